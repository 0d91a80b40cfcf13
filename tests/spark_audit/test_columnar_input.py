"""The audit job on the columnar layout: the same reports as from JSON Lines, both layouts in
one folder, files collected twice, rows it cannot use counted, UTC times whatever the local
zone, and ``--out`` as a Hadoop filesystem URL."""

from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from sluice.proxy import telemetry as t
from sluice.spark_audit.job import run_audit
from sluice.spark_audit.reports import REPORT_NAMES
from tests.spark_audit import known_telemetry as k
from tests.spark_audit.test_audit_job import billing_figures, write_known_telemetry

pytestmark = [pytest.mark.spark, pytest.mark.timeout(900)]


def _norm(value: Any) -> Any:
    return value.timestamp() if isinstance(value, datetime) else value


def report_rows(out: Path | str) -> dict[str, list[dict[str, Any]]]:
    base = str(out).removeprefix("file://")
    return {
        name: [
            {key: _norm(v) for key, v in row.items()}
            for row in pq.read_table(f"{base}/{name}.parquet").to_pylist()
        ]
        for name in REPORT_NAMES
    }


def _run(spark: Any, telemetry: Path | str, out: Path | str, **kw: Any) -> Any:
    return run_audit(str(telemetry), str(out), **kw)


@pytest.fixture(scope="module")
def json_reports(spark: Any, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    tele = tmp_path_factory.mktemp("json-telemetry")
    write_known_telemetry(tele)
    out = tmp_path_factory.mktemp("json-out")
    _run(spark, tele, out)
    return report_rows(out)


def write_parquet_telemetry(directory: Path, events: list[dict[str, Any]]) -> None:
    """Through the real Parquet sink, one sink per proxy instance as in production."""
    for proxy in (k.A, k.B):
        sink = t.ParquetSink(proxy, directory, fsync=False)
        mine = [e for e in events if e["proxy"]["instance_id"] == proxy.instance_id]
        for event in mine:
            sink.emit(event)
        sink.close(timeout=10)
        assert sink.stats()["written"] == len(mine)


@pytest.fixture(scope="module")
def parquet_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("parquet-telemetry")
    write_parquet_telemetry(directory, k.events())
    return directory


def test_minutes_the_tasks_roll_up_equal_a_second_pass(spark: Any, parquet_dir: Path) -> None:
    """The known telemetry spans 91 minutes: the chart's bytes per client and minute come
    from the file tasks as they read the record batches, equal to a pass of their own."""
    from sluice.spark_audit import partials, rollups, sources

    inputs = sources.read_inputs(spark, str(parquet_dir))
    got = rollups.collect(spark, inputs, partials.standard(), minutes=True)
    second = rollups.collect(spark, inputs, {"traffic": partials.traffic(partials.MINUTE_MS)},
                             count_skipped=False)["traffic"]
    assert second
    assert sorted(map(repr, got[rollups.MINUTES])) == sorted(map(repr, second))


def test_parquet_layout_gives_the_json_reports(
    spark: Any, parquet_dir: Path, json_reports: dict[str, Any], tmp_path: Path
) -> None:
    result = _run(spark, parquet_dir, tmp_path)
    assert result.events == len(k.events())
    assert report_rows(tmp_path) == json_reports
    assert billing_figures(tmp_path) == k.EXPECTED_BILLING
    assert result.skipped == {"malformed": {}, "unknown_schema_version": {}}


def test_parquet_layout_names_the_signer_of_the_module(
    spark: Any, parquet_dir: Path, tmp_path: Path
) -> None:
    """Instance B ran the pii module from a signed fleet record: the audit report of its
    Parquet segments names the key, per run and per module."""
    _run(spark, parquet_dir, tmp_path)
    got = report_rows(tmp_path)
    assert {(r["api"], r["offset_first"], r["topic"]): r["signer_key_ids"]
            for r in got["audit"] if r["signer_key_ids"]} == {
        ("fetch", 0, "orders"): [k.SIGNER], ("produce", 40, "orders"): [k.SIGNER]}
    assert {r["module_sha256"]: r["signer_key_ids"] for r in got["audit_modules"]} == {
        k.PII: [k.SIGNER], k.POLICY: []}


def _without_signer_column(root: Path) -> int:
    """Rewrite every segment file under ``root`` as the layout was before ``signer_key_id``
    (the same name, so the job reads it as that file); how many files were rewritten."""
    n = 0
    for path in root.rglob("*.parquet"):
        table = pq.read_table(path)
        if "signer_key_id" in table.column_names:
            pq.write_table(table.drop_columns(["signer_key_id"]), path)
            n += 1
    return n


def test_segment_files_of_the_layout_before_the_signer_column_still_read(
    spark: Any, parquet_dir: Path, json_reports: dict[str, Any], tmp_path: Path
) -> None:
    """Files written before the column existed: the same reports, with no signer named."""
    tele = tmp_path / "telemetry"
    shutil.copytree(parquet_dir, tele)
    assert _without_signer_column(tele) > 0
    result = _run(spark, tele, tmp_path / "out")
    assert result.events == len(k.events())
    assert result.skipped == {"malformed": {}, "unknown_schema_version": {}}
    unsigned = {name: [{**r, "signer_key_ids": []} if "signer_key_ids" in r else r
                       for r in rows] for name, rows in json_reports.items()}
    assert report_rows(tmp_path / "out") == unsigned


def test_a_folder_with_both_layouts_reads_both(
    spark: Any, json_reports: dict[str, Any], tmp_path: Path
) -> None:
    """Migration: old JSON Lines files next to new Parquet datasets, each event in one."""
    tele = tmp_path / "telemetry"
    events = k.events()
    old, new = events[::2], events[1::2]
    sink = t.FileSink(k.A, tele, fsync=False)
    for event in old:
        sink.emit(event)
    sink.close(timeout=10)
    write_parquet_telemetry(tele, new)
    result = _run(spark, tele, tmp_path / "out")
    assert result.input_files["jsonl"] >= 1 and result.input_files["record_batch"] >= 1
    assert result.events == len(events)
    assert report_rows(tmp_path / "out") == json_reports


def test_files_collected_twice_are_read_once(
    spark: Any, parquet_dir: Path, json_reports: dict[str, Any], tmp_path: Path
) -> None:
    root = tmp_path / "collected"
    shutil.copytree(parquet_dir, root / "from-host-1")
    shutil.copytree(parquet_dir, root / "from-backup")
    result = _run(spark, root, tmp_path / "out")
    assert result.events == len(k.events())
    assert result.duplicate_files > 0
    assert report_rows(tmp_path / "out") == json_reports


def test_unknown_versions_and_malformed_rows_are_counted_and_shown(
    spark: Any, parquet_dir: Path, json_reports: dict[str, Any], tmp_path: Path
) -> None:
    tele = tmp_path / "telemetry"
    shutil.copytree(parquet_dir, tele)
    future = {**k.events()[4], "schema_version": 2, "event_id": "future-1"}
    (tele / "sluice-telemetry-old-000001-x.jsonl").write_text(
        json.dumps(future) + "\n" + "this is not json\n" + '{"type": "record_batch", "time_ms": "no'
    )
    # A Parquet file of a future layout version in the record_batch dataset.
    sample = pq.read_table(next((parquet_dir / "record_batch").rglob("*.parquet")))
    future_rows = sample.set_column(
        0, "schema_version", pa.array([2] * sample.num_rows, pa.int32())
    )
    hour_dir = next((tele / "record_batch").rglob("*.parquet")).parent
    pq.write_table(future_rows, hour_dir / "inst-z-000001.parquet")
    out = tmp_path / "out"
    result = _run(spark, tele, out)
    assert result.events == len(k.events())
    unknown = {"record_batch": sample.num_rows}
    unknown[future["type"]] = unknown.get(future["type"], 0) + 1
    assert result.skipped["unknown_schema_version"] == unknown
    assert result.skipped["malformed"] == {"(unreadable)": 2}
    assert report_rows(out) == json_reports
    html = (out / "report.html").read_text(encoding="utf-8")
    assert f"{unknown['record_batch']} unknown schema version (record_batch)" in html
    assert "2 malformed ((unreadable))" in html
    summary = json.loads((out / "summary.json").read_text())
    assert summary["skipped"] == result.skipped


def test_skipped_parquet_rows_of_every_kind_of_dataset_are_counted_apart(
    spark: Any, parquet_dir: Path, json_reports: dict[str, Any], tmp_path: Path
) -> None:
    """The aggregations that build the reports also count the rows they cannot use (an event
    table, a rollup, a detail table): never in a report, each counted once."""
    tele = tmp_path / "telemetry"
    shutil.copytree(parquet_dir, tele)

    def add(dataset: str, change: Any) -> int:
        sample = pq.read_table(next((parquet_dir / dataset).rglob("*.parquet")))
        changed = change(sample)
        hour_dir = next((tele / dataset).rglob("*.parquet")).parent
        pq.write_table(changed, hour_dir / "inst-z-000002.parquet")
        return int(changed.num_rows)

    def no_time(column: str) -> Any:
        def change(table: pa.Table) -> pa.Table:
            i = table.schema.get_field_index(column)
            return table.set_column(i, column, pa.nulls(table.num_rows, pa.int64()))
        return change

    def version(table: pa.Table) -> pa.Table:
        return table.set_column(0, "schema_version", pa.array([3] * table.num_rows, pa.int32()))

    malformed = {"record_batch": add("record_batch", no_time("time_ms")),
                 "offset_run": add("offset_run", no_time("time_first_ms"))}
    unknown = {"connection_api": add("connection_api", version),
               "admin": add("admin", version)}
    out = tmp_path / "out"
    result = _run(spark, tele, out)
    assert result.events == len(k.events())
    assert result.skipped == {"malformed": malformed, "unknown_schema_version": unknown}
    assert report_rows(out) == json_reports


@pytest.fixture
def tokyo_time() -> Iterator[None]:
    """The driver's local zone is not UTC (the JVM keeps its own)."""
    old = os.environ.get("TZ")
    os.environ["TZ"] = "Asia/Tokyo"
    time.tzset()
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("TZ", None)
        else:
            os.environ["TZ"] = old
        time.tzset()


def test_html_and_csv_times_are_utc_with_tz_asia_tokyo(
    spark: Any, parquet_dir: Path, tmp_path: Path, tokyo_time: None
) -> None:
    assert time.localtime(0).tm_hour == 9
    result = _run(spark, parquet_dir, tmp_path)
    first_loaded = "2026-11-18T09:59:00.000Z"  # the first filter_loaded event, UTC
    last = "2026-11-18T11:30:00.000Z"  # the telemetry_dropped event
    assert (result.first_event, result.last_event) == (first_loaded, last)
    html = (tmp_path / "report.html").read_text(encoding="utf-8")
    assert f"events from {first_loaded} to {last}" in html
    assert "all times UTC" in html
    csv_text = (tmp_path / "audit_modules.csv").read_text(encoding="utf-8")
    assert "2026-11-18T09:59:00.000Z" in csv_text
    audit = pq.read_table(tmp_path / "audit.parquet")
    assert audit.schema.field("time_first").type == pa.timestamp("us", tz="UTC")


def test_out_as_a_hadoop_filesystem_url(
    spark: Any, parquet_dir: Path, json_reports: dict[str, Any], tmp_path: Path
) -> None:
    """``file://`` goes through Hadoop's FileSystem API, as ``s3a://`` or ``hdfs://`` would."""
    out = f"file://{tmp_path}/reports"
    result = _run(spark, f"file://{parquet_dir}", out)
    assert result.html == f"{out}/report.html"
    assert report_rows(out) == json_reports
    assert (tmp_path / "reports" / "report.html").is_file()
    assert (tmp_path / "reports" / "billing.csv").read_text().startswith("principal,client_id")
    summary = json.loads((tmp_path / "reports" / "summary.json").read_text())
    assert summary["events"] == len(k.events())


def test_dedupe_drops_events_repeated_in_differently_named_files(
    spark: Any, json_reports: dict[str, Any], tmp_path: Path
) -> None:
    """Half the events in JSON Lines files collected twice under different names, the other
    half in Parquet files copied under other names: with --dedupe every event counts once."""
    tele = tmp_path / "telemetry"
    events = k.events()
    write_parquet_telemetry(tele, events[1::2])
    for dataset in ("record_batch", "offset_run", "finding"):
        for path in list((tele / dataset).rglob("*.parquet")):
            shutil.copy(path, path.with_name(f"copied-{path.name}"))
    sink = t.FileSink(k.A, tmp_path / "json", fsync=False)
    for event in events[::2]:
        sink.emit(event)
    sink.close(timeout=10)
    for path in (tmp_path / "json").glob("*.jsonl"):
        shutil.copy(path, tele / path.name)
        shutil.copy(path, tele / f"renamed-{path.name}")
    result = _run(spark, tele, tmp_path / "out", dedupe=True)
    assert result.events == len(events)
    assert report_rows(tmp_path / "out") == json_reports


def test_kafka_arrow_messages_without_the_signer_column_read_as_nulls() -> None:
    """An Arrow message a sink sent before ``signer_key_id`` existed (the same layout
    version): both readers of the columnar topic give the column as nulls."""
    from sluice.spark_audit.kafka_arrow_source import message_rows, message_table
    from sluice.telemetry_schema.columns import LAYOUT_VERSION, SCHEMAS, ColumnarBuffers

    buffers = ColumnarBuffers("p")
    for event in k.events():
        buffers.add(event)
    segments = buffers.rows_for_flush()["offset_run"]
    assert set(segments.column(segments.schema.get_field_index("signer_key_id")).to_pylist()) \
        == {None, k.SIGNER}
    old = segments.drop_columns(["signer_key_id"])
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, old.schema) as writer:
        writer.write_batch(old)
    value = sink.getvalue().to_pybytes()
    (rows,) = message_rows("offset_run", str(LAYOUT_VERSION), value)
    assert rows.schema == SCHEMAS["offset_run"]
    assert rows.column("signer_key_id").null_count == rows.num_rows == old.num_rows
    assert rows.column("offset_first").to_pylist() == old.column("offset_first").to_pylist()
    table = message_table("offset_run", str(LAYOUT_VERSION), value,
                          ["module_sha256", "signer_key_id"], dictionary=["signer_key_id"])
    assert table["signer_key_id"].null_count == old.num_rows
