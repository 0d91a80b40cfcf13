"""The Spark side of the audit job: every rollup of ``partials`` run as Spark tasks, merged.

The heavy part of the job, grouping millions of rows, runs in Spark's tasks as Arrow code
(``partials``); the driver merges the tasks' small partial tables into the rows the reports are
built from. There are three kinds of task, each kind one Spark job (the files two, in turn,
when the job asks for some rollups later: ``collect_in_turn``):

- **Parquet files on a local or shared path** (the columnar layout, the common case): the
  driver plans tasks of whole hours of a dataset's files (both connection datasets' files of
  the same hours together), about two per core, costliest first, and each task reads its
  files with pyarrow (only the columns its rollup needs), classifies the rows (``SKIP``), keeps
  the ``--from/--to`` window and returns its partial tables as Arrow IPC bytes. The executors
  must see the path: on a multi-host cluster it is a shared file system mounted at the same
  place.
- **A Kafka topic** (``run_kafka_task``, one task per Kafka partition): each task reads its
  partition with a consumer, decodes each Arrow message as it arrives (only the columns the
  rollups read) and aggregates every ``CHUNK_ROWS`` rows of a dataset, so the topic is read
  once and no row of it becomes a Spark row. The versioned datasets (``ROLLUPS``: a segment
  is sent again at every flush while it grows) are kept at their latest version per id as
  the task goes and go to the driver that way, where the latest of each id over all tasks is
  kept before they are aggregated (``merge_versions``). JSON messages of the old sink are
  only counted there; if there are any, ``collect`` reads them in a second pass as
  DataFrames (``sources.kafka_json_tables``).
- **DataFrames** (JSON Lines, ``--dedupe``, Hadoop URLs such as ``s3a://`` and ``hdfs://``):
  Spark reads and classifies them (``sources``); ``mapInArrow`` hands each partition to the
  same partial code. The connection datasets are repartitioned by connection first, so that a
  task holds every row of its connections.

Nothing is cached and no rows are shuffled (but that repartition); what reaches the driver is
a few partial rows per group and task. The rollups'
counts for the summary (events, skipped rows, first and last time, instances) come from the
same rows (``split_counts``).
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import reduce
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from sluice.spark_audit.partials import (
    CHECKS,
    MINUTE_MS,
    SHORT_SPAN_MS,
    PartialSet,
    Rollup,
    skipped,
    traffic,
)
from sluice.spark_audit.schema import MALFORMED, SCHEMA_VERSION, SKIP, UNKNOWN_VERSION
from sluice.spark_audit.sources import Inputs, LocalFile, Window, kafka_json_tables
from sluice.telemetry_schema.columns import (
    ROLLUPS,
    SCHEMAS,
    UNIQUE_COLUMNS,
    latest_versions,
    time_column,
)
from sluice.telemetry_schema.integrity import Verifier, read_sidecar

# The dataset each part aggregates (``connections`` reads two: its rows carry ``_type``).
PART_DATASETS = {
    "batches": "record_batch",
    "runs": "offset_run",
    "found": "finding",
    "admin": "admin",
    "loads": "filter_loaded",
    "drops": "telemetry_dropped",
    "transforms": "transform_batch",
    "encryption": "encryption",
}
_PARTIAL_SCHEMA = "part string, data binary"
# Tasks per core: enough to even out unequal tasks, few enough that each stays large.
TASKS_PER_CORE = 2


@dataclass(frozen=True)
class FileTask:
    """What one task reads: per unit, a rollup and its datasets' files (whole hours)."""

    units: tuple[tuple[str, tuple[tuple[str, tuple[str, ...]], ...]], ...]


def plan_tasks(files: list[LocalFile], rollups: Mapping[str, Rollup], cores: int,
               size: Any = os.path.getsize) -> list[FileTask]:
    """Split every rollup's files into runs of whole hours of about equal cost and pack the
    runs into about ``TASKS_PER_CORE`` tasks per core (largest first, onto the lightest), the
    costliest task first (Spark starts them in order). A file's cost is its size times its
    rollup's ``cost_per_byte``."""
    # Only the files of the rollups asked for count (a job may run some of them).
    per_byte = {d: max(r.cost_per_byte for r in rollups.values() if d in r.datasets)
                for d in {d for r in rollups.values() for d in r.datasets}}
    costs = {f.path: size(f.path) * per_byte[f.dataset] for f in files if f.dataset in per_byte}
    bins = max(1, TASKS_PER_CORE * cores)
    target = max(sum(costs.values()) / bins, 1.0)
    units: list[tuple[float, str, dict[str, list[str]]]] = []
    for name, rollup in rollups.items():
        hours: dict[str, dict[str, list[str]]] = {}
        for f in files:
            if f.dataset in rollup.datasets:
                hours.setdefault(f.hour, {}).setdefault(f.dataset, []).append(f.path)
        chunk: dict[str, list[str]] = {}
        weight = 0.0
        for hour in sorted(hours):
            for dataset, paths in hours[hour].items():
                chunk.setdefault(dataset, []).extend(paths)
                weight += sum(costs[p] for p in paths)
            if weight >= target:
                units.append((weight, name, chunk))
                chunk, weight = {}, 0.0
        if chunk:
            units.append((weight, name, chunk))
    tasks: list[list[tuple[float, str, dict[str, list[str]]]]] = [
        [] for _ in range(min(bins, len(units)))
    ]
    loads = [0.0] * len(tasks)
    for unit in sorted(units, key=lambda u: -u[0]):
        i = loads.index(min(loads))
        tasks[i].append(unit)
        loads[i] += unit[0]
    order = sorted(range(len(tasks)), key=lambda i: -loads[i])
    return [
        FileTask(tuple(
            (name, tuple((d, tuple(paths)) for d, paths in sorted(chunk.items())))
            for _w, name, chunk in tasks[i]
        ))
        for i in order if tasks[i]
    ]


