"""Time the audit job on generated telemetry and report events per second per core.

    python -m bench.bench_audit [--events 10000000] [--workdir DIR] [--reuse]
                                [--master local[*]] [--driver-memory 4g] [--runs 1]
                                [--kafka-events 10000000] [--kafka-rate 10000]
                                [--kafka-runs 1] [--unverified]

The telemetry (``bench.audit_data``) is written in the proxy's columnar layout (Parquet
datasets under ``date=/hour=`` folders, rollups as the sink builds them) with pyarrow, then read
by the job like real telemetry. Generation is not timed; the job is timed end to end, from
listing the files to the HTML report, in one Spark session (its start is excluded and printed
separately). Events per core = events / seconds / the session's default parallelism.
``--runs N`` runs the job N times in the same session: the first run also pays for compiling
the job's generated code and the JVM's JIT, later ones show the steady state. In local mode
each run also prints the CPU time the job used (from /proc: this process, which is the driver,
the JVM and the Python workers under it), a steadier figure than wall time on a machine shared
with other work.

The telemetry is tagged with a telemetry key (``WORKDIR/telemetry.key``, made once) as the
proxies tag it, and the job verifies every file and message with it (docs/TELEMETRY.md,
"Authenticated telemetry"); ``--unverified`` runs the job without the key (no file is read
twice, no tag checked), as before tags existed.

``--kafka-events N`` (0 skips it) also produces N events' datasets to a topic of the bundled
Tansu broker on 127.0.0.1 as the columnar Kafka sink does (Arrow IPC messages, a partition per
core), runs the job on ``kafka://...`` (``--kafka-runs`` times) and prints the same figures for
that input, and the broker's CPU time during each run (a process of its own). A live sink
sends a rollup row again at every flush in which it grew, so how many rows the topic holds
depends on the event rate: ``--kafka-rate`` events per second (default 10,000, the fleet of
issue 13), or 0 for the files' spread of 24 hours (about 116 events per second: almost every
record batch then sends its segment and finding counters again).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from bench.audit_data import SPAN_MS, generate, tables
from sluice.spark_audit.job import AuditResult, run_audit
from sluice.spark_audit.session import get_session
from sluice.telemetry_schema import integrity


def _size(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def _proc_cpu(pid: int, children: bool) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    ticks = int(fields[11]) + int(fields[12])
    if children:  # processes that ended and were waited for (finished Python workers)
        ticks += int(fields[13]) + int(fields[14])
    return ticks / os.sysconf("SC_CLK_TCK")


def _job_cpu_seconds(spark: Any) -> float | None:
    """CPU time (user + system) so far of everything a local job runs on: this process (the
    driver's Python side), the JVM and every process under it (the Python workers that run the
    tasks); None where /proc cannot say."""
    try:
        jvm = int(spark._jvm.java.lang.ProcessHandle.current().pid())
        parents: dict[int, int] = {}
        for stat in Path("/proc").glob("[0-9]*/stat"):
            try:
                parents[int(stat.parent.name)] = int(stat.read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
        tree, frontier = {jvm}, [jvm]
        while frontier:
            pid = frontier.pop()
            for child, parent in parents.items():
                if parent == pid and child not in tree:
                    tree.add(child)
                    frontier.append(child)
        total = time.process_time()
        for pid in tree:
            try:
                total += _proc_cpu(pid, children=True)
            except (OSError, ValueError, IndexError):
                continue
        return total
    except (OSError, ValueError, IndexError, AttributeError):
        return None


def _verified(result: AuditResult) -> str:
    checked = result.integrity
    if not checked.get("verified"):
        return "unverified"
    accepted = ", ".join(f"{n:,} {s}" for s, n in sorted(checked["accepted"].items()))
    return f"verified {accepted}, refused {checked['refused_total']:,}"


def _report(label: str, result: AuditResult, cores: int, master: str,
            cpu_s: float | None = None) -> None:
    rate = result.events / result.seconds if result.seconds else 0.0
    print(json.dumps({"timings_s": {k: round(v, 2) for k, v in result.timings.items()},
                      "spark_jobs": result.spark_jobs, "telemetry": _verified(result)}))
    cpu = ""
    if cpu_s:
        cpu = (f"; CPU (driver, JVM, Python workers) {cpu_s:.1f} s = "
               f"{result.events / cpu_s:,.0f} events per CPU second")
    print(
        f"audit job, {label}: {result.events:,} events ({master}, {cores} cores) in "
        f"{result.seconds:.1f} s = {rate:,.0f} events/s = {rate / cores:,.0f} events/s per core"
        f"{cpu}"
    )


# The Kafka sink's default flush interval: it sends a rollup again at every flush in which
# it grew (``bench.audit_data.tables``).
KAFKA_FLUSH_MS = 1000


def _produce_to_kafka(bootstrap: str, topic: str, n: int, partitions: int, span_ms: int,
                      tagger: integrity.Tagger) -> tuple[int, int, int]:
    """The datasets of ``n`` events as Arrow IPC messages, as the columnar Kafka sink sends
    (``encode_batch``, no producer compression), to a new topic of ``partitions`` partitions,
    spread evenly over them (as a fleet's instance keys spread over a topic's partitions; the
    job reads each partition in one task), the events spread over ``span_ms``, each message
    tagged by ``tagger`` as the sink tags them. Returns
    (messages, rows, bytes of their values)."""
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient, NewTopic

    from sluice.proxy.telemetry.kafka_arrow import MAX_ROWS_PER_MESSAGE, encode_batch

    admin = AdminClient({"bootstrap.servers": bootstrap})
    for fut in admin.create_topics([NewTopic(topic, partitions)], request_timeout=10).values():
        fut.result(timeout=15)
    producer = Producer(
        {"bootstrap.servers": bootstrap, "linger.ms": 20, "compression.type": "none",
         "message.max.bytes": 2_000_000, "log_level": 2}
    )
    sent = size = rows = 0
    failures: list[str] = []

    def delivered(err: Any, _msg: Any) -> None:
        if err is not None:
            failures.append(str(err))

    for dataset, table in tables(n, flush_ms=KAFKA_FLUSH_MS, span_ms=span_ms).items():
        rows += table.num_rows
        for batch in table.to_batches(max_chunksize=MAX_ROWS_PER_MESSAGE):
            sent += 1
            message_id = f"bench-{sent}".encode()
            value = encode_batch(batch)
            key = f"inst-{sent % 3}".encode()
            headers: list[tuple[str, str | bytes | None]] = [
                ("sluice-dataset", dataset.encode()), ("sluice-layout", b"1"),
                ("sluice-message-id", message_id),
                (integrity.TAG_HEADER, tagger.tag(
                    integrity.KAFKA_ARROW,
                    integrity.kafka_arrow_fields(key, dataset.encode(), b"1", message_id),
                    value))]
            size += len(value)
            while True:
                try:
                    producer.produce(topic, value, key,
                                     partition=sent % partitions, headers=headers,
                                     on_delivery=delivered)
                    break
                except BufferError:
                    producer.poll(0.1)
            producer.poll(0)
    if producer.flush(120) != 0 or failures:
        raise RuntimeError(f"producing the benchmark topic failed: {failures[:3]}")
    return sent, rows, size


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--events", type=int, default=10_000_000)
    parser.add_argument("--workdir", default="/tmp/sluice-bench-audit")
    parser.add_argument("--reuse", action="store_true", help="keep already generated input")
    parser.add_argument("--master", default="local[*]")
    parser.add_argument("--driver-memory", default="4g")
    parser.add_argument("--kafka-events", type=int, default=0,
                        help="also measure the kafka:// input with this many events (0: skip)")
    parser.add_argument("--runs", type=int, default=1,
                        help="run the job on the files this many times in one session")
    parser.add_argument("--kafka-runs", type=int, default=1,
                        help="run the job on the topic this many times")
    parser.add_argument("--kafka-rate", type=int, default=10_000,
                        help="the topic's events per second (the rollups a sink sends again "
                             "at each flush depend on it); 0: spread over 24 h as the files")
    parser.add_argument("--unverified", action="store_true",
                        help="run the job without the telemetry key (no tag checked)")
    args = parser.parse_args(argv)

    work = Path(args.workdir)
    work.mkdir(parents=True, exist_ok=True)
    key_file = work / "telemetry.key"
    if not key_file.exists():
        integrity.write_key(key_file, integrity.new_key())
    tagger = integrity.Tagger(integrity.load_key(key_file))
    keys = None if args.unverified else [str(key_file)]
    data = work / f"telemetry-columnar-{args.events}"
    t0 = time.perf_counter()
    spark, created = get_session(args.master, {"spark.driver.memory": args.driver_memory})
    startup = time.perf_counter() - t0
    cores = int(spark.sparkContext.defaultParallelism)
    try:
        if not (args.reuse and data.exists()):
            t0 = time.perf_counter()
            generate(args.events, data, tagger)
            print(
                f"generated {args.events:,} events in {time.perf_counter() - t0:.1f} s "
                f"({_size(data) / 1e6:.0f} MB Parquet) at {data}"
            )
        print(f"session start {startup:.1f} s (not included)")
        # Only local mode runs the executors in this JVM.
        local = args.master.startswith("local")
        for run in range(1, args.runs + 1):
            cpu0 = _job_cpu_seconds(spark)
            result = run_audit(str(data), str(work / "report"), telemetry_keys=keys)
            cpu1 = _job_cpu_seconds(spark)
            cpu_s = cpu1 - cpu0 if local and cpu0 is not None and cpu1 is not None else None
            _report(f"file input (columnar Parquet), run {run}", result, cores, args.master,
                    cpu_s)
        if args.kafka_events:
            from sluice.local_broker import TansuBroker

            with TansuBroker() as broker:
                topic = f"sluice-telemetry-bench-{int(time.time())}"
                t0 = time.perf_counter()
                span_ms = (round(args.kafka_events * 1000 / args.kafka_rate) if args.kafka_rate
                           else SPAN_MS)
                messages, rows, size = _produce_to_kafka(
                    broker.bootstrap, topic, args.kafka_events, cores, span_ms, tagger)
                print(f"produced {args.kafka_events:,} events over {span_ms / 1000:,.0f} s as "
                      f"{rows:,} rows in {messages:,} Arrow IPC messages ({size / 1e6:.0f} MB) "
                      f"to {cores} partitions in {time.perf_counter() - t0:.1f} s")
                assert broker.process is not None
                for run in range(1, args.kafka_runs + 1):
                    cpu0 = _job_cpu_seconds(spark)
                    broker0 = _proc_cpu(broker.process.pid, children=False)
                    result = run_audit(f"kafka://{broker.bootstrap}/{topic}",
                                       str(work / "report-kafka"), telemetry_keys=keys)
                    cpu1 = _job_cpu_seconds(spark)
                    broker_s = _proc_cpu(broker.process.pid, children=False) - broker0
                    cpu_s = (cpu1 - cpu0 if local and cpu0 is not None and cpu1 is not None
                             else None)
                    _report(f"kafka input (Arrow IPC messages), run {run}", result, cores,
                            args.master, cpu_s)
                    print(f"  the broker's CPU during the run: {broker_s:.1f} s")
    finally:
        if created:
            spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
