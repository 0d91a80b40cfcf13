"""The report tables, as Spark DataFrame transformations of the telemetry events.

Input: the events DataFrame of schema ``TELEMETRY_V1`` plus ``ts`` (event time as a UTC
timestamp) and ``hour`` (``ts`` truncated to the hour), as ``load.load_events`` returns it.
Only built-in Spark SQL functions are used (no Python UDFs), so the work stays in the JVM.

Reports (column meanings are in docs/TELEMETRY.md, section "Reports"):
- ``audit``: per filter module (sha256), api, topic-partition and contiguous offset run.
- ``audit_modules``: one row per module sha256: where it was loaded and what it touched.
- ``billing``: per principal, client id, topic and hour: records/bytes produced and consumed,
  filter time.
- ``billing_connections``: per principal, client id, hour and API: connection-level traffic
  (also unfiltered), ``api = "*"`` rows hold the connection totals.
- ``compliance``: long format, ``kind`` in detection, rejected, reject_reason, filter_error,
  partition_error, admin_deny, admin_error, telemetry_dropped.
- ``admin``: admin decisions per module, operation, resource and decision.
- ``encryption``: key versions and offset ranges of encrypted records, reads per principal
  (spark_audit/encryption.py).
"""

from __future__ import annotations

from collections.abc import Callable

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F

from sluice.spark_audit.encryption import encryption

REPORT_NAMES = (
    "audit",
    "audit_modules",
    "billing",
    "billing_connections",
    "compliance",
    "admin",
    "encryption",
)

_RUN_KEYS = ["module_sha256", "api", "topic", "partition"]


def _sorted(df: DataFrame, *keys: str | Column) -> DataFrame:
    """One sorted partition: reports are aggregates, and a global ``orderBy`` would cost an
    extra sampling job per report."""
    return df.coalesce(1).sortWithinPartitions(*keys)


def _sum0(col: Column) -> Column:
    return F.coalesce(F.sum(col), F.lit(0)).cast("long")


def _when_api(api: str, col: str) -> Column:
    return F.when(F.col("api") == api, F.coalesce(F.col(col), F.lit(0))).otherwise(0)


def record_batches(events: DataFrame) -> DataFrame:
    return events.filter(F.col("type") == "record_batch")


def filter_rows(events: DataFrame) -> DataFrame:
    """One row per (record_batch event, filter that ran on it)."""
    rb = record_batches(events)
    exploded = rb.select(
        "api",
        "topic",
        "partition",
        "offset_first",
        "offset_last",
        "ts",
        F.col("proxy.instance_id").alias("instance_id"),
        F.col("proxy.host").alias("host"),
        F.explode("filters").alias("f"),
    )
    f = F.col("f")
    return exploded.select(
        f["module_sha256"].alias("module_sha256"),
        f["name"].alias("filter_name"),
        "api",
        "topic",
        "partition",
        "offset_first",
        "offset_last",
        "ts",
        "instance_id",
        "host",
        F.coalesce(f["kept"], F.lit(0)).alias("kept"),
        F.coalesce(f["rewritten"], F.lit(0)).alias("rewritten"),
        F.coalesce(f["dropped"], F.lit(0)).alias("dropped"),
        F.coalesce(f["rejected"], F.lit(0)).alias("rejected"),
        F.coalesce(
            F.aggregate(F.map_values(f["detectors"]), F.lit(0).cast("long"), lambda a, b: a + b),
            F.lit(0),
        ).alias("detections"),
        F.coalesce(F.size(f["errors"]), F.lit(0)).alias("errors"),
        F.coalesce(f["time_ns"], F.lit(0)).alias("time_ns"),
        f["detectors"].alias("detectors"),
        f["errors"].alias("error_messages"),
    )


def _decision_sums() -> list[Column]:
    """What the filters did, summed: the columns the audit and module reports share."""
    return [
        _sum0(F.col("kept")).alias("kept"),
        _sum0(F.col("rewritten")).alias("rewritten"),
        _sum0(F.col("dropped")).alias("dropped"),
        _sum0(F.col("rejected")).alias("rejected"),
        _sum0(F.col("detections")).alias("detections"),
        _sum0(F.col("errors")).alias("errors"),
        _sum0(F.col("time_ns")).alias("filter_time_ns"),
    ]


