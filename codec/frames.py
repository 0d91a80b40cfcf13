"""Kafka framing: a 4-byte big-endian size prefix followed by the frame body.

`FrameBuffer` turns arbitrary chunks read from a socket into whole frame bodies. It is on the
proxy's hot path for every request and response, so it avoids copies: frames that lie wholly
inside one fed chunk come back as zero-copy `memoryview` slices of that chunk; a frame that
spans reads is assembled in one buffer reserved for it once its size prefix is known (grown
by doubling past `PREALLOCATE` bytes, so a peer that declares a large frame and sends little
makes the proxy hold little), never in a buffer regrown read after read.

It can also be read into directly (the buffered-protocol way, `get_buffer` and
`buffer_updated`): while a large frame is in assembly the reader is handed the rest of that
frame's own buffer, so the socket's bytes land where the frame is kept, with no copy in
between; otherwise it is handed a scratch buffer whose bytes are then fed as a chunk. The
buffer itself stays sans-IO: it only says where the next bytes should go.
"""

from __future__ import annotations

import struct

from .errors import FrameTooLarge

__all__ = [
    "DEFAULT_MAX_FRAME_SIZE",
    "DIRECT_READ",
    "PREALLOCATE",
    "READ_SIZE",
    "FrameBuffer",
    "FrameTooLarge",
    "frame",
]

DEFAULT_MAX_FRAME_SIZE = 100 * 1024 * 1024
#: Body bytes reserved for a frame in assembly before any of them arrive; past it the buffer
#: doubles as bytes come (what a peer makes the proxy hold follows what it sent).
PREALLOCATE = 1 << 20
#: The scratch buffer a reader gets between large frames (one read's worth, as uvloop's own).
READ_SIZE = 256 * 1024
#: A frame in assembly with at least this much still to come is read into its own buffer.
DIRECT_READ = 64 * 1024

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

    __slots__ = (
        "_direct",
        "_filled",
        "_frame",
        "_head",
        "_scratch",
        "_size",
        "max_frame_size",
    )

    def __init__(self, max_frame_size: int = DEFAULT_MAX_FRAME_SIZE) -> None:
        if max_frame_size < 0:
            raise ValueError("max_frame_size must be >= 0")
        self.max_frame_size = max_frame_size
        self._head = bytearray()  # a size prefix not yet complete (< 4 bytes)
        # The body of the frame in assembly (None: none), its declared size, bytes filled.
        self._frame: bytearray | None = None
        self._size = 0
        self._filled = 0
        self._scratch: memoryview | None = None  # made on the first buffered read
        self._direct = False  # the last `get_buffer` handed out the frame's own buffer

    @property
    def pending(self) -> int:
        """Bytes buffered that do not yet form a whole frame."""
        if self._frame is not None:
            return 4 + self._filled
        return len(self._head)

    def _check(self, size: int) -> None:
        if size < 0 or size > self.max_frame_size:
            raise FrameTooLarge(f"declared frame size {size} outside 0..{self.max_frame_size}")

    def _room(self, wanted: int) -> bytearray:
        """The frame's buffer, grown (doubling, at most to the declared size) to hold
        `wanted` body bytes."""
        body = self._frame
        assert body is not None
        have = len(body)
        if wanted > have:
            body += bytes(min(self._size, max(wanted, 2 * have)) - have)
        return body

    def _begin(self, size: int, out: list[memoryview | bytes]) -> None:
        if size == 0:
            out.append(b"")
            return
        self._size = size
        self._filled = 0
        self._frame = bytearray(min(size, PREALLOCATE))

    def _take(self, data: bytes, pos: int, out: list[memoryview | bytes]) -> int:
        """Copy what the frame in assembly still needs from data[pos:]; returns the new pos."""
        filled = self._filled
        take = min(self._size - filled, len(data) - pos)
        end = filled + take
        body = self._room(end)
        body[filled:end] = memoryview(data)[pos : pos + take]
        self._filled = end
        if end == self._size:
            out.append(memoryview(body))
            self._frame = None
        return pos + take

    def feed(self, data: bytes | bytearray | memoryview) -> list[memoryview | bytes]:
        """Add a chunk; return the bodies of every frame it completes, in order."""
        if type(data) is not bytes:
            # Returned views must not alias a buffer the caller may reuse.
            data = bytes(data)
        out: list[memoryview | bytes] = []
        pos = 0
        n = len(data)
        if self._frame is not None:
            pos = self._take(data, pos, out)
            if self._frame is not None:
                return out
        head = self._head
        if head:
            take = 4 - len(head)
            head += data[:take]
            pos = min(take, n)
            if len(head) < 4:
                return out
            size = _unpack_size(head, 0)[0]
            head.clear()
            self._check(size)
            self._begin(size, out)
            if self._frame is not None:
                pos = self._take(data, pos, out)
                if self._frame is not None:
                    return out
        view = memoryview(data)
        while n - pos >= 4:
            size = _unpack_size(data, pos)[0]
            if size < 0 or size > self.max_frame_size:
                self._check(size)
            end = pos + 4 + size
            if end > n:
                self._begin(size, out)
                self._take(data, pos + 4, out)
                return out
            out.append(view[pos + 4 : end])
            pos = end
        if pos < n:
            head += data[pos:]
        return out

    # ------------------------------------------------------------ buffered reads

    def get_buffer(self) -> memoryview:
        """Where the next read should put its bytes (then call `buffer_updated`): the rest of
        a large frame's own buffer, so its bytes are not copied again, or a scratch buffer."""
        if self._frame is not None and self._size - self._filled >= DIRECT_READ:
            self._direct = True
            body = self._room(self._filled + 1)
            return memoryview(body)[self._filled :]
        self._direct = False
        scratch = self._scratch
        if scratch is None:
            scratch = self._scratch = memoryview(bytearray(READ_SIZE))
        return scratch

    def buffer_updated(self, nbytes: int) -> list[memoryview | bytes]:
        """`nbytes` were written at the start of the last `get_buffer`'s buffer: the bodies of
        every frame they complete, in order."""
        if not self._direct:
            assert self._scratch is not None
            return self.feed(self._scratch[:nbytes].tobytes())
        self._direct = False
        filled = self._filled = self._filled + nbytes
        if filled < self._size:
            return []
        body = self._frame
        assert body is not None
        self._frame = None
        return [memoryview(body)]
