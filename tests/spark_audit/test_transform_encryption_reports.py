"""The ``transforms`` and ``encryption`` reports from known telemetry written by the real sinks:
JSON Lines (FileSink), the columnar layout (ParquetSink) and Arrow IPC messages on a Kafka topic
(ArrowKafkaSink) give the same, exact rows."""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from sluice.proxy import telemetry as t
from sluice.spark_audit.job import run_audit
from tests.spark_audit import known_transforms as k
from tests.spark_audit.kafka_topics import emit_through_sinks, redeliver_one

pytestmark = [pytest.mark.spark, pytest.mark.timeout(900)]


def _write(directory: Path, fmt: str) -> None:
    for proxy in (k.A, k.B):
        mine = [e for e in k.events() if e["proxy"]["instance_id"] == proxy.instance_id]
        sink = t.make_sink({"dir": str(directory), "format": fmt}, proxy.instance_id,
                           proxy=proxy)
        for event in mine:
            sink.emit(event)
        sink.close(timeout=10)
        assert sink.stats()["written"] == len(mine)


@pytest.fixture(scope="module", params=["jsonl", "parquet"])
def report(request: pytest.FixtureRequest, spark: Any,
           tmp_path_factory: pytest.TempPathFactory) -> Path:
    telemetry = tmp_path_factory.mktemp(f"telemetry-{request.param}")
    _write(telemetry, request.param)
    out = tmp_path_factory.mktemp(f"out-{request.param}")
    run_audit(str(telemetry), str(out))
    return out


def _rows(out: Path, name: str) -> list[dict[str, Any]]:
    return list(pq.read_table(out / f"{name}.parquet").to_pylist())


def test_transform_events_are_counted_once_each(report: Path) -> None:
    summary = json.loads((report / "summary.json").read_text())
    assert summary["events_by_type"]["transform_batch"] == sum(
        1 for e in k.events() if e["type"] == "transform_batch")
    assert summary["skipped"] == {"malformed": {}, "unknown_schema_version": {}}


def test_transforms_report_names_modules_input_and_output_offsets(report: Path) -> None:
    rows = _rows(report, "transforms")
    assert _transform_figures(rows) == k.EXPECTED_TRANSFORMS
    assert len(rows) == len(k.EXPECTED_TRANSFORMS)
    assert {(r["transform"], r["input_topic"], r["output_topic"]) for r in rows} == {
        ("upper", "lower", "upper-out")}
    assert all(r["filter_names"] == ["upper"] and r["groups"] == ["upper-group"] for r in rows)
    first = next(r for r in rows if r["output_partition"] == 1 and r["run"] == 2)
    assert first["time_first"].timestamp() * 1000 == k.T0 + 7 * k.MIN


def _transform_figures(rows: list[dict[str, Any]]) -> dict[tuple[Any, ...], tuple[Any, ...]]:
    return {
        (tuple(r["module_sha256s"]), r["input_partition"], r["run"], r["output_partition"]): (
            r["input_offset_first"], r["input_offset_last"], r["output_offset_first"],
            r["output_offset_last"], r["batches"], r["input_records"], r["output_records"],
            r["dropped"], r["guarantees"], r["proxy_instances"])
        for r in rows
    }


def test_encryption_report_key_versions_offsets_and_reads(report: Path) -> None:
    rows = _rows(report, "encryption")
    encrypted, reads = _encryption_figures(rows)
    assert encrypted == k.EXPECTED_ENCRYPTED
    assert reads == k.EXPECTED_READS
    assert len(rows) == len(encrypted) + len(reads)


def _encryption_figures(rows: list[dict[str, Any]]) -> tuple[dict[Any, Any], dict[Any, Any]]:
    encrypted = {
        (r["topic"], r["partition"], r["key_name"], r["key_version"]): (
            r["offset_first"], r["offset_last"], r["records"], r["batches"])
        for r in rows if r["section"] == "encrypted"
    }
    reads = {
        (r["topic"], r["principal"]): (r["decrypted"], r["withheld"], r["unreadable"],
                                       r["failures"])
        for r in rows if r["section"] == "read"
    }
    return encrypted, reads


def test_html_shows_transforms_and_encryption(report: Path) -> None:
    html = (report / "report.html").read_text()
    assert "<h2>Transforms</h2>" in html and "<h2>Encryption</h2>" in html
    assert k.UP2 in html and "User:billing-eu" in html
    summary = json.loads((report / "summary.json").read_text())
    assert summary["totals"]["transform_records"] == sum(
        r[6] for r in k.EXPECTED_TRANSFORMS.values())
    assert summary["totals"]["encrypted_records"] == 160
    assert set(summary["reports"]) >= {"transforms", "encryption"}


def test_csv_of_the_new_reports(report: Path) -> None:
    lines = (report / "transforms.csv").read_text().splitlines()
    assert lines[0].startswith("transform,module_sha256s,filter_names,input_topic,")
    assert len(lines) == 1 + len(k.EXPECTED_TRANSFORMS)
    enc = (report / "encryption.csv").read_text().splitlines()
    assert "encrypted,payments,0,payments,2,,150,159,10,1,,,," in enc


def test_arrow_kafka_topic_gives_the_same_reports(
    spark: Any, broker: Any, tmp_path: Path
) -> None:
    """Both instances through the Arrow IPC Kafka sink, one transform_batch message delivered
    twice (read once, by its message id)."""
    topic = f"sluice-telemetry-tr-{uuid.uuid4().hex[:8]}"
    emit_through_sinks(broker.bootstrap, topic, k.events(), [(k.A, "arrow"), (k.B, "arrow")])
    redeliver_one(broker.bootstrap, topic, "transform_batch")

    out = tmp_path / "report"
    result = run_audit(f"kafka://{broker.bootstrap}/{topic}", str(out))
    assert result.events_by_type["transform_batch"] == sum(
        1 for e in k.events() if e["type"] == "transform_batch")
    assert _transform_figures(_rows(out, "transforms")) == k.EXPECTED_TRANSFORMS
    assert _encryption_figures(_rows(out, "encryption")) == (k.EXPECTED_ENCRYPTED,
                                                             k.EXPECTED_READS)
