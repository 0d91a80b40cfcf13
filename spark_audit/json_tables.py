"""JSON Lines telemetry (the old layout, schema ``TELEMETRY_V1``) as the flat datasets of the
columnar layout, so the job reads old and new telemetry the same way.

Each filter entry of a ``record_batch`` event becomes an ``offset_run`` segment of one batch
and each detector count, reject, reject reason, filter or partition error a ``finding`` of one
event, exactly what the proxy's columnar sink sums up before writing; an entry of the
``builtin:encrypt`` filter also becomes ``encryption`` segments of one batch (one per KEK
counter on produce, one per entry on fetch). A ``transform_batch`` event becomes one row per
output partition. Only built-in Spark SQL functions: the conversion stays in the JVM.
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from sluice.spark_audit.schema import SCHEMA_VERSION, spark_schema
from sluice.telemetry_schema.columns import DECRYPT_COUNTERS, KEK_COUNTER_PREFIX, SCHEMAS
from sluice.telemetry_schema.host_identity import ENCRYPT_SHA256

_ITEM = "array<struct<kind:string,name:string,n:bigint>>"


def _envelope() -> list[Column]:
    return [
        F.col("schema_version"),
        F.col("event_id"),
        F.col("time_ms"),
        F.col("proxy.host").alias("host"),
        F.col("proxy.pid").alias("pid"),
        F.col("proxy.instance_id").alias("instance_id"),
    ]


def _proxy() -> list[Column]:
    return [
        F.col("proxy.host").alias("host"),
        F.col("proxy.pid").alias("pid"),
        F.col("proxy.instance_id").alias("instance_id"),
    ]


def _shape(df: DataFrame, dataset: str) -> DataFrame:
    """Columns in the dataset's order and types (absent ones null)."""
    return df.select(
        *[
            (F.col(f.name) if f.name in df.columns else F.lit(None)).cast(f.dataType).alias(f.name)
            for f in spark_schema(dataset).fields
        ]
    )


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


