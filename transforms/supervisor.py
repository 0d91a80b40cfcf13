"""Starting and stopping every transform of a config: `sluice transform run` and `sluice serve`
both use `TransformSupervisor`.

Start-up checks everything before any thread starts: each chain loads (same module cache and
failure policies as the proxy's chain), each topic exists, and ``guarantee: auto`` is resolved
by asking the broker for a transactional producer id once.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from sluice.filters.chain import FilterChain
from sluice.proxy import telemetry
from sluice.proxy.telemetry.logs import log
from sluice.transforms.config import TransformSpec, with_security
from sluice.transforms.progress import TransformCollector, TransformStatus
from sluice.transforms.runner import (
    AT_LEAST_ONCE,
    EXACTLY_ONCE,
    TransformError,
    TransformRunner,
    broker_supports_transactions,
)

__all__ = ["TransformError", "TransformSupervisor"]


class TransformSupervisor:
    """The transforms of one config, each in its own thread."""

    def __init__(self, specs: Sequence[TransformSpec], bootstrap: str, *,
                 cache_dir: str | None = None, sink: telemetry.TelemetrySink | None = None,
                 info: telemetry.ProxyInfo | None = None,
                 session_timeout_ms: int = 6000,
                 security: Mapping[str, Any] | None = None) -> None:
        # The config's upstream_tls:/upstream_sasl: (proxy/net/kafka_settings.py) under each
        # transform's own client_config, which may override them.
        self.specs = [with_security(spec, security) for spec in specs]
        self.bootstrap = bootstrap
        self.cache_dir = cache_dir
        self.sink = sink
        self.info = info or telemetry.proxy_info()
        self.session_timeout_ms = session_timeout_ms
        self.runners: list[TransformRunner] = []

    def prepare(self, *, check_topics: bool = True) -> None:
        """Load chains, check topics and resolve guarantees; TransformError or
        FilterLoadError say what is wrong. Nothing runs yet.

        With `check_topics` False (`sluice serve`), a missing topic is not an error: the
        transform waits for it (state ``waiting``, logged once as ``transform_waiting``).
        """
        transactions: bool | None = None
        try:
            for spec in self.specs:
                guarantee = spec.guarantee
                if guarantee == "auto":
                    if transactions is None:
                        transactions = broker_supports_transactions(spec, self.bootstrap)
                    guarantee = EXACTLY_ONCE if transactions else AT_LEAST_ONCE
                chain = FilterChain.from_specs(spec.filters, self.cache_dir)
                runner = TransformRunner(spec, chain, self.bootstrap, guarantee, sink=self.sink,
                                         info=self.info,
                                         session_timeout_ms=self.session_timeout_ms)
                self.runners.append(runner)
                if check_topics:
                    runner.check_topics()
                for line in chain.describe():
                    log.info("transform_filter_loaded", transform=spec.name, **line)
        except BaseException:
            self.close_chains()
            raise

    def start(self) -> None:
        for runner in self.runners:
            runner.start()

    def statuses(self) -> list[TransformStatus]:
        return [r.status for r in self.runners]

    def collector(self) -> TransformCollector:
        return TransformCollector(self.statuses)

    def stop(self, timeout: float = 30.0) -> None:
        for runner in self.runners:
            runner.request_stop()
        for runner in self.runners:
            runner.stop(timeout)
        self.close_chains()

    def close_chains(self) -> None:
        for runner in self.runners:
            runner.chain.close()
        self.runners = []
