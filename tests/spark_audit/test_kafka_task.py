"""The audit job's Kafka tasks (``rollups.run_kafka_task``) against its file tasks, on the
same known telemetry: the columnar Kafka sink's messages (every flush's rows, so the rollups
come in several versions), split into partitions and read in chunks anyhow, give the reports'
rows that the published Parquet files give.

Pure pyarrow: no Spark session, no broker (the sink's own encoder builds the messages).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sluice.proxy.telemetry.kafka_arrow import encode_batch
from sluice.proxy.telemetry.parquet import publish_table
from sluice.spark_audit.schema import SKIP
from sluice.telemetry_schema.columns import LAYOUT_VERSION, ColumnarBuffers
from tests.spark_audit import known_telemetry as k
from tests.spark_audit import known_transforms as kt

pytest.importorskip("pyspark")  # rollups imports pyspark (no session is started)

from sluice.spark_audit import partials, rollups
from sluice.spark_audit.sources import LocalFile, Window

Message = tuple[str | None, str | None, bytes | None]


def _events() -> list[dict[str, Any]]:
    return sorted([*k.events(), *kt.events()], key=lambda e: e["time_ms"])


def _flushes(every: int) -> list[dict[str, pa.RecordBatch]]:
    """The rows of each flush of one sink per instance, flushing every ``every`` events."""
    out = []
    for instance in sorted({e["proxy"]["instance_id"] for e in _events()}):
        buffers = ColumnarBuffers(instance)
        mine = [e for e in _events() if e["proxy"]["instance_id"] == instance]
        for n, event in enumerate(mine, 1):
            buffers.add(event)
            if n % every == 0 or n == len(mine):
                if n == len(mine):
                    buffers.close_rollups()
                out.append(buffers.rows_for_flush())
    return out


def _messages(flushes: list[dict[str, pa.RecordBatch]], plain: set[int]) -> list[Message]:
    """The sink's messages; those numbered in ``plain`` as an older sink sent them (no
    dictionary-encoded strings)."""
    out: list[Message] = []
    for flush in flushes:
        for dataset, batch in sorted(flush.items()):
            if len(out) in plain:
                sink = pa.BufferOutputStream()
                with pa.ipc.new_stream(sink, batch.schema) as writer:
                    writer.write_batch(batch)
                value = sink.getvalue().to_pybytes()
            else:
                value = encode_batch(batch)
            out.append((dataset, str(LAYOUT_VERSION), value))
    return out


def _sorted(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return sorted(rows, key=repr)


def _driver(pairs: list[tuple[str, bytes]], wanted: dict[str, partials.Rollup]
            ) -> dict[str, list[dict[str, Any]]]:
    """What ``rollups.collect`` does with the tasks' results (with ``minutes``)."""
    got = partials.PartialSet()
    rollups.add_pairs(got, [(p, d) for p, d in pairs if p != rollups.JSON_MESSAGES])
    return {name: _sorted(rows) for name, rows in rollups.finish(got, wanted, True).items()}


@pytest.fixture(scope="module")
def from_files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[dict[str, Any]]]:
    """The reference: every flush published as Parquet files, read by the file tasks."""
    directory = tmp_path_factory.mktemp("published")
    rows: dict[str, list[pa.RecordBatch]] = {}
    for flush in _flushes(3):
        for dataset, batch in flush.items():
            rows.setdefault(dataset, []).append(batch)
    for dataset, batches in rows.items():
        publish_table(directory, dataset, pa.Table.from_batches(batches), "all", fsync=False)
    files = [LocalFile(p.parts[-4], f"{p.parts[-3][5:]}/{p.parts[-2][5:]}", str(p))
             for p in sorted(Path(directory).rglob("*.parquet"))]
    wanted = partials.standard()
    pairs = []
    for task in rollups.plan_tasks(files, wanted, cores=2):
        pairs.extend(rollups.run_file_task(task, wanted, Window(), minutes=True))
    got = _driver(pairs, wanted)
    assert got[rollups.MINUTES]  # the known telemetry spans 91 minutes
    return got


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                HealthCheck.function_scoped_fixture])
@given(every=st.integers(1, 7), partitions=st.integers(1, 3), chunk=st.integers(1, 40),
       data=st.data())
def test_kafka_tasks_equal_the_file_tasks(
    from_files: dict[str, list[dict[str, Any]]], monkeypatch: pytest.MonkeyPatch, every: int,
    partitions: int, chunk: int, data: st.DataObject,
) -> None:
    """Whatever the flush interval (how many versions a rollup has), the messages' split into
    partitions (each keeps its order), the rows a task decodes before it aggregates, and
    which messages came plain or dictionary-encoded."""
    monkeypatch.setattr(rollups, "CHUNK_ROWS", chunk)
    flushes = _flushes(every)
    count = sum(len(f) for f in flushes)
    plain = data.draw(st.sets(st.integers(0, count - 1)))
    owner = data.draw(st.lists(st.integers(0, partitions - 1), min_size=count,
                               max_size=count))
    messages = _messages(flushes, plain)
    wanted = partials.standard()
    pairs = []
    for p in range(partitions):
        mine = [m for m, o in zip(messages, owner, strict=True) if o == p]
        pairs.extend(rollups.run_kafka_task(iter(mine), wanted, Window(), minutes=True))
    assert _driver(pairs, wanted) == from_files


def test_json_messages_are_counted_not_read() -> None:
    messages: list[Message] = [(None, None, b'{"type": "record_batch"}'), (None, None, b"{}")]
    pairs = rollups.run_kafka_task(iter(messages), partials.standard(), Window())
    assert pairs == [(rollups.JSON_MESSAGES, b"2")]


def test_a_message_of_an_unknown_layout_is_counted_as_an_unknown_version() -> None:
    batch = next(iter(_flushes(100)[0].values()))
    dataset = next(iter(_flushes(100)[0]))
    pairs = rollups.run_kafka_task(iter([(dataset, "99", encode_batch(batch))]),
                                   partials.standard(), Window())
    counts = rollups.split_counts(_driver(pairs, partials.standard()))[1]
    assert counts[dataset].unknown_version == 1
    assert counts[dataset].events == 0


def test_minute_traffic_stops_where_the_rows_span_more_than_two_hours() -> None:
    """A task whose record batch rows span over ``SHORT_SPAN_MS`` drops its minutes and says
    so: the job charts hours then, and a part of the minutes would be wrong."""
    rows = pa.Table.from_batches([f["record_batch"] for f in _flushes(1)
                                  if "record_batch" in f])
    minutes = rollups.MinuteTraffic()
    columns = [c for c in minutes.columns if c != SKIP]
    table = rows.select(columns).append_column(SKIP, pa.nulls(rows.num_rows, pa.string()))
    minutes.add(table)
    assert [p for p, _ in minutes.results()] == [rollups.MINUTES]
    later = table.set_column(table.schema.get_field_index("time_ms"), "time_ms",
                             pc.add(table["time_ms"], partials.SHORT_SPAN_MS))
    minutes.add(later)
    assert minutes.results() == [("traffic:over", b"")]
