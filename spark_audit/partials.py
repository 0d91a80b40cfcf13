"""The audit job's aggregations, in Arrow: a partial rollup per Spark task, merged in the driver.

Each ``Rollup`` turns the rows of one or two datasets into the small rows a report is built
from (``reports``). It does so in two steps, so that Spark's tasks do the heavy part:

- ``partial`` runs in a task (``rollups``), on the Arrow tables the task read (a run of hours
  of the Parquet layout, or one partition of a DataFrame). It classifies nothing and reads no
  files: it groups the rows with Arrow's hash aggregation (multi-threaded C++, about 0.1 µs per
  row here) into one row per group and returns the result as Arrow tables.
- ``final`` runs in the driver on every task's partial tables: it merges rows of equal keys
  (sums add, minima and maxima combine, sets unite) into the rows the reports read.

Every aggregation is associative, so merging the partials of any split of the input gives what
one aggregation over all rows gives. Two need more than merging:

- runs (offset runs, transform runs): islands of overlapping or adjacent offset ranges per
  key. A task merges its own segments into islands; the driver merges those islands again
  (an island of islands is an island of the segments), then numbers them from 1 per key.
- connections: a connection's ``open`` row is written before the client has sent its client
  id and principal; it takes them from the connection's other rows. A task resolves every
  connection whose ``open`` and ``close`` rows it holds (all of the connection's rows lie
  between them in time, and a task reads whole hours of both connection datasets); the rows
  of the others (``pending``) go to the driver per connection, which resolves them there over
  all tasks.

Rows the job skips (``schema.SKIP`` set: malformed, unknown schema version) are aggregated with
their grouping keys blanked, so they fall into one group per reason and dataset, and every
group carries ``_rows`` (rows, or events where an event has several rows), ``_first_ms`` and
``_last_ms`` for the summary (``rollups.split_counts``).

Output rows are dicts keyed by the column names ``reports`` reads; lists (sets) are sorted and
hold no nulls; times stay epoch milliseconds.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from sluice.spark_audit.schema import SKIP
from sluice.telemetry_schema.columns import HOUR_MS

# Joins the items of a list column into one string, so that Arrow can group by it or collect
# its distinct values (its hash aggregations take no list columns); no name or sha256 holds it.
LIST_SEP = "\x1f"
_I64 = pa.int64()

Tables = Mapping[str, pa.Table]


@dataclass(frozen=True)
class Agg:
    """One output column: ``op`` over the prepared column ``src``.

    ``sum`` (nulls count as 0), ``count`` (rows; no ``src``), ``min``, ``max``, ``set`` (the
    distinct non-null values, sorted), ``union`` (``src`` holds lists joined by ``LIST_SEP``:
    the distinct items of all of them, sorted)."""

    out: str
    op: str
    src: str | None = None


_PARTIAL_OP = {"sum": "sum", "count": "count_all", "min": "min", "max": "max",
               "set": "distinct", "union": "distinct"}


def _null_like(col: pa.ChunkedArray | pa.Array) -> pa.Array:
    return pa.nulls(len(col), col.type)


def _blank(table: pa.Table, keys: Iterable[str]) -> pa.Table:
    """``table`` with ``keys`` null on skipped rows (they make one group per reason)."""
    if table[SKIP].null_count == table.num_rows:
        return table  # nothing skipped: the common case, and copying strings is not free
    usable = pc.is_null(table[SKIP])
    for key in keys:
        i = table.schema.get_field_index(key)
        col = _decoded(table[key])
        table = table.set_column(i, key, pc.if_else(usable, col, _null_like(col)))
    return table


def _decoded(col: pa.ChunkedArray) -> pa.ChunkedArray:
    """A dictionary-encoded column as plain values (other columns as they are)."""
    if pa.types.is_dictionary(col.type):
        return col.cast(col.type.value_type)
    return col


def _decoded_type(dtype: pa.DataType) -> pa.DataType:
    return dtype.value_type if pa.types.is_dictionary(dtype) else dtype


def _zero(col: pa.ChunkedArray | pa.Array) -> pa.ChunkedArray | pa.Array:
    return pc.fill_null(pc.cast(col, _I64), 0)


def floor_to(times: pa.ChunkedArray | pa.Array, step_ms: int) -> pa.ChunkedArray:
    """Epoch ms down to a multiple of ``step_ms`` (as Spark's ``floor(t / step) * step``),
    nulls kept. Integer times go through numpy, whose remainder takes the divisor's sign, so
    that times before 1970 floor too: 7 ms for 1.4 million times where Arrow's float64
    division, floor and casts took 53."""
    chunks = times.chunks if isinstance(times, pa.ChunkedArray) else [times]
    if not pa.types.is_integer(times.type):
        buckets = pc.floor(pc.divide(pc.cast(times, pa.float64()), float(step_ms)))
        return pa.chunked_array([pc.multiply(pc.cast(buckets, _I64), step_ms)], _I64)

    def floored(chunk: pa.Array) -> pa.Array:
        values = pc.cast(chunk, _I64).fill_null(0).to_numpy()
        nulls = chunk.is_null().to_numpy(zero_copy_only=False) if chunk.null_count else None
        return pa.array(values - values % step_ms, _I64, mask=nulls)

    return pa.chunked_array([floored(c) for c in chunks], _I64)


def _joined(col: pa.ChunkedArray) -> pa.ChunkedArray:
    return pc.binary_join(col, LIST_SEP)


def _split(value: str | None) -> list[str]:
    return [] if not value else value.split(LIST_SEP)


def group(table: pa.Table, keys: Sequence[str], aggs: Sequence[Agg]) -> pa.Table:
    """One Arrow aggregation: a row per distinct ``keys``, the partial form of ``aggs``."""
    spec: list[tuple[Any, str]] = [([] if a.op == "count" else a.src, _PARTIAL_OP[a.op])
                                   for a in aggs]
    # A key null on every row (``SKIP``, most of the time) splits no group: it is left out of
    # the hashing and put back as nulls. A string key, even all null, takes Arrow's grouping
    # off its fixed-width path: 1.4 million record batch rows grouped in 0.075 s instead of
    # 0.145.
    blank = {k for k in keys if table.num_rows and table[k].null_count == table.num_rows}
    if blank >= set(keys):
        blank -= set(keys[:1])  # Arrow's keyless aggregation has no ``distinct``
    hashed = [k for k in keys if k not in blank]
    done = table.group_by(hashed, use_threads=True).aggregate(spec)
    # Arrow names the columns by source and function (twice the same name for the same pair):
    # the keys come first, then the aggregates in the order asked.
    columns = list(done.columns)
    # Dictionary-encoded keys (``Rollup.dictionary``) leave as plain strings: partial tables
    # of different tasks (and of DataFrames) concatenate in the driver.
    grouped = dict(zip(hashed, columns[: len(hashed)], strict=True))
    out = [_decoded(grouped[k]) if k in grouped
           else pa.nulls(done.num_rows, _decoded_type(table[k].type)) for k in keys]
    for a, col in zip(aggs, columns[len(hashed):], strict=True):
        out.append(_zero(col) if a.op in ("sum", "count") else col)
    return pa.table(out, names=[*keys, *(a.out for a in aggs)])


_ARROW_MERGED = ("sum", "count", "min", "max")


def _merged(agg: Agg) -> Agg:
    """``agg`` as it applies to partial rows (whose column is named ``agg.out``)."""
    return Agg(agg.out, "sum" if agg.op == "count" else agg.op, agg.out)


def _items(agg: Agg, value: Any) -> Iterable[Any]:
    """The items a partial value of a ``set`` (a list) or ``union`` (joined lists) adds."""
    if agg.op == "set":
        return value or ()
    return (item for joined in value or () for item in _split(joined))


def _sets_sorted(row: dict[str, Any], aggs: Sequence[Agg]) -> dict[str, Any]:
    """A partial row as ``merge`` leaves a group of one: sets (and unions of joined lists)
    as sorted lists."""
    for a in aggs:
        if a.op in ("set", "union"):
            row[a.out] = sorted(set(_items(a, row[a.out])))
    return row


def sorted_lists(col: pa.ChunkedArray | pa.Array) -> pa.ListArray:
    """Each list of ``col`` with its items sorted and its nulls left out (a null list becomes
    empty), as ``merge`` leaves a set: in Arrow, one sort of every item by (list, item)."""
    lists = col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col
    items = pc.list_flatten(lists)
    parents = pc.list_parent_indices(lists)
    present = pc.is_valid(items)
    items, parents = items.filter(present), parents.filter(present)
    order = pc.sort_indices(pa.table({"p": parents, "v": items}),
                            sort_keys=[("p", "ascending"), ("v", "ascending")])
    counts = np.bincount(parents.to_numpy(zero_copy_only=False), minlength=len(lists))
    offsets = np.zeros(len(lists) + 1, np.int32)
    np.cumsum(counts, out=offsets[1:])
    return pa.ListArray.from_arrays(pa.array(offsets), items.take(order))


def merge(rows: Iterable[dict[str, Any]], keys: Sequence[str],
          aggs: Sequence[Agg]) -> list[dict[str, Any]]:
    """The partial rows of ``group`` (from any number of tasks) merged per ``keys``."""
    acc: dict[tuple[Any, ...], dict[str, Any]] = {}
    for row in rows:
        key = tuple(row[k] for k in keys)
        have = acc.get(key)
        if have is None:
            have = {k: row[k] for k in keys}
            for a in aggs:
                v = row[a.out]
                have[a.out] = set(_items(a, v)) if a.op in ("set", "union") else v
            acc[key] = have
            continue
        for a in aggs:
            v = row[a.out]
            if a.op in ("sum", "count"):
                have[a.out] += v
            elif a.op == "min":
                if v is not None and (have[a.out] is None or v < have[a.out]):
                    have[a.out] = v
            elif a.op == "max":
                if v is not None and (have[a.out] is None or v > have[a.out]):
                    have[a.out] = v
            else:
                have[a.out].update(_items(a, v))
    out = list(acc.values())
    for row in out:
        for a in aggs:
            if a.op in ("set", "union"):
                row[a.out] = sorted(row[a.out])
    return out


def number_runs(table: pa.Table, keys: Sequence[str], first: str, last: str) -> pa.Table:
    """``table`` with ``run``: per ``keys`` and ``SKIP``, islands of rows whose ``first`` ..
    ``last`` ranges overlap or touch, numbered from 1 in offset order (a new run starts where a
    row's ``first`` lies beyond every earlier row's ``last`` + 1). Rows without offsets sort
    first and neither start nor number a run; they and skipped rows get a null ``run``."""
    n = table.num_rows
    if n == 0:
        return table.append_column("run", pa.nulls(0, _I64))
    # The groups need only be contiguous, not in the keys' order: sorting by each key's
    # number in a dictionary of its values (null: -1) costs less than comparing strings.
    numbered_keys = {f"k{i}": _key_numbers(table[k]) for i, k in enumerate([*keys, SKIP])}
    order = pc.sort_indices(
        pa.table({**numbered_keys, "first": table[first], "last": table[last]}),
        sort_keys=[*((k, "ascending", "at_start") for k in numbered_keys),
                   ("first", "ascending", "at_start"), ("last", "ascending", "at_start")],
    )
    table = table.take(order)
    rows = order.to_numpy()
    key_numbers = np.stack([a.to_numpy()[rows] for a in numbered_keys.values()])
    # Where a new group of keys starts (null and non-null differ; two nulls are equal).
    starts = np.ones(n, bool)
    starts[1:] = (key_numbers[:, 1:] != key_numbers[:, :-1]).any(axis=0)
    groups = np.cumsum(starts) - 1
    lo = table[first].combine_chunks()
    hi = table[last].combine_chunks()
    has_lo = lo.is_valid().to_numpy(zero_copy_only=False)
    lo_v = lo.fill_null(0).to_numpy()
    # What a row adds to its group's reach: its last offset, if it has both offsets.
    adds = has_lo & hi.is_valid().to_numpy(zero_copy_only=False)
    hi_v = hi.fill_null(0).to_numpy()
    # The greatest last offset of the earlier rows of the group (``reach``, if ``reached``),
    # as a running maximum over all rows: each row's key is its group number, then the rank
    # of its last offset among all (rank 0: adds nothing), so a group's keys exceed every
    # earlier group's and the running maximum starts again at each group.
    values, ranks = np.unique(hi_v[adds], return_inverse=True)
    rank = np.zeros(n, np.int64)
    rank[adds] = ranks.reshape(-1) + 1
    top = np.maximum.accumulate(groups * (len(values) + 1) + rank)
    before = np.empty(n, np.int64)
    before[0] = 0
    before[1:] = top[:-1] - groups[1:] * (len(values) + 1)
    before[starts] = 0  # the previous row is another group's
    reached = before > 0
    reach = values[np.maximum(before - 1, 0)] if len(values) else np.zeros(n, np.int64)
    # A new run starts beyond reach + 1 (``lo - 1 > reach``: no overflow, as ``lo > reach``).
    new_run = has_lo & (~reached | ((lo_v > reach) & (lo_v - 1 > reach)))
    counted = np.cumsum(new_run)
    at_start = np.maximum.accumulate(np.where(starts, counted - new_run, 0))
    number = counted - at_start
    numbered = has_lo & table[SKIP].is_null().to_numpy(zero_copy_only=False)
    runs = pa.array(number, _I64, mask=~numbered)
    return table.append_column("run", runs)


def _key_numbers(col: pa.ChunkedArray | pa.Array) -> pa.Array:
    """Each value's number in a dictionary of ``col``'s values; -1 for null (equal values,
    equal numbers)."""
    return pc.fill_null(pc.cast(_encoded(col).indices, _I64), -1)


@dataclass(frozen=True)
class Rollup:
    """One aggregation: ``prepare`` makes the rows to group from the task's tables (every
    table has ``SKIP``), ``keys`` are blanked on skipped rows (``blank`` says which, default
    all), ``runs`` = (first, last, keys) numbers runs before grouping, ``finish`` edits each
    final row."""

    name: str
    datasets: tuple[str, ...]
    columns: Mapping[str, tuple[str, ...]]
    prepare: Callable[[Tables], pa.Table]
    keys: tuple[str, ...]
    aggs: tuple[Agg, ...]
    runs: tuple[str, str, tuple[str, ...]] | None = None
    blank: tuple[str, ...] | None = None
    finish: Callable[[dict[str, Any]], dict[str, Any]] | None = None
    # Whether a task must hold every row of a connection (a DataFrame input is repartitioned).
    by_connection: bool = False
    # CPU per byte of Parquet relative to the others, for planning tasks of equal cost.
    cost_per_byte: float = 1.0
    # String columns read dictionary-encoded from Parquet (few distinct values per file):
    # grouping by their indices costs less than hashing the strings, and so does reading them.
    dictionary: tuple[str, ...] = ()

    def _keys(self) -> list[str]:
        return [*self.keys, *(["run"] if self.runs else []), SKIP]

    def partial(self, tables: Tables, whole_connections: bool = True) -> dict[str, pa.Table]:
        """The partial tables of the rows of ``tables`` (see ``Connections`` for
        ``whole_connections``; the other rollups do not depend on how rows were split)."""
        rows = _blank(self.prepare(tables), self.keys if self.blank is None else self.blank)
        if self.runs is not None:
            first, last, run_keys = self.runs
            rows = number_runs(rows, run_keys, first, last)
        return {self.name: group(rows, self._keys(), self.aggs)}

    @property
    def merges_in_arrow(self) -> bool:
        """Whether partial tables merge by one more Arrow aggregation: sums, counts, minima
        and maxima, no runs to renumber."""
        return self.runs is None and all(a.op in _ARROW_MERGED for a in self.aggs)

    def _regrouped(self, table: pa.Table) -> pa.Table:
        """Partial rows (no sets to unite) merged per key by one more Arrow aggregation."""
        return group(table, self._keys(), [_merged(a) for a in self.aggs])

    def merge_partials(self, partials: Sequence[Mapping[str, pa.Table]]) -> dict[str, pa.Table]:
        """The results of several ``partial`` calls as one (``merges_in_arrow`` only)."""
        got = [p[self.name] for p in partials if self.name in p]
        if not got:
            return {}
        return {self.name: self._regrouped(pa.concat_tables(got, promote_options="permissive"))}

    def final(self, partials: Mapping[str, Sequence[pa.Table]]) -> list[dict[str, Any]]:
        got = [t for t in partials.get(self.name, ()) if t.num_rows]
        if not got:
            return []
        table = pa.concat_tables(got, promote_options="permissive")
        if self.runs is not None:
            first, last, run_keys = self.runs
            table = number_runs(table.drop_columns(["run"]), run_keys, first, last)
        if any(a.op in ("set", "union") for a in self.aggs):
            if table.group_by(self._keys()).aggregate([]).num_rows == table.num_rows:
                # Every group in one partial row (one task held all of them): nothing to
                # merge but the sets to sort (11,628 offset runs: 0.11-0.17 s instead of
                # 0.30-0.38).
                out = [_sets_sorted(row, self.aggs) for row in table.to_pylist()]
            else:
                out = merge(table.to_pylist(), self._keys(), self.aggs)
        else:  # sums, counts, minima and maxima merge in Arrow
            out = self._regrouped(table).to_pylist()
        return [self.finish(r) for r in out] if self.finish else out

    def final_table(self, partials: Mapping[str, Sequence[pa.Table]]) -> pa.Table:
        """``final``'s rows as one Arrow table: the keys (with ``run`` for numbered runs and
        ``SKIP``), then each aggregate's column; empty, without columns, when there are no
        rows. Built in Arrow when every group is one partial row (the offset runs of a job
        whose offset run files one task read: 11,628 rows of the bench in 0.03 s instead of
        0.28 through Python rows) or nothing is a set; else from ``final``'s rows."""
        got = [t for t in partials.get(self.name, ()) if t.num_rows]
        if not got:
            return pa.table({})
        if self.finish is not None or any(a.op == "union" for a in self.aggs):
            return pa.Table.from_pylist(self.final(partials))
        table = pa.concat_tables(got, promote_options="permissive")
        if self.runs is not None:
            first, last, run_keys = self.runs
            table = number_runs(table.drop_columns(["run"]), run_keys, first, last)
        sets = [a.out for a in self.aggs if a.op == "set"]
        if not sets:
            return self._regrouped(table)
        if table.group_by(self._keys()).aggregate([]).num_rows != table.num_rows:
            return pa.Table.from_pylist(self.final(partials), schema=table.schema)
        for name in sets:
            table = table.set_column(table.schema.get_field_index(name), name,
                                     sorted_lists(table[name]))
        return table


