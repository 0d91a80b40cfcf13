"""Base offsets out of a Produce response without decoding it.

The proxy relays Produce responses untouched; it reads them only to tell telemetry which
offsets the broker gave each filtered partition. Decoding the whole response with kio builds
an object per partition and per record error for that. This scan reads the four values
telemetry needs with one struct call per partition and skips the rest of each entry with the
guard's schema-generated scanner (codec/guard.py), so new fields of a later version are
skipped correctly as long as kio knows the version.

Layout (v3-v13; v9+ flexible; v13+ topics by id): ``responses [name | topic_id,
partition_responses [index int32, error_code int16, base_offset int64, ...], tags?]``, then
fields the scan does not read (throttle time, top-level tags).
"""

from __future__ import annotations

import struct
import uuid
from collections.abc import Callable
from dataclasses import fields
from functools import cache
from typing import Any, NamedTuple

from kio.serial._introspect import classify_field, get_field_tag

from . import guard
from .errors import DecodeError, UnsupportedVersion
from .guard import read_uvarint, skip_tags
from .produce_splice import read_topic_key
from .schemas import known_versions, response_schema

_native_tagged: Callable[..., int] | None
try:  # codec/passthrough.c, built at install; the Python walk below answers alike without it
    from ._passthrough import produce_response_tagged as _native_tagged  # type: ignore[import-not-found, no-redef, unused-ignore]
except ImportError:
    _native_tagged = None

__all__ = [
    "ProduceOffset",
    "produce_response_tagged",
    "produce_responses_end",
    "scan_produce_offsets",
    "scan_produce_response",
]

Buffer = bytes | bytearray | memoryview

_i16 = struct.Struct(">h").unpack_from
_i32 = struct.Struct(">i").unpack_from
_head = struct.Struct(">ihq").unpack_from  # index, error_code, base_offset


class ProduceOffset(NamedTuple):
    """One partition of a Produce response: topic name (v3-v12) or topic id (v13+)."""

    topic: str | uuid.UUID
    partition: int
    error_code: int
    base_offset: int


@cache
def _shape(version: int) -> tuple[bool, bool, Callable[[Any, int, int], int]]:
    """(flexible, topics by id, skipper of one partition entry) for a response version."""
    if version not in known_versions(0, False):
        raise UnsupportedVersion(f"Produce v{version} is not supported by the codec")
    schema = response_schema(0, version)
    topic_cls = _element(schema, "responses")
    part_cls = _element(topic_cls, "partition_responses")
    names = [f.name for f in fields(part_cls)]
    if names[:3] != ["index", "error_code", "base_offset"]:  # pragma: no cover - kio change
        raise UnsupportedVersion(f"Produce v{version} response: unexpected layout {names[:3]}")
    return (
        bool(schema.__flexible__),
        "topic_id" in {f.name for f in fields(topic_cls)},
        (guard.entity_skipper(part_cls)),
    )


def _element(cls: type[Any], field_name: str) -> type[Any]:
    """The element class of a tuple-of-entities field of a kio class."""
    (fld,) = (f for f in fields(cls) if f.name == field_name)
    element: type[Any] = classify_field(fld).type_
    return element


def scan_produce_offsets(version: int, body: Buffer) -> list[ProduceOffset]:
    """(topic, partition, error_code, base_offset) of every partition entry of a Produce
    response body (the frame after the response header), in the response's order.

    Reads only the `responses` array: fields after it (throttle time, top-level tagged fields
    such as KIP-951 node endpoints) are not looked at. Raises DecodeError for a truncated or
    inconsistent array, UnsupportedVersion for a version the codec does not know."""
    out: list[ProduceOffset] = []
    _scan(version, body, out)
    return out


def scan_produce_response(version: int, body: Buffer) -> tuple[list[ProduceOffset], bool]:
    """`scan_produce_offsets`, and whether anything may follow `throttle_time_ms`: True when
    the body has top-level tagged fields (where KIP-951 node endpoints sit) or ends otherwise
    than the schema says (a full decode decides then). One walk where the Produce path used
    two (this scan and a schema walk for endpoints)."""
    out: list[ProduceOffset] = []
    end = _scan(version, body, out)
    flexible = _shape(version)[0]
    rest = len(body) - end - 4  # after throttle_time_ms
    plain = rest == (1 if flexible else 0) and (not flexible or body[-1] == 0)
    return out, not plain


# A flexible partition entry without an error message, record errors or tagged fields (such
# as KIP-951's current_leader): index, error_code, base_offset, log_append_time_ms,
# log_start_offset (30 bytes), then an empty record_errors array, a null error_message and an
# empty tag section. Every error-free partition a broker sends looks like this.
_PLAIN_PART = 30
_PLAIN_TAIL = b"\x01\x00\x00"
_PLAIN_FIELDS = ["index", "error_code", "base_offset", "log_append_time", "log_start_offset",
                 "record_errors", "error_message"]


@cache
def _plain_shape(version: int) -> tuple[bool, Callable[[Any, int, int], int]] | None:
    """(topics by id, skipper of one partition entry) for a flexible version whose partition
    entry is `_PLAIN_FIELDS` (plus tags); None for any other (the generic walk decides)."""
    flexible, by_id, skip_partition = _shape(version)
    if not flexible:
        return None
    part_cls = _element(_element(response_schema(0, version), "responses"), "partition_responses")
    names = [f.name for f in fields(part_cls) if get_field_tag(f) is None]
    if names != _PLAIN_FIELDS:  # pragma: no cover - a later kio version adds a field
        return None
    return by_id, skip_partition


