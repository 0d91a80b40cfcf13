"""The Spark side of the audit job: one aggregation per dataset, all collected in one go.

Every function here builds one aggregation over one dataset (no caching, no ``coalesce(1)``);
``collect`` runs any number of them as one Spark query (a union, so adaptive execution runs
their stages side by side) and returns each as a list of dicts small enough for the driver.
The report tables are then built from these rollups in the driver (``reports``). Times stay
epoch milliseconds (UTC) until the reports turn them into UTC timestamps.

Each aggregation also counts what the job's summary needs, in the same scan: the rows of a
dataset the job skips (``schema.SKIP``: malformed, unknown schema version) stay in the tables,
their grouping keys blanked so that they fall into one group per reason, and every group
carries ``_skip``, ``_rows`` (rows, or events where an event has several rows), ``_first_ms``
and ``_last_ms``. ``split_counts`` takes those apart in the driver: the reports get only the
usable groups, the summary the counts per event type.

- ``record_batches``: one fine-grained rollup (principal, client, topic, api, proxy, time
  bucket) from which billing, traffic, edges, top topics and the client table all come.
- ``offset_runs``: the offset-run segments merged into runs (a window over segments, not over
  every batch) per module, api and topic-partition.
- ``findings``, ``connections``, ``admin``, ``filter_loads``, ``drops``: the small datasets.
- ``transform_runs``: transform batches merged into runs of contiguous input offsets per
  transform, module versions and input partition, split per output partition.
- ``encryption``: the encrypt filter's segments summed per topic-partition, KEK version and
  principal.
- ``skipped``: the JSON lines that never became table rows, per type and reason.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F

from sluice.spark_audit.schema import MALFORMED, SKIP, UNKNOWN_VERSION

RUN_KEYS = ["module_sha256", "api", "topic", "partition"]
TRANSFORM_KEYS = ["transform", "module_sha256s", "input_topic", "input_partition"]
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


def collect(parts: dict[str, DataFrame]) -> dict[str, list[dict[str, Any]]]:
    """Run every aggregation in one query; rows come back as dicts, per part."""
    tagged = [
        df.select(
            F.lit(name).alias("part"),
            F.to_json(F.struct(*df.columns), {"ignoreNullFields": "false"}).alias("row"),
        )
        for name, df in parts.items()
    ]
    union = tagged[0]
    for df in tagged[1:]:
        union = union.unionByName(df)
    table = union.toArrow()
    out: dict[str, list[dict[str, Any]]] = {name: [] for name in parts}
    for part, row in zip(table.column("part").to_pylist(), table.column("row").to_pylist(),
                         strict=True):
        out[part].append(json.loads(row))
    return out


@dataclass
class TypeCounts:
    """What the summary says about one event type (or dataset)."""

    events: int = 0
    malformed: int = 0
    unknown_version: int = 0
    first_ms: int | None = None
    last_ms: int | None = None
    instances: set[str] = field(default_factory=set)


def split_counts(
    got: Mapping[str, list[dict[str, Any]]],
) -> tuple[dict[str, list[dict[str, Any]]], dict[str, TypeCounts]]:
    """(the usable rows of every part, counts per event type) from ``collect``'s result."""
    usable: dict[str, list[dict[str, Any]]] = {}
    counts: dict[str, TypeCounts] = {}
    for part, rows in got.items():
        if part == "skipped":
            for r in rows:
                c = counts.setdefault(r["type"], TypeCounts())
                if r[SKIP] == MALFORMED:
                    c.malformed += r["_rows"]
                else:
                    c.unknown_version += r["_rows"]
            continue
        if part not in PART_DATASETS and part != "conns":
            usable[part] = rows
            continue
        usable[part] = []
        for r in rows:
            c = counts.setdefault(r.get("_type") or PART_DATASETS[part], TypeCounts())
            if r[SKIP] == MALFORMED:
                c.malformed += r["_rows"]
            elif r[SKIP] == UNKNOWN_VERSION:
                c.unknown_version += r["_rows"]
            else:
                usable[part].append(r)
                c.events += r["_rows"]
                if r["_first_ms"] is not None:
                    c.first_ms = r["_first_ms"] if c.first_ms is None else min(
                        c.first_ms, r["_first_ms"])
                    c.last_ms = r["_last_ms"] if c.last_ms is None else max(
                        c.last_ms, r["_last_ms"])
                # The instance is a key of some parts, a list (``_instances``) in others.
                if r.get("instance_id") is not None:
                    c.instances.add(r["instance_id"])
                c.instances.update(r.get("_instances") or ())
    return usable, counts


