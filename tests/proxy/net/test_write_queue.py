"""`QueuedWrites` on real transports (uvloop and asyncio's own loop) to a peer that does not read.

Small writes made one loop turn at a time, the way answers reach a client that never reads,
must pause the writer before their bytes plus `PIECE_COST` a write pass the mark, and the mark
must be back once the peer has read everything. Pieces written through TLS are joined into
record-sized writes (`tls_writes`), by the session for a TLS side only.
"""

from __future__ import annotations

import asyncio
import itertools
import socket
from typing import Any, cast

import pytest
import uvloop
from hypothesis import given, settings
from hypothesis import strategies as st

from sluice.proxy.net.write_queue import PIECE_COST, TLS_RECORD, QueuedWrites, tls_writes

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


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 3 * TLS_RECORD), max_size=40))
def test_tls_writes_keep_the_bytes_and_join_only_small_neighbours(sizes: list[int]) -> None:
    data = [bytes([i % 251]) * n for i, n in enumerate(sizes)]
    out = tls_writes([memoryview(d) for d in data])
    assert b"".join(out) == b"".join(data)
    # No two neighbours that could share a record (both under it, their sum too) stay apart;
    # a large piece passes as it is (no copy).
    for a, b in itertools.pairwise(out):
        assert len(a) + len(b) > TLS_RECORD or len(a) >= TLS_RECORD or len(b) >= TLS_RECORD
    large = [d for d in data if len(d) >= TLS_RECORD]
    assert [bytes(p) for p in out if len(p) >= TLS_RECORD and type(p) is memoryview] == large


class _TLSClient:
    """A client transport as the session sees it: TLS (an `sslcontext`) or not."""

    def __init__(self, tls: bool) -> None:
        self.tls = tls
        self.writes: list[list[Any]] = []

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return object() if name == "sslcontext" and self.tls else default

    def set_write_buffer_limits(self, high: int) -> None:
        pass

    def get_write_buffer_size(self) -> int:
        return 0

    def pause_reading(self) -> None:
        pass

    def writelines(self, data: list[Any]) -> None:
        self.writes.append(list(data))


@pytest.mark.parametrize("tls", [True, False])
def test_a_response_in_pieces_reaches_a_tls_client_in_record_sized_writes(tls: bool) -> None:
    """A spliced Fetch response (`Pieces`: a view per batch) is sealed a TLS record per
    buffer: joined into record-sized writes for a TLS client, handed over as is otherwise."""
    from sluice.proxy.net.connection import Connection, SendToClient
    from sluice.proxy.net.session import Session
    from sluice.proxy.telemetry.metrics import Metrics
    from tests.proxy.net.unfiltered_routes import unfiltered_routes

    frame = bytes(range(256)) * 400
    view = memoryview(frame)
    pieces = [view[i:i + 100] for i in range(0, len(frame), 100)]

    async def scenario() -> _TLSClient:
        metrics = Metrics()
        session = Session(lambda c: Connection(c, unfiltered_routes([], metrics), metrics),
                          ("127.0.0.1", 9), {}, None, cast(Any, None), None, cast(Any, None))
        client = _TLSClient(tls)
        session._client = cast(Any, client)  # as `connection_made` does
        session._set_up(cast(Any, client))
        assert session._connecting is not None
        session._connecting.cancel()
        session._do([SendToClient([b"\0\0\0\0", *pieces])])
        return client

    client = asyncio.run(scenario())
    (written,) = client.writes
    assert b"".join(written) == b"\0\0\0\0" + frame
    if tls:
        assert len(written) <= len(frame) // TLS_RECORD + 2
    else:
        assert len(written) == len(pieces) + 1
