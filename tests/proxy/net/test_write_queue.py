"""`QueuedWrites` on real transports (uvloop and asyncio's own loop) to a peer that does not read.

Small writes made one loop turn at a time, the way answers reach a client that never reads,
must pause the writer before their bytes plus `PIECE_COST` a write pass the mark, and the mark
must be back once the peer has read everything.
"""

from __future__ import annotations

import asyncio
import socket

import pytest
import uvloop

from sluice.proxy.net.write_queue import PIECE_COST, QueuedWrites

HIGH = 256 * 1024
PIECE = b"x" * 100


class _Writer(asyncio.Protocol):
    def __init__(self) -> None:
        self.paused = asyncio.Event()
        self.resumed = asyncio.Event()
        self.queue: QueuedWrites | None = None

    def pause_writing(self) -> None:
        self.paused.set()

    def resume_writing(self) -> None:
        assert self.queue is not None
        self.queue.resumed()
        self.resumed.set()


async def _scenario() -> tuple[int, int, int, int]:
    loop = asyncio.get_running_loop()
    ours, theirs = socket.socketpair()
    theirs.setblocking(False)
    transport, writer = await loop.connect_accepted_socket(_Writer, ours)
    queue = writer.queue = QueuedWrites(transport, HIGH)
    # Fill the socket: what follows is queued, not sent.
    while not transport.get_write_buffer_size():
        transport.write(b"y" * 65536)
        await asyncio.sleep(0)
    writes = 0
    while not writer.paused.is_set() and writes < 100_000:
        transport.write(PIECE)
        queue.wrote()
        writes += 1
        await asyncio.sleep(0)  # one write per loop turn: each its own queued request
    held = transport.get_write_buffer_size()
    lowered_to = transport.get_write_buffer_limits()[1]
    # The peer reads everything: the writer resumes and the mark is back.
    while not writer.resumed.is_set():
        try:
            theirs.recv(1 << 20)
        except BlockingIOError:
            await asyncio.sleep(0.001)
    restored = transport.get_write_buffer_limits()[1]
    transport.close()
    theirs.close()
    return writes, held, lowered_to, restored


@pytest.mark.parametrize("loop", ["uvloop", "asyncio"])
def test_small_queued_writes_pause_before_their_cost_passes_the_mark(loop: str) -> None:
    run = uvloop.run if loop == "uvloop" else asyncio.run
    writes, held, lowered_to, restored = run(_scenario())
    assert writes < 100_000, "never paused"
    # Counted at PIECE_COST each, the writes made while queued stay within the mark (one
    # write may cross it: the pause follows it).
    assert held + writes * PIECE_COST <= HIGH + PIECE_COST + len(PIECE)
    # Paused by the count, long before the bytes alone reach the mark.
    assert held < HIGH // 2
    assert lowered_to < HIGH
    assert restored == HIGH


def test_a_transport_that_drained_is_counted_from_zero() -> None:
    class Transport:
        held = 0
        high = 0

        def set_write_buffer_limits(self, high: int) -> None:
            self.high = high

        def get_write_buffer_size(self) -> int:
            return self.held

    transport = Transport()
    queue = QueuedWrites(transport, 10 * PIECE_COST)
    transport.held = 100
    for _ in range(9):
        queue.wrote()
    assert not queue.lowered and transport.high == 10 * PIECE_COST
    queue.wrote()  # 100 bytes + 10 pieces: past the mark
    assert queue.lowered and transport.high == 99
    queue.wrote()  # already lowered: the mark is not moved again
    assert transport.high == 99
    queue.resumed()
    assert not queue.lowered and queue.pieces == 0 and transport.high == 10 * PIECE_COST
