"""Kafka framing: a 4-byte big-endian size prefix followed by the frame body.

`FrameBuffer` turns arbitrary chunks read from a socket into whole frame bodies. It is on the
proxy's hot path for every request and response, so it avoids copies: frames that lie wholly
inside one fed chunk come back as zero-copy `memoryview` slices of that chunk; only the
incomplete tail of a chunk is buffered (and copied) until the rest arrives.
"""

from __future__ import annotations

import struct
from collections.abc import Callable

from .errors import FrameTooLarge

_whole_frames: Callable[[bytes, int], list[memoryview | bytes] | None] | None
try:  # codec/passthrough.c, built at install: a read of whole frames in one call
    from ._passthrough import whole_frames as _whole_frames  # type: ignore[import-not-found, no-redef, unused-ignore]
except ImportError:
    _whole_frames = None

__all__ = ["DEFAULT_MAX_FRAME_SIZE", "FrameBuffer", "FrameTooLarge", "frame"]

DEFAULT_MAX_FRAME_SIZE = 100 * 1024 * 1024

_SIZE = struct.Struct(">i")
_unpack_size = _SIZE.unpack_from
_pack_size = _SIZE.pack


def frame(body: bytes | bytearray | memoryview) -> bytes:
    """Return `body` with its 4-byte size prefix."""
    return b"".join((_pack_size(len(body)), body))


class FrameBuffer:
    """Reassembles length-prefixed frames from a byte stream.

    `feed` returns the bodies (without the size prefix) of all frames completed by the chunk.
    A declared size above `max_frame_size` (or below zero) raises `FrameTooLarge` as soon as
    the 4 prefix bytes are seen, before any memory for the body is reserved; the buffer is then
    in an undefined state and the connection should be closed.
    """

    __slots__ = ("_buf", "_need", "max_frame_size", "missing")

    def __init__(self, max_frame_size: int = DEFAULT_MAX_FRAME_SIZE) -> None:
        if max_frame_size < 0:
            raise ValueError("max_frame_size must be >= 0")
        self.max_frame_size = max_frame_size
        self._buf = bytearray()
        # Total bytes (prefix + body) of the frame being assembled in _buf, or 0 if the
        # prefix itself is not complete yet.
        self._need = 0
        #: Bytes still to come before the frame in assembly is whole (0 when no frame's size
        #: prefix has been read yet: nothing is known to be coming). An attribute, set by
        #: `feed`, not a property: the proxy reads it after every read of a socket.
        self.missing = 0

    @property
    def pending(self) -> int:
        """Bytes buffered that do not yet form a whole frame."""
        return len(self._buf)

    def _check(self, size: int) -> None:
        if size < 0 or size > self.max_frame_size:
            raise FrameTooLarge(f"declared frame size {size} outside 0..{self.max_frame_size}")

    def feed(self, data: bytes | bytearray | memoryview) -> list[memoryview | bytes]:
        """Add a chunk; return the bodies of every frame it completes, in order."""
        if type(data) is not bytes:
            # Returned views must not alias a buffer the caller may reuse.
            data = bytes(data)
        buf = self._buf
        if not buf and _whole_frames is not None:
            # The common read (nothing in assembly, whole frames only) in one C call; None
            # for anything else, which the loop below reads (and refuses).
            whole = _whole_frames(data, self.max_frame_size)
            if whole is not None:
                return whole
        out: list[memoryview | bytes] = []
        pos = 0
        n = len(data)
        if buf:
            # Finish the frame started by earlier chunks.
            if not self._need:
                take = 4 - len(buf)
                buf += data[:take]
                pos = min(take, n)
                if len(buf) < 4:
                    return out  # `missing` is still 0: no size known
                size = _unpack_size(buf, 0)[0]
                self._check(size)
                self._need = size + 4
            missing = self._need - len(buf)
            if n - pos < missing:
                buf += data[pos:]
                self.missing = missing - (n - pos)
                return out
            buf += data[pos : pos + missing]
            pos += missing
            # Hand the filled bytearray itself to the caller (no copy) and start a fresh one.
            out.append(memoryview(buf)[4:])
            self._buf = buf = bytearray()
            self._need = 0
            self.missing = 0
        view = memoryview(data)
        while n - pos >= 4:
            size = _unpack_size(data, pos)[0]
            if size < 0 or size > self.max_frame_size:
                self._check(size)
            end = pos + 4 + size
            if end > n:
                self._need = size + 4
                self.missing = end - n
                break
            out.append(view[pos + 4 : end])
            pos = end
        if pos < n:
            buf += data[pos:]
        return out
