"""Produce requests without kio: a scan that finds every partition's `records` in the body,
and a splice that writes new `records` bytes (or drops partitions) into the original body.

Why: a filter changes only the `records` of some partitions, and kio's pure-Python writer
costs 12-25 µs per Produce request to re-encode all of it. The scan reads the regular fields
(topic names or ids, partition indexes) with struct, builds no kio objects, and hands the
records out as zero-copy `memoryview` slices; the splice copies the untouched stretches of the
original body around the new records and rewrites only the lengths and counts that change.
The result is byte-for-byte what kio writes for the same change (tests/codec property-test
this against kio for every version the codec supports), so the broker sees the same request.

Who reads what: a filtered Produce is scanned through `passthrough.scan_layout`, the C
reader in codec/passthrough.c where it is built: it answers the common case (versions by
name, no tagged fields, UTF-8 names) with the very layout `scan_produce_request` returns and
hands anything else back (None) to it, which stays the reference for every error and rare
encoding (tests/codec/test_passthrough_native.py holds the two to the same answers).

Positions, not names, address partitions: ``(i, j)`` is the j-th partition of the i-th topic
entry, in the order of the request (as in the kio entity's ``topic_data[i].partition_data[j]``);
a request may name one topic twice, and positions stay exact.

Layout of the Produce request body (v3-v13; v9+ flexible: compact lengths, uvarint counts and
tagged-field sections; v13+ topics by id)::

    transactional_id  nullable string
    acks              int16
    timeout_ms        int32
    topic_data        [name string | topic_id uuid (v13+),
                       partition_data [index int32, records nullable bytes, tags?], tags?]
    tags?
"""

from __future__ import annotations

import struct
import uuid
from collections.abc import Collection, Mapping
from functools import cache, partial
from typing import NamedTuple

from .errors import DecodeError, UnsupportedVersion
from .guard import read_uvarint, skip_tags
from .schemas import known_versions
from .splice_fields import records_prefix, uvarint_bytes

__all__ = [
    "PartitionSlot",
    "ProduceRequestLayout",
    "ProduceTopics",
    "TopicSlot",
    "produce_head",
    "produce_topics",
    "read_topic_key",
    "scan_produce_request",
    "splice_produce_pieces",
    "splice_produce_records",
]

Buffer = bytes | bytearray | memoryview

_i16 = struct.Struct(">h").unpack_from
_i32 = struct.Struct(">i").unpack_from
_pack_i32 = struct.Struct(">i").pack
_ih = struct.Struct(">hi").unpack_from  # acks, timeout_ms

# The smallest encoded partition entry: index + records length (+ its tag count when flexible).
_MIN_PARTITION = {False: 4 + 4, True: 4 + 1 + 1}
_MIN_TOPIC = {False: 2 + 4, True: 1 + 1 + 1}


# NamedTuples rather than frozen dataclasses: several times cheaper to build, which shows on
# one-record requests. Built with `_new` (tuple.__new__, a C call): a NamedTuple's own
# __new__ is a Python function, a call per slot of every filtered request (issue 29).
_new = tuple.__new__

class PartitionSlot(NamedTuple):
    """One partition entry of a Produce request; offsets are into the scanned body."""

    partition: int  # the partition index
    records: memoryview | None  # None: a null records field
    start: int  # the entry's first byte (its index)
    records_at: int  # the records' length prefix
    records_end: int  # just after the records bytes
    end: int  # just after the entry (after its tagged fields)


class TopicSlot(NamedTuple):
    """One topic entry: by name (v3-v12) or by id (v13+)."""

    name: str | None
    topic_id: uuid.UUID | None
    partitions: tuple[PartitionSlot, ...]
    start: int
    count_at: int  # the partition array's count
    count_end: int  # just after that count
    end: int  # just after the entry (after its tagged fields)


