"""The proxy's runtime configuration: command-line flags merged with the YAML config file."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sluice.codec.batch_limits import BatchLimits
from sluice.codec.frames import DEFAULT_MAX_FRAME_SIZE
from sluice.proxy.ops.quotas import QuotaSettings

if TYPE_CHECKING:
    from sluice.proxy.net.tls import ServerTLS, UpstreamTLS
    from sluice.proxy.net.upstream_sasl import UpstreamSasl

#: dead_letters.max_queued_bytes when the config file does not say.
DEFAULT_DEAD_LETTER_QUEUE_BYTES = 64 * 1024 * 1024
#: dead_letters.shutdown_timeout_seconds when the config file does not say.
DEFAULT_DEAD_LETTER_SHUTDOWN_TIMEOUT = 5.0
#: proxy.filtered_fetch_max_bytes when the config file does not say (docs/PERFORMANCE.md,
#: *Why filtered fetch lags most*).
DEFAULT_FILTERED_FETCH_MAX_BYTES = 8 * 1024 * 1024


class ConfigFileError(ValueError):
    """A problem in the config file; the message names the file, line and field."""


@dataclass(frozen=True)
class DeadLetterSettings:
    """Section `dead_letters:`: how much may wait for the broker, and for how long at exit."""

    max_queued_bytes: int = DEFAULT_DEAD_LETTER_QUEUE_BYTES
    shutdown_timeout: float = DEFAULT_DEAD_LETTER_SHUTDOWN_TIMEOUT


@dataclass
class ProxyConfig:
    listen: tuple[str, int]
    upstream: list[tuple[str, int]]
    advertised_host: str | None = None
    node_ports: dict[int, int] = field(default_factory=dict)
    max_frame_size: int = DEFAULT_MAX_FRAME_SIZE
    filters: list[Any] = field(default_factory=list)
    transforms: list[Any] = field(default_factory=list)  # sluice.transforms.config specs
    telemetry: dict[str, Any] = field(default_factory=dict)
    metrics: dict[str, Any] = field(default_factory=dict)
    module_cache_dir: str | None = None
    tls: ServerTLS | None = None  # towards clients (section `tls:`)
    upstream_tls: UpstreamTLS | None = None  # towards brokers (section `upstream_tls:`)
    # The proxy's own connections to the brokers (section `upstream_sasl:`).
    upstream_sasl: UpstreamSasl | None = None
    dead_letters: DeadLetterSettings = field(default_factory=DeadLetterSettings)
    max_connections: int = 0  # limits.max_connections, per worker; 0 = unlimited
    idle_timeout: float = 0  # limits.idle_timeout_seconds; 0 = never
    job_deadline: float = 20.0  # limits.job_deadline_seconds
    # limits.max_batch_bytes / _records / _headers: what one filtered batch may expand into
    batch_limits: BatchLimits = field(default_factory=BatchLimits)
    quotas: QuotaSettings = field(default_factory=QuotaSettings)  # section `quotas:`
    metrics_listen: tuple[str, int] | None = None  # metrics.listen
    workers: int = 1  # `--workers N`: processes sharing the ports (SO_REUSEPORT)
    # proxy.filter_threads: threads that run filters off the event loop (0 = on the loop)
    filter_threads: int = 2
    # proxy.spread_fetch: a large Fetch response's partitions on several filter threads at once
    # (stateless filters only; filters/parallel.py)
    spread_fetch: bool = True
    # proxy.spread_produce: a connection's pipelined Produce requests filtered on several filter
    # threads at once, forwarded in order (stateless filters only; net/connection.py)
    spread_produce: bool = True
    # proxy.filtered_fetch_max_bytes: while a fetch filter is in force, a Fetch request asking
    # for more (its max_bytes) asks for this much (0: as the client asks; paths/fetch.py)
    filtered_fetch_max_bytes: int = DEFAULT_FILTERED_FETCH_MAX_BYTES
    node_port_table: str | None = None  # the workers' shared node -> port file (net/node_ports.py)
    worker_index: int = 0  # which of them this process is
    # policy_admins: principal globs allowed to set x-data-policy (None: nobody)
    policy_admins: tuple[str, ...] | None = None
    # security.operators: principals that may reach the proxy's own topics through it
    operators: frozenset[str] = frozenset()
    # security.internal_topics: topics protected like the proxy's own (ops/security.py)
    internal_topics: tuple[str, ...] = ()
    raw: dict[str, Any] = field(default_factory=dict)
    path: Path | None = None

    @property
    def advertised(self) -> str:
        if self.advertised_host:
            return self.advertised_host
        host = self.listen[0]
        return "127.0.0.1" if host in ("", "0.0.0.0", "::") else host
