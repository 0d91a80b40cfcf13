"""The telemetry recorder: what it builds for each sink (issue 29: no event is built for the
null sink, whose events nobody reads, while the metrics still count every batch)."""

from __future__ import annotations

from typing import Any

import pytest

from sluice.filters.chain import FilterStats
from sluice.proxy.contract import ClientInfo
from sluice.proxy.telemetry import events
from sluice.proxy.telemetry.metrics import Metrics
from sluice.proxy.telemetry.recorder import TelemetryRecorder
from sluice.proxy.telemetry.sinks import NullSink


class ListSink:
    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []

    def emit(self, event: dict[str, Any]) -> None:
        self.events.append(event)


def record(recorder: TelemetryRecorder) -> None:
    recorder.record_batch(
        ClientInfo("1.2.3.4:5", ("b", 9092)), api="produce", topic="t", partition=0,
        offset_first=7, offset_last=7, records_in=1, records_out=1, bytes_in=80, bytes_out=80,
        stats=[FilterStats("pii", "ab" * 32, rewritten=1, time_ns=500)],
    )


def never_built(monkeypatch: pytest.MonkeyPatch, builder: str) -> None:
    """Make the event builder `builder` of `events` fail the test if it is called."""
    def must_not_build(*args: Any, **kwargs: Any) -> dict[str, Any]:
        raise AssertionError(f"{builder} was called for the null sink")

    monkeypatch.setattr(events, builder, must_not_build)


def test_the_null_sink_counts_record_batches_that_are_never_built(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    never_built(monkeypatch, "record_batch_event")
    metrics = Metrics()
    recorder = TelemetryRecorder(events.proxy_info("test"), metrics)
    assert isinstance(recorder.sink, NullSink)
    record(recorder)
    record(recorder)
    assert recorder.failed == 0
    assert recorder.sink.stats()["emitted"] == 2
    # Metrics keep counting what the filters did, telemetry or not.
    assert metrics.filters["pii"].batches == 2
    assert metrics.filters["pii"].rewritten == 2


def test_a_real_sink_gets_the_whole_record_batch_event() -> None:
    metrics = Metrics()
    recorder = TelemetryRecorder(events.proxy_info("test"), metrics)
    sink = ListSink()
    recorder.sink = sink  # type: ignore[assignment]
    record(recorder)
    assert recorder.failed == 0
    [event] = sink.events
    assert (event["topic"], event["partition"], event["records_in"]) == ("t", 0, 1)
    assert event["filters"][0]["name"] == "pii"
    assert metrics.filters["pii"].batches == 1


def test_stats_only_counts_the_batch_when_telemetry_is_off() -> None:
    # The produce path asks first, and builds the event's fields only when it must.
    metrics = Metrics()
    recorder = TelemetryRecorder(events.proxy_info("test"), metrics)
    stats = [FilterStats("pii", "ab" * 32, kept=2, rewritten=1, time_ns=500)]
    assert recorder.stats_only(stats) is True
    assert recorder.sink.stats()["emitted"] == 1
    assert metrics.filters["pii"].batches == 1
    assert metrics.filters["pii"].rewritten == 1 and metrics.filters["pii"].kept == 2
    sink = ListSink()
    recorder.sink = sink  # type: ignore[assignment]
    assert recorder.stats_only(stats) is False
    assert metrics.filters["pii"].batches == 1, "record_batch counts it when telemetry is on"
    assert sink.events == []


def test_the_null_sink_counts_connection_events_that_are_never_built(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    never_built(monkeypatch, "connection_event")
    recorder = TelemetryRecorder(events.proxy_info("test"), Metrics())
    client = ClientInfo("1.2.3.4:5", ("b", 9092))
    client.stats.requests[18] = 2
    recorder.connection_opened(client)
    recorder.connection_closed(client)
    assert recorder.failed == 0
    assert recorder.sink.stats()["emitted"] == 2


def test_a_sink_gets_both_connection_events_with_the_apis_named() -> None:
    sink = ListSink()
    recorder = TelemetryRecorder(events.proxy_info("test"), Metrics())
    recorder.sink = sink  # type: ignore[assignment]
    client = ClientInfo("1.2.3.4:5", ("b", 9092))
    client.stats.requests[18] = 2
    recorder.connection_opened(client)
    recorder.connection_closed(client)
    assert [e["phase"] for e in sink.events] == ["open", "close"]
    assert sink.events[1]["apis"]["api_versions"]["requests"] == 2
