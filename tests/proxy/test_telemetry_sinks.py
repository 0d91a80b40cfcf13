"""Telemetry sinks: file rotation, drop accounting, and that a failing sink never blocks emit."""

from __future__ import annotations

import json
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from sluice.proxy import telemetry as t
from tests.harness.ports import free_port

PROXY = t.ProxyInfo(host="h", pid=1, instance_id="testinst")


def _event(i: int) -> dict[str, Any]:
    return t.connection_event(
        PROXY, phase="open", connection_id=f"c{i}", client_address="127.0.0.1:1"
    )


def _lines(directory: Path, pattern: str = "*.jsonl") -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for path in sorted(directory.glob(pattern)):
        out.extend(json.loads(line) for line in path.read_text().splitlines())
    return out


def test_file_sink_writes_every_event_and_rotates_by_size(tmp_path: Path) -> None:
    sink = t.make_sink(
        {"dir": str(tmp_path), "format": "jsonl", "rotate_bytes": 2000}, "testinst", proxy=PROXY
    )
    assert isinstance(sink, t.FileSink)
    for i in range(200):
        sink.emit(_event(i))
    sink.close(timeout=10)
    files = sorted(tmp_path.glob("*.jsonl"))
    assert len(files) > 5
    assert not list(tmp_path.glob("*.tmp"))
    for f in files:
        assert f.name.startswith("sluice-telemetry-testinst-")
    seqs = [int(f.name.split("-")[3]) for f in files]
    assert sorted(seqs) == list(range(1, len(files) + 1))
    # Rotation happens after the write that crosses the limit: no file is much larger.
    assert all(f.stat().st_size < 2000 + 200 * 250 for f in files)
    events = sorted(_lines(tmp_path), key=lambda e: int(e["connection_id"][1:]))
    assert [e["connection_id"] for e in events] == [f"c{i}" for i in range(200)]
    stats = sink.stats()
    assert stats["emitted"] == 200
    assert stats["written"] == 200
    assert stats["dropped"] == 0


def test_file_sink_rotates_by_time(tmp_path: Path) -> None:
    sink = t.FileSink(PROXY, tmp_path, rotate_seconds=0.2)
    try:
        sink.emit(_event(1))
        deadline = time.monotonic() + 5
        while not list(tmp_path.glob("*.jsonl")) and time.monotonic() < deadline:
            time.sleep(0.05)
        # Closed and renamed by age, while the sink is still running.
        done = list(tmp_path.glob("*.jsonl"))
        assert len(done) == 1
        assert json.loads(done[0].read_text())["connection_id"] == "c1"
        sink.emit(_event(2))
    finally:
        sink.close(timeout=5)
    assert len(list(tmp_path.glob("*.jsonl"))) == 2


def test_open_file_is_tmp_until_rotated(tmp_path: Path) -> None:
    sink = t.FileSink(PROXY, tmp_path, rotate_seconds=3600)
    try:
        sink.emit(_event(1))
        deadline = time.monotonic() + 5
        while not list(tmp_path.glob("*.jsonl.tmp")) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert list(tmp_path.glob("*.jsonl.tmp"))
        assert not list(tmp_path.glob("*.jsonl"))
    finally:
        sink.close(timeout=5)
    assert not list(tmp_path.glob("*.jsonl.tmp"))
    assert len(list(tmp_path.glob("*.jsonl"))) == 1


