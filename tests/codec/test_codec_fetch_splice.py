"""The Fetch response scan and splice (codec/fetch_splice.py) against kio: the scan finds what
kio decodes, and a splice writes the bytes kio writes for the same change, for every Fetch
version the codec supports (topic ids, aborted transactions, partition tagged fields and the
KIP-951 node endpoints included); golden responses from real clients; hostile bodies."""

from __future__ import annotations

import dataclasses
import datetime
import itertools
import uuid
from dataclasses import fields
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kio.schema.errors import ErrorCode

from sluice.codec.errors import DecodeError, UnsupportedVersion
from sluice.codec.fetch_splice import scan_fetch_response, splice_fetch_records
from sluice.codec.headers import response_header_size
from sluice.codec.messages import decode_response, encode_response
from sluice.codec.schemas import known_versions, response_schema
from tests.codec.produce_entities import element
from tests.codec.test_codec_golden import RESPONSES

VERSIONS = [v for v in known_versions(1, False) if v >= 4]
CODES = [ErrorCode(c) for c in (0, 1, 3, 6, 74, 100)]


def _has(cls: type[Any], name: str) -> bool:
    return any(f.name == name for f in fields(cls))


records_st = st.one_of(st.none(), st.binary(max_size=300))
i64_st = st.integers(-(2**63), 2**63 - 1)


@st.composite
def partitions(draw: st.DrawFn, pcls: type[Any]) -> Any:
    kwargs: dict[str, Any] = {
        "partition_index": draw(st.integers(-(2**31), 2**31 - 1)),
        "error_code": draw(st.sampled_from(CODES)),
        "high_watermark": draw(i64_st),
        "last_stable_offset": draw(i64_st),
        "records": draw(records_st),
    }
    acls = element(pcls, "aborted_transactions")
    kwargs["aborted_transactions"] = draw(
        st.one_of(
            st.none(),
            st.lists(
                st.builds(lambda p, o: acls(producer_id=p, first_offset=o), i64_st, i64_st),
                max_size=3,
            ).map(tuple),
        )
    )
    if _has(pcls, "log_start_offset"):
        kwargs["log_start_offset"] = draw(i64_st)
    if _has(pcls, "preferred_read_replica"):
        kwargs["preferred_read_replica"] = draw(st.integers(-1, 5))
    if _has(pcls, "current_leader") and draw(st.booleans()):
        lcls = element(pcls, "current_leader")
        kwargs["current_leader"] = lcls(leader_id=draw(st.integers(0, 9)), leader_epoch=7)
    if _has(pcls, "diverging_epoch") and draw(st.booleans()):
        dcls = element(pcls, "diverging_epoch")
        kwargs["diverging_epoch"] = dcls(epoch=3, end_offset=draw(i64_st))
    return pcls(**kwargs)


@st.composite
def responses(draw: st.DrawFn) -> tuple[int, Any]:
    version = draw(st.sampled_from(VERSIONS))
    cls = response_schema(1, version)
    tcls = element(cls, "responses")
    pcls = element(tcls, "partitions")
    by_id = version >= 13
    topics = []
    for _ in range(draw(st.integers(0, 3))):
        parts = tuple(draw(st.lists(partitions(pcls), max_size=3)))
        if by_id:
            topics.append(tcls(topic_id=draw(st.one_of(st.none(), st.uuids())), partitions=parts))
        else:
            topics.append(tcls(topic=draw(st.text(max_size=140)), partitions=parts))
    kwargs: dict[str, Any] = {
        "throttle_time": datetime.timedelta(milliseconds=draw(st.integers(0, 10_000))),
        "responses": tuple(topics),
    }
    if _has(cls, "error_code"):
        kwargs["error_code"] = draw(st.sampled_from(CODES))
        kwargs["session_id"] = draw(st.integers(0, 2**31 - 1))
    if _has(cls, "node_endpoints") and draw(st.booleans()):
        ncls = element(cls, "node_endpoints")
        kwargs["node_endpoints"] = (ncls(node_id=1, host="broker-1.internal", port=9092),)
    return version, cls(**kwargs)


Change = tuple[dict[tuple[int, int], bytes | None], dict[tuple[int, int], int]]


@st.composite
def changes(draw: st.DrawFn, entity: Any) -> Change:
    positions = [(i, j) for i, t in enumerate(entity.responses) for j in range(len(t.partitions))]
    chosen = draw(st.lists(st.sampled_from(positions), unique=True)) if positions else []
    records: dict[tuple[int, int], bytes | None] = {}
    errors: dict[tuple[int, int], int] = {}
    for pos in chosen:
        kind = draw(st.sampled_from(["records", "error", "both"]))
        if kind in ("records", "both"):
            records[pos] = draw(records_st)
        if kind in ("error", "both"):
            errors[pos] = draw(st.sampled_from([2, 100, 87]))
    return records, errors