#: The native check itself (body, start, by_id) -> 1 | 0 | -1, for a caller that looked up
#: `native_tagged_by_id` once per version; None where it is not built.
native_produce_response_tagged = _native_tagged


def native_tagged_by_id(version: int) -> bool | None:
    """The `by_id` argument of `native_produce_response_tagged` for Produce response
    `version`; None where the native check does not apply (not built, or a version whose
    partitions the Python walk steps over otherwise)."""
    if _native_tagged is None:
        return None
    try:
        plain = _plain_shape(version)
    except (DecodeError, UnsupportedVersion):
        return None
    return None if plain is None else plain[0]


def produce_response_tagged(version: int, body: Buffer, start: int = 0) -> bool:
    """Whether the Produce response body at `start` of `body` may carry top-level tagged
    fields (where KIP-951 node endpoints sit): False only when the walk proves the body ends
    in `throttle_time_ms` and an empty tag section. A truncated or malformed body is True
    (the full decode reports it).

    Answers as the schema walk (codec/guard.py `fields_end`) does, for less: each
    error-free partition (`_PLAIN_TAIL`) is stepped over by one comparison, names are skipped
    by their length without being decoded; any other partition is skipped by the generic
    scanner. Versions before v9 carry no tagged fields: False when the body ends where the
    schema says."""
    end = len(body)
    try:
        plain = _plain_shape(version)
        if plain is None:
            flexible = _shape(version)[0]
            pos = _scan(version, memoryview(body)[start:], None) + start
            return not (pos + 4 == end - flexible and (not flexible or body[end - 1] == 0))
    except (DecodeError, UnsupportedVersion):
        return True
    by_id, skip_partition = plain
    if _native_tagged is not None and start >= 0:
        # One C call (codec/passthrough.c); -1: a partition that is not error-free, which
        # the walk below steps over with the generic reader.
        found = _native_tagged(body, start, by_id)
        if found >= 0:
            return bool(found)
    pos = start
    try:
        n_topics = body[pos] - 1
        pos += 1
        if n_topics >= 0x7F:
            n_topics, pos = read_uvarint(body, pos - 1, end)
            n_topics -= 1
        if n_topics * 2 > end - pos:
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
            if n_parts * 14 > end - pos:
                return True
            for _ in range(n_parts):
                after = pos + _PLAIN_PART
                if body[after : after + 3] == _PLAIN_TAIL:
                    pos = after + 3
                else:
                    pos = skip_partition(body, pos, end)
            pos = pos + 1 if body[pos] == 0 else skip_tags(body, pos, end)
    except (DecodeError, struct.error, IndexError):
        return True
    return not (pos + 5 == end and body[end - 1] == 0)


def produce_responses_end(version: int, body: Buffer) -> int:
    """Where the `responses` array of a Produce response body ends: the position of
    `throttle_time_ms` (int32), which every version the codec supports carries next (quota
    throttling patches it there, proxy/ops/quotas.py). Same errors as the scan."""
    return _scan(version, body, None)


def _scan(version: int, body: Buffer, out: list[ProduceOffset] | None) -> int:
    """Walk the `responses` array, collecting partition heads into `out` (None: only walk);
    returns the position just after the array."""
    flexible, by_id, skip_partition = _shape(version)
    end = len(body)
    # One-byte varints (every count and name length below 127) are read inline: a function
    # call per field would cost more than kio's compiled decoder of the whole response.
    try:
        if flexible:
            n_topics = body[0]
            pos = 1
            if n_topics >= 0x80:
                n_topics, pos = read_uvarint(body, 0, end)
            n_topics -= 1
        else:
            n_topics = _i32(body, 0)[0]
            pos = 4
        if n_topics * 2 > end - pos:
            raise DecodeError(f"array of {n_topics} topics declared in {end - pos} bytes")
        for _ in range(n_topics):
            key, pos = read_topic_key(body, pos, end, flexible, by_id)
            topic = "" if key is None else key
            if flexible:
                n_parts = body[pos]
                pos += 1
                if n_parts >= 0x80:
                    n_parts, pos = read_uvarint(body, pos - 1, end)
                n_parts -= 1
            else:
                n_parts = _i32(body, pos)[0]
                pos += 4
            if n_parts * 14 > end - pos:
                raise DecodeError(f"array of {n_parts} partitions declared in {end - pos} bytes")
            for _ in range(n_parts):
                if out is not None:
                    index, error_code, base_offset = _head(body, pos)
                    out.append(ProduceOffset(topic, index, error_code, base_offset))
                pos = skip_partition(body, pos, end)
            if flexible:
                pos = pos + 1 if body[pos] == 0 else skip_tags(body, pos, end)
    except (struct.error, IndexError):
        raise DecodeError("Produce response truncated") from None
    except UnicodeDecodeError as exc:
        raise DecodeError(f"Produce response: a topic name is not UTF-8 ({exc.reason})") from None
    if pos > end:
        raise DecodeError("Produce response truncated")
    return pos
