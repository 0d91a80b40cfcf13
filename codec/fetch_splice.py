"""Fetch responses without kio: a scan that finds every partition's `records` in the response,
and a splice that writes new `records` bytes and error codes into the original frame.

Why: with a fetch filter in force, decoding every Fetch response with kio and re-encoding it
in Python costs more than the filter on a large response, and topics that no filter touches
paid it too. The scan reads the regular fields with struct, builds no kio objects and hands
the records out as zero-copy `memoryview` slices; the splice puts views of the untouched
stretches of the frame (the response header included) around the new records, as pieces to
write in order (`splice_fetch_pieces`; `splice_fetch_records` joins them), with new bytes only
for the records' length prefixes and the error codes that change. A Fetch response has no size of a
topic or partition entry, so nothing else moves. The result is byte for byte what kio writes
for the same change (tests/codec property-test this for every version the codec supports).

Positions address partitions: ``(i, j)`` is the j-th partition of the i-th topic entry, in
the order of the response (``responses[i].partitions[j]`` of the kio entity).

Layout of the Fetch response body (v4-v18; v12+ flexible: compact lengths, uvarint counts
and tagged-field sections; v13+ topics by id)::

    throttle_time_ms  int32
    error_code        int16   (v7+)
    session_id        int32   (v7+)
    responses         [topic string | topic_id uuid (v13+),
                       partitions [partition_index int32, error_code int16,
                                   high_watermark int64, last_stable_offset int64,
                                   log_start_offset int64 (v5+),
                                   aborted_transactions nullable [producer_id int64,
                                                                  first_offset int64, tags?],
                                   preferred_read_replica int32 (v11+),
                                   records nullable bytes, tags?], tags?]
    tags?             (v16+: node_endpoints, tag 0: broker addresses)

The top-level tagged fields are not decoded: `endpoints` is False when there are none, or when
the only one is an empty (or null) `node_endpoints`; True when they may hold a broker address
(KIP-951 node endpoints, sent with NOT_LEADER_OR_FOLLOWER errors, or a tag the scan does not
know). A caller that must rewrite those addresses decodes the response with kio when it is True.
"""

from __future__ import annotations

import struct
import uuid
from collections.abc import Callable, Mapping
from functools import cache
from typing import NamedTuple

from .errors import DecodeError, UnsupportedVersion
from .guard import fields_end, read_uvarint, skip_tags
from .schemas import known_versions, response_schema
from .splice_fields import records_prefix, records_size_prefix

_native_tagged: Callable[..., int] | None
try:  # codec/passthrough.c, built at install; the Python walk below answers alike without it
    from ._passthrough import fetch_response_tagged as _native_tagged  # type: ignore[import-not-found, no-redef, unused-ignore]
except ImportError:
    _native_tagged = None

__all__ = [
    "FetchPartitionSlot",
    "FetchResponseLayout",
    "FetchTopicSlot",
    "fetch_response_tagged",
    "scan_fetch_response",
    "splice_fetch_pieces",
    "splice_fetch_records",
]

Buffer = bytes | bytearray | memoryview

_i16 = struct.Struct(">h").unpack_from
_i32 = struct.Struct(">i").unpack_from
_pack_i16 = struct.Struct(">h").pack
_pack_i32 = struct.Struct(">i").pack
_ZERO_UUID = bytes(16)
# Top-level tag sections that hold no address: node_endpoints (tag 0) as an empty or a null
# compact array, which some brokers (Tansu) send on every v16+ response.
_NO_ENDPOINTS = (b"\x01\x00\x01\x01", b"\x01\x00\x01\x00")


class FetchPartitionSlot(NamedTuple):
    """One partition entry of a Fetch response; offsets are into the scanned buffer."""

    partition: int  # the partition index
    error_code: int
    records: memoryview | None  # None: a null records field
    start: int  # the entry's first byte (its index); the error code follows at start + 4
    records_at: int  # the records' length prefix
    records_end: int  # just after the records bytes
    end: int  # just after the entry (after its tagged fields)


class FetchTopicSlot(NamedTuple):
    """One topic entry: by name (v4-v12) or by id (v13+; None for the all-zero id)."""

    name: str | None
    topic_id: uuid.UUID | None
    partitions: tuple[FetchPartitionSlot, ...]
    start: int
    end: int  # just after the entry (after its tagged fields)


