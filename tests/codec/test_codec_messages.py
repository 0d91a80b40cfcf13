"""messages: kio wrapper (decode/encode, version ranges, error mapping, unknown tagged fields)."""

from __future__ import annotations

import uuid

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kio.schema.index import api_key_map
from kio.schema.metadata.v12.request import MetadataRequest, MetadataRequestTopic
from kio.schema.types import TopicName
from kio.serial import entity_reader, entity_writer

from sluice.codec.errors import CodecError, DecodeError, EncodeError, UnsupportedVersion
from sluice.codec.messages import (
    ApiKey,
    codec_version_range,
    decode_request,
    decode_response,
    encode_request,
    encode_response,
)
from sluice.codec.schemas import request_schema, response_schema


def _metadata_request() -> MetadataRequest:
    return MetadataRequest(
        topics=(MetadataRequestTopic(topic_id=uuid.UUID(int=1), name=TopicName("orders")),),
        allow_auto_topic_creation=False,
        include_topic_authorized_operations=True,
    )


def test_api_key_enum_matches_kio() -> None:
    assert {int(k): k.name.lower() for k in ApiKey} == dict(api_key_map)
    assert ApiKey.PRODUCE == 0
    assert ApiKey.API_VERSIONS == 18
    assert ApiKey.DESCRIBE_CLUSTER == 60


def test_version_ranges() -> None:
    assert codec_version_range(ApiKey.PRODUCE) == (3, 13)
    assert codec_version_range(ApiKey.FETCH) == (4, 18)
    assert codec_version_range(ApiKey.METADATA) == (0, 13)
    assert codec_version_range(ApiKey.API_VERSIONS) == (0, 4)
    assert codec_version_range(ApiKey.CREATE_TOPICS) == (2, 7)
    assert codec_version_range(12345) is None


@pytest.mark.parametrize("api_key", [int(k) for k in ApiKey])
def test_every_version_in_range_has_reader_and_writer(api_key: int) -> None:
    rng = codec_version_range(api_key)
    if rng is None:
        return
    for version in range(rng[0], rng[1] + 1):
        for schema in (request_schema(api_key, version), response_schema(api_key, version)):
            assert schema.__version__ == version
            assert callable(entity_writer(schema))
            assert callable(entity_reader(schema))
        # An empty body is valid only for a request without fields (ApiVersions v0, ...),
        # which must then encode back to nothing; otherwise the failure is a DecodeError.
        try:
            entity = decode_request(api_key, version, b"")
        except DecodeError:
            continue
        assert encode_request(entity) == b""


def test_round_trip_metadata_request() -> None:
    entity = _metadata_request()
    body = encode_request(entity)
    assert decode_request(3, 12, body) == entity
    assert decode_request(3, 12, memoryview(b"xx" + body)[2:]) == entity


def test_trailing_bytes_rejected() -> None:
    body = encode_request(_metadata_request())
    with pytest.raises(DecodeError, match="trailing"):
        decode_request(3, 12, body + b"\x00")


def test_unsupported_versions() -> None:
    with pytest.raises(UnsupportedVersion):
        decode_request(0, 2, b"")
    with pytest.raises(UnsupportedVersion):
        decode_response(1, 3, b"")
    with pytest.raises(UnsupportedVersion):
        decode_request(4321, 0, b"")


def test_unknown_tagged_fields_are_skipped() -> None:
    entity = _metadata_request()
    body = encode_request(entity)
    # The body ends with the top-level tagged-field count (0). Replace it with two unknown
    # tags; also give the nested topic entry an unknown tag.
    with_top_tags = body[:-1] + b"\x02" + b"\x07\x02\xaa\xbb" + b"\x09\x00"
    assert decode_request(3, 12, with_top_tags) == entity
    name_end = body.index(b"orders") + len(b"orders")
    assert body[name_end] == 0
    with_nested_tag = body[:name_end] + b"\x01\x05\x01\xcc" + body[name_end + 1 :]
    assert decode_request(3, 12, with_nested_tag) == entity


def test_unknown_tag_with_bad_length_is_decode_error() -> None:
    body = encode_request(_metadata_request())
    with pytest.raises(DecodeError):
        decode_request(3, 12, body[:-1] + b"\x01\x07\x40\xaa")


def test_encode_errors_are_codec_errors() -> None:
    bad = MetadataRequest(
        topics=(MetadataRequestTopic(topic_id=None, name=123),),  # type: ignore[arg-type]
        allow_auto_topic_creation=False,
        include_topic_authorized_operations=True,
    )
    with pytest.raises(EncodeError):
        encode_request(bad)
    with pytest.raises(EncodeError):
        encode_response(object())


_DECODE_TARGETS = [(0, 9), (0, 3), (1, 12), (1, 4), (3, 12), (3, 1), (18, 3), (19, 7), (60, 1)]


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    target=st.sampled_from(_DECODE_TARGETS),
    request=st.booleans(),
    data=st.binary(max_size=200),
)
def test_random_bodies_raise_only_codec_errors(
    target: tuple[int, int], request: bool, data: bytes
) -> None:
    decode = decode_request if request else decode_response
    try:
        decode(target[0], target[1], data)
    except CodecError:
        pass


@settings(max_examples=100, deadline=None)
@given(cut=st.integers(min_value=0, max_value=200))
def test_truncated_bodies_raise_decode_error(cut: int) -> None:
    body = encode_request(_metadata_request())
    cut %= len(body)
    with pytest.raises(DecodeError):
        decode_request(3, 12, body[:cut])


def _uvarint(n: int) -> bytes:
    out = bytearray()
    while True:
        b, n = n & 0x7F, n >> 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


@pytest.mark.parametrize("count", [2**31, 2**32 - 1, 2**32, 12492229793 & 0xFFFFFFFF])
@pytest.mark.parametrize(("api_key", "version"), [(19, 7), (20, 4), (3, 12)])
def test_huge_compact_array_lengths_are_refused_before_kio(
    api_key: int, version: int, count: int
) -> None:
    # kio's native reader reserves count * 8 bytes up front and aborts the process when the
    # allocation fails; the guard must refuse such bodies first.
    body = _uvarint(count + 1) + b"a" * 10
    with pytest.raises(DecodeError, match="array"):
        decode_request(api_key, version, body)


@pytest.mark.parametrize("count", [2**31 - 1, 10**9, 11])
def test_huge_legacy_array_lengths_are_refused_before_kio(count: int) -> None:
    body = count.to_bytes(4, "big") + b"a" * 10
    with pytest.raises(DecodeError, match="array"):
        decode_request(3, 1, body)


_ALL_VERSIONS = [
    (int(key), version, request)
    for key in ApiKey
    if (rng := codec_version_range(key)) is not None
    for version in range(rng[0], rng[1] + 1)
    for request in (True, False)
]


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(target=st.sampled_from(_ALL_VERSIONS), data=st.binary(max_size=120))
def test_random_bodies_for_every_api_version_raise_only_codec_errors(
    target: tuple[int, int, bool], data: bytes
) -> None:
    api_key, version, request = target
    decode = decode_request if request else decode_response
    try:
        decode(api_key, version, data)
    except CodecError:
        pass
