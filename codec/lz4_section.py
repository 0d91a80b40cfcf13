"""An lz4 batch's records section not yet decompressed, for a reader that has a home for it.

Why: on the fetch and produce paths a guest reads every batch's records section from its own
memory. The section was decompressed into a buffer of its own (zeroed first), checked there
and copied into the guest: two passes over ~1 MB per batch that only move bytes. A `PendingSection`
is decompressed straight where the guest reads it (`write_into`, called by the filter's
runner at the address it allocated) and checked there, before any filter call. The verdicts
are those of `records.records_section` followed by `records.check_section` (the pipeline's
`_open` and `_check_input`), raised as `SectionRefused` around the codec's own error so that
no filter runtime mistakes them for a failure of its guest.

Only batches whose frame binds its own size are pending (`pending_section`: one LZ4 frame
whose block headers give the bound, within `limits.max_bytes`; the same condition under
which `compression.decompress` uses a buffer of exactly that bound), and only within the
room the guests may allocate (`most_room`: half their memory cap, since a frame may claim
255 times what it holds); any other batch is opened as before.
"""

from __future__ import annotations

import time
from typing import Final

from . import lz4_frame
from .batch_limits import BatchLimits, check_count, check_section_size
from .compression import CODEC_LZ4, LZ4_SEALED_NATIVE, lz4_output_bound
from .errors import CodecError, CorruptBatch
from .raw_memory import view_at
from .records import HEADER_SIZE, NATIVE_CHECK, RawBatch, check_section

__all__ = ["PendingSection", "SectionRefused", "pending_section"]

#: Whether sections can be pending here: liblz4 loaded (its decompressor writes at an
#: address), the native module built (it gives a view's address), the native record check.
AVAILABLE: Final = lz4_frame.AVAILABLE and LZ4_SEALED_NATIVE and NATIVE_CHECK

if LZ4_SEALED_NATIVE:
    from sluice.codec._record_check import (  # type: ignore[import-not-found, unused-ignore]
        ffi as _ffi,
    )


class SectionRefused(Exception):
    """`PendingSection.write_into` refused the batch: `error` is the codec's own error
    (BatchTooLarge, CorruptBatch) that opening and checking it the usual way raises."""

    def __init__(self, error: CodecError) -> None:
        super().__init__(str(error))
        self.error = error


class PendingSection:
    """The records section of `batch` (lz4, `count` > 0 records), at most `bound` bytes once
    decompressed. `room` is what a home for it must hold (one byte past the bound: a frame
    that fills it yields more than its headers allow). `spent_ns`: the time the last
    `write_into` took, which a caller that times the reader leaves out (the host's work, not
    the reader's, as when the section was opened before the reader ran)."""

    __slots__ = ("attributes", "batch", "bound", "count", "max_headers", "spent_ns")

    def __init__(self, batch: RawBatch, bound: int, max_headers: int) -> None:
        self.batch = batch
        self.bound = bound
        self.count = batch.header.record_count
        self.attributes = batch.header.attributes
        self.max_headers = max_headers
        self.spent_ns = 0

    @property
    def room(self) -> int:
        return self.bound + 1

    def write_into(self, address: int) -> int:
        """Decompress the section to `address` (`room` writable bytes there, kept valid by the
        caller) and check it; its length. SectionRefused as `records_section` and
        `check_section` refuse it."""
        started = time.perf_counter_ns()
        payload = self.batch.data[HEADER_SIZE:]
        src = _ffi.from_buffer(payload)
        try:
            try:
                n = lz4_frame.decompress_into(int(_ffi.cast("uintptr_t", src)), len(payload),
                                              address, self.room)
            except lz4_frame.Lz4Limit:
                raise CorruptBatch("lz4 frame yields more than its block headers "
                                   "allow") from None
            except lz4_frame.Lz4Error as exc:
                raise CorruptBatch(f"lz4 decompression failed: {exc}") from exc
            finally:
                del src
            check_section_size(self.count, n)
            if n:
                plain = view_at(address, n)
                check_section(plain, self.count, self.attributes, self.max_headers)
        except CodecError as exc:
            raise SectionRefused(exc) from exc
        finally:
            self.spent_ns = time.perf_counter_ns() - started
        return n


def pending_section(batch: RawBatch, limits: BatchLimits, most_room: int | None = None
                    ) -> PendingSection | None:
    """`batch`'s records section as a `PendingSection`, or None when it is opened the usual
    way (not lz4, no records, no binding bound, a `room` over `most_room`, the module not
    built). The caller has
    checked the codec id and the CRC; the declared count is checked here (BatchTooLarge, as
    `records_section` does first)."""
    header = batch.header
    if not AVAILABLE or header.compression != CODEC_LZ4 or header.record_count <= 0:
        return None
    check_count(header.record_count, limits)
    bound = lz4_output_bound(batch.data[HEADER_SIZE:], limits.max_bytes)
    if bound is None or (most_room is not None and bound + 1 > most_room):
        return None
    return PendingSection(batch, bound, limits.max_headers)
