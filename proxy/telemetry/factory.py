"""Building the telemetry sink that the proxy config's ``telemetry:`` section asks for.

Separate from ``telemetry_sinks`` because the columnar sinks (``telemetry_parquet``,
``telemetry_kafka_arrow``) build on the queue machinery there: the factory imports them all,
and none of them imports the factory.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import structlog

from sluice.proxy.telemetry.events import ProxyInfo, proxy_info
from sluice.proxy.telemetry.kafka_arrow import ArrowKafkaSink
from sluice.proxy.telemetry.parquet import ParquetSink
from sluice.proxy.telemetry.sinks import (
    FileSink,
    KafkaSink,
    NullSink,
    TeeSink,
    TelemetrySink,
    parse_telemetry_config,
)

log = structlog.get_logger("sluice.telemetry")


def make_sink(
    telemetry_config: Mapping[str, Any] | None,
    instance_id: str,
    *,
    proxy: ProxyInfo | None = None,
    security: Mapping[str, Any] | None = None,
) -> TelemetrySink:
    """Build the sink the proxy config's ``telemetry:`` section asks for.

    ``{dir: PATH}`` selects Parquet datasets (``format: jsonl`` JSON Lines files);
    ``{kafka: {bootstrap, topic}}`` a Kafka topic of Arrow IPC batches (``format: json`` one
    JSON message per event); both together write to both; ``None``/``{}``/``{enabled: false}``
    is a ``NullSink``. Raises ``TelemetryConfigError`` naming the offending field.
    ``security``: librdkafka settings of the config's ``upstream_tls:``/``upstream_sasl:``
    (proxy/net/kafka_settings.py) for the Kafka sinks; ``telemetry.kafka.producer_config``
    may override them (a telemetry cluster other than the proxied one).
    """
    settings = parse_telemetry_config(telemetry_config)
    if not settings.enabled:
        return NullSink()
    tagger = settings.tagger()
    info = proxy or proxy_info(instance_id)
    sinks: list[TelemetrySink] = []
    if settings.directory is not None:
        if settings.file_format == "parquet":
            sinks.append(
                ParquetSink(
                    info,
                    settings.directory,
                    rotate_bytes=settings.rotate_bytes,
                    rotate_seconds=settings.rotate_seconds,
                    flush_seconds=settings.flush_seconds,
                    queue_size=settings.queue_size,
                    fsync=settings.fsync,
                    tagger=tagger,
                )
            )
        else:
            sinks.append(
                FileSink(
                    info,
                    settings.directory,
                    rotate_bytes=settings.rotate_bytes,
                    rotate_seconds=settings.rotate_seconds,
                    queue_size=settings.queue_size,
                    fsync=settings.fsync,
                    tagger=tagger,
                )
            )
    if settings.kafka_topic is not None and settings.kafka_bootstrap is not None:
        kafka_args: dict[str, Any] = {
            "queue_size": settings.queue_size,
            "producer_config": {**(security or {}), **(settings.kafka_config or {})},
            "create_partitions": settings.create_partitions,
            "message_timeout_ms": settings.message_timeout_ms,
            "tagger": tagger,
        }
        if settings.kafka_format == "arrow":
            sinks.append(
                ArrowKafkaSink(
                    info,
                    settings.kafka_bootstrap,
                    settings.kafka_topic,
                    flush_seconds=settings.flush_seconds,
                    **kafka_args,
                )
            )
        else:
            sinks.append(
                KafkaSink(info, settings.kafka_bootstrap, settings.kafka_topic, **kafka_args)
            )
    if not sinks:
        return NullSink()
    if tagger is None:
        log.warning("telemetry is not authenticated: telemetry.key_file is not set, so the "
                    "audit cannot tell this proxy's telemetry from rows anyone wrote "
                    "(docs/SECURITY.md, Audit integrity)")
    else:
        log.info("telemetry authenticated", key_id=tagger.key.key_id)
    if len(sinks) == 1:
        return sinks[0]
    return TeeSink(sinks)
