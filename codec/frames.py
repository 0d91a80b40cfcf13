"""Kafka framing: a 4-byte big-endian size prefix followed by the frame body.

`FrameBuffer` turns arbitrary chunks read from a socket into whole frame bodies. It is on the
proxy's hot path for every request and response, so it avoids copies: frames that lie wholly
inside one fed chunk come back as zero-copy `memoryview` slices of that chunk; only the
incomplete tail of a chunk is buffered (and copied) until the rest arrives.

It can also be read into (`get_buffer`, `filled`: what an asyncio `BufferedProtocol` asks
for): a read goes into a `READ_SIZE` buffer of its own, from which whole frames are taken as
with `feed`; once a frame of `OWN_BUFFER` bytes or more is known to be in assembly, its body
gets a buffer of its own, sized from its length prefix (at most `RESERVE` at first, or the
`reserve` given: `CLIENT_RESERVE` for a client's requests), and the socket reads the rest of it
straight into that buffer. A large Fetch response or Produce request is then copied in Python
only for what its first read held; the rest the kernel copies into the buffer it is
forwarded from (fed as chunks, all of it was copied once out of the event loop's read buffer
into a `bytes` and once more into the frame in assembly). A read holding whole frames only,
the first of them large, is not copied at all where the buffer is made with `hand_over`
(a client's requests): the read buffer goes with its frames (read-only views of it).
"""

from __future__ import annotations

import struct
import threading
from collections.abc import Callable

from .errors import FrameTooLarge

_whole_frames: Callable[[bytes, int], list[memoryview | bytes] | None] | None
_unfilled: Callable[[int], bytearray]
try:  # codec/passthrough.c, built at install: a read of whole frames in one call
    from ._passthrough import whole_frames as _whole_frames  # type: ignore[import-not-found, no-redef, unused-ignore]
except ImportError:
    _whole_frames = None
_read_frames: Callable[[bytearray, int, int], list[memoryview | bytes] | None]
try:  # the same module: the frames of a read as views of the buffer it was read into
    from ._passthrough import read_frames as _read_frames  # type: ignore[import-not-found, no-redef, unused-ignore]
    _HAND_OVER = True
except ImportError:

    def _read_frames(buffer: bytearray, nbytes: int, max_frame_size: int) -> None:
        return None  # never called: without the native module no read is handed over

    _HAND_OVER = False
_grow: Callable[[bytearray, int], None]
try:  # the same module: a large frame's buffer without first writing zeros into it
    from ._passthrough import grow as _grow  # type: ignore[import-not-found, no-redef, unused-ignore]
    from ._passthrough import unfilled as _unfilled  # type: ignore[import-not-found, no-redef, unused-ignore]
except ImportError:
    _unfilled = bytearray

    def _grow(buffer: bytearray, size: int) -> None:
        buffer += bytes(size - len(buffer))

#: Bytes of one read made while no large frame is in assembly (`FrameBuffer.get_buffer`, into
#: a buffer shared by the thread's connections, `_read_buffer`): as much as uvloop reads at a
#: time into its own buffer, so a read of small or medium frames costs what it did (one copy
#: into a `bytes`, the frames views of it); a large frame's first read is copied once into its
#: own buffer, and the rest of it is not copied.
READ_SIZE = 256_000
#: A frame of this many bytes or more, once its size prefix is read, is read into a buffer of
#: its own (`get_buffer`); below it, a frame takes the copies `feed` makes, cheap at that size.
OWN_BUFFER = 32 * 1024
#: At most this much is reserved at once for a frame in assembly, whatever its prefix says (up
#: to `max_frame_size`, 100 MiB by default): a peer's 4-byte prefix must not reserve 100 MiB
#: before it sends anything. A larger frame's buffer grows, doubling, as its bytes arrive. Not
#: less: a workload-2 consumer in bench_proxy (8 MiB per partition, six partitions) gets ~33 MB
#: responses, and growing a 16 MiB reserve (from the heap to a mapping of its own: copies and
#: faults) cost more than the copies it saved (bench.consume_cpu --workload 2: 1.2x the CPU per
#: GB of feeding chunks; reserved whole, 0.4x). Above glibc's mmap threshold (32 MiB here,
#: proxy/ops/allocator.py) a reservation is a mapping the kernel backs only as bytes arrive.
RESERVE = 64 * 1024 * 1024
#: What a client's request frame reserves at once instead (`FrameBuffer(reserve=...)`): a
#: client is less trusted than the broker, and a connection that declares a large request and
#: sends no more of it then holds 1 MiB, not 64; a larger request's buffer doubles as it
#: arrives. Produce requests are ~0.1-1 MB (a workload-1 producer's ~0.8 MB fits at once).
CLIENT_RESERVE = 1024 * 1024