def _run_aggregates() -> list[Column]:
    return [
        F.array_sort(F.collect_set("filter_name")).alias("filter_names"),
        F.count(F.lit(1)).alias("batches"),
        (
            _sum0(F.col("kept"))
            + _sum0(F.col("rewritten"))
            + _sum0(F.col("dropped"))
            + _sum0(F.col("rejected"))
        ).alias("records"),
        *_decision_sums(),
        F.array_sort(F.collect_set("instance_id")).alias("proxy_instances"),
        F.array_sort(F.collect_set("host")).alias("proxy_hosts"),
        F.min("ts").alias("time_first"),
        F.max("ts").alias("time_last"),
    ]


def audit(events: DataFrame, frows: DataFrame | None = None) -> DataFrame:
    """Contiguous offset runs each module touched, per api and topic-partition.

    Runs are islands of overlapping or adjacent offset ranges (a new run starts where a
    batch's first offset lies beyond every earlier batch's last offset + 1), so re-reads by
    several consumers merge and a gap (offsets that went around the proxy, or were never
    filtered) splits. Batches without offsets (acks=0, broker errors) get one row per key
    with null offsets and null run.
    """
    rows = (frows if frows is not None else filter_rows(events)).select(
        *_RUN_KEYS,
        "filter_name",
        "offset_first",
        "offset_last",
        "ts",
        "instance_id",
        "host",
        "kept",
        "rewritten",
        "dropped",
        "rejected",
        "detections",
        "errors",
        "time_ns",
    )
    with_offsets = rows.filter(F.col("offset_first").isNotNull())
    w = Window.partitionBy(*_RUN_KEYS).orderBy("offset_first", "offset_last")
    prev_max = F.max("offset_last").over(w.rowsBetween(Window.unboundedPreceding, -1))
    starts = with_offsets.withColumn(
        "_new_run",
        F.when(prev_max.isNull() | (F.col("offset_first") > prev_max + 1), 1).otherwise(0),
    )
    runs = starts.withColumn(
        "run", F.sum("_new_run").over(w.rowsBetween(Window.unboundedPreceding, 0))
    )
    with_runs = runs.groupBy(*_RUN_KEYS, "run").agg(
        F.min("offset_first").alias("offset_first"),
        F.max("offset_last").alias("offset_last"),
        *_run_aggregates(),
    )
    no_offsets = (
        rows.filter(F.col("offset_first").isNull())
        .groupBy(*_RUN_KEYS)
        .agg(*_run_aggregates())
        .withColumn("run", F.lit(None).cast("long"))
        .withColumn("offset_first", F.lit(None).cast("long"))
        .withColumn("offset_last", F.lit(None).cast("long"))
    )
    columns = [
        *_RUN_KEYS,
        "run",
        "offset_first",
        "offset_last",
        "filter_names",
        "batches",
        "records",
        "kept",
        "rewritten",
        "dropped",
        "rejected",
        "detections",
        "errors",
        "filter_time_ns",
        "proxy_instances",
        "proxy_hosts",
        "time_first",
        "time_last",
    ]
    return (
        with_runs.withColumn("run", F.col("run").cast("long"))
        .select(*columns)
        .unionByName(no_offsets.select(*columns))
        .transform(lambda df: _sorted(df, *_RUN_KEYS, F.col("offset_first").asc_nulls_last()))
    )


