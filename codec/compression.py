"""Record-batch compression codecs (attributes bits 0-2): none, gzip, snappy, lz4, zstd.

Through `cramjam` (Rust), except lz4 where the system's liblz4 loads (`lz4_frame`, ctypes):
cramjam holds the GIL for the whole call (a Python thread makes no progress while another
compresses), so filter threads working side by side would take turns; a ctypes call gives the
GIL up, and the frames are the same bytes. Choices that follow what Kafka clients write:
- snappy: Java producers use xerial's framed stream ("\\x82SNAPPY\\x00" header, then
  length-prefixed raw blocks of 32 KiB input); librdkafka writes raw snappy. Both are read;
  `compress` writes whichever the caller asks for.
- lz4: the LZ4 frame format with independent blocks, as Kafka's Java LZ4 stream requires.
- gzip: level 6, zstd: level 3 (the defaults of zlib and of the zstd library used by Kafka).
Any failure to decompress is a `CorruptBatch`. Output beyond the caller's limit (default
`MAX_DECOMPRESSED_SIZE`; the proxy passes `limits.max_batch_bytes`) is `BatchTooLarge`: a few
KiB of zstd can claim gigabytes, so decompression stops at the limit instead of producing it
all (gzip through zlib's `max_length`, snappy from the length its framing declares, lz4 and
zstd from the content size their frame header declares when it does, else into a buffer that
grows up to the limit; lz4's first buffer is sized from its block headers, held to what
LZ4 can make of the payload).
"""

from __future__ import annotations

import struct
import zlib

import cramjam

from . import lz4_frame
from .errors import BatchTooLarge, CorruptBatch, UnsupportedCompression

__all__ = [
    "CODEC_GZIP",
    "CODEC_LZ4",
    "CODEC_NAMES",
    "CODEC_NONE",
    "CODEC_SNAPPY",
    "CODEC_ZSTD",
    "MAX_DECOMPRESSED_SIZE",
    "compress",
    "declared_size",
    "decompress",
    "is_xerial",
]

CODEC_NONE = 0
CODEC_GZIP = 1
CODEC_SNAPPY = 2
CODEC_LZ4 = 3
CODEC_ZSTD = 4
CODEC_NAMES = ("none", "gzip", "snappy", "lz4", "zstd")

MAX_DECOMPRESSED_SIZE = 256 * 1024 * 1024
"""Largest records section a batch may decompress to (Kafka batches are usually < 1 MiB)."""

_FIRST_GUESS_RATIO = 8
_MIN_FIRST_GUESS = 64 * 1024
#: LZ4 writes at most 255 bytes per input byte (a length extension byte adds up to 255), so
#: a first guess from what a frame claims (its content size, its block headers) is held to
#: this many times the payload: a few dozen bytes must not make the proxy zero the limit.
_LZ4_MAX_RATIO = 255

XERIAL_MAGIC = b"\x82SNAPPY\x00"
_XERIAL_HEADER = XERIAL_MAGIC + struct.pack(">ii", 1, 1)
_XERIAL_BLOCK = 32 * 1024
_i32 = struct.Struct(">i")

Buffer = bytes | bytearray | memoryview


def is_xerial(payload: Buffer) -> bool:
    """Whether a snappy payload uses xerial's framed stream (Java producers)."""
    return bytes(payload[:8]) == XERIAL_MAGIC


def _too_large(limit: int) -> BatchTooLarge:
    return BatchTooLarge(
        f"records decompress to more than {limit} bytes (limits.max_batch_bytes)")


def _snappy_raw(block: Buffer, limit: int) -> bytes:
    if cramjam.snappy.decompress_raw_len(block) > limit:
        raise _too_large(limit)
    return bytes(cramjam.snappy.decompress_raw(block))


def _xerial_decompress(payload: Buffer, limit: int) -> bytes:
    view = memoryview(payload)
    pos = 16
    end = len(view)
    parts = []
    total = 0
    while pos < end:
        if pos + 4 > end:
            raise CorruptBatch("truncated xerial snappy block length")
        (size,) = _i32.unpack_from(view, pos)
        pos += 4
        if size < 0 or pos + size > end:
            raise CorruptBatch("xerial snappy block runs past the payload")
        block = view[pos : pos + size]
        total += cramjam.snappy.decompress_raw_len(block)
        if total > limit:
            raise _too_large(limit)
        parts.append(bytes(cramjam.snappy.decompress_raw(block)))
        pos += size
    return b"".join(parts)


def _gzip_decompress(payload: Buffer, limit: int) -> bytes:
    parts = []
    total = 0
    data = bytes(payload)
    while True:
        # wbits 47: a gzip (or zlib) header, detected automatically.
        inflater = zlib.decompressobj(47)
        chunk = inflater.decompress(data, limit - total + 1)
        total += len(chunk)
        if total > limit:
            raise _too_large(limit)
        if not inflater.eof:
            raise CorruptBatch("truncated gzip stream")
        parts.append(chunk)
        data = inflater.unused_data
        if not data:
            return b"".join(parts)


