"""The PathContext a `sluice serve` with a given config file would give its paths (chain 1),
for tests of proxy settings that reach the paths; no sockets, the filter pool shut down."""

from __future__ import annotations

from pathlib import Path

from sluice.proxy.net.server import ProxyServer
from sluice.proxy.ops.config import ProxyConfig
from sluice.proxy.ops.config_load import load_config_file
from sluice.proxy.paths.base import PathContext


def server_of(tmp_path: Path, text: str) -> ProxyServer:
    """A server built from `text` as sluice.yaml (the caller shuts its executor down)."""
    path = tmp_path / "sluice.yaml"
    path.write_text(text, encoding="utf-8")
    config = load_config_file(path, ProxyConfig(listen=("127.0.0.1", 0),
                                                upstream=[("127.0.0.1", 1)]))
    return ProxyServer(config)


def context_of(tmp_path: Path, text: str) -> PathContext:
    """The server's context for chain generation 1."""
    server = server_of(tmp_path, text)
    try:
        return server._context(1)
    finally:
        if server.executor is not None:
            server.executor.shutdown()
