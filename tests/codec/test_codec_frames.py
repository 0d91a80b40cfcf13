"""FrameBuffer: reassembly across chunk boundaries, size limits, zero-copy fast path."""

from __future__ import annotations

import itertools
import struct
import tracemalloc

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sluice.codec.errors import CodecError
from sluice.codec.frames import (
    DEFAULT_MAX_FRAME_SIZE,
    DIRECT_READ,
    PREALLOCATE,
    FrameBuffer,
    FrameTooLarge,
    frame,
)


def test_frame_adds_big_endian_size_prefix() -> None:
    assert frame(b"abc") == b"\x00\x00\x00\x03abc"
    assert frame(memoryview(b"")) == b"\x00\x00\x00\x00"


def test_default_limit_is_100_mib() -> None:
    assert DEFAULT_MAX_FRAME_SIZE == 100 * 1024 * 1024
    assert FrameBuffer().max_frame_size == DEFAULT_MAX_FRAME_SIZE


def test_whole_frames_in_one_chunk_are_views_of_that_chunk() -> None:
    fb = FrameBuffer()
    out = fb.feed(frame(b"one") + frame(b"two") + frame(b""))
    assert [bytes(f) for f in out] == [b"one", b"two", b""]
    assert all(isinstance(f, memoryview) for f in out)
    assert fb.pending == 0


def test_partial_frame_is_buffered_until_complete() -> None:
    fb = FrameBuffer()
    data = frame(b"hello world")
    assert fb.feed(data[:2]) == []
    assert fb.pending == 2
    assert fb.feed(data[2:7]) == []
    assert fb.pending == 7
    out = fb.feed(data[7:] + frame(b"x")[:3])
    assert [bytes(f) for f in out] == [b"hello world"]
    assert fb.pending == 3
    assert [bytes(f) for f in fb.feed(frame(b"x")[3:])] == [b"x"]
    assert fb.pending == 0


def test_returned_frames_survive_later_feeds() -> None:
    fb = FrameBuffer()
    data = frame(b"A" * 100)
    fb.feed(data[:50])
    (first,) = fb.feed(data[50:])
    fb.feed(frame(b"B" * 100)[:60])
    assert bytes(first) == b"A" * 100


def test_bytearray_input_is_not_aliased() -> None:
    fb = FrameBuffer()
    chunk = bytearray(frame(b"data"))
    (out,) = fb.feed(chunk)
    chunk[4:8] = b"XXXX"
    assert bytes(out) == b"data"


def test_oversize_frame_rejected_from_prefix_alone() -> None:
    fb = FrameBuffer(max_frame_size=1024)
    # Only the prefix of a 2 GiB frame: must raise without waiting for (or reserving) the body.
    with pytest.raises(FrameTooLarge):
        fb.feed(struct.pack(">i", 2**31 - 1))
    assert fb.pending == 0


def test_oversize_frame_rejected_when_prefix_is_split() -> None:
    fb = FrameBuffer(max_frame_size=1024)
    fb.feed(frame(b"ok")[:3])
    fb = FrameBuffer(max_frame_size=1024)
    assert fb.feed(b"\x00\x00") == []
    with pytest.raises(FrameTooLarge):
        fb.feed(b"\x04\x01")
    assert fb.pending <= 4


def test_frame_at_limit_is_accepted() -> None:
    fb = FrameBuffer(max_frame_size=8)
    assert [bytes(f) for f in fb.feed(frame(b"12345678"))] == [b"12345678"]
    with pytest.raises(FrameTooLarge):
        fb.feed(frame(b"123456789"))


def test_negative_size_rejected() -> None:
    fb = FrameBuffer()
    with pytest.raises(FrameTooLarge):
        fb.feed(b"\xff\xff\xff\xfe")


def test_frame_too_large_is_a_value_error_and_codec_error() -> None:
    assert issubclass(FrameTooLarge, ValueError)
    assert issubclass(FrameTooLarge, CodecError)


@settings(max_examples=200, deadline=None)
@given(
    bodies=st.lists(st.binary(max_size=300), max_size=20),
    cuts=st.lists(st.integers(min_value=0, max_value=10_000), max_size=30),
)
def test_random_chunking_yields_the_same_frames(bodies: list[bytes], cuts: list[int]) -> None:
    stream = b"".join(frame(b) for b in bodies)
    points = sorted({c % (len(stream) + 1) for c in cuts} | {0, len(stream)})
    fb = FrameBuffer()
    got: list[bytes] = []
    for a, b in itertools.pairwise(points):
        got.extend(bytes(f) for f in fb.feed(stream[a:b]))
    assert got == bodies
    assert fb.pending == 0


