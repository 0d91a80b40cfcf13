"""Quota throttling in the sans-IO connection: the response carries throttle_time_ms, later
requests wait until the client is within quota, pausing composes with back-pressure, and
pre-KIP-219 versions get their response held back instead."""

from __future__ import annotations

import datetime
import struct
from typing import Any

import pytest

from sluice.codec import entities
from sluice.codec.headers import request_header_bytes, response_header_bytes
from sluice.codec.messages import ApiKey, decode_response, encode_response
from sluice.codec.throttle import throttle_offset
from sluice.proxy.contract import ClientInfo
from sluice.proxy.net.connection import (
    Connection,
    PauseClient,
    ResumeClient,
    SendToBroker,
    SendToClient,
    Wake,
)
from sluice.proxy.ops.quotas import QuotaRule, Quotas, QuotaSettings
from sluice.proxy.paths.registry import Routes, VersionTable
from sluice.proxy.telemetry.metrics import Metrics
from tests.proxy.net.test_connection import frame, frames_of, make, sent

PRODUCE = int(ApiKey.PRODUCE)


class Clock:
    def __init__(self) -> None:
        self.now = 50.0

    def __call__(self) -> float:
        return self.now


def throttled(rule: QuotaRule, burst: float = 1.0) -> tuple[Connection, Clock]:
    base, _, _ = make()
    clock = Clock()
    quotas = Quotas(1, clock=clock)
    quotas.update(QuotaSettings((rule,), burst_seconds=burst))
    routes: Routes = base._routes
    conn = Connection(
        ClientInfo("c", ("b", 1)), Routes([], routes._make_context, VersionTable()), Metrics(),
        quotas=quotas, clock=clock,
    )
    return conn, clock


def produce_request(cid: int, size: int, version: int = 9) -> bytes:
    head = request_header_bytes(PRODUCE, version, cid, "app")
    return head + b"x" * (size - len(head))


def produce_response(cid: int, version: int = 9, broker_ms: int = 0) -> bytes:
    cls = entities.response_class(ApiKey.PRODUCE, version)
    body = entities.build(
        cls, responses=(), throttle_time=datetime.timedelta(milliseconds=broker_ms)
    )
    return response_header_bytes(cid, PRODUCE, version) + encode_response(body)


def throttle_of(resp: bytes, version: int = 9) -> int:
    at = throttle_offset(PRODUCE, version, resp)
    value: int = struct.unpack_from(">i", resp, at)[0]
    return value


def kinds(actions: list[Any]) -> list[type]:
    return [type(a) for a in actions]


def test_over_quota_response_says_so_and_later_requests_wait() -> None:
    conn, clock = throttled(QuotaRule("r", client_id="app", produce=1000.0))
    # 1000 bytes of burst; the first request is 1500 bytes: 500 over -> 0.5 s.
    out = conn.client_data(frame(produce_request(1, 1500)) + frame(produce_request(2, 100)))
    assert frames_of(sent(out, SendToBroker)) == [produce_request(1, 1500)], "2 waits"
    assert PauseClient in kinds(out)
    (wake,) = [a for a in out if isinstance(a, Wake)]
    assert wake.delay == 0.5
    clock.now += 0.1  # the broker answers after 100 ms: 400 ms of the wait are left
    out = conn.broker_data(frame(produce_response(1)))
    (resp,) = frames_of(sent(out, SendToClient))
    assert throttle_of(resp) == 400
    assert decode_response(PRODUCE, 9, resp[5:]).responses == ()
    assert conn.client.stats.throttle_ms == 400
    assert ResumeClient not in kinds(out) and conn.busy
    clock.now += 0.4
    out = conn.tick()
    assert frames_of(sent(out, SendToBroker)) == [produce_request(2, 100)]
    # The bucket was empty: request 2's 100 bytes are 0.1 s over in turn.
    assert [a.delay for a in out if isinstance(a, Wake)] == [pytest.approx(0.1)]
    clock.now += 0.1
    assert ResumeClient in kinds(conn.tick())


def test_broker_throttle_kept_when_longer() -> None:
    conn, _clock = throttled(QuotaRule("r", produce=1000.0))
    conn.client_data(frame(produce_request(1, 1100)))
    out = conn.broker_data(frame(produce_response(1, broker_ms=900)))
    (resp,) = frames_of(sent(out, SendToClient))
    assert throttle_of(resp) == 900


def test_within_quota_nothing_changes() -> None:
    conn, _clock = throttled(QuotaRule("r", client_id="other", produce=1.0))
    out = conn.client_data(frame(produce_request(1, 5000)))
    assert not any(isinstance(a, (PauseClient, Wake)) for a in out)
    response = produce_response(1, broker_ms=0)
    out = conn.broker_data(frame(response))
    assert frames_of(sent(out, SendToClient)) == [response], "the broker's bytes, untouched"


def test_quota_wait_and_back_pressure_do_not_resume_each_other() -> None:
    conn, clock = throttled(QuotaRule("r", produce=1000.0))
    conn.client_data(frame(produce_request(1, 2000)))  # 1 s
    out = conn.client_writable(False)
    assert ResumeClient not in kinds(out)
    clock.now += 1.0
    out = conn.tick()
    assert ResumeClient not in kinds(out), "the client socket is still full"
    conn.client_writable(True)
    conn.client_data(frame(produce_request(2, 1000)))  # 1 s more
    out = conn.client_writable(True)
    assert ResumeClient not in kinds(out), "the quota wait is not over"


def test_pre_kip219_response_is_held_back_instead() -> None:
    conn, clock = throttled(QuotaRule("r", produce=1000.0))
    out = conn.client_data(frame(produce_request(1, 1300, version=5)))  # 0.3 s
    assert [a.delay for a in out if isinstance(a, Wake)] == [pytest.approx(0.3)]
    out = conn.broker_data(frame(produce_response(1, version=5)))
    assert sent(out, SendToClient) == b"", "held until the wait is over (the Wake is armed)"
    clock.now += 0.3
    out = conn.tick()
    (resp,) = frames_of(sent(out, SendToClient))
    assert throttle_of(resp, version=5) == 300
