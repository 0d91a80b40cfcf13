"""Byte layout of ``sluice_filter_records``: the Sluice ABI v1 entry point over Kafka's own
record encoding (the fast path; ``sluice_filter`` in records_io is the portable one).

The host passes a batch's records section as Kafka stores it, decompressed, and reads back
the new records section plus one fate byte per record, so neither side builds per-record
objects in Python. All integers little-endian; ``str`` = u32 length + UTF-8 bytes.

Input (host -> guest)::

    u32 version (=1) | u8 direction (0 produce, 1 fetch) | str topic | i32 partition |
    str client_id | str principal | i64 offset_base | i64 timestamp_base |
    u32 record_count | the records section (Kafka RecordBatch v2 records, uncompressed)

Output (guest -> host)::

    u32 record_count (= input) | record_count x u8 fate (0 keep, 1 rewrite, 2 drop, 3 reject) |
    i32 records_len (-1: every record kept, the section is unchanged) | records_len bytes:
      the kept and rewritten records in input order, in Kafka's record encoding |
    u32 reject_count | per reject: u32 index, str reason |
    u32 detector_count | per detector: str name, u32 count

`decode_native_output` checks everything but the records section itself, which the caller
validates with the codec (it knows how many records it must hold: keeps + rewrites).
It never raises anything but `AbiError`.
"""

from __future__ import annotations

import struct
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Final

from sluice.codec.records import HEADER_SIZE
from sluice.filters.context import DIRECTION_CODE, RecordContext
from sluice.filters.decisions import Action
from sluice.filters.records_io import (
    _HEAD,
    _I32,
    _U32,
    ABI_VERSION,
    MAX_DETECTOR_NAME_BYTES,
    MAX_DETECTORS,
    MAX_REASON_CHARS,
    AbiError,
    _str,
)

# Fate bytes are the decision bytes of sluice_filter's output.
FATE_KEEP: Final = int(Action.KEEP)
FATE_REWRITE: Final = int(Action.REWRITE)
FATE_DROP: Final = int(Action.DROP)
FATE_REJECT: Final = int(Action.REJECT)
_KNOWN_FATES: Final = bytes((FATE_KEEP, FATE_REWRITE, FATE_DROP, FATE_REJECT))
#: A one-record output's fates by its one byte (`decode_native_output`), the known fates only.
_ONE_FATE: Final = {fate: bytes((fate,)) for fate in _KNOWN_FATES}
_KEPT_ONE: Final = bytes((FATE_KEEP,))

_TAIL = struct.Struct("<qqI")

#: What a caller may do with a guest's new records section where it lies, before anything
#: else runs in the guest (`decode_native_output`'s `finish`): given the section and the
#: records it must hold, the bytes to keep instead of a copy of it (the whole new batch), or
#: None to have it copied out as usual.
Finish = Callable[[memoryview, int], "bytes | None"]

#: Spare bytes a guest's new section is copied behind (`NativeOutput.framed`): a v2 record
#: batch header.
ROOM: Final = HEADER_SIZE
#: `ROOM` zero bytes, that `_copied` concatenates a section to (never written: the + makes a
#: new bytearray).
_ROOM_BYTES: Final = bytearray(ROOM)


_context_heads: dict[tuple[str, str, int, str | None, str | None], bytes] = {}
_CONTEXT_CACHE_LIMIT: Final = 4096


def native_input_head(ctx: RecordContext, record_count: int, offset_base: int,
                      timestamp_base: int) -> bytes:
    """Everything of the input before the records section (the caller appends it)."""
    # Keyed by a tuple of the fields, not the context: its dataclass hash and equality are
    # Python calls, per filtered batch (issue 29).
    key = (ctx.direction, ctx.topic, ctx.partition, ctx.client_id, ctx.principal)
    fixed = _context_heads.get(key)
    if fixed is None:
        # A connection sends to the same few partitions again and again: encode those once.
        fixed = b"".join((
            _HEAD.pack(ABI_VERSION, DIRECTION_CODE[ctx.direction]),
            _str(ctx.topic),
            _I32.pack(ctx.partition),
            _str(ctx.client_id),
            _str(ctx.principal),
        ))
        if len(_context_heads) >= _CONTEXT_CACHE_LIMIT:
            _context_heads.clear()
        _context_heads[key] = fixed
    return fixed + _TAIL.pack(offset_base, timestamp_base, record_count)