def _summed(*columns: str) -> tuple[Agg, ...]:
    """Each of ``columns`` summed under its own name."""
    return tuple(Agg(c, "sum", c) for c in columns)


def _counted(time_col: str, rows: str | None = None) -> tuple[Agg, ...]:
    """The summary's figures of a group: rows (or events), first and last time."""
    return (
        Agg("_rows", "count") if rows is None else Agg("_rows", "sum", rows),
        Agg("_first_ms", "min", time_col),
        Agg("_last_ms", "max", time_col),
    )


def _as_read(dataset: str) -> Callable[[Tables], pa.Table]:
    """``prepare`` for a rollup that groups the rows as they were read."""
    return lambda tables: tables[dataset]


def _dated(first: str, last: str | None = None) -> tuple[Agg, ...]:
    """``first_ms`` and ``last_ms`` of a group, and the summary's figures (``_counted``)."""
    return (Agg("first_ms", "min", first), Agg("last_ms", "max", last or first),
            *_counted(first))


def _with(table: pa.Table, **columns: Any) -> pa.Table:
    for name, col in columns.items():
        if name in table.column_names:
            table = table.set_column(table.schema.get_field_index(name), name, col)
        else:
            table = table.append_column(name, col)
    return table


def _cols(*names: str) -> tuple[str, ...]:
    return (*names, SKIP)


