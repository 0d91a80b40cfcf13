"""The Produce request scan and splice (codec/produce_splice.py) against kio: the scan finds
what kio decodes, and a splice writes the bytes kio writes for the same change, for every
Produce version the codec supports; golden requests from real clients; hostile bodies."""

from __future__ import annotations

import dataclasses
import datetime
import uuid
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sluice.codec.errors import DecodeError, UnsupportedVersion
from sluice.codec.headers import parse_request_header
from sluice.codec.messages import decode_request, encode_request
from sluice.codec.produce_splice import (
    produce_head,
    produce_topics,
    scan_produce_request,
    splice_produce_records,
)
from sluice.codec.schemas import known_versions, request_schema
from tests.codec.produce_entities import element
from tests.codec.test_codec_golden import REQUESTS

VERSIONS = known_versions(0, True)


def build(version: int, txn: str | None, acks: int, topics: list[tuple[Any, list[Any]]]) -> Any:
    cls = request_schema(0, version)
    tcls = element(cls, "topic_data")
    pcls = element(tcls, "partition_data")
    key = "topic_id" if version >= 13 else "name"
    return cls(
        transactional_id=txn,
        acks=acks,
        timeout=datetime.timedelta(milliseconds=1500),
        topic_data=tuple(
            tcls(**{key: t, "partition_data": tuple(pcls(index=i, records=r) for i, r in parts)})
            for t, parts in topics
        ),
    )


# Records around the one-byte/two-byte varint boundary (127) of flexible lengths, and null.
records_st = st.one_of(st.none(), st.binary(max_size=300))
partitions_st = st.lists(
    st.tuples(st.integers(-(2**31), 2**31 - 1), records_st), min_size=0, max_size=4
)


@st.composite
def requests(draw: st.DrawFn) -> tuple[int, Any]:
    version = draw(st.sampled_from(VERSIONS))
    name_st: st.SearchStrategy[Any] = (
        st.uuids() if version >= 13 else st.text(min_size=0, max_size=140)
    )
    topics = draw(st.lists(st.tuples(name_st, partitions_st), max_size=4))
    txn = draw(st.one_of(st.none(), st.text(max_size=20)))
    acks = draw(st.sampled_from([-1, 0, 1]))
    return version, build(version, txn, acks, topics)


@st.composite
def changes(
    draw: st.DrawFn, entity: Any
) -> tuple[dict[tuple[int, int], bytes | None], set[tuple[int, int]]]:
    positions = [
        (i, j) for i, t in enumerate(entity.topic_data) for j in range(len(t.partition_data))
    ]
    chosen = draw(st.lists(st.sampled_from(positions), unique=True)) if positions else []
    records: dict[tuple[int, int], bytes | None] = {}
    drop: set[tuple[int, int]] = set()
    for pos in chosen:
        if draw(st.booleans()):
            records[pos] = draw(records_st)
        else:
            drop.add(pos)
    return records, drop


def expected(
    entity: Any, records: dict[tuple[int, int], bytes | None], drop: set[tuple[int, int]]
) -> bytes:
    """What re-encoding the changed entity with kio gives (the proxy's way before the splice)."""
    topics = []
    for i, t in enumerate(entity.topic_data):
        touched = any(k[0] == i for k in (*records, *drop))
        parts = [
            dataclasses.replace(p, records=records[(i, j)]) if (i, j) in records else p
            for j, p in enumerate(t.partition_data)
            if (i, j) not in drop
        ]
        if touched and not parts:
            continue
        topics.append(dataclasses.replace(t, partition_data=tuple(parts)))
    return encode_request(dataclasses.replace(entity, topic_data=tuple(topics)))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), request=requests())
def test_splice_writes_what_kio_writes_for_the_same_change(
    data: st.DataObject, request: tuple[int, Any]
) -> None:
    version, entity = request
    body = encode_request(entity)
    layout = scan_produce_request(version, body)
    records, drop = data.draw(changes(entity))
    assert splice_produce_records(body, layout, records, drop) == expected(entity, records, drop)


