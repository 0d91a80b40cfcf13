"""The audit job: telemetry in, Parquet + CSV reports and an HTML summary out.

Run it as ``sluice audit ...``, ``python -m sluice.spark_audit ...``, or give this file to
spark-submit (``spark-submit --master spark://... $(python -c 'import
sluice.spark_audit.job as j; print(j.__file__)') --telemetry ... --out ...``).

Output layout under OUT (local folder)::

    report.html           self-contained summary (inline SVG)
    summary.json          event counts, totals, paths, timings
    <report>.parquet/     Spark Parquet folder, one per report
    <report>.csv          one CSV file per report (arrays joined with ';', maps as JSON)

For a non-local OUT (``s3a://``...), ``<report>.csv`` is a Spark folder with one part file and
the HTML goes to ``--html`` (a local file).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pyspark import StorageLevel
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import ArrayType, MapType, StructType, TimestampType

from sluice.spark_audit import html_report, load, reports
from sluice.spark_audit.options import add_arguments, parse_conf
from sluice.spark_audit.session import get_session
from sluice.spark_audit.svg import Edge

TOP_CLIENTS_IN_CHART = 8
TOPOLOGY_LIMITS = {"client": 14, "proxy": 8, "topic": 16}


@dataclass
class AuditResult:
    out: str
    html: str
    reports: dict[str, dict[str, str]]
    events: int
    events_by_type: dict[str, int]
    totals: dict[str, int]
    instances: list[str]
    seconds: float
    timings: dict[str, float] = field(default_factory=dict)


def _is_local(path: str) -> bool:
    return "://" not in path or path.startswith("file://")


def _local(path: str) -> Path:
    return Path(path[len("file://") :] if path.startswith("file://") else path)


def _join(base: str, name: str) -> str:
    return base.rstrip("/") + "/" + name


def _iso(dt: datetime | None) -> str | None:
    if dt is None:
        return None
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=UTC)
    return dt.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


def _csv_ready(df: DataFrame) -> DataFrame:
    """Flatten types CSV cannot hold: arrays -> 'a;b', maps/structs -> JSON, times -> ISO Z."""
    cols = []
    for f in df.schema.fields:
        c = F.col(f.name)
        if isinstance(f.dataType, ArrayType):
            c = F.concat_ws(";", c.cast("array<string>"))
        elif isinstance(f.dataType, MapType | StructType):
            c = F.to_json(c)
        elif isinstance(f.dataType, TimestampType):
            c = F.date_format(c, "yyyy-MM-dd'T'HH:mm:ss.SSS'Z'")
        cols.append(c.alias(f.name))
    return df.select(*cols)


def _write_report(spark: SparkSession, df: DataFrame, out: str, name: str) -> dict[str, str]:
    parquet_path = _join(out, f"{name}.parquet")
    # Reports come as one sorted partition (reports._sorted): one file each.
    df.write.mode("overwrite").parquet(parquet_path)
    # CSV from the written Parquet, so the aggregation runs once.
    written = spark.read.parquet(parquet_path)
    csv_path = _join(out, f"{name}.csv")
    if _is_local(out):
        tmp_dir = _join(out, f".{name}.csv.tmp")
        _csv_ready(written).coalesce(1).write.mode("overwrite").option("header", True).csv(tmp_dir)
        parts = sorted(_local(tmp_dir).glob("part-*.csv"))
        target = _local(csv_path)
        if target.is_dir():
            shutil.rmtree(target)
        if parts:
            parts[0].replace(target)
        else:  # no rows: Spark may write no part file; keep a header-only file
            target.write_text(",".join(written.columns) + "\n", encoding="utf-8")
        shutil.rmtree(_local(tmp_dir), ignore_errors=True)
    else:
        _csv_ready(written).coalesce(1).write.mode("overwrite").option("header", True).csv(csv_path)
    return {"parquet": parquet_path, "csv": csv_path}


def _client_label() -> Any:
    label = F.concat_ws("/", F.col("principal"), F.col("client_id"))
    return F.when(label == "", F.lit("(anonymous)")).otherwise(label)


def _bucket(span_ms: int) -> tuple[int, str]:
    if span_ms <= 2 * 3600_000:
        return 60_000, "minute"
    if span_ms <= 2 * 86400_000:
        return 3600_000, "hour"
    return 86400_000, "day"


def _traffic(events: DataFrame, bucket_ms: int) -> dict[str, list[tuple[int, float]]]:
    rows = (
        reports.record_batches(events)
        .select(
            _client_label().alias("client"),
            (F.floor(F.col("time_ms") / bucket_ms) * bucket_ms).cast("long").alias("bucket"),
            (
                F.when(
                    F.col("api") == "produce", F.coalesce(F.col("bytes_in"), F.lit(0))
                ).otherwise(F.coalesce(F.col("bytes_out"), F.lit(0)))
            ).alias("bytes"),
        )
        .groupBy("client", "bucket")
        .agg(F.sum("bytes").alias("bytes"))
        .collect()
    )
    totals: dict[str, int] = {}
    for r in rows:
        totals[r["client"]] = totals.get(r["client"], 0) + int(r["bytes"] or 0)
    top = sorted(totals, key=lambda c: (-totals[c], c))[:TOP_CLIENTS_IN_CHART]
    series: dict[str, dict[int, float]] = {c: {} for c in top}
    for r in rows:
        name = r["client"] if r["client"] in series else "other clients"
        bucket = series.setdefault(name, {})
        bucket[int(r["bucket"])] = bucket.get(int(r["bucket"]), 0.0) + float(r["bytes"] or 0)
    return {name: sorted(points.items()) for name, points in series.items()}


def _edges(events: DataFrame) -> list[Edge]:
    rows = (
        reports.record_batches(events)
        .groupBy(
            _client_label().alias("client"),
            F.concat_ws(" ", F.col("proxy.host"), F.col("proxy.instance_id")).alias("proxy"),
            "topic",
            "api",
        )
        .agg(
            F.sum(F.coalesce(F.col("records_out"), F.lit(0))).alias("records"),
            F.sum(
                F.when(F.col("api") == "produce", F.col("bytes_in")).otherwise(F.col("bytes_out"))
            ).alias("bytes"),
        )
        .collect()
    )
    weight: dict[str, dict[str, int]] = {"client": {}, "proxy": {}, "topic": {}}
    for r in rows:
        for kind in weight:
            weight[kind][r[kind]] = weight[kind].get(r[kind], 0) + int(r["records"] or 0)
    keep = {
        kind: set(sorted(w, key=lambda k, w=w: (-w[k], k))[: TOPOLOGY_LIMITS[kind]])  # type: ignore[misc]
        for kind, w in weight.items()
    }
    merged: dict[tuple[str, str, str, str], list[int]] = {}
    for r in rows:
        client = r["client"] if r["client"] in keep["client"] else "other clients"
        proxy = r["proxy"] if r["proxy"] in keep["proxy"] else "other proxies"
        topic = r["topic"] if r["topic"] in keep["topic"] else "other topics"
        acc = merged.setdefault((client, proxy, topic, r["api"]), [0, 0])
        acc[0] += int(r["records"] or 0)
        acc[1] += int(r["bytes"] or 0)
    return [
        Edge(client=c, proxy=p, topic=t, api=a, records=v[0], bytes=v[1])
        for (c, p, t, a), v in sorted(merged.items())
    ]


def _rows(df: DataFrame, limit: int) -> list[dict[str, Any]]:
    return [r.asDict(recursive=True) for r in df.limit(limit).collect()]


def run_audit(
    telemetry: str,
    out: str,
    *,
    master: str | None = None,
    time_from: str | None = None,
    time_to: str | None = None,
    input_format: str = "json",
    glob: str | None = load.DEFAULT_GLOB,
    kafka_reader: str = "python",
    dedupe: bool | None = None,
    html_path: str | None = None,
    conf: dict[str, str] | None = None,
) -> AuditResult:
    started = time.perf_counter()
    timings: dict[str, float] = {}
    from_ms = load.parse_time(time_from)
    to_ms = load.parse_time(time_to)
    is_kafka = load.parse_kafka_url(telemetry) is not None
    if html_path is None:
        if not _is_local(out):
            raise ValueError("--html FILE is required when --out is not a local folder")
        html_path = str(_local(out) / "report.html")
    if _is_local(out):
        _local(out).mkdir(parents=True, exist_ok=True)
    spark, created = get_session(master, conf)
    events: DataFrame | None = None
    frows: DataFrame | None = None
    try:
        t0 = time.perf_counter()
        raw = load.read_raw(
            spark, telemetry, input_format=input_format, glob=glob, kafka_reader=kafka_reader
        )
        events = load.prepare(
            raw,
            time_from_ms=from_ms,
            time_to_ms=to_ms,
            dedupe=is_kafka if dedupe is None else dedupe,
        ).persist(StorageLevel.MEMORY_AND_DISK)
        summary_rows = (
            events.groupBy("type")
            .agg(
                F.count(F.lit(1)).alias("n"),
                F.min("ts").alias("first"),
                F.max("ts").alias("last"),
                F.collect_set("proxy.instance_id").alias("instances"),
            )
            .collect()
        )
        timings["read_and_cache"] = time.perf_counter() - t0
        by_type = {r["type"]: int(r["n"]) for r in summary_rows}
        firsts = [r["first"] for r in summary_rows if r["first"] is not None]
        lasts = [r["last"] for r in summary_rows if r["last"] is not None]
        instances = sorted({i for r in summary_rows for i in (r["instances"] or [])})
        # The per-filter rows feed three reports: explode the filters once.
        t0 = time.perf_counter()
        frows = reports.filter_rows(events).persist(StorageLevel.MEMORY_AND_DISK)
        frows.count()
        timings["filter_rows"] = time.perf_counter() - t0
        written: dict[str, dict[str, str]] = {}
        for name in reports.REPORT_NAMES:
            t0 = time.perf_counter()
            df = reports.BUILDERS[name](events, frows)
            written[name] = _write_report(spark, df, out, name)
            timings[f"report_{name}"] = time.perf_counter() - t0

        t0 = time.perf_counter()
        first_ms = int(min(firsts).replace(tzinfo=UTC).timestamp() * 1000) if firsts else 0
        last_ms = int(max(lasts).replace(tzinfo=UTC).timestamp() * 1000) if lasts else 0
        bucket_ms, bucket_label = _bucket(last_ms - first_ms)
        billing = spark.read.parquet(written["billing"]["parquet"])
        compliance = spark.read.parquet(written["compliance"]["parquet"])
        modules = spark.read.parquet(written["audit_modules"]["parquet"])
        totals_row = billing.agg(
            F.sum("produce_records_out").alias("produce_records"),
            F.sum("fetch_records_out").alias("fetch_records"),
            F.sum("produce_bytes_in").alias("produce_bytes"),
            F.sum("fetch_bytes_out").alias("fetch_bytes"),
            F.sum("filter_time_ns").alias("filter_time_ns"),
        ).collect()[0]
        kinds = {
            r["kind"]: int(r["total"])
            for r in compliance.groupBy("kind").agg(F.sum("count").alias("total")).collect()
        }
        totals = {k: int(v or 0) for k, v in totals_row.asDict().items()}
        totals["detections"] = kinds.get("detection", 0)
        totals["rejected"] = kinds.get("rejected", 0)
        totals["filter_errors"] = kinds.get("filter_error", 0)
        totals["telemetry_dropped"] = kinds.get("telemetry_dropped", 0)
        top_topics = [
            (r["topic"], int(r["p"]), int(r["f"]))
            for r in billing.groupBy("topic")
            .agg(F.sum("produce_records_out").alias("p"), F.sum("fetch_records_out").alias("f"))
            .orderBy(F.desc(F.col("p") + F.col("f")), "topic")
            .limit(15)
            .collect()
        ]
        detections = [
            (f"{r['name']} @ {r['topic']}", int(r["n"]))
            for r in compliance.filter(F.col("kind") == "detection")
            .groupBy("name", "topic")
            .agg(F.sum("count").alias("n"))
            .orderBy(F.desc("n"), "name", "topic")
            .limit(15)
            .collect()
        ]
        clients = _rows(
            billing.groupBy("principal", "client_id")
            .agg(
                *[
                    F.sum(c).alias(c)
                    for c in (
                        "produce_records_out",
                        "produce_bytes_in",
                        "fetch_records_out",
                        "fetch_bytes_out",
                        "filter_time_ns",
                    )
                ]
            )
            .orderBy(F.desc(F.col("produce_bytes_in") + F.col("fetch_bytes_out"))),
            50,
        )
        data = html_report.ReportData(
            source=telemetry,
            generated_at=_iso(datetime.now(tz=UTC)) or "",
            time_from=time_from,
            time_to=time_to,
            first_event=_iso(min(firsts)) if firsts else None,
            last_event=_iso(max(lasts)) if lasts else None,
            events_by_type=by_type,
            totals=totals,
            instances=instances,
            bucket_label=bucket_label,
            traffic=_traffic(events, bucket_ms),
            top_topics=top_topics,
            detections=detections,
            edges=_edges(events),
            modules=_rows(modules.orderBy(F.desc("batches"), "module_sha256"), 50),
            clients=clients,
            compliance=_rows(compliance.orderBy(F.desc("count"), "kind", "topic"), 50),
            files=[
                (name, _relative(p["parquet"], out), _relative(p["csv"], out))
                for name, p in written.items()
            ],
        )
        Path(html_path).parent.mkdir(parents=True, exist_ok=True)
        Path(html_path).write_text(html_report.render(data), encoding="utf-8")
        timings["html"] = time.perf_counter() - t0
        result = AuditResult(
            out=out,
            html=html_path,
            reports=written,
            events=sum(by_type.values()),
            events_by_type=by_type,
            totals=totals,
            instances=instances,
            seconds=time.perf_counter() - started,
            timings=timings,
        )
        if _is_local(out):
            (_local(out) / "summary.json").write_text(
                json.dumps(asdict(result), indent=2, sort_keys=True), encoding="utf-8"
            )
        return result
    finally:
        for cached in (frows, events):
            if cached is not None:
                cached.unpersist()
        if created:
            spark.stop()


def _relative(path: str, out: str) -> str:
    prefix = out.rstrip("/") + "/"
    return path[len(prefix) :] if path.startswith(prefix) else path


def run_from_args(args: argparse.Namespace) -> int:
    """Entry point shared by ``sluice audit`` and ``python -m sluice.spark_audit``."""
    telemetry_path = str(args.telemetry)
    if (
        load.parse_kafka_url(telemetry_path) is None
        and _is_local(telemetry_path)
        and not _local(telemetry_path).exists()
    ):
        # Checked before Spark starts: a typo should not cost a JVM start and a stack trace.
        print(f"sluice audit: --telemetry {telemetry_path}: no such file or directory",
              file=sys.stderr)
        return 2
    try:
        conf = parse_conf(list(args.conf or []))
        result = run_audit(
            args.telemetry,
            args.out,
            master=args.master,
            time_from=args.time_from,
            time_to=args.time_to,
            input_format=args.input_format,
            glob=args.glob or None,
            kafka_reader=args.kafka_reader,
            dedupe=args.dedupe,
            html_path=args.html,
            conf=conf,
        )
    except ValueError as exc:
        print(f"sluice audit: {exc}", file=sys.stderr)
        return 2
    except Exception as exc:  # Spark's own errors (bad paths on a cluster, unreadable input)
        if type(exc).__module__.startswith(("pyspark", "py4j")):
            first_line = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            print(f"sluice audit: Spark refused the job: {first_line}", file=sys.stderr)
            return 1
        raise
    print(
        f"sluice audit: {result.events:,} events "
        f"({', '.join(f'{k} {v:,}' for k, v in sorted(result.events_by_type.items()))}) "
        f"in {result.seconds:.1f} s"
    )
    for name, paths in result.reports.items():
        print(f"  {name}: {paths['parquet']}  {paths['csv']}")
    print(f"Report: {result.html}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="sluice-audit", description="Sluice telemetry -> audit, billing, compliance reports"
    )
    add_arguments(parser)
    return run_from_args(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
