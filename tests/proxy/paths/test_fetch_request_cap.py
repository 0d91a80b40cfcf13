"""proxy.filtered_fetch_max_bytes: while a fetch filter is in force, the fetch path forwards a
Fetch request asking for more than the setting with its max_bytes lowered to it (and a
min_bytes above it; only those changed); otherwise, and with the setting 0, the client's own
bytes go on. A connection's first Fetch requests get a lower cap, doubling up to the setting
(`ramp_cap`)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from sluice.codec.headers import parse_request_header
from sluice.codec.messages import ApiKey, decode_request
from sluice.proxy.contract import ClientInfo
from sluice.proxy.ops.config import DEFAULT_FILTERED_FETCH_MAX_BYTES, ConfigFileError
from sluice.proxy.paths.base import Exchange, Forward
from sluice.proxy.paths.fetch import RAMP_FIRST_BYTES, FetchPath, ramp_cap
from tests.codec.test_codec_fetch_request import build
from tests.proxy.server_context import context_of

FETCH = int(ApiKey.FETCH)


def _ramped_client() -> ClientInfo:
    """A connection whose Fetch requests get the whole setting (past the ramp)."""
    return ClientInfo("c", ("127.0.0.1", 1), client_id="consumer", capped_fetches=8)


def test_the_setting_reaches_the_paths_and_is_checked(tmp_path: Path) -> None:
    assert context_of(tmp_path, "proxy: {}\n").fetch_max_bytes == DEFAULT_FILTERED_FETCH_MAX_BYTES
    assert context_of(tmp_path, "proxy:\n  filtered_fetch_max_bytes: 0\n").fetch_max_bytes == 0
    assert context_of(tmp_path, "proxy:\n  filtered_fetch_max_bytes: 65536\n").fetch_max_bytes == (
        65536)
    for bad in ("-1", "'4M'", "true", "2147483648"):
        with pytest.raises(ConfigFileError,
                           match=r"sluice\.yaml:2: proxy\.filtered_fetch_max_bytes: must be"):
            context_of(tmp_path, f"proxy:\n  filtered_fetch_max_bytes: {bad}\n")


def test_fetch_requests_are_looked_at_only_with_a_fetch_filter_and_a_cap(tmp_path: Path) -> None:
    ctx = context_of(tmp_path, "proxy: {}\n")
    path = FetchPath()
    filtered = dataclasses.replace(ctx, directions=frozenset({"fetch"}))
    assert path.wants_request(filtered, FETCH)
    assert not path.wants_request(dataclasses.replace(ctx, directions=frozenset({"produce"})),
                                  FETCH)
    assert not path.wants_request(dataclasses.replace(filtered, fetch_max_bytes=0), FETCH)


@pytest.mark.parametrize("version", [4, 12, 15, 18])
@pytest.mark.parametrize("asked", [1 << 10, 4 << 20, 64 << 20])
def test_a_request_asking_for_more_is_forwarded_asking_for_the_cap(
    tmp_path: Path, version: int, asked: int,
) -> None:
    ctx = dataclasses.replace(context_of(tmp_path, "proxy: {}\n"), directions=frozenset({"fetch"}))
    frame = build(version, asked, 1, 500, 0, [(0, 0, 8 << 20), (1, 9, 8 << 20)], "consumer")
    header = parse_request_header(frame)
    exchange = Exchange(header, _ramped_client())
    outcome = FetchPath().on_request(ctx, exchange, frame)
    assert isinstance(outcome, Forward)
    if asked <= ctx.fetch_max_bytes:
        assert outcome.frame is None  # the client's bytes
        return
    assert outcome.frame is not None
    sent = decode_request(FETCH, version, bytes(outcome.frame)[header.header_size:])
    before = decode_request(FETCH, version, frame[header.header_size:])
    assert sent == dataclasses.replace(before, max_bytes=ctx.fetch_max_bytes)


@pytest.mark.parametrize("version", [4, 12, 15, 18])
def test_a_min_bytes_above_the_cap_is_lowered_to_it(tmp_path: Path, version: int) -> None:
    """A broker answers once `min_bytes` are available (counted per partition, not up to the
    request's max_bytes): a consumer asking for 10 MB at least and 50 MB at most, capped to
    4 MiB at most but still 10 MB at least, would wait max_wait_ms for a backlog of under
    10 MB already at the broker, on every Fetch once the backlog falls below it."""
    ctx = dataclasses.replace(context_of(tmp_path, "proxy: {}\n"), directions=frozenset({"fetch"}))
    frame = build(version, 50 << 20, 10 << 20, 500, 0, [(0, 0, 8 << 20)], "consumer")
    header = parse_request_header(frame)
    exchange = Exchange(header, _ramped_client())
    outcome = FetchPath().on_request(ctx, exchange, frame)
    assert isinstance(outcome, Forward) and outcome.frame is not None
    sent = decode_request(FETCH, version, bytes(outcome.frame)[header.header_size:])
    assert (sent.min_bytes, sent.max_bytes) == (ctx.fetch_max_bytes, ctx.fetch_max_bytes)
    before = decode_request(FETCH, version, frame[header.header_size:])
    assert sent == dataclasses.replace(before, min_bytes=ctx.fetch_max_bytes,
                                       max_bytes=ctx.fetch_max_bytes)


def test_a_connection_s_first_fetches_ramp_up_to_the_setting(tmp_path: Path) -> None:
    """A new consumer with a backlog gets a small first response (filtered quickly), then
    responses twice as large each time, up to the setting; each connection ramps on its own."""
    ctx = dataclasses.replace(context_of(tmp_path, "proxy: {}\n"), directions=frozenset({"fetch"}))
    frame = build(12, 64 << 20, 1, 500, 0, [(0, 0, 8 << 20)], "consumer")
    header = parse_request_header(frame)
    client = ClientInfo("c", ("127.0.0.1", 1), client_id="consumer")
    other = ClientInfo("d", ("127.0.0.1", 2), client_id="consumer")
    asked = []
    for _ in range(6):
        outcome = FetchPath().on_request(ctx, Exchange(header, client), frame)
        assert isinstance(outcome, Forward) and outcome.frame is not None
        asked.append(decode_request(FETCH, 12, bytes(outcome.frame)[header.header_size:]).max_bytes)
    assert asked == [1 << 20, 2 << 20, 4 << 20, 8 << 20, 8 << 20, 8 << 20]
    outcome = FetchPath().on_request(ctx, Exchange(header, other), frame)
    assert isinstance(outcome, Forward) and outcome.frame is not None
    assert decode_request(FETCH, 12, bytes(outcome.frame)[header.header_size:]).max_bytes == (
        RAMP_FIRST_BYTES)


@pytest.mark.parametrize("cap", [1, 65536, RAMP_FIRST_BYTES, 3 << 20, 64 << 20, (1 << 31) - 1])
def test_the_ramp_never_asks_for_more_than_the_setting_and_reaches_it(cap: int) -> None:
    caps = [ramp_cap(cap, sent) for sent in range(12)]
    assert all(c <= cap for c in caps)
    assert caps == sorted(caps)
    assert caps[-1] == cap
    assert caps[0] == min(cap, RAMP_FIRST_BYTES)