def _sum0(col: Column | str) -> Column:
    c = F.col(col) if isinstance(col, str) else col
    return F.coalesce(F.sum(F.coalesce(c, F.lit(0))), F.lit(0)).cast("long")


def _set(col: str) -> Column:
    return F.array_sort(F.collect_set(col))


def _kept(col: Column | str, name: str | None = None) -> Column:
    """A grouping key, null on the rows the job skips (so they make one group per reason)."""
    c = F.col(col) if isinstance(col, str) else col
    alias = name if name is not None else str(col)
    return F.when(F.col(SKIP).isNull(), c).alias(alias)


def _blanked(df: DataFrame, keys: list[str]) -> DataFrame:
    """``df`` with ``keys`` null on skipped rows."""
    return df.select(*[_kept(c) if c in keys else F.col(c) for c in df.columns])


def _counted(time_col: str, rows: Column | None = None) -> list[Column]:
    """The summary's figures of a group: rows (or events), first and last time."""
    return [
        (F.count(F.lit(1)) if rows is None else F.sum(rows)).cast("long").alias("_rows"),
        F.min(time_col).alias("_first_ms"),
        F.max(time_col).alias("_last_ms"),
    ]


def skipped(checks: DataFrame) -> DataFrame:
    """The JSON lines the job skips, per type and reason."""
    return checks.groupBy("type", SKIP).agg(F.count(F.lit(1)).cast("long").alias("_rows"))


def traffic(rb: DataFrame, bucket_ms: int) -> DataFrame:
    """Record bytes per client and time bucket (produce: in, fetch: out) for the chart."""
    bucket = (F.floor(F.col("time_ms") / bucket_ms) * bucket_ms).cast("long")
    return rb.filter(F.col(SKIP).isNull()).groupBy(
        "principal", "client_id", bucket.alias("bucket")
    ).agg(
        _sum0(
            F.when(F.col("api") == "produce", F.col("bytes_in")).otherwise(F.col("bytes_out"))
        ).alias("bytes")
    )


def record_batches(rb: DataFrame, bucket_ms: int) -> DataFrame:
    bucket = (F.floor(F.col("time_ms") / bucket_ms) * bucket_ms).cast("long")
    return (
        rb.groupBy(
            *[_kept(k) for k in ("principal", "client_id", "topic", "api", "host",
                                 "instance_id")],
            _kept(bucket, "bucket"),
            SKIP,
        ).agg(
            F.count(F.lit(1)).alias("batches"),
            _sum0("records_in").alias("records_in"),
            _sum0("records_out").alias("records_out"),
            _sum0("bytes_in").alias("bytes_in"),
            _sum0("bytes_out").alias("bytes_out"),
            F.sum(F.when(F.coalesce(F.col("error_code"), F.lit(0)) != 0, 1).otherwise(0))
            .cast("long")
            .alias("errors"),
            _sum0("filter_time_ns").alias("filter_time_ns"),
            *_counted("time_ms"),
        )
    )


def _run_aggregates() -> list[Column]:
    return [
        _set("filter_name").alias("filter_names"),
        _sum0("batches").alias("batches"),
        (_sum0("kept") + _sum0("rewritten") + _sum0("dropped") + _sum0("rejected")).alias(
            "records"
        ),
        _sum0("kept").alias("kept"),
        _sum0("rewritten").alias("rewritten"),
        _sum0("dropped").alias("dropped"),
        _sum0("rejected").alias("rejected"),
        _sum0("detections").alias("detections"),
        _sum0("errors").alias("errors"),
        _sum0("time_ns").alias("filter_time_ns"),
        _set("instance_id").alias("proxy_instances"),
        _set("host").alias("proxy_hosts"),
        F.min("time_first_ms").alias("time_first_ms"),
        F.max("time_last_ms").alias("time_last_ms"),
        *_counted("time_first_ms"),
    ]


def _numbered_runs(df: DataFrame, keys: list[str], first: str, last: str) -> DataFrame:
    """``df`` with ``run``: per ``keys``, islands of rows whose ``first``..``last`` ranges
    overlap or touch, numbered from 1 in offset order (a new run starts where a row's
    ``first`` lies beyond every earlier row's ``last`` + 1). Rows without offsets sort first
    and neither start nor number a run; they and skipped rows get a null ``run``. One window,
    partitioned by ``keys`` and ``SKIP`` only, so a grouping by them needs no second shuffle."""
    no_offsets = F.col(first).isNull()
    w = Window.partitionBy(*keys, SKIP).orderBy(first, last)
    prev_max = F.max(last).over(w.rowsBetween(Window.unboundedPreceding, -1))
    new_run = (
        F.when(no_offsets, 0)
        .when(F.col("_prev").isNull() | (F.col(first) > F.col("_prev") + 1), 1)
        .otherwise(0)
    )
    return df.withColumn("_prev", prev_max).withColumn("_new_run", new_run).withColumn(
        "run",
        F.when(
            ~no_offsets & F.col(SKIP).isNull(),
            F.sum("_new_run").over(w.rowsBetween(Window.unboundedPreceding, 0)),
        ).cast("long"),
    )


