"""FrameBuffer: reassembly across chunk boundaries, size limits, zero-copy fast path."""

from __future__ import annotations

import itertools
import struct
import tracemalloc

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sluice.codec.errors import CodecError
from sluice.codec.frames import DEFAULT_MAX_FRAME_SIZE, FrameBuffer, FrameTooLarge, frame


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


@given(
    bodies=st.lists(st.binary(max_size=300), min_size=1, max_size=6),
    cuts=st.lists(st.integers(min_value=0, max_value=2000), max_size=12),
)
def test_missing_is_what_the_frame_in_assembly_still_lacks(
    bodies: list[bytes], cuts: list[int]
) -> None:
    """After any chunk: 0 if no size prefix is pending whole, else the bytes from the stream's
    position to the end of the frame that prefix announced."""
    stream = b"".join(frame(b) for b in bodies)
    ends, at = [], 0
    for body in bodies:
        ends.append((at + 4, at + 4 + len(body)))  # (prefix read, frame whole)
        at += 4 + len(body)
    fb = FrameBuffer()
    points = sorted({min(c, len(stream)) for c in cuts} | {len(stream)})
    start = 0
    for point in points:
        fb.feed(stream[start:point])
        start = point
        expected = next((end - point for head, end in ends if head <= point < end), 0)
        assert fb.missing == expected