def audit_modules(events: DataFrame, frows: DataFrame | None = None) -> DataFrame:
    """One row per module sha256: where it was loaded, what data and admin items it touched."""
    touched = (
        (frows if frows is not None else filter_rows(events))
        .groupBy("module_sha256")
        .agg(
            F.array_sort(F.collect_set("filter_name")).alias("touched_names"),
            F.array_sort(F.collect_set("api")).alias("apis"),
            F.array_sort(F.collect_set("topic")).alias("topics"),
            # size(collect_set) rather than countDistinct: a distinct count next to other
            # aggregates makes Spark expand every row once per distinct group.
            F.size(F.collect_set(F.struct("topic", "partition"))).alias("topic_partitions"),
            F.array_sort(F.collect_set("instance_id")).alias("touched_instances"),
            F.array_sort(F.collect_set("host")).alias("proxy_hosts"),
            F.min("ts").alias("first_seen"),
            F.max("ts").alias("last_seen"),
            F.count(F.lit(1)).alias("batches"),
            *_decision_sums(),
        )
    )
    loaded = (
        events.filter(F.col("type") == "filter_loaded")
        .groupBy(F.col("filter.module_sha256").alias("module_sha256"))
        .agg(
            F.array_sort(F.collect_set("filter.name")).alias("loaded_names"),
            F.array_sort(F.collect_set("proxy.instance_id")).alias("loaded_on_instances"),
            F.array_sort(F.array_distinct(F.flatten(F.collect_list("topics")))).alias(
                "bound_topics"
            ),
            F.array_sort(F.array_distinct(F.flatten(F.collect_list("apply_to")))).alias("apply_to"),
            F.min("ts").alias("first_loaded"),
            F.max("ts").alias("last_loaded"),
        )
    )
    admin_counts = (
        events.filter(F.col("type") == "admin")
        .groupBy(F.col("filter.module_sha256").alias("module_sha256"))
        .agg(
            F.count(F.lit(1)).alias("admin_items"),
            _sum0(F.when(F.col("decision") == "deny", 1).otherwise(0)).alias("admin_denied"),
            F.array_sort(F.collect_set("filter.name")).alias("admin_names"),
            F.array_sort(F.collect_set("proxy.instance_id")).alias("admin_instances"),
        )
    )
    joined = touched.join(loaded, "module_sha256", "full_outer").join(
        admin_counts, "module_sha256", "full_outer"
    )
    empty = F.array().cast("array<string>")

    def union_arrays(*cols: str) -> Column:
        merged = F.coalesce(F.col(cols[0]), empty)
        for c in cols[1:]:
            merged = F.array_union(merged, F.coalesce(F.col(c), empty))
        return F.array_sort(merged)

    zero_cols = [
        "batches",
        "kept",
        "rewritten",
        "dropped",
        "rejected",
        "detections",
        "errors",
        "filter_time_ns",
        "admin_items",
        "admin_denied",
        "topic_partitions",
    ]
    return joined.select(
        "module_sha256",
        union_arrays("touched_names", "loaded_names", "admin_names").alias("filter_names"),
        union_arrays("touched_instances", "loaded_on_instances", "admin_instances").alias(
            "proxy_instances"
        ),
        F.coalesce(F.col("proxy_hosts"), empty).alias("proxy_hosts"),
        F.coalesce(F.col("bound_topics"), empty).alias("bound_topics"),
        F.coalesce(F.col("apply_to"), empty).alias("apply_to"),
        F.coalesce(F.col("apis"), empty).alias("apis"),
        F.coalesce(F.col("topics"), empty).alias("topics"),
        *[F.coalesce(F.col(c), F.lit(0)).cast("long").alias(c) for c in zero_cols],
        "first_loaded",
        "last_loaded",
        "first_seen",
        "last_seen",
    ).transform(lambda df: _sorted(df, "module_sha256"))


def billing(events: DataFrame, frows: DataFrame | None = None) -> DataFrame:
    """Per principal, client id, topic and hour: records and bytes each way, filter time."""
    rb = record_batches(events).withColumn(
        "_filter_ns",
        F.aggregate(
            F.coalesce(F.col("filters"), F.array()),
            F.lit(0).cast("long"),
            lambda acc, f: acc + F.coalesce(f["time_ns"], F.lit(0)),
        ),
    )
    aggs: list[Column] = []
    for api in ("produce", "fetch"):
        aggs.append(_sum0(F.when(F.col("api") == api, 1).otherwise(0)).alias(f"{api}_batches"))
        for col in ("records_in", "records_out", "bytes_in", "bytes_out"):
            aggs.append(_sum0(_when_api(api, col)).alias(f"{api}_{col}"))
    aggs.append(
        _sum0(
            F.when((F.col("api") == "produce") & (F.col("error_code") != 0), 1).otherwise(0)
        ).alias("produce_errors")
    )
    aggs.append(
        _sum0(F.when((F.col("api") == "fetch") & (F.col("error_code") != 0), 1).otherwise(0)).alias(
            "fetch_errors"
        )
    )
    aggs.append(_sum0(F.col("_filter_ns")).alias("filter_time_ns"))
    return (
        rb.groupBy("principal", "client_id", "topic", "hour")
        .agg(*aggs)
        .transform(lambda df: _sorted(df, "hour", "principal", "client_id", "topic"))
    )


