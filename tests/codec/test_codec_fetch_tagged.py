"""The fast KIP-951 check of Fetch responses (codec/fetch_splice.py `fetch_response_tagged`)
against the schema walk it replaced on the pass-through path (codec/guard.py `fields_end`):
they must agree on every flexible Fetch response (topic ids, aborted transactions, partition
tagged fields, node endpoints, records of any size), and a corrupt or cut body must never pass
as untagged where the schema walk would not let it."""

from __future__ import annotations

import dataclasses
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from sluice.codec.errors import CodecError
from sluice.codec.fetch_splice import fetch_response_tagged
from sluice.codec.guard import fields_end
from sluice.codec.headers import response_header_bytes, response_header_size
from sluice.codec.messages import encode_response
from sluice.codec.schemas import response_schema
from sluice.proxy.paths.responses import may_carry_endpoints
from tests.codec.test_codec_fetch_splice import responses


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
