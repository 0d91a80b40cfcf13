"""Telemetry API for the proxy: event builders and sinks in one import.

The proxy does::

    from sluice.proxy import telemetry
    info = telemetry.proxy_info()                      # host, pid, new instance id
    sink = telemetry.make_sink(config.get("telemetry"), info.instance_id, proxy=info)
    sink.emit(telemetry.record_batch_event(info, ...))  # never blocks
    ...
    sink.close(timeout=5)

The schema is documented in docs/TELEMETRY.md; the builders live in ``events``, the sinks in
``sinks`` (JSON Lines, Kafka), ``parquet`` and ``kafka_arrow`` (columnar, layout in
``sluice.telemetry_schema.columns``), and ``make_sink`` in ``factory``.

The sinks are imported on first use (PEP 562 ``__getattr__``): importing this package for the
event builders does not pay for the sinks' imports (structlog, the Parquet writer, the Kafka
client) until a sink is made.
"""


from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

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

if TYPE_CHECKING:
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

# Name -> the submodule that defines it, imported when the name is first looked up.
_LAZY = {
    "make_sink": "factory",
    "ArrowKafkaSink": "kafka_arrow",
    "ParquetSink": "parquet",
    **dict.fromkeys(("FileSink", "KafkaSink", "NullSink", "QueuedSink", "TeeSink",
                     "TelemetryConfigError", "TelemetrySink"), "sinks"),
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value  # later lookups find it without this function
    return value


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