class ProduceRequestLayout(NamedTuple):
    """Where everything is in one Produce request body."""

    version: int
    flexible: bool
    transactional_id: str | None
    acks: int
    timeout_ms: int
    topics: tuple[TopicSlot, ...]
    count_at: int  # the topic array's count
    count_end: int
    topics_end: int  # just after the last topic entry (the top-level tags, if flexible)


@cache
def _shape(version: int) -> tuple[bool, bool]:
    """(flexible, topics by id) of a Produce request version the codec supports."""
    if version not in known_versions(0, True):
        raise UnsupportedVersion(f"Produce v{version} is not supported by the codec")
    return version >= 9, version >= 13


def read_topic_key(
    buf: Buffer, pos: int, end: int, flexible: bool, by_id: bool
) -> tuple[str | uuid.UUID | None, int]:
    """The topic name (None: a null string) or topic id at `pos` of a Produce request or
    response entry, and the position after it. One-byte compact lengths are read inline."""
    if by_id:
        if pos + 16 > end:
            raise DecodeError("Produce message truncated in a topic id")
        return uuid.UUID(bytes=bytes(buf[pos : pos + 16])), pos + 16
    if flexible:
        n = buf[pos]
        pos += 1
        if n >= 0x80:
            n, pos = read_uvarint(buf, pos - 1, end)
        if n == 0:
            return None, pos
        if pos + n - 1 > end:
            raise DecodeError("Produce message truncated in a topic name")
        return str(buf[pos : pos + n - 1], "utf-8"), pos + n - 1
    n = _i16(buf, pos)[0]
    if n < 0:
        return None, pos + 2
    if pos + 2 + n > end:
        raise DecodeError("Produce message truncated in a topic name")
    return str(buf[pos + 2 : pos + 2 + n], "utf-8"), pos + 2 + n


def _count(buf: Buffer, pos: int, end: int, flexible: bool, minimum: int) -> tuple[int, int]:
    if flexible:
        # A one-byte count (under 127 entries) read inline: a call fewer per array.
        if pos < end and buf[pos] < 0x80:
            n = buf[pos] - 1
            pos += 1
        else:
            n, pos = read_uvarint(buf, pos, end)
            n -= 1
    else:
        if pos + 4 > end:
            raise DecodeError("Produce request truncated in an array count")
        n = _i32(buf, pos)[0]
        pos += 4
    if n < 0:
        # topic_data and partition_data are not nullable; kio reads a null as empty too.
        return 0, pos
    if n * minimum > end - pos:
        raise DecodeError(f"array of {n} entries declared in {end - pos} bytes")
    return n, pos


