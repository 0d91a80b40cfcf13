"""A client's reads (proxy/net/session.py `Session.get_buffer`, `buffer_updated`,
`data_received`): before its broker connection is up, what they hold per connection and that
each session keeps the bytes it read although the spare buffer is the thread's; a chunk
handed to `data_received` is read as the event loop reads."""

from __future__ import annotations

import asyncio
import gc
import socket
import struct
import time
import tracemalloc
from typing import Any

import pytest

from bench.connection_cpu import _mask_chain
from bench.path_cpu import produce_frame
from sluice.codec import frames as frames_module
from sluice.codec.frames import CLIENT_RESERVE, OWN_BUFFER, READ_SIZE, frame
from sluice.codec.headers import request_header_bytes
from sluice.codec.messages import ApiKey
from sluice.proxy.net.server import ProxyServer
from sluice.proxy.ops.config import ProxyConfig
from tests.proxy.net.test_passthrough_calls import (
    _Transport,
    read_into,
    tcp_sockets,
    wired_session,
)

__all__ = ["tcp_sockets"]  # the fixture, used by name

#: Sessions waiting for their broker connection in the memory test.
WAITING = 20


def _waiting_session(server: ProxyServer, sock: socket.socket) -> tuple[Any, _Transport]:
    """A session of `server` whose client is `sock`'s transport and whose broker connection
    is not up (nothing dialled)."""
    session: Any = server._new_session(lambda: ("127.0.0.1", 1), None)
    client = _Transport(sock)
    session._client = client
    server.admit(session)
    session._set_up(client)
    session._connecting.cancel()  # the broker stays unreachable: `_live` stays False
    return session, client


def test_sessions_waiting_for_the_broker_hold_only_what_they_read(
    tcp_sockets: tuple[socket.socket, socket.socket],
) -> None:
    # uvloop reads a client's socket once right after `connection_made`, whatever it paused:
    # a first request (ApiVersions, ~30 bytes) lands in the spare buffer. Kept per session,
    # that was a zeroed 64 KiB each for as long as the broker took to answer (up to the
    # 10 s connect timeout), where the bytes read are all a session needs to keep.
    async def main() -> int:
        server = ProxyServer(ProxyConfig(listen=("127.0.0.1", 0), upstream=[("127.0.0.1", 1)]))
        request = frame(bytes(30))
        tracemalloc.start()
        try:
            base = tracemalloc.get_traced_memory()[0]
            sessions = [_waiting_session(server, tcp_sockets[0]) for _ in range(WAITING)]
            for session, _client in sessions:
                read_into(session, request)
                assert session._early == [request]
            held = tracemalloc.get_traced_memory()[0] - base
        finally:
            tracemalloc.stop()
        for session, _client in sessions:
            session.close("test over")
        return held // WAITING

    per_session = asyncio.run(main())
    assert per_session < 32 * 1024, per_session


def test_early_reads_of_two_sessions_keep_their_own_bytes(
    tcp_sockets: tuple[socket.socket, socket.socket],
) -> None:
    async def main() -> None:
        server = ProxyServer(ProxyConfig(listen=("127.0.0.1", 0), upstream=[("127.0.0.1", 1)]))
        first, second = frame(b"\1" * 10), frame(b"\2" * 10)
        # The second session's read lands where the first one's did (one spare per thread).
        one, _ = _waiting_session(server, tcp_sockets[0])
        two, _ = _waiting_session(server, tcp_sockets[0])
        read_into(one, first[:7])
        read_into(two, second)
        assert one._early == [first[:7]] and two._early == [second]
        one.close("test over")
        two.close("test over")

    asyncio.run(main())


