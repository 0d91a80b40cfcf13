"""Counting records in a records blob from the batch headers alone (no decompression)."""

from __future__ import annotations

from sluice.codec.errors import CodecError
from sluice.codec.records import split_batches


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
