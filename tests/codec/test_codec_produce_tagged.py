"""The fast KIP-951 check of Produce responses (codec/produce_offsets.py
`produce_response_tagged`) against the schema walk it replaced on the pass-through path
(codec/guard.py `fields_end`, still what every other response with tagged endpoints gets):
they must agree on every response, with or without errors, record errors, current-leader hints
and node endpoints, and a corrupt or cut body must never pass as untagged where the schema walk
would not let it."""

from __future__ import annotations

import dataclasses
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from kio.schema.errors import ErrorCode

from sluice.codec.errors import CodecError
from sluice.codec.guard import fields_end
from sluice.codec.headers import response_header_bytes, response_header_size
from sluice.codec.messages import encode_response
from sluice.codec.produce_offsets import produce_response_tagged
from sluice.codec.schemas import response_schema
from sluice.proxy.paths.responses import may_carry_endpoints
from tests.codec.produce_entities import element
from tests.codec.test_codec_produce_offsets import responses


def schema_walk(version: int, frame: bytes) -> bool:
    """What paths/responses.py `may_carry_endpoints` answered before the fast check."""
    size = response_header_size(frame, 0, version)
    try:
        end = fields_end(response_schema(0, version), frame[size:])
    except CodecError:
        return True
    return not (end == len(frame) - size - 1 and frame[-1] == 0)


@st.composite
def mixed(draw: st.DrawFn) -> tuple[int, Any]:
    """A Produce response whose partitions are each either as drawn (errors, messages,
    record errors, a current-leader hint) or made error-free as a broker sends them."""
    version, entity = draw(responses())
    pcls = element(element(type(entity), "responses"), "partition_responses")
    names = set(pcls.__dataclass_fields__)
    topics = []
    for t in entity.responses:
        parts = []
        for p in t.partition_responses:
            if draw(st.booleans()):
                plain: dict[str, Any] = {"error_code": ErrorCode.none}
                if "record_errors" in names:
                    plain.update(record_errors=(), error_message=None)
                if "current_leader" in names:
                    plain["current_leader"] = element(pcls, "current_leader")(
                        leader_id=-1, leader_epoch=-1)  # the default: no tag is written
                p = dataclasses.replace(p, **plain)
            parts.append(p)
        topics.append(dataclasses.replace(t, partition_responses=tuple(parts)))
    return version, dataclasses.replace(entity, responses=tuple(topics))


@settings(max_examples=400, deadline=None)
@given(response=mixed())
def test_fast_check_agrees_with_the_schema_walk(response: tuple[int, Any]) -> None:
    version, entity = response
    frame = response_header_bytes(7, 0, version) + encode_response(entity)
    size = response_header_size(frame, 0, version)
    fast = produce_response_tagged(version, frame, size)
    assert fast == produce_response_tagged(version, memoryview(frame)[size:])
    assert may_carry_endpoints(0, version, frame) == (fast if version >= 10 else False)
    if version >= 9:
        # Flexible versions (the schema walk's tail test is theirs). Node endpoints are the
        # only top-level tagged field the strategy writes.
        assert fast == schema_walk(version, frame)
        assert fast == bool(getattr(entity, "node_endpoints", ()))
    else:
        assert not fast  # no tagged fields before v9: the body ends where the schema says


@settings(max_examples=400, deadline=None)
@given(data=st.data(), response=mixed())
def test_corrupt_or_cut_bodies_never_pass_where_the_schema_walk_would_not(
    data: st.DataObject, response: tuple[int, Any]
) -> None:
    version, entity = response
    frame = bytearray(response_header_bytes(7, 0, version) + encode_response(entity))
    size = response_header_size(frame, 0, version)
    if data.draw(st.booleans()):
        del frame[data.draw(st.integers(size, len(frame) - 1)):]
    for _ in range(data.draw(st.integers(0, 3))):
        if len(frame) > size:
            at = data.draw(st.integers(size, len(frame) - 1))
            frame[at] = data.draw(st.integers(0, 255))
    fast = produce_response_tagged(version, bytes(frame), size)
    if version < 9:
        return  # nothing to rewrite in those versions (no tagged fields)
    walk = schema_walk(version, bytes(frame))
    # Both may be wrong about garbage in their own way, but the fast check must not clear a
    # body the schema walk would send to the full decode (that is where a hint is rewritten).
    assert fast or not walk