def offset_runs(segments: DataFrame) -> DataFrame:
    """Runs: islands of overlapping or adjacent segments (a new run starts where a segment's
    first offset lies beyond every earlier segment's last offset + 1). Segments without
    offsets are summed into one row per key with null offsets and null run (see
    ``_numbered_runs``)."""
    segments = _blanked(segments, RUN_KEYS)
    runs = _numbered_runs(segments, RUN_KEYS, "offset_first", "offset_last")
    return runs.groupBy(*RUN_KEYS, "run", SKIP).agg(
        F.min("offset_first").alias("offset_first"),
        F.max("offset_last").alias("offset_last"),
        *_run_aggregates(),
    )


def findings(df: DataFrame) -> DataFrame:
    keys = ["kind", "topic", "api", "filter_name", "module_sha256", "name"]
    return (
        df.groupBy(*[_kept(k) for k in keys], SKIP).agg(
            _sum0("n").alias("count"),
            _sum0("events").alias("events"),
            F.min("time_first_ms").alias("first_ms"),
            F.max("time_last_ms").alias("last_ms"),
            *_counted("time_first_ms"),
        )
    )


_CONN_SUMS = ("requests", "bytes_in", "bytes_out", "opened", "closed", "duration_ms",
              "throttle_ms")


def connections(conn: DataFrame, per_api: DataFrame) -> DataFrame:
    """``billing_connections`` rows (hours as epoch ms). A connection's ``open`` event precedes
    its first request, so it has no client id: such a row takes the client id and principal
    seen on any event of the same connection (its ``close`` and ``connection_api`` rows carry
    them). Only the rows that lack them are joined with the identities (one row per
    connection); the others go straight to the aggregation. The instances of a group are
    collected after a first aggregation per instance, over a few rows instead of every row."""
    zero = F.lit(0).cast("long")
    hour = (F.floor(F.col("time_ms") / 3_600_000) * 3_600_000).cast("long").alias("hour_ms")
    rows = conn.select(
        F.lit("connection").alias("_type"),
        "instance_id", "connection_id", "client_id", "principal", "time_ms", hour,
        F.lit("*").alias("api"),
        "requests", "bytes_in", "bytes_out",
        F.when(F.col("phase") == "open", 1).otherwise(0).cast("long").alias("opened"),
        F.when(F.col("phase") == "close", 1).otherwise(0).cast("long").alias("closed"),
        "duration_ms", "throttle_ms", SKIP,
    ).unionByName(per_api.select(
        F.lit("connection_api").alias("_type"),
        "instance_id", "connection_id", "client_id", "principal", "time_ms", hour, "api",
        "requests", "bytes_in", "bytes_out",
        zero.alias("opened"), zero.alias("closed"), zero.alias("duration_ms"),
        zero.alias("throttle_ms"), SKIP,
    ))
    usable = F.col(SKIP).isNull()
    known = F.col("principal").isNotNull() & F.col("client_id").isNotNull()
    # Skipped rows are not resolved: their keys are blanked below anyway.
    identities = rows.filter(
        usable & (F.col("principal").isNotNull() | F.col("client_id").isNotNull())
    ).groupBy("instance_id", "connection_id").agg(
        F.max("principal").alias("_principal"), F.max("client_id").alias("_client_id"))
    resolved = rows.filter(usable & ~known).join(
        identities, ["instance_id", "connection_id"], "left"
    ).select(
        *[c for c in rows.columns if c not in ("principal", "client_id")],
        F.coalesce(F.col("principal"), F.col("_principal")).alias("principal"),
        F.coalesce(F.col("client_id"), F.col("_client_id")).alias("client_id"),
    )
    every = rows.filter(known | ~usable).unionByName(resolved)
    keys = ["principal", "client_id", "hour_ms", "api"]
    per_instance = every.groupBy(
        *[_kept(k) for k in keys], "instance_id", "_type", SKIP
    ).agg(
        *[_sum0(c).alias(c) for c in _CONN_SUMS],
        F.count(F.lit(1)).alias("_rows"),
        F.min("time_ms").alias("_first_ms"),
        F.max("time_ms").alias("_last_ms"),
    )
    return per_instance.groupBy(*keys, "_type", SKIP).agg(
        *[_sum0(c).alias(c) for c in _CONN_SUMS[:3]],
        _sum0("opened").alias("connections_opened"),
        _sum0("closed").alias("connections_closed"),
        *[_sum0(c).alias(c) for c in _CONN_SUMS[5:]],
        _set("instance_id").alias("_instances"),
        _sum0("_rows").alias("_rows"),
        F.min("_first_ms").alias("_first_ms"),
        F.max("_last_ms").alias("_last_ms"),
    )


