"""Reading the columnar Kafka sink's topic in Spark: Arrow IPC messages -> dataset rows.

``raw_batches`` reads the topic once, one task per Kafka partition: one row per message
(``raw_arrow_schema``: its dataset header, layout, and either the Arrow IPC bytes or, for a
message without a dataset header, the JSON text of the old Kafka sink), in Arrow batches. A
message delivered twice (same ``sluice-message-id``) is read once. The audit job keeps those
batches in the executors (a persisted RDD: no Spark SQL plan around them); its tasks decode the
IPC bytes of the messages they hold (``decode_messages``) and aggregate them in Arrow
(``rollups``), so the topic is fetched from Kafka once, not once per dataset, and no row of it
becomes a Spark row. ``spark.read.format("sluice_telemetry_kafka").option("dataset", "raw")``
gives the same rows as a DataFrame.

``option("dataset", NAME)`` yields the rows of one dataset directly, and
``option("dataset", "json")`` the JSON texts only (one pass each, for tools reading one
dataset).

One Spark partition per Kafka partition, each read from its start to the snapshot end, as
``kafka_source`` does.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition
from pyspark.sql.types import StructType

from sluice.proxy.telemetry.columns import LAYOUT_VERSION, SCHEMAS
from sluice.spark_audit.kafka_source import KafkaBatchReader

FORMAT_NAME = "sluice_telemetry_kafka"
RAW = "raw"
DATASET_HEADER = "sluice-dataset"
LAYOUT_HEADER = "sluice-layout"
MESSAGE_ID_HEADER = "sluice-message-id"


def _headers(msg: Any) -> dict[str, bytes]:
    return {k: v for k, v in (msg.headers() or [])}


class KafkaArrowReader(KafkaBatchReader):
    def __init__(self, options: dict[str, str]) -> None:
        super().__init__(options)
        self.dataset = self.options.get("dataset", "")
        if self.dataset not in ("json", RAW) and self.dataset not in SCHEMAS:
            raise ValueError(f"{FORMAT_NAME}: option dataset {self.dataset!r} is not a dataset")

    def read(self, partition: InputPartition) -> Iterator[Any]:
        if self.dataset == "json":
            yield from self._json_values(partition)
            return
        if self.dataset == RAW:
            yield from self.raw(partition)
            return
        wanted = self.dataset.encode()
        seen: set[bytes] = set()
        for msg in self.messages(partition):
            headers = _headers(msg)
            if headers.get(DATASET_HEADER) != wanted:
                continue
            message_id = headers.get(MESSAGE_ID_HEADER, b"")
            if message_id in seen:
                continue  # at-least-once delivery sent it twice
            seen.add(message_id)
            layout = headers.get(LAYOUT_HEADER, b"").decode("ascii", "replace")
            yield from message_rows(self.dataset, layout, msg.value())

    def raw(self, partition: InputPartition) -> Iterator[Any]:
        """The partition's messages as Arrow batches of ``raw_arrow_schema``."""
        import pyarrow as pa

        schema = raw_arrow_schema()
        cols: dict[str, list[Any]] = {name: [] for name in schema.names}
        seen: set[bytes] = set()
        for msg in self.messages(partition):
            headers = _headers(msg)
            dataset = headers.get(DATASET_HEADER)
            raw = msg.value()
            if dataset is None:
                cols["dataset"].append(None)
                cols["layout"].append(None)
                cols["value"].append(None)
                cols["text"].append(
                    raw.decode("utf-8", errors="replace") if raw is not None else ""
                )
            else:
                message_id = headers.get(MESSAGE_ID_HEADER, b"")
                if message_id in seen:
                    continue  # at-least-once delivery sent it twice
                seen.add(message_id)
                cols["dataset"].append(dataset.decode("utf-8", errors="replace"))
                cols["layout"].append(headers.get(LAYOUT_HEADER, b"").decode("ascii", "replace"))
                cols["value"].append(raw)
                cols["text"].append(None)
            if len(cols["text"]) >= 1_000:
                yield pa.RecordBatch.from_pydict(cols, schema=schema)
                cols = {name: [] for name in schema.names}
        if cols["text"]:
            yield pa.RecordBatch.from_pydict(cols, schema=schema)

    def _json_values(self, partition: InputPartition) -> Iterator[Any]:
        import pyarrow as pa

        values: list[str] = []
        for msg in self.messages(partition):
            if DATASET_HEADER in _headers(msg):
                continue
            raw = msg.value()
            values.append(raw.decode("utf-8", errors="replace") if raw is not None else "")
            if len(values) >= 10_000:
                yield pa.RecordBatch.from_pydict({"value": values})
                values = []
        if values:
            yield pa.RecordBatch.from_pydict({"value": values})