@settings(max_examples=200, deadline=None)
@given(request=requests())
def test_scan_finds_what_kio_decodes(request: tuple[int, Any]) -> None:
    version, entity = request
    body = encode_request(entity)
    layout = scan_produce_request(version, bytearray(body))
    decoded = decode_request(0, version, body)
    assert layout.flexible == (version >= 9)
    assert layout.transactional_id == decoded.transactional_id
    assert layout.acks == decoded.acks
    assert layout.timeout_ms == decoded.timeout.total_seconds() * 1000
    assert len(layout.topics) == len(decoded.topic_data)
    for slot, topic in zip(layout.topics, decoded.topic_data, strict=True):
        assert slot.name == getattr(topic, "name", None)
        assert slot.topic_id == getattr(topic, "topic_id", None)
        got = [
            (p.partition, None if p.records is None else bytes(p.records)) for p in slot.partitions
        ]
        assert got == [(p.index, p.records) for p in topic.partition_data]
    # Nothing changed: the body comes back as it was.
    assert splice_produce_records(body, layout, {}) == body
    # The topics-only read agrees with the scan.
    read = produce_topics(version, body)
    assert read.keys == [t.name if t.name is not None else t.topic_id for t in layout.topics]
    assert read.acks == layout.acks


@settings(max_examples=100, deadline=None)
@given(data=st.data(), request=requests())
def test_every_truncation_is_a_decode_error(data: st.DataObject, request: tuple[int, Any]) -> None:
    version, entity = request
    body = encode_request(entity)
    cut = data.draw(st.integers(0, len(body) - 1))
    with pytest.raises(DecodeError):
        scan_produce_request(version, body[:cut])
    with pytest.raises(DecodeError, match="trailing"):
        scan_produce_request(version, body + b"\x00")
    with pytest.raises(DecodeError):
        produce_topics(version, body[:cut])
    with pytest.raises(DecodeError, match="trailing"):
        produce_topics(version, body + b"\x00")


PRODUCE_GOLDEN = [g for g in REQUESTS if g.api_key == 0]


@pytest.mark.parametrize("g", PRODUCE_GOLDEN, ids=lambda g: g.name)
def test_golden_produce_requests_scan_and_splice(g: Any) -> None:
    header = parse_request_header(g.body)
    body = bytes(g.body[header.header_size :])
    entity = decode_request(0, g.api_version, body)
    layout = scan_produce_request(g.api_version, memoryview(body))
    assert [bytes(p.records or b"") for t in layout.topics for p in t.partitions] == [
        p.records or b"" for t in entity.topic_data for p in t.partition_data
    ]
    # The client's own bytes come back unchanged when the records are "replaced" by themselves.
    same = {
        (i, j): bytes(p.records) if p.records is not None else None
        for i, t in enumerate(layout.topics)
        for j, p in enumerate(t.partitions)
    }
    assert splice_produce_records(body, layout, same) == body
    first = (0, 0)
    masked = b"\x01" * 300
    spliced = splice_produce_records(body, layout, {first: masked})
    assert spliced == expected(entity, {first: masked}, set())


def test_golden_clients_cover_produce_versions() -> None:
    # Non-flexible (v7), the first flexible version (v9) and v10, from three clients.
    assert {g.api_version for g in PRODUCE_GOLDEN} >= {7, 9, 10}


def test_unknown_tagged_fields_are_carried_over_untouched() -> None:
    entity = build(9, None, -1, [("t", [(0, b"abc"), (1, b"def")])])
    body = encode_request(entity)
    layout = scan_produce_request(9, body)
    part = layout.topics[0].partitions[1]
    # Give partition 1 a tagged field (tag 7, two bytes) that no schema knows.
    tagged = body[: part.records_end] + b"\x01\x07\x02zz" + body[part.records_end + 1 :]
    layout = scan_produce_request(9, tagged)
    out = splice_produce_records(tagged, layout, {(0, 0): b"XYZW"})
    again = scan_produce_request(9, out)
    assert [bytes(p.records or b"") for p in again.topics[0].partitions] == [b"XYZW", b"def"]
    assert out.endswith(b"\x01\x07\x02zz\x00\x00")  # partition tags, then topic and top tags


def test_hostile_counts_and_versions_are_refused() -> None:
    entity = build(8, None, -1, [])
    body = bytearray(encode_request(entity))
    body[-4:] = (2**31 - 1).to_bytes(4, "big")  # topic count
    with pytest.raises(DecodeError, match="declared"):
        scan_produce_request(8, body)
    with pytest.raises(UnsupportedVersion):
        scan_produce_request(99, b"")
    layout = scan_produce_request(8, encode_request(build(8, None, 1, [("t", [(0, b"")])])))
    with pytest.raises(ValueError, match="position"):
        splice_produce_records(b"", layout, {(0, 1): b""})


def test_topic_ids_survive_the_splice() -> None:
    tid = uuid.uuid4()
    entity = build(13, "tx", -1, [(tid, [(3, b"r" * 200)])])
    body = encode_request(entity)
    layout = scan_produce_request(13, body)
    assert layout.topics[0].topic_id == tid and layout.topics[0].name is None
    out = splice_produce_records(body, layout, {(0, 0): b"s" * 100})
    assert decode_request(0, 13, out).topic_data[0].topic_id == tid


