"""lz4 through the system's liblz4 (codec/lz4_frame.py): the same frames as cramjam made, the
same verdicts on bad input, output bounded by the limit, and the GIL given up while it works."""

from __future__ import annotations

import ctypes
import gc
import os
import sys
import threading
import tracemalloc

import cramjam
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sluice.codec import compression, lz4_frame
from sluice.codec.compression import CODEC_LZ4
from sluice.codec.errors import BatchTooLarge, CorruptBatch

pytestmark = pytest.mark.skipif(not lz4_frame.AVAILABLE, reason="no liblz4.so.1 on this host")


def cramjam_frame(data: bytes) -> bytes:
    """The frame `compression.compress` made before lz4_frame (cramjam, level 0)."""
    compressor = cramjam.lz4.Compressor(level=0, content_checksum=False, block_linked=False)
    compressor.compress(data)
    return bytes(compressor.finish())


#: The 7 bytes opening an LZ4 frame as librdkafka's producer writes it (liblz4's frame
#: preferences left at their defaults but for independent blocks): the magic number, FLG 0x60
#: (version 01, independent blocks, no block or content checksum, no content size), BD 0x40
#: (blocks of at most 64 KiB) and the descriptor's checksum, the second byte of xxh32(FLG BD).
LIBRDKAFKA_FRAME_HEAD = bytes.fromhex("04224d18") + bytes([0x60, 0x40, 0x82])


records = st.one_of(
    st.binary(max_size=3000),
    st.builds(lambda chunk, n: chunk * n, st.binary(min_size=1, max_size=300),
              st.integers(1, 2000)),
)


@settings(max_examples=80, deadline=None)
@given(data=records)
def test_frames_are_cramjams_bytes_and_read_back(data: bytes) -> None:
    frame = compression.compress(CODEC_LZ4, data)
    assert frame == cramjam_frame(data)
    assert bytes(compression.decompress(CODEC_LZ4, frame)) == data
    assert bytes(cramjam.lz4.decompress(frame)) == data


def test_large_sections_grow_the_buffer_and_keep_to_the_limit() -> None:
    data = b'{"user": "ann@example.com", "note": "' + b"x" * 150 + b'"}'
    data *= 20_000  # 3.8 MB, blocks of 64 KiB: the first guess is far too small
    frame = lz4_frame.compress(data)
    assert bytes(lz4_frame.decompress(frame, len(data), 64)) == data
    with pytest.raises(BatchTooLarge):
        compression.decompress(CODEC_LZ4, frame, limit=len(data) - 1)


@settings(max_examples=40, deadline=None)
@given(data=records)
def test_content_of_exactly_the_limit_is_read_to_its_end_mark(data: bytes) -> None:
    # The buffer is as large as the limit: the end mark still has to be read after the last
    # byte fills it (an lz4 batch is decompressed into its block-header bound exactly).
    frame = cramjam_frame(data)
    assert bytes(lz4_frame.decompress(frame, len(data), len(data))) == data
    if data:
        with pytest.raises(lz4_frame.Lz4Limit):
            lz4_frame.decompress(frame, len(data) - 1, len(data) - 1)


