"""One wake-up per large frame instead of one per TCP segment: the receive low-water mark.

A large Produce request (benchmark workload 2: ~93 KB on average, up to ~1 MB) or Fetch
response reaches the proxy over loopback in pieces, and the event loop used to wake for each
piece that had arrived (`strace`: reads of 38, 46 and 207 KB for one request): an
`epoll_pwait`, a `read`, and the Python that hands the chunk to the frame buffer, although
nothing can be done with a frame until it is whole. While a frame of which at least
`MIN_MARK` bytes are still missing is in assembly, the session sets the socket's
`SO_RCVLOWAT` to the bytes missing (at most `MAX_MARK`; lowered only when fewer are missing
than the mark), so the kernel wakes the loop once they are there; the mark goes back to 1 as
soon as no such frame is in assembly, before the loop waits again, so a small frame after a
large one is read at once.

Why this cannot stall a connection: Linux reports end of stream and errors as readable
whatever the mark; it caps the mark at half the largest receive buffer the socket may have and
grows the buffer to hold the mark, and reports the socket readable under memory pressure; the
mark is never more than the bytes the peer must still send to finish a frame it started.
While a mark is set the proxy makes no read, so `limits.idle_timeout_seconds` (which watches
the bytes read) would take a client sending a large frame slowly for an idle one: `waiting()`
reports the bytes the kernel holds for the next read, which the idle check counts as moved.
Not on TLS sockets: ciphertext already taken into the TLS layer but not yet decrypted is
not on the socket any more, so the socket may never hold as many bytes as the plaintext
missing. Nor where the option cannot be set (the mark then stays 1, as before).
"""

from __future__ import annotations

import fcntl
import socket
import termios
from typing import Any

#: Below this many missing bytes a frame is finished by the next segment or two anyway: two
#: `setsockopt` calls would cost more than the wake-ups they save.
MIN_MARK = 8 * 1024
#: Marks are capped at what uvloop reads in one call (256 000 bytes): a larger mark would
#: not save a read, and a mark at most this large stays valid while a large frame is read in
#: such chunks, so it is set about three times per frame (at its start, for its last chunk,
#: back to 1), not after every read. The kernel grows a receive buffer to about twice the mark.
MAX_MARK = 256_000


def low_water(transport: Any) -> LowWater | None:
    """The mark of the transport's socket; None where none can be set (TLS, not TCP): the
    session then makes no call per read."""
    mark = LowWater(transport)
    return mark if mark.settable else None


class LowWater:
    """The receive low-water mark of one socket, set only when it changes."""

    __slots__ = ("_sock", "mark")

    def __init__(self, transport: Any) -> None:
        #: The mark set now (1: none). An attribute: the session reads it after every read.
        self.mark = 1
        self._sock: Any = None
        if transport.get_extra_info("sslcontext") is not None:
            return  # TLS: see the module docstring
        sock = transport.get_extra_info("socket")
        if sock is None or sock.family not in (socket.AF_INET, socket.AF_INET6):
            return  # not TCP (a test's socketpair)
        self._sock = sock

    @property
    def settable(self) -> bool:
        return self._sock is not None

    def wait_for(self, missing: int) -> None:
        """A frame in assembly lacks `missing` bytes (0: none in assembly)."""
        current = self.mark
        if missing < MIN_MARK:
            mark = 1
        elif 1 < current <= missing:
            return  # still no more than what must come: wakes the loop no later than due
        else:
            mark = min(missing, MAX_MARK)
        if mark == current or self._sock is None:
            return
        try:
            self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT, mark)
        except OSError:
            # Closed under us, or an option this socket does not take: from now on the
            # loop wakes on every segment, as it did before the mark existed.
            self._sock = None
            return
        self.mark = mark

    def waiting(self) -> int:
        """Bytes received on the socket and not read yet, while a mark above 1 holds them back
        (0 otherwise: without a mark every arrival is read at once)."""
        if self.mark <= 1 or self._sock is None:
            return 0
        try:
            buf = fcntl.ioctl(self._sock.fileno(), termios.FIONREAD, b"\0\0\0\0")
        except (OSError, ValueError):
            return 0  # closed under us: nothing waits any more
        return int.from_bytes(buf, "little", signed=True)