def billing_connections(events: DataFrame, frows: DataFrame | None = None) -> DataFrame:
    """Connection-level traffic (including unfiltered APIs) per principal, client, hour, API.

    A connection's ``open`` event precedes its first request, so it has no client id: each
    event takes the client id and principal seen on any event of the same connection.
    """
    conn = events.filter(F.col("type") == "connection").withColumn(
        "instance_id", F.col("proxy.instance_id")
    )
    ident = conn.groupBy("instance_id", "connection_id").agg(
        F.max("client_id").alias("_client_id"), F.max("principal").alias("_principal")
    )
    resolved = (
        conn.join(ident, ["instance_id", "connection_id"], "left")
        .withColumn("client_id", F.coalesce(F.col("client_id"), F.col("_client_id")))
        .withColumn("principal", F.coalesce(F.col("principal"), F.col("_principal")))
    )
    keys = ["principal", "client_id", "hour"]
    totals = (
        resolved.groupBy(*keys)
        .agg(
            _sum0(F.coalesce(_map_total_requests(), F.lit(0))).alias("requests"),
            _sum0(F.col("bytes_in")).alias("bytes_in"),
            _sum0(F.col("bytes_out")).alias("bytes_out"),
            _sum0(F.when(F.col("phase") == "open", 1).otherwise(0)).alias("connections_opened"),
            _sum0(F.when(F.col("phase") == "close", 1).otherwise(0)).alias("connections_closed"),
            _sum0(F.col("duration_ms")).alias("duration_ms"),
        )
        .withColumn("api", F.lit("*"))
    )
    per_api = (
        resolved.select(*keys, F.explode("apis").alias("api", "c"))
        .groupBy(*keys, "api")
        .agg(
            _sum0(F.col("c.requests")).alias("requests"),
            _sum0(F.col("c.bytes_in")).alias("bytes_in"),
            _sum0(F.col("c.bytes_out")).alias("bytes_out"),
        )
        .withColumn("connections_opened", F.lit(0).cast("long"))
        .withColumn("connections_closed", F.lit(0).cast("long"))
        .withColumn("duration_ms", F.lit(0).cast("long"))
    )
    columns = [
        *keys,
        "api",
        "requests",
        "bytes_in",
        "bytes_out",
        "connections_opened",
        "connections_closed",
        "duration_ms",
    ]
    return (
        totals.select(*columns)
        .unionByName(per_api.select(*columns))
        .transform(lambda df: _sorted(df, "hour", "principal", "client_id", "api"))
    )


_API_COUNTERS_MAP = "map<string,struct<requests:bigint,bytes_in:bigint,bytes_out:bigint>>"


def _map_total_requests() -> Column:
    apis = F.coalesce(F.col("apis"), F.create_map().cast(_API_COUNTERS_MAP))
    return F.aggregate(
        F.map_values(apis),
        F.lit(0).cast("long"),
        lambda acc, c: acc + F.coalesce(c["requests"], F.lit(0)),
    )


_ITEM = "array<struct<kind:string,name:string,n:bigint>>"


def _item(kind: Column | str, name: Column | str, n: Column | int) -> Column:
    def col(v: Column | str | int) -> Column:
        return v if isinstance(v, Column) else F.lit(v)

    return F.struct(
        col(kind).cast("string").alias("kind"),
        col(name).cast("string").alias("name"),
        col(n).cast("long").alias("n"),
    )


def _items(*parts: Column) -> Column:
    empty = F.array().cast(_ITEM)
    return F.concat(*[F.coalesce(p.cast(_ITEM), empty) for p in parts])


