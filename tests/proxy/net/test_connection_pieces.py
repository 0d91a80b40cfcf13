"""A response a path hands back as `Pieces` (a spliced Fetch response): written to the client
in order behind one size prefix, never joined, counted at its size while held; joined only
when a quota's throttle time must be written into it."""

from __future__ import annotations

import datetime
import struct
from typing import Any

from sluice.codec import entities
from sluice.codec.headers import request_header_bytes, response_header_bytes
from sluice.codec.messages import ApiKey, encode_response
from sluice.codec.throttle import throttle_offset
from sluice.proxy.contract import ClientInfo
from sluice.proxy.net.connection import (
    Connection,
    Limits,
    ResumeBroker,
    SendToClient,
    StartJob,
)
from sluice.proxy.ops.quotas import QuotaRule, Quotas, QuotaSettings
from sluice.proxy.paths.base import Exchange, Frame, PathContext, Respond
from sluice.proxy.telemetry.metrics import Metrics
from tests.proxy.net.test_connection import (
    ScriptedPath,
    frame,
    frames_of,
    held_until_paused,
    sent,
)
from tests.proxy.net.unfiltered_routes import unfiltered_routes

FETCH = int(ApiKey.FETCH)
VERSION = 12


class PiecesPath(ScriptedPath):
    """Answers every Fetch response with its bytes cut into three pieces (one that ends in
    ``slow`` goes to a job first, as `ScriptedPath` does)."""

    def on_response(self, ctx: PathContext, exchange: Exchange, frame: Frame) -> Any:
        if bytes(frame).endswith(b"slow"):
            return super().on_response(ctx, exchange, frame)
        view = memoryview(frame)
        return Respond((view[:9], bytes(view[9:12]), view[12:]))


class Clock:
    def __init__(self) -> None:
        self.now = 50.0

    def __call__(self) -> float:
        return self.now


def connection(quotas: Quotas | None = None, clock: Clock | None = None,
               limits: Limits | None = None) -> Connection:
    metrics = Metrics()
    extra: dict[str, Any] = {} if clock is None else {"clock": clock}
    return Connection(ClientInfo("c", ("b", 1)), unfiltered_routes([PiecesPath()], metrics),
                      metrics, limits, quotas=quotas, **extra)


def fetch_request(cid: int) -> bytes:
    return request_header_bytes(FETCH, VERSION, cid, "app") + b"x" * 40


def fetch_response(cid: int, pad: int = 0) -> bytes:
    cls = entities.response_class(ApiKey.FETCH, VERSION)
    body = entities.build(cls, throttle_time=datetime.timedelta(0), error_code=0,
                          session_id=0, responses=())
    return response_header_bytes(cid, FETCH, VERSION) + encode_response(body) + b"\0" * pad


def test_pieces_are_written_in_order_behind_one_size_prefix_never_joined() -> None:
    conn = connection()
    conn.client_data(frame(fetch_request(1)))
    raw = fetch_response(1, pad=30)
    out = conn.broker_data(frame(raw))
    (send,) = [a for a in out if isinstance(a, SendToClient)]
    assert bytes(send.data[0]) == struct.pack(">i", len(raw))
    assert [type(p) for p in send.data[1:]] == [memoryview, bytes, memoryview], "not joined"
    assert frames_of(sent(out, SendToClient)) == [raw]
    assert conn.client.stats.bytes_out == len(raw) + 4


def test_a_throttled_fetch_in_pieces_is_joined_with_its_throttle_time() -> None:
    clock = Clock()
    quotas = Quotas(1, clock=clock)
    quotas.update(QuotaSettings((QuotaRule("r", fetch=100.0),), burst_seconds=1.0))
    conn = connection(quotas, clock)
    conn.client_data(frame(fetch_request(1)))
    raw = fetch_response(1, pad=300)  # over the 100-byte burst: throttled
    out = conn.broker_data(frame(raw))
    (resp,) = frames_of(sent(out, SendToClient))
    at = throttle_offset(FETCH, VERSION, resp)
    (ms,) = struct.unpack_from(">i", resp, at)
    assert ms > 0 and conn.client.stats.throttle_ms == ms
    assert resp[:at] == raw[:at] and resp[at + 4:] == raw[at + 4:]


def test_pieces_held_behind_a_job_count_their_bytes_not_their_number() -> None:
    """Responses in pieces waiting behind a slower one count their bytes against the held
    bound, as one buffer would: past it the broker is not read."""
    conn = connection(limits=Limits(max_held_response_bytes=1000))
    conn.client_data(b"".join(frame(fetch_request(cid)) for cid in range(1, 8)))
    out = conn.broker_data(frame(struct.pack(">i", 1) + b"slow"))
    (job,) = [a for a in out if isinstance(a, StartJob)]
    paused_at = held_until_paused(
        conn, {cid: fetch_response(cid, pad=300 - len(fetch_response(cid))) for cid in range(2, 8)})
    # Each held response counts its frame and its pieces (views of that frame, counted at
    # their size all the same): 600 bytes; counted by their number it would be 303.
    assert paused_at == 3, "paused once 2 x 600 bytes (and the slow one) were held"
    out = conn.job_done(job.job_id, job.job.run())
    assert len(frames_of(sent(out, SendToClient))) == 3
    assert any(isinstance(a, ResumeBroker) for a in out)