_lending = threading.local()


@contextmanager
def lending() -> Iterator[None]:
    """Within this block, the proxy's own native code (the encrypt filter's sealer) may hand
    back its output as a view of a buffer it keeps per thread instead of a copy: the view
    stays valid only until its next call on this thread, so the caller must copy or consume
    it before then (the pipeline builds the batch from it at once). Saves a fresh megabyte,
    its page faults and a copy per batch."""
    before = lend()
    try:
        yield
    finally:
        end_lending(before)


def lend() -> bool:
    """`lending()` without the context manager, for the per-batch path (a generator-based one
    costs a few µs per batch): returns what `end_lending` puts back; call it in a
    ``finally``."""
    before: bool = getattr(_lending, "on", False)
    _lending.on = True
    return before


def end_lending(before: bool) -> None:
    """Undo `lend()` with the value it returned."""
    _lending.on = before


def may_lend() -> bool:
    """Whether this thread's caller accepts views (see `lending`)."""
    return getattr(_lending, "on", False)


@dataclass(slots=True)
class NativeOutput:
    """One filter's answer for one records section.

    `fates[i]` is the fate byte of input record i; `records` is the new records section, or
    None when every record was kept; `rejects` maps input index -> reason. `trusted` is set
    only by the proxy's own native code (a host filter's sealer): its section, written from a
    section that was already checked, needs no second check (a guest's output always does).
    Under `lending`, a trusted `records` may be a view of the sealer's per-thread buffer.
    `incompressible`: the filter knows its section will not compress (whole values sealed),
    so the batch is written with its codec's stored blocks (`compression.compress`);
    `tail`: the bytes every rewritten record ends with (the proxy's header group), which
    LZ4 then writes as matches.
    `framed`: when set, `records` is a view of its tail and it holds `ROOM` spare bytes in
    front: the section was copied out of the guest once, behind room for a batch header,
    so an uncompressed batch is written around it in place (`records.batch_around`) rather
    than copied a second time into a new one.
    `finished`: `records` is what the caller's `finish` made of the section in guest memory
    (the new batch, checked and compressed there: the section was never copied out), in
    `finish_ns` of the call's time.
    """

    fates: bytes
    records: bytes | memoryview | None
    rejects: dict[int, str] = field(default_factory=dict)
    detector_counts: dict[str, int] = field(default_factory=dict)
    trusted: bool = False
    incompressible: bool = False
    tail: bytes = b""
    framed: bytearray | None = None
    finished: bool = False
    finish_ns: int = 0

    def count(self, fate: int) -> int:
        return self.fates.count(fate)


def _u32(buf: bytes | memoryview, pos: int, what: str) -> int:
    if pos + 4 > len(buf):
        raise AbiError(f"output truncated reading {what} at byte {pos}")
    return int(_U32.unpack_from(buf, pos)[0])


def _text(buf: bytes | memoryview, pos: int, what: str) -> tuple[str, int]:
    n = _u32(buf, pos, what)
    pos += 4
    if pos + n > len(buf):
        raise AbiError(f"output truncated reading {what} at byte {pos}")
    try:
        return str(buf[pos:pos + n], "utf-8"), pos + n
    except UnicodeDecodeError:
        raise AbiError(f"{what} is not valid UTF-8") from None