def test_a_node_endpoint_after_error_free_partitions_is_seen() -> None:
    # The shape KIP-951 produces: an error-free partition next to a NOT_LEADER_OR_FOLLOWER one
    # with its current leader, and the new leader's address at the top level.
    cls = response_schema(0, 10)
    tcls = element(cls, "responses")
    pcls = element(tcls, "partition_responses")
    lcls = element(pcls, "current_leader")
    ecls = element(cls, "node_endpoints")
    ok = pcls(index=0, error_code=ErrorCode.none, base_offset=5, log_start_offset=0,
              log_append_time=None, record_errors=(), error_message=None,
              current_leader=lcls(leader_id=-1, leader_epoch=-1))
    moved = dataclasses.replace(ok, index=1, error_code=ErrorCode.not_leader_or_follower,
                                base_offset=-1, current_leader=lcls(leader_id=2, leader_epoch=9))
    import datetime

    def frame(parts: tuple[Any, ...], endpoints: tuple[Any, ...]) -> bytes:
        body = encode_response(cls(
            responses=(tcls(name="t", partition_responses=parts),),
            throttle_time=datetime.timedelta(0), node_endpoints=endpoints))
        return response_header_bytes(1, 0, 10) + body

    size = response_header_size(frame((ok,), ()), 0, 10)
    assert not produce_response_tagged(10, frame((ok, ok), ()), size)
    endpoint = ecls(node_id=2, host="10.0.0.2", port=9092, rack=None)
    assert produce_response_tagged(10, frame((ok, moved), (endpoint,)), size)
    assert produce_response_tagged(10, frame((ok, ok), (endpoint,)), size)
    assert may_carry_endpoints(0, 10, frame((ok, moved), (endpoint,)))


def test_endpoints_smuggled_past_a_partitions_current_leader_are_not_cleared() -> None:
    # As tests/codec/test_codec_fetch_tagged.py's smuggling case: a partition's current_leader
    # (a struct of 9 bytes) declares more, and what a client reads after the struct is an empty
    # topic tag section, throttle_time and node endpoints naming the broker itself. Found by
    # the review of round 39; the schema skipper of a partition took the declared size.
    import datetime
    import struct

    for version in (10, 11):
        cls = response_schema(0, version)
        tcls = element(cls, "responses")
        pcls = element(tcls, "partition_responses")
        lcls = element(pcls, "current_leader")
        ncls = element(cls, "node_endpoints")
        epoch = datetime.datetime.fromtimestamp(0, datetime.UTC)
        part = pcls(index=0, error_code=ErrorCode.none, base_offset=5, log_append_time=epoch,
                    log_start_offset=0, record_errors=(), error_message=None,
                    current_leader=lcls(leader_id=3, leader_epoch=7))
        entity = cls(responses=(tcls(name="t", partition_responses=(part,)),),
                     throttle_time=datetime.timedelta(0))
        hidden = dataclasses.replace(
            entity, node_endpoints=(ncls(node_id=1, host="broker-1.internal", port=9092),))
        body, with_endpoints = encode_response(entity), encode_response(hidden)
        client_tail = with_endpoints[len(body) - 6:]  # topic tags, throttle, top-level tags
        assert b"broker-1.internal" in client_tail
        tag = b"\x01\x00\x09" + struct.pack(">ii", 3, 7) + b"\x00"
        assert body.count(tag) == 1
        smuggled = b"\x01\x00" + bytes([9 + len(client_tail)]) + tag[3:] + client_tail
        frame = response_header_bytes(7, 0, version) + body.replace(tag, smuggled)
        size = response_header_size(frame, 0, version)
        assert schema_walk(version, frame)
        assert produce_response_tagged(version, frame, size)
        assert may_carry_endpoints(0, version, frame)