def flatten(events: DataFrame) -> dict[str, DataFrame]:
    """The datasets of ``telemetry_columns.SCHEMAS`` from valid schema-v1 events."""
    by_type = {t: events.filter(F.col("type") == t) for t in (
        "record_batch", "connection", "admin", "filter_loaded", "telemetry_dropped",
        "transform_batch")}
    rb = by_type["record_batch"]
    out: dict[str, DataFrame] = {}
    out["record_batch"] = rb.select(
        "*",
        *_proxy(),
        F.coalesce(F.size("filters"), F.lit(0)).alias("filters_n"),
        F.aggregate(
            F.coalesce(F.col("filters"), F.array()),
            F.lit(0).cast("long"),
            lambda acc, f: acc + F.coalesce(f["time_ns"], F.lit(0)),
        ).alias("filter_time_ns"),
    ).drop("proxy", "filters").withColumnRenamed("filters_n", "filters")
    per_filter = rb.select(
        *_envelope(),
        "api",
        "topic",
        "partition",
        "principal",
        "offset_first",
        "offset_last",
        F.posexplode("filters").alias("pos", "f"),
    )
    f = F.col("f")
    out["offset_run"] = per_filter.select(
        F.lit(SCHEMA_VERSION).alias("schema_version"),
        F.concat_ws("#", "event_id", F.col("pos").cast("string")).alias("id"),
        F.lit(1).alias("version"),
        "host",
        "instance_id",
        f["module_sha256"].alias("module_sha256"),
        f["name"].alias("filter_name"),
        f["signer_key_id"].alias("signer_key_id"),
        "api",
        "topic",
        "partition",
        "offset_first",
        "offset_last",
        F.lit(1).alias("batches"),
        *[F.coalesce(f[c], F.lit(0)).alias(c) for c in ("kept", "rewritten", "dropped",
                                                         "rejected")],
        F.coalesce(
            F.aggregate(F.map_values(f["detectors"]), F.lit(0).cast("long"), lambda a, b: a + b),
            F.lit(0),
        ).alias("detections"),
        F.coalesce(F.size(f["errors"]), F.lit(0)).alias("errors"),
        F.coalesce(f["time_ns"], F.lit(0)).alias("time_ns"),
        F.col("time_ms").alias("time_first_ms"),
        F.col("time_ms").alias("time_last_ms"),
    )
    filter_items = per_filter.select(
        "event_id",
        "time_ms",
        "instance_id",
        "api",
        "topic",
        f["name"].alias("filter_name"),
        f["module_sha256"].alias("module_sha256"),
        f["signer_key_id"].alias("signer_key_id"),
        F.col("pos").cast("string").alias("pos"),
        F.posexplode(
            _items(
                F.transform(
                    F.filter(F.map_entries(f["detectors"]), lambda e: e["value"] > 0),
                    lambda e: _item("detection", e["key"], e["value"]),
                ),
                F.when(f["rejected"] > 0, F.array(_item("rejected", "", f["rejected"]))),
                F.transform(f["errors"], lambda m: _item("filter_error", m, 1)),
            )
        ).alias("ipos", "item"),
    )
    batch_items = rb.select(
        "event_id",
        "time_ms",
        F.col("proxy.instance_id").alias("instance_id"),
        "api",
        "topic",
        F.lit(None).cast("string").alias("filter_name"),
        F.lit(None).cast("string").alias("module_sha256"),
        F.lit(None).cast("string").alias("signer_key_id"),
        F.lit("b").alias("pos"),
        F.posexplode(
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
            )
        ).alias("ipos", "item"),
    )
    out["finding"] = filter_items.unionByName(batch_items).select(
        F.lit(SCHEMA_VERSION).alias("schema_version"),
        F.concat_ws("#", "event_id", "pos", F.col("ipos").cast("string")).alias("id"),
        F.lit(1).alias("version"),
        "instance_id",
        F.col("item.kind").alias("kind"),
        "topic",
        "api",
        "filter_name",
        "module_sha256",
        "signer_key_id",
        F.col("item.name").alias("name"),
        F.col("item.n").alias("n"),
        F.lit(1).alias("events"),
        F.col("time_ms").alias("time_first_ms"),
        F.col("time_ms").alias("time_last_ms"),
    )
    out["encryption"] = _encryption(per_filter)
    out["transform_batch"] = _transform_batches(by_type["transform_batch"])
    conn = by_type["connection"]
    out["connection"] = conn.select(
        "*",
        *_proxy(),
        F.aggregate(
            F.map_values(F.coalesce(F.col("apis"), F.create_map().cast(
                "map<string,struct<requests:bigint,bytes_in:bigint,bytes_out:bigint>>"))),
            F.lit(0).cast("long"),
            lambda acc, c: acc + F.coalesce(c["requests"], F.lit(0)),
        ).alias("requests"),
    ).drop("proxy", "apis")
    out["connection_api"] = conn.select(
        "schema_version",
        "event_id",
        "time_ms",
        F.col("proxy.instance_id").alias("instance_id"),
        "connection_id",
        "client_id",
        "principal",
        F.explode("apis").alias("api", "c"),
    ).select(
        "*",
        F.coalesce(F.col("c.requests"), F.lit(0)).alias("requests"),
        F.coalesce(F.col("c.bytes_in"), F.lit(0)).alias("bytes_in"),
        F.coalesce(F.col("c.bytes_out"), F.lit(0)).alias("bytes_out"),
    ).drop("c")
    for kind in ("admin", "filter_loaded"):
        out[kind] = by_type[kind].select(
            "*",
            *_proxy(),
            F.col("filter.name").alias("filter_name"),
            F.col("filter.module_sha256").alias("module_sha256"),
        ).drop("proxy", "filter")
    out["telemetry_dropped"] = by_type["telemetry_dropped"].select("*", *_proxy()).drop(
        "proxy"
    )
    return {name: _shape(df, name) for name, df in out.items() if name in SCHEMAS}


