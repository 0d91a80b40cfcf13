"""A pending lz4 section (codec/lz4_section.py) decompressed into memory of the caller's:
the same bytes and the same verdicts as opening the batch the usual way
(`records_section`, then `check_section`), for any payload, damaged or not."""

from __future__ import annotations

import ctypes
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sluice.codec import lz4_frame, lz4_section
from sluice.codec.batch_limits import BatchLimits
from sluice.codec.compression import CODEC_LZ4
from sluice.codec.errors import CodecError
from sluice.codec.records import (
    HEADER_SIZE,
    BatchHeader,
    RawBatch,
    Record,
    build_batch,
    check_section,
    parse_batch_header,
    records_section,
)

pytestmark = pytest.mark.skipif(not lz4_section.AVAILABLE,
                                reason="no liblz4.so.1 or native module on this host")


def _batch(values: list[bytes], payload: bytes | None = None, count: int | None = None
           ) -> RawBatch:
    recs = [Record(j, j, None, v, [("k", b"v")]) for j, v in enumerate(values)]
    n = len(recs)
    data = bytearray(build_batch(BatchHeader(7, 0, 0, 2, 0, CODEC_LZ4, n - 1, 1, 1, -1, -1, -1,
                                             n), recs))
    if payload is not None:
        data[HEADER_SIZE:] = payload
        struct.pack_into(">i", data, 8, len(data) - 12)
    if count is not None:
        struct.pack_into(">i", data, HEADER_SIZE - 4, count)
    return RawBatch(parse_batch_header(data), bytes(data))


def _opened(batch: RawBatch, limits: BatchLimits) -> bytes | str:
    try:
        plain = records_section(batch, limits)
        check_section(plain, batch.header.record_count, batch.header.attributes,
                      limits.max_headers)
        return bytes(plain)
    except CodecError as exc:
        return f"{type(exc).__name__}: {exc}"


def _pending(batch: RawBatch, limits: BatchLimits) -> bytes | str | None:
    try:
        section = lz4_section.pending_section(batch, limits)
    except CodecError as exc:
        return f"{type(exc).__name__}: {exc}"
    if section is None:
        return None
    home = ctypes.create_string_buffer(section.room)
    try:
        n = section.write_into(ctypes.addressof(home))
    except lz4_section.SectionRefused as exc:
        return f"{type(exc.error).__name__}: {exc.error}"
    return home.raw[:n]


@settings(max_examples=300, deadline=None)
@given(values=st.lists(st.binary(max_size=300), min_size=1, max_size=30),
       edits=st.lists(st.tuples(st.integers(0, 10**6), st.integers(0, 255)), max_size=3),
       cut=st.none() | st.integers(0, 10**6), extra=st.sampled_from([b"", b"\x00", b"junk"]),
       twice=st.booleans(), count=st.none() | st.integers(0, 40),
       max_bytes=st.sampled_from([1 << 20, 2000, 64]),
       max_headers=st.sampled_from([1000, 3]))
def test_a_pending_section_is_what_opening_the_batch_gives(
        values: list[bytes], edits: list[tuple[int, int]], cut: int | None, extra: bytes,
        twice: bool, count: int | None, max_bytes: int, max_headers: int) -> None:
    frame = bytearray(_batch(values).data[HEADER_SIZE:])
    if twice:  # two frames one after the other: both decoders read on
        frame += bytes(frame)
    for at, value in edits:
        frame[at % len(frame)] = value
    if cut is not None:
        del frame[cut % len(frame):]
    batch = _batch(values, bytes(frame) + extra, count)
    limits = BatchLimits(max_bytes=max_bytes, max_headers=max_headers)
    pending = _pending(batch, limits)
    if pending is not None:
        assert pending == _opened(batch, limits)


def test_an_intact_batch_is_pending_and_decompressed_whole() -> None:
    values = [b'{"email": "a@example.com", "n": %d}' % i for i in range(500)]
    batch = _batch(values)
    got = _pending(batch, BatchLimits())
    assert isinstance(got, bytes) and got == _opened(batch, BatchLimits())


def test_decompress_into_stops_at_the_room_it_has() -> None:
    content = b"abc" * 10_000
    frame = lz4_frame.compress(content)
    src = ctypes.create_string_buffer(frame, len(frame))
    for room, fits in ((len(content) + 1, True), (len(content), False)):
        home = ctypes.create_string_buffer(room)
        if fits:
            n = lz4_frame.decompress_into(ctypes.addressof(src), len(frame),
                                          ctypes.addressof(home), room)
            assert home.raw[:n] == content
        else:
            with pytest.raises(lz4_frame.Lz4Limit):
                lz4_frame.decompress_into(ctypes.addressof(src), len(frame),
                                          ctypes.addressof(home), room)