def test_truncated_and_corrupt_frames_are_corrupt_batches() -> None:
    frame = lz4_frame.compress(os.urandom(1000) * 300)
    for cut in (3, 7, 20, len(frame) // 2, len(frame) - 1):
        with pytest.raises(CorruptBatch, match="lz4 decompression failed"):
            compression.decompress(CODEC_LZ4, frame[:cut])
    bad = bytearray(frame)
    bad[40] ^= 0xFF  # inside the first block: its checksum no longer matches
    with pytest.raises(CorruptBatch, match="lz4 decompression failed"):
        compression.decompress(CODEC_LZ4, bytes(bad))
    with pytest.raises(CorruptBatch):
        compression.decompress(CODEC_LZ4, b"not an lz4 frame at all")


@pytest.mark.serial
def test_a_python_thread_runs_while_another_compresses() -> None:
    """With Python's switch interval longer than the calls, a thread counting in Python can run
    during a call only if the call gave the GIL up (cramjam's lz4 Compressor does not: the
    counter stays still through each of its calls)."""
    # Calls of tens of ms (a thread wake-up on a loaded machine can take ~10 ms).
    data = b"".join(b'{"user": "u%d@example.com", "n": %d}' % (i, i * 7) for i in range(800_000))
    frame = lz4_frame.compress(data)
    count = [0]
    stop = threading.Event()

    def spin() -> None:
        while not stop.is_set():
            count[0] += 1

    interval = sys.getswitchinterval()
    sys.setswitchinterval(0.5)
    spinner = threading.Thread(target=spin)
    spinner.start()
    try:
        progress = []
        for call in (lambda: lz4_frame.compress(data),
                     lambda: lz4_frame.decompress(frame, len(data), len(data))) * 6:
            before = count[0]
            call()
            progress.append(count[0] - before)
    finally:
        stop.set()
        spinner.join()
        sys.setswitchinterval(interval)
    assert max(progress[0::2]) > 0 and max(progress[1::2]) > 0, progress


def _memory_kept_by_a_thread_after(size: int) -> int:
    """Bytes still allocated in a fresh thread after it compressed `size` bytes and dropped
    the frame (what the thread keeps for its next call)."""
    kept: list[int] = []

    def run() -> None:
        data = bytes(size)
        tracemalloc.start()
        try:
            frame = lz4_frame.compress(data)
            del frame
            kept.append(tracemalloc.get_traced_memory()[0])
        finally:
            tracemalloc.stop()

    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    return kept[0]


def test_a_large_section_leaves_no_large_buffer_behind() -> None:
    """A client can make a section as large as max_batch_bytes (32 MiB of zeros is ~130 KB of
    lz4): a filter thread that compressed one must not hold a buffer of its size for good."""
    assert _memory_kept_by_a_thread_after(24 << 20) < 6 << 20
    # Batch-sized sections keep theirs: their next compression does not zero a fresh one.
    assert _memory_kept_by_a_thread_after(1 << 20) > 1 << 20


def _ctypes_array_types() -> int:
    return sum(1 for t in gc.get_objects()
               if isinstance(t, type) and issubclass(t, ctypes.Array))


def test_sections_of_new_sizes_make_no_ctypes_types_and_views_read_in_place() -> None:
    """Each fetched lz4 batch has its own size: decompression and compression over views of
    it (a fetched frame, an opened section lent as a view of a bytearray) must not make a
    ctypes array type per size (7-45 µs each, and each lives until the cyclic garbage
    collector frees it); the frames stay those of bytes input, and a bad frame leaves the thread's
    decompression context fit for the next one."""
    base = b'{"user_id": "u1", "card": "4111 1111 1111 0000", "note": "xxxxxxxx"}'
    sections = [bytearray(base * (3 + i) + bytes([i])) for i in range(40)]
    frames = [lz4_frame.compress(bytes(s)) for s in sections]
    before = _ctypes_array_types()
    for i, (section, frame) in enumerate(zip(sections, frames, strict=True)):
        assert lz4_frame.compress(memoryview(section)[:]) == frame
        wrapped = bytearray(b"\0" * 7 + frame)
        assert bytes(compression.decompress(CODEC_LZ4, memoryview(wrapped)[7:])) == section
        if i % 10 == 0:
            with pytest.raises(CorruptBatch):
                compression.decompress(CODEC_LZ4, frame[:-6] + b"\xff" * 6)
    assert _ctypes_array_types() - before < 5

@settings(max_examples=80, deadline=None)
@given(data=records)
def test_fast_frames_are_the_same_format_and_read_back(data: bytes) -> None:
    # The fetch path's recompression (a higher acceleration): the frame descriptor of the
    # level-0 frame (independent 64 KiB blocks, no content size or checksum) without block
    # checksums, as librdkafka's producer writes it (its LZ4F defaults), read back by liblz4
    # and by cramjam's independent decoder.
    fast = compression.compress(CODEC_LZ4, data, fast=True)
    assert fast[:7] == LIBRDKAFKA_FRAME_HEAD
    assert bytes(compression.decompress(CODEC_LZ4, fast)) == data
    assert bytes(cramjam.lz4.decompress(fast)) == data
    assert bytes(lz4_frame.decompress(fast, len(data), len(data))) == data