# -- record batches: billing, traffic, edges, top topics, clients all come from one rollup ---

_BATCH_KEYS = ("principal", "client_id", "topic", "api", "host", "instance_id")


def record_batches(bucket_ms: int = HOUR_MS) -> Rollup:
    def prepare(tables: Tables) -> pa.Table:
        t = tables["record_batch"]
        err = pc.cast(pc.not_equal(pc.fill_null(t["error_code"], 0), 0), _I64)
        return _with(t, bucket=floor_to(t["time_ms"], bucket_ms), _err=err)

    return Rollup(
        name="batches",
        datasets=("record_batch",),
        columns={"record_batch": _cols(*_BATCH_KEYS, "time_ms", "records_in", "records_out",
                                       "bytes_in", "bytes_out", "error_code",
                                       "filter_time_ns")},
        prepare=prepare,
        keys=(*_BATCH_KEYS, "bucket"),
        # Measured on 3.5 million rows: 0.71 CPU s to read and group against 1.13 s.
        dictionary=_BATCH_KEYS,
        aggs=(
            Agg("batches", "count"),
            *_summed("records_in", "records_out", "bytes_in", "bytes_out"),
            Agg("errors", "sum", "_err"),
            Agg("filter_time_ns", "sum", "filter_time_ns"),
            *_counted("time_ms"),
        ),
    )


