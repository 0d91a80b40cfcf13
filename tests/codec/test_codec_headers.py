"""Request/response headers: v1 vs v2 request headers, v0 vs v1 response headers, and the
ApiVersions exception (its response header is always v0)."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sluice.codec.errors import CodecError, DecodeError
from sluice.codec.headers import (
    RequestHeader,
    is_flexible,
    parse_request_header,
    read_correlation_id,
    request_header_bytes,
    response_header_bytes,
    response_header_size,
)


def test_flexibility_follows_kafka_specs() -> None:
    assert not is_flexible(0, 8)  # Produce v9 is the first flexible version
    assert is_flexible(0, 9)
    assert not is_flexible(3, 8)
    assert is_flexible(3, 9)  # Metadata v9+
    assert not is_flexible(18, 2)
    assert is_flexible(18, 3)  # ApiVersions v3 body is flexible...
    assert is_flexible(18, 3, request=False)
    assert not is_flexible(1, 11)
    assert is_flexible(1, 12)  # Fetch v12+


def test_versions_kio_lacks_are_judged_by_neighbours() -> None:
    # kio starts Produce at v3 and Fetch at v4; older versions predate flexible encoding.
    assert not is_flexible(0, 2)
    assert not is_flexible(1, 0)
    # A future version is as flexible as the newest known one.
    assert is_flexible(0, 99)


def test_request_header_v1_layout() -> None:
    raw = request_header_bytes(0, 7, 42, "producer-1")
    assert raw == struct.pack(">hhih", 0, 7, 42, 10) + b"producer-1"
    hdr = parse_request_header(raw + b"BODY")
    assert hdr == RequestHeader(0, 7, 42, "producer-1", len(raw), False)


def test_request_header_v2_has_tagged_fields_but_legacy_client_id() -> None:
    raw = request_header_bytes(3, 12, -5, "c")
    assert raw == struct.pack(">hhih", 3, 12, -5, 1) + b"c" + b"\x00"
    hdr = parse_request_header(raw + b"\x01\x02")
    assert hdr.flexible
    assert hdr.header_size == len(raw)
    assert hdr.correlation_id == -5


def test_request_header_null_client_id() -> None:
    raw = request_header_bytes(18, 3, 1, None)
    assert raw == struct.pack(">hhih", 18, 3, 1, -1) + b"\x00"
    assert parse_request_header(raw).client_id is None


def test_request_header_skips_tagged_fields() -> None:
    base = struct.pack(">hhih", 1, 13, 9, 2) + b"id"
    tags = b"\x02" + b"\x00\x03abc" + b"\x05\x00"
    hdr = parse_request_header(memoryview(base + tags + b"body"))
    assert hdr.header_size == len(base) + len(tags)
    assert hdr.client_id == "id"


def test_unknown_api_key_parses_as_v1() -> None:
    raw = struct.pack(">hhih", 999, 0, 3, -1)
    hdr = parse_request_header(raw)
    assert (hdr.api_key, hdr.flexible, hdr.header_size) == (999, False, 10)


@pytest.mark.parametrize(
    "frame",
    [
        b"",
        b"\x00\x03\x00\x0c\x00\x00",
        struct.pack(">hhih", 3, 12, 1, 5) + b"ab",  # client_id runs past the end
        struct.pack(">hhih", 3, 12, 1, -2),  # negative length other than -1
        struct.pack(">hhih", 3, 12, 1, 2) + b"\xff\xfe\x00",  # not UTF-8
        struct.pack(">hhih", 3, 12, 1, -1),  # flexible but tagged-field count missing
        struct.pack(">hhih", 3, 12, 1, -1) + b"\x01\x00\x09ab",  # tag longer than frame
        struct.pack(">hhih", 3, 12, 1, -1) + b"\xff\xff\xff\xff\xff\xff",  # varint too long
        struct.pack(">hhih", -1, 0, 1, -1),
    ],
)
def test_garbage_request_headers_raise_decode_error(frame: bytes) -> None:
    with pytest.raises(DecodeError):
        parse_request_header(frame)


def test_api_versions_response_header_is_always_v0() -> None:
    for version in range(5):
        assert response_header_bytes(77, 18, version) == struct.pack(">i", 77)
        # The body of a v3+ ApiVersions response starts with error_code; a v1 header parser
        # would misread its first byte as a tagged-field count.
        assert response_header_size(b"\x00\x00\x00\x4d\x00\x00\x01", 18, version) == 4


def test_flexible_response_header_has_tagged_fields() -> None:
    assert response_header_bytes(1, 3, 12) == b"\x00\x00\x00\x01\x00"
    assert response_header_bytes(1, 3, 8) == b"\x00\x00\x00\x01"
    assert response_header_size(b"\x00\x00\x00\x01\x00rest", 3, 12) == 5
    assert response_header_size(b"\x00\x00\x00\x01\x01\x00\x02xyrest", 3, 12) == 9
    assert response_header_size(b"\x00\x00\x00\x01\x00rest", 3, 8) == 4


def test_response_header_garbage() -> None:
    with pytest.raises(DecodeError):
        response_header_size(b"\x00\x00", 3, 12)
    with pytest.raises(DecodeError):
        response_header_size(b"\x00\x00\x00\x01", 3, 12)


def test_read_correlation_id() -> None:
    assert read_correlation_id(memoryview(b"\x00\x00\x01\x00xyz")) == 256
    assert read_correlation_id(b"\xff\xff\xff\xff") == -1
    with pytest.raises(DecodeError):
        read_correlation_id(b"\x00")


def test_encode_out_of_range_raises_codec_error() -> None:
    with pytest.raises(CodecError):
        request_header_bytes(0, 7, 2**31, None)
    with pytest.raises(CodecError):
        response_header_bytes(2**40, 3, 12)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=64))
def test_random_request_headers_raise_only_codec_errors(data: bytes) -> None:
    try:
        hdr = parse_request_header(data)
    except CodecError:
        return
    assert 10 <= hdr.header_size <= len(data)


@settings(max_examples=200, deadline=None)
@given(
    api_key=st.sampled_from([0, 1, 3, 10, 18, 19, 60]),
    version=st.integers(min_value=0, max_value=13),
    correlation_id=st.integers(min_value=-(2**31), max_value=2**31 - 1),
    client_id=st.none() | st.text(max_size=40),
)
def test_request_header_round_trip(
    api_key: int, version: int, correlation_id: int, client_id: str | None
) -> None:
    raw = request_header_bytes(api_key, version, correlation_id, client_id)
    hdr = parse_request_header(raw + b"\x00body")
    assert (hdr.api_key, hdr.api_version, hdr.correlation_id, hdr.client_id) == (
        api_key,
        version,
        correlation_id,
        client_id,
    )
    assert hdr.header_size == len(raw)
    assert hdr.flexible == is_flexible(api_key, version)
