"""The Parquet telemetry sink: flat datasets, atomic publish, recovery after kill -9, and the
offset-run segments the proxy builds (checked against merging every batch's range)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sluice.proxy import telemetry as t
from sluice.proxy.telemetry.parquet import SPOOL, publish_spool, read_stream_tolerant
from sluice.telemetry_schema.columns import ColumnarBuffers, latest_versions
from sluice.telemetry_schema.host_identity import ENCRYPT_SHA256
from tests.spark_audit import known_telemetry as k
from tests.spark_audit import known_transforms as kt


def _dataset(directory: Path, name: str) -> list[dict[str, Any]]:
    files = sorted((directory / name).rglob("*.parquet"))
    if not files:
        return []
    return pa.concat_tables([pq.read_table(f) for f in files]).to_pylist()  # type: ignore[no-any-return]


def test_events_become_flat_datasets_partitioned_by_hour(tmp_path: Path) -> None:
    sink = t.make_sink({"dir": str(tmp_path)}, "x", proxy=k.A)
    assert isinstance(sink, t.ParquetSink)
    for event in k.events():
        sink.emit(event)
    sink.close(timeout=10)
    assert sink.stats()["written"] == len(k.events())
    # Published only: no temporary file, no spool left.
    assert not [p for p in tmp_path.rglob("*") if p.name.startswith(".")]
    assert not [p for p in (tmp_path / SPOOL).iterdir() if p.is_dir()]
    by_type: dict[str, int] = {}
    for e in k.events():
        by_type[e["type"]] = by_type.get(e["type"], 0) + 1
    for kind, n in by_type.items():
        assert len(_dataset(tmp_path, kind)) == n, kind
    hours = sorted(str(p.parent.relative_to(tmp_path)) for p in
                   (tmp_path / "record_batch").rglob("*.parquet"))
    assert hours == ["record_batch/date=2026-11-18/hour=10", "record_batch/date=2026-11-18/hour=11"]
    batch = next(r for r in _dataset(tmp_path, "record_batch") if r["offset_first"] == 0
                 and r["topic"] == "orders" and r["api"] == "produce")
    assert batch["filter_time_ns"] == 5000 and batch["filters"] == 1
    # The produce runs on orders: 0-29 (three batches, one segment) and 40-49 (a gap).
    runs = sorted(
        (r["offset_first"], r["offset_last"], r["batches"])
        for r in _dataset(tmp_path, "offset_run")
        if r["topic"] == "orders" and r["api"] == "produce"
    )
    assert runs == [(0, 29, 3), (40, 49, 1)]
    found = {(r["kind"], r["name"]): (r["n"], r["events"]) for r in _dataset(tmp_path, "finding")}
    assert found[("detection", "email")] == (3, 3)
    assert found[("partition_error", "87: INVALID_RECORD")] == (1, 1)
    # Instance B ran the pii module from a signed fleet record: its segments name the key.
    signers = {(r["instance_id"], r["signer_key_id"]) for r in _dataset(tmp_path, "offset_run")}
    assert signers == {("inst-a", None), ("inst-b", k.SIGNER)}


def test_segments_and_findings_name_the_signer_of_their_filter(tmp_path: Path) -> None:
    """Batches of one module signed by different keys (or by none) are separate segments and
    findings, each naming its key; the encrypt filter's segments name theirs too."""
    buffers = ColumnarBuffers("p")
    for first, signer in ((0, None), (10, "00000000000000a1"), (20, "00000000000000b2")):
        event = _batch(first, first + 9, k.T0)
        event["filters"] = [
            t.filter_entry("pii", "ab" * 32, kept=1, detectors={"email": 1},
                           signer_key_id=signer),
            t.filter_entry("builtin:encrypt", ENCRYPT_SHA256, detectors={"decrypted": 1},
                           signer_key_id=signer),
        ]
        buffers.add(event)
    rows = buffers.rows_for_flush()
    runs = sorted(((r["module_sha256"], r["offset_first"], r["signer_key_id"])
                   for r in rows["offset_run"].to_pylist()), key=repr)
    assert runs == sorted(
        [(sha, first, signer) for sha in ("ab" * 32, ENCRYPT_SHA256) for first, signer in
         ((0, None), (10, "00000000000000a1"), (20, "00000000000000b2"))], key=repr)
    assert sorted((r["offset_first"], r["signer_key_id"])
                  for r in rows["encryption"].to_pylist()) == [
        (0, None), (10, "00000000000000a1"), (20, "00000000000000b2")]
    found = {r["signer_key_id"]: r["n"] for r in rows["finding"].to_pylist()
             if r["kind"] == "detection" and r["name"] == "email"}
    assert found == {None: 1, "00000000000000a1": 1, "00000000000000b2": 1}


