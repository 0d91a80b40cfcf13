"""Counting records in a records blob, and the size it expands to, from the batch headers and
the codecs' framing alone (no decompression)."""

from __future__ import annotations

import struct

from sluice.codec.compression import CODEC_NONE, declared_size
from sluice.codec.errors import CodecError
from sluice.codec.records import HEADER_SIZE, split_batches

# base offset, batch length, partition leader epoch (skipped), magic, CRC, attributes
_HEAD = struct.Struct(">qi4xbIh")
_COMPRESSION_MASK = 0x07


def count_records(records: bytes | bytearray | memoryview | None) -> int:
    if not records:
        return 0
    try:
        batches, _tail = split_batches(records)
    except CodecError:
        return 0
    return sum(b.header.record_count for b in batches)


def offset_range(records: bytes | bytearray | memoryview | None) -> tuple[int | None, int | None]:
    """First and last offsets covered by the whole batches in a Fetch partition's records."""
    if not records:
        return None, None
    try:
        batches, _tail = split_batches(records)
    except CodecError:
        return None, None
    if not batches:
        return None, None
    return batches[0].header.base_offset, batches[-1].header.last_offset


def expanded_size(records: bytes | bytearray | memoryview | None) -> int | None:
    """Bytes the whole batches in `records` occupy once decompressed, as their headers and
    their codecs' framing declare it (no decompression), plus any partial tail; None when a
    batch's codec declares no size it is held to (gzip, lz4, zstd: see
    `compression.declared_size`) or the batches do not parse."""
    if not records:
        return 0
    whole = len(records)
    if whole >= HEADER_SIZE:
        # One uncompressed batch filling the blob (a producer's usual partition): its size,
        # read from the header without building the batch list (`split_batches` below gives
        # the same answer for it).
        _base, length, magic, _crc, attributes = _HEAD.unpack_from(records, 0)
        if (length + 12 == whole and length >= HEADER_SIZE - 12 and magic == 2
                and attributes & _COMPRESSION_MASK == CODEC_NONE):
            return whole
    return expanded_size_of_batches(records)


def expanded_size_of_batches(records: bytes | bytearray | memoryview) -> int | None:
    """`expanded_size` from the batch list alone, without its short way for one uncompressed
    batch (which must give the same answer)."""
    try:
        batches, tail = split_batches(records)
    except CodecError:
        return None
    total = len(tail)
    for batch in batches:
        size = declared_size(batch.header.compression, batch.data[HEADER_SIZE:])
        if size is None:
            return None
        total += HEADER_SIZE + size
    return total