def classify(table: pa.Table, dataset: str) -> pa.Array | pa.ChunkedArray:
    """``SKIP`` of each row of a Parquet read: ``malformed`` (no version, or no time), the
    version unknown, or null for a row the reports use. The same rule as ``sources``'s for
    DataFrames."""
    version = table["schema_version"]
    if (version.null_count == 0 and table[time_column(dataset)].null_count == 0
            and pc.min_max(version).as_py() == {"min": SCHEMA_VERSION, "max": SCHEMA_VERSION}):
        return pa.nulls(table.num_rows, pa.string())  # every row usable: the common case
    ours = pc.fill_null(pc.equal(version, SCHEMA_VERSION), False)
    malformed = pc.or_(pc.is_null(version),
                       pc.and_(ours, pc.is_null(table[time_column(dataset)])))
    none = pa.nulls(table.num_rows, pa.string())
    return pc.if_else(malformed, pa.scalar(MALFORMED),
                      pc.if_else(ours, none, pa.scalar(UNKNOWN_VERSION)))


# A part of every task's result: what it verified and refused, a row per (source, dataset,
# outcome) with the units (files, messages) counted: ``outcome`` is ``verified`` or a reason
# (``integrity.REASONS``, ``replayed``).
INTEGRITY = "integrity"
VERIFIED = "verified"
Tally = dict[tuple[str, str, str], int]


def tally_add(tally: Tally, source: str, dataset: str, outcome: str, n: int = 1) -> None:
    key = (source, dataset, outcome)
    tally[key] = tally.get(key, 0) + n


def integrity_table(tally: Tally) -> pa.Table:
    keys = sorted(tally)
    return pa.table({
        "source": pa.array([k[0] for k in keys], pa.string()),
        "dataset": pa.array([k[1] for k in keys], pa.string()),
        "outcome": pa.array([k[2] for k in keys], pa.string()),
        "units": pa.array([tally[k] for k in keys], pa.int64()),
    })


def integrity_rows(tables: Iterable[pa.Table]) -> list[dict[str, Any]]:
    """Every task's ``INTEGRITY`` tables summed per (source, dataset, outcome)."""
    tally: Tally = {}
    for table in tables:
        for r in table.to_pylist():
            tally_add(tally, r["source"], r["dataset"], r["outcome"], r["units"])
    return integrity_table(tally).to_pylist()


def file_name_in_layout(path: str) -> str:
    """What a published Parquet file's tag covers besides its bytes: ``<dataset>/date=.../
    hour=.../<name>`` (``parquet.published_name``)."""
    return "/".join(path.split("/")[-4:])


def read_files(dataset: str, paths: tuple[str, ...], columns: tuple[str, ...],
               window: Window, dictionary: tuple[str, ...] = (),
               verifier: Verifier | None = None, tally: Tally | None = None) -> pa.Table:
    """The rows of ``paths`` in the window (and every skipped row), with ``SKIP``; the string
    columns ``dictionary`` dictionary-encoded (one dictionary per column for the table).
    With ``verifier``, a file whose tag does not verify is not read: it is counted in
    ``tally``."""
    wanted = [c for c in columns if c != SKIP]
    need = list(dict.fromkeys([*wanted, "schema_version", time_column(dataset)]))
    # The dataset's schema: a column an older file lacks reads as nulls.
    schema = pa.schema([
        f.with_type(pa.dictionary(pa.int32(), f.type)) if f.name in dictionary else f
        for f in (SCHEMAS[dataset].field(c) for c in need)
    ])
    read = [_read_file(path, schema, dictionary, verifier, tally, dataset) for path in paths]
    tables = [t for t in read if t is not None]
    table = pa.concat_tables(tables) if tables else schema.empty_table()
    if dictionary:
        table = table.unify_dictionaries()
    return _classified(table, dataset, window).select([*wanted, SKIP])


def _read_file(path: str, schema: pa.Schema, dictionary: tuple[str, ...],
               verifier: Verifier | None = None, tally: Tally | None = None,
               dataset: str = "") -> pa.Table | None:
    """The columns of ``schema`` from one Parquet file, as the schema types them (a column
    the file lacks as nulls). ``pyarrow.parquet`` reads a known file as fast as
    ``pyarrow.dataset`` does here, and the chunks of ``run_file_task`` are lists of files:
    there is nothing to discover. With ``verifier`` the whole file is read into memory once,
    its tag checked over those bytes and the columns read from them; None (counted in
    ``tally``) when the tag does not verify."""
    import pyarrow.parquet as pq

    source: Any = path
    if verifier is not None:
        with open(path, "rb") as f:
            data = f.read()
        reason = verifier.check_file(file_name_in_layout(path), data, read_sidecar(path))
        if tally is not None:
            tally_add(tally, "files", dataset, reason or VERIFIED)
        if reason is not None:
            return None
        source = pa.BufferReader(data)
    file = pq.ParquetFile(source, read_dictionary=[c for c in dictionary if c in schema.names])
    have = set(file.schema_arrow.names)
    read = file.read(columns=[c for c in schema.names if c in have], use_threads=False)
    table = pa.table(
        [read[f.name] if f.name in have else pa.nulls(read.num_rows, f.type) for f in schema],
        names=schema.names,
    )
    return table if table.schema.equals(schema) else table.cast(schema)


