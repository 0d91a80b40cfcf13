"""The audit job: telemetry in, Parquet + CSV reports and an HTML summary out.

Run it as ``sluice audit ...``, ``python -m sluice.spark_audit ...``, or give this file to
spark-submit (``spark-submit --master spark://... $(python -c 'import
sluice.spark_audit.job as j; print(j.__file__)') --telemetry ... --out ...``).

Output layout under OUT (a local folder or any Hadoop filesystem URL: ``file://``, ``s3a://``,
``hdfs://``...)::

    report.html           self-contained summary (inline SVG)
    summary.json          event counts, skipped rows, totals, paths, timings
    <report>.parquet      one Parquet file per report
    <report>.csv          one CSV file per report (arrays joined with ';', times UTC)

How it runs (no caching): one aggregation per dataset, run as Arrow code in Spark's tasks and
merged in the driver (``rollups``, ``partials``), which also counts the dataset's events and
the rows that cannot be used; the driver builds every report from those small results
(``reports``; the offset runs and record batches stay Arrow tables, ``TABLES``) and writes them
(``report_io``). Parquet files take two Spark jobs, submitted in turn: every dataset but the
connections, then the connections (``LATER``), so that the driver builds and writes the other
reports while the connections' tasks run (``rollups.collect_in_turn``).
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from sluice.spark_audit import html_report, load, partials, report_io, reports, rollups, sources
from sluice.spark_audit.options import add_arguments, parse_conf
from sluice.spark_audit.session import get_session
from sluice.spark_audit.svg import Edge
from sluice.telemetry_schema.columns import EVENT_TABLES, HOUR_MS
from sluice.telemetry_schema.integrity import TelemetryKeyError, Verifier, load_key

TOP_CLIENTS_IN_CHART = 8
# The rollups of the second Spark job (``rollups.collect_in_turn``): the connections, whose
# tasks cost the most per row and feed one report only; the reports of the rest are built
# while their tasks run.
LATER = ("conns",)
# The rollups the driver keeps as Arrow tables (``rollups.collect``): those of many rows.
TABLES = ("runs", "batches")
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
    skipped: dict[str, dict[str, int]] = field(default_factory=dict)
    first_event: str | None = None
    last_event: str | None = None
    input_files: dict[str, int] = field(default_factory=dict)
    duplicate_files: int = 0
    spark_jobs: int = 0
    # What was verified and refused (``integrity_summary``).
    integrity: dict[str, Any] = field(default_factory=dict)


UNVERIFIED_NOTE = ("no --telemetry-key given: no tag was checked, so forged telemetry "
                   "would be reported like the proxies' own")


def verifier_of(key_files: Sequence[str] | None) -> Verifier | None:
    """The trusted keys of ``--telemetry-key`` files (ValueError naming a bad file)."""
    if not key_files:
        return None
    try:
        return Verifier([load_key(path) for path in key_files])
    except TelemetryKeyError as exc:
        raise ValueError(f"--telemetry-key {exc}") from None


def integrity_summary(verifier: Verifier | None, units: Sequence[dict[str, Any]],
                      missing: dict[str, int]) -> dict[str, Any]:
    """The summary's ``integrity``: the keys trusted, the units (files, messages) that
    verified, those refused per reason and dataset (left out of every report), and the
    Kafka messages missing per sink instance."""
    if verifier is None:
        return {"verified": False, "keys": [], "note": UNVERIFIED_NOTE}
    accepted: dict[str, int] = {}
    refused: dict[str, dict[str, int]] = {}
    for r in units:
        if r["outcome"] == rollups.VERIFIED:
            accepted[r["source"]] = accepted.get(r["source"], 0) + r["units"]
        else:
            per = refused.setdefault(r["outcome"], {})
            per[r["dataset"]] = per.get(r["dataset"], 0) + r["units"]
    return {
        "verified": True,
        "keys": verifier.key_ids,
        "accepted": accepted,
        "refused": {k: dict(sorted(v.items())) for k, v in sorted(refused.items())},
        "refused_total": sum(n for per in refused.values() for n in per.values()),
        "missing_messages": dict(sorted(missing.items())),
    }


def _bucket(span_ms: int) -> tuple[int, str]:
    if span_ms <= partials.SHORT_SPAN_MS:
        return partials.MINUTE_MS, "minute"
    if span_ms <= 2 * 86400_000:
        return 3600_000, "hour"
    return 86400_000, "day"


def _client_label(principal: str | None, client_id: str | None) -> str:
    label = "/".join(p for p in (principal, client_id) if p is not None)
    return label or "(anonymous)"


def _row_bytes(row: dict[str, Any]) -> int:
    return int(row["bytes"])


def _batch_sums(batches: pa.Table, keys: dict[str, Any]) -> list[dict[str, Any]]:
    """The record batch rollup's rows (a table) summed per ``keys`` (name -> column):
    ``records`` (out of the proxy) and ``bytes`` on the client's side of the proxy (produce:
    in, fetch: out). Grouped in Arrow: the rollup holds a row per client, topic, proxy and
    hour (12,750 on the bench), the chart and the topology far fewer."""
    if batches.num_rows == 0:
        return []
    produce = pc.fill_null(pc.equal(batches["api"], "produce"), False)
    table = pa.table({**keys, "records": batches["records_out"],
                      "bytes": pc.if_else(produce, batches["bytes_in"], batches["bytes_out"])})
    return partials.group(table, list(keys), [partials.Agg("records", "sum", "records"),
                                              partials.Agg("bytes", "sum", "bytes")]).to_pylist()


def _batch_traffic(batches: pa.Table, bucket_ms: int) -> list[dict[str, Any]]:
    """Chart rows (principal, client id, bucket, bytes) from the record batch rollup."""
    if batches.num_rows == 0:
        return []
    return _batch_sums(batches, {"principal": batches["principal"],
                                 "client_id": batches["client_id"],
                                 "bucket": partials.floor_to(batches["bucket"], bucket_ms)})


def _traffic(rows: list[dict[str, Any]], bucket_ms: int,
             bytes_of: Callable[[dict[str, Any]], int]) -> dict[str, list[tuple[int, float]]]:
    """Chart series from rows of (principal, client_id, bucket, and bytes: ``bytes_of``)."""
    per: dict[tuple[str, int], int] = {}
    for r in rows:
        key = (_client_label(r["principal"], r["client_id"]), r["bucket"] // bucket_ms * bucket_ms)
        per[key] = per.get(key, 0) + bytes_of(r)
    totals: dict[str, int] = {}
    for (client, _b), n in per.items():
        totals[client] = totals.get(client, 0) + n
    top = sorted(totals, key=lambda c: (-totals[c], c))[:TOP_CLIENTS_IN_CHART]
    series: dict[str, dict[int, float]] = {c: {} for c in top}
    for (client, bucket), n in per.items():
        points = series.setdefault(client if client in series else "other clients", {})
        points[bucket] = points.get(bucket, 0.0) + float(n)
    return {name: sorted(points.items()) for name, points in series.items()}


def _edges(batches: pa.Table) -> list[Edge]:
    keys = ("principal", "client_id", "host", "instance_id", "topic", "api")
    rows: dict[tuple[str, str, str, str], list[int]] = {}
    for r in _batch_sums(batches, {k: batches[k] for k in keys} if batches.num_rows else {}):
        proxy = " ".join(p for p in (r["host"], r["instance_id"]) if p is not None)
        acc = rows.setdefault(
            (_client_label(r["principal"], r["client_id"]), proxy, r["topic"], r["api"]), [0, 0]
        )
        acc[0] += r["records"]
        acc[1] += r["bytes"]
    weight: dict[str, dict[str, int]] = {"client": {}, "proxy": {}, "topic": {}}
    for (client, proxy, topic, _api), (records, _bytes) in rows.items():
        for kind, name in (("client", client), ("proxy", proxy), ("topic", topic)):
            weight[kind][name] = weight[kind].get(name, 0) + records
    keep = {
        kind: set(sorted(w, key=lambda k, w=w: (-w[k], k))[: TOPOLOGY_LIMITS[kind]])  # type: ignore[misc]
        for kind, w in weight.items()
    }
    merged: dict[tuple[str, str, str, str], list[int]] = {}
    for (client, proxy, topic, api), (records, nbytes) in rows.items():
        acc = merged.setdefault(
            (
                client if client in keep["client"] else "other clients",
                proxy if proxy in keep["proxy"] else "other proxies",
                topic if topic in keep["topic"] else "other topics",
                api,
            ),
            [0, 0],
        )
        acc[0] += records
        acc[1] += nbytes
    return [
        Edge(client=c, proxy=p, topic=t, api=a, records=v[0], bytes=v[1])
        for (c, p, t, a), v in sorted(merged.items())
    ]


def _top(rows: list[dict[str, Any]], key: Any, limit: int) -> list[dict[str, Any]]:
    return sorted(rows, key=key)[:limit]


def _summarise(tables: dict[str, pa.Table]) -> dict[str, Any]:
    """Totals, top topics, detections, clients: small sums over the report tables."""
    billing = tables["billing"].to_pylist()
    compliance = tables["compliance"].to_pylist()
    totals = {
        "produce_records": sum(r["produce_records_out"] for r in billing),
        "fetch_records": sum(r["fetch_records_out"] for r in billing),
        "produce_bytes": sum(r["produce_bytes_in"] for r in billing),
        "fetch_bytes": sum(r["fetch_bytes_out"] for r in billing),
        "filter_time_ns": sum(r["filter_time_ns"] for r in billing),
    }
    kinds: dict[str, int] = {}
    for r in compliance:
        kinds[r["kind"]] = kinds.get(r["kind"], 0) + r["count"]
    totals["detections"] = kinds.get("detection", 0)
    totals["rejected"] = kinds.get("rejected", 0)
    totals["filter_errors"] = kinds.get("filter_error", 0)
    totals["telemetry_dropped"] = kinds.get("telemetry_dropped", 0)
    transforms = tables["transforms"].to_pylist()
    encryption = tables["encryption"].to_pylist()
    totals["transform_records"] = sum(r["output_records"] for r in transforms)
    totals["encrypted_records"] = sum(r["records"] or 0 for r in encryption
                                      if r["section"] == "encrypted")
    per_topic: dict[str, list[int]] = {}
    per_client: dict[tuple[Any, Any], dict[str, Any]] = {}
    money = ("produce_records_out", "produce_bytes_in", "fetch_records_out", "fetch_bytes_out",
             "filter_time_ns")
    for r in billing:
        acc = per_topic.setdefault(r["topic"], [0, 0])
        acc[0] += r["produce_records_out"]
        acc[1] += r["fetch_records_out"]
        c = per_client.setdefault(
            (r["principal"], r["client_id"]),
            {"principal": r["principal"], "client_id": r["client_id"], **dict.fromkeys(money, 0)},
        )
        for col in money:
            c[col] += r[col]
    top_topics = [
        (t, p, f)
        for t, (p, f) in sorted(per_topic.items(), key=lambda i: (-(i[1][0] + i[1][1]), i[0] or ""))
    ][:15]
    per_detection: dict[tuple[str, str], int] = {}
    for r in compliance:
        if r["kind"] == "detection":
            key = (r["name"] or "", r["topic"] or "")
            per_detection[key] = per_detection.get(key, 0) + r["count"]
    detections = [
        (f"{name} @ {topic}", n)
        for (name, topic), n in sorted(per_detection.items(), key=lambda i: (-i[1], i[0]))
    ][:15]
    clients = sorted(
        per_client.values(),
        key=lambda c: (-(c["produce_bytes_in"] + c["fetch_bytes_out"]), str(c["principal"]),
                       str(c["client_id"])),
    )[:50]
    modules = _top(
        tables["audit_modules"].to_pylist(), lambda r: (-r["batches"], r["module_sha256"] or ""),
        50,
    )
    compliance_top = _top(
        compliance, lambda r: (-r["count"], r["kind"] or "", r["topic"] or ""), 50
    )
    return {
        "totals": totals,
        "top_topics": top_topics,
        "detections": detections,
        "clients": clients,
        "modules": modules,
        "compliance": compliance_top,
        "transforms": transforms[:50],
        "encryption": encryption[:50],
    }


def _import_while_tasks_run() -> threading.Thread:
    """Import, on another thread, what the driver's merge of the tasks' results first needs:
    Arrow's group-by (``pyarrow.acero``, which imports ``pyarrow.dataset`` and pandas: 0.44 s
    in a new process). The driver's own thread only waits on a socket while Spark's tasks run;
    without this, the first run of a process imported them after the tasks, on the job's
    critical path. Python's import locks make a module imported on both threads at once
    load once."""

    def load() -> None:
        import pyarrow.acero  # noqa: F401

    thread = threading.Thread(target=load, name="sluice-audit-imports", daemon=True)
    thread.start()
    return thread


def _spark_job_count(spark: Any) -> int:
    tracker = spark.sparkContext.statusTracker()
    return len(tracker.getJobIdsForGroup(None))


def run_audit(
    telemetry: str,
    out: str,
    *,
    master: str | None = None,
    time_from: str | None = None,
    time_to: str | None = None,
    input_format: str = "auto",
    glob: str | None = sources.DEFAULT_GLOB,
    kafka_reader: str = "python",
    dedupe: bool | None = None,
    html_path: str | None = None,
    conf: dict[str, str] | None = None,
    telemetry_keys: Sequence[str] | None = None,
    kafka_security: Mapping[str, str] | None = None,
) -> AuditResult:
    """``telemetry_keys``: key files whose tags the job trusts; only files and messages that
    verify reach the reports. Without any, nothing is verified (``UNVERIFIED_NOTE``)."""
    started = time.perf_counter()
    timings: dict[str, float] = {}
    from_ms = load.parse_time(time_from)
    to_ms = load.parse_time(time_to)
    verifier = verifier_of(telemetry_keys)
    if input_format not in ("auto", "columnar", "json"):
        raise ValueError(f"input format {input_format!r}: expected auto, columnar or json")
    html_target = html_path or report_io.join(out, "report.html")
    spark, created = get_session(master, conf)
    jobs_before = _spark_job_count(spark)
    try:
        report_io.prepare_dir(spark, out)
        t0 = time.perf_counter()
        inputs = sources.read_inputs(
            spark,
            telemetry,
            time_from_ms=from_ms,
            time_to_ms=to_ms,
            glob=glob,
            dedupe=bool(dedupe),
            kafka_reader=kafka_reader,
            input_format=input_format,
            verifier=verifier,
            kafka_security=kafka_security,
        )
        wanted = partials.standard(HOUR_MS)  # hourly: billing needs hours
        importing = _import_while_tasks_run()
        first, later = rollups.collect_in_turn(spark, inputs, wanted, LATER, minutes=True,
                                               tables=TABLES)
        importing.join()
        got, counts = rollups.split_counts(first)
        checked = [inputs.integrity, got[rollups.INTEGRITY]["units"]]
        missing = dict(got[rollups.INTEGRITY]["missing_messages"])
        timings["aggregate"] = time.perf_counter() - t0

        t0 = time.perf_counter()
        batches, runs, found = got["batches"], got["runs"], got["found"]
        admin_rows, loads, drop_rows = got["admin"], got["loads"], got["drops"]
        built = {
            "audit": reports.audit(runs),
            "audit_modules": reports.audit_modules(runs, loads, admin_rows),
            "billing": reports.billing(batches),
            "compliance": reports.compliance(found, admin_rows, drop_rows),
            "admin": reports.admin(admin_rows),
            "transforms": reports.transforms(got["transforms"]),
            "encryption": reports.encryption(got["encryption"], batches),
        }
        paths = {
            name: {"parquet": report_io.join(out, f"{name}.parquet"),
                   "csv": report_io.join(out, f"{name}.csv")}
            for name in reports.REPORT_NAMES
        }

        def write(name: str) -> None:
            report_io.write_bytes(spark, paths[name]["parquet"],
                                  report_io.parquet_bytes(built[name]))
            report_io.write_bytes(spark, paths[name]["csv"], report_io.csv_bytes(built[name]))

        for name in built:
            write(name)
        # The summary's parts that do not depend on the connections, while they are counted.
        summary = _summarise(built)
        edges = _edges(batches)
        waiting = time.perf_counter()
        got_later, counts_later = rollups.split_counts(later.rows())
        timings["waited_for_connections"] = time.perf_counter() - waiting
        counts = rollups.merge_counts(counts, counts_later)
        if rollups.INTEGRITY in got_later:
            checked.append(got_later.pop(rollups.INTEGRITY)["units"])
        integrity = integrity_summary(
            verifier, rollups.integrity_rows([pa.Table.from_pylist(
                rows, schema=rollups.integrity_table({}).schema) for rows in checked]), missing)
        got.update(got_later)
        built["billing_connections"] = reports.billing_connections(got["conns"])
        write("billing_connections")
        written = {name: paths[name] for name in reports.REPORT_NAMES}
        timings["reports"] = time.perf_counter() - t0

        by_type = {t: c.events for t, c in counts.items() if t in EVENT_TABLES and c.events}
        skipped = {
            "malformed": {t: c.malformed for t, c in counts.items() if c.malformed},
            "unknown_schema_version": {
                t: c.unknown_version for t, c in counts.items() if c.unknown_version
            },
        }
        event_stats = [c for t, c in counts.items() if t in EVENT_TABLES and c.events]
        first_ms = min((c.first_ms for c in event_stats if c.first_ms is not None), default=None)
        last_ms = max((c.last_ms for c in event_stats if c.last_ms is not None), default=None)
        instances = sorted({i for c in event_stats for i in c.instances})
        bucket_ms, bucket_label = _bucket((last_ms or 0) - (first_ms or 0))
        if bucket_ms < HOUR_MS and rollups.MINUTES in got:
            chart = got[rollups.MINUTES]  # rolled up by the tasks as they went
        elif bucket_ms < HOUR_MS:  # inputs Spark read itself: a second pass
            t1 = time.perf_counter()
            chart = rollups.collect(spark, inputs, {"traffic": partials.traffic(bucket_ms)},
                                    count_skipped=False)["traffic"]
            timings["traffic_minutes"] = time.perf_counter() - t1
        else:
            chart = _batch_traffic(batches, bucket_ms)

        t0 = time.perf_counter()
        data = html_report.ReportData(
            source=telemetry,
            generated_at=sources.utc_iso(int(datetime.now(tz=UTC).timestamp() * 1000)) or "",
            time_from=time_from,
            time_to=time_to,
            first_event=sources.utc_iso(first_ms),
            last_event=sources.utc_iso(last_ms),
            events_by_type=by_type,
            totals=summary["totals"],
            instances=instances,
            bucket_label=bucket_label,
            traffic=_traffic(chart, bucket_ms, _row_bytes),
            top_topics=summary["top_topics"],
            detections=summary["detections"],
            edges=edges,
            modules=summary["modules"],
            clients=summary["clients"],
            compliance=summary["compliance"],
            transforms=summary["transforms"],
            encryption=summary["encryption"],
            files=[
                (name, _relative(p["parquet"], out), _relative(p["csv"], out))
                for name, p in written.items()
            ],
            skipped=skipped,
            integrity=integrity,
        )
        report_io.write_bytes(spark, html_target, html_report.render(data).encode("utf-8"))
        timings["html"] = time.perf_counter() - t0
        result = AuditResult(
            out=out,
            html=html_target,
            reports=written,
            events=sum(by_type.values()),
            events_by_type=by_type,
            totals=summary["totals"],
            instances=instances,
            seconds=time.perf_counter() - started,
            timings=timings,
            skipped=skipped,
            first_event=data.first_event,
            last_event=data.last_event,
            input_files=inputs.files,
            duplicate_files=inputs.duplicate_files,
            spark_jobs=_spark_job_count(spark) - jobs_before,
            integrity=integrity,
        )
        report_io.write_bytes(
            spark,
            report_io.join(out, "summary.json"),
            json.dumps(asdict(result), indent=2, sort_keys=True).encode("utf-8"),
        )
        return result
    finally:
        if created:
            spark.stop()


def _relative(path: str, out: str) -> str:
    prefix = out.rstrip("/") + "/"
    return path[len(prefix) :] if path.startswith(prefix) else path


#: Reads ``--config``'s upstream_tls:/upstream_sasl: into librdkafka settings (ValueError
#: naming the file, line and field of a mistake). The proxy's config loader lives in the proxy,
#: which this room knows nothing of: `sluice audit` (sluice/cli_audit.py) passes it in.
SecurityReader = Callable[[str], dict[str, str]]


def run_from_args(args: argparse.Namespace, read_security: SecurityReader | None = None) -> int:
    """Entry point shared by ``sluice audit`` and ``python -m sluice.spark_audit``."""
    telemetry_path = str(args.telemetry)
    if (
        load.parse_kafka_url(telemetry_path) is None
        and sources.is_local(telemetry_path)
        and not sources.local_path(telemetry_path).exists()
    ):
        # Checked before Spark starts: a typo should not cost a JVM start and a stack trace.
        print(f"sluice audit: --telemetry {telemetry_path}: no such file or directory",
              file=sys.stderr)
        return 2
    try:
        conf = parse_conf(list(args.conf or []))
        config_path = getattr(args, "config", None)
        kafka_security = None
        if config_path is not None:
            if read_security is None:
                raise ValueError("--config is read by `sluice audit` (the proxy's config loader)")
            kafka_security = read_security(str(config_path))
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
            telemetry_keys=list(args.telemetry_key or []),
            kafka_security=kafka_security,
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
    for kind, per_type in sorted(result.skipped.items()):
        for type_, n in sorted(per_type.items()):
            print(f"  skipped: {n:,} {kind.replace('_', ' ')} ({type_})")
    integrity = result.integrity
    if not integrity.get("verified"):
        print(f"  UNVERIFIED: {UNVERIFIED_NOTE}")
    else:
        accepted = ", ".join(f"{n:,} {source}" for source, n in
                             sorted(integrity["accepted"].items())) or "nothing"
        print(f"  verified with key(s) {', '.join(integrity['keys'])}: {accepted}")
        for reason, per in integrity["refused"].items():
            for dataset, n in per.items():
                print(f"  REFUSED (not in any report): {n:,} {reason.replace('_', ' ')} "
                      f"({dataset})")
        for instance, n in integrity["missing_messages"].items():
            print(f"  MISSING: {n:,} telemetry messages of instance {instance} never read")
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
