"""A batch Kafka reader for Spark built on the Python Data Source API and confluent-kafka.

Spark's own Kafka source is a jar from a Maven repository; this reader needs only Python
packages, so it works offline. It yields the same columns as Spark's Kafka source (``key``,
``value``, ``topic``, ``partition``, ``offset``, ``timestamp``, ``timestampType``), so the job
reads either the same way::

    spark.dataSource.register(KafkaBatchSource)
    df = (spark.read.format("sluice_kafka")
          .option("bootstrap.servers", "host:9092").option("subscribe", "telemetry").load())

One Spark partition per Kafka partition. Each reads from the partition's start (earliest, or
``startingOffsets`` as JSON ``{"0": 42}``) to the high watermark that the broker reports in
its first Fetch response for that read: a per-partition snapshot. The high watermark from
Fetch is used rather than ListOffsets because some brokers (Tansu 0.6) answer ListOffsets
LATEST wrongly. Options named ``kafka.<key>`` go to the librdkafka consumer as ``<key>``.
Executors need ``confluent-kafka`` and ``pyarrow`` installed.

"Earliest" is asked for as offset 0, with ``auto.offset.reset=earliest`` for a log whose start
was deleted: the first Fetch then comes at once, where asking for the beginning made
librdkafka look the offset up first (0.5 s per partition from the bundled Tansu).
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator, Sequence
from datetime import UTC, datetime
from typing import Any

from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition
from pyspark.sql.types import StructType

from sluice.spark_audit.schema import KAFKA_ROWS

FORMAT_NAME = "sluice_kafka"
# Rows per Arrow batch handed to Spark: large enough to amortise the Python->JVM crossing.
ARROW_BATCH_ROWS = 10_000
# How long one ``consume`` call waits: it returns when it has its count of messages or when
# this has passed, so a longer wait holds up the last messages of a read (measured: 0.5 s
# made every read of a small partition take at least 0.5 s).
CONSUME_WAIT_S = 0.02


class KafkaPartition(InputPartition):
    def __init__(self, topic: str, partition: int, start: int) -> None:
        super().__init__((topic, partition, start))
        self.topic = topic
        self.partition = partition
        self.start = start


def _consumer_config(options: dict[str, str]) -> dict[str, Any]:
    bootstrap = options.get("bootstrap.servers") or options.get("kafka.bootstrap.servers")
    if not bootstrap:
        raise ValueError(f"{FORMAT_NAME}: option bootstrap.servers is required")
    conf: dict[str, Any] = {
        "bootstrap.servers": bootstrap,
        "group.id": f"sluice-audit-{uuid.uuid4().hex[:12]}",
        "enable.auto.commit": False,
        "enable.partition.eof": True,
        "auto.offset.reset": "earliest",
        "fetch.max.bytes": 52_428_800,
        # A batch read to a known end: a broker holding each Fetch up to librdkafka's default
        # 500 ms only adds waiting (70 MB from the bundled Tansu: 2.05 s, 1.07 s with 10 ms).
        "fetch.wait.max.ms": 10,
        "log_level": 3,
    }
    for key, value in options.items():
        if key.startswith("kafka.") and key != "kafka.bootstrap.servers":
            conf[key[len("kafka.") :]] = value
    return conf


class KafkaBatchReader(DataSourceReader):
    def __init__(self, options: dict[str, str]) -> None:
        # Spark hands options over case-insensitively (lower-cased keys); so do we.
        self.options = {key.lower(): value for key, value in options.items()}
        topic = self.options.get("subscribe") or self.options.get("topic")
        if not topic:
            raise ValueError(f"{FORMAT_NAME}: option subscribe (the topic) is required")
        self.topic = topic
        self.timeout_s = float(self.options.get("timeout.seconds", "30"))

    def partitions(self) -> Sequence[InputPartition]:
        from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaException

        consumer = Consumer(_consumer_config(self.options))
        try:
            try:
                metadata = consumer.list_topics(self.topic, timeout=self.timeout_s)
            except KafkaException as exc:  # no broker answered: the user's address, not a bug
                err = exc.args[0] if exc.args else exc
                detail = err.str() if hasattr(err, "str") else str(err)
                raise ValueError(
                    f"{FORMAT_NAME}: {self.options.get('bootstrap.servers')}: topic "
                    f"{self.topic!r}: {detail}"
                ) from exc
            topic_md = metadata.topics.get(self.topic)
            if topic_md is None or topic_md.error is not None:
                error = topic_md.error if topic_md is not None else "not found"
                raise ValueError(f"{FORMAT_NAME}: topic {self.topic!r}: {error}")
            numbers = sorted(topic_md.partitions)
        finally:
            consumer.close()
        starting = json.loads(self.options.get("startingoffsets", "{}") or "{}")
        if starting == "earliest":
            starting = {}
        if not isinstance(starting, dict):
            raise ValueError(f"{FORMAT_NAME}: startingOffsets must be a JSON object or earliest")
        return [
            KafkaPartition(self.topic, p, int(starting.get(str(p), OFFSET_BEGINNING)))
            for p in numbers
        ]

    def messages(self, partition: InputPartition) -> Iterator[Any]:
        """The partition's messages from its start to the snapshot end (see module doc)."""
        from confluent_kafka import OFFSET_BEGINNING, KafkaError, TopicPartition
        from confluent_kafka import Consumer as KafkaConsumer

        assert isinstance(partition, KafkaPartition)
        consumer = KafkaConsumer(_consumer_config(self.options))
        # OFFSET_BEGINNING as offset 0 (auto.offset.reset=earliest if the log starts later).
        start = 0 if partition.start == OFFSET_BEGINNING else partition.start
        tp = TopicPartition(partition.topic, partition.partition, start)
        consumer.assign([tp])
        end: int | None = None
        next_offset = -1
        idle_since = time.monotonic()
        try:
            while True:
                messages = consumer.consume(num_messages=ARROW_BATCH_ROWS,
                                            timeout=CONSUME_WAIT_S)
                reached_eof = False
                for msg in messages:
                    err = msg.error()
                    if err is not None:
                        if err.code() == KafkaError._PARTITION_EOF:
                            reached_eof = True
                            continue
                        raise RuntimeError(f"{FORMAT_NAME}: {partition.topic}: {err}")
                    offset = int(msg.offset() or 0)
                    if end is not None and offset >= end:
                        reached_eof = True
                        break
                    yield msg
                    next_offset = offset + 1
                if messages:
                    idle_since = time.monotonic()
                if end is None:
                    # The high watermark of the first Fetch response: this read's snapshot.
                    _low, high = consumer.get_watermark_offsets(tp, cached=True)
                    if high >= 0:
                        end = high
                if reached_eof or (end is not None and next_offset >= end):
                    break
                if time.monotonic() - idle_since > self.timeout_s:
                    raise TimeoutError(
                        f"{FORMAT_NAME}: {partition.topic}[{partition.partition}]: "
                        f"no data and no end of partition within {self.timeout_s} s"
                    )
        finally:
            consumer.close()

    def read(self, partition: InputPartition) -> Iterator[Any]:
        import pyarrow as pa

        arrow_schema = pa.schema(
            [
                ("key", pa.binary()),
                ("value", pa.binary()),
                ("topic", pa.string()),
                ("partition", pa.int32()),
                ("offset", pa.int64()),
                ("timestamp", pa.timestamp("us", tz="UTC")),
                ("timestampType", pa.int32()),
            ]
        )
        cols: dict[str, list[Any]] = {name: [] for name in arrow_schema.names}
        for msg in self.messages(partition):
            ts_type, ts_ms = msg.timestamp()
            cols["key"].append(msg.key())
            cols["value"].append(msg.value())
            cols["topic"].append(msg.topic())
            cols["partition"].append(msg.partition())
            cols["offset"].append(int(msg.offset() or 0))
            cols["timestamp"].append(
                datetime.fromtimestamp(ts_ms / 1000, tz=UTC) if ts_ms >= 0 else None
            )
            cols["timestampType"].append(ts_type)
            if len(cols["offset"]) >= ARROW_BATCH_ROWS:
                yield pa.RecordBatch.from_pydict(cols, schema=arrow_schema)
                cols = {name: [] for name in arrow_schema.names}
        if cols["offset"]:
            yield pa.RecordBatch.from_pydict(cols, schema=arrow_schema)


class KafkaBatchSource(DataSource):
    """``spark.read.format("sluice_kafka")``: a batch read of one Kafka topic."""

    @classmethod
    def name(cls) -> str:
        return FORMAT_NAME

    def schema(self) -> StructType:
        return KAFKA_ROWS

    def reader(self, schema: StructType) -> DataSourceReader:
        return KafkaBatchReader(dict(self.options))