class FetchResponseLayout(NamedTuple):
    """Where everything is in one Fetch response."""

    version: int
    flexible: bool
    error_code: int  # 0 before v7 (no top-level error code)
    topics: tuple[FetchTopicSlot, ...]
    topics_end: int  # just after the last topic entry (the top-level tags, if flexible)
    endpoints: bool  # the top-level tags may hold broker addresses (see the module docstring)


class _Shape(NamedTuple):
    flexible: bool
    by_id: bool
    top_fixed: int  # throttle (+ error code + session id) before the topic array
    fixed: int  # partition fields after the index and error code, before the aborted list
    replica: int  # preferred_read_replica's size (0 before v11)


@cache
def _shape(version: int) -> _Shape:
    """The shape of a Fetch response version the codec supports."""
    if version not in known_versions(1, False) or version < 4:
        raise UnsupportedVersion(f"Fetch v{version} response is not supported by the splice")
    return _Shape(
        flexible=version >= 12,
        by_id=version >= 13,
        top_fixed=10 if version >= 7 else 4,
        fixed=24 if version >= 5 else 16,
        replica=4 if version >= 11 else 0,
    )


def _count(buf: memoryview, pos: int, end: int, flexible: bool, minimum: int) -> tuple[int, int]:
    """(count, position after it) of an array; -1 for a null array. DecodeError when the
    count times the smallest entry is more than the bytes left (a hostile count)."""
    if flexible:
        n = buf[pos]
        if n < 0x80:
            pos += 1
        else:
            n, pos = read_uvarint(buf, pos, end)
        n -= 1
    else:
        n = _i32(buf, pos)[0]
        pos += 4
    if n < 0:
        return -1, pos
    if n * minimum > end - pos:
        raise DecodeError(f"array of {n} entries declared in {end - pos} bytes")
    return n, pos


def _skip_tags(buf: memoryview, pos: int, end: int) -> int:
    return pos + 1 if buf[pos] == 0 else skip_tags(buf, pos, end)


def scan_fetch_response(version: int, buf: Buffer, start: int = 0) -> FetchResponseLayout:
    """Find every partition of the Fetch response body that starts at `start` of `buf` (pass
    the whole frame and the response header's size to get offsets into the frame).

    Raises DecodeError for a body that is truncated, declares more than it holds, names a
    topic with a null or non-UTF-8 string or has bytes after its end; UnsupportedVersion for
    a version the scan does not know. The records views alias `buf`."""
    shape = _shape(version)
    flexible = shape.flexible
    by_id = shape.by_id
    fixed = shape.fixed
    replica = shape.replica
    view = buf if isinstance(buf, memoryview) else memoryview(buf)
    end = len(view)
    # The smallest entries: what a count is checked against.
    min_part = 4 + 2 + fixed + replica + (3 if flexible else 8)
    # A name is a compact string in flexible versions: one byte when empty.
    min_topic = (16 if by_id else 1 if flexible else 2) + (2 if flexible else 4)
    min_aborted = 17 if flexible else 16
    try:
        pos = start
        error_code = _i16(view, pos + 4)[0] if version >= 7 else 0
        pos += shape.top_fixed
        if pos > end:
            raise DecodeError("Fetch response truncated")
        n_topics, pos = _count(view, pos, end, flexible, min_topic)
        topics = []
        for _ in range(max(n_topics, 0)):
            t_start = pos
            name: str | None = None
            topic_id: uuid.UUID | None = None
            if by_id:
                raw = bytes(view[pos : pos + 16])
                if len(raw) != 16:
                    raise DecodeError("Fetch response truncated in a topic id")
                if raw != _ZERO_UUID:
                    topic_id = uuid.UUID(bytes=raw)
                pos += 16
            else:
                if flexible:
                    n = view[pos]
                    if n < 0x80:
                        pos += 1
                    else:
                        n, pos = read_uvarint(view, pos, end)
                    n -= 1
                else:
                    n = _i16(view, pos)[0]
                    pos += 2
                if n < 0:
                    raise DecodeError("null topic name in a Fetch response")
                if pos + n > end:
                    raise DecodeError("Fetch response truncated in a topic name")
                name = str(view[pos : pos + n], "utf-8")
                pos += n
            n_parts, pos = _count(view, pos, end, flexible, min_part)
            parts = []
            for _ in range(max(n_parts, 0)):
                p_start = pos
                index, code = _i32(view, pos)[0], _i16(view, pos + 4)[0]
                pos += 6 + fixed
                n_aborted, pos = _count(view, pos, end, flexible, min_aborted)
                if n_aborted > 0:
                    if flexible:
                        for _ in range(n_aborted):
                            pos = _skip_tags(view, pos + 16, end)
                    else:
                        pos += 16 * n_aborted
                pos += replica
                records_at = pos
                if flexible:
                    size = view[pos]
                    if size < 0x80:
                        pos += 1
                    else:
                        size, pos = read_uvarint(view, pos, end)
                    size -= 1
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
                    pos = _skip_tags(view, pos, end)
                parts.append(
                    FetchPartitionSlot(index, code, records, p_start, records_at, records_end, pos)
                )
            if flexible:
                pos = _skip_tags(view, pos, end)
            topics.append(FetchTopicSlot(name, topic_id, tuple(parts), t_start, pos))
        topics_end = pos
        endpoints = False
        if flexible:
            pos = _skip_tags(view, pos, end)
            endpoints = pos != topics_end + 1 and view[topics_end:pos] not in _NO_ENDPOINTS
    except (struct.error, IndexError):
        raise DecodeError("Fetch response truncated") from None
    except UnicodeDecodeError as exc:
        raise DecodeError(f"Fetch response: a topic name is not UTF-8 ({exc.reason})") from None
    if pos > end:
        raise DecodeError("Fetch response truncated")
    if pos != end:
        raise DecodeError(f"Fetch response: {end - pos} trailing bytes after the body")
    return FetchResponseLayout(version, flexible, error_code, tuple(topics), topics_end, endpoints)