def _classified(table: pa.Table, dataset: str, window: Window) -> pa.Table:
    """``table`` with ``SKIP``, without the usable rows outside the window."""
    table = table.append_column(SKIP, classify(table, dataset))
    time_col = time_column(dataset)
    keep = None
    for bound, op in ((window.from_ms, pc.greater_equal), (window.to_ms, pc.less)):
        if bound is not None:
            cond = pc.fill_null(op(table[time_col], bound), False)
            keep = cond if keep is None else pc.and_(keep, cond)
    if keep is not None:
        table = table.filter(pc.or_(keep, pc.is_valid(table[SKIP])))
    return table


def latest(table: pa.Table) -> pa.Table:
    """The highest ``version`` of each rollup row ``id`` (a Kafka topic holds a segment again
    at every flush while it grows); skipped rows are all kept, to be counted."""
    if table[SKIP].null_count == table.num_rows:  # no skipped row: nothing to set apart
        return latest_versions(table)
    usable = pc.is_null(table[SKIP])
    return pa.concat_tables([latest_versions(table.filter(usable)),
                             table.filter(pc.invert(usable))])


def _system_memory() -> None:
    """Arrow's allocations in this Python worker from the C library's allocator, which keeps
    freed memory for the next task. Measured on the 10M-event bench data, a task's first run
    under Arrow's default (jemalloc) spent as much time in the kernel (page faults) as
    grouping the rows, and the connection join kept doing so on later runs (1.2-2.6 s of
    system time against 0.1-0.5 s); glibc by default maps every allocation over 128 KB to
    fresh pages and unmaps it when freed, so the largest threshold it takes (32 MB) and no
    trimming keep those pages mapped too."""
    if pa.default_memory_pool().backend_name == "system":
        return
    pa.set_memory_pool(pa.system_memory_pool())
    pa.set_cpu_count(1)
    try:
        import ctypes

        libc = ctypes.CDLL("libc.so.6")
        libc.mallopt(-3, 32 * 1024 * 1024)  # M_MMAP_THRESHOLD
        libc.mallopt(-1, 1 << 30)  # M_TRIM_THRESHOLD
    except (OSError, AttributeError):  # not glibc: its defaults
        pass


def _ipc(part: str, table: pa.Table) -> tuple[str, bytes]:
    """``table`` as Arrow IPC, compressed: a task's result under Spark's 1 MiB
    (``spark.task.maxDirectResultSize``) goes to the driver with the task's end instead of
    through the block manager (measured: the offset runs' partial of 11,628 rows is 3.2 MB
    as it is, 0.37 MB compressed, in 3 ms)."""
    sink = pa.BufferOutputStream()
    options = pa.ipc.IpcWriteOptions(compression="zstd")
    with pa.ipc.new_stream(sink, table.schema, options=options) as writer:
        writer.write_table(table)
    return part, sink.getvalue().to_pybytes()


def _partial_batches(pairs: Iterable[tuple[str, bytes]]) -> Iterator[pa.RecordBatch]:
    """(part, Arrow IPC) pairs as ``mapInArrow`` returns them (``_PARTIAL_SCHEMA``)."""
    for part, data in pairs:
        yield pa.RecordBatch.from_arrays([pa.array([part]), pa.array([data], pa.binary())],
                                         names=["part", "data"])


# Parquet bytes a task reads at once for a rollup that merges in Arrow (see run_file_task).
CHUNK_BYTES = 8 << 20


def _chunks(paths: tuple[str, ...], size: Any) -> Iterator[tuple[str, ...]]:
    """``paths`` in runs of at least ``CHUNK_BYTES`` (the last one may be smaller)."""
    chunk: list[str] = []
    total = 0
    for path in paths:
        chunk.append(path)
        total += size(path)
        if total >= CHUNK_BYTES:
            yield tuple(chunk)
            chunk, total = [], 0
    if chunk:
        yield tuple(chunk)


MINUTES = "traffic_minutes"  # ``collect``'s result: bytes per client and minute
_MINUTES_OVER = "traffic:over"  # a task's part: its record batch rows span too long


class MinuteTraffic:
    """Bytes per client and minute for the traffic chart (``partials.traffic``), rolled up by
    a file or Kafka task from the record batch rows it aggregates anyway, while those rows
    span at most ``SHORT_SPAN_MS``. A job whose events span longer charts hours or days (from
    the ``batches`` rollup); a task whose rows span longer cannot be part of a shorter job, so
    it stops there and says so (part ``_MINUTES_OVER``). This spares a second pass over the
    input (a second read of a Kafka topic) for short spans."""

    def __init__(self) -> None:
        self.rollup = replace(traffic(MINUTE_MS), name=MINUTES)
        self.columns = list(self.rollup.columns["record_batch"])
        self.first: int | None = None
        self.last: int | None = None
        self.over = False
        self.partials: list[pa.Table] = []

    def add(self, rows: pa.Table) -> None:
        """Classified record batch rows (with at least ``self.columns``)."""
        if self.over:
            return
        span = pc.min_max(rows["time_ms"].filter(pc.is_null(rows[SKIP]))).as_py()
        if span["min"] is None:
            return
        self.first = span["min"] if self.first is None else min(self.first, span["min"])
        self.last = span["max"] if self.last is None else max(self.last, span["max"])
        if self.last - self.first > SHORT_SPAN_MS:
            self.over = True
            self.partials.clear()
            return
        self.partials.extend(self.rollup.partial({"record_batch": rows.select(self.columns)})
                             .values())

    def results(self) -> list[tuple[str, bytes]]:
        if self.over:
            return [(_MINUTES_OVER, b"")]
        merged = self.rollup.merge_partials([{self.rollup.name: t} for t in self.partials])
        return [_ipc(part, table) for part, table in merged.items()]


