"""Telemetry event builders: envelope, field names and values of schema version 1."""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from sluice.proxy import telemetry as t

PROXY = t.ProxyInfo(host="h1", pid=42, instance_id="inst-a")
T0 = 1_795_000_000_123  # 2026-11-18T11:06:40.123Z


def test_envelope_and_time_forms() -> None:
    event = t.connection_event(
        PROXY, phase="open", connection_id="c1", client_address="127.0.0.1:5000", time_ms=T0
    )
    assert event["schema_version"] == 1
    assert event["type"] == "connection"
    assert event["time_ms"] == T0
    assert event["time"] == "2026-11-18T11:06:40.123Z"
    assert event["proxy"] == {"host": "h1", "pid": 42, "instance_id": "inst-a"}
    assert len(event["event_id"]) == 32 and int(event["event_id"], 16) >= 0  # random, hex


def test_event_ids_are_unique() -> None:
    ids = {
        t.connection_event(PROXY, phase="open", connection_id="c", client_address="a")["event_id"]
        for _ in range(100)
    }
    assert len(ids) == 100


def test_iso_time_pads_milliseconds() -> None:
    assert t.iso_time(5) == "1970-01-01T00:00:00.005Z"


@dataclass
class _Stats:
    name: str
    sha256: str
    kept: int
    rewritten: int
    dropped: int
    rejected: int
    detector_counts: dict[str, int] = field(default_factory=dict)
    time_ns: int = 0
    errors: list[str] = field(default_factory=list)


def test_record_batch_event_from_pipeline_stats() -> None:
    stats = [_Stats("pii", "ab" * 32, 7, 2, 0, 1, {"email": 3}, 1500, ["boom"])]
    first, last = t.produce_offsets(100, 9)
    event = t.record_batch_event(
        PROXY,
        connection_id="c1",
        client_address="127.0.0.1:5000",
        client_id="app",
        principal="alice",
        api="produce",
        topic="orders",
        partition=3,
        offset_first=first,
        offset_last=last,
        records_in=10,
        records_out=9,
        bytes_in=1000,
        bytes_out=900,
        filters=t.filter_entries(stats),
        reject_reasons=t.reject_reason_counts([(0, "card number"), (0, "card number")]),
        time_ms=T0,
    )
    assert (event["offset_first"], event["offset_last"]) == (100, 108)
    assert event["filters"] == [
        {
            "name": "pii",
            "module_sha256": "ab" * 32,
            "kept": 7,
            "rewritten": 2,
            "dropped": 0,
            "rejected": 1,
            "detectors": {"email": 3},
            "time_ns": 1500,
            "errors": ["boom"],
        }
    ]
    assert event["reject_reasons"] == {"card number": 2}
    assert event["error_code"] == 0
    # JSON-serialisable as is: the sink does no conversion.
    assert json.loads(json.dumps(event)) == event


def test_filter_entries_from_the_chain_stats() -> None:
    from sluice.filters.chain import FilterStats

    failed = FilterStats("pii", "ab" * 32, kept=1, errors=2, failure="trap: unreachable")
    clean = FilterStats("pii", "ab" * 32, kept=3)
    counted = FilterStats("pii", "ab" * 32, errors=1)
    entries = t.filter_entries([failed, clean, counted])
    assert [e["errors"] for e in entries] == [["trap: unreachable"], [], ["1 filter failure(s)"]]
    assert entries[0]["kept"] == 1


def test_produce_offsets_none_when_broker_assigned_none() -> None:
    assert t.produce_offsets(-1, 5) == (None, None)
    assert t.produce_offsets(None, 5) == (None, None)
    assert t.produce_offsets(10, 0) == (None, None)
    assert t.produce_offsets(0, 1) == (0, 0)


def test_long_text_is_capped() -> None:
    event = t.admin_event(
        PROXY,
        connection_id="c",
        client_address="a",
        client_id=None,
        principal=None,
        op="create_topics",
        resource_type="topic",
        resource="x",
        decision="deny",
        message="m" * 10_000,
        filter_name="policy",
        module_sha256="cd" * 32,
    )
    assert len(event["message"]) == t.MAX_TEXT
    assert event["filter"] == {"name": "policy", "module_sha256": "cd" * 32}


def test_connection_event_counters() -> None:
    counters = t.ApiCounters(requests=3, bytes_in=300, bytes_out=30)
    event = t.connection_event(
        PROXY,
        phase="close",
        connection_id="c1",
        client_address="a",
        bytes_in=310,
        bytes_out=40,
        apis={"produce": counters, "metadata": {"requests": 1, "bytes_in": 10}},
        duration_ms=1234,
        throttle_ms=250,
    )
    assert event["throttle_ms"] == 250
    assert event["apis"] == {
        "produce": {"requests": 3, "bytes_in": 300, "bytes_out": 30},
        "metadata": {"requests": 1, "bytes_in": 10, "bytes_out": 0},
    }
    assert event["duration_ms"] == 1234


def test_filter_loaded_event() -> None:
    event = t.filter_loaded_event(
        PROXY,
        name="pii",
        module_sha256="ef" * 32,
        topics=["orders.*"],
        apply_to={"produce", "fetch"},
    )
    assert event["type"] == "filter_loaded"
    assert event["apply_to"] == ["fetch", "produce"]
    assert event["topics"] == ["orders.*"]