def compliance(events: DataFrame, frows: DataFrame | None = None) -> DataFrame:
    """Detections, rejects with reasons, filter and partition errors, admin denials, gaps.

    Two scans: each row turns into an array of (kind, name, n) items which is exploded once,
    rather than one scan of the cached data per kind.
    """
    rows = frows if frows is not None else filter_rows(events)
    per_filter = rows.select(
        "topic",
        "api",
        "filter_name",
        "module_sha256",
        "ts",
        F.explode(
            _items(
                F.transform(
                    F.filter(F.map_entries("detectors"), lambda e: e["value"] > 0),
                    lambda e: _item("detection", e["key"], e["value"]),
                ),
                F.when(F.col("rejected") > 0, F.array(_item("rejected", "", F.col("rejected")))),
                F.transform("error_messages", lambda m: _item("filter_error", m, 1)),
            )
        ).alias("item"),
    )
    kind = F.col("type")
    is_batch = kind == "record_batch"
    is_admin = (kind == "admin") & F.col("decision").isin("deny", "error")
    is_gap = kind == "telemetry_dropped"
    per_event = events.filter(is_batch | is_admin | is_gap).select(
        F.when(is_admin, F.col("resource")).otherwise(F.col("topic")).alias("topic"),
        F.when(is_admin, F.col("op")).otherwise(F.col("api")).alias("api"),
        F.when(is_admin, F.col("filter.name"))
        .when(is_gap, F.col("proxy.instance_id"))
        .alias("filter_name"),
        F.when(is_admin, F.col("filter.module_sha256")).alias("module_sha256"),
        "ts",
        F.explode(
            F.when(
                is_batch,
                _items(
                    F.transform(
                        F.map_entries("reject_reasons"),
                        lambda e: _item("reject_reason", e["key"], e["value"]),
                    ),
                    F.when(
                        F.coalesce(F.col("error_code"), F.lit(0)) != 0,
                        F.array(
                            _item(
                                "partition_error",
                                F.concat_ws(
                                    ": ",
                                    F.col("error_code").cast("string"),
                                    F.coalesce(F.col("error_message"), F.lit("")),
                                ),
                                1,
                            )
                        ),
                    ),
                ),
            )
            .when(
                is_admin,
                F.array(
                    _item(
                        F.concat(F.lit("admin_"), F.col("decision")),
                        F.coalesce(F.col("message"), F.lit("")),
                        1,
                    )
                ),
            )
            .otherwise(
                F.array(
                    _item(
                        "telemetry_dropped",
                        F.coalesce(F.col("reason"), F.lit("")),
                        F.col("dropped"),
                    )
                )
            )
        ).alias("item"),
    )
    keys = ["kind", "topic", "api", "filter_name", "module_sha256", "name"]
    union = per_filter.unionByName(per_event).select(
        F.col("item.kind").alias("kind"),
        "topic",
        "api",
        "filter_name",
        "module_sha256",
        F.col("item.name").alias("name"),
        F.col("item.n").alias("n"),
        "ts",
    )
    aggregated = union.groupBy(*keys).agg(
        _sum0(F.col("n")).alias("count"),
        F.count(F.lit(1)).alias("events"),
        F.min("ts").alias("first_time"),
        F.max("ts").alias("last_time"),
    )
    return _sorted(aggregated, "kind", "topic", "api", "filter_name", "name")


def admin(events: DataFrame, frows: DataFrame | None = None) -> DataFrame:
    """Admin decisions per module, operation, resource, decision, principal and client."""
    return (
        events.filter(F.col("type") == "admin")
        .groupBy(
            F.col("filter.module_sha256").alias("module_sha256"),
            F.col("filter.name").alias("filter_name"),
            "op",
            "resource_type",
            "resource",
            "decision",
            "principal",
            "client_id",
        )
        .agg(
            F.count(F.lit(1)).alias("count"),
            F.array_sort(F.collect_set("proxy.instance_id")).alias("proxy_instances"),
            F.slice(F.array_sort(F.collect_set("message")), 1, 5).alias("messages"),
            F.min("ts").alias("first_time"),
            F.max("ts").alias("last_time"),
        )
        .transform(lambda df: _sorted(df, "module_sha256", "op", "resource", "decision"))
    )


Builder = Callable[[DataFrame, DataFrame | None], DataFrame]

BUILDERS: dict[str, Builder] = {
    "audit": audit,
    "audit_modules": audit_modules,
    "billing": billing,
    "billing_connections": billing_connections,
    "compliance": compliance,
    "admin": admin,
    "encryption": encryption,
}