def run_file_task(task: FileTask, rollups: Mapping[str, Rollup],
                  window: Window, size: Any = os.path.getsize, minutes: bool = False,
                  verifier: Verifier | None = None) -> list[tuple[str, bytes]]:
    """One task: read each unit's files, run its rollup's partial; (part, Arrow IPC) pairs.

    A rollup whose partial tables merge in Arrow (``Rollup.merges_in_arrow``) reads its files
    ``CHUNK_BYTES`` at a time and merges their partials: the task then holds about 1.5
    million record batch rows at a time instead of all its rows. Measured on a task of 4.25
    million: 0.88 s instead of 1.03 s in a new worker (0.14 s of system time instead of 0.34:
    the memory of one chunk is reused by the next instead of being faulted in anew), 0.58 s
    instead of 0.70 s later. ``size`` gives a file's size in bytes. ``minutes``: the record
    batch rows read also feed a ``MinuteTraffic``. ``verifier``: only files whose tag it
    accepts are read (part ``INTEGRITY`` counts them and the others)."""
    _system_memory()
    out: list[tuple[str, bytes]] = []
    tally: Tally = {}
    traffic_minutes = MinuteTraffic() if minutes else None
    for name, files in task.units:
        rollup = rollups[name]
        if rollup.merges_in_arrow and len(files) == 1:
            dataset, paths = files[0]
            cols = rollup.columns[dataset]
            chunks = []
            for chunk in _chunks(paths, size):
                rows = read_files(dataset, chunk, cols, window, rollup.dictionary, verifier,
                                  tally)
                if (traffic_minutes is not None and dataset == "record_batch"
                        and set(traffic_minutes.columns) <= set(cols)):
                    traffic_minutes.add(rows)
                chunks.append(rollup.partial({dataset: rows}))
            partial = rollup.merge_partials(chunks)
        else:
            partial = rollup.partial({
                d: read_files(d, paths, rollup.columns[d], window, rollup.dictionary, verifier,
                              tally)
                for d, paths in files
            })
        out.extend(_ipc(part, table) for part, table in partial.items())
    if traffic_minutes is not None:
        out.extend(traffic_minutes.results())
    if tally:
        out.append(_ipc(INTEGRITY, integrity_table(tally)))
    return out


def _partials_of_batches(rollup: Rollup, batches: Iterator[pa.RecordBatch]
                         ) -> Iterator[pa.RecordBatch]:
    """``mapInArrow``: one partition's rows (tagged ``_dataset``) -> its partial tables."""
    _system_memory()
    got = [batch for batch in batches if batch.num_rows]
    if not got:
        return
    rows = _plain_types(pa.Table.from_batches(got))
    tables = {}
    for dataset in rollup.datasets:
        mine = rows.filter(pc.equal(rows["_dataset"], dataset))
        if mine.num_rows:
            tables[dataset] = mine.select(list(rollup.columns[dataset]))
    yield from _partial_batches(_ipc(p, t) for p, t in rollup.partial(tables).items())


_LATEST = "latest:"  # partial name prefix: rollup rows of a dataset, latest version per id
JSON_MESSAGES = "kafka:json_messages"  # a Kafka task's count of JSON messages (not read there)
# Rows of a dataset a Kafka task decodes before it aggregates them and lets them go. Measured
# on 1 million events a task in a new worker: 87,000 page faults and 2.3 s with 250,000,
# 235,000 and 2.8 s with 1.5 million (the memory of one chunk is reused by the next).
CHUNK_ROWS = 250_000


def _reads_versions(rollup: Rollup) -> bool:
    return any(d in ROLLUPS for d in rollup.datasets)


@dataclass
class _MessageTables:
    """What a Kafka task holds of one dataset: the columns and dictionary columns it decodes,
    the tables decoded since the last aggregation and their rows, and for a versioned dataset
    the latest version of each id so far (``versions``)."""

    columns: tuple[str, ...]
    dictionary: frozenset[str]
    tables: list[pa.Table] = field(default_factory=list)
    rows: int = 0
    versions: pa.Table | None = None

    def take(self, window: Window, dataset: str) -> pa.Table:
        """The rows decoded since the last call, classified (``SKIP``) and in the window."""
        table = pa.concat_tables(self.tables)
        if self.dictionary:
            table = table.unify_dictionaries()
        self.tables, self.rows = [], 0
        return _classified(table, dataset, window)

    def keep_latest(self, window: Window, dataset: str) -> pa.Table:
        """A versioned dataset's latest version of each id among every row so far: the rows
        held shrink to one per id (a segment is sent again at every flush while it grows)."""
        parts = [] if self.versions is None else [self.versions]
        if self.tables:
            parts.append(self.take(window, dataset))
        table = pa.concat_tables(parts)
        if self.dictionary:
            table = table.unify_dictionaries()
        self.versions = latest(table)
        return self.versions


def _message_plan(rollups: Mapping[str, Rollup]) -> dict[str, _MessageTables]:
    """Per dataset the rollups read: the columns to decode (the versioned datasets also their
    ``id`` and ``version``) and the string columns to keep dictionary-encoded (those a rollup
    reading the dataset groups by their dictionary; ``_rollup_tables`` decodes them for the
    others)."""
    plan: dict[str, _MessageTables] = {}
    for dataset in SCHEMAS:
        readers = [r for r in rollups.values() if dataset in r.datasets]
        if not readers:
            continue
        wanted = [c for r in readers for c in r.columns[dataset] if c != SKIP]
        if dataset in ROLLUPS:
            wanted += ["id", "version"]
        wanted += ["schema_version", time_column(dataset)]
        columns = tuple(dict.fromkeys(wanted))
        dictionary = {c for r in readers for c in r.dictionary}
        if dataset in ROLLUPS:
            # Kept as the sink sends them until only the latest versions are left, which go
            # to the driver as plain strings (a fifth of the rows or less to decode).
            dictionary |= {c for c in columns if c not in UNIQUE_COLUMNS
                           and pa.types.is_string(SCHEMAS[dataset].field(c).type)}
        plan[dataset] = _MessageTables(columns, frozenset(dictionary) & set(columns))
    return plan