@settings(max_examples=200, deadline=None)
@given(data=st.binary(max_size=200), limit=st.integers(min_value=0, max_value=64))
def test_random_bytes_raise_only_frame_errors(data: bytes, limit: int) -> None:
    fb = FrameBuffer(max_frame_size=limit)
    try:
        for f in fb.feed(data):
            assert len(f) <= limit
    except FrameTooLarge:
        pass


def test_a_frame_fed_byte_by_byte_holds_about_its_own_size() -> None:
    # What a frame in assembly holds follows what the peer sent, a byte per read included.
    fb = FrameBuffer()
    data = frame(b"z" * 100_000)
    tracemalloc.start()
    try:
        for i in range(len(data) - 1):
            fb.feed(data[i : i + 1])
        held, _peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert fb.pending == len(data) - 1
    assert held < 1.3 * len(data)
    (out,) = fb.feed(data[-1:])
    assert bytes(out) == data[4:]


# ------------------------------------------------------------ buffered reads (get_buffer)


def _read_into(fb: FrameBuffer, stream: bytes, sizes: list[int]) -> list[bytes]:
    """What a buffered-protocol transport does: ask for a buffer, write at most its length
    (and at most the next read size) from the stream, report it."""
    got: list[bytes] = []
    pos, k = 0, 0
    while pos < len(stream):
        buf = fb.get_buffer()
        want = sizes[k % len(sizes)] if sizes else len(stream)
        k += 1
        n = min(len(buf), max(1, want), len(stream) - pos)
        buf[:n] = stream[pos : pos + n]
        del buf  # a transport releases the buffer before the next read
        pos += n
        got.extend(bytes(f) for f in fb.buffer_updated(n))
    return got


@settings(max_examples=200, deadline=None)
@given(
    bodies=st.lists(
        st.one_of(st.binary(max_size=300), st.integers(0, 300_000).map(lambda n: b"q" * n)),
        max_size=8,
    ),
    sizes=st.lists(st.integers(min_value=1, max_value=400_000), max_size=12),
)
def test_buffered_reads_yield_the_same_frames(bodies: list[bytes], sizes: list[int]) -> None:
    stream = b"".join(frame(b) for b in bodies)
    fb = FrameBuffer()
    assert _read_into(fb, stream, sizes) == bodies
    assert fb.pending == 0


def test_buffered_reads_split_at_every_byte() -> None:
    bodies = [b"", b"a", b"bc" * 50, bytes(range(256)) * 400]  # the last one is read directly
    stream = b"".join(frame(b) for b in bodies)
    for cut in range(len(stream) + 1):
        fb = FrameBuffer()
        got = _read_into(fb, stream[:cut], [])
        got += _read_into(fb, stream[cut:], [])
        assert got == bodies, cut
        assert fb.pending == 0


def test_a_large_frame_is_read_into_its_own_buffer() -> None:
    body = bytes(range(256)) * 20_000  # ~5 MB: grows past PREALLOCATE while read into
    data = frame(body)
    fb = FrameBuffer()
    first = fb.get_buffer()
    first[:1000] = data[:1000]
    del first
    assert fb.buffer_updated(1000) == []
    pos, direct = 1000, 0
    out: list[memoryview | bytes] = []
    while pos < len(data):
        buf = fb.get_buffer()
        n = min(len(buf), 300_000, len(data) - pos)
        direct += n >= DIRECT_READ
        buf[:n] = data[pos : pos + n]
        del buf
        pos += n
        out += fb.buffer_updated(n)
    assert [bytes(f) for f in out] == [body]
    assert direct >= 10  # most of it went straight into the frame's buffer
    assert fb.pending == 0


def test_a_declared_large_frame_reserves_little_until_its_bytes_come() -> None:
    fb = FrameBuffer(max_frame_size=DEFAULT_MAX_FRAME_SIZE)
    tracemalloc.start()
    try:
        fb.feed(struct.pack(">i", DEFAULT_MAX_FRAME_SIZE) + b"x" * 10)
        held, _peak = tracemalloc.get_traced_memory()
        buf = fb.get_buffer()
        assert len(buf) <= PREALLOCATE
        del buf
    finally:
        tracemalloc.stop()
    assert held <= PREALLOCATE + 64 * 1024


def test_oversize_frame_rejected_on_a_buffered_read() -> None:
    fb = FrameBuffer(max_frame_size=1024)
    buf = fb.get_buffer()
    buf[:4] = struct.pack(">i", 4096)
    del buf
    with pytest.raises(FrameTooLarge):
        fb.buffer_updated(4)


def test_frames_from_the_scratch_buffer_survive_later_reads() -> None:
    fb = FrameBuffer()
    buf = fb.get_buffer()
    buf[:7] = frame(b"one")
    del buf
    (first,) = fb.buffer_updated(7)
    buf = fb.get_buffer()
    buf[:7] = frame(b"two")
    del buf
    (second,) = fb.buffer_updated(7)
    assert (bytes(first), bytes(second)) == (b"one", b"two")