def splice_fetch_records(
    buf: Buffer,
    layout: FetchResponseLayout,
    records: Mapping[tuple[int, int], Buffer | list[Buffer] | tuple[Buffer, ...] | None],
    errors: Mapping[tuple[int, int], int] | None = None,
) -> bytes:
    """`splice_fetch_pieces` joined into one buffer."""
    return b"".join(splice_fetch_pieces(buf, layout, records, errors))


def splice_fetch_pieces(
    buf: Buffer,
    layout: FetchResponseLayout,
    records: Mapping[tuple[int, int], Buffer | list[Buffer] | tuple[Buffer, ...] | None],
    errors: Mapping[tuple[int, int], int] | None = None,
) -> tuple[Buffer, ...]:
    """`buf` (scanned into `layout`) with new records and error codes for some partitions,
    as consecutive pieces (views of `buf` between new bytes) whose concatenation is the new
    frame: a caller that writes them with one `writev` never copies the frame into one
    buffer (a masked 9 MB Fetch response: ~0.02 µs a record).

    `records` maps a partition's position ``(topic i, partition j)`` to its new records bytes,
    or to a list or tuple of buffers whose concatenation they are (each batch as the filters
    left it: a piece of its own, never joined first), or to None (a null records field);
    `errors` maps positions to a new error code. Every other byte is a view of `buf`,
    including what comes before the scanned body (the response header): the body is what
    kio writes for the changed entity. Raises ValueError for a position the response does
    not have."""
    errors = errors or {}
    topics = layout.topics
    slots = []
    for i, j in {*records, *errors}:
        if not (0 <= i < len(topics) and 0 <= j < len(topics[i].partitions)):
            raise ValueError(f"Fetch response has no partition entry at position {(i, j)}")
        slots.append((topics[i].partitions[j], (i, j)))
    slots.sort(key=lambda s: s[0].start)
    view = buf if isinstance(buf, memoryview) else memoryview(buf)
    flexible = layout.flexible
    pieces: list[Buffer] = []
    pos = 0
    for part, key in slots:
        code = errors.get(key)
        if code is not None:
            pieces.append(view[pos : part.start + 4])
            pieces.append(_pack_i16(code))
            pos = part.start + 6
        if key in records:
            new = records[key]
            pieces.append(view[pos : part.records_at])
            if isinstance(new, (list, tuple)):
                pieces.append(records_size_prefix(sum(len(p) for p in new), flexible))
                pieces.extend(new)
            else:
                pieces.append(records_prefix(new, flexible))
                if new is not None:
                    pieces.append(new)
            pos = part.records_end
    pieces.append(view[pos:])
    return tuple(pieces)


#: The native check itself (body, start, by_id, fixed, replica, top_fixed) -> bool, for a
#: caller that looked up `native_tagged_args` once per version; None where it is not built.
native_fetch_response_tagged = _native_tagged


def native_tagged_args(version: int) -> tuple[bool, int, int, int] | None:
    """The arguments after (body, start) of `native_fetch_response_tagged` for Fetch response
    `version`; None where the native check does not apply (not built, or not flexible)."""
    if _native_tagged is None:
        return None
    try:
        shape = _shape(version)
    except UnsupportedVersion:
        return None
    if not shape.flexible:
        return None
    return shape.by_id, 6 + shape.fixed, shape.replica, shape.top_fixed