def _undictionaried(table: pa.Table, keep: Iterable[str] = ()) -> pa.Table:
    """``table`` with its dictionary-encoded columns but ``keep`` as plain values."""
    kept = set(keep)
    for i, f in enumerate(table.schema):
        if pa.types.is_dictionary(f.type) and f.name not in kept:
            table = table.set_column(i, f.name, table[f.name].cast(f.type.value_type))
    return table


def _rollup_tables(rollup: Rollup, tables: Mapping[str, pa.Table]) -> dict[str, pa.Table]:
    """``rollup``'s columns of the ``tables`` it reads, as it reads them (dictionary columns
    another rollup of the dataset does not want as such are plain)."""
    return {d: _undictionaried(tables[d].select(list(rollup.columns[d])), rollup.dictionary)
            for d in rollup.datasets if d in tables}


def run_kafka_task(messages: Iterable[tuple[str | None, str | None, bytes | None]],
                   rollups: Mapping[str, Rollup], window: Window, minutes: bool = False
                   ) -> list[tuple[str, bytes]]:
    """One task over a Kafka partition's messages, (dataset, layout, value) as
    ``KafkaArrowReader.arrow_messages`` yields them: decode each Arrow message as it comes
    (``message_table``: only the columns the rollups read), aggregate every ``CHUNK_ROWS`` rows
    of a dataset and let them go, and return each rollup's partial tables as (part, Arrow IPC)
    pairs. JSON messages (dataset None) are only counted (part ``JSON_MESSAGES``): the job
    reads them apart. The rows of the versioned datasets (``ROLLUPS``) go to the driver at
    their latest version here, since another version of a row may be in another partition.
    A Kafka partition holds whatever its producers keyed to it, so connections are not
    assumed whole: any split of the rows gives the same result (``whole_connections``).
    ``minutes``: the record batch rows also feed a ``MinuteTraffic``."""
    from sluice.spark_audit.kafka_arrow_source import message_table

    _system_memory()
    traffic_minutes = MinuteTraffic() if minutes else None
    plan = _message_plan(rollups if traffic_minutes is None
                         else {**rollups, MINUTES: traffic_minutes.rollup})
    got = PartialSet()
    json_messages = 0

    def aggregate(tables: Mapping[str, pa.Table]) -> None:
        if traffic_minutes is not None and "record_batch" in tables:
            traffic_minutes.add(tables["record_batch"])
        for rollup in rollups.values():
            if _reads_versions(rollup):
                continue
            mine = _rollup_tables(rollup, tables)
            if mine:
                for part, table in rollup.partial(mine, whole_connections=False).items():
                    got.add(part, table)

    for dataset, layout, value in messages:
        if dataset is None:
            json_messages += 1
            continue
        held = plan.get(dataset)
        if held is None:
            continue  # a dataset no report reads (or one this job does not know)
        table = message_table(dataset, layout, value, held.columns, held.dictionary)
        held.tables.append(table)
        held.rows += table.num_rows
        if held.rows >= CHUNK_ROWS:
            if dataset in ROLLUPS:
                held.keep_latest(window, dataset)
            else:
                aggregate({dataset: held.take(window, dataset)})
    aggregate({d: held.take(window, d) for d, held in plan.items()
               if held.tables and d not in ROLLUPS})
    out: list[tuple[str, bytes]] = []
    for dataset in ROLLUPS:
        held = plan.get(dataset)
        if held is not None and (held.tables or held.versions is not None):
            # Plain strings: the driver concatenates every task's rows of the dataset.
            out.append(_ipc(_LATEST + dataset,
                            _undictionaried(held.keep_latest(window, dataset))))
    for rollup in rollups.values():
        if rollup.name in got.tables:
            tables = got.tables[rollup.name]
            if rollup.merges_in_arrow and len(tables) > 1:
                tables = list(rollup.merge_partials([{rollup.name: t} for t in tables])
                              .values())
            out.extend(_ipc(rollup.name, t) for t in tables)
    out.extend(_ipc(part, t) for part, ts in got.tables.items() if part not in rollups
               for t in ts)
    if traffic_minutes is not None:
        out.extend(traffic_minutes.results())
    if json_messages:
        out.append((JSON_MESSAGES, str(json_messages).encode()))
    return out


KAFKA_IDS = "kafka:message_ids"  # a Kafka task's part: the verified message ids it read


def kafka_partition_task(options: dict[str, str], partition: Any, rollups: Mapping[str, Rollup],
                         window: Window, minutes: bool = False,
                         verifier: Verifier | None = None,
                         skip: Mapping[int, frozenset[bytes]] | None = None
                         ) -> list[tuple[str, bytes]]:
    """``run_kafka_task`` over one partition of the topic, its messages checked by
    ``verifier`` (when there is one): with the task's parts, ``INTEGRITY`` (messages verified
    and refused per dataset) and ``KAFKA_IDS`` (the verified messages' ids, for the driver to
    find copies of one message in several partitions). ``skip``: per partition number, ids
    of verified messages this task must not read (such copies)."""
    from sluice.spark_audit.kafka_arrow_source import KafkaArrowReader

    reader = KafkaArrowReader(options, verifier,
                              (skip or {}).get(int(partition.partition), frozenset()))
    out = run_kafka_task(reader.arrow_messages(partition), rollups, window, minutes)
    if verifier is not None:
        tally: Tally = {}
        for dataset, n in reader.verified.items():
            tally_add(tally, "kafka", dataset, VERIFIED, n)
        for (dataset, reason), n in reader.rejected.items():
            tally_add(tally, "kafka", dataset, reason, n)
        out.append(_ipc(INTEGRITY, integrity_table(tally)))
        ids = pa.table({"partition": pa.repeat(pa.scalar(int(partition.partition), pa.int32()),
                                               len(reader.message_ids)),
                        "message_id": pa.array(reader.message_ids, pa.binary())})
        out.append(_ipc(KAFKA_IDS, ids))
    return out