def test_transform_batches_and_encryption_counters_get_their_datasets(tmp_path: Path) -> None:
    events = kt.events()
    sink = t.ParquetSink(kt.A, tmp_path, fsync=False)
    for event in events:
        sink.emit(event)
    sink.close(timeout=10)
    assert sink.stats()["written"] == len(events)
    # One row per transform batch and output partition; none is left unknown.
    transforms = [e for e in events if e["type"] == "transform_batch"]
    rows = _dataset(tmp_path, "transform_batch")
    assert len(rows) == sum(max(1, len(e["outputs"])) for e in transforms)
    assert sum(1 for r in rows if r["output_index"] == 0) == len(transforms)
    replay = sorted(
        (r["output_partition"], r["output_offset_first"], r["output_offset_last"],
         r["output_records"], r["outputs"], r["guarantee"])
        for r in rows if r["input_partition"] == 0 and r["input_offset_first"] == 50
    )
    assert replay == [(0, 122, 146, 25, 2, "exactly-once"), (0, 300, 349, 50, 1, "at-least-once"),
                      (1, 230, 254, 25, 2, "exactly-once")]
    dropped = next(r for r in rows if r["input_partition"] == 1 and r["input_offset_first"] == 0)
    assert (dropped["output_partition"], dropped["output_records"], dropped["dropped"]) == (
        None, 0, 10)
    assert dropped["module_sha256s"] == [kt.UP1] and dropped["filter_names"] == ["upper"]
    # The encrypt filter's counters: adjacent batches of one KEK version make one segment.
    segments = sorted(
        [(r["api"], r["topic"], r["key_name"], r["key_version"], r["principal"],
          r["offset_first"], r["offset_last"], r["batches"], r["records"], r["decrypted"],
          r["withheld"])
         for r in _dataset(tmp_path, "encryption")],
        key=lambda row: [(v is not None, v) for v in row],
    )
    assert segments == [
        ("fetch", "payments", None, None, "User:billing-eu", None, None, 1, 0, 0, 0),
        ("fetch", "payments", None, None, "User:billing-eu", 0, 159, 1, 0, 160, 0),
        ("fetch", "payments", None, None, "User:bob", 0, 159, 1, 0, 0, 160),
        ("produce", "payments", "payments", "1", None, 0, 149, 2, 150, 0, 0),
        ("produce", "payments", "payments", "2", None, 150, 159, 1, 10, 0, 0),
    ]


def test_rotation_publishes_files_while_running(tmp_path: Path) -> None:
    sink = t.ParquetSink(k.A, tmp_path, rotate_seconds=0.3, flush_seconds=0.05, fsync=False)
    try:
        sink.emit(k.events()[0])
        deadline = time.monotonic() + 10
        while not list((tmp_path / "filter_loaded").rglob("*.parquet")):
            assert time.monotonic() < deadline, "no file published by age"
            time.sleep(0.05)
    finally:
        sink.close(timeout=5)
    assert len(_dataset(tmp_path, "filter_loaded")) == 1


