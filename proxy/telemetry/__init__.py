"""Telemetry API for the proxy: event builders and sinks in one import.

The proxy does::

    from sluice.proxy import telemetry
    info = telemetry.proxy_info()                      # host, pid, new instance id
    sink = telemetry.make_sink(config.get("telemetry"), info.instance_id, proxy=info)
    sink.emit(telemetry.record_batch_event(info, ...))  # never blocks
    ...
    sink.close(timeout=5)

The schema is documented in docs/TELEMETRY.md; the builders live in
``telemetry_events``, the sinks in ``telemetry_sinks`` (JSON), ``telemetry_parquet`` and
``telemetry_kafka_arrow`` (columnar, layout in ``telemetry_columns``), and ``make_sink`` in
``telemetry_factory``.
"""

from __future__ import annotations

from sluice.proxy.telemetry.events import (
    MAX_TEXT,
    SCHEMA_VERSION,
    AdminDecision,
    Api,
    ApiCounters,
    ConnectionPhase,
    EventType,
    FilterStatsLike,
    ProxyInfo,
    admin_event,
    connection_event,
    filter_entries,
    filter_entry,
    filter_loaded_event,
    iso_time,
    new_instance_id,
    now_ms,
    produce_offsets,
    proxy_info,
    record_batch_event,
    reject_reason_counts,
    telemetry_dropped_event,
    transform_batch_event,
)
from sluice.proxy.telemetry.factory import make_sink
from sluice.proxy.telemetry.kafka_arrow import ArrowKafkaSink
from sluice.proxy.telemetry.parquet import ParquetSink
from sluice.proxy.telemetry.sinks import (
    FileSink,
    KafkaSink,
    NullSink,
    QueuedSink,
    TeeSink,
    TelemetryConfigError,
    TelemetrySink,
)

__all__ = [
    "MAX_TEXT",
    "SCHEMA_VERSION",
    "AdminDecision",
    "Api",
    "ApiCounters",
    "ArrowKafkaSink",
    "ConnectionPhase",
    "EventType",
    "FileSink",
    "FilterStatsLike",
    "KafkaSink",
    "NullSink",
    "ParquetSink",
    "ProxyInfo",
    "QueuedSink",
    "TeeSink",
    "TelemetryConfigError",
    "TelemetrySink",
    "admin_event",
    "connection_event",
    "filter_entries",
    "filter_entry",
    "filter_loaded_event",
    "iso_time",
    "make_sink",
    "new_instance_id",
    "now_ms",
    "produce_offsets",
    "proxy_info",
    "record_batch_event",
    "reject_reason_counts",
    "telemetry_dropped_event",
    "transform_batch_event",
]