MINUTE_MS = 60_000
# Events spanning at most this are charted per minute (``job._bucket``).
SHORT_SPAN_MS = 2 * HOUR_MS


def traffic(bucket_ms: int) -> Rollup:
    """Record bytes per client and time bucket (produce: in, fetch: out) for the chart."""

    def prepare(tables: Tables) -> pa.Table:
        t = tables["record_batch"]
        t = t.filter(pc.is_null(t[SKIP]))
        produce = pc.fill_null(pc.equal(t["api"], "produce"), False)
        return pa.table({
            "principal": t["principal"], "client_id": t["client_id"],
            "bucket": floor_to(t["time_ms"], bucket_ms),
            "_bytes": pc.if_else(produce, t["bytes_in"], t["bytes_out"]), SKIP: t[SKIP],
        })

    return Rollup(
        name="traffic",
        datasets=("record_batch",),
        columns={"record_batch": _cols("principal", "client_id", "api", "time_ms", "bytes_in",
                                       "bytes_out")},
        prepare=prepare,
        keys=("principal", "client_id", "bucket"),
        aggs=(Agg("bytes", "sum", "_bytes"),),
        finish=_drop_skip,
    )


def _drop_skip(row: dict[str, Any]) -> dict[str, Any]:
    row.pop(SKIP, None)
    return row