def test_publishing_a_spool_twice_rewrites_the_same_files(tmp_path: Path) -> None:
    sink = t.ParquetSink(k.A, tmp_path / "a", flush_seconds=0.05, fsync=False)
    for event in k.events():
        sink.emit(event)
    time.sleep(0.5)  # a flush reaches the spool
    spool = next(p for p in (tmp_path / "a" / SPOOL).iterdir() if p.is_dir())
    copy = tmp_path / "copy" / spool.name
    shutil.copytree(spool, copy)
    sink.close(timeout=5)
    # A crash between two renames leaves the spool: publishing it again must not add rows.
    publish_spool(copy, tmp_path / "a", fsync=False)
    assert len(_dataset(tmp_path / "a", "record_batch")) == 9


def test_a_torn_stream_keeps_every_complete_batch(tmp_path: Path) -> None:
    path = tmp_path / "record_batch.arrows"
    buffers = ColumnarBuffers("p")
    with open(path, "wb") as f:
        writer = None
        for event in k.events():
            buffers.add(event)
            rows = buffers.rows_for_flush().get("record_batch")
            if rows is not None:
                writer = writer or pa.ipc.new_stream(f, rows.schema)
                writer.write_batch(rows)
        f.flush()
    size = path.stat().st_size
    with open(path, "r+b") as f:
        f.truncate(size - 40)  # the last batch is cut short, as by a crash mid-write
    table, complete = read_stream_tolerant(path)
    assert not complete
    assert table is not None and table.num_rows == 8


CRASHER = textwrap.dedent(
    """
    import shutil, sys, time
    sys.path.insert(0, {root!r})
    from sluice.proxy import telemetry as t
    from tests.spark_audit import known_telemetry as k
    from pathlib import Path
    from sluice.proxy.telemetry.parquet import publish_spool
    sink = t.ParquetSink(k.A, {directory!r}, flush_seconds=0.1, fsync=False)
    for event in k.events():
        sink.emit(event)
    # Killed once flushes have put every event, of every type, in the spool: not after a
    # fixed sleep, and not once one type's stream is whole, since under load the events can
    # reach the spool in two flushes. The count is publish_spool's, on a copy of the spool.
    spool = Path({directory!r}) / "_spool" / "inst-a-000001"
    scratch = Path({directory!r}).parent / "scratch"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        shutil.rmtree(scratch, ignore_errors=True)
        if spool.is_dir():
            shutil.copytree(spool, scratch / "copy")
            events, _complete, _latest = publish_spool(scratch / "copy", scratch / "out",
                                                       fsync=False)
            if events == len(k.events()):
                break
        time.sleep(0.02)
    shutil.rmtree(scratch, ignore_errors=True)
    print("flushed", flush=True)
    time.sleep(60)
    """
)


def test_kill_9_loses_at_most_the_flush_interval_and_the_next_start_says_so(
    tmp_path: Path,
) -> None:
    root = str(Path(__file__).resolve().parents[2])
    directory = tmp_path / "telemetry"
    proc = subprocess.Popen(
        [sys.executable, "-c", CRASHER.format(root=root, directory=str(directory))],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "flushed"
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)
    assert not list(directory.glob("record_batch/**/*.parquet"))  # nothing published yet
    sink = t.ParquetSink(k.B, directory, fsync=False)
    sink.close(timeout=10)
    # Every event that reached a flush is there, once.
    assert len(_dataset(directory, "record_batch")) == 9
    assert sink.recovered and sink.recovered[0]["events"] == len(k.events())
    notes = [r for r in _dataset(directory, "telemetry_dropped") if r["instance_id"] == "inst-b"
             and "unclean stop" in (r["reason"] or "")]
    assert len(notes) == 1 and "inst-a" in notes[0]["reason"]


def test_a_running_instance_spool_is_left_alone(tmp_path: Path) -> None:
    first = t.ParquetSink(k.A, tmp_path, flush_seconds=0.05, fsync=False)
    try:
        first.emit(k.events()[0])
        time.sleep(0.4)
        second = t.ParquetSink(k.B, tmp_path, fsync=False)
        second.close(timeout=5)
        assert second.recovered == []
    finally:
        first.close(timeout=5)
    assert len(_dataset(tmp_path, "filter_loaded")) == 1


