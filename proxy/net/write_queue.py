"""The write high-water mark, counting what each queued write costs besides its bytes.

A transport's high-water mark counts bytes. But once a socket's send buffer is full, uvloop
queues every later write as its own libuv request, a write context of about 1 KiB (room for
four buffers, the request, a list), until the socket drains. A peer that never reads, sent
small answers one loop turn at a time (a flood of pipelined Metadata requests: ~150 bytes a
turn), grew the proxy by ~30 MiB for the 4 MiB the mark counted (tests/e2e/test_core_holes.py,
`test_client_that_never_reads_broker_answers`: 27 500 writes, 1.1 KiB each).

`QueuedWrites` is told of each write made while its transport holds unsent bytes, counts it at
`PIECE_COST`, and once the bytes plus the pieces pass the transport's mark, lowers the mark to
just under what the transport holds: the transport itself then calls `pause_writing` (the
connection stops reading the other side, as at the mark) and later `resume_writing` once
a quarter of that has drained, where `resumed` puts the mark back. So the back-pressure path
is the transport's own; this only decides when it starts.

`tls_writes` is what a write through TLS is handed instead of many small pieces: the TLS
transports (asyncio's and uvloop's) seal each buffer of a `writelines` as records of its own,
so a spliced Fetch response written as pieces (each batch a view, `paths/base.Pieces`) went
out as a TLS record per batch (~29 bytes and an SSL_write each: 10 000 pieces of 100 bytes,
15x the CPU of one 1 MB buffer). Small neighbours are joined; large pieces pass as they are.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

#: Memory one write costs while its socket is full, besides its bytes: uvloop's write context
#: (a `uv_write_t`, four inline `uv_buf_t` and `Py_buffer`s) and its list, ~1.1 KiB measured.
PIECE_COST = 1024
_Buffer = bytes | bytearray | memoryview
#: A TLS record's most plaintext: pieces are joined up to it (`tls_writes`).
TLS_RECORD = 16384


class QueuedWrites:
    """Counts the writes a transport queues while its socket is full (see the module)."""

    __slots__ = ("_high", "_transport", "lowered", "pieces")

    def __init__(self, transport: Any, high: int) -> None:
        self._transport = transport
        self._high = high
        #: Writes made since the transport last held nothing unsent.
        self.pieces = 0
        #: The mark is lowered, waiting for `resumed`.
        self.lowered = False
        transport.set_write_buffer_limits(high=high)

    def wrote(self) -> None:
        """A write was made while the transport already held unsent bytes."""
        self.pieces += 1
        if self.lowered:
            return
        held = self._transport.get_write_buffer_size()
        if held and held + self.pieces * PIECE_COST > self._high:
            self.lowered = True
            # Pauses at once (uvloop and asyncio check the mark when it is set), and resumes at
            # a quarter of it, the transports' default low-water mark.
            self._transport.set_write_buffer_limits(high=held - 1)

    def resumed(self) -> None:
        """The transport called `resume_writing`: what it holds has drained."""
        if self.lowered:
            self.lowered = False
            self.pieces = 0
            self._transport.set_write_buffer_limits(high=self._high)


def tls_writes(data: Sequence[_Buffer]) -> list[_Buffer]:
    """`data` for a TLS transport's `writelines`: runs of pieces under `TLS_RECORD` bytes
    joined until they reach it (each buffer becomes TLS records of its own), larger pieces
    as they are (a record each 16 KiB anyway: copying them would cost more than it saves)."""
    out: list[_Buffer] = []
    run: list[_Buffer] = []
    size = 0
    for piece in data:
        n = len(piece)
        if n >= TLS_RECORD:
            if run:
                out.append(run[0] if len(run) == 1 else b"".join(run))
                run, size = [], 0
            out.append(piece)
            continue
        run.append(piece)
        size += n
        if size >= TLS_RECORD:
            out.append(b"".join(run))
            run, size = [], 0
    if run:
        out.append(run[0] if len(run) == 1 else b"".join(run))
    return out