@settings(max_examples=200, deadline=None)
@given(request=requests())
def test_the_head_read_agrees_with_the_full_read(request: tuple[int, Any]) -> None:
    version, entity = request
    body = encode_request(entity)
    head = produce_head(version, body)
    full = produce_topics(version, body)
    if len(full.keys) == 1:
        assert head == full
    else:
        assert head is None  # several topics (or none): the caller reads them all


def test_prefix_is_written_before_the_body_in_one_frame() -> None:
    # The produce path passes the request header as the prefix: the frame is built in one copy.
    entity = build(9, None, -1, [("t", [(0, b"abc"), (1, b"def")])])
    body = encode_request(entity)
    layout = scan_produce_request(9, body)
    header = b"\x00\x00\x00\x09HEADER"
    view = memoryview(header + body)
    out = splice_produce_records(view[len(header):], layout, {(0, 1): b"XYZW"},
                                 prefix=view[: len(header)])
    assert out == header + splice_produce_records(body, layout, {(0, 1): b"XYZW"})
    assert isinstance(out, bytes)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), request=requests())
def test_splice_without_drops_writes_what_kio_writes(
    data: st.DataObject, request: tuple[int, Any]
) -> None:
    # Only replacements (the splice's short way: every count and entry stays), in any number
    # and order of positions, after a header prefix.
    version, entity = request
    body = encode_request(entity)
    layout = scan_produce_request(version, body)
    positions = [
        (i, j) for i, t in enumerate(entity.topic_data) for j in range(len(t.partition_data))
    ]
    chosen = data.draw(st.lists(st.sampled_from(positions), unique=True)) if positions else []
    records = {pos: data.draw(records_st) for pos in chosen}
    spliced = splice_produce_records(body, layout, records, (), prefix=b"head")
    assert spliced == b"head" + expected(entity, records, set())


@settings(max_examples=300, deadline=None)
@given(data=st.data(), request=requests(),
       txn=st.one_of(st.none(), st.text(max_size=200)))
def test_the_head_read_never_names_another_topic_than_the_full_read(
    data: st.DataObject, request: tuple[int, Any], txn: str | None
) -> None:
    # The internal-topics check trusts the head read: on a cut or corrupted body it may fail
    # or give up (None), but whenever both reads succeed they name the same topic, and a cut
    # body's head is the whole body's head. Transactional ids past 127 bytes take the varint
    # branch of flexible versions.
    version, entity = request
    body = bytearray(encode_request(dataclasses.replace(entity, transactional_id=txn)))
    whole = produce_head(version, bytes(body))
    if data.draw(st.booleans()):
        del body[data.draw(st.integers(0, len(body))):]
        try:
            cut = produce_head(version, bytes(body))
        except DecodeError:
            return
        assert cut is None or cut == whole
        return
    for _ in range(data.draw(st.integers(1, 3))):
        if body:
            body[data.draw(st.integers(0, min(len(body) - 1, 260)))] = data.draw(
                st.integers(0, 255))
    try:
        head = produce_head(version, bytes(body))
        full = produce_topics(version, bytes(body))
    except DecodeError:
        return
    if len(full.keys) == 1:
        assert head == full
    else:
        assert head is None


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), request=requests())
def test_splice_pieces_are_what_kio_writes_and_hold_the_new_records_uncopied(
    data: st.DataObject, request: tuple[int, Any]
) -> None:
    # The produce path hands the connection the splice's pieces (one writev): joined, they
    # are kio's bytes for the same change, after the prefix; every new records object is one
    # of the pieces itself, and the rest are views of the body and prefix, not copies.
    from sluice.codec.produce_splice import splice_produce_pieces

    version, entity = request
    body = encode_request(entity)
    layout = scan_produce_request(version, body)
    records, drop = data.draw(changes(entity))
    records = {pos: None if new is None else bytes(bytearray(new)) for pos, new in records.items()}
    prefix = b"head"
    pieces = splice_produce_pieces(memoryview(body), layout, records, drop, prefix=prefix)
    assert b"".join(pieces) == prefix + expected(entity, records, drop)
    kept = [new for pos, new in records.items() if new is not None and pos not in drop]
    for new in kept:
        assert any(p is new for p in pieces)
    for p in pieces:
        assert isinstance(p, memoryview) or p is prefix or any(p is new for new in kept) or (
            len(p) <= 5)  # the length and count fields the splice writes
