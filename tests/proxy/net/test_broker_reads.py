"""The broker's socket read into the connection's frame buffer (a buffered protocol,
`session._BrokerSide`; codec/frames.py `FrameBuffer.get_buffer`): through the real
`ProxyServer` and `Session`, on uvloop and on asyncio's own loop, responses of every size
(small ones several to a read, medium ones, ~1 MB ones read into their own buffer, one past
the reserve that must grow) sent by a fake broker in pieces cut anywhere reach the client as
the broker's bytes, in order, over plain TCP and over TLS to the broker (the loop's TLS layer
then drives the buffered protocol); a size prefix over `max_frame_size` closes the connection.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import ssl
import struct
from collections.abc import AsyncIterator, Callable, Coroutine
from pathlib import Path
from typing import Any

import pytest
import uvloop

from sluice.codec import frames as frames_module
from sluice.codec.headers import request_header_bytes
from sluice.codec.messages import ApiKey
from sluice.proxy.net.server import ProxyServer
from sluice.proxy.net.tls import UpstreamTLS
from sluice.proxy.ops.config import ProxyConfig
from tests.harness.ports import free_port_block
from tests.proxy.test_low_water import _proxy_before, _read_frame
from tests.proxy.tls_certs import Pki, make_pki

VERSION = 4  # Heartbeat: no path inspects it, so it is relayed as its bytes
#: The reserve for a frame in assembly, lowered here so that a response past it stays small.
RESERVE = 2 << 20
#: Response sizes (bytes after the correlation id): small, medium, ~1 MB, past the reserve.
SIZES = [0, 7, 300, 40_000, 1_050_000, 3, 250_000, RESERVE + 100_000, 12]


def _request(correlation_id: int) -> bytes:
    body = request_header_bytes(ApiKey.HEARTBEAT, VERSION, correlation_id, "t")
    return struct.pack(">i", len(body)) + body


def _response(correlation_id: int, extra: int) -> bytes:
    rnd = random.Random(correlation_id)
    body = struct.pack(">i", correlation_id) + rnd.randbytes(extra)
    return struct.pack(">i", len(body)) + body


def _run(main: Callable[[], Coroutine[Any, Any, Any]], loop: str) -> Any:
    return uvloop.run(main()) if loop == "uvloop" else asyncio.run(main())


@contextlib.asynccontextmanager
async def _proxy_before_tls(broker: Any, config: ProxyConfig, pki: Pki) -> AsyncIterator[None]:
    """As `_proxy_before`, the fake broker speaking TLS and the proxy trusting its CA: the
    event loop's TLS layer then drives the buffered protocol (get_buffer, buffer_updated)."""
    server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_ctx.load_cert_chain(pki.server_cert, pki.server_key)
    fake = await asyncio.start_server(broker, "127.0.0.1", 0, ssl=server_ctx)
    config.upstream = [("127.0.0.1", fake.sockets[0].getsockname()[1])]
    config.upstream_tls = UpstreamTLS(ca=pki.ca)
    server = ProxyServer(config)
    await server.start()
    try:
        yield
    finally:
        await server.close()
        fake.close()


async def _relay(seed: int, pki: Pki | None = None) -> list[bool]:
    config = ProxyConfig(listen=("127.0.0.1", free_port_block(9)), upstream=[])
    responses = [_response(cid, extra) for cid, extra in enumerate(SIZES, 1)]

    async def broker(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        for _ in SIZES:
            await _read_frame(reader)
        # All the responses back to back, cut at random places, a pause after some pieces.
        stream = b"".join(responses)
        rnd = random.Random(seed)
        at = 0
        while at < len(stream):
            step = rnd.choice((1, 3, 4, 5, 1000, 65_536, 300_000, 2_000_000))
            writer.write(stream[at : at + step])
            at += step
            await writer.drain()
            if rnd.random() < 0.3:
                await asyncio.sleep(0.002)
        await reader.read()
        writer.close()

    proxy = _proxy_before(broker, config) if pki is None else _proxy_before_tls(broker, config, pki)
    async with proxy:
        reader, writer = await asyncio.open_connection(*config.listen)
        for cid in range(1, len(SIZES) + 1):
            writer.write(_request(cid))
        await writer.drain()
        got = [await asyncio.wait_for(_read_frame(reader), 30) for _ in SIZES]
        writer.close()
    return [frame == response[4:] for frame, response in zip(got, responses, strict=True)]


@pytest.mark.serial
@pytest.mark.parametrize("loop", ["uvloop", "asyncio"])
@pytest.mark.parametrize("seed", [1, 2])
def test_responses_cut_anywhere_reach_the_client_as_sent(
    loop: str, seed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(frames_module, "RESERVE", RESERVE)
    assert _run(lambda: _relay(seed), loop) == [True] * len(SIZES)


@pytest.mark.serial
@pytest.mark.parametrize("loop", ["uvloop", "asyncio"])
def test_responses_cut_anywhere_reach_the_client_over_tls_to_the_broker(
    loop: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(frames_module, "RESERVE", RESERVE)
    pki = make_pki(tmp_path / "pki")
    assert _run(lambda: _relay(1, pki), loop) == [True] * len(SIZES)


async def _oversize() -> bytes:
    config = ProxyConfig(listen=("127.0.0.1", free_port_block(9)), upstream=[],
                         max_frame_size=100_000)

    async def broker(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _read_frame(reader)
        writer.write(struct.pack(">ii", 100_001, 1) + bytes(1000))
        await writer.drain()
        await reader.read()
        writer.close()

    async with _proxy_before(broker, config):
        reader, writer = await asyncio.open_connection(*config.listen)
        writer.write(_request(1))
        await writer.drain()
        rest = await asyncio.wait_for(reader.read(), 10)  # the proxy closes: end of stream
        writer.close()
    return rest


@pytest.mark.parametrize("loop", ["uvloop", "asyncio"])
def test_a_response_over_the_frame_size_closes_the_connection(loop: str) -> None:
    assert _run(_oversize, loop) == b""
