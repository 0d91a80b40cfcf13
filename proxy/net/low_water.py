"""One wake-up per large frame instead of one per TCP segment: the receive low-water mark.

A ~93 KB Produce request (benchmark workload 2) reaches the proxy over loopback in several
segments, and a 1 MB Fetch response in ~16, and the event loop used to wake for each: an
`epoll_pwait`, a `read`, and the Python that hands the chunk to the frame buffer, although
nothing can be done with a frame until it is whole. While a frame of which at least
`MIN_MARK` bytes are still missing is in assembly, the session sets the socket's
`SO_RCVLOWAT` to the bytes missing (at most `MAX_MARK`), so the kernel wakes the loop once
they are there; the mark goes back to 1 as soon as no such frame is in assembly, before the
loop waits again, so a small frame after a large one is read at once.

Why this cannot stall a connection: Linux reports end of stream and errors as readable
whatever the mark; it caps the mark at half the largest receive buffer the socket may have and
grows the buffer to hold the mark, and reports the socket readable under memory pressure; the
mark is never more than the bytes the peer must still send to finish a frame it started.
Not on TLS sockets: ciphertext already taken into the TLS layer but not yet decrypted is
not on the socket any more, so the socket may never hold as many bytes as the plaintext
missing. Nor where the option cannot be set (the mark then stays 1, as before).
"""

from __future__ import annotations

import socket
from typing import Any

#: Below this many missing bytes a frame is finished by the next segment or two anyway: two
#: `setsockopt` calls would cost more than the wake-ups they save.
MIN_MARK = 8 * 1024
#: Marks are capped: past this the loop reads what is there (uvloop reads 256 KiB at a time),
#: and the kernel never grows a receive buffer to more than about twice the mark for it.
MAX_MARK = 1024 * 1024


class LowWater:
    """The receive low-water mark of one socket, set only when it changes."""

    __slots__ = ("_mark", "_sock")

    def __init__(self, transport: Any) -> None:
        self._mark = 1
        self._sock: Any = None
        if transport.get_extra_info("sslcontext") is not None:
            return  # TLS: see the module docstring
        sock = transport.get_extra_info("socket")
        if sock is None or sock.family not in (socket.AF_INET, socket.AF_INET6):
            return  # not TCP (a test's socketpair)
        self._sock = sock

    @property
    def mark(self) -> int:
        return self._mark

    def wait_for(self, missing: int) -> None:
        """A frame in assembly lacks `missing` bytes (0: none in assembly)."""
        mark = 1 if missing < MIN_MARK else min(missing, MAX_MARK)
        if mark == self._mark or self._sock is None:
            return
        try:
            self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT, mark)
        except OSError:
            # Closed under us, or an option this socket does not take: from now on the
            # loop wakes on every segment, as it did before the mark existed.
            self._sock = None
            return
        self._mark = mark