def decode_native_output(buf: bytes | memoryview, expected_records: int,
                         room: int = 0, finish: Finish | None = None) -> NativeOutput:
    """Parse a ``sluice_filter_records`` output (AbiError when it breaks the layout).

    `buf` may be a view of guest memory (`GuestInstance.view`): the result holds copies of
    what it keeps (the fates, the new records section, the texts), nothing of `buf`, so the
    records section is copied out of the guest once rather than twice. With `room`, a new
    section is copied behind that many spare bytes (`NativeOutput.framed`). With `finish`
    and a view, a new section of a valid output is first handed to `finish` where it lies
    (`Finish`; `NativeOutput.finished`): the fetch path builds a compressed batch from guest
    memory, without copying the section out (~460 KB a 2 200-record batch) first."""
    size = len(buf)
    if size < 4:
        raise AbiError("output truncated reading record_count at byte 0")
    count = _U32.unpack_from(buf, 0)[0]
    if count != expected_records:
        raise AbiError(f"output has {count} fates for {expected_records} records")
    pos = 4 + count
    if pos + 4 > size:
        raise AbiError(f"output truncated reading fates and records_len at byte {pos}")
    if count == 1:
        # One record (a one-record Produce, nearly every filtered request): its fate byte
        # looked up, not sliced, copied and scanned (~1 µs of a ~4 µs decode).
        fates = _ONE_FATE.get(buf[4], b"")
        if not fates:
            raise AbiError(f"unknown fate {buf[4]}")
        all_kept = fates == _KEPT_ONE
    else:
        fates = bytes(buf[4:pos])
        # translate() deletes the known fates in one C pass (max() walked the bytes as ints:
        # ~30 µs per 1 000 records, more than the rest of this function)
        unknown = fates.translate(None, _KNOWN_FATES)
        if unknown:
            raise AbiError(f"unknown fate {max(unknown)}")
        all_kept = fates.count(FATE_KEEP) == count
    records_len = _I32.unpack_from(buf, pos)[0]
    pos += 4
    records: bytes | memoryview | None = None
    framed: bytearray | None = None
    section_at = -1  # where the new section lies in `buf`, while `finish` may take it
    if records_len == -1:
        if not all_kept:
            raise AbiError("records_len -1 (unchanged) with records not kept")
    elif records_len < 0:
        raise AbiError(f"negative records_len {records_len}")
    else:
        if pos + records_len > size:
            raise AbiError(f"output truncated reading {records_len} bytes of records")
        # A guest that keeps everything yet returns a section: the input stands.
        if all_kept:
            records = None
        elif finish is not None and isinstance(buf, memoryview):
            section_at = pos  # copied out below if `finish` declines it
        else:
            records, framed = _copied(memoryview(buf)[pos:pos + records_len], room)
        pos += records_len
    if pos + 4 > size:
        raise AbiError(f"output truncated reading reject_count at byte {pos}")
    nrej = _U32.unpack_from(buf, pos)[0]
    pos += 4
    rejects: dict[int, str] = {}
    if nrej or not all_kept:
        rejected = fates.count(FATE_REJECT)
        if nrej != rejected:
            raise AbiError(f"{nrej} reject reasons for {rejected} rejected records")
        for _ in range(nrej):
            index = _u32(buf, pos, "reject index")
            reason, pos = _text(buf, pos + 4, "reject reason")
            if index >= count or fates[index] != FATE_REJECT or index in rejects:
                raise AbiError(f"reject reason for record {index}, which was not rejected")
            if len(reason) > MAX_REASON_CHARS:
                reason = reason[:MAX_REASON_CHARS] + "..."
            rejects[index] = reason or "rejected by filter"
    if pos + 4 > size:
        raise AbiError(f"output truncated reading detector_count at byte {pos}")
    nd = _U32.unpack_from(buf, pos)[0]
    pos += 4
    if nd * 8 > size - pos:
        raise AbiError(f"detector count {nd} exceeds the output size")
    if nd > MAX_DETECTORS:
        raise AbiError(f"detector count {nd} is over the limit of {MAX_DETECTORS}")
    detectors = _detectors(buf, pos, size, nd)
    if section_at >= 0:
        assert finish is not None
        # Only a valid output gets here, and nothing has run in the guest since its call.
        section = memoryview(buf)[section_at:section_at + records_len]
        started = time.perf_counter_ns()
        done = finish(section, count - fates.count(FATE_DROP) - fates.count(FATE_REJECT))
        spent = time.perf_counter_ns() - started
        if done is not None:
            return NativeOutput(fates, done, rejects, detectors, finished=True,
                                finish_ns=spent)
        records, framed = _copied(section, room)
    return NativeOutput(fates, records, rejects, detectors, False, False, b"", framed)


