"""The fast KIP-951 check of Fetch responses (codec/fetch_splice.py `fetch_response_tagged`)
against the schema walk it replaced on the pass-through path (codec/guard.py `fields_end`):
they must agree on every flexible Fetch response (topic ids, aborted transactions, partition
tagged fields, node endpoints, records of any size), and a corrupt or cut body must never pass
as untagged where the schema walk would not let it."""

from __future__ import annotations

import dataclasses
import datetime
import struct
import uuid
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from kio.schema.errors import ErrorCode

from sluice.codec import fetch_splice
from sluice.codec.errors import CodecError
from sluice.codec.fetch_splice import fetch_response_tagged
from sluice.codec.guard import fields_end
from sluice.codec.headers import response_header_bytes, response_header_size
from sluice.codec.messages import encode_response
from sluice.codec.schemas import response_schema
from sluice.proxy.paths.responses import may_carry_endpoints
from tests.codec.test_codec_fetch_splice import element, responses


def schema_walk(version: int, frame: bytes) -> bool:
    """What paths/responses.py `may_carry_endpoints` answered for Fetch before the fast check."""
    size = response_header_size(frame, 1, version)
    try:
        end = fields_end(response_schema(1, version), frame[size:])
    except CodecError:
        return True
    return not (end == len(frame) - size - 1 and frame[-1] == 0)


@st.composite
def flexible(draw: st.DrawFn) -> tuple[int, Any]:
    """A flexible Fetch response, some of its records made large (a length of 3 bytes)."""
    version, entity = draw(responses().filter(lambda r: r[0] >= 12))
    topics = []
    for t in entity.responses:
        parts = tuple(
            dataclasses.replace(p, records=bytes(draw(st.sampled_from([200, 70_000, 2_100_000]))))
            if p.records is not None and draw(st.booleans()) else p
            for p in t.partitions
        )
        topics.append(dataclasses.replace(t, partitions=parts))
    return version, dataclasses.replace(entity, responses=tuple(topics))


@settings(max_examples=300, deadline=None)
@given(response=flexible())
def test_fast_check_agrees_with_the_schema_walk(response: tuple[int, Any]) -> None:
    version, entity = response
    frame = response_header_bytes(7, 1, version) + encode_response(entity)
    size = response_header_size(frame, 1, version)
    fast = fetch_response_tagged(version, frame, size)
    assert fast == fetch_response_tagged(version, memoryview(frame)[size:])
    assert fast == schema_walk(version, frame)
    assert fast == bool(getattr(entity, "node_endpoints", ()))
    assert may_carry_endpoints(1, version, frame) == (fast if version >= 16 else False)


@settings(max_examples=300, deadline=None)
@given(data=st.data(), response=flexible())
def test_corrupt_or_cut_bodies_never_pass_where_the_schema_walk_would_not(
    data: st.DataObject, response: tuple[int, Any]
) -> None:
    version, entity = response
    frame = bytearray(response_header_bytes(7, 1, version) + encode_response(entity))
    size = response_header_size(frame, 1, version)
    if data.draw(st.booleans()):
        del frame[data.draw(st.integers(size, len(frame) - 1)):]
    for _ in range(data.draw(st.integers(0, 3))):
        if len(frame) > size:
            at = data.draw(st.integers(size, len(frame) - 1))
            frame[at] = data.draw(st.integers(0, 255))
    fast = fetch_response_tagged(version, bytes(frame), size)
    # Both may be wrong about garbage in their own way, but the fast check must not clear a
    # body the schema walk would send to the full decode (that is where an address is rewritten).
    assert fast or not schema_walk(version, bytes(frame))


def test_versions_without_tagged_fields_are_left_to_the_decode() -> None:
    assert fetch_response_tagged(11, b"\x00" * 20)
    assert fetch_response_tagged(99, b"\x00" * 20)


def _smuggled_endpoints(version: int) -> tuple[bytes, bytes]:
    """(frame, what a client reads as its top-level tagged fields): a Fetch response whose one
    partition declares a current_leader tag longer than the struct. A client reads the struct
    (9 bytes) whatever size the tag declares, then takes the bytes after it for the rest of the
    response: an empty topic tag section and node endpoints naming the broker itself. A walk
    that skips the tag by its declared size sees none and clears the response unrewritten."""
    cls = response_schema(1, version)
    tcls = element(cls, "responses")
    pcls = element(tcls, "partitions")
    lcls = element(pcls, "current_leader")
    ncls = element(cls, "node_endpoints")
    leader = lcls(leader_id=3, leader_epoch=7)
    part = pcls(partition_index=0, error_code=ErrorCode.none, high_watermark=0,
                last_stable_offset=0, log_start_offset=0, aborted_transactions=None,
                preferred_read_replica=-1, records=None, current_leader=leader)
    entity = cls(throttle_time=datetime.timedelta(0), error_code=ErrorCode.none, session_id=0,
                 responses=(tcls(topic_id=uuid.UUID(int=5), partitions=(part,)),))
    with_endpoints = dataclasses.replace(
        entity, node_endpoints=(ncls(node_id=1, host="broker-1.internal", port=9092),))
    body, hidden = encode_response(entity), encode_response(with_endpoints)
    # `hidden` ends in the topic's tag section and the top-level one holding the endpoints:
    # what follows the struct in the client's reading.
    client_tail = hidden[len(body) - 2:]
    tag = b"\x01\x01\x09" + struct.pack(">ii", 3, 7) + b"\x00"  # one tag: current_leader
    assert body.count(tag) == 1
    smuggled = b"\x01\x01" + bytes([9 + len(client_tail)]) + tag[3:] + client_tail
    return response_header_bytes(7, 1, version) + body.replace(tag, smuggled), client_tail


def test_endpoints_smuggled_past_a_known_tags_struct_are_not_cleared() -> None:
    # Found by the review of the native readers (round 39): the fast walks (C and Python) and
    # the schema walk skipped a partition's current_leader by its declared size and cleared
    # this frame, relayed as it was: a client would connect to the broker's own address.
    for version in (16, 17):
        frame, client_tail = _smuggled_endpoints(version)
        assert b"broker-1.internal" in client_tail
        size = response_header_size(frame, 1, version)
        assert schema_walk(version, frame)
        assert fetch_response_tagged(version, frame, size)
        assert may_carry_endpoints(1, version, frame)
        saved = fetch_splice._native_tagged
        fetch_splice._native_tagged = None
        try:
            assert fetch_response_tagged(version, frame, size)
        finally:
            fetch_splice._native_tagged = saved