# -- offset runs and transform runs ---------------------------------------------------------

RUN_KEYS = ("module_sha256", "api", "topic", "partition")


def offset_runs() -> Rollup:
    def prepare(tables: Tables) -> pa.Table:
        t = tables["offset_run"]
        records = pc.add(pc.add(_zero(t["kept"]), _zero(t["rewritten"])),
                         pc.add(_zero(t["dropped"]), _zero(t["rejected"])))
        return _with(t, _records=records)

    return Rollup(
        name="runs",
        datasets=("offset_run",),
        columns={"offset_run": _cols(*RUN_KEYS, "offset_first", "offset_last", "filter_name",
                                     "signer_key_id", "batches", "kept", "rewritten",
                                     "dropped", "rejected", "detections", "errors", "time_ns",
                                     "instance_id", "host", "time_first_ms", "time_last_ms")},
        prepare=prepare,
        keys=RUN_KEYS,
        runs=("offset_first", "offset_last", RUN_KEYS),
        aggs=(
            Agg("offset_first", "min", "offset_first"),
            Agg("offset_last", "max", "offset_last"),
            Agg("filter_names", "set", "filter_name"),
            # The keys that signed the module's fleet records: few distinct values per run.
            Agg("signer_key_ids", "set", "signer_key_id"),
            Agg("batches", "sum", "batches"),
            Agg("records", "sum", "_records"),
            *_summed("kept", "rewritten", "dropped", "rejected", "detections", "errors"),
            Agg("filter_time_ns", "sum", "time_ns"),
            Agg("proxy_instances", "set", "instance_id"),
            Agg("proxy_hosts", "set", "host"),
            Agg("time_first_ms", "min", "time_first_ms"),
            Agg("time_last_ms", "max", "time_last_ms"),
            *_counted("time_first_ms"),
        ),
    )


TRANSFORM_KEYS = ("transform", "_mods", "input_topic", "input_partition")


def _transform_row(row: dict[str, Any]) -> dict[str, Any]:
    mods = row.pop("_mods")
    row["module_sha256s"] = None if mods is None else _split(mods)
    return row


def transform_runs() -> Rollup:
    """Per transform, module versions (sha256s in chain order) and input partition: runs of
    batches whose input offsets overlap or touch, one row per run and output partition. All
    rows of one batch have the same input range, so they fall in the same run."""

    def prepare(tables: Tables) -> pa.Table:
        t = tables["transform_batch"]
        # A batch has one row per output partition: its first row counts the event.
        first_row = pc.cast(pc.equal(pc.fill_null(t["output_index"], 0), 0), _I64)
        return _with(t, _mods=_joined(t["module_sha256s"]),
                     _filters=_joined(t["filter_names"]), _first_row=first_row)

    return Rollup(
        name="transforms",
        datasets=("transform_batch",),
        columns={"transform_batch": _cols(
            "transform", "module_sha256s", "input_topic", "input_partition", "output_topic",
            "output_partition", "output_index", "filter_names", "input_offset_first",
            "input_offset_last", "output_offset_first", "output_offset_last", "records_in",
            "output_records", "dropped", "rejected", "dead_letters", "guarantee", "group",
            "instance_id", "time_ms")},
        prepare=prepare,
        keys=(*TRANSFORM_KEYS, "output_topic", "output_partition"),
        runs=("input_offset_first", "input_offset_last", TRANSFORM_KEYS),
        aggs=(
            Agg("filter_names", "union", "_filters"),
            Agg("input_offset_first", "min", "input_offset_first"),
            Agg("input_offset_last", "max", "input_offset_last"),
            Agg("output_offset_first", "min", "output_offset_first"),
            Agg("output_offset_last", "max", "output_offset_last"),
            Agg("batches", "count"),
            Agg("input_records", "sum", "records_in"),
            *_summed("output_records", "dropped", "rejected", "dead_letters"),
            Agg("guarantees", "set", "guarantee"),
            Agg("groups", "set", "group"),
            Agg("proxy_instances", "set", "instance_id"),
            Agg("_instances", "set", "instance_id"),
            Agg("time_first_ms", "min", "time_ms"),
            Agg("time_last_ms", "max", "time_ms"),
            *_counted("time_ms", "_first_row"),
        ),
        finish=_transform_row,
    )


# -- the small datasets ----------------------------------------------------------------------


def findings() -> Rollup:
    keys = ("kind", "topic", "api", "filter_name", "module_sha256", "name")
    return Rollup(
        name="found",
        datasets=("finding",),
        columns={"finding": _cols(*keys, "n", "events", "time_first_ms", "time_last_ms")},
        prepare=_as_read("finding"),
        keys=keys,
        dictionary=keys,
        aggs=(
            Agg("count", "sum", "n"),
            Agg("events", "sum", "events"),
            *_dated("time_first_ms", "time_last_ms"),
        ),
    )


def admin() -> Rollup:
    keys = ("module_sha256", "filter_name", "op", "resource_type", "resource", "decision",
            "principal", "client_id", "message", "instance_id")
    return Rollup(
        name="admin",
        datasets=("admin",),
        columns={"admin": _cols(*keys, "time_ms")},
        prepare=_as_read("admin"),
        keys=keys,
        # Measured on 400,000 rows: 0.08 s to read and group against 0.18 s.
        dictionary=keys,
        aggs=(
            Agg("count", "count"),
            *_dated("time_ms"),
        ),
    )


