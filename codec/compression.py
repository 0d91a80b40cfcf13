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
grows up to the limit; an lz4 frame is held to what its block headers allow, at most what
LZ4 can make of the payload, which `declared_size` gives the inline decision).

`compress(..., incompressible=True)` is for sections the caller knows will not compress
(records whose values are ciphertext): lz4 then writes the records' repeated tail as matches
and the rest as literals, or stored blocks, a copy instead of a search that finds little, and
the batch keeps its codec; gzip, snappy and zstd compress as usual (zstd's raw blocks would
cost ~46 % more bytes on the broker: zstd's search finds the repeated envelope).
"""

from __future__ import annotations

import struct
import threading
import zlib

import cramjam

from . import lz4_frame
from .errors import BatchTooLarge, CorruptBatch, UnsupportedCompression

try:  # the LZ4 writer for sealed sections (codec/lz4_sealed.c), built at install
    from sluice.codec._record_check import (  # type: ignore[import-not-found, unused-ignore]
        ffi as _ls_ffi,
    )
    from sluice.codec._record_check import (  # type: ignore[import-not-found, unused-ignore]
        lib as _ls_lib,
    )

    LZ4_SEALED_NATIVE = hasattr(_ls_lib, "lz4_sealed_frame")
except ImportError:  # not built: stored blocks only (`lz4_stored_frame`)
    _ls_ffi = _ls_lib = None
    LZ4_SEALED_NATIVE = False

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
    "lz4_output_bound",
    "lz4_sealed_frame",
    "lz4_stored_frame",
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
    (no compression), snappy's declared lengths (raw, or the sum of xerial's blocks; snappy
    refuses a block that decodes to another length), or for lz4 a bound from the frame's
    block headers (`_lz4_output_bound`: at least the real size; `decompress` refuses a frame
    that yields more, so the bound binds). None for gzip and zstd, whose output is known
    only by producing it (zstd's optional size field is not binding on every stream the
    codec reads), for an lz4 payload that is not one frame of at most
    `_LZ4_DECLARED_MAX_BLOCKS` blocks and one block per `_LZ4_DECLARED_BLOCK_BYTES` of its
    length (the walk runs on the event loop), and for a payload
    whose framing does not parse."""
    if codec == CODEC_NONE:
        return len(payload)
    if codec == CODEC_LZ4:
        return _lz4_output_bound(payload, min(_LZ4_DECLARED_MAX_BLOCKS,
                                              1 + len(payload) // _LZ4_DECLARED_BLOCK_BYTES))
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
#: `declared_size` walks at most this many LZ4 blocks (it runs on the event loop, for the
#: inline decision): a 1 MiB batch in Kafka's 64 KiB blocks has 16, and a frame of many
#: tiny blocks is simply not given a size (its job goes to the pool).
_LZ4_DECLARED_MAX_BLOCKS = 256
#: ... and at most one block per this many bytes of the frame: the cap above is per batch, and
#: a Produce frame of 1 MiB holds ~900 batches of 256 empty stored blocks (4 bytes each), a
#: walk of 230 000 block headers on the loop (~85 ms). Kafka's blocks hold 64 KiB of records,
#: well over 1 KiB on the wire unless they compress over 64:1 (those go to the pool).
_LZ4_DECLARED_BLOCK_BYTES = 1024


def _lz4_output_bound(payload: Buffer, max_blocks: int | None = None) -> int | None:
    """What the LZ4 frame `payload` decompresses to at most, from its block headers (a stored
    block yields its own length, a compressed one at most the frame's block size and
    `_LZ4_MAX_RATIO` times its own length), or None when `payload` is not one frame this
    walk reads to its end (or has more than `max_blocks` blocks). Sizes the output buffer
    (without it the guess is 8 times the payload, and a batch of sealed records had ~2 MB
    zeroed per 250 KB decompressed), and `decompress` holds the frame to it, so it is also
    the binding size `declared_size` gives."""
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
    blocks = 0
    while pos + 4 <= end:
        size = int.from_bytes(view[pos:pos + 4], "little")
        pos += 4
        blocks += 1
        if max_blocks is not None and blocks > max_blocks + 1:  # + 1: the end mark
            return None
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
        if LZ4_SEALED_NATIVE and not isinstance(payload, bytes):
            # A view of a fetched frame is read where it lies: bytes(payload) copied every
            # batch before decompressing it. `src` keeps the buffer exported for the call,
            # and only for it: an export left in the frame of a raised error, in a reference
            # cycle, crashes CPython 3.11's collector (gh-77894; filters/native_call.py).
            with _ls_ffi.from_buffer(payload) as src:
                return lz4_frame.decompress(payload, limit, guess,
                                            int(_ls_ffi.cast("uintptr_t", src)))
        return lz4_frame.decompress(payload, limit, guess)
    except lz4_frame.Lz4Limit:
        raise _too_large(limit) from None


def lz4_output_bound(payload: Buffer, limit: int) -> int | None:
    """The bound `decompress` holds the lz4 `payload` to and sizes its buffer by (the frame's
    block headers, `_lz4_output_bound`), when it does: None when the frame declares a content
    size over `limit` (refused as too large), has no such bound, or one over `limit`."""
    declared = _frame_content_size(CODEC_LZ4, payload)
    if declared is not None and declared > limit:
        return None
    bound = _lz4_output_bound(payload)
    return bound if bound is not None and bound <= limit else None


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
                bound = _lz4_output_bound(payload)
                if bound is not None and bound <= limit:
                    # What its blocks can yield binds the frame (`declared_size` says it to
                    # the inline decision): a buffer of exactly that, and more is corrupt.
                    try:
                        if lz4_frame.AVAILABLE:  # gives up the GIL while it works
                            return _lz4_decompress(payload, bound, bound)
                        return _bounded_into(cramjam.lz4.decompress_into, payload, bound,
                                             bound)
                    except BatchTooLarge:
                        raise CorruptBatch("lz4 frame yields more than its block headers "
                                           "allow") from None
                guess = declared if declared is not None else bound
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


#: The frame descriptor of `lz4_stored_frame`, as Kafka's own Java LZ4 writer sets it: FLG
#: 0x60 (version 01, independent blocks, no checksums, no content size), BD 0x40 (blocks of
#: at most 64 KiB), and the header checksum 0x82 (second byte of xxHash32 of FLG and BD).
_LZ4_STORED_HEADER = _LZ4_MAGIC + b"\x60\x40\x82"
_LZ4_STORED_BLOCK = 64 * 1024
#: LZ4 frame block size's high bit: the block holds its bytes as they are.
_LZ4_UNCOMPRESSED = 0x80000000
_u32le = struct.Struct("<I")


def lz4_stored_frame(data: Buffer) -> bytes:
    """`data` as one LZ4 frame of stored blocks (each at most 64 KiB, the block size's high
    bit set), the descriptor Kafka's Java producer writes, and the end mark: every LZ4 frame
    reader (liblz4, Kafka's `KafkaLZ4BlockInputStream`) copies such blocks out as they are.
    Costs a copy; holds `data` plus 7 + 4 bytes per 64 KiB + 4."""
    view = memoryview(data).cast("B")
    size = len(view)
    blocks = -(-size // _LZ4_STORED_BLOCK)
    total = 7 + size + 4 * blocks + 4
    out = _frame_buffer(total)
    out[:7] = _LZ4_STORED_HEADER
    pos = 7
    for start in range(0, size, _LZ4_STORED_BLOCK):
        block = view[start:start + _LZ4_STORED_BLOCK]
        _u32le.pack_into(out, pos, len(block) | _LZ4_UNCOMPRESSED)
        pos += 4
        out[pos:pos + len(block)] = block
        pos += len(block)
    _u32le.pack_into(out, pos, 0)  # the end mark
    return bytes(memoryview(out)[:total])


_scratch = threading.local()
#: Largest frame buffer kept per thread.
_SCRATCH_KEPT = 16 << 20


def _frame_buffer(size: int) -> bytearray:
    """A buffer of at least `size` bytes, contents undefined, kept per thread for the frame
    writers, which copy out what they wrote: a fresh batch-sized bytearray per call is
    zeroed, and above glibc's mmap threshold it is a new mapping whose pages fault in each
    time (and it moves that threshold for the decompression buffers of later fetches)."""
    out: bytearray | None = getattr(_scratch, "frame", None)
    if out is None or len(out) < size:
        out = bytearray(size)
        if size <= _SCRATCH_KEPT:
            _scratch.frame = out
    return out


def lz4_sealed_frame(data: Buffer, tail: bytes) -> Buffer:
    """`data`, a records section whose values do not compress but whose records end with the
    same `tail` (the proxy's header group), as one LZ4 frame in which each record's `tail`
    is a match of the previous record's and the rest literals (codec/lz4_sealed.c): the
    compression LZ4 finds in such a section at the cost of a copy. Stored blocks
    (`lz4_stored_frame`) when the native module is not built or `tail` is too short."""
    if not LZ4_SEALED_NATIVE or len(tail) < 4:
        return lz4_stored_frame(data)
    with _ls_ffi.from_buffer(data) as src:  # given back before anything is raised
        cap = int(_ls_lib.lz4_sealed_bound(len(src)))
        out = _frame_buffer(cap)
        written = int(_ls_lib.lz4_sealed_frame(src, len(src), tail, len(tail),
                                               _ls_ffi.from_buffer(out), cap))
    if written < 0:
        raise RuntimeError("lz4_sealed_frame: output bound too small")
    return bytes(memoryview(out)[:written])


def compress(codec: int, data: Buffer, xerial: bool = True,
             incompressible: bool = False, tail: bytes = b"", fast: bool = False) -> Buffer:
    """Compress a records section with `codec` (snappy: xerial framing unless xerial=False).
    `incompressible`: the caller knows the section will not compress (ciphertext), so lz4
    writes stored blocks (`lz4_stored_frame`) or, with the `tail` its records end with,
    that tail as matches (`lz4_sealed_frame`); the other codecs compress as usual.
    `fast`: lz4 through liblz4 searches at a higher acceleration (`lz4_frame.FAST_LEVEL`)
    and writes no block checksums: the same frame format, as Kafka's producers write it, for
    sections rebuilt on the way to a consumer."""
    if codec == CODEC_NONE:
        return data
    if incompressible and codec == CODEC_LZ4:
        return lz4_sealed_frame(data, tail) if tail else lz4_stored_frame(data)
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
            return lz4_frame.compress(data, fast)
        compressor = cramjam.lz4.Compressor(level=0, content_checksum=False,
                                            block_linked=False)
        compressor.compress(data if isinstance(data, bytes) else bytes(data))
        return bytes(compressor.finish())
    if codec == CODEC_ZSTD:
        return bytes(cramjam.zstd.compress(data, level=3))
    raise UnsupportedCompression(f"compression codec id {codec}")
