"""The Spark side of the audit job: one aggregation per dataset, all collected in one go.

Every function here builds one aggregation over one dataset (no caching, no ``coalesce(1)``);
``collect`` runs any number of them as one Spark query (a union, so adaptive execution runs
their stages side by side) and returns each as a list of dicts small enough for the driver.
The report tables are then built from these rollups in the driver (``reports``). Times stay
epoch milliseconds (UTC) until the reports turn them into UTC timestamps.

- ``stats``: per event type: events in the window, first/last time, instances, and the rows
  skipped because their schema version is unknown or they do not match the schema.
- ``record_batches``: one fine-grained rollup (principal, client, topic, api, proxy, time
  bucket) from which billing, traffic, edges, top topics and the client table all come.
- ``offset_runs``: the offset-run segments merged into runs (a window over segments, not over
  every batch) per module, api and topic-partition.
- ``findings``, ``connections``, ``admin``, ``filter_loads``, ``drops``: the small datasets.
- ``transform_runs``: transform batches merged into runs of contiguous input offsets per
  transform, module versions and input partition, split per output partition.
- ``encryption``: the encrypt filter's segments summed per topic-partition, KEK version and
  principal.
"""

from __future__ import annotations

import json
from typing import Any

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F

RUN_KEYS = ["module_sha256", "api", "topic", "partition"]


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


def _sum0(col: Column | str) -> Column:
    c = F.col(col) if isinstance(col, str) else col
    return F.coalesce(F.sum(F.coalesce(c, F.lit(0))), F.lit(0)).cast("long")


def _set(col: str) -> Column:
    return F.array_sort(F.collect_set(col))


def stats(
    checks: DataFrame, time_from_ms: int | None, time_to_ms: int | None
) -> DataFrame:
    ok = ~F.col("malformed") & (F.col("schema_version") == 1)
    in_window = F.lit(True)
    if time_from_ms is not None:
        in_window = in_window & (F.col("time_ms") >= F.lit(time_from_ms))
    if time_to_ms is not None:
        in_window = in_window & (F.col("time_ms") < F.lit(time_to_ms))
    good = ok & in_window
    return (
        checks.groupBy("type").agg(
            F.sum(F.when(good, 1).otherwise(0)).cast("long").alias("events"),
            F.sum(F.when(F.col("malformed"), 1).otherwise(0)).cast("long").alias("malformed"),
            F.sum(F.when(~F.col("malformed") & (F.col("schema_version") != 1), 1).otherwise(0))
            .cast("long")
            .alias("unknown_version"),
            F.min(F.when(good, F.col("time_ms"))).alias("first_ms"),
            F.max(F.when(good, F.col("time_ms"))).alias("last_ms"),
            F.array_sort(F.collect_set(F.when(good, F.col("instance_id")))).alias("instances"),
            F.array_sort(
                F.collect_set(
                    F.when(~F.col("malformed") & (F.col("schema_version") != 1),
                           F.col("schema_version"))
                )
            ).alias("unknown_versions"),
        )
    )


def traffic(rb: DataFrame, bucket_ms: int) -> DataFrame:
    """Record bytes per client and time bucket (produce: in, fetch: out) for the chart."""
    bucket = (F.floor(F.col("time_ms") / bucket_ms) * bucket_ms).cast("long")
    return rb.groupBy("principal", "client_id", bucket.alias("bucket")).agg(
        _sum0(
            F.when(F.col("api") == "produce", F.col("bytes_in")).otherwise(F.col("bytes_out"))
        ).alias("bytes")
    )