def scan_produce_request(version: int, body: Buffer) -> ProduceRequestLayout:
    """Find every field of a Produce request body (the frame after the request header).

    Raises DecodeError for a body that is truncated, declares more than it holds or has bytes
    left after its end; UnsupportedVersion for a version the codec does not know. The returned
    records views alias `body`."""
    flexible, by_id = _shape(version)
    view = body if isinstance(body, memoryview) else memoryview(body)
    end = len(view)
    try:
        # transactional_id
        if flexible:
            n = view[0]
            pos = 1
            if n >= 0x80:
                n, pos = read_uvarint(view, 0, end)
            txn = None if n == 0 else str(view[pos : pos + n - 1], "utf-8")
            pos += max(n - 1, 0)
        else:
            n = _i16(view, 0)[0]
            pos = 2
            txn = None if n < 0 else str(view[pos : pos + n], "utf-8")
            pos += max(n, 0)
        acks, timeout_ms = _ih(view, pos)
        pos += 6
        count_at = pos
        n_topics, pos = _count(view, pos, end, flexible, _MIN_TOPIC[flexible])
        count_end = pos
        topics = []
        for _ in range(n_topics):
            t_start = pos
            key, pos = read_topic_key(view, pos, end, flexible, by_id)
            if key is None:
                raise DecodeError("null topic name in a Produce request")
            name = key if isinstance(key, str) else None
            topic_id = key if isinstance(key, uuid.UUID) else None
            p_count_at = pos
            n_parts, pos = _count(view, pos, end, flexible, _MIN_PARTITION[flexible])
            p_count_end = pos
            parts = []
            for _ in range(n_parts):
                p_start = pos
                index = _i32(view, pos)[0]
                pos += 4
                records_at = pos
                if flexible:
                    n = view[pos]
                    if n < 0x80:
                        pos += 1
                    else:
                        n, pos = read_uvarint(view, pos, end)
                    size = n - 1
                else:
                    size = _i32(view, pos)[0]
                    pos += 4
                if size >= 0:
                    if pos + size > end:
                        raise DecodeError(f"records of {size} bytes declared in {end - pos}")
                    records: memoryview | None = view[pos : pos + size]
                    pos += size
                else:
                    records = None
                records_end = pos
                if flexible:
                    pos = pos + 1 if view[pos] == 0 else skip_tags(view, pos, end)
                parts.append(_new(PartitionSlot,
                                  (index, records, p_start, records_at, records_end, pos)))
            if flexible:
                pos = pos + 1 if view[pos] == 0 else skip_tags(view, pos, end)
            topics.append(_new(
                TopicSlot, (name, topic_id, tuple(parts), t_start, p_count_at, p_count_end, pos)
            ))
        topics_end = pos
        if flexible:
            pos = pos + 1 if view[pos] == 0 else skip_tags(view, pos, end)
    except (struct.error, IndexError):
        raise DecodeError("Produce request truncated") from None
    except UnicodeDecodeError as exc:
        raise DecodeError(f"Produce request: a string is not UTF-8 ({exc.reason})") from None
    if pos > end:
        raise DecodeError("Produce request truncated")
    if pos != end:
        raise DecodeError(f"Produce request: {end - pos} trailing bytes after the body")
    return _new(ProduceRequestLayout, (
        version,
        flexible,
        txn,
        acks,
        timeout_ms,
        tuple(topics),
        count_at,
        count_end,
        topics_end,
    ))


class ProduceTopics(NamedTuple):
    """What `produce_topics` reads of a Produce request: its acks and the topics it names."""

    acks: int
    keys: list[str | uuid.UUID]  # names (v3-v12) or ids (v13+), in request order


_topics = partial(tuple.__new__, ProduceTopics)  # NamedTuple's __new__ is Python


def produce_head(version: int, body: Buffer) -> ProduceTopics | None:
    """The acks and the one topic of a Produce request body that names exactly one topic (the
    common case), read from its head only: the partitions and records after the name are not
    walked (a broker reads the same count and name, so it finds no other topic there). None
    for any other count: `produce_topics` reads them all. DecodeError if the head is short."""
    flexible, by_id = _shape(version)
    end = len(body)
    # Read on every Produce (the internal-topics check): one-byte lengths and the name are
    # read inline, the rest through the general readers.
    try:
        if flexible:
            n = body[0]
            if n >= 0x80:
                n, pos = read_uvarint(body, 0, end)
                pos += max(n - 1, 0)
            else:
                pos = n if n else 1  # after the transactional id (0: null, n: n - 1 bytes)
            acks = _i16(body, pos)[0]
            name_at = pos + 7
            if body[pos + 6] != 2:  # a compact count of one topic
                return None
            size = body[name_at]
            if not by_id and 1 < size < 0x80:
                if name_at + size > end:
                    raise DecodeError("Produce message truncated in a topic name")
                key: str | uuid.UUID | None = str(body[name_at + 1 : name_at + size], "utf-8")
            else:
                key, _pos = read_topic_key(body, name_at, end, flexible, by_id)
        else:
            pos = 2 + max(_i16(body, 0)[0], 0)
            acks = _i16(body, pos)[0]
            if _i32(body, pos + 6)[0] != 1:
                return None
            key, _pos = read_topic_key(body, pos + 10, end, flexible, by_id)
    except (struct.error, IndexError):
        raise DecodeError("Produce request truncated") from None
    except UnicodeDecodeError as exc:
        raise DecodeError(f"Produce request: a string is not UTF-8 ({exc.reason})") from None
    if key is None:
        raise DecodeError("null topic name in a Produce request")
    return _topics((acks, [key]))


