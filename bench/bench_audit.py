"""Time the audit job on generated telemetry and report events per second per core.

    python -m bench.bench_audit [--events 10000000] [--workdir DIR] [--reuse]
                                [--master local[*]] [--driver-memory 4g]
                                [--kafka-events 1000000] [--runs 1]

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

``--kafka-events N`` (0 skips it) also produces N events' datasets to a topic of the bundled
Tansu broker on 127.0.0.1 as the columnar Kafka sink does (Arrow IPC messages), runs the job
on ``kafka://...`` and prints the same figures for that input.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from bench.audit_data import generate, tables
from sluice.spark_audit.job import AuditResult, run_audit
from sluice.spark_audit.session import get_session


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


def _report(label: str, result: AuditResult, cores: int, master: str,
            cpu_s: float | None = None) -> None:
    rate = result.events / result.seconds if result.seconds else 0.0
    print(json.dumps({"timings_s": {k: round(v, 2) for k, v in result.timings.items()},
                      "spark_jobs": result.spark_jobs}))
    cpu = ""
    if cpu_s:
        cpu = (f"; CPU (driver, JVM, Python workers) {cpu_s:.1f} s = "
               f"{result.events / cpu_s:,.0f} events per CPU second")
    print(
        f"audit job, {label}: {result.events:,} events ({master}, {cores} cores) in "
        f"{result.seconds:.1f} s = {rate:,.0f} events/s = {rate / cores:,.0f} events/s per core"
        f"{cpu}"
    )


def _produce_to_kafka(bootstrap: str, topic: str, n: int) -> int:
    """The datasets of ``n`` events as Arrow IPC messages, as the columnar Kafka sink sends."""
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient, NewTopic

    from sluice.proxy.telemetry.kafka_arrow import MAX_ROWS_PER_MESSAGE, encode_batch

    admin = AdminClient({"bootstrap.servers": bootstrap})
    for fut in admin.create_topics([NewTopic(topic, 2)], request_timeout=10).values():
        fut.result(timeout=15)
    producer = Producer(
        {"bootstrap.servers": bootstrap, "linger.ms": 20, "compression.type": "lz4",
         "message.max.bytes": 2_000_000, "log_level": 2}
    )
    sent = 0
    failures: list[str] = []

    def delivered(err: Any, _msg: Any) -> None:
        if err is not None:
            failures.append(str(err))

    for dataset, table in tables(n).items():
        for batch in table.to_batches(max_chunksize=MAX_ROWS_PER_MESSAGE):
            sent += 1
            headers = [("sluice-dataset", dataset.encode()), ("sluice-layout", b"1"),
                       ("sluice-message-id", f"bench-{sent}".encode())]
            while True:
                try:
                    producer.produce(topic, encode_batch(batch), f"inst-{sent % 3}".encode(),
                                     headers=headers, on_delivery=delivered)
                    break
                except BufferError:
                    producer.poll(0.1)
            producer.poll(0)
    if producer.flush(120) != 0 or failures:
        raise RuntimeError(f"producing the benchmark topic failed: {failures[:3]}")
    return sent


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
    args = parser.parse_args(argv)

    work = Path(args.workdir)
    data = work / f"telemetry-columnar-{args.events}"
    t0 = time.perf_counter()
    spark, created = get_session(args.master, {"spark.driver.memory": args.driver_memory})
    startup = time.perf_counter() - t0
    cores = int(spark.sparkContext.defaultParallelism)
    try:
        if not (args.reuse and data.exists()):
            t0 = time.perf_counter()
            generate(args.events, data)
            print(
                f"generated {args.events:,} events in {time.perf_counter() - t0:.1f} s "
                f"({_size(data) / 1e6:.0f} MB Parquet) at {data}"
            )
        print(f"session start {startup:.1f} s (not included)")
        for run in range(1, args.runs + 1):
            cpu0 = _job_cpu_seconds(spark)
            result = run_audit(str(data), str(work / "report"))
            cpu1 = _job_cpu_seconds(spark)
            # Only local mode runs the executors in this JVM.
            local = args.master.startswith("local")
            cpu_s = cpu1 - cpu0 if local and cpu0 is not None and cpu1 is not None else None
            _report(f"file input (columnar Parquet), run {run}", result, cores, args.master,
                    cpu_s)
        if args.kafka_events:
            from sluice.local_broker import TansuBroker

            with TansuBroker() as broker:
                topic = f"sluice-telemetry-bench-{int(time.time())}"
                t0 = time.perf_counter()
                messages = _produce_to_kafka(broker.bootstrap, topic, args.kafka_events)
                print(f"produced {args.kafka_events:,} events as {messages:,} Arrow IPC messages "
                      f"in {time.perf_counter() - t0:.1f} s")
                result = run_audit(f"kafka://{broker.bootstrap}/{topic}",
                                   str(work / "report-kafka"))
                _report("kafka input (Arrow IPC messages)", result, cores, args.master)
    finally:
        if created:
            spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
