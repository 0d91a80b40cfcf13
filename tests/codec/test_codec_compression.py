"""Compression codecs: round trips, snappy framings, lz4 block independence, output caps."""

from __future__ import annotations

import gzip
import os
import struct
import tracemalloc

import cramjam
import pytest

from sluice.codec.compression import (
    CODEC_LZ4,
    XERIAL_MAGIC,
    _lz4_output_bound,
    compress,
    decompress,
    is_xerial,
)
from sluice.codec.errors import CodecError, CorruptBatch, UnsupportedCompression

DATA = b"".join(os.urandom(64) * 3 for _ in range(2000))  # ~384 KiB, several blocks


@pytest.mark.parametrize("codec", [0, 1, 2, 3, 4])
@pytest.mark.parametrize("xerial", [True, False])
def test_round_trip(codec: int, xerial: bool) -> None:
    assert bytes(decompress(codec, compress(codec, DATA, xerial))) == DATA
    assert bytes(decompress(codec, compress(codec, b"", xerial))) == b""


def test_snappy_framings() -> None:
    framed = compress(2, DATA, xerial=True)
    raw = compress(2, DATA, xerial=False)
    assert is_xerial(framed)
    assert bytes(framed[:8]) == XERIAL_MAGIC
    assert not is_xerial(raw)
    # xerial splits input into 32 KiB blocks, each length-prefixed.
    (first_block,) = struct.unpack_from(">i", framed, 16)
    assert cramjam.snappy.decompress_raw_len(framed[20 : 20 + first_block]) == 32 * 1024
    assert bytes(decompress(2, framed)) == bytes(decompress(2, raw)) == DATA


def test_lz4_frames_have_independent_blocks() -> None:
    # Kafka's Java LZ4 reader decodes each block on its own.
    frame = compress(3, DATA)
    assert bytes(frame[:4]) == b"\x04\x22\x4d\x18"
    flags = frame[4]
    assert flags >> 6 == 1  # version
    assert flags & 0x20  # block independence


def test_lz4_output_buffer_is_sized_from_the_frame_blocks() -> None:
    """An LZ4 frame decompresses into a buffer sized from its block headers (a stored block
    its own length, a compressed one the frame's block size), not 8 times the payload: a
    batch of sealed records, which do not compress, had ~2 MB zeroed per 250 KB."""
    sealed_like = os.urandom(300_000)
    out = decompress(3, compress(3, sealed_like))
    assert isinstance(out, memoryview) and bytes(out) == sealed_like
    assert len(out.obj) == len(sealed_like)  # type: ignore[arg-type]
    out = decompress(3, compress(3, DATA))
    assert isinstance(out, memoryview) and bytes(out) == DATA
    assert len(out.obj) < len(DATA) + 64 * 1024  # type: ignore[arg-type]
    # A frame with a content checksum, from another writer: the same bytes.
    other = cramjam.lz4.Compressor(content_checksum=True)
    other.compress(DATA)
    assert bytes(decompress(3, bytes(other.finish()))) == DATA


def test_lz4_first_buffer_of_tiny_blocks_is_not_the_whole_limit() -> None:
    """A hostile 1 KB frame of 200 one-byte compressed blocks, each in a frame of 4 MiB
    blocks, must not size the first buffer at 200 x 4 MiB (then clipped to the limit, all of
    it zeroed before decompressing a byte): a block yields at most ~255 bytes a byte."""
    flags, descriptor = 0x60, 0x70  # version 1, independent blocks; 4 MiB blocks
    blocks = b"".join((1).to_bytes(4, "little") + b"\x00" for _ in range(200))
    frame = b"\x04\x22\x4d\x18" + bytes([flags, descriptor, 0]) + blocks + bytes(4)
    assert len(frame) < 1100
    bound = _lz4_output_bound(frame)
    assert bound is not None and bound <= 200 * 256