@pytest.mark.serial  # measures time: run alone
def test_unwritable_dir_does_not_block_and_counts_drops(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    sink = t.make_sink({"dir": str(blocker / "telemetry"), "queue_size": 100}, "x", proxy=PROXY)
    start = time.perf_counter()
    for i in range(5000):
        sink.emit(_event(i))
    elapsed = time.perf_counter() - start
    assert elapsed < 1.0  # 5000 emits against a dead backend: no waiting on IO
    sink.close(timeout=5)
    stats = sink.stats()
    assert stats["emitted"] == 5000
    assert stats["written"] == 0
    assert stats["dropped"] == 5000
    assert stats["dropped_queue_full"] > 0
    assert stats["dropped_sink_error"] > 0
    assert stats["errors"] > 0
    assert "NotADirectoryError" in stats["last_error"] or "FileExists" in stats["last_error"]


class _SlowSink(t.QueuedSink):
    kind = "slow"

    def __init__(self) -> None:
        self.release = threading.Event()
        self.lines: list[dict[str, Any]] = []
        super().__init__(PROXY, queue_size=10)

    def _write_batch(self, batch: list[dict[str, Any]], gap: dict[str, Any] | None) -> int:
        self.release.wait(5)
        if gap is not None:
            self.lines.append(gap)
        self.lines.extend(batch)
        return len(batch)


def test_full_queue_drops_counts_and_reports_the_gap_in_the_data() -> None:
    sink = _SlowSink()
    start = time.perf_counter()
    for i in range(1000):
        sink.emit(_event(i))
    assert time.perf_counter() - start < 1.0
    mid = sink.stats()
    assert mid["dropped_queue_full"] >= 1000 - 10 - 5000  # at least the overflow beyond one batch
    assert mid["dropped"] > 900
    sink.release.set()
    time.sleep(0.2)
    sink.emit(_event(1000))  # written after the gap: carries the telemetry_dropped event
    sink.close(timeout=5)
    stats = sink.stats()
    assert stats["emitted"] == 1001
    assert stats["written"] + stats["dropped"] == 1001
    gaps = [e for e in sink.lines if e["type"] == "telemetry_dropped"]
    assert sum(g["dropped"] for g in gaps) == stats["dropped"]
    assert [e for e in sink.lines if e["type"] == "connection"][-1]["connection_id"] == "c1000"


def test_dead_kafka_does_not_block_and_counts_drops() -> None:
    port = free_port()  # nothing listens there
    sink = t.make_sink(
        {
            "kafka": {
                "bootstrap": f"127.0.0.1:{port}",
                "topic": "telemetry",
                "message_timeout_ms": 1000,
            },
            "queue_size": 1000,
        },
        "x",
        proxy=PROXY,
    )
    assert isinstance(sink, t.KafkaSink)
    start = time.perf_counter()
    for i in range(3000):
        sink.emit(_event(i))
    assert time.perf_counter() - start < 1.0
    sink.close(timeout=10)
    stats = sink.stats()
    assert stats["emitted"] == 3000
    assert stats["written"] == 0
    assert stats["dropped"] == 3000
    assert stats["in_flight"] == 0


@pytest.mark.timeout(60)
def test_kafka_sink_delivers_to_a_real_broker(broker: Any) -> None:
    from confluent_kafka import Consumer

    topic = f"telemetry-{uuid.uuid4().hex[:8]}"
    sink = t.make_sink(
        {
            "kafka": {
                "bootstrap": broker.bootstrap,
                "topic": topic,
                "create_partitions": 2,
                "format": "json",
            }
        },
        "x",
        proxy=PROXY,
    )
    for i in range(50):
        sink.emit(_event(i))
    sink.close(timeout=20)
    assert sink.stats()["written"] == 50
    consumer = Consumer(
        {
            "bootstrap.servers": broker.bootstrap,
            "group.id": f"g-{topic}",
            "auto.offset.reset": "earliest",
            "session.timeout.ms": 6000,
        }
    )
    consumer.subscribe([topic])
    seen: set[str] = set()
    deadline = time.monotonic() + 30
    try:
        while len(seen) < 50 and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is None or msg.error():
                continue
            event = json.loads(msg.value() or b"null")
            assert msg.key() == b"testinst"
            seen.add(event["connection_id"])
    finally:
        consumer.close()
    assert seen == {f"c{i}" for i in range(50)}


@pytest.mark.parametrize(
    ("config", "field"),
    [
        ({"dir": 3}, "telemetry.dir"),
        ({"dirr": "/tmp"}, "telemetry.dirr"),
        ({"kafka": {"topic": "t"}}, "telemetry.kafka.bootstrap"),
        ({"kafka": {"bootstrap": "h:1"}}, "telemetry.kafka.topic"),
        ({"dir": "/tmp/x", "rotate_bytes": True}, "telemetry.rotate_bytes"),
        ({"dir": "/tmp/x", "queue_size": 0}, "telemetry.queue_size"),
    ],
)
def test_config_errors_name_the_field(config: dict[str, Any], field: str) -> None:
    with pytest.raises(t.TelemetryConfigError, match=field.replace(".", r"\.")):
        t.make_sink(config, "x", proxy=PROXY)


def test_null_sink_for_empty_or_disabled_config() -> None:
    assert isinstance(t.make_sink(None, "x"), t.NullSink)
    assert isinstance(t.make_sink({}, "x"), t.NullSink)
    sink = t.make_sink({"dir": "/nonexistent", "enabled": False}, "x")
    assert isinstance(sink, t.NullSink)
    sink.emit(_event(0))
    assert sink.stats()["discarded"] == 1