def expected(entity: Any, records: dict[Any, bytes | None], errors: dict[Any, int]) -> bytes:
    """What re-encoding the changed entity with kio gives (the proxy's way before the splice)."""
    topics = []
    for i, t in enumerate(entity.responses):
        parts = []
        for j, p in enumerate(t.partitions):
            if (i, j) in records:
                p = dataclasses.replace(p, records=records[(i, j)])
            if (i, j) in errors:
                p = dataclasses.replace(p, error_code=ErrorCode(errors[(i, j)]))
            parts.append(p)
        topics.append(dataclasses.replace(t, partitions=tuple(parts)))
    return encode_response(dataclasses.replace(entity, responses=tuple(topics)))


def _a_change(data: st.DataObject, response: tuple[int, Any]) -> tuple[
        int, Any, bytes, Any, dict[tuple[int, int], Any], dict[tuple[int, int], int]]:
    """A response's version, entity, encoded body and scanned layout, with a drawn change."""
    version, entity = response
    body = encode_response(entity)
    records, errors = data.draw(changes(entity))
    return version, entity, body, scan_fetch_response(version, body), records, errors


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), response=responses())
def test_splice_writes_what_kio_writes_for_the_same_change(
    data: st.DataObject, response: tuple[int, Any]
) -> None:
    version, entity, body, layout, records, errors = _a_change(data, response)
    out = splice_fetch_records(body, layout, records, errors)
    assert out == expected(entity, records, errors)
    # And kio reads the spliced body back as the changed entity (semantic equality).
    assert decode_response(1, version, out) == decode_response(
        1, version, expected(entity, records, errors)
    )


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), response=responses())
def test_records_given_as_pieces_splice_as_their_concatenation(
    data: st.DataObject, response: tuple[int, Any]
) -> None:
    # The fetch path hands each partition's batches over as built (a list), unjoined: the
    # result is what kio writes for the joined bytes.
    _, entity, body, layout, records, errors = _a_change(data, response)
    pieces: dict[tuple[int, int], Any] = {}
    for pos, new in records.items():
        if new is None:
            pieces[pos] = None
            continue
        cuts = sorted(data.draw(st.lists(st.integers(0, len(new)), max_size=4)))
        bounds = [0, *cuts, len(new)]
        split = [new[a:b] for a, b in itertools.pairwise(bounds)]
        kind = data.draw(st.sampled_from([list, tuple, "views"]))
        if kind == "views":
            pieces[pos] = [memoryview(x) for x in split]
        else:
            pieces[pos] = kind(split)  # type: ignore[operator]
    out = splice_fetch_records(memoryview(body), layout, pieces, errors)
    assert out == expected(entity, records, errors)


@settings(max_examples=200, deadline=None)
@given(response=responses(), header=st.binary(min_size=0, max_size=9))
def test_scan_finds_what_kio_decodes(response: tuple[int, Any], header: bytes) -> None:
    version, entity = response
    body = encode_response(entity)
    # Scanned inside a frame: offsets point into the frame, the header bytes are kept.
    frame = header + body
    layout = scan_fetch_response(version, bytearray(frame), len(header))
    decoded = decode_response(1, version, body)
    assert layout.flexible == (version >= 12)
    assert layout.error_code == int(getattr(decoded, "error_code", 0))
    assert layout.endpoints == bool(getattr(decoded, "node_endpoints", ()))
    assert len(layout.topics) == len(decoded.responses)
    for slot, topic in zip(layout.topics, decoded.responses, strict=True):
        assert slot.name == getattr(topic, "topic", None)
        assert slot.topic_id == getattr(topic, "topic_id", None)
        got = [
            (p.partition, p.error_code, None if p.records is None else bytes(p.records))
            for p in slot.partitions
        ]
        assert got == [(p.partition_index, int(p.error_code), p.records) for p in topic.partitions]
    # Nothing changed: the frame comes back as it was.
    assert splice_fetch_records(frame, layout, {}) == frame


@settings(max_examples=100, deadline=None)
@given(data=st.data(), response=responses())
def test_every_truncation_is_a_decode_error(data: st.DataObject, response: tuple[int, Any]) -> None:
    version, entity = response
    body = encode_response(entity)
    cut = data.draw(st.integers(0, len(body) - 1))
    with pytest.raises(DecodeError):
        scan_fetch_response(version, body[:cut])
    with pytest.raises(DecodeError, match="trailing"):
        scan_fetch_response(version, body + b"\x00")


FETCH_GOLDEN = [g for g in RESPONSES if g.api_key == 1 and g.api_version >= 4]


@pytest.mark.parametrize("g", FETCH_GOLDEN, ids=lambda g: g.name)
def test_golden_fetch_responses_scan_and_splice(g: Any) -> None:
    size = response_header_size(g.body, 1, g.api_version)
    frame = g.body
    entity = decode_response(1, g.api_version, frame[size:])
    layout = scan_fetch_response(g.api_version, memoryview(frame), size)
    assert [bytes(p.records or b"") for t in layout.topics for p in t.partitions] == [
        p.records or b"" for t in entity.responses for p in t.partitions
    ]
    same = {
        (i, j): bytes(p.records) if p.records is not None else None
        for i, t in enumerate(layout.topics)
        for j, p in enumerate(t.partitions)
    }
    assert splice_fetch_records(frame, layout, same) == frame
    if layout.topics and layout.topics[0].partitions:
        masked = b"\x01" * 300
        out = splice_fetch_records(frame, layout, {(0, 0): masked}, {(0, 0): 0})
        assert out[:size] == frame[:size]
        want = expected(entity, {(0, 0): masked}, {(0, 0): 0})
        if encode_response(entity) == frame[size:]:
            assert out[size:] == want
        else:
            # The broker wrote something kio writes otherwise (Tansu sends an empty
            # node_endpoints tag, kio leaves it out): the same response, and the broker's
            # bytes are kept.
            assert decode_response(1, g.api_version, out[size:]) == decode_response(
                1, g.api_version, want
            )
            assert out[-4:] == frame[-4:]