def _bounded_into(decompress_into: object, payload: Buffer, limit: int,
                  guess: int | None = None) -> memoryview:
    """Decompress into a buffer that grows up to `limit` (cramjam cannot cap its own output),
    starting at `guess` when the caller knows a likely size (a buffer too small only costs
    another attempt)."""
    if guess is None:
        guess = max(_MIN_FIRST_GUESS, len(payload) * _FIRST_GUESS_RATIO)
    size = min(limit, max(guess, 1))
    data = payload if isinstance(payload, bytes) else bytes(payload)
    while True:
        out = bytearray(size)
        try:
            written = decompress_into(data, out)  # type: ignore[operator]
        except Exception as exc:
            if "failed to write whole buffer" not in str(exc):
                raise
            if size >= limit:
                raise _too_large(limit) from None
            size = min(limit, size * _FIRST_GUESS_RATIO)
            continue
        return memoryview(out)[:written]


def _xerial_compress(data: Buffer) -> bytes:
    view = memoryview(data)
    parts = [_XERIAL_HEADER]
    for start in range(0, len(view), _XERIAL_BLOCK):
        block = bytes(cramjam.snappy.compress_raw(view[start : start + _XERIAL_BLOCK]))
        parts.append(_i32.pack(len(block)))
        parts.append(block)
    return b"".join(parts)


def declared_size(codec: int, payload: Buffer) -> int | None:
    """The decompressed size of `payload` as its framing declares it, read without
    decompressing, when the decompressor holds the stream to it: the payload's own length
    (no compression) or snappy's declared lengths (raw, or the sum of xerial's blocks; snappy
    refuses a block that decodes to another length). None for gzip, lz4 and zstd, whose
    output is known only by producing it (their optional size fields are not binding on
    every stream the codec reads), and for a payload whose framing does not parse."""
    if codec == CODEC_NONE:
        return len(payload)
    if codec != CODEC_SNAPPY:
        return None
    try:
        if not is_xerial(payload):
            return int(cramjam.snappy.decompress_raw_len(payload))
        view = memoryview(payload)
        pos, end, total = 16, len(view), 0
        while pos < end:
            if pos + 4 > end:
                return None
            (size,) = _i32.unpack_from(view, pos)
            pos += 4
            if size < 0 or pos + size > end:
                return None
            total += int(cramjam.snappy.decompress_raw_len(view[pos : pos + size]))
            pos += size
        return total
    except Exception:  # cramjam's errors for a preamble that does not parse
        return None


_ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
_LZ4_MAGIC = b"\x04\x22\x4d\x18"
_ZSTD_FCS_BYTES = (0, 2, 4, 8)
_DICT_ID_BYTES = (0, 1, 2, 4)


def _frame_content_size(codec: int, payload: Buffer) -> int | None:
    """The content size the first zstd or LZ4 frame of `payload` declares in its header, if it
    declares one (zstd's Frame_Content_Size; LZ4's optional Content Size). Either decoder
    holds the frame to it, so a declaration over the caller's limit is refused before
    anything is decompressed: too large if true, corrupt if not."""
    head = bytes(payload[:18])
    if codec == CODEC_ZSTD and head[:4] == _ZSTD_MAGIC and len(head) >= 5:
        descriptor = head[4]
        fcs_bytes = _ZSTD_FCS_BYTES[descriptor >> 6]
        single_segment = bool(descriptor & 0x20)
        if not fcs_bytes and single_segment:
            fcs_bytes = 1
        if not fcs_bytes:
            return None
        pos = 5 + (0 if single_segment else 1) + _DICT_ID_BYTES[descriptor & 0x03]
        if pos + fcs_bytes > len(head):
            return None
        size = int.from_bytes(head[pos : pos + fcs_bytes], "little")
        return size + 256 if fcs_bytes == 2 else size
    if codec == CODEC_LZ4 and head[:4] == _LZ4_MAGIC and len(head) >= 14 and head[4] & 0x08:
        return int.from_bytes(head[6:14], "little")
    return None


#: LZ4 frame descriptor's block maximum size codes (BD bits 4-6).
_LZ4_BLOCK_MAX = {4: 64 << 10, 5: 256 << 10, 6: 1 << 20, 7: 4 << 20}