def record_batches(rb: DataFrame, bucket_ms: int) -> DataFrame:
    bucket = (F.floor(F.col("time_ms") / bucket_ms) * bucket_ms).cast("long")
    return (
        rb.groupBy(
            "principal", "client_id", "topic", "api", "host", "instance_id", bucket.alias("bucket")
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
    ]


def offset_runs(segments: DataFrame) -> DataFrame:
    """Runs: islands of overlapping or adjacent segments (a new run starts where a segment's
    first offset lies beyond every earlier segment's last offset + 1). Segments without
    offsets are summed into one row per key with null offsets and null run. One window over
    one scan: segments without offsets have a window partition of their own."""
    no_offsets = F.col("offset_first").isNull()
    w = Window.partitionBy(*RUN_KEYS, no_offsets).orderBy(
        "offset_first", "offset_last"
    )
    prev_max = F.max("offset_last").over(w.rowsBetween(Window.unboundedPreceding, -1))
    starts = segments.withColumn(
        "_new_run",
        F.when(prev_max.isNull() | (F.col("offset_first") > prev_max + 1), 1).otherwise(0),
    )
    runs = starts.withColumn(
        "run",
        F.when(
            ~no_offsets,
            F.sum("_new_run").over(w.rowsBetween(Window.unboundedPreceding, 0)),
        ).cast("long"),
    )
    return runs.groupBy(*RUN_KEYS, "run").agg(
        F.min("offset_first").alias("offset_first"),
        F.max("offset_last").alias("offset_last"),
        *_run_aggregates(),
    )


def findings(df: DataFrame) -> DataFrame:
    return (
        df.groupBy("kind", "topic", "api", "filter_name", "module_sha256", "name").agg(
            _sum0("n").alias("count"),
            _sum0("events").alias("events"),
            F.min("time_first_ms").alias("first_ms"),
            F.max("time_last_ms").alias("last_ms"),
        )
    )


def connections(conn: DataFrame, per_api: DataFrame) -> DataFrame:
    """``billing_connections`` rows (hours as epoch ms). A connection's ``open`` event precedes
    its first request, so it has no client id: each row takes the client id and principal seen
    on any event of the same connection. A ``connection_api`` row carries its event's client
    id and principal, so one window over both datasets (no join) finds them."""
    zero = F.lit(0).cast("long")
    rows = conn.select(
        "instance_id", "connection_id", "client_id", "principal", "time_ms",
        F.lit("*").alias("api"),
        "requests", "bytes_in", "bytes_out",
        F.when(F.col("phase") == "open", 1).otherwise(0).cast("long").alias("opened"),
        F.when(F.col("phase") == "close", 1).otherwise(0).cast("long").alias("closed"),
        "duration_ms",
    ).unionByName(per_api.select(
        "instance_id", "connection_id", "client_id", "principal", "time_ms", "api",
        "requests", "bytes_in", "bytes_out",
        zero.alias("opened"), zero.alias("closed"), zero.alias("duration_ms"),
    ))
    same = Window.partitionBy("instance_id", "connection_id")
    resolved = rows.select(
        F.coalesce(F.col("principal"), F.max("principal").over(same)).alias("principal"),
        F.coalesce(F.col("client_id"), F.max("client_id").over(same)).alias("client_id"),
        (F.floor(F.col("time_ms") / 3_600_000) * 3_600_000).cast("long").alias("hour_ms"),
        "api", "requests", "bytes_in", "bytes_out", "opened", "closed", "duration_ms",
    )
    return resolved.groupBy("principal", "client_id", "hour_ms", "api").agg(
        _sum0("requests").alias("requests"),
        _sum0("bytes_in").alias("bytes_in"),
        _sum0("bytes_out").alias("bytes_out"),
        _sum0("opened").alias("connections_opened"),
        _sum0("closed").alias("connections_closed"),
        _sum0("duration_ms").alias("duration_ms"),
    )


def admin(df: DataFrame) -> DataFrame:
    return (
        df.groupBy(
            "module_sha256", "filter_name", "op", "resource_type", "resource", "decision",
            "principal", "client_id", "message", "instance_id",
        ).agg(
            F.count(F.lit(1)).alias("count"),
            F.min("time_ms").alias("first_ms"),
            F.max("time_ms").alias("last_ms"),
        )
    )


def filter_loads(df: DataFrame) -> DataFrame:
    return (
        df.groupBy("module_sha256", "filter_name", "instance_id").agg(
            F.array_distinct(F.flatten(F.collect_list(F.coalesce(
                F.col("topics"), F.array().cast("array<string>"))))).alias("topics"),
            F.array_distinct(F.flatten(F.collect_list(F.coalesce(
                F.col("apply_to"), F.array().cast("array<string>"))))).alias("apply_to"),
            F.min("time_ms").alias("first_ms"),
            F.max("time_ms").alias("last_ms"),
        )
    )


def drops(df: DataFrame) -> DataFrame:
    return (
        df.groupBy("instance_id", "reason").agg(
            _sum0("dropped").alias("count"),
            F.count(F.lit(1)).alias("events"),
            F.min("time_ms").alias("first_ms"),
            F.max("time_ms").alias("last_ms"),
        )
    )


TRANSFORM_KEYS = ["transform", "module_sha256s", "input_topic", "input_partition"]


def transform_runs(tb: DataFrame) -> DataFrame:
    """Per transform, module versions (sha256s in chain order) and input partition: runs of
    batches whose input offsets overlap or touch (a new run starts where a batch's first input
    offset lies beyond every earlier batch's last + 1, as for ``offset_runs``), one row per
    run and output partition with the input and output offset ranges. All rows of one batch
    have the same input range, so they fall in the same run."""
    no_offsets = F.col("input_offset_first").isNull()
    w = Window.partitionBy(*TRANSFORM_KEYS, no_offsets).orderBy(
        "input_offset_first", "input_offset_last"
    )
    prev_max = F.max("input_offset_last").over(w.rowsBetween(Window.unboundedPreceding, -1))
    starts = tb.withColumn(
        "_new_run",
        F.when(prev_max.isNull() | (F.col("input_offset_first") > prev_max + 1), 1).otherwise(0),
    )
    runs = starts.withColumn(
        "run",
        F.when(
            ~no_offsets,
            F.sum("_new_run").over(w.rowsBetween(Window.unboundedPreceding, 0)),
        ).cast("long"),
    )
    return (
        runs
        .groupBy(*TRANSFORM_KEYS, "run", "output_topic", "output_partition")
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
            F.min("time_ms").alias("time_first_ms"),
            F.max("time_ms").alias("time_last_ms"),
        )
    )


def encryption(df: DataFrame) -> DataFrame:
    """The encrypt filter's segments per api, topic-partition, principal and KEK version."""
    return df.groupBy("api", "topic", "partition", "principal", "key_name", "key_version").agg(
        F.min("offset_first").alias("offset_first"),
        F.max("offset_last").alias("offset_last"),
        _sum0("batches").alias("batches"),
        _sum0("records").alias("records"),
        _sum0("decrypted").alias("decrypted"),
        _sum0("withheld").alias("withheld"),
        _sum0("unreadable").alias("unreadable"),
    )
