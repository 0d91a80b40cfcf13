"""A Fetch request's max_bytes lowered in place (codec/fetch_request.py) against kio: for every
Fetch request version the codec knows, the capped frame decodes to the request kio decodes
from the original with only max_bytes (and a min_bytes above it) changed; golden requests
from real clients; short frames refused."""

from __future__ import annotations

import dataclasses
import datetime
import uuid
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sluice.codec.errors import DecodeError
from sluice.codec.fetch_request import cap_fetch_max_bytes, fetch_max_bytes_at
from sluice.codec.headers import parse_request_header, request_header_bytes
from sluice.codec.messages import decode_request, encode_request
from sluice.codec.schemas import known_versions, request_schema
from tests.codec.produce_entities import element
from tests.codec.test_codec_golden import REQUESTS

VERSIONS = known_versions(1, True)
I32 = st.integers(-(2**31), 2**31 - 1)


def build(version: int, max_bytes: int, min_bytes: int, wait_ms: int, session: int,
          partitions: list[tuple[int, int, int]], client_id: str | None) -> bytes:
    """A whole Fetch request (header and body) of `version`, as kio encodes it."""
    cls = request_schema(1, version)
    tcls = element(cls, "topics")
    pcls = element(tcls, "partitions")
    key: dict[str, Any] = {"topic_id": uuid.UUID(int=7)} if version >= 13 else {"topic": "t"}
    fields = {f.name for f in dataclasses.fields(pcls)}
    parts = tuple(
        pcls(**{"partition": p, "fetch_offset": off, "partition_max_bytes": pmax,
                **({"log_start_offset": -1} if "log_start_offset" in fields else {})})
        for p, off, pmax in partitions
    )
    names = {f.name for f in dataclasses.fields(cls)}
    extra: dict[str, Any] = {}
    if "session_id" in names:
        extra.update(session_id=session, session_epoch=-1)
    if "forgotten_topics_data" in names:
        extra["forgotten_topics_data"] = ()
    if "rack_id" in names:
        extra["rack_id"] = "rack"
    request = cls(max_wait=datetime.timedelta(milliseconds=wait_ms), min_bytes=min_bytes,
                  max_bytes=max_bytes, topics=(tcls(**key, partitions=parts),), **extra)
    return request_header_bytes(1, version, 42, client_id) + encode_request(request)


@given(version=st.sampled_from(VERSIONS), asked=I32, cap=st.integers(0, 2**31 - 1),
       min_bytes=I32, wait_ms=st.integers(0, 2**31 - 1), session=I32,
       partitions=st.lists(st.tuples(st.integers(0, 2**31 - 1), st.integers(0, 2**62), I32),
                           max_size=3),
       client_id=st.one_of(st.none(), st.text(max_size=30)))
def test_a_capped_request_is_the_original_with_max_bytes_lowered(
    version: int, asked: int, cap: int, min_bytes: int, wait_ms: int, session: int,
    partitions: list[tuple[int, int, int]], client_id: str | None,
) -> None:
    frame = build(version, asked, min_bytes, wait_ms, session, partitions, client_id)
    header = parse_request_header(frame)
    before = decode_request(1, version, frame[header.header_size:])
    assert before.max_bytes == asked
    capped = cap_fetch_max_bytes(frame, header.header_size, version, cap)
    if asked <= cap:
        assert capped is None
        return
    assert capped is not None and len(capped) == len(frame)
    assert parse_request_header(capped) == header
    after = decode_request(1, version, capped[header.header_size:])
    assert after == dataclasses.replace(before, max_bytes=cap, min_bytes=min(min_bytes, cap))


FETCH_GOLDEN = [g for g in REQUESTS if g.api_key == 1]


@pytest.mark.parametrize("g", FETCH_GOLDEN, ids=lambda g: g.name)
def test_golden_fetch_requests_capped(g: Any) -> None:
    frame = bytes(g.body)
    size = parse_request_header(frame).header_size
    before = decode_request(1, g.api_version, frame[size:])
    assert cap_fetch_max_bytes(frame, size, g.api_version, before.max_bytes) is None
    lower = max(0, before.max_bytes - 1)
    capped = cap_fetch_max_bytes(frame, size, g.api_version, lower)
    assert capped is not None
    assert decode_request(1, g.api_version, capped[size:]) == dataclasses.replace(
        before, max_bytes=lower, min_bytes=min(before.min_bytes, lower))


def test_fetch_golden_requests_exist() -> None:
    assert FETCH_GOLDEN


@given(version=st.sampled_from(VERSIONS), cut=st.integers(0, 11))
def test_a_frame_ending_before_max_bytes_is_refused(version: int, cut: int) -> None:
    frame = build(version, 1 << 20, 1, 500, 0, [(0, 0, 1 << 20)], "c")
    size = parse_request_header(frame).header_size
    at = fetch_max_bytes_at(version)
    assert at is not None
    with pytest.raises(DecodeError):
        cap_fetch_max_bytes(frame[:size + at + 4 - 1 - cut % (at + 4)], size, version, 1)


def test_versions_before_3_have_no_max_bytes() -> None:
    assert [fetch_max_bytes_at(v) for v in range(3)] == [None, None, None]
    assert cap_fetch_max_bytes(b"", 0, 2, 1) is None