def test_golden_clients_cover_fetch_versions() -> None:
    # Non-flexible and flexible versions, from the three clients.
    versions = {g.api_version for g in FETCH_GOLDEN}
    assert any(v < 12 for v in versions) and any(v >= 12 for v in versions)


def test_unknown_tagged_fields_are_carried_over_untouched() -> None:
    cls = response_schema(1, 12)
    tcls = element(cls, "responses")
    pcls = element(tcls, "partitions")
    part = pcls(
        partition_index=0,
        error_code=ErrorCode(0),
        high_watermark=5,
        aborted_transactions=None,
        records=b"abc",
    )
    entity = cls(
        throttle_time=datetime.timedelta(0),
        error_code=ErrorCode(0),
        session_id=0,
        responses=(tcls(topic="t", partitions=(part, dataclasses.replace(part, records=b"d"))),),
    )
    body = encode_response(entity)
    slot = scan_fetch_response(12, body).topics[0].partitions[1]
    # Give partition 1 a tagged field (tag 7, two bytes) that no schema knows.
    tagged = body[: slot.records_end] + b"\x01\x07\x02zz" + body[slot.records_end + 1 :]
    layout = scan_fetch_response(12, tagged)
    out = splice_fetch_records(tagged, layout, {(0, 0): b"XYZW", (0, 1): None}, {(0, 1): 87})
    again = scan_fetch_response(12, out)
    assert [(p.error_code, p.records) for p in again.topics[0].partitions] == [
        (0, b"XYZW"),
        (87, None),
    ]
    assert out.endswith(b"\x00\x01\x07\x02zz\x00\x00")  # null records, tags, topic and top tags


def test_hostile_counts_and_versions_are_refused() -> None:
    entity = response_schema(1, 11)(
        throttle_time=datetime.timedelta(0), error_code=ErrorCode(0), session_id=0, responses=()
    )
    body = bytearray(encode_response(entity))
    body[-4:] = (2**31 - 1).to_bytes(4, "big")  # topic count
    with pytest.raises(DecodeError, match="declared"):
        scan_fetch_response(11, body)
    with pytest.raises(UnsupportedVersion):
        scan_fetch_response(99, b"")
    with pytest.raises(UnsupportedVersion):
        scan_fetch_response(3, b"")
    layout = scan_fetch_response(11, encode_response(entity))
    with pytest.raises(ValueError, match="position"):
        splice_fetch_records(b"", layout, {(0, 0): b""})


def test_an_empty_node_endpoints_tag_holds_no_address() -> None:
    cls = response_schema(1, 16)
    entity = cls(
        throttle_time=datetime.timedelta(0), error_code=ErrorCode(0), session_id=1, responses=()
    )
    body = encode_response(entity)
    assert body[-1:] == b"\x00"
    for tags in (b"\x01\x00\x01\x01", b"\x01\x00\x01\x00"):
        assert not scan_fetch_response(16, body[:-1] + tags).endpoints
    # Any other tag may hold one (or is unknown): the caller decodes with kio.
    assert scan_fetch_response(16, body[:-1] + b"\x01\x05\x01\x01").endpoints
    assert scan_fetch_response(16, body[:-1] + b"\x02\x00\x01\x01\x05\x01\x01").endpoints


def test_topic_ids_and_node_endpoints_survive_the_splice() -> None:
    cls = response_schema(1, 16)
    tcls = element(cls, "responses")
    pcls = element(tcls, "partitions")
    ncls = element(cls, "node_endpoints")
    tid = uuid.uuid4()
    part = pcls(
        partition_index=3,
        error_code=ErrorCode(0),
        high_watermark=5,
        aborted_transactions=(),
        records=b"r" * 200,
    )
    entity = cls(
        throttle_time=datetime.timedelta(0),
        error_code=ErrorCode(0),
        session_id=1,
        responses=(tcls(topic_id=tid, partitions=(part,)),),
        node_endpoints=(ncls(node_id=2, host="10.0.0.2", port=9092),),
    )
    body = encode_response(entity)
    layout = scan_fetch_response(16, body)
    assert layout.topics[0].topic_id == tid and layout.topics[0].name is None
    assert layout.endpoints
    out = splice_fetch_records(body, layout, {(0, 0): b"s" * 100})
    decoded = decode_response(1, 16, out)
    assert decoded.responses[0].topic_id == tid
    assert decoded.node_endpoints == entity.node_endpoints
