"""Setting `throttle_time_ms` in Produce and Fetch responses in place (codec/throttle.py),
checked against kio's decode for every version the codec supports: the field holds
max(broker's, ours) and nothing else changes."""

from __future__ import annotations

import dataclasses
import datetime
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sluice.codec import entities
from sluice.codec.errors import DecodeError
from sluice.codec.headers import response_header_bytes, response_header_size
from sluice.codec.messages import ApiKey, decode_response, encode_response
from sluice.codec.schemas import known_versions
from sluice.codec.throttle import sends_before_throttling, throttle_offset, with_throttle
from tests.codec.test_codec_golden import RESPONSES
from tests.codec.test_codec_produce_offsets import responses as produce_responses

PRODUCE, FETCH = int(ApiKey.PRODUCE), int(ApiKey.FETCH)
ms = st.integers(0, 2**31 - 1)


def decoded(api_key: int, version: int, frame: bytes | memoryview) -> Any:
    size = response_header_size(frame, api_key, version)
    return decode_response(api_key, version, bytes(frame[size:]))


def frame_of(api_key: int, version: int, entity: Any, correlation_id: int = 42) -> bytes:
    return response_header_bytes(correlation_id, api_key, version) + encode_response(entity)


def check(api_key: int, version: int, entity: Any, broker_ms: int, ours: int) -> None:
    entity = dataclasses.replace(entity, throttle_time=datetime.timedelta(milliseconds=broker_ms))
    frame = frame_of(api_key, version, entity)
    out, value = with_throttle(api_key, version, memoryview(frame).toreadonly(), ours)
    assert value == max(broker_ms, ours)
    assert len(out) == len(frame)
    got = decoded(api_key, version, out)
    assert got.throttle_time == datetime.timedelta(milliseconds=value)
    assert dataclasses.replace(got, throttle_time=entity.throttle_time) == decoded(
        api_key, version, frame
    )
    assert bytes(out[:4]) == frame[:4], "the correlation id is untouched"


@settings(max_examples=200, deadline=None)
@given(response=produce_responses(), broker_ms=ms, ours=ms)
def test_produce_throttle_patch_matches_kio(
    response: tuple[int, Any], broker_ms: int, ours: int
) -> None:
    version, entity = response
    check(PRODUCE, version, entity, broker_ms, ours)


@settings(max_examples=100, deadline=None)
@given(version=st.sampled_from(known_versions(FETCH, False)), broker_ms=ms, ours=ms)
def test_fetch_throttle_patch_matches_kio(version: int, broker_ms: int, ours: int) -> None:
    cls = entities.response_class(ApiKey.FETCH, version)
    check(FETCH, version, entities.build(cls, responses=()), broker_ms, ours)


@pytest.mark.parametrize(
    "g", [g for g in RESPONSES if g.api_key in (PRODUCE, FETCH)], ids=lambda g: g.name
)
def test_golden_responses_from_real_clients_and_broker(g: Any) -> None:
    frame = g.body
    before = decoded(g.api_key, g.api_version, frame)
    out, value = with_throttle(g.api_key, g.api_version, frame, 1234)
    after = decoded(g.api_key, g.api_version, out)
    assert value == max(1234, int(before.throttle_time.total_seconds() * 1000))
    assert after.throttle_time == datetime.timedelta(milliseconds=value)
    assert dataclasses.replace(after, throttle_time=before.throttle_time) == before


def test_fixed_positions() -> None:
    # Fetch v4 (header v0): right after the correlation id; Fetch v12+ (header v1): after
    # the header's empty tagged-field section.
    cls4 = entities.response_class(ApiKey.FETCH, 4)
    assert throttle_offset(FETCH, 4, frame_of(FETCH, 4, entities.build(cls4, responses=()))) == 4
    cls12 = entities.response_class(ApiKey.FETCH, 12)
    f12 = frame_of(FETCH, 12, entities.build(cls12, responses=()))
    assert throttle_offset(FETCH, 12, f12) == 5
    # Produce v9 with no topics: header (4 + 1 tag byte) + compact array length (1 byte).
    cls9 = entities.response_class(ApiKey.PRODUCE, 9)
    f9 = frame_of(PRODUCE, 9, entities.build(cls9, responses=()))
    assert throttle_offset(PRODUCE, 9, f9) == 6


def test_broker_value_kept_when_larger_and_original_returned() -> None:
    cls = entities.response_class(ApiKey.FETCH, 11)
    entity = entities.build(cls, responses=(), throttle_time=datetime.timedelta(seconds=3))
    frame = frame_of(FETCH, 11, entity)
    out, value = with_throttle(FETCH, 11, frame, 100)
    assert value == 3000 and out is frame


def test_truncated_response_is_a_decode_error() -> None:
    with pytest.raises(DecodeError):
        with_throttle(FETCH, 4, b"\x00\x00\x00\x01\x00\x00", 10)
    with pytest.raises(DecodeError):
        with_throttle(PRODUCE, 8, b"\x00\x00\x00\x01\x00\x00\x00\x05", 10)


def test_kip219_versions() -> None:
    assert [v for v in range(3, 14) if sends_before_throttling(PRODUCE, v)] == list(range(6, 14))
    assert [v for v in range(4, 19) if sends_before_throttling(FETCH, v)] == list(range(8, 19))