def replayed_ids(ids: Sequence[pa.Table]) -> dict[int, frozenset[bytes]]:
    """Verified message ids read in more than one partition (a message is sent to one): per
    partition, the copies to skip (the lowest partition's copy is the one kept)."""
    got = [t for t in ids if t.num_rows]
    if not got:
        return {}
    table = pa.concat_tables(got)
    per = table.group_by("message_id").aggregate([("partition", "count_distinct"),
                                                  ("partition", "min")])
    copied = per.filter(pc.greater(per["partition_count_distinct"], 1))
    if copied.num_rows == 0:
        return {}
    keep = dict(zip(copied["message_id"].to_pylist(), copied["partition_min"].to_pylist(),
                    strict=True))
    skip: dict[int, set[bytes]] = {}
    for partition, message_id in zip(table["partition"].to_pylist(),
                                     table["message_id"].to_pylist(), strict=True):
        home = keep.get(message_id)
        if home is not None and partition != home:
            skip.setdefault(partition, set()).add(message_id)
    return {p: frozenset(v) for p, v in skip.items()}


def missing_messages(ids: Sequence[pa.Table]) -> dict[str, int]:
    """Per sink instance, how many message ids below its highest verified one were never
    read (``<instance>-<n>``, n = 1, 2, ...): messages deleted from the topic (or lost). A
    deleted tail cannot be seen."""
    numbers: dict[str, set[int]] = {}
    for table in ids:
        for raw in table["message_id"].to_pylist():
            instance, _, n = raw.decode("utf-8", "replace").rpartition("-")
            if n.isdigit() and instance:
                numbers.setdefault(instance, set()).add(int(n))
    return {i: max(ns) - len(ns) for i, ns in sorted(numbers.items()) if max(ns) > len(ns)}


def merge_versions(got: PartialSet, rollups: Mapping[str, Rollup]) -> None:
    """The versioned datasets' rows of every message task: the latest version of each id over
    all tasks, then the partial of every rollup that reads them (in the driver: one row per
    segment id, a few per offset run)."""
    for name in [n for n in got.tables if n.startswith(_LATEST)]:
        dataset = name[len(_LATEST):]
        rows = latest(pa.concat_tables(got.tables.pop(name), promote_options="permissive"))
        for rollup in rollups.values():
            if dataset in rollup.datasets:
                for part, table in rollup.partial(
                        {dataset: rows.select(list(rollup.columns[dataset]))}).items():
                    got.add(part, table)


def _plain_types(table: pa.Table) -> pa.Table:
    """Spark may hand strings over as ``large_string``: the same types as a Parquet read, so
    that partial tables of both kinds of task concatenate and join."""
    fields = []
    for f in table.schema:
        t = f.type
        if pa.types.is_large_string(t):
            t = pa.string()
        elif pa.types.is_large_list(t) and pa.types.is_large_string(t.value_type):
            t = pa.list_(pa.string())
        elif pa.types.is_list(t) and pa.types.is_large_string(t.value_type):
            t = pa.list_(pa.string())
        fields.append(f.with_type(t))
    schema = pa.schema(fields)
    return table if schema.equals(table.schema) else table.cast(schema)