_reads = threading.local()


def _read_buffer() -> memoryview:
    """The calling thread's `READ_SIZE` read buffer, shared by every `FrameBuffer` read into on
    that thread. Not one per connection: an idle connection would hold it for its life (found
    in review: 10 000 connections, 2.5 GB, where the event loop's own reads held nothing per
    connection). Sharing is safe because an event loop fills one buffer and reports it
    (`filled`) before it asks any protocol for another, and `filled` copies out every byte it
    keeps, or hands the whole buffer over with the frames it holds (`hand_over`: the thread
    then makes a new one; no `FrameBuffer` keeps a reference to it, so none reads into a
    buffer handed over); only the bytes a read reports are ever looked at, so it is not
    zeroed."""
    buffer: memoryview | None = getattr(_reads, "buffer", None)
    if buffer is None or len(buffer) != READ_SIZE:
        array = _reads.array = _unfilled(READ_SIZE)
        buffer = _reads.buffer = memoryview(array)
    return buffer


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

    __slots__ = ("_body", "_buf", "_got", "_need", "_reserve", "_size", "hand_over",
                 "max_frame_size", "missing")

    def __init__(self, max_frame_size: int = DEFAULT_MAX_FRAME_SIZE,
                 reserve: int | None = None, hand_over: bool = False) -> None:
        if max_frame_size < 0:
            raise ValueError("max_frame_size must be >= 0")
        self.max_frame_size = max_frame_size
        # At most this much reserved at once for a large frame (None: `RESERVE`).
        self._reserve = reserve
        #: A read of whole frames, the first of them large, is handed over with its frames
        #: rather than copied (`filled`); only where frames are let go of once forwarded. An
        #: attribute: the owner turns it off while its frames may be held (a frame handed
        #: over keeps the whole read buffer, 256 000 bytes, however small it is).
        self.hand_over = hand_over and _HAND_OVER
        self._buf = bytearray()
        # Total bytes (prefix + body) of the frame being assembled in _buf, or 0 if the
        # prefix itself is not complete yet.
        self._need = 0
        #: Bytes still to come before the frame in assembly is whole (0 when no frame's size
        #: prefix has been read yet: nothing is known to be coming). An attribute, set by
        #: `feed`, not a property: the proxy reads it after every read of a socket.
        self.missing = 0
        # Read into (`get_buffer`): the buffer of the large frame in assembly (its body only),
        # the bytes of it filled, and its size; else None, and reads go into the thread's
        # read buffer (`_read_buffer`).
        self._body: bytearray | None = None
        self._got = 0
        self._size = 0

    @property
    def pending(self) -> int:
        """Bytes buffered that do not yet form a whole frame."""
        if self._body is not None:
            return 4 + self._got
        return len(self._buf)

    def get_buffer(self, sizehint: int = -1) -> memoryview:
        """Where the next read from the socket goes (never empty); then call `filled` with
        the number of bytes written into it. While a large frame is in assembly, that is the
        rest of the frame's own buffer: the read stops at the frame's end, and the next read
        goes into a small buffer again."""
        body = self._body
        if body is not None:
            got = self._got
            if got == len(body):
                # Reserved less than the frame (`RESERVE`): twice what arrived, at most.
                body = self._enlarge(min(self._size, 2 * got))
            return memoryview(body)[got:]
        read = getattr(_reads, "buffer", None)
        if read is None or len(read) != READ_SIZE:
            read = _read_buffer()
        return read

    def filled(self, nbytes: int) -> list[memoryview | bytes]:
        """`nbytes` were read into the buffer `get_buffer` gave: the bodies of every frame
        they complete, in order (as `feed`)."""
        if self._body is not None:
            return self._fill(nbytes)
        read = _reads.buffer
        assert read is not None and 0 <= nbytes <= len(read)
        buf = self._buf
        if not buf and nbytes >= 4:
            size = _unpack_size(read, 0)[0]
            if size >= OWN_BUFFER:
                if size + 4 > nbytes:
                    # The common start of a large frame (a Fetch response: one in flight per
                    # connection): the read begins with it and holds nothing else, so what it
                    # holds of the body is copied once, into the frame's own buffer.
                    self._check(size)
                    self._own_buffer(size, read[4:nbytes])
                    self.missing = size + 4 - nbytes
                    return []
                if self.hand_over:
                    # A large frame whole in the read (a workload-2 Produce request, ~93 KB):
                    # the read buffer goes with its frames, not copied into a `bytes` (one
                    # memcpy of the frame less, on cold caches); the thread's next read gets
                    # a new buffer (malloc's, mostly the one just let go of), made here, not
                    # by a call in the next `get_buffer` (issue 29: calls per request).
                    whole = _read_frames(_reads.array, nbytes, self.max_frame_size)
                    if whole is not None:
                        array = _reads.array = _unfilled(READ_SIZE)
                        _reads.buffer = memoryview(array)
                        return whole
        # One copy: whole frames are views of it, a frame cut at the end is kept (`feed`).
        data = bytes(read[:nbytes])
        if not buf and _whole_frames is not None:
            whole = _whole_frames(data, self.max_frame_size)  # `feed`'s common read, one call less
            if whole is not None:
                return whole
        out = self.feed(data)
        if self._need >= OWN_BUFFER:
            self._own_buffer(self._need - 4, memoryview(self._buf)[4:])
            self._buf = bytearray()
            self._need = 0
        return out

    def _own_buffer(self, size: int, part: memoryview) -> None:
        """The frame in assembly is large (`size` bytes, of which `part` has arrived): its
        body moves to a buffer of its own, which the socket reads the rest into
        (`get_buffer`)."""
        got = len(part)
        reserve = RESERVE if self._reserve is None else self._reserve
        body = _unfilled(min(size, max(reserve, got)))
        body[:got] = part
        self._body, self._got, self._size = body, got, size

    def _enlarge(self, size: int) -> bytearray:
        """The large frame's buffer made `size` bytes long: in place (`realloc`, which remaps
        rather than copies a buffer above glibc's mmap threshold), or, while a view of it is
        still alive (a caller's; an event loop lets go of its own after each read), a copy."""
        body = self._body
        assert body is not None
        try:
            _grow(body, size)
        except BufferError:
            grown = _unfilled(size)
            grown[: self._got] = memoryview(body)[: self._got]
            self._body = body = grown
        return body

    def _fill(self, nbytes: int) -> list[memoryview | bytes]:
        got = self._got = self._got + nbytes
        missing = self._size - got
        self.missing = missing
        if missing:
            return []
        body = self._body
        assert body is not None
        self._body = None
        self._size = self._got = 0
        return [memoryview(body)]

    def _check(self, size: int) -> None:
        if size < 0 or size > self.max_frame_size:
            raise FrameTooLarge(f"declared frame size {size} outside 0..{self.max_frame_size}")

    def feed(self, data: bytes | bytearray | memoryview) -> list[memoryview | bytes]:
        """Add a chunk; return the bodies of every frame it completes, in order."""
        if type(data) is not bytes:
            # Returned views must not alias a buffer the caller may reuse.
            data = bytes(data)
        if self._body is not None:
            # A large frame is being read into its own buffer: the chunk fills it first.
            body, got = self._body, self._got
            take = min(len(data), self._size - got)
            if got + take > len(body):
                # More than was reserved (`RESERVE`) has arrived: the buffer grows to hold it.
                body = self._enlarge(min(self._size, max(2 * got, got + take)))
            body[got : got + take] = data[:take]
            done = self._fill(take)
            if take == len(data):
                return done
            return done + self.feed(data[take:])
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
