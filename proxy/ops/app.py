"""Running the proxy: event loop set-up, the filter chain and telemetry sink, signals, and the
`listening` line."""

from __future__ import annotations

import asyncio
import gc
import signal

import uvloop

from sluice.filters.chain import FilterChain
from sluice.filters.runtime import FilterLoadError
from sluice.filters.yaml_lines import ConfigError
from sluice.proxy import telemetry
from sluice.proxy.net.kafka_settings import cluster_settings
from sluice.proxy.net.server import ProxyServer
from sluice.proxy.ops import warmup
from sluice.proxy.ops.allocator import keep_batch_buffers
from sluice.proxy.ops.config import ConfigFileError, ProxyConfig
from sluice.proxy.ops.gc_pauses import GcPauses, freeze_startup_heap
from sluice.proxy.ops.readiness import notify_ready
from sluice.proxy.ops.reload import ChainManager, build_chain, locate_telemetry_error
from sluice.proxy.telemetry.logs import log
from sluice.proxy.telemetry.metrics import MetricsServer
from sluice.transforms.supervisor import TransformError, TransformSupervisor


def load_chain(config: ProxyConfig) -> FilterChain | None:
    try:
        return build_chain(config.filters, config.module_cache_dir)
    except ConfigError as exc:
        raise ConfigFileError(str(exc)) from None


async def serve(config: ProxyConfig, ready_fd: int | None = None) -> int:
    # Before the first batch: filtered batches reuse heap memory (allocator.py).
    keep_batch_buffers()
    chain = load_chain(config)
    server = ProxyServer(config)
    metrics_server = None
    if config.metrics_listen is not None:
        # Worker k of `--workers N` serves its own metrics on the configured port + k.
        m_host, m_port = config.metrics_listen
        m_port = m_port + config.worker_index if m_port else 0
        metrics_server = MetricsServer(server.metrics, m_host, m_port)
        await metrics_server.start()
    try:
        server.telemetry = telemetry.make_sink(
            config.telemetry, server.instance_id, proxy=server.proxy_info,
            security=cluster_settings(config),
        )
    except telemetry.TelemetryConfigError as exc:
        raise ConfigFileError(str(locate_telemetry_error(config.path, exc))) from None
    server.install_chain(chain)
    transforms = None
    if config.transforms and config.worker_index == 0:
        # Only worker 0 runs them: more members of one group would add nothing but joins.
        transforms = TransformSupervisor(
            config.transforms, ",".join(f"{h}:{p}" for h, p in config.upstream),
            cache_dir=config.module_cache_dir, sink=server.telemetry, info=server.proxy_info,
            security=cluster_settings(config))
        try:
            await asyncio.to_thread(transforms.prepare, check_topics=False)
        except (TransformError, FilterLoadError) as exc:
            raise ConfigFileError(f"transforms: {exc}") from None
        if metrics_server is not None:
            metrics_server.registry.register(transforms.collector())
        transforms.start()
    if chain is not None:
        for line in chain.describe():
            log.info("filter_loaded", **line)
    # Before the listeners open, so the first client already meets the fleet's filters.
    chains = ChainManager(server, config)
    await chains.start()
    await server.start()
    # Everything built at start-up lives as long as the process: keep it out of the
    # collector's walks (a full collection of it paused the loop for 14-25 ms; see
    # gc_pauses.py). The codec's hot schemas, prepared next in small steps on the loop
    # (warmup.py), are frozen too when they are done: a plain freeze, without the full
    # collection, which by then could pause clients' traffic.
    loop = asyncio.get_running_loop()
    startup = {"frozen": freeze_startup_heap(), "schemas": 0}

    def warmed(schemas: int) -> None:
        gc.freeze()
        startup["schemas"] = schemas
        startup["frozen"] = gc.get_freeze_count()
        log.info("codec_warmed", schemas=schemas, frozen=startup["frozen"])

    warming = loop.create_task(warmup.warm(warmed))
    gc_pauses = GcPauses()
    gc_pauses.install()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    host, port = config.listen
    upstream = ",".join(f"{h}:{p}" for h, p in config.upstream)
    if ready_fd is None:
        log.info(
            "listening", listen=f"{host}:{port}", upstream=upstream, instance=server.instance_id
        )
    else:
        notify_ready(ready_fd, config.worker_index, server.instance_id)
    await stop.wait()
    log.info("stopping", connections=len(server.sessions))
    warming.cancel()
    gc_pauses.uninstall()
    log.info("gc_pauses", frozen=startup["frozen"], warmed_schemas=startup["schemas"],
             **gc_pauses.summary())
    await chains.stop()
    if transforms is not None:
        await asyncio.to_thread(transforms.stop)
    await server.close()
    if metrics_server is not None:
        await metrics_server.close()
    server.telemetry.close(timeout=5)
    return 0


def run(config: ProxyConfig, ready_fd: int | None = None) -> int:
    return uvloop.run(serve(config, ready_fd))
