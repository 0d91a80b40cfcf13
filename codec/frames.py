"""Kafka framing: a 4-byte big-endian size prefix followed by the frame body.

`FrameBuffer` turns arbitrary chunks read from a socket into whole frame bodies. It is on the
proxy's hot path for every request and response, so it avoids copies: frames that lie wholly
inside one fed chunk come back as zero-copy `memoryview` slices of that chunk. A frame that
spans chunks (a large Fetch response or Produce request arrives in many reads) is kept as a
list of its pieces, views of the chunks themselves, and joined once when its last byte arrives:
each byte is copied once, into a buffer of exactly the frame's size, handed out as a read-only
view (slicing a view copies nothing). Growing one buffer chunk by chunk instead copied the
frame again at each reallocation (with the proxy's malloc settings, ops/allocator.py, the heap
cannot remap a large block in place): about as much CPU per byte again as the copy itself
(issue 29).
"""

from __future__ import annotations

import struct

from .errors import FrameTooLarge

__all__ = ["DEFAULT_MAX_FRAME_SIZE", "FrameBuffer", "FrameTooLarge", "frame"]

DEFAULT_MAX_FRAME_SIZE = 100 * 1024 * 1024

_SIZE = struct.Struct(">i")
_unpack_size = _SIZE.unpack_from
_pack_size = _SIZE.pack

#: A piece of a frame at least this long is kept as it came (the chunk, or a view of it);
#: shorter ones are copied into a buffer of their own, gathered up to `_COALESCE_MAX` bytes.
#: A peer that sends a frame a few bytes per read would otherwise make the proxy hold one
#: object (~40-200 bytes) per few bytes of frame: this bounds what a frame in assembly holds
#: to a few percent over its own size, plus at most the rest of the one chunk its first piece
#: came from.
_KEEP_MIN = 1024
_COALESCE_MAX = 64 * 1024


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

    __slots__ = ("_have", "_head", "_need", "_parts", "max_frame_size")

    def __init__(self, max_frame_size: int = DEFAULT_MAX_FRAME_SIZE) -> None:
        if max_frame_size < 0:
            raise ValueError("max_frame_size must be >= 0")
        self.max_frame_size = max_frame_size
        # Bytes of a size prefix split across chunks (fewer than 4).
        self._head = b""
        # Body size of the frame being assembled, or -1 while no frame is started.
        self._need = -1
        # The pieces of that frame's body received so far, and their total length.
        self._parts: list[bytes | memoryview | bytearray] = []
        self._have = 0

    @property
    def pending(self) -> int:
        """Bytes buffered that do not yet form a whole frame."""
        return len(self._head) + self._have + (4 if self._need >= 0 else 0)

    def _check(self, size: int) -> None:
        if size < 0 or size > self.max_frame_size:
            raise FrameTooLarge(f"declared frame size {size} outside 0..{self.max_frame_size}")

    def _keep(self, piece: bytes | memoryview) -> None:
        parts = self._parts
        if len(piece) >= _KEEP_MIN:
            parts.append(piece)
        elif parts and type(parts[-1]) is bytearray and len(parts[-1]) < _COALESCE_MAX:
            parts[-1] += piece  # type: ignore[operator]
        else:
            parts.append(bytearray(piece))
        self._have += len(piece)

    def feed(self, data: bytes | bytearray | memoryview) -> list[memoryview | bytes]:
        """Add a chunk; return the bodies of every frame it completes, in order."""
        if type(data) is not bytes:
            # Returned views (and kept pieces) must not alias a buffer the caller may reuse.
            data = bytes(data)
        out: list[memoryview | bytes] = []
        pos = 0
        n = len(data)
        view = memoryview(data)
        if self._head:
            # Finish a size prefix started by earlier chunks.
            take = 4 - len(self._head)
            head = self._head + data[:take]
            if len(head) < 4:
                self._head = head
                return out
            self._head = b""
            pos = take
            size = _unpack_size(head, 0)[0]
            self._check(size)
            self._need = size
        if self._need >= 0:
            # Finish the frame started by earlier chunks.
            missing = self._need - self._have
            if n - pos < missing:
                if pos == 0 and n >= _KEEP_MIN:
                    self._parts.append(data)  # the common case, inline: a whole chunk
                    self._have += n
                else:
                    self._keep(view[pos:])
                return out
            parts = self._parts
            if parts:
                parts.append(view[pos : pos + missing])
                # A view, like every other frame: paths slice frames (`frame[header_size:]`),
                # and a slice of bytes would copy the whole frame again.
                out.append(memoryview(b"".join(parts)))
                self._parts = []
            else:
                # Only its prefix came before: the body is a view of this chunk.
                out.append(view[pos : pos + missing])
            pos += missing
            self._need = -1
            self._have = 0
        while n - pos >= 4:
            size = _unpack_size(data, pos)[0]
            if size < 0 or size > self.max_frame_size:
                self._check(size)
            end = pos + 4 + size
            if end > n:
                self._need = size
                pos += 4
                if pos < n:
                    self._keep(view[pos:])
                return out
            out.append(view[pos + 4 : end])
            pos = end
        if pos < n:
            self._head = data[pos:]
        return out