def test_unwritable_directory_counts_drops(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    sink = t.make_sink({"dir": str(blocker / "telemetry")}, "x", proxy=k.A)
    for event in k.events():
        sink.emit(event)
    sink.close(timeout=5)
    stats = sink.stats()
    assert stats["written"] == 0
    assert stats["dropped"] == len(k.events())


@pytest.mark.parametrize(
    ("config", "field"),
    [
        ({"dir": "/tmp/x", "format": "csv"}, "telemetry.format"),
        ({"dir": "/tmp/x", "flush_seconds": 0}, "telemetry.flush_seconds"),
        ({"kafka": {"bootstrap": "h:1", "topic": "t", "format": "avro"}}, "telemetry.kafka.format"),
    ],
)
def test_format_errors_name_the_field(config: dict[str, Any], field: str) -> None:
    with pytest.raises(t.TelemetryConfigError, match=field.replace(".", r"\.")):
        t.make_sink(config, "x", proxy=k.A)


def _batch(first: int | None, last: int | None, time_ms: int) -> dict[str, Any]:
    return t.record_batch_event(
        k.A, connection_id="c", client_address="a", client_id="c", principal=None,
        api="fetch", topic="t", partition=0, offset_first=first, offset_last=last,
        records_in=1, records_out=1, bytes_in=1, bytes_out=1,
        filters=[t.filter_entry("pii", "ab" * 32, kept=1, time_ns=7)], time_ms=time_ms,
    )


def _islands(ranges: list[tuple[int, int]]) -> list[tuple[int, int]]:
    out: list[list[int]] = []
    for first, last in sorted(ranges):
        if out and first <= out[-1][1] + 1:
            out[-1][1] = max(out[-1][1], last)
        else:
            out.append([first, last])
    return [(a, b) for a, b in out]


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(0, 60), st.integers(0, 6), st.integers(0, 3), st.booleans()),
        min_size=1,
        max_size=40,
    )
)
def test_segments_merge_to_the_same_runs_as_every_batch(
    batches: list[tuple[int, int, int, bool]],
) -> None:
    """Whatever order offsets arrive in and wherever flushes and rotations fall, merging the
    segments (latest versions) gives the runs and sums that merging every batch gives."""
    buffers = ColumnarBuffers("p")
    emitted: list[pa.RecordBatch] = []
    ranges = []
    for first, length, flush_or_rotate, hour_later in batches:
        time_ms = k.T0 + (3_600_000 if hour_later else 0)
        buffers.add(_batch(first, first + length, time_ms))
        ranges.append((first, first + length))
        if flush_or_rotate == 1:
            flushed = buffers.rows_for_flush().get("offset_run")
            if flushed is not None:
                emitted.append(flushed)
        elif flush_or_rotate == 2:
            buffers.close_rollups()
    last = buffers.rows_for_flush().get("offset_run")
    if last is not None:
        emitted.append(last)
    segments = latest_versions(pa.Table.from_batches(emitted)).to_pylist()
    assert sum(s["batches"] for s in segments) == len(batches)
    assert sum(s["time_ns"] for s in segments) == 7 * len(batches)
    assert _islands([(s["offset_first"], s["offset_last"]) for s in segments]) == _islands(ranges)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(st.one_of(st.none(), st.sampled_from("abcde")), st.integers(0, 4)),
        max_size=30,
    )
)
def test_latest_versions_keeps_the_last_highest_version_of_each_id(
    rows: list[tuple[str | None, int]],
) -> None:
    """Against a plain reading of the rule: per id the highest version, of equal ones the
    last written; every row without an id; table order kept."""
    table = pa.table({"id": pa.array([i for i, _v in rows], pa.string()),
                      "version": pa.array([v for _i, v in rows], pa.int32()),
                      "row": pa.array(range(len(rows)), pa.int64())})
    best: dict[str, int] = {}
    for position, (id_, version) in enumerate(rows):
        if id_ is not None and (id_ not in best or version >= rows[best[id_]][1]):
            best[id_] = position
    expected = sorted([*best.values(), *(p for p, (i, _v) in enumerate(rows) if i is None)])
    assert latest_versions(table).column("row").to_pylist() == expected
