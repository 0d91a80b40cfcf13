"""Both sockets of a session send small frames at once: TCP_NODELAY on the client side and on
the upstream side, with and without TLS.

Nagle's algorithm holding a small response until the peer's delayed ACK costs ~40 ms per
hit, exactly the tail the latency target forbids. uvloop sets TCP_NODELAY on TCP transports it
creates and the proxy sets it on accepted client sockets; these tests pin the outcome on the
proxy's real event loop, whatever transport set-up changes later.
"""

from __future__ import annotations

import asyncio
import socket
import ssl
from pathlib import Path
from typing import Any

import pytest
import uvloop

from sluice.proxy.net.server import ProxyServer
from sluice.proxy.net.session import Session
from sluice.proxy.net.tls import ServerTLS, UpstreamTLS
from sluice.proxy.ops.config import ProxyConfig
from tests.harness.ports import free_port_block
from tests.proxy.tls_certs import make_pki


def _nodelay(transport: asyncio.BaseTransport | None) -> int:
    assert transport is not None
    sock: Any = transport.get_extra_info("socket")
    assert sock is not None
    return int(sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))


async def _session_sockets(tls_dir: Path | None) -> tuple[int, int]:
    """(client-side, upstream-side) TCP_NODELAY of the one session a client opens."""
    upstream_ssl: ssl.SSLContext | None = None
    client_ssl: ssl.SSLContext | None = None
    config = ProxyConfig(listen=("127.0.0.1", free_port_block(9)), upstream=[])
    if tls_dir is not None:
        pki = make_pki(tls_dir)
        config.tls = ServerTLS(cert=pki.server_cert, key=pki.server_key)
        config.upstream_tls = UpstreamTLS(ca=pki.ca)
        upstream_ssl = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        upstream_ssl.load_cert_chain(pki.server_cert, pki.server_key)
        client_ssl = ssl.create_default_context(cafile=str(pki.ca))
    accepted = asyncio.Event()

    async def broker(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        accepted.set()
        await reader.read()  # hold the connection until the proxy closes it
        writer.close()

    fake = await asyncio.start_server(broker, "127.0.0.1", 0, ssl=upstream_ssl)
    config.upstream = [("127.0.0.1", fake.sockets[0].getsockname()[1])]
    server = ProxyServer(config)
    await server.start()
    try:
        _r, w = await asyncio.open_connection(*config.listen, ssl=client_ssl)
        await asyncio.wait_for(accepted.wait(), 10)
        for _ in range(200):  # the session registers once its upstream connection is up
            if server.sessions:
                break
            await asyncio.sleep(0.01)
        (session,) = server.sessions
        assert isinstance(session, Session)
        result = (_nodelay(session._client), _nodelay(session._broker))
        w.close()
        return result
    finally:
        await server.close()
        fake.close()


@pytest.mark.parametrize("tls", [False, True], ids=["plain", "tls"])
def test_client_and_upstream_sockets_have_tcp_nodelay(tls: bool, tmp_path: Path) -> None:
    client_side, upstream_side = uvloop.run(_session_sockets(tmp_path if tls else None))
    assert client_side == 1, "client-side socket without TCP_NODELAY"
    assert upstream_side == 1, "upstream socket without TCP_NODELAY"