def filter_loads() -> Rollup:
    keys = ("module_sha256", "filter_name", "instance_id")

    def prepare(tables: Tables) -> pa.Table:
        t = tables["filter_loaded"]
        return _with(t, _topics=_joined(t["topics"]), _apply_to=_joined(t["apply_to"]))

    return Rollup(
        name="loads",
        datasets=("filter_loaded",),
        columns={"filter_loaded": _cols(*keys, "topics", "apply_to", "time_ms")},
        prepare=prepare,
        keys=keys,
        aggs=(
            Agg("topics", "union", "_topics"),
            Agg("apply_to", "union", "_apply_to"),
            *_dated("time_ms"),
        ),
    )


def drops() -> Rollup:
    return Rollup(
        name="drops",
        datasets=("telemetry_dropped",),
        columns={"telemetry_dropped": _cols("instance_id", "reason", "dropped", "time_ms")},
        prepare=_as_read("telemetry_dropped"),
        keys=("instance_id", "reason"),
        aggs=(
            Agg("count", "sum", "dropped"),
            Agg("events", "count"),
            *_dated("time_ms"),
        ),
    )


def encryption() -> Rollup:
    """The encrypt filter's segments per api, topic-partition, principal and KEK version."""
    keys = ("api", "topic", "partition", "principal", "key_name", "key_version")
    return Rollup(
        name="encryption",
        datasets=("encryption",),
        columns={"encryption": _cols(*keys, "offset_first", "offset_last", "batches", "records",
                                     "decrypted", "withheld", "unreadable", "time_first_ms")},
        prepare=_as_read("encryption"),
        keys=keys,
        aggs=(
            Agg("offset_first", "min", "offset_first"),
            Agg("offset_last", "max", "offset_last"),
            *_summed("batches", "records", "decrypted", "withheld", "unreadable"),
            *_counted("time_first_ms"),
        ),
    )


CHECKS = "_checks"


def skipped() -> Rollup:
    """The JSON lines that never became table rows, per type and reason."""
    return Rollup(
        name="skipped",
        datasets=(CHECKS,),
        columns={CHECKS: ("type", SKIP)},
        prepare=_as_read(CHECKS),
        keys=("type",),
        blank=(),
        aggs=(Agg("_rows", "count"),),
    )


# -- connections -----------------------------------------------------------------------------

CONN_KEYS = ("principal", "client_id", "hour_ms", "api")
_CONN_SUMS = ("requests", "bytes_in", "bytes_out", "opened", "closed", "duration_ms",
              "throttle_ms")
_PER_INSTANCE = (
    *_summed(*_CONN_SUMS),
    Agg("_rows", "count"),
    Agg("_first_ms", "min", "time_ms"),
    Agg("_last_ms", "max", "time_ms"),
)
# Pending rows keep the connection; they are grouped as they are merged (by their identity).
_PENDING_KEYS = ("instance_id", "connection_id", "_type", "hour_ms", "api", "principal",
                 "client_id", "time_ms")
_PENDING = (*_summed(*_CONN_SUMS), Agg("_n", "count"))


def _connection_rows(tables: Tables) -> pa.Table:
    """Both connection datasets as one table of per-connection rows (``api`` ``*`` for the
    connection's own rows)."""
    parts = []
    conn = tables.get("connection")
    if conn is not None and conn.num_rows:
        n = conn.num_rows
        phase = pc.fill_null(conn["phase"], "")
        parts.append(pa.table({
            "_type": pa.repeat("connection", n),
            "instance_id": conn["instance_id"], "connection_id": conn["connection_id"],
            "client_id": conn["client_id"], "principal": conn["principal"],
            "time_ms": conn["time_ms"], "api": pa.repeat("*", n),
            "requests": _zero(conn["requests"]), "bytes_in": _zero(conn["bytes_in"]),
            "bytes_out": _zero(conn["bytes_out"]),
            "opened": pc.cast(pc.equal(phase, "open"), _I64),
            "closed": pc.cast(pc.equal(phase, "close"), _I64),
            "duration_ms": _zero(conn["duration_ms"]), "throttle_ms": _zero(conn["throttle_ms"]),
            SKIP: conn[SKIP],
        }))
    per_api = tables.get("connection_api")
    if per_api is not None and per_api.num_rows:
        n = per_api.num_rows
        zero = pa.repeat(pa.scalar(0, _I64), n)
        parts.append(pa.table({
            "_type": pa.repeat("connection_api", n),
            "instance_id": per_api["instance_id"], "connection_id": per_api["connection_id"],
            "client_id": per_api["client_id"], "principal": per_api["principal"],
            "time_ms": per_api["time_ms"], "api": per_api["api"],
            "requests": _zero(per_api["requests"]), "bytes_in": _zero(per_api["bytes_in"]),
            "bytes_out": _zero(per_api["bytes_out"]),
            "opened": zero, "closed": zero, "duration_ms": zero, "throttle_ms": zero,
            SKIP: per_api[SKIP],
        }))
    if not parts:
        return pa.table({})
    rows = pa.concat_tables(parts, promote_options="permissive")
    hour = pc.if_else(pc.is_null(rows["time_ms"]), pa.nulls(rows.num_rows, _I64),
                      floor_to(rows["time_ms"], HOUR_MS))
    return rows.append_column("hour_ms", hour)


_ID_KEYS = ["instance_id", "connection_id"]


_IDENTITY_COLUMNS = [*_ID_KEYS, "principal", "client_id", "opened", "closed"]


def _encoded(col: pa.ChunkedArray | pa.Array) -> pa.DictionaryArray:
    """``col`` as one dictionary array of its distinct values. A dictionary column (one
    dictionary per file read) has its dictionaries unified, which costs a fraction of hashing
    every row's string again (1 million rows of 3 values: 3 ms instead of 86); it is encoded
    from its values only where the unified dictionary would repeat a value."""
    if pa.types.is_dictionary(col.type):
        chunked = col if isinstance(col, pa.ChunkedArray) else pa.chunked_array([col])
        unified = pa.table({"c": chunked}).unify_dictionaries()["c"].combine_chunks()
        if pc.count_distinct(unified.dictionary, mode="all").as_py() == len(unified.dictionary):
            return unified
    plain = _decoded(col)
    return pc.dictionary_encode(
        plain.combine_chunks() if isinstance(plain, pa.ChunkedArray) else plain)


