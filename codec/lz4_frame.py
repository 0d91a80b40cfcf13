"""LZ4 frames through the system's liblz4 (ctypes), which gives up the GIL while it works.

cramjam's lz4 holds the GIL for the whole call (measured: a Python thread makes no progress
while another compresses a 1 MB records section), so when two filter threads mask a Fetch
response's partitions side by side (`filters/parallel.py`) their decompression and
recompression ran one at a time. A ctypes call releases the GIL, so the same work here runs
on both cores. Used by `codec/compression.py` for lz4 when ``liblz4.so.1`` loads (`AVAILABLE`);
without it compression keeps to cramjam, with the same frames and the same verdicts
(tests/codec/test_lz4_frame.py holds the two to that).

Compression makes the frame `compression.compress` made with cramjam: LZ4's fast mode (level 0,
what librdkafka producers use), independent 64 KiB blocks with a checksum each, no content
checksum or size. `compress(fast=True)` makes the same kind of frame with a faster, coarser
match search and without block checksums, as Kafka's producers write it (the fetch path's
recompression of a filter's output).
Decompression writes into a buffer the caller sizes and grows it only up to the caller's limit,
so a small frame claiming gigabytes costs no more than the limit.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import threading
from typing import Any, Final

Buffer = bytes | bytearray | memoryview

__all__ = ["AVAILABLE", "Lz4Error", "Lz4Limit", "compress", "decompress", "decompress_into"]

_LZ4F_VERSION: Final = 100
_BLOCK_INDEPENDENT: Final = 1


class Lz4Error(ValueError):
    """A frame liblz4 refuses (the message is liblz4's own) or that ends early."""


class Lz4Limit(Lz4Error):
    """The frame holds more than the caller's limit."""


class _FrameInfo(ctypes.Structure):
    _fields_ = [
        ("blockSizeID", ctypes.c_int),
        ("blockMode", ctypes.c_int),
        ("contentChecksumFlag", ctypes.c_int),
        ("frameType", ctypes.c_int),
        ("contentSize", ctypes.c_ulonglong),
        ("dictID", ctypes.c_uint),
        ("blockChecksumFlag", ctypes.c_int),
    ]


class _Preferences(ctypes.Structure):
    _fields_ = [
        ("frameInfo", _FrameInfo),
        ("compressionLevel", ctypes.c_int),
        ("autoFlush", ctypes.c_uint),
        ("favorDecSpeed", ctypes.c_uint),
        ("reserved", ctypes.c_uint * 3),
    ]


def _load() -> ctypes.CDLL | None:
    for name in ("liblz4.so.1", ctypes.util.find_library("lz4")):
        if not name:
            continue
        try:
            lib = ctypes.CDLL(name)  # CDLL, not PyDLL: every call releases the GIL
        except OSError:
            continue
        try:
            if lib.LZ4F_getVersion() < _LZ4F_VERSION or not lib.LZ4F_resetDecompressionContext:
                continue
        except AttributeError:
            continue
        return lib
    return None


_lib = _load()
AVAILABLE: Final = _lib is not None

_size = ctypes.c_size_t
_vp = ctypes.c_void_p
if _lib is not None:
    _lib.LZ4F_compressFrameBound.argtypes = [_size, ctypes.POINTER(_Preferences)]
    _lib.LZ4F_compressFrameBound.restype = _size
    _lib.LZ4F_compressFrame.argtypes = [_vp, _size, _vp, _size, ctypes.POINTER(_Preferences)]
    _lib.LZ4F_compressFrame.restype = _size
    _lib.LZ4F_isError.argtypes = [_size]
    _lib.LZ4F_isError.restype = ctypes.c_uint
    _lib.LZ4F_getErrorName.argtypes = [_size]
    _lib.LZ4F_getErrorName.restype = ctypes.c_char_p
    _lib.LZ4F_createDecompressionContext.argtypes = [ctypes.POINTER(_vp), ctypes.c_uint]
    _lib.LZ4F_createDecompressionContext.restype = _size
    _lib.LZ4F_freeDecompressionContext.argtypes = [_vp]
    _lib.LZ4F_freeDecompressionContext.restype = _size
    _lib.LZ4F_decompress.argtypes = [_vp, _vp, ctypes.POINTER(_size), _vp,
                                     ctypes.POINTER(_size), _vp]
    _lib.LZ4F_decompress.restype = _size
    _lib.LZ4F_resetDecompressionContext.argtypes = [_vp]
    _lib.LZ4F_resetDecompressionContext.restype = None

#: LZ4's acceleration for `compress(fast=True)`: liblz4's frame API takes a negative level
#: -L as acceleration L + 1. The frame format is the same as at level 0 (every LZ4 reader
#: reads it); only the match search skips more. On bench_proxy's masked JSON records: ~15 %
#: less time than level 0, and no larger (docs/PERFORMANCE.md, "pii-mask on fetch").
FAST_LEVEL: Final = -2


def _preferences(level: int, block_checksums: bool = True) -> _Preferences:
    prefs = _Preferences()
    prefs.frameInfo.blockMode = _BLOCK_INDEPENDENT
    prefs.frameInfo.blockChecksumFlag = int(block_checksums)
    prefs.compressionLevel = level
    return prefs


_PREFS = _preferences(0)  # block checksums, as cramjam's frames have always had
#: The fetch path's frames carry no block checksums, as librdkafka's and the Java client's
#: producers write them (every LZ4 reader takes both; the batch's CRC32C covers the frame):
#: hashing the compressed blocks was ~11 % of the recompression of bench_proxy's records.
_FAST_PREFS = _preferences(FAST_LEVEL, block_checksums=False)


#: liblz4 returns its errors as sizes just under 2**64 (`LZ4F_isError`): a result below this
#: is a size or hint without asking, a foreign call of ~1 µs saved per call.
_SURELY_NOT_ERROR: Final = 1 << 63


def _check(code: int) -> int:
    assert _lib is not None
    if code >= _SURELY_NOT_ERROR and _lib.LZ4F_isError(code):
        raise Lz4Error(_lib.LZ4F_getErrorName(code).decode("ascii", "replace"))
    return code


def _address(data: bytes) -> int:
    # the pointer a c_char_p holds, read as a c_void_p (ctypes.cast costs twice as much)
    return _vp.from_buffer(ctypes.c_char_p(data)).value or 0


def compress(data: Buffer, fast: bool = False) -> bytes:
    """One LZ4 frame of `data` (fast mode, independent blocks with checksums); `fast`: at
    acceleration `1 - FAST_LEVEL` rather than 1 (a coarser search), blocks without
    checksums."""
    assert _lib is not None
    prefs = ctypes.byref(_FAST_PREFS if fast else _PREFS)
    size = memoryview(data).nbytes
    bound = _lib.LZ4F_compressFrameBound(size, prefs)
    out = _scratch(bound)
    if isinstance(data, bytes):
        written = _compress_at(out, bound, _address(data), size, prefs)
    else:
        # A writable buffer (the opened section an encrypt filter lends, a view of its
        # output buffer) is read where it lies: bytes(data) was a copy of the whole section.
        view = memoryview(data)
        if view.readonly or not view.c_contiguous or not size:
            copy = bytes(view)  # held until the call returns
            written = _compress_at(out, bound, _address(copy), size, prefs)
        else:
            # one c_char over its first byte gives the address (see `decompress`)
            first = ctypes.c_char.from_buffer(view)
            try:
                written = _compress_at(out, bound, ctypes.addressof(first), size, prefs)
            finally:
                del first  # releases the export of `data`'s buffer
    return ctypes.string_at(out, written)  # the one copy: out of the scratch buffer


def _compress_at(
    out: ctypes.Array[ctypes.c_char], bound: int, src: int, size: int, prefs: Any
) -> int:
    assert _lib is not None
    return _check(_lib.LZ4F_compressFrame(out, bound, src, size, prefs))


_local = threading.local()
#: Largest compression buffer a thread keeps between calls. A client can make a section as
#: large as `limits.max_batch_bytes` (32 MiB by default, a few hundred KB of lz4 on the wire);
#: kept, every filter thread would hold the largest it ever compressed for good.
_SCRATCH_KEPT: Final = 4 << 20


def _scratch(size: int) -> ctypes.Array[ctypes.c_char]:
    """This thread's compression buffer, at least `size` bytes: reused, so that a batch's
    compression does not zero a fresh buffer of its size first. A buffer over `_SCRATCH_KEPT`
    serves its one call and is freed with it."""
    buf: ctypes.Array[ctypes.c_char] | None = getattr(_local, "buf", None)
    if buf is None or len(buf) < size:
        buf = ctypes.create_string_buffer(size)
        if size <= _SCRATCH_KEPT:
            _local.buf = buf
    return buf


def _dctx() -> ctypes.c_void_p:
    """This thread's decompression context, made once: a new one per call also allocated
    liblz4's block buffers (and freed them) for every fetched batch."""
    ctx: ctypes.c_void_p | None = getattr(_local, "dctx", None)
    if ctx is None:
        assert _lib is not None
        ctx = _vp()
        _check(_lib.LZ4F_createDecompressionContext(ctypes.byref(ctx), _LZ4F_VERSION))
        _local.dctx = ctx
        # freed with the thread's other locals
        _local.dctx_owner = _DctxOwner(ctx)
    return ctx


class _DctxOwner:
    """Frees a thread's decompression context when the thread's locals go."""

    def __init__(self, ctx: ctypes.c_void_p) -> None:
        self.ctx = ctx

    def __del__(self) -> None:
        if _lib is not None:
            _lib.LZ4F_freeDecompressionContext(self.ctx)


def decompress(payload: Buffer, limit: int, guess: int, address: int | None = None
               ) -> memoryview:
    """The content of the LZ4 frame(s) in `payload`, written into a buffer of `guess` bytes
    that grows up to `limit` (`Lz4Error` beyond it, or on a frame liblz4 refuses or that ends
    early). `address`: where `payload`'s bytes lie, which the caller keeps valid for the
    call (a view read in place; without it a `payload` that is not bytes is copied)."""
    assert _lib is not None
    if address is None and not isinstance(payload, bytes):
        payload = bytes(payload)
    ctx = _dctx()
    done = False
    try:
        src = _address(payload) if address is None else address  # type: ignore[arg-type]
        end = len(payload)
        # One byte past the limit: a frame whose content ends exactly at the limit still
        # finds room to be read to its end mark, and output reaching that byte is too much.
        cap = limit + 1
        out = bytearray(min(cap, max(guess, 64)))
        pos_in = pos_out = 0
        dst_size, src_size = _size(), _size()
        hint = 1
        # Until the input is used up, and then while output may wait in the context (the
        # last call filled the buffer mid-frame).
        while pos_in < end or (hint != 0 and pos_out == len(out)):
            if pos_out == len(out):
                if len(out) >= cap:
                    raise Lz4Limit(f"decompresses to more than {limit} bytes")
                out.extend(bytes(min(cap, 2 * len(out)) - len(out)))
            # The address of out[pos_out] through one c_char over it: `(c_char * n)` made
            # a new ctypes array type for every new length n (7-45 µs each; ctypes holds it
            # weakly, and a type lives until the cyclic garbage collector frees it), once
            # per fetched lz4 batch.
            first = ctypes.c_char.from_buffer(out, pos_out)
            dst_size.value = len(out) - pos_out
            src_size.value = end - pos_in
            try:
                hint = _check(_lib.LZ4F_decompress(ctx, ctypes.addressof(first),
                                                   ctypes.byref(dst_size), src + pos_in,
                                                   ctypes.byref(src_size), None))
            finally:
                del first  # the bytearray may not grow while ctypes holds it
            if dst_size.value == 0 and src_size.value == 0 and pos_out < len(out):
                raise Lz4Error("no progress")
            pos_in += src_size.value
            pos_out += dst_size.value
        if pos_out > limit:
            raise Lz4Limit(f"decompresses to more than {limit} bytes")
        if hint != 0:
            raise Lz4Error("frame ends early")
        done = True
        return memoryview(out)[:pos_out]
    finally:
        if not done:  # mid-frame or after an error: the next frame starts afresh
            _lib.LZ4F_resetDecompressionContext(ctx)


def decompress_into(src: int, size: int, dst: int, cap: int) -> int:
    """The content of the LZ4 frame(s) of `size` bytes at address `src`, written to the `cap`
    bytes at address `dst` (both kept valid by the caller for the call): how many bytes it
    wrote. `Lz4Limit` when the content does not fit in `cap - 1` bytes (a caller sizes `cap`
    one byte past what it allows, as `decompress` does, so that content ending exactly at the
    limit is read to its end mark), `Lz4Error` on a frame liblz4 refuses or that ends early.
    For a caller that has the output's home already (guest memory: the fetch path's
    records section goes there without a buffer of its own in between)."""
    assert _lib is not None
    ctx = _dctx()
    done = False
    try:
        pos_in = pos_out = 0
        dst_size, src_size = _size(), _size()
        hint = 1
        # `decompress`'s loop with a buffer that cannot grow: the same verdicts.
        while pos_in < size or (hint != 0 and pos_out == cap):
            if pos_out == cap:
                raise Lz4Limit(f"decompresses to more than {cap - 1} bytes")
            dst_size.value = cap - pos_out
            src_size.value = size - pos_in
            hint = _check(_lib.LZ4F_decompress(ctx, dst + pos_out, ctypes.byref(dst_size),
                                               src + pos_in, ctypes.byref(src_size), None))
            if dst_size.value == 0 and src_size.value == 0:
                raise Lz4Error("no progress")
            pos_in += src_size.value
            pos_out += dst_size.value
        if pos_out >= cap:
            raise Lz4Limit(f"decompresses to more than {cap - 1} bytes")
        if hint != 0:
            raise Lz4Error("frame ends early")
        done = True
        return pos_out
    finally:
        if not done:  # mid-frame or after an error: the next frame starts afresh
            _lib.LZ4F_resetDecompressionContext(ctx)