def test_a_chunk_handed_over_grows_a_large_request_in_place(
    tcp_sockets: tuple[socket.socket, socket.socket], monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Benchmarks and tests hand `data_received` a whole request: it must read it as the loop
    # does, letting go of each buffer before asking for the next, or every doubling of a
    # request over CLIENT_RESERVE is a copy (`FrameBuffer._enlarge`) the loop never makes.
    made: list[int] = []
    unfilled = frames_module._unfilled

    def counted(size: int) -> bytearray:
        made.append(size)
        return unfilled(size)

    monkeypatch.setattr(frames_module, "_unfilled", counted)

    async def main() -> None:
        server = ProxyServer(ProxyConfig(listen=("127.0.0.1", 0), upstream=[("127.0.0.1", 1)]))
        session, _client, broker = wired_session(server, tcp_sockets)
        # Heartbeat: relayed as its bytes (no path inspects it).
        header = request_header_bytes(ApiKey.HEARTBEAT, 4, 1, "t")
        payload = frame(header + bytes(3 * CLIENT_RESERVE))
        session.data_received(payload)
        assert b"".join(bytes(b) for b in broker.writes[-1]) == payload
        session.close("test over")

    asyncio.run(main())
    # The request's buffer reserved once, then grown in place (not made anew at 2 and 3 MiB).
    assert [size for size in made if size >= CLIENT_RESERVE] == [CLIENT_RESERVE], made


#: Large Produce requests in flight in the memory test (the connection awaits 256 at most).
IN_FLIGHT = 100


class _Sink(_Transport):
    """A broker transport that takes every write (nothing kept: only the proxy holds)."""

    def writelines(self, data: Any) -> None:
        pass

    def write(self, data: Any) -> None:
        pass


def test_forwarded_requests_handed_over_are_let_go_of(
    tcp_sockets: tuple[socket.socket, socket.socket],
) -> None:
    # A client's read of one whole request of 32 KiB or more is handed over with the read
    # buffer (256 000 bytes, codec/frames.py `hand_over`): a request kept with its slot until
    # its response (its parse, `exchange.parsed`, holds the frame) held the whole buffer,
    # ~257 KB per request in flight, up to 256 of them (64 MiB a connection) that no limit
    # counts. Forwarded, the frame must be let go of (connection.py `_apply_request`).
    async def main() -> int:
        server = ProxyServer(ProxyConfig(listen=("127.0.0.1", 0), upstream=[("127.0.0.1", 1)]))
        session, _client, _broker = wired_session(server, tcp_sockets)
        session._broker = _Sink(tcp_sockets[1])
        request = bytearray(produce_frame("t", bytes(OWN_BUFFER), 9))
        requests = []
        for cid in range(1, IN_FLIGHT + 2):
            struct.pack_into(">i", request, 4, cid)
            requests.append(struct.pack(">i", len(request)) + bytes(request))
        read_into(session, requests[0])  # memos filled, versions learnt
        gc.collect()
        tracemalloc.start()
        try:
            base = tracemalloc.get_traced_memory()[0]
            for data in requests[1:]:
                before = frames_module._reads.array
                read_into(session, data)
                assert frames_module._reads.array is not before  # handed over
            gc.collect()
            held = tracemalloc.get_traced_memory()[0] - base
        finally:
            tracemalloc.stop()
        assert len(session.conn._awaiting) == IN_FLIGHT + 1 and not session._ended
        session.close("test over")
        return held // IN_FLIGHT

    per_request = asyncio.run(main())
    # Neither the read buffer nor the frame (each buffer handed over made anew: READ_SIZE).
    assert per_request < OWN_BUFFER // 4 < READ_SIZE, per_request


#: Connections with a filtered request in its job in the memory test.
IN_JOBS = 20


def test_requests_in_filter_jobs_hold_no_read_buffer(
    tcp_sockets: tuple[socket.socket, socket.socket],
) -> None:
    # A request in a Produce filter job (or queued for the pool, with every other
    # connection's) is held until its job is done: handed over with its read's buffer, a
    # 32 KiB request held 256 000 bytes (261 KB a connection measured, against 38 KB copied),
    # where the memory bounds count request frames in jobs at their size (docs/ARCHITECTURE.md).
    async def main() -> int:
        server = ProxyServer(ProxyConfig(listen=("127.0.0.1", 0), upstream=[("127.0.0.1", 1)]))
        server.install_chain(_mask_chain())  # pii-mask on produce, topics cpu-*
        request = produce_frame("cpu-topic", b'{"email": "a@b.c"}' + bytes(OWN_BUFFER), 9)
        data = struct.pack(">i", len(request)) + request
        sessions = []
        for _ in range(IN_JOBS + 1):
            session, _client, _broker = wired_session(server, tcp_sockets)
            session._broker = _Sink(tcp_sockets[1])
            sessions.append(session)
        read_into(sessions[0], data)  # warm: its job run, the filter loaded
        for _ in range(100):
            await asyncio.sleep(0)
        gc.collect()
        tracemalloc.start()
        try:
            base = tracemalloc.get_traced_memory()[0]
            for session in sessions[1:]:
                read_into(session, data)
            time.sleep(0.2)  # the jobs run in the pool; the loop does not take their results
            gc.collect()
            held = tracemalloc.get_traced_memory()[0] - base
        finally:
            tracemalloc.stop()
        assert all(session.conn._jobs for session in sessions[1:])  # each request in its job
        for session in sessions:
            session.close("test over")
        return held // IN_JOBS

    per_connection = asyncio.run(main())
    assert per_connection < 3 * OWN_BUFFER < READ_SIZE, per_connection


def test_a_broker_that_never_answers_the_connect_ends_the_session_at_the_timeout(
    tcp_sockets: tuple[socket.socket, socket.socket], monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A dial that never completes (`_connect`'s timeout) ends the session as an
    unreachable broker, with its client connection closed."""
    from sluice.proxy.net import session as session_module

    monkeypatch.setattr(session_module, "_CONNECT_TIMEOUT", 0.05)
    closed: list[str] = []

    async def main() -> None:
        server = ProxyServer(ProxyConfig(listen=("127.0.0.1", 0), upstream=[("127.0.0.1", 1)]))
        loop = asyncio.get_running_loop()

        async def never(*args: Any, **kwargs: Any) -> Any:
            await asyncio.sleep(3600)

        monkeypatch.setattr(loop, "create_connection", never)
        monkeypatch.setattr(server, "session_closed",
                            lambda session, close: closed.append(close.reason))
        session: Any = server._new_session(lambda: ("127.0.0.1", 1), None)
        client = _Transport(sock=tcp_sockets[0])
        client.close = lambda: closed.append("client closed")  # type: ignore[attr-defined]
        session._client = client
        server.admit(session)
        session._set_up(client)
        started = time.monotonic()
        # Ended from inside its own task (`_end` cancels a connect still running): waited
        # for, not awaited.
        await asyncio.wait({session._connecting}, timeout=5)
        assert 0.04 <= time.monotonic() - started < 4
        assert session._ended and not session.opened

    asyncio.run(main())
    assert closed == ["client closed", "broker unreachable"]