def _schema_tagged(version: int, body: Buffer, start: int) -> bool:
    """`fetch_response_tagged` by the schema walk (codec/guard.py `fields_end`), for a body
    with a nested tag section that is not empty: a known tag (a partition's current_leader,
    diverging_epoch, snapshot_id) is read by a client as its struct, whatever size it
    declares. Skipped by its size, a hostile broker's struct that ends early would hide from
    the fast walk what a client reads next (node endpoints included); the schema walk reads
    it as the client does (review of round 39)."""
    try:
        end = fields_end(response_schema(1, version), memoryview(body)[start:])
    except DecodeError:
        return True
    return not (start + end == len(body) - 1 and body[-1] == 0)


def fetch_response_tagged(version: int, body: Buffer, start: int = 0) -> bool:
    """Whether the Fetch response body at `start` of `body` may carry top-level tagged fields
    (where KIP-951 node endpoints sit): False only when the walk proves the body ends in an
    empty tag section. A truncated or malformed body, or a version without tagged fields, is
    True (the full decode decides).

    Answers as the schema walk (codec/guard.py `fields_end`) does, in one Python call: every
    pass-through Fetch response v16+ is asked this, and the generic walk made two calls per
    partition (each costs several µs on the cold caches of a loaded machine, issue 29). Counts,
    record sizes and empty tag sections are read inline; a count or name over 127 calls the
    generic readers, a nested tag section that is not empty hands the body to the schema walk
    (`_schema_tagged`: a client reads a known tag as its struct, not by its size)."""
    end = len(body)
    try:
        shape = _shape(version)
        if not shape.flexible:
            return True
        by_id = shape.by_id
        fixed = 6 + shape.fixed
        replica = shape.replica
        if _native_tagged is not None and start >= 0:
            # The walk below in one C call (codec/passthrough.c), the same answers; -1: a
            # nested tag section that is not empty (the schema walk decides, as below).
            found = _native_tagged(body, start, by_id, fixed, replica, shape.top_fixed)
            return bool(found) if found >= 0 else _schema_tagged(version, body, start)
        pos = start + shape.top_fixed
        n_topics = body[pos] - 1
        pos += 1
        if n_topics >= 0x7F:
            n_topics, pos = read_uvarint(body, pos - 1, end)
            n_topics -= 1
        # A topic entry is at least its id (or a one-byte empty name), a count and its tags.
        if n_topics * (18 if by_id else 3) > end - pos:
            return True
        for _ in range(n_topics):
            if by_id:
                pos += 16
            else:
                n = body[pos]
                pos += 1
                if n >= 0x80:
                    n, pos = read_uvarint(body, pos - 1, end)
                pos += max(n - 1, 0)
            n_parts = body[pos] - 1
            pos += 1
            if n_parts >= 0x7F:
                n_parts, pos = read_uvarint(body, pos - 1, end)
                n_parts -= 1
            if n_parts * (fixed + replica + 3) > end - pos:
                return True
            for _ in range(n_parts):
                pos += fixed
                n_aborted = body[pos] - 1
                pos += 1
                if n_aborted >= 0x7F:
                    n_aborted, pos = read_uvarint(body, pos - 1, end)
                    n_aborted -= 1
                if n_aborted > 0:
                    if n_aborted * 17 > end - pos:
                        return True
                    for _ in range(n_aborted):
                        pos += 16
                        if body[pos] != 0:
                            return _schema_tagged(version, body, start)
                        pos += 1
                pos += replica
                # The records' compact length: up to 5 bytes, read inline (a large batch
                # takes three).
                size = body[pos]
                pos += 1
                if size >= 0x80:
                    size &= 0x7F
                    shift = 7
                    while True:
                        b = body[pos]
                        pos += 1
                        size |= (b & 0x7F) << shift
                        if b < 0x80:
                            break
                        shift += 7
                        if shift > 28:
                            return True
                if size > 1:
                    pos += size - 1
                    if pos > end:
                        return True
                if body[pos] != 0:
                    return _schema_tagged(version, body, start)
                pos += 1
            if body[pos] != 0:
                return _schema_tagged(version, body, start)
            pos += 1
    except (DecodeError, UnsupportedVersion, IndexError):
        return True
    return not (pos + 1 == end and body[pos] == 0)
