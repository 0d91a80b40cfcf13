"""A Spark Structured Streaming query over Kafka (Spark's own `kafka` source and sink), run in
a Python process of its own.

Spark's Kafka connector is not in pyspark's wheel: `scripts/dev.sh` installs it from Maven
Central (`scripts/spark/pom.xml`) into `<venv>/share/spark-kafka/jars`, checked against
`scripts/spark/jars.sha256`. `connector_jars` checks the installed files against that lock file
again and the session loads exactly those with `spark.jars`: nothing is resolved at run time
(no `spark.jars.packages`, no Ivy, no network but 127.0.0.1).

The queries run in a child process (`python -m tests.harness.spark_streaming`), one local
session for all the runs it is given: `spark.jars` is fixed when a session starts, and a test
process may already hold a session without the connector (the audit tests' one).
`run_queries` starts it and returns what it printed, one JSON object.

The query: every record of the input topic (earliest to the end, trigger `availableNow`), its
value upper-cased and prefixed with the input partition and offset, records whose value starts
with "DROP" left out, written with the same key to the output topic.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
LOCK = REPO / "scripts" / "spark" / "jars.sha256"


class ConnectorNotInstalled(RuntimeError):
    """The connector's jars are missing or differ from the lock file."""


def jars_dir() -> Path:
    """`SLUICE_SPARK_KAFKA_JARS`, else `<venv>/share/spark-kafka/jars`."""
    override = os.environ.get("SLUICE_SPARK_KAFKA_JARS")
    return Path(override) if override else Path(sys.prefix) / "share" / "spark-kafka" / "jars"


def connector_jars() -> list[Path]:
    """The installed connector's jars, each checked against the lock file, in its order."""
    folder = jars_dir()
    out: list[Path] = []
    for line_no, line in enumerate(LOCK.read_text().splitlines(), 1):
        if not line.strip():
            continue
        digest, name = line.split()
        path = folder / name
        if not path.is_file():
            raise ConnectorNotInstalled(
                f"{path} is missing ({LOCK.name} line {line_no}): run `bash scripts/dev.sh "
                "install` (it fetches Spark's Kafka connector with Maven)")
        actual = hashlib.sha256(path.read_bytes()).hexdigest()
        if actual != digest:
            raise ConnectorNotInstalled(
                f"{path}: sha256 {actual}, {LOCK.name} line {line_no} says {digest}")
        out.append(path)
    return out


@dataclass
class QueryRun:
    """One query: `input` read from `bootstrap`, the result written to `output` there too."""

    bootstrap: str
    input: str
    output: str
    checkpoint: str


def run_queries(runs: list[QueryRun], timeout: float = 300) -> dict[str, Any]:
    """Run the queries one after another in one fresh local session (a child process);
    returns its report: `session_seconds`, and per run `rows` (records read) and `seconds`."""
    jars = connector_jars()
    cmd = [sys.executable, "-m", "tests.harness.spark_streaming",
           "--jars", ",".join(str(j) for j in jars),
           "--runs", json.dumps([asdict(r) for r in runs])]
    env = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1"}
    try:
        done = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True,
                              timeout=timeout)
    except subprocess.TimeoutExpired as exc:
        raise AssertionError(f"the streaming queries took over {timeout} s; stderr:\n"
                             f"{(exc.stderr or b'')[-4000:]!r}") from exc
    if done.returncode != 0:
        raise AssertionError(f"the streaming queries failed (exit {done.returncode}):\n"
                             f"{done.stderr[-6000:]}")
    last = done.stdout.strip().splitlines()[-1]
    report = json.loads(last)
    assert isinstance(report, dict)
    return report


# --- the child process -------------------------------------------------------------------


def _session(jars: str) -> Any:
    from pyspark.sql import SparkSession

    from sluice.spark_audit.session import local_defaults

    builder = SparkSession.builder.master("local[2]").appName("sluice-streaming-test")
    # The audit's local settings: loopback only, no UI, the client compiler only and the
    # driver's class archive (spark_audit/class_archive.py), which halves the start.
    for key, value in {**local_defaults(), "spark.driver.memory": "1g",
                       "spark.sql.shuffle.partitions": "2",
                       "spark.jars": jars}.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def _run(spark: Any, run: QueryRun) -> dict[str, Any]:
    from pyspark.sql import functions as F

    started = time.perf_counter()
    source = (spark.readStream.format("kafka")
              .option("kafka.bootstrap.servers", run.bootstrap)
              .option("subscribe", run.input)
              .option("startingOffsets", "earliest")
              .option("failOnDataLoss", "true")
              .load())
    value = F.upper(F.col("value").cast("string"))
    result = (source
              .where(~value.startswith("DROP"))
              .select(F.col("key"),
                      F.concat_ws("|", F.col("partition").cast("string"),
                                  F.col("offset").cast("string"), value).alias("value")))
    query = (result.writeStream.format("kafka")
             .option("kafka.bootstrap.servers", run.bootstrap)
             .option("topic", run.output)
             .option("checkpointLocation", run.checkpoint)
             .trigger(availableNow=True)
             .start())
    query.awaitTermination()
    if query.exception() is not None:
        raise RuntimeError(str(query.exception()))
    rows = sum(int(p["numInputRows"]) for p in query.recentProgress)
    return {"rows": rows, "seconds": round(time.perf_counter() - started, 2)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--jars", required=True)
    parser.add_argument("--runs", required=True, help="a JSON list of QueryRun fields")
    args = parser.parse_args(argv)
    runs = [QueryRun(**r) for r in json.loads(args.runs)]
    started = time.perf_counter()
    spark = _session(args.jars)
    report: dict[str, Any] = {"session_seconds": round(time.perf_counter() - started, 2)}
    try:
        report["runs"] = [_run(spark, run) for run in runs]
    finally:
        spark.stop()
    print(json.dumps(report), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
