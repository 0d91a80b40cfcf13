"""Reading telemetry into Spark: JSON Lines (any Spark path), Parquet, or a Kafka topic.

``kafka://HOST:PORT[,HOST:PORT...]/TOPIC`` is read with the Python Kafka reader
(``kafka_source``) by default, or with Spark's own Kafka connector (``kafka_reader="spark"``)
where its jar is on the classpath. Everything else is a path Spark reads (local directory or
file, ``s3a://``, ``hdfs://``...). A directory is read for ``*.jsonl`` files only, which skips the
``.jsonl.tmp`` file a running proxy is still writing.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, datetime

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from sluice.spark_audit.schema import SCHEMA_VERSION, TELEMETRY_V1

DEFAULT_GLOB = "*.jsonl"
_KAFKA_URL = re.compile(r"^kafka://(?P<bootstrap>[^/]+)/(?P<topic>[^/?#]+)/?$")


@dataclass(frozen=True)
class KafkaUrl:
    bootstrap: str
    topic: str


def parse_kafka_url(source: str) -> KafkaUrl | None:
    """``kafka://h:p[,h2:p2]/topic`` -> KafkaUrl; other strings -> None."""
    if not source.startswith("kafka://"):
        return None
    match = _KAFKA_URL.match(source)
    if match is None:
        raise ValueError(f"telemetry source {source!r}: expected kafka://HOST:PORT/TOPIC")
    return KafkaUrl(match["bootstrap"], match["topic"])


def parse_time(value: str | None) -> int | None:
    """``--from``/``--to``: epoch milliseconds, a date, or ISO-8601 (no zone = UTC) -> epoch ms."""
    if value is None or value == "":
        return None
    text = value.strip()
    if re.fullmatch(r"-?\d{10,}", text):
        return int(text)
    if text.endswith("Z"):
        text = text[:-1] + "+00:00"
    try:
        dt = datetime.fromisoformat(text)
    except ValueError as exc:
        raise ValueError(
            f"time {value!r}: expected ISO-8601 (2026-11-18T10:00:00Z), a date or epoch ms"
        ) from exc
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=UTC)
    return int(dt.timestamp() * 1000)


def read_raw(
    spark: SparkSession,
    source: str,
    *,
    input_format: str = "json",
    glob: str | None = DEFAULT_GLOB,
    kafka_reader: str = "python",
) -> DataFrame:
    """Events with exactly the ``TELEMETRY_V1`` columns, not yet filtered."""
    kafka = parse_kafka_url(source)
    if kafka is not None:
        return _read_kafka(spark, kafka, kafka_reader)
    if input_format == "parquet":
        df = spark.read.parquet(source)
        return df.select(
            *[
                (F.col(f.name) if f.name in df.columns else F.lit(None))
                .cast(f.dataType)
                .alias(f.name)
                for f in TELEMETRY_V1.fields
            ]
        )
    if input_format != "json":
        raise ValueError(f"input format {input_format!r}: expected json or parquet")
    reader = spark.read.schema(TELEMETRY_V1).option("mode", "DROPMALFORMED")
    if glob and not re.search(r"\.(jsonl?|gz|bz2|zst)$", source):
        reader = reader.option("pathGlobFilter", glob)
    return reader.json(source)


def _read_kafka(spark: SparkSession, kafka: KafkaUrl, kafka_reader: str) -> DataFrame:
    if kafka_reader == "spark":
        # Spark's connector: needs org.apache.spark:spark-sql-kafka-0-10 on the classpath
        # (spark-submit --packages ... or --jars ...).
        raw = (
            spark.read.format("kafka")
            .option("kafka.bootstrap.servers", kafka.bootstrap)
            .option("subscribe", kafka.topic)
            .option("startingOffsets", "earliest")
            .option("endingOffsets", "latest")
            .load()
        )
    elif kafka_reader == "python":
        from sluice.spark_audit.kafka_source import FORMAT_NAME, KafkaBatchSource

        spark.dataSource.register(KafkaBatchSource)
        raw = (
            spark.read.format(FORMAT_NAME)
            .option("bootstrap.servers", kafka.bootstrap)
            .option("subscribe", kafka.topic)
            .load()
        )
    else:
        raise ValueError(f"kafka reader {kafka_reader!r}: expected python or spark")
    parsed = raw.select(
        F.from_json(F.col("value").cast("string"), TELEMETRY_V1, {"mode": "PERMISSIVE"}).alias("e")
    )
    return parsed.select("e.*").filter(F.col("type").isNotNull())


def prepare(
    raw: DataFrame,
    *,
    time_from_ms: int | None = None,
    time_to_ms: int | None = None,
    dedupe: bool = False,
) -> DataFrame:
    """Filter to schema version 1 and the time range; add ``ts`` and ``hour`` columns.

    ``dedupe`` drops repeated ``event_id`` values (an at-least-once Kafka sink may deliver an
    event twice); files written by the file sink have no duplicates.
    """
    df = raw.filter(F.col("schema_version") == SCHEMA_VERSION)
    if time_from_ms is not None:
        df = df.filter(F.col("time_ms") >= F.lit(time_from_ms))
    if time_to_ms is not None:
        df = df.filter(F.col("time_ms") < F.lit(time_to_ms))
    if dedupe:
        df = df.dropDuplicates(["event_id"])
    # Only the columns the reports use: the JSON reader then skips the rest while parsing,
    # and the cached events take less memory.
    df = df.select(*USED_COLUMNS)
    ts = F.timestamp_millis(F.col("time_ms"))
    return df.withColumn("ts", ts).withColumn("hour", F.date_trunc("hour", ts))


USED_COLUMNS = (
    "type",
    "time_ms",
    "proxy",
    "connection_id",
    "client_id",
    "principal",
    "api",
    "topic",
    "partition",
    "offset_first",
    "offset_last",
    "records_in",
    "records_out",
    "bytes_in",
    "bytes_out",
    "filters",
    "error_code",
    "error_message",
    "reject_reasons",
    "op",
    "resource_type",
    "resource",
    "decision",
    "message",
    "filter",
    "phase",
    "apis",
    "duration_ms",
    "topics",
    "apply_to",
    "dropped",
    "reason",
)
