"""Running the proxy: event loop set-up, signal handling, the `listening` line."""

from __future__ import annotations

import asyncio
import signal

import uvloop
from sluice.proxy.config import ProxyConfig
from sluice.proxy.logs import log
from sluice.proxy.server import ProxyServer


async def serve(config: ProxyConfig) -> int:
    server = ProxyServer(config)
    await server.start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    host, port = config.listen
    upstream = ",".join(f"{h}:{p}" for h, p in config.upstream)
    log.info("listening", listen=f"{host}:{port}", upstream=upstream, instance=server.instance_id)
    await stop.wait()
    log.info("stopping", connections=len(server.sessions))
    await server.close()
    return 0


def run(config: ProxyConfig) -> int:
    return uvloop.run(serve(config))