def _encryption(per_filter: DataFrame) -> DataFrame:
    """Segments of one batch from the encrypt filter's entries (``telemetry_columns``)."""
    f = F.col("f")
    mine = per_filter.filter(f["module_sha256"] == F.lit(ENCRYPT_SHA256))
    common: list[Column | str] = [
        F.lit(SCHEMA_VERSION).alias("schema_version"),
        F.lit(1).alias("version"),
        "host",
        "instance_id",
        f["module_sha256"].alias("module_sha256"),
        f["name"].alias("filter_name"),
        f["signer_key_id"].alias("signer_key_id"),
        "api",
        "topic",
        "partition",
        "offset_first",
        "offset_last",
        F.lit(1).alias("batches"),
        F.col("time_ms").alias("time_first_ms"),
        F.col("time_ms").alias("time_last_ms"),
    ]
    sealed = mine.filter(F.col("api") == "produce").select(
        "*", F.explode(f["detectors"]).alias("counter", "n")
    ).filter(F.col("counter").startswith(KEK_COUNTER_PREFIX))
    # kek:NAME:VERSION; names cannot hold ':' (crypto/record_filter.py).
    kek = F.split(F.substring(F.col("counter"), len(KEK_COUNTER_PREFIX) + 1, 1 << 20), ":")
    produce = sealed.select(
        *common,
        F.concat_ws("#", "event_id", F.col("pos").cast("string"), "counter").alias("id"),
        F.lit(None).cast("string").alias("principal"),
        kek[0].alias("key_name"),
        kek[1].alias("key_version"),
        F.coalesce(F.col("n"), F.lit(0)).alias("records"),
        *[F.lit(0).alias(c) for c in DECRYPT_COUNTERS],
    )
    fetch = mine.filter(F.col("api") != "produce").select(
        *common,
        F.concat_ws("#", "event_id", F.col("pos").cast("string")).alias("id"),
        "principal",
        F.lit(None).cast("string").alias("key_name"),
        F.lit(None).cast("string").alias("key_version"),
        F.lit(0).alias("records"),
        *[F.coalesce(f["detectors"].getItem(c), F.lit(0)).alias(c) for c in DECRYPT_COUNTERS],
    )
    return produce.unionByName(fetch)


def _transform_batches(tb: DataFrame) -> DataFrame:
    """One row per output partition written (one without output columns if none)."""
    filters = F.coalesce(F.col("filters"), F.array())
    return tb.select(
        *_envelope(),
        "transform",
        "group",
        "guarantee",
        "transactional_id",
        F.col("input.topic").alias("input_topic"),
        F.col("input.partition").alias("input_partition"),
        F.col("input.offset_first").alias("input_offset_first"),
        F.col("input.offset_last").alias("input_offset_last"),
        "output_topic",
        F.coalesce(F.size("outputs"), F.lit(0)).alias("outputs"),
        "records_in",
        "records_out",
        F.coalesce(F.col("dropped"), F.lit(0)).alias("dropped"),
        F.coalesce(
            F.aggregate(F.map_values("reject_reasons"), F.lit(0).cast("long"),
                        lambda a, b: a + F.coalesce(b, F.lit(0))),
            F.lit(0),
        ).alias("rejected"),
        F.coalesce(F.col("dead_letters"), F.lit(0)).alias("dead_letters"),
        F.transform(filters, lambda x: x["name"]).alias("filter_names"),
        F.transform(filters, lambda x: x["module_sha256"]).alias("module_sha256s"),
        F.aggregate(filters, F.lit(0).cast("long"),
                    lambda acc, x: acc + F.coalesce(x["time_ns"], F.lit(0))
                    ).alias("filter_time_ns"),
        F.posexplode_outer("outputs").alias("output_index", "o"),
    ).select(
        "*",
        F.coalesce(F.col("output_index"), F.lit(0)).alias("_index"),
        F.col("o.partition").alias("output_partition"),
        F.col("o.offset_first").alias("output_offset_first"),
        F.col("o.offset_last").alias("output_offset_last"),
        F.coalesce(F.col("o.records"), F.lit(0)).alias("output_records"),
    ).drop("o", "output_index").withColumnRenamed("_index", "output_index")