def _plain(table: pa.Table) -> pa.Table:
    """``table`` with its dictionary columns decoded."""
    for i, f in enumerate(table.schema):
        if pa.types.is_dictionary(f.type):
            table = table.set_column(i, f.name, _decoded(table[f.name]))
    return table


def _greatest(col: pa.ChunkedArray | pa.Array, number: np.ndarray, valid: np.ndarray,
              count: int) -> pa.Array:
    """Per connection number (``count`` of them), the greatest string of ``col`` on its rows
    (null if none): the strings' ranks in a sorted dictionary, their maximum per number."""
    encoded = _encoded(col)
    values = encoded.dictionary
    if len(values) == 0:  # no row has a value
        return pa.nulls(count, values.type)
    order = pc.sort_indices(values).to_numpy()
    rank = np.empty(len(values), np.int64)
    rank[order] = np.arange(len(values))
    index = encoded.indices.fill_null(-1).to_numpy(zero_copy_only=False)
    ranks = np.where(index >= 0, rank[np.maximum(index, 0)], -1)
    best = np.full(count, -1, np.int64)
    np.maximum.at(best, number[valid], ranks[valid])
    return values.take(pa.array(order[np.maximum(best, 0)], mask=best < 0))


def _identities(rows: pa.Table) -> tuple[pa.Array, pa.Table]:
    """(each row's connection number, null for a row without an instance or connection id;
    per connection number, in order: its instance and connection id, the greatest principal
    and client id on its rows, and whether its ``open`` and ``close`` rows are among them).

    The connections are numbered from the numbers of their instance and connection ids in two
    dictionaries (no string is built), and the per-connection figures are maxima of integers
    in numpy (a string's rank in its sorted dictionary stands for the string). Measured on
    the 1.3 million connection rows of a bench task: 0.46 s, where joining the two ids into
    one string, numbering those and grouping the rows by number with string maxima took
    0.73 s."""
    instance = _encoded(rows["instance_id"])
    connection = _encoded(rows["connection_id"])
    width = max(len(connection.dictionary), 1)
    combined = pc.add(pc.multiply(pc.cast(instance.indices, _I64), width),
                      pc.cast(connection.indices, _I64))
    encoded = pc.dictionary_encode(combined)
    number = encoded.indices
    count = len(encoded.dictionary)
    numbers = number.fill_null(-1).to_numpy(zero_copy_only=False)
    valid = numbers >= 0

    def flag(col: pa.ChunkedArray) -> pa.Array:
        seen = np.zeros(count, np.int64)
        np.maximum.at(seen, numbers[valid], _zero(col).to_numpy()[valid])
        return pa.array(seen)

    keys = encoded.dictionary.to_numpy(zero_copy_only=False)
    ids = pa.table({
        "instance_id": instance.dictionary.take(pa.array(keys // width)),
        "connection_id": connection.dictionary.take(pa.array(keys % width)),
        "_principal": _greatest(rows["principal"], numbers, valid, count),
        "_client_id": _greatest(rows["client_id"], numbers, valid, count),
        "_opened": flag(rows["opened"]), "_closed": flag(rows["closed"]),
    })
    return number, ids


def _lacking(rows: pa.Table) -> pa.Array | pa.ChunkedArray:
    return pc.or_(pc.is_null(rows["principal"]), pc.is_null(rows["client_id"]))


def _filled(rows: pa.Table, numbers: pa.Array, ids: pa.Table) -> tuple[pa.Table, pa.Table]:
    """(``rows`` with their connection's identity filled in, ``ids``'s row of each: all null
    for a row without a connection number)."""
    mine = ids.take(numbers)
    filled = _with(
        rows,
        principal=pc.coalesce(rows["principal"], mine["_principal"]),
        client_id=pc.coalesce(rows["client_id"], mine["_client_id"]),
    )
    return filled, mine


def _resolve_local(rows: pa.Table, whole_connections: bool = True
                   ) -> tuple[pa.Table, pa.Table, pa.Table]:
    """Usable rows -> (rows to aggregate, rows pending, identities others may need).

    A row lacking a principal or a client id takes the greatest seen on any row of its
    connection. That is only known here for connections whose ``open`` and ``close`` rows are
    both here, given ``whole_connections`` (and for rows without a connection id, which have
    nothing to take from); the lacking rows of the others are pending, and this task's
    identities of those connections go to the driver with them."""
    number, ids = _identities(rows)
    rows = _plain(rows)  # decoded once numbered: the numbering used the dictionaries
    lacking = _lacking(rows)
    known = rows.filter(pc.invert(lacking))
    lacking_rows = rows.filter(lacking)
    lacking_numbers = number.filter(lacking)
    filled, mine = _filled(lacking_rows, lacking_numbers, ids)
    no_id = pc.is_null(lacking_numbers)
    shared = pc.or_(pc.is_valid(ids["_principal"]), pc.is_valid(ids["_client_id"]))
    if whole_connections:
        complete = pc.or_(no_id, pc.fill_null(
            pc.and_(pc.equal(mine["_opened"], 1), pc.equal(mine["_closed"], 1)), False))
        incomplete = pc.invert(pc.and_(pc.equal(ids["_opened"], 1), pc.equal(ids["_closed"], 1)))
        shared = pc.and_(shared, incomplete)
    else:
        complete = no_id
    shared_ids = ids.filter(shared).select([*_ID_KEYS, "_principal", "_client_id"])
    done = pa.concat_tables([known, filled.filter(complete)])
    pending = lacking_rows.filter(pc.invert(complete))
    return done, pending, shared_ids


_PER_INSTANCE_KEYS = (*CONN_KEYS, "instance_id", "_type", SKIP)


class Connections(Rollup):
    """``billing_connections`` rows (hours as epoch ms) with each connection's identity
    filled in (see the module's docstring); the instances of a group are collected after a
    first aggregation per instance."""

    @property
    def merges_in_arrow(self) -> bool:
        return False  # three partial tables, and pending rows resolved in the driver

    def partial(self, tables: Tables, whole_connections: bool = True) -> dict[str, pa.Table]:
        """``whole_connections``: a connection whose ``open`` and ``close`` rows are in
        ``tables`` has all its rows there (true of whole hours of both connection datasets, and
        of rows partitioned by connection). Without it every row lacking an identity waits for
        the driver, with every identity seen here."""
        rows = _connection_rows(tables)
        if rows.num_rows == 0:
            return {}
        usable = pc.is_null(rows[SKIP])
        skipped_rows = _blank(_plain(rows.filter(pc.invert(usable))), CONN_KEYS)
        resolved, pending, shared = _resolve_local(rows.filter(usable), whole_connections)
        per_instance = pa.concat_tables([resolved, skipped_rows])
        return {
            "conns": group(per_instance, _PER_INSTANCE_KEYS, _PER_INSTANCE),
            "conns_pending": group(pending, (*_PENDING_KEYS, SKIP), _PENDING),
            "conns_ids": shared,
        }

    def final_table(self, partials: Mapping[str, Sequence[pa.Table]]) -> pa.Table:
        return pa.Table.from_pylist(self.final(partials))

    def final(self, partials: Mapping[str, Sequence[pa.Table]]) -> list[dict[str, Any]]:
        done = [t for t in partials.get("conns", ()) if t.num_rows]
        pending = [t for t in partials.get("conns_pending", ()) if t.num_rows]
        if pending:
            rows = pa.concat_tables(pending, promote_options="permissive")
            shared = [t for t in partials.get("conns_ids", ()) if t.num_rows]
            # The identities other tasks saw, as rows of their connections.
            seen = [rows.select(_IDENTITY_COLUMNS)] + [
                pa.table({
                    "instance_id": t["instance_id"], "connection_id": t["connection_id"],
                    "principal": t["_principal"], "client_id": t["_client_id"],
                    "opened": pa.repeat(pa.scalar(0, _I64), t.num_rows),
                    "closed": pa.repeat(pa.scalar(0, _I64), t.num_rows),
                }) for t in shared
            ]
            number, ids = _identities(pa.concat_tables(seen, promote_options="permissive"))
            resolved, _ = _filled(rows, number.slice(0, rows.num_rows), ids)
            # A pending row stands for ``_n`` rows of one connection at one time.
            resolved = _with(resolved, _t=resolved["time_ms"])
            aggs = (*_summed(*_CONN_SUMS), Agg("_rows", "sum", "_n"),
                    Agg("_first_ms", "min", "_t"), Agg("_last_ms", "max", "_t"))
            done.append(group(resolved, _PER_INSTANCE_KEYS, aggs))
        if not done:
            return []
        # One row per instance in a group: the group's instances are the set of them.
        table = pa.concat_tables(done, promote_options="permissive")
        table = table.rename_columns([_CONN_RENAMED.get(n, n) for n in table.column_names])
        rows = table.to_pylist()
        for r in rows:
            instance = r.pop("instance_id")
            r["_instances"] = None if instance is None else [instance]
        return merge(rows, (*CONN_KEYS, "_type", SKIP), _CONN_FINAL)


_CONN_RENAMED = {"opened": "connections_opened", "closed": "connections_closed"}
_CONN_FINAL = (
    *[Agg(_CONN_RENAMED.get(c, c), "sum") for c in _CONN_SUMS],
    Agg("_instances", "set"),
    Agg("_rows", "sum"),
    Agg("_first_ms", "min"),
    Agg("_last_ms", "max"),
)


def connections() -> Rollup:
    cols = ("instance_id", "connection_id", "client_id", "principal", "time_ms", "requests",
            "bytes_in", "bytes_out")
    return Connections(
        name="conns",
        datasets=("connection", "connection_api"),
        columns={
            "connection": _cols(*cols, "phase", "duration_ms", "throttle_ms"),
            "connection_api": _cols(*cols, "api"),
        },
        prepare=_connection_rows,
        keys=CONN_KEYS,
        aggs=_PER_INSTANCE,
        by_connection=True,
        # Measured on the bench data: 2 million connection rows (16 MB) cost as much CPU as
        # 3.5 million record batch rows (18 MB): the identities and the join.
        cost_per_byte=2.0,
        # Few distinct values (unlike connection ids): read as their files' dictionaries,
        # the identities number them without hashing each row's string (``_encoded``).
        dictionary=("instance_id", "principal", "client_id"),
    )


def standard(bucket_ms: int = HOUR_MS) -> dict[str, Rollup]:
    """Every rollup the reports are built from, by part name."""
    rollups = [record_batches(bucket_ms), offset_runs(), findings(), connections(), admin(),
               filter_loads(), drops(), transform_runs(), encryption()]
    return {r.name: r for r in rollups}


@dataclass
class PartialSet:
    """The partial tables of every task, by partial name."""

    tables: dict[str, list[pa.Table]] = field(default_factory=dict)
    # Per telemetry sink instance of a Kafka topic: message ids missing below its highest.
    missing_messages: dict[str, int] = field(default_factory=dict)

    def add(self, name: str, table: pa.Table) -> None:
        self.tables.setdefault(name, []).append(table)