def _lz4_output_bound(payload: Buffer) -> int | None:
    """What the LZ4 frame `payload` decompresses to at most, from its block headers (a stored
    block yields its own length, a compressed one at most the frame's block size and
    `_LZ4_MAX_RATIO` times its own length), or None
    when `payload` is not one frame this walk reads to its end. Only a first guess for the
    output buffer: without it the guess is 8 times the payload, and a batch of sealed
    (incompressible) records had ~2 MB zeroed per 250 KB decompressed."""
    view = memoryview(payload)
    end = len(view)
    if end < 11 or bytes(view[:4]) != _LZ4_MAGIC:
        return None
    flags, descriptor = view[4], view[5]
    block_max = _LZ4_BLOCK_MAX.get((descriptor >> 4) & 7)
    if block_max is None or flags >> 6 != 1:
        return None
    pos = 7 + (8 if flags & 0x08 else 0) + (4 if flags & 0x01 else 0)
    checksum = 4 if flags & 0x10 else 0
    bound = 0
    while pos + 4 <= end:
        size = int.from_bytes(view[pos:pos + 4], "little")
        pos += 4
        if size == 0:  # end mark, then the optional content checksum
            return bound if pos + (4 if flags & 0x04 else 0) == end else None
        stored = size & 0x7FFFFFFF
        # A compressed block yields at most the block size, and at most ~255 bytes per byte
        # it holds (a match length grows by 255 per byte): without the second cap a 1 KB frame
        # of tiny blocks would claim hundreds of MiB and have the whole limit zeroed up front.
        bound += stored if size & 0x80000000 else min(block_max, stored * _LZ4_MAX_RATIO)
        pos += stored + checksum
    return None


def _lz4_decompress(payload: Buffer, limit: int, guess: int | None) -> memoryview:
    """liblz4 through `lz4_frame` (it gives up the GIL while it works), sized as
    `_bounded_into` sizes cramjam's output."""
    if guess is None:
        guess = max(_MIN_FIRST_GUESS, len(payload) * _FIRST_GUESS_RATIO)
    try:
        return lz4_frame.decompress(payload if isinstance(payload, bytes) else bytes(payload),
                                    limit, guess)
    except lz4_frame.Lz4Limit:
        raise _too_large(limit) from None


def decompress(codec: int, payload: Buffer, limit: int | None = None) -> Buffer:
    """Decompress a batch's records section (returns `payload` itself for codec none).

    `limit` (default MAX_DECOMPRESSED_SIZE) bounds the output size: more is `BatchTooLarge`,
    raised before the output beyond the limit is produced.
    """
    if codec == CODEC_NONE:
        return payload
    if limit is None:
        limit = MAX_DECOMPRESSED_SIZE
    try:
        if codec == CODEC_GZIP:
            return _gzip_decompress(payload, limit)
        if codec == CODEC_SNAPPY:
            if is_xerial(payload):
                return _xerial_decompress(payload, limit)
            return _snappy_raw(payload, limit)
        if codec in (CODEC_LZ4, CODEC_ZSTD):
            declared = _frame_content_size(codec, payload)
            if declared is not None and declared > limit:
                raise _too_large(limit)
            if codec == CODEC_LZ4:
                guess = declared if declared is not None else _lz4_output_bound(payload)
                if guess is not None:  # a claim, not yet checked: no more than LZ4 can make
                    guess = min(guess, _MIN_FIRST_GUESS + len(payload) * _LZ4_MAX_RATIO)
                if lz4_frame.AVAILABLE:
                    return _lz4_decompress(payload, limit, guess)
                return _bounded_into(cramjam.lz4.decompress_into, payload, limit, guess)
            return _bounded_into(cramjam.zstd.decompress_into, payload, limit)
    except CorruptBatch:
        raise
    except Exception as exc:  # cramjam raises DecompressionError, ValueError, ...
        raise CorruptBatch(f"{CODEC_NAMES[codec]} decompression failed: {exc}") from exc
    raise UnsupportedCompression(f"compression codec id {codec}")


def compress(codec: int, data: Buffer, xerial: bool = True) -> Buffer:
    """Compress a records section with `codec` (snappy: xerial framing unless xerial=False)."""
    if codec == CODEC_NONE:
        return data
    if codec == CODEC_GZIP:
        return bytes(cramjam.gzip.compress(data, level=6))
    if codec == CODEC_SNAPPY:
        if xerial:
            return _xerial_compress(data)
        return bytes(cramjam.snappy.compress_raw(data))
    if codec == CODEC_LZ4:
        # Level 0 is LZ4's fast mode, which librdkafka producers use by default; cramjam's
        # default (4) is the high-compression mode, ~6x slower for ~25% smaller batches.
        if lz4_frame.AVAILABLE:  # the same frame, made without holding the GIL
            return lz4_frame.compress(data if isinstance(data, bytes) else bytes(data))
        compressor = cramjam.lz4.Compressor(level=0, content_checksum=False,
                                            block_linked=False)
        compressor.compress(data if isinstance(data, bytes) else bytes(data))
        return bytes(compressor.finish())
    if codec == CODEC_ZSTD:
        return bytes(cramjam.zstd.compress(data, level=3))
    raise UnsupportedCompression(f"compression codec id {codec}")
