"""The native batch sealer (crypto/batch_seal.py, crypto/batch_seal.c) at the edges of what it
is given: a record count the section cannot hold, a field plan that does not match the
section it is used on, and a record too long for the 32-bit offsets the C code keeps. Each is
refused with an error, never read or allocated on trust."""

from __future__ import annotations

import mmap
import struct
import tracemalloc
from collections.abc import Callable

import pytest

from sluice.codec.records import Record, encode_records
from sluice.crypto import batch_seal

pytestmark = pytest.mark.skipif(not batch_seal.AVAILABLE,
                                reason="native batch sealer not built (scripts/dev.sh install)")

KEY, PREFIX = bytes(range(32)), b"prefix"
NONCES = bytes(12 * 64)


def _varint(value: int) -> bytes:
    out = bytearray()
    value = (value << 1) ^ (value >> 63)
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def test_a_count_the_section_cannot_hold_is_refused_before_anything_is_allocated() -> None:
    """Every record takes at least 7 bytes (length, attributes, two deltas, key, value and
    header count, one byte each), so a count above a seventh of the section's size is
    malformed: each call refuses it before allocating anything of the count's size (its fate
    bytes, output room or plan), where the count alone used to size them."""
    section = bytes(encode_records([Record(0, 0, b"k", b"v", [], 0)]))
    count = 1_000_000  # room for ~60 MB of output if taken on trust
    packed = batch_seal.pack_paths(["a"])
    calls: list[Callable[[], object]] = [
        lambda: batch_seal.seal_section(section, count, KEY, NONCES, PREFIX),
        lambda: batch_seal.open_section(section, count, KEY, PREFIX, b"", 0),
        lambda: batch_seal.plan_fields(section, count, packed, 1, 8),
        lambda: batch_seal.seal_fields(section, count, KEY, NONCES, PREFIX, packed, 1, [], 8),
        lambda: batch_seal.open_fields(section, count, KEY, PREFIX, b"", 0),
    ]
    for i, call in enumerate(calls):
        tracemalloc.start()
        try:
            with pytest.raises(batch_seal.Malformed):
                call()
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        assert peak < count // 4, (i, peak)
    # The bound is exact: ten of the smallest records fill 70 bytes, and are read.
    smallest = bytes(encode_records([Record(i, 0, None, None, [], 0) for i in range(10)]))
    assert len(smallest) == 70
    assert batch_seal.seal_section(smallest, 10, KEY, NONCES, PREFIX)[1] == bytes(10)
    with pytest.raises(batch_seal.Malformed):
        batch_seal.open_section(section, -1, KEY, PREFIX, b"", 0)


def _plan_records(plan: batch_seal.FieldPlan) -> list[list[tuple[int, int, int]]]:
    words = struct.unpack(f"<{len(plan.spans) // 4}I", plan.spans)
    out, at = [], 0
    while at < len(words):
        n = words[at]
        out.append([tuple(words[at + 1 + 3 * a:at + 4 + 3 * a]) for a in range(n)])
        at += 1 + 3 * n
    return out  # type: ignore[return-value]


def _plan_of(records: list[list[tuple[int, int, int]]], seals: int) -> batch_seal.FieldPlan:
    words: list[int] = []
    for spans in records:
        words.append(len(spans))
        for span in spans:
            words.extend(span)
    return batch_seal.FieldPlan(seals, struct.pack(f"<{len(words)}I", *words))


_DOCS = [b'{"a": 1, "b": "xy"}', None, b'{"b": [1, 2], "a": {"c": 3}}']
_SECTION = bytes(encode_records([Record(i, i, b"k", v, [], 0) for i, v in enumerate(_DOCS)]))
_PACKED = batch_seal.pack_paths(["a", "b"])


def _seal(plan: batch_seal.FieldPlan) -> tuple[object, ...]:
    return batch_seal.seal_fields(_SECTION, 3, KEY, NONCES, PREFIX, _PACKED, 2, [], 8, plan)


def test_the_plan_of_the_section_is_used_as_it_is() -> None:
    plan = batch_seal.plan_fields(_SECTION, 3, _PACKED, 2, 8)
    assert [len(s) for s in _plan_records(plan)] == [2, 0, 2]
    assert _seal(plan)[3] == 4


@pytest.mark.parametrize("edit", [
    "path index", "past the value", "end before start", "out of order", "overlapping",
    "tombstone", "words missing", "words left over"])
def test_a_field_plan_that_does_not_match_its_section_is_refused(edit: str) -> None:
    """`seal_fields` reads the spans `plan_fields` found rather than scanning each document
    again; a plan that is not this section's is refused with an error naming the plan, before
    anything outside a record's value is read."""
    plan = batch_seal.plan_fields(_SECTION, 3, _PACKED, 2, 8)
    good = _plan_records(plan)
    (s0, e0, p0), (s1, e1, p1) = good[0]
    last = len(_DOCS[0] or b"")
    first = {
        "path index": [(s0, e0, 2), (s1, e1, p1)],
        "past the value": [(s0, e0, p0), (s1, last + 1, p1)],
        "end before start": [(e0, s0, p0), (s1, e1, p1)],
        "out of order": [(s1, e1, p1), (s0, e0, p0)],
        "overlapping": [(s0, s1 + 1, p0), (s1, e1, p1)],
    }
    if edit in first:
        bad = _plan_of([first[edit], [], good[2]], plan.seals)
    elif edit == "tombstone":
        bad = _plan_of([good[0], [(0, 1, 0)], good[2]], plan.seals + 1)
    elif edit == "words missing":
        bad = batch_seal.FieldPlan(plan.seals, plan.spans[:-4])
    else:
        bad = batch_seal.FieldPlan(plan.seals, plan.spans + bytes(4))
    with pytest.raises(batch_seal.NativeSealError, match="plan"):
        _seal(bad)


def test_a_record_too_long_for_32_bit_offsets_is_refused_not_wrapped() -> None:
    """Kafka's record length is an int32; the C code keeps offsets inside a record (each
    header's start) in 32 bits. A longer record in a longer section (here a header value of
    4 GiB, then a ``sluice.enc`` header) is malformed: before, the second header's offset
    wrapped and the scan returned bytes of the first header as the group. The section is an
    anonymous mapping of which only the first page is written (the rest is never read)."""
    big = (1 << 32) + 3
    head = (b"\x00\x00\x00" + _varint(-1) + _varint(-1) + _varint(2)
            + _varint(1) + b"x" + _varint(big))
    tail = _varint(10) + b"sluice.enc" + _varint(1) + b"v"
    body = len(head) + big + len(tail)
    prefix = _varint(body) + head
    size = len(prefix) + big + len(tail)
    try:
        section = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS
                            | getattr(mmap, "MAP_NORESERVE", 0))
    except (OSError, OverflowError, ValueError) as exc:
        pytest.skip(f"no {size}-byte mapping here: {exc}")
    try:
        section[:len(prefix)] = prefix
        section[size - len(tail):] = tail
        for call in (batch_seal.scan, batch_seal.first_group):
            with pytest.raises(batch_seal.Malformed):
                call(section, 1)
    finally:
        section.close()