def produce_topics(version: int, body: Buffer) -> ProduceTopics:
    """The acks and the topic names (v3-v12) or ids (v13+) of a Produce request body, in
    request order.

    What `scan_produce_request` finds, with the same checks (truncation, hostile counts,
    trailing bytes raise DecodeError), for the path that only asks which topics a request
    names: no slot objects, no records views (about half the scan's cost)."""
    flexible, by_id = _shape(version)
    view = body if isinstance(body, memoryview) else memoryview(body)
    end = len(view)
    keys: list[str | uuid.UUID] = []
    try:
        if flexible:
            n = view[0]
            pos = 1
            if n >= 0x80:
                n, pos = read_uvarint(view, 0, end)
            pos += max(n - 1, 0)
        else:
            pos = 2 + max(_i16(view, 0)[0], 0)
        acks = _ih(view, pos)[0]  # acks, timeout_ms: present
        pos += 6
        n_topics, pos = _count(view, pos, end, flexible, _MIN_TOPIC[flexible])
        for _ in range(n_topics):
            key, pos = read_topic_key(view, pos, end, flexible, by_id)
            if key is None:
                raise DecodeError("null topic name in a Produce request")
            keys.append(key)
            n_parts, pos = _count(view, pos, end, flexible, _MIN_PARTITION[flexible])
            for _ in range(n_parts):
                pos += 4  # partition index
                if flexible:
                    n = view[pos]
                    if n < 0x80:
                        pos += 1
                    else:
                        n, pos = read_uvarint(view, pos, end)
                    size = n - 1
                else:
                    size = _i32(view, pos)[0]
                    pos += 4
                if size > 0:
                    if pos + size > end:
                        raise DecodeError(f"records of {size} bytes declared in {end - pos}")
                    pos += size
                if flexible:
                    pos = pos + 1 if view[pos] == 0 else skip_tags(view, pos, end)
            if flexible:
                pos = pos + 1 if view[pos] == 0 else skip_tags(view, pos, end)
        if flexible:
            pos = pos + 1 if view[pos] == 0 else skip_tags(view, pos, end)
    except (struct.error, IndexError):
        raise DecodeError("Produce request truncated") from None
    except UnicodeDecodeError as exc:
        raise DecodeError(f"Produce request: a string is not UTF-8 ({exc.reason})") from None
    if pos > end:
        raise DecodeError("Produce request truncated")
    if pos != end:
        raise DecodeError(f"Produce request: {end - pos} trailing bytes after the body")
    return ProduceTopics(int(acks), keys)


def _count_bytes(n: int, flexible: bool) -> bytes:
    return uvarint_bytes(n + 1) if flexible else _pack_i32(n)


def _records_at(spot: tuple[PartitionSlot, Buffer | None]) -> int:
    return spot[0].records_at


def splice_produce_records(
    body: Buffer,
    layout: ProduceRequestLayout,
    records: Mapping[tuple[int, int], Buffer | None],
    drop: Collection[tuple[int, int]] = (),
    prefix: Buffer = b"",
) -> bytes:
    """`splice_produce_pieces` joined into one buffer."""
    return b"".join(splice_produce_pieces(body, layout, records, drop, prefix))