def _peak_while_decompressing(payload: bytes, limit: int) -> int:
    tracemalloc.start()
    try:
        try:
            decompress(3, payload, limit=limit)
        except CorruptBatch:
            pass
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


@pytest.mark.parametrize("claim", ["content_size", "block_headers"])
def test_lz4_first_buffer_is_not_sized_from_an_unchecked_claim(claim: str) -> None:
    """A few dozen bytes of LZ4 frame that claim a large output (a content size field, or
    compressed blocks of one byte each in a frame of 4 MiB blocks) must not make the proxy
    allocate and zero the whole limit before decompression finds the frame wrong: LZ4
    makes at most 255 bytes per input byte."""
    limit = 32 * 1024 * 1024
    magic = b"\x04\x22\x4d\x18"
    if claim == "content_size":  # FLG: version 1, independent blocks, content size; 4 MiB
        frame = magic + bytes([0x68, 0x70]) + limit.to_bytes(8, "little") + b"\x00"
        frame += (5 | 0x80000000).to_bytes(4, "little") + b"hello" + bytes(4)
    else:  # eight compressed blocks of one byte, each "up to 4 MiB"
        frame = magic + bytes([0x60, 0x70, 0x00])
        frame += ((1).to_bytes(4, "little") + b"\x00") * 8 + bytes(4)
    assert len(frame) < 64
    assert _peak_while_decompressing(frame, limit) < 1024 * 1024


def test_gzip_reads_other_writers_and_multiple_members() -> None:
    python_gzip = gzip.compress(DATA[:1000]) + gzip.compress(DATA[1000:3000])
    assert bytes(decompress(1, python_gzip)) == DATA[:3000]


@pytest.mark.parametrize("codec", [1, 2, 3, 4])
@pytest.mark.parametrize("xerial", [True, False])
def test_output_cap_stops_decompression_bombs(codec: int, xerial: bool) -> None:
    bomb = compress(codec, bytes(8 * 1024 * 1024), xerial)
    assert len(bomb) < 1024 * 1024
    with pytest.raises(CorruptBatch, match="more than"):
        decompress(codec, bomb, limit=1024 * 1024)
    assert len(decompress(codec, bomb, limit=8 * 1024 * 1024)) == 8 * 1024 * 1024


@pytest.mark.parametrize("codec", [1, 2, 3, 4])
def test_garbage_and_truncation_are_corrupt_batch(codec: int) -> None:
    good = bytes(compress(codec, DATA))
    for bad in (b"", b"\x00" * 10, os.urandom(100), good[: len(good) // 2], good[:-3]):
        with pytest.raises(CorruptBatch):
            decompress(codec, bad)


def test_truncated_xerial_blocks() -> None:
    framed = bytes(compress(2, DATA, xerial=True))
    with pytest.raises(CorruptBatch):
        decompress(2, framed[:18])
    with pytest.raises(CorruptBatch):
        decompress(2, framed[:-5])


@pytest.mark.parametrize("codec", [5, 6, 7])
def test_unknown_codec_ids(codec: int) -> None:
    with pytest.raises(UnsupportedCompression):
        decompress(codec, b"abc")
    with pytest.raises(UnsupportedCompression):
        compress(codec, b"abc")


@pytest.mark.parametrize("cut, limit", [(0, 1000), (9, 1 << 20)])
def test_a_refused_lz4_view_is_not_left_exported_by_the_error(cut: int, limit: int) -> None:
    """A view of an lz4 frame is read where it lies, and given back before an error leaves
    (too large, or cut short): the error's traceback keeps the frame that read it, and a
    memoryview still exported from a kept frame, in a reference cycle, crashes CPython 3.11's
    collector (gh-77894)."""
    frame = compress(CODEC_LZ4, DATA)
    view = memoryview(bytearray(frame[:len(frame) - cut]))
    with pytest.raises(CodecError) as caught:
        decompress(CODEC_LZ4, view, limit)
    assert caught.value.__traceback__ is not None
    view.release()  # BufferError while the kept frame still exports it