def _copied(section: memoryview, room: int) -> tuple[bytes | memoryview, bytearray | None]:
    """A new section copied out of `buf`: behind `room` spare bytes when asked
    (`NativeOutput.framed`; bytearray's += copies the view once), else as bytes."""
    if not room:
        return bytes(section), None
    # One allocation and one copy: the spare bytes' bytearray + the view (bytearray(room)
    # then += reallocated it).
    framed = (_ROOM_BYTES if room == ROOM else bytearray(room)) + section
    return memoryview(framed)[room:], framed


#: Detector sections read before, by (entry count, byte size): a Struct that reads such a
#: section whole, and the name lengths, names and their text it had (see `_detectors`).
_Layout = tuple[struct.Struct, tuple[int, ...], tuple[bytes, ...], tuple[str, ...]]
_LAYOUTS: dict[tuple[int, int], _Layout] = {}
_MAX_LAYOUTS: Final = 256
#: The largest section kept as a layout. A guest may write as many distinct names as its
#: output holds, and a layout keeps ~20 times its section's size (the names, their text, a
#: Struct of three codes an entry) after the batch, in up to `_MAX_LAYOUTS` sizes; filters
#: report a few counters (builtin:rules three, pii-mask one a detector: under 200 bytes).
_MAX_LAYOUT_BYTES: Final = 1024


def _detectors(buf: bytes | memoryview, pos: int, size: int, nd: int) -> dict[str, int]:
    """The `nd` detector counts at buf[pos:size], which must end exactly at `size`.

    A filter reports the same counters batch after batch, so a section whose entry count and
    size were seen before is first read with that section's Struct (its names as bytes, its
    counts as ints) and taken when its name lengths and names are the same: one call and two
    tuple compares instead of ~0.5 µs of Python an entry (builtin:rules reports three
    counters a batch, ~3 % of its native call). Otherwise it is read entry by entry, and a
    section of distinct names, of at most `_MAX_LAYOUT_BYTES`, becomes the layout for its
    count and size."""
    layout = _LAYOUTS.get((nd, size - pos))
    if layout is not None:
        reader, lens, names, texts = layout
        fields = reader.unpack_from(buf, pos)
        if nd == 1:
            # One counter (builtin:pii-mask's batch of one detector): no slices, no zip.
            if fields[0] == lens[0] and fields[1] == names[0]:
                return {texts[0]: fields[2]}
        elif fields[0::3] == lens and fields[1::3] == names:
            # As many texts as the Struct reads entries (it was made from them): zip without
            # strict=, whose keyword made it the slowest step (~0.5 µs).
            return dict(zip(texts, fields[2::3]))  # noqa: B905
    start = pos
    detectors: dict[str, int] = {}
    seen: list[bytes] = []
    for _ in range(nd):
        n = _u32(buf, pos, "detector name")
        if n > MAX_DETECTOR_NAME_BYTES:
            raise AbiError(f"a detector name is over the limit of {MAX_DETECTOR_NAME_BYTES} bytes")
        end = pos + 4 + n
        if end + 4 > size:
            raise AbiError(f"output truncated reading a detector at byte {pos}")
        raw = bytes(buf[pos + 4:end])
        try:
            name = str(raw, "utf-8")
        except UnicodeDecodeError:
            raise AbiError("detector name is not valid UTF-8") from None
        detectors[name] = detectors.get(name, 0) + _U32.unpack_from(buf, end)[0]
        seen.append(raw)
        pos = end + 4
    if pos != size:
        raise AbiError(f"{size - pos} unexpected bytes after the output")
    # Distinct names: a dict of the counts in order is exact. Only small sections: see
    # _MAX_LAYOUT_BYTES (a guest's output must not outlive its batch).
    if nd and len(detectors) == nd and size - start <= _MAX_LAYOUT_BYTES:
        if len(_LAYOUTS) >= _MAX_LAYOUTS:
            _LAYOUTS.clear()
        reader = struct.Struct("<" + "".join(f"I{len(raw)}sI" for raw in seen))
        _LAYOUTS[(nd, size - start)] = (reader, tuple(len(raw) for raw in seen), tuple(seen),
                                        tuple(detectors))
    return detectors