def splice_produce_pieces(
    body: Buffer,
    layout: ProduceRequestLayout,
    records: Mapping[tuple[int, int], Buffer | None],
    drop: Collection[tuple[int, int]] = (),
    prefix: Buffer = b"",
) -> list[Buffer]:
    """`body` (scanned into `layout`) with new records for some partitions and others removed,
    after `prefix` (the request header), as consecutive pieces: views of `body` and `prefix`,
    the new length fields and the new records objects themselves, never copied. A caller
    that writes them with one `writev` (the connection, `Forward.frame`) copies no byte of
    the request; `splice_produce_records` joins them.

    `records` maps a partition's position ``(topic i, partition j)`` to its new records bytes
    (None writes a null records field); `drop` lists positions to leave out (a position in
    both is left out). A topic entry left with no partitions is left out too, as is done when
    re-encoding the request from its kio entity with those partitions removed. Everything
    else is copied from `body`: the result is the bytes kio would write for the changed
    entity. Raises ValueError for a position the request does not have."""
    if not drop and len(records) == 1:
        # One partition rewritten, none removed (a filtered one-partition Produce, nearly
        # every one): the general case below without its tuple of positions and list of
        # spots, ~1 µs a request.
        ((i, j), new), = records.items()
        topics = layout.topics
        if not (0 <= i < len(topics) and 0 <= j < len(topics[i].partitions)):
            raise ValueError(f"Produce request has no partition entry at position {(i, j)}")
        part = topics[i].partitions[j]
        view = body if isinstance(body, memoryview) else memoryview(body)
        pieces: list[Buffer] = [prefix, view[: part.records_at],
                                records_prefix(new, layout.flexible)]
        if new is not None:
            pieces.append(new)
        pieces.append(view[part.records_end :])
        return pieces
    for i, j in (*records, *drop):
        if not (0 <= i < len(layout.topics) and 0 <= j < len(layout.topics[i].partitions)):
            raise ValueError(f"Produce request has no partition entry at position {(i, j)}")
    view = body if isinstance(body, memoryview) else memoryview(body)
    flexible = layout.flexible
    if not drop:
        # Nothing removed (a filter rewrote records, nearly every filtered Produce): every
        # count and every entry stays, so the body is copied with each replaced records
        # field (its length prefix and bytes) written in its place, in body order.
        spots = [(layout.topics[i].partitions[j], new) for (i, j), new in records.items()]
        if len(spots) > 1:
            spots.sort(key=_records_at)
        pieces = [prefix]
        pos = 0
        for part, new in spots:
            pieces.append(view[pos : part.records_at])
            pieces.append(records_prefix(new, flexible))
            if new is not None:
                pieces.append(new)
            pos = part.records_end
        pieces.append(view[pos:])
        return pieces
    dropped = set(drop)
    changed_topics = {i for i, _ in records} | {i for i, _ in dropped}
    pieces = [prefix]
    kept_topics = len(layout.topics)
    topic_pieces: list[Buffer] = []
    for i, topic in enumerate(layout.topics):
        if i not in changed_topics:
            topic_pieces.append(view[topic.start : topic.end])
            continue
        parts = topic.partitions
        kept = [j for j in range(len(parts)) if (i, j) not in dropped]
        if not kept:
            kept_topics -= 1
            continue
        if len(kept) == len(parts):
            topic_pieces.append(view[topic.start : topic.count_end])
        else:
            topic_pieces.append(view[topic.start : topic.count_at])
            topic_pieces.append(_count_bytes(len(kept), flexible))
        for j in kept:
            part = parts[j]
            if (i, j) in records:
                new = records[(i, j)]
                topic_pieces.append(view[part.start : part.records_at])
                topic_pieces.append(records_prefix(new, flexible))
                if new is not None:
                    topic_pieces.append(new)
                topic_pieces.append(view[part.records_end : part.end])
            else:
                topic_pieces.append(view[part.start : part.end])
        last = parts[-1].end if parts else topic.count_end
        topic_pieces.append(view[last : topic.end])
    if kept_topics == len(layout.topics):
        pieces.append(view[: layout.count_end])
    else:
        pieces.append(view[: layout.count_at])
        pieces.append(_count_bytes(kept_topics, flexible))
    pieces.extend(topic_pieces)
    pieces.append(view[layout.topics_end :])
    return pieces