def _frame_partials(rollup: Rollup, frames: Mapping[str, DataFrame]) -> DataFrame | None:
    tagged = [
        frames[d].select(*rollup.columns[d]).withColumn("_dataset", F.lit(d))
        for d in rollup.datasets if d in frames
    ]
    if not tagged:
        return None
    rows = reduce(lambda a, b: a.unionByName(b, allowMissingColumns=True), tagged)
    if rollup.by_connection:
        rows = rows.repartition("instance_id", "connection_id")

    def partial(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        return _partials_of_batches(rollup, batches)

    return rows.mapInArrow(partial, _PARTIAL_SCHEMA)


def collect(spark: SparkSession, inputs: Inputs, rollups: Mapping[str, Rollup],
            count_skipped: bool = True, minutes: bool = False, tables: Collection[str] = ()
            ) -> dict[str, Any]:
    """Every rollup over ``inputs``: partial tables in Spark's tasks, merged in the driver;
    rows come back as dicts per rollup name, or as one Arrow table for the rollups named in
    ``tables``. ``count_skipped``: JSON lines and messages the job cannot use are counted
    (rollup ``skipped``), wherever they turn up. ``minutes``: also ``MINUTES``
    (``MinuteTraffic``), when every record batch row was read by a file or Kafka task and
    none of them saw rows spanning more than ``SHORT_SPAN_MS``."""
    got = PartialSet()
    cores = int(spark.sparkContext.defaultParallelism)
    tasks = plan_tasks(inputs.local_files, rollups, cores)
    verifier = inputs.verifier
    if tasks:
        window = inputs.window
        pairs = spark.sparkContext.parallelize(tasks, len(tasks)).flatMap(
            lambda task: run_file_task(task, rollups, window, minutes=minutes,
                                       verifier=verifier)
        ).collect()
        add_pairs(got, pairs)
    frames_read = dict(inputs.tables)
    checks = inputs.checks
    if inputs.kafka is not None and inputs.kafka.partitions:
        json_messages = _collect_kafka(spark, inputs, rollups, got, minutes)
        if json_messages:
            json_tables, checks = kafka_json_tables(spark, inputs.kafka, inputs.window,
                                                    inputs.verifier)
            frames_read.update(json_tables)
    if checks is not None and count_skipped:
        frames_read[CHECKS] = checks
        rollups = {**rollups, "skipped": skipped()}
    frames = [f for f in (_frame_partials(r, frames_read) for r in rollups.values())
              if f is not None]
    if frames:
        for row in reduce(lambda a, b: a.unionByName(b), frames).collect():
            got.add(row["part"], pa.ipc.open_stream(row["data"]).read_all())
    # DataFrame inputs (JSON, --dedupe, Hadoop URLs) do not roll up minutes.
    return finish(got, rollups, minutes and "record_batch" not in frames_read, tables)


class Later:
    """What ``collect_in_turn`` returns for its second job: ``rows()`` waits for it."""

    def __init__(self, collect: Callable[[], dict[str, Any]], thread: bool) -> None:
        self._rows: dict[str, Any] | None = None
        self._error: BaseException | None = None
        self._thread: threading.Thread | None = None
        if not thread:
            self._run(collect)
            return
        # Spark's own thread class: the job's JVM thread follows the Python thread's
        # properties (pinned thread mode) and ends with it.
        from pyspark import InheritableThread

        self._thread = InheritableThread(target=self._run, args=(collect,), daemon=True)
        self._thread.start()

    def _run(self, collect: Callable[[], dict[str, Any]]) -> None:
        try:
            self._rows = collect()
        except BaseException as exc:  # handed to the caller of rows()
            self._error = exc

    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def rows(self) -> dict[str, Any]:
        if self._thread is not None:
            self._thread.join()
        if self._error is not None:
            raise self._error
        assert self._rows is not None
        return self._rows


# How long ``collect_in_turn`` waits for Spark to register its first job before it submits
# the second anyway (they then run in either order, with the same result).
_FIRST_JOB_WAIT_S = 10.0


def collect_in_turn(spark: SparkSession, inputs: Inputs, rollups: Mapping[str, Rollup],
                    later: Collection[str], minutes: bool = False,
                    tables: Collection[str] = ()) -> tuple[dict[str, Any], Later]:
    """``collect`` in two parts: the rollups named in ``later`` run as a second Spark job,
    submitted once Spark holds the first, so that the first job's tasks run first and its rows
    come back while the second job's tasks run; the driver builds the reports of the first
    part meanwhile, instead of after every task with one core of a small machine idle.
    (Spark schedules the jobs of a session first come, first served.) Parquet files only:
    other inputs are collected in one part, and ``Later`` then holds them already."""
    if inputs.tables or inputs.checks is not None or inputs.kafka is not None:
        every = collect(spark, inputs, rollups, minutes=minutes, tables=tables)
        rest = {name: every.pop(name) for name in later if name in every}
        return every, Later(lambda: rest, thread=False)
    first = {name: r for name, r in rollups.items() if name not in later}
    second = {name: r for name, r in rollups.items() if name in later}
    tracker = spark.sparkContext.statusTracker()
    jobs_before = len(tracker.getJobIdsForGroup(None))
    first_part = Later(lambda: collect(spark, inputs, first, minutes=minutes, tables=tables),
                       thread=True)
    deadline = time.monotonic() + _FIRST_JOB_WAIT_S
    while (first_part.running() and time.monotonic() < deadline
           and len(tracker.getJobIdsForGroup(None)) == jobs_before):
        time.sleep(0.005)
    second_part = Later(lambda: collect(spark, inputs, second, tables=tables), thread=True)
    return first_part.rows(), second_part


def finish(got: PartialSet, rollups: Mapping[str, Rollup], minutes: bool = False,
           tables: Collection[str] = ()) -> dict[str, Any]:
    """Every task's partial tables (``got``) merged into each rollup's rows (a list of dicts;
    for the rollups named in ``tables`` one Arrow table, ``Rollup.final_table``); with
    ``minutes`` also ``MINUTES``, unless a task's rows spanned too long for them; and
    ``INTEGRITY``: ``{"units": rows of (source, dataset, outcome, units), "missing_messages":
    {instance: n}}``."""
    merge_versions(got, rollups)
    result: dict[str, Any] = {
        name: rollup.final_table(got.tables) if name in tables else rollup.final(got.tables)
        for name, rollup in rollups.items()
    }
    result[INTEGRITY] = {"units": integrity_rows(got.tables.get(INTEGRITY, ())),
                         "missing_messages": got.missing_messages}
    if minutes and _MINUTES_OVER not in got.tables:
        result[MINUTES] = MinuteTraffic().rollup.final(got.tables)
    return result


def add_pairs(got: PartialSet, pairs: Iterable[tuple[str, bytes]]) -> None:
    """Tasks' (part, Arrow IPC) pairs into ``got`` (a marker part has no bytes)."""
    for part, data in pairs:
        got.add(part, pa.ipc.open_stream(data).read_all() if data else pa.table({}))


def _collect_kafka(spark: SparkSession, inputs: Inputs, rollups: Mapping[str, Rollup],
                   got: PartialSet, minutes: bool) -> int:
    """One Spark job, a task per Kafka partition (``run_kafka_task``): their partials into
    ``got``; returns how many JSON messages they found."""
    assert inputs.kafka is not None
    options, partitions, window = inputs.kafka.options, inputs.kafka.partitions, inputs.window
    verifier = inputs.verifier

    def run(skip: Mapping[int, frozenset[bytes]] | None) -> list[tuple[str, bytes]]:
        return spark.sparkContext.parallelize(partitions, len(partitions)).flatMap(
            lambda partition: kafka_partition_task(options, partition, rollups, window,
                                                   minutes, verifier, skip)
        ).collect()

    pairs = run(None)
    if verifier is not None:
        ids = [pa.ipc.open_stream(data).read_all() for part, data in pairs if part == KAFKA_IDS]
        skip = replayed_ids(ids)
        if skip:
            # Copies of verified messages in other partitions than their own (a message is
            # sent to one): read again without them, so that nothing is counted twice.
            pairs = run(skip)
        got.missing_messages = missing_messages(ids)
    json_messages = 0
    for part, data in pairs:
        if part == JSON_MESSAGES:
            json_messages += int(data)
        elif part != KAFKA_IDS:
            add_pairs(got, [(part, data)])
    return json_messages


@dataclass
class TypeCounts:
    """What the summary says about one event type (or dataset)."""

    events: int = 0
    malformed: int = 0
    unknown_version: int = 0
    first_ms: int | None = None
    last_ms: int | None = None
    instances: set[str] = field(default_factory=set)


def _type_counts(counts: dict[str, TypeCounts], kind: str) -> TypeCounts:
    """``counts[kind]``, a new one if there is none (without building one per row)."""
    found = counts.get(kind)
    if found is None:
        found = counts[kind] = TypeCounts()
    return found


def merge_counts(*parts: Mapping[str, TypeCounts]) -> dict[str, TypeCounts]:
    """The counts of several ``split_counts`` results as one (of the same events)."""
    out: dict[str, TypeCounts] = {}
    for part in parts:
        for kind, c in part.items():
            have = out.get(kind)
            if have is None:
                out[kind] = replace(c, instances=set(c.instances))
                continue
            have.events += c.events
            have.malformed += c.malformed
            have.unknown_version += c.unknown_version
            have.first_ms = _least(have.first_ms, c.first_ms)
            have.last_ms = _most(have.last_ms, c.last_ms)
            have.instances |= c.instances
    return out


def _least(a: int | None, b: int | None) -> int | None:
    return b if a is None else a if b is None else min(a, b)


def _most(a: int | None, b: int | None) -> int | None:
    return b if a is None else a if b is None else max(a, b)


def _table_counts(table: pa.Table, counts: dict[str, TypeCounts], kind: str) -> pa.Table:
    """``split_counts`` of a part's Arrow table (``collect``'s ``tables``): its usable rows."""
    if table.num_rows == 0:
        return table
    keys = [k for k in ("_type", SKIP) if k in table.column_names]
    per = table.group_by(keys).aggregate([("_rows", "sum"), ("_first_ms", "min"),
                                          ("_last_ms", "max")])
    for r in per.to_pylist():
        c = _type_counts(counts, r.get("_type") or kind)
        if r[SKIP] == MALFORMED:
            c.malformed += r["_rows_sum"]
        elif r[SKIP] == UNKNOWN_VERSION:
            c.unknown_version += r["_rows_sum"]
        else:
            c.events += r["_rows_sum"]
            c.first_ms = _least(c.first_ms, r["_first_ms_min"])
            c.last_ms = _most(c.last_ms, r["_last_ms_max"])
    usable = table.filter(pc.is_null(table[SKIP]))
    # A row without ``_type`` counts under ``kind``, as in the rows' own loop.
    by_type = ([(t or kind, usable.filter(pc.equal(usable["_type"], t)) if t is not None
                 else usable.filter(pc.is_null(usable["_type"])))
                for t in pc.unique(usable["_type"]).to_pylist()]
               if "_type" in usable.column_names else [(kind, usable)])
    for type_, rows in by_type:
        for col, listed in (("instance_id", False), ("_instances", True)):
            if col in rows.column_names and rows.num_rows:
                values = pc.list_flatten(rows[col]) if listed else rows[col]
                found = {v for v in pc.unique(values).to_pylist() if v is not None}
                if found:
                    _type_counts(counts, type_).instances.update(found)
    return usable


def split_counts(got: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, TypeCounts]]:
    """(the usable rows of every part, counts per event type) from ``collect``'s result (a
    part's rows: dicts, or an Arrow table)."""
    usable: dict[str, Any] = {}
    counts: dict[str, TypeCounts] = {}
    for part, rows in got.items():
        if isinstance(rows, pa.Table):
            usable[part] = _table_counts(rows, counts, PART_DATASETS.get(part, part))
            continue
        if part == "skipped":
            for r in rows:
                c = _type_counts(counts, r["type"])
                if r[SKIP] == MALFORMED:
                    c.malformed += r["_rows"]
                else:
                    c.unknown_version += r["_rows"]
            continue
        if part not in PART_DATASETS and part != "conns":
            usable[part] = rows
            continue
        kept: list[dict[str, Any]] = []
        usable[part] = kept
        default_type = PART_DATASETS.get(part, part)  # "conns" rows name their type
        for r in rows:
            c = _type_counts(counts, r.get("_type") or default_type)
            skip = r[SKIP]
            if skip == MALFORMED:
                c.malformed += r["_rows"]
                continue
            if skip == UNKNOWN_VERSION:
                c.unknown_version += r["_rows"]
                continue
            kept.append(r)
            c.events += r["_rows"]
            c.first_ms = _least(c.first_ms, r["_first_ms"])
            c.last_ms = _most(c.last_ms, r["_last_ms"])
            # The instance is a key of some parts, a list (``_instances``) in others.
            instance = r.get("instance_id")
            if instance is not None:
                c.instances.add(instance)
            listed = r.get("_instances")
            if listed:
                c.instances.update(listed)
    return usable, counts
