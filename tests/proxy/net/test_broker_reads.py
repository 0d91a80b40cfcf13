"""The broker's socket read into the connection's frame buffer (a buffered protocol,
`session._BrokerSide`; codec/frames.py `FrameBuffer.get_buffer`): through the real
`ProxyServer` and `Session`, on uvloop and on asyncio's own loop, responses of every size
(small ones several to a read, medium ones, ~1 MB ones read into their own buffer, one past
the reserve that must grow) sent by a fake broker in pieces cut anywhere reach the client as
the broker's bytes, in order; a size prefix over `max_frame_size` closes the connection.
"""

from __future__ import annotations

import asyncio
import random
import struct
from collections.abc import Callable, Coroutine
from typing import Any

import pytest
import uvloop

from sluice.codec import frames as frames_module
from sluice.codec.headers import request_header_bytes
from sluice.codec.messages import ApiKey
from sluice.proxy.ops.config import ProxyConfig
from tests.harness.ports import free_port_block
from tests.proxy.test_low_water import _proxy_before, _read_frame

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


async def _relay(seed: int) -> list[bool]:
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

    async with _proxy_before(broker, config):
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
