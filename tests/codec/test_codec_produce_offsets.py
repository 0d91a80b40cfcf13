"""The Produce response scan (codec/produce_offsets.py) against kio's decode, for every
Produce version the codec supports, on random responses and golden ones from real clients."""

from __future__ import annotations

import datetime
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kio.schema.errors import ErrorCode

from sluice.codec.errors import DecodeError, UnsupportedVersion
from sluice.codec.headers import response_header_size
from sluice.codec.messages import decode_response, encode_response
from sluice.codec.produce_offsets import (
    ProduceOffset,
    scan_produce_offsets,
    scan_produce_response,
)
from sluice.codec.schemas import known_versions, response_schema
from tests.codec.produce_entities import element
from tests.codec.test_codec_golden import RESPONSES

VERSIONS = known_versions(0, False)
i32 = st.integers(-(2**31), 2**31 - 1)
i64 = st.integers(-(2**63), 2**63 - 1)


@st.composite
def responses(draw: st.DrawFn) -> tuple[int, Any]:
    version = draw(st.sampled_from(VERSIONS))
    cls = response_schema(0, version)
    tcls = element(cls, "responses")
    pcls = element(tcls, "partition_responses")
    names = {f for f in pcls.__dataclass_fields__}
    topics = []
    for _ in range(draw(st.integers(0, 3))):
        parts = []
        for _ in range(draw(st.integers(0, 3))):
            kw: dict[str, Any] = {
                "index": draw(i32),
                "error_code": draw(st.sampled_from(list(ErrorCode))),
                "base_offset": draw(i64),
                "log_append_time": datetime.datetime.fromtimestamp(
                    draw(st.integers(0, 2**40)) / 1000, datetime.UTC
                ),
            }
            if "log_start_offset" in names:
                kw["log_start_offset"] = draw(i64)
            if "record_errors" in names:
                rcls = element(pcls, "record_errors")
                kw["record_errors"] = tuple(
                    rcls(
                        batch_index=draw(i32),
                        batch_index_error_message=draw(st.one_of(st.none(), st.text(max_size=9))),
                    )
                    for _ in range(draw(st.integers(0, 2)))
                )
                kw["error_message"] = draw(st.one_of(st.none(), st.text(max_size=30)))
            if "current_leader" in names:
                lcls = element(pcls, "current_leader")
                kw["current_leader"] = lcls(leader_id=draw(i32), leader_epoch=draw(i32))
            parts.append(pcls(**kw))
        key = (
            {"topic_id": draw(st.uuids())}
            if "topic_id" in tcls.__dataclass_fields__
            else {"name": draw(st.text(max_size=60))}
        )
        topics.append(tcls(**key, partition_responses=tuple(parts)))
    kw = {"responses": tuple(topics), "throttle_time": datetime.timedelta(milliseconds=3)}
    if "node_endpoints" in cls.__dataclass_fields__:
        ecls = element(cls, "node_endpoints")
        kw["node_endpoints"] = tuple(
            ecls(node_id=draw(i32), host="127.0.0.1", port=9092, rack=None)
            for _ in range(draw(st.integers(0, 2)))
        )
    return version, cls(**kw)


def kio_offsets(entity: Any) -> list[ProduceOffset]:
    return [
        ProduceOffset(
            t.topic_id if hasattr(t, "topic_id") else t.name,
            p.index,
            int(p.error_code),
            p.base_offset,
        )
        for t in entity.responses
        for p in t.partition_responses
    ]


@settings(max_examples=300, deadline=None)
@given(response=responses())
def test_scan_matches_kio_decode(response: tuple[int, Any]) -> None:
    version, entity = response
    body = encode_response(entity)
    decoded = decode_response(0, version, body)
    assert scan_produce_offsets(version, body) == kio_offsets(decoded)
    assert scan_produce_offsets(version, memoryview(body)) == kio_offsets(decoded)


@settings(max_examples=100, deadline=None)
@given(data=st.data(), response=responses())
def test_truncated_responses_fail_with_a_decode_error_or_a_prefix(
    data: st.DataObject, response: tuple[int, Any]
) -> None:
    version, entity = response
    body = encode_response(entity)
    full = scan_produce_offsets(version, body)
    cut = data.draw(st.integers(0, len(body) - 1))
    # The scan reads only the responses array: a cut after it changes nothing; a cut inside
    # it is an error, never a wrong answer.
    try:
        got = scan_produce_offsets(version, body[:cut])
    except DecodeError:
        return
    assert got == full


GOLDEN = [g for g in RESPONSES if g.api_key == 0]


@pytest.mark.parametrize("g", GOLDEN, ids=lambda g: g.name)
def test_golden_produce_responses(g: Any) -> None:
    size = response_header_size(g.body, 0, g.api_version)
    body = memoryview(g.body)[size:]
    entity = decode_response(0, g.api_version, body)
    found = scan_produce_offsets(g.api_version, body)
    assert found == kio_offsets(entity)
    assert found and all(o.base_offset >= 0 for o in found if o.error_code == 0)


def test_hostile_counts_and_unknown_versions() -> None:
    with pytest.raises(DecodeError, match="declared"):
        scan_produce_offsets(8, (2**31 - 1).to_bytes(4, "big"))
    with pytest.raises(DecodeError, match="declared"):
        scan_produce_offsets(10, b"\xff\xff\xff\xff\x0f")
    with pytest.raises(UnsupportedVersion):
        scan_produce_offsets(2, b"")


@settings(max_examples=300, deadline=None)
@given(response=responses())
def test_one_scan_tells_whether_node_endpoints_may_follow(response: tuple[int, Any]) -> None:
    # The Produce path's single scan must agree with the schema walk it replaced
    # (paths/responses.py `may_carry_endpoints`) on every version, with and without
    # KIP-951 node endpoints.
    from sluice.codec.headers import response_header_bytes
    from sluice.proxy.paths.responses import may_carry_endpoints

    version, entity = response
    body = encode_response(entity)
    offsets, tagged = scan_produce_response(version, body)
    assert offsets == scan_produce_offsets(version, body)
    frame = response_header_bytes(1, 0, version) + body
    assert tagged == may_carry_endpoints(0, version, frame)
    endpoints = getattr(entity, "node_endpoints", ())
    assert tagged == bool(endpoints)