def raw_batches(options: dict[str, str], partitions: Iterable[InputPartition]
                ) -> Iterator[Any]:
    """The raw Arrow batches of ``partitions`` of the topic ``options`` name (a task's part
    of the topic, for an RDD of the listed partitions)."""
    reader = KafkaArrowReader({**options, "dataset": RAW})
    for partition in partitions:
        yield from reader.raw(partition)


def raw_arrow_schema() -> Any:
    import pyarrow as pa

    return pa.schema(
        [("dataset", pa.string()), ("layout", pa.string()), ("value", pa.binary()),
         ("text", pa.string())]
    )


def raw_spark_schema() -> StructType:
    from pyspark.sql.types import BinaryType, StringType, StructField

    return StructType(
        [StructField("dataset", StringType()), StructField("layout", StringType()),
         StructField("value", BinaryType()), StructField("text", StringType())]
    )


def message_rows(dataset: str, layout: str | None, value: bytes | None) -> Iterator[Any]:
    """The record batches of one Arrow IPC message of ``dataset``, in the dataset's schema."""
    import pyarrow as pa

    schema = SCHEMAS[dataset]
    if layout != str(LAYOUT_VERSION) or value is None:
        # Rows of a layout this job does not know: keep them countable as unknown schema
        # versions rather than guessing at their columns.
        yield _unknown_layout_rows(schema, (layout or "").encode())
        return
    with pa.ipc.open_stream(value) as reader:
        for rows in reader:
            yield rows.select(schema.names).cast(schema)


def decode_messages(batches: Iterable[Any]) -> dict[str, Any]:
    """Batches of (dataset, layout, value) message rows -> one Arrow table per dataset."""
    import pyarrow as pa

    got: dict[str, list[Any]] = {}
    for batch in batches:
        for dataset, layout, value in zip(batch.column("dataset").to_pylist(),
                                          batch.column("layout").to_pylist(),
                                          batch.column("value").to_pylist(), strict=True):
            if dataset in SCHEMAS:
                got.setdefault(dataset, []).extend(message_rows(dataset, layout, value))
    return {d: pa.Table.from_batches(rows, schema=SCHEMAS[d]) for d, rows in got.items()}


def _unknown_layout_rows(schema: Any, layout: bytes) -> Any:
    import pyarrow as pa

    version = int(layout) if layout.isdigit() else -1
    arrays = [
        pa.array([version], pa.int32()) if f.name == "schema_version" else pa.nulls(1, f.type)
        for f in schema
    ]
    return pa.RecordBatch.from_arrays(arrays, schema=schema)


class KafkaArrowSource(DataSource):
    """``spark.read.format("sluice_telemetry_kafka")``: one dataset of a columnar topic."""

    @classmethod
    def name(cls) -> str:
        return FORMAT_NAME

    def schema(self) -> StructType:
        from sluice.spark_audit.schema import spark_schema

        dataset = self.options.get("dataset", "")
        if dataset in SCHEMAS:
            return spark_schema(dataset)
        if dataset == RAW:
            return raw_spark_schema()
        return StructType.fromJson(
            {"type": "struct", "fields": [
                {"name": "value", "type": "string", "nullable": True, "metadata": {}}]}
        )

    def reader(self, schema: StructType) -> DataSourceReader:
        return KafkaArrowReader(dict(self.options))
