"""A large frame wakes the proxy once, not once per segment; a small frame after it is read at
once; TLS sockets keep the default mark (proxy/net/low_water.py).

On the proxy's real event loop (uvloop, the real `ProxyServer` and `Session`) against a fake
broker: the client sends a 400 KB request in 20 pieces with pauses between them, the broker
answers it the same way, and the test counts the reads the session was handed on each side.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import ssl
import struct
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import uvloop

from sluice.codec.headers import request_header_bytes
from sluice.codec.messages import ApiKey
from sluice.proxy.net import low_water
from sluice.proxy.net.server import ProxyServer
from sluice.proxy.net.session import Session
from sluice.proxy.net.tls import ServerTLS
from sluice.proxy.ops.config import ProxyConfig
from tests.harness.ports import free_port_block
from tests.proxy.tls_certs import make_pki

LARGE = 400_000
PIECES = 20
VERSION = 4  # Heartbeat: no path inspects it, so it is relayed as its bytes


def _request(correlation_id: int, extra: int) -> bytes:
    body = request_header_bytes(ApiKey.HEARTBEAT, VERSION, correlation_id, "t") + bytes(extra)
    return struct.pack(">i", len(body)) + body


def _response(correlation_id: int, extra: int) -> bytes:
    body = struct.pack(">i", correlation_id) + bytes(range(256)) * (extra // 256)
    return struct.pack(">i", len(body)) + body


async def _in_pieces(write: Any, drain: Any, data: bytes) -> None:
    step = len(data) // PIECES + 1
    for at in range(0, len(data), step):
        write(data[at : at + step])
        await drain()
        await asyncio.sleep(0.01)


async def _read_frame(reader: asyncio.StreamReader) -> bytes:
    size = struct.unpack(">i", await reader.readexactly(4))[0]
    return await reader.readexactly(size)


def _config() -> ProxyConfig:
    return ProxyConfig(listen=("127.0.0.1", free_port_block(9)), upstream=[])


@contextlib.asynccontextmanager
async def _proxy_before(broker: Any, config: ProxyConfig) -> AsyncIterator[ProxyServer]:
    """The real `ProxyServer` of `config` started in front of a fake broker served by
    `broker`; both closed on the way out."""
    fake = await asyncio.start_server(broker, "127.0.0.1", 0)
    config.upstream = [("127.0.0.1", fake.sockets[0].getsockname()[1])]
    server = ProxyServer(config)
    await server.start()
    try:
        yield server
    finally:
        await server.close()
        fake.close()


async def _start_large_request(
    config: ProxyConfig, client_ssl: ssl.SSLContext | None = None
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter, bytes]:
    """A client of the proxy that has sent the first 20 000 bytes of a large request: its
    reader, writer and the whole request."""
    reader, writer = await asyncio.open_connection(*config.listen, ssl=client_ssl)
    request = _request(1, LARGE)
    writer.write(request[:20_000])
    await writer.drain()
    return reader, writer, request


async def _exchange(tls_dir: Path | None, counts: dict[str, int]) -> dict[str, Any]:
    config = _config()
    client_ssl: ssl.SSLContext | None = None
    if tls_dir is not None:
        pki = make_pki(tls_dir)
        config.tls = ServerTLS(cert=pki.server_cert, key=pki.server_key)
        client_ssl = ssl.create_default_context(cafile=str(pki.ca))
    seen: dict[str, Any] = {}

    async def broker(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        large = await _read_frame(reader)
        seen["large request"] = len(large)
        await _in_pieces(writer.write, writer.drain, _response(1, LARGE))
        small = await _read_frame(reader)
        seen["small request"] = len(small)
        writer.write(_response(2, 0))
        await writer.drain()
        await reader.read()
        writer.close()

    async with _proxy_before(broker, config) as server:
        # The first piece alone, then the session's mark while the rest is missing.
        reader, writer, request = await _start_large_request(config, client_ssl)
        for _ in range(500):
            if server.sessions and counts["client"]:
                break
            await asyncio.sleep(0.01)
        (session,) = server.sessions
        assert isinstance(session, Session)
        client_mark = session._client_mark
        seen["mark"] = 1 if client_mark is None else client_mark.mark
        sock: Any = session._client.get_extra_info("socket")  # type: ignore[union-attr]
        seen["socket mark"] = sock.getsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT)
        before = dict(counts)
        await _in_pieces(writer.write, writer.drain, request[20_000:])
        large = await asyncio.wait_for(_read_frame(reader), 20)
        seen["client reads"] = counts["client"] - before["client"]
        seen["broker reads"] = counts["broker"] - before["broker"]
        seen["large response"] = large == _response(1, LARGE)[4:]
        # A small request right after: read at once (the mark went back to 1).
        writer.write(_request(2, 0))
        await writer.drain()
        small = await asyncio.wait_for(_read_frame(reader), 5)
        seen["small response"] = small == _response(2, 0)[4:]
        seen["mark after"] = 1 if client_mark is None else client_mark.mark
        seen["has mark"] = client_mark is not None
        writer.close()
        return seen


def _run(tls_dir: Path | None, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    counts = {"client": 0, "broker": 0}
    # Each side's reads as the event loop hands them over: both sockets are buffered
    # protocols, so a client read is a `buffer_updated` (`data_received` only takes the
    # reads made before the broker connection is up, round 43, and counted nothing after).
    client_read, broker_read = Session.buffer_updated, Session.broker_data

    def count_client(self: Session, nbytes: int) -> None:
        counts["client"] += 1
        client_read(self, nbytes)

    def count_broker(self: Session, data: bytes) -> None:
        counts["broker"] += 1
        broker_read(self, data)

    monkeypatch.setattr(Session, "buffer_updated", count_client)
    monkeypatch.setattr(Session, "broker_data", count_broker)
    return uvloop.run(_exchange(tls_dir, counts))


@pytest.mark.serial
def test_a_large_frame_wakes_the_proxy_once_per_side(monkeypatch: pytest.MonkeyPatch) -> None:
    seen = _run(None, monkeypatch)
    header = len(request_header_bytes(ApiKey.HEARTBEAT, VERSION, 1, "t"))
    assert seen["large request"] == header + LARGE
    assert seen["large response"] and seen["small response"]
    missing = header + LARGE - (20_000 - 4)
    assert seen["mark"] == seen["socket mark"] == min(missing, low_water.MAX_MARK)
    # 19 more pieces sent 10 ms apart: without the mark, about one read each. With it, the
    # pieces that came before the mark was set, then what uvloop reads at once (256 KB a read).
    assert seen["client reads"] <= 5, seen
    assert seen["broker reads"] <= 5, seen
    assert seen["mark after"] == 1 and seen["has mark"]


def test_tls_sockets_keep_the_default_mark(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen = _run(tmp_path, monkeypatch)
    assert seen["large response"] and seen["small response"]
    assert seen["mark"] == seen["socket mark"] == 1
    assert not seen["has mark"]  # no call per read at all


def test_no_mark_for_small_remainders() -> None:
    class _Transport:
        def __init__(self, sock: socket.socket) -> None:
            self.sock = sock

        def get_extra_info(self, key: str) -> Any:
            return self.sock if key == "socket" else None

    listener = socket.create_server(("127.0.0.1", 0))
    try:
        with socket.create_connection(listener.getsockname()) as sock:
            mark = low_water.LowWater(_Transport(sock))
            mark.wait_for(low_water.MIN_MARK - 1)
            assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT) == mark.mark == 1
            mark.wait_for(50_000)
            assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT) == mark.mark == 50_000
            mark.wait_for(60_000)  # more missing than the mark (cannot happen in a frame): kept
            assert mark.mark == 50_000
            mark.wait_for(40_000)  # fewer missing than the mark: lowered
            assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT) == mark.mark == 40_000
            mark.wait_for(0)
            mark.wait_for(10 * low_water.MAX_MARK)
            assert mark.mark == low_water.MAX_MARK
            mark.wait_for(5 * low_water.MAX_MARK)  # still no more than what must come: kept
            assert mark.mark == low_water.MAX_MARK
            mark.wait_for(0)
            assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT) == mark.mark == 1
    finally:
        listener.close()


async def _trickle_past_idle_timeout() -> dict[str, Any]:
    """A client sends a large request steadily but slowly: fewer bytes per idle timeout than
    the mark, so the proxy makes no read for longer than the timeout."""
    config = _config()
    config.idle_timeout = 1.0
    seen: dict[str, Any] = {}

    async def broker(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        seen["large request"] = len(await _read_frame(reader))
        writer.write(_response(1, 0))
        await writer.drain()
        await reader.read()
        writer.close()

    async with _proxy_before(broker, config) as server:
        reader, writer, request = await _start_large_request(config)
        # 3 s of 4 KB every 0.1 s (120 KB, below the mark): bytes move all the time
        at = 20_000
        try:
            for _ in range(30):
                writer.write(request[at : at + 4_000])
                await writer.drain()
                at += 4_000
                await asyncio.sleep(0.1)
            writer.write(request[at:])
            await writer.drain()
            response = await asyncio.wait_for(_read_frame(reader), 5)
            seen["response"] = response == _response(1, 0)[4:]
        except (asyncio.IncompleteReadError, ConnectionError, RuntimeError):
            seen["response"] = False  # closed under the client (uvloop: RuntimeError)
        seen["idle closed"] = server.metrics.connections_idle_closed
        writer.close()
        return seen


async def _stall_under_the_mark() -> int:
    """A client starts a large request, sends a little more (held under the mark), then stops:
    the idle timeout still closes it. Returns the idle closes counted."""
    config = _config()
    config.idle_timeout = 0.5

    async def broker(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read()
        writer.close()

    async with _proxy_before(broker, config) as server:
        reader, writer, request = await _start_large_request(config)
        await asyncio.sleep(0.2)
        writer.write(request[20_000:30_000])  # waits in the kernel: below the mark
        await writer.drain()
        try:  # closed with unread bytes: a reset, not an orderly end
            assert await asyncio.wait_for(reader.read(), 5) == b""
        except ConnectionResetError:
            pass
        writer.close()
        return server.metrics.connections_idle_closed


@pytest.mark.serial
def test_idle_timeout_counts_the_bytes_held_under_the_mark() -> None:
    """limits.idle_timeout_seconds closes a connection that moved no byte: bytes the client
    sent that wait in the kernel under the mark are bytes moved, so a slow but steady sender
    of a large frame stays; one that stops is still closed."""
    seen = uvloop.run(_trickle_past_idle_timeout())
    assert seen["idle closed"] == 0 and seen["response"], seen
    assert uvloop.run(_stall_under_the_mark()) == 1
