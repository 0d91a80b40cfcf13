"""The proxy's runtime configuration: command-line flags merged with the YAML config file."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sluice.codec.frames import DEFAULT_MAX_FRAME_SIZE

if TYPE_CHECKING:
    from sluice.proxy.net.tls import ServerTLS, UpstreamTLS


class ConfigFileError(ValueError):
    """A problem in the config file; the message names the file, line and field."""


@dataclass
class ProxyConfig:
    listen: tuple[str, int]
    upstream: list[tuple[str, int]]
    advertised_host: str | None = None
    node_ports: dict[int, int] = field(default_factory=dict)
    max_frame_size: int = DEFAULT_MAX_FRAME_SIZE
    filters: list[Any] = field(default_factory=list)
    telemetry: dict[str, Any] = field(default_factory=dict)
    metrics: dict[str, Any] = field(default_factory=dict)
    module_cache_dir: str | None = None
    tls: ServerTLS | None = None  # towards clients (section `tls:`)
    upstream_tls: UpstreamTLS | None = None  # towards brokers (section `upstream_tls:`)
    max_connections: int = 0  # limits.max_connections, per worker; 0 = unlimited
    idle_timeout: float = 0  # limits.idle_timeout_seconds; 0 = never
    metrics_listen: tuple[str, int] | None = None  # metrics.listen
    workers: int = 1  # `--workers N`: processes sharing the ports (SO_REUSEPORT)
    # proxy.filter_threads: threads that run filters off the event loop (0 = on the loop)
    filter_threads: int = 2
    node_port_table: str | None = None  # the workers' shared node -> port file (addresses.py)
    worker_index: int = 0  # which of them this process is
    raw: dict[str, Any] = field(default_factory=dict)
    path: Path | None = None

    @property
    def advertised(self) -> str:
        if self.advertised_host:
            return self.advertised_host
        host = self.listen[0]
        return "127.0.0.1" if host in ("", "0.0.0.0", "::") else host