def admin(df: DataFrame) -> DataFrame:
    keys = ["module_sha256", "filter_name", "op", "resource_type", "resource", "decision",
            "principal", "client_id", "message", "instance_id"]
    return (
        df.groupBy(*[_kept(k) for k in keys], SKIP).agg(
            F.count(F.lit(1)).alias("count"),
            F.min("time_ms").alias("first_ms"),
            F.max("time_ms").alias("last_ms"),
            *_counted("time_ms"),
        )
    )


def filter_loads(df: DataFrame) -> DataFrame:
    keys = ["module_sha256", "filter_name", "instance_id"]
    return (
        df.groupBy(*[_kept(k) for k in keys], SKIP).agg(
            F.array_distinct(F.flatten(F.collect_list(F.coalesce(
                F.col("topics"), F.array().cast("array<string>"))))).alias("topics"),
            F.array_distinct(F.flatten(F.collect_list(F.coalesce(
                F.col("apply_to"), F.array().cast("array<string>"))))).alias("apply_to"),
            F.min("time_ms").alias("first_ms"),
            F.max("time_ms").alias("last_ms"),
            *_counted("time_ms"),
        )
    )


def drops(df: DataFrame) -> DataFrame:
    return (
        df.groupBy(_kept("instance_id"), _kept("reason"), SKIP).agg(
            _sum0("dropped").alias("count"),
            F.count(F.lit(1)).alias("events"),
            F.min("time_ms").alias("first_ms"),
            F.max("time_ms").alias("last_ms"),
            *_counted("time_ms"),
        )
    )


def transform_runs(tb: DataFrame) -> DataFrame:
    """Per transform, module versions (sha256s in chain order) and input partition: runs of
    batches whose input offsets overlap or touch (a new run starts where a batch's first input
    offset lies beyond every earlier batch's last + 1, as for ``offset_runs``), one row per
    run and output partition with the input and output offset ranges. All rows of one batch
    have the same input range, so they fall in the same run."""
    tb = _blanked(tb, [*TRANSFORM_KEYS, "output_topic", "output_partition"])
    runs = _numbered_runs(tb, TRANSFORM_KEYS, "input_offset_first", "input_offset_last")
    # A batch has one row per output partition: its first row counts the event.
    first_row = F.when(F.coalesce(F.col("output_index"), F.lit(0)) == 0, 1).otherwise(0)
    return (
        runs
        .groupBy(*TRANSFORM_KEYS, "run", "output_topic", "output_partition", SKIP)
        .agg(
            F.array_sort(F.array_distinct(F.flatten(F.collect_list("filter_names"))))
            .alias("filter_names"),
            F.min("input_offset_first").alias("input_offset_first"),
            F.max("input_offset_last").alias("input_offset_last"),
            F.min("output_offset_first").alias("output_offset_first"),
            F.max("output_offset_last").alias("output_offset_last"),
            F.count(F.lit(1)).alias("batches"),
            _sum0("records_in").alias("input_records"),
            _sum0("output_records").alias("output_records"),
            _sum0("dropped").alias("dropped"),
            _sum0("rejected").alias("rejected"),
            _sum0("dead_letters").alias("dead_letters"),
            _set("guarantee").alias("guarantees"),
            _set("group").alias("groups"),
            _set("instance_id").alias("proxy_instances"),
            _set("instance_id").alias("_instances"),
            F.min("time_ms").alias("time_first_ms"),
            F.max("time_ms").alias("time_last_ms"),
            *_counted("time_ms", first_row),
        )
    )


def encryption(df: DataFrame) -> DataFrame:
    """The encrypt filter's segments per api, topic-partition, principal and KEK version."""
    keys = ["api", "topic", "partition", "principal", "key_name", "key_version"]
    return df.groupBy(*[_kept(k) for k in keys], SKIP).agg(
        F.min("offset_first").alias("offset_first"),
        F.max("offset_last").alias("offset_last"),
        _sum0("batches").alias("batches"),
        _sum0("records").alias("records"),
        _sum0("decrypted").alias("decrypted"),
        _sum0("withheld").alias("withheld"),
        _sum0("unreadable").alias("unreadable"),
        *_counted("time_first_ms"),
    )
