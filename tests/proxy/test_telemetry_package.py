"""The telemetry package's imports: the sinks load on first use, the layout without them.

The audit job's Spark workers import ``sluice.telemetry_schema.columns``; the sinks (structlog,
the Parquet writer, the Kafka client) must not come with it. Each check runs in a new
interpreter, where nothing was imported before.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from sluice.proxy import telemetry
from sluice.proxy.telemetry import factory, kafka_arrow, parquet, sinks


def _modules_after(statement: str) -> set[str]:
    code = f"import sys\n{statement}\nprint('\\n'.join(sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, timeout=60)
    return set(out.stdout.split())


def test_the_layout_comes_without_the_sinks() -> None:
    loaded = _modules_after("import sluice.telemetry_schema.columns")
    assert "sluice.telemetry_schema.columns" in loaded
    assert not loaded & {"structlog", "sluice.proxy.telemetry.sinks",
                         "sluice.proxy.telemetry.factory", "sluice.proxy.telemetry.parquet",
                         "sluice.proxy.telemetry.kafka_arrow"}


def test_a_sink_name_loads_its_module() -> None:
    loaded = _modules_after("from sluice.proxy.telemetry import make_sink")
    assert {"sluice.proxy.telemetry.factory", "structlog"} <= loaded


def test_lazy_names_are_the_submodules_objects() -> None:
    assert telemetry.make_sink is factory.make_sink
    assert telemetry.ParquetSink is parquet.ParquetSink
    assert telemetry.ArrowKafkaSink is kafka_arrow.ArrowKafkaSink
    for name in ("FileSink", "KafkaSink", "NullSink", "QueuedSink", "TeeSink",
                 "TelemetryConfigError", "TelemetrySink"):
        assert getattr(telemetry, name) is getattr(sinks, name)
    assert set(telemetry.__all__) <= set(dir(telemetry)) | set(telemetry._LAZY)


def test_an_unknown_name_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="no attribute 'no_such_sink'"):
        telemetry.no_such_sink  # noqa: B018
