"""Reading the columnar Kafka sink's topic: Arrow IPC messages -> dataset rows.

``KafkaArrowReader.arrow_messages`` reads one Kafka partition from its start to the snapshot
end (as ``kafka_source`` does) and yields each message once: a message delivered twice (same
``sluice-message-id``) is read once. With a ``verifier`` (the audit's trusted telemetry keys)
it yields only the messages whose ``sluice-tag`` verifies, and counts the others by dataset
and reason (``rejected``); only a verified message can make another one a duplicate, so a
forged message sent ahead of time under a real message's id displaces nothing.
The audit job's Kafka tasks (``rollups.run_kafka_task``, one per Kafka partition) decode
each message as it arrives with ``message_table``: only the columns the job reads, repeated
strings kept dictionary-encoded, and aggregate the tables in Arrow, so no telemetry row
becomes a Spark row and the topic is fetched once.
``json_texts`` yields the messages of the old JSON sink (no ``sluice-dataset`` header), for
the job's JSON path.

The same reader is a Python data source, ``spark.read.format("sluice_telemetry_kafka")``, for
other tools: ``option("dataset", NAME)`` yields the rows of one dataset in its schema,
``option("dataset", "json")`` the JSON texts, ``option("dataset", "raw")`` one row per message
(its dataset header, layout, and the Arrow IPC bytes or the JSON text).
"""

from __future__ import annotations

from collections.abc import Collection, Iterator, Sequence
from typing import Any

from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition
from pyspark.sql.types import StructType

from sluice.spark_audit.kafka_source import KafkaBatchReader
from sluice.telemetry_schema.columns import LAYOUT_VERSION, SCHEMAS
from sluice.telemetry_schema.integrity import (
    KAFKA_ARROW,
    KAFKA_JSON,
    TAG_HEADER,
    Verifier,
    kafka_arrow_fields,
)

FORMAT_NAME = "sluice_telemetry_kafka"
RAW = "raw"
DATASET_HEADER = "sluice-dataset"
LAYOUT_HEADER = "sluice-layout"
MESSAGE_ID_HEADER = "sluice-message-id"
# ``rejected``'s dataset for JSON messages of the old sink.
JSON_DATASET = "(json)"
# ``rejected``'s reason for a verified message the job was told to skip (``skip``): a copy of
# a message that another partition holds too.
REPLAYED = "replayed"


def _headers(msg: Any) -> dict[str, bytes]:
    return {k: v for k, v in (msg.headers() or [])}


class KafkaArrowReader(KafkaBatchReader):
    def __init__(self, options: dict[str, str], verifier: Verifier | None = None,
                 skip: frozenset[bytes] = frozenset()) -> None:
        """``verifier``: yield only messages whose tag it accepts; ``skip``: message ids of
        verified messages not to yield (copies the job reads in another partition)."""
        super().__init__(options)
        self.dataset = self.options.get("dataset", "")
        if self.dataset not in ("json", RAW) and self.dataset not in SCHEMAS:
            raise ValueError(f"{FORMAT_NAME}: option dataset {self.dataset!r} is not a dataset")
        self.verifier = verifier
        self.skip = skip
        # (dataset, reason) -> messages refused; (dataset, "verified") -> messages accepted.
        self.rejected: dict[tuple[str, str], int] = {}
        self.verified: dict[str, int] = {}
        # The message ids of the Arrow messages yielded (with a verifier), in order.
        self.message_ids: list[bytes] = []

    def _refuse(self, dataset: str, reason: str) -> None:
        self.rejected[(dataset, reason)] = self.rejected.get((dataset, reason), 0) + 1

    def read(self, partition: InputPartition) -> Iterator[Any]:
        if self.dataset == "json":
            yield from self.json_texts(partition)
            return
        if self.dataset == RAW:
            yield from self.raw(partition)
            return
        for dataset, layout, value in self.arrow_messages(partition):
            if dataset == self.dataset:
                yield from message_rows(self.dataset, layout, value)

    def arrow_messages(self, partition: InputPartition
                       ) -> Iterator[tuple[str | None, str | None, bytes | None]]:
        """(dataset, layout, value) of every message of the partition, a message delivered
        twice once; dataset and layout are None for a JSON message of the old sink (which has
        no message id: the job drops a redelivered event by its event id)."""
        seen: set[bytes] = set()
        verifier = self.verifier
        for msg in self.messages(partition):
            headers = _headers(msg)
            dataset = headers.get(DATASET_HEADER)
            value = msg.value()
            if dataset is None:
                if verifier is not None:
                    reason = verifier.check(headers.get(TAG_HEADER), KAFKA_JSON,
                                            [msg.key() or b""], value or b"")
                    if reason is not None:
                        self._refuse(JSON_DATASET, reason)
                        continue
                    self.verified[JSON_DATASET] = self.verified.get(JSON_DATASET, 0) + 1
                yield None, None, value
                continue
            message_id = headers.get(MESSAGE_ID_HEADER, b"")
            layout = headers.get(LAYOUT_HEADER, b"")
            name = dataset.decode("utf-8", errors="replace")
            if verifier is not None:
                # Checked before the duplicate test: an unverified message never makes a
                # verified one a duplicate.
                reason = verifier.check(
                    headers.get(TAG_HEADER), KAFKA_ARROW,
                    kafka_arrow_fields(msg.key(), dataset, layout, message_id), value or b"")
                if reason is not None:
                    self._refuse(name, reason)
                    continue
            if message_id in seen:
                continue  # at-least-once delivery sent it twice
            seen.add(message_id)
            if verifier is not None:
                if message_id in self.skip:
                    self._refuse(name, REPLAYED)
                    continue
                self.verified[name] = self.verified.get(name, 0) + 1
                self.message_ids.append(message_id)
            yield name, layout.decode("ascii", "replace"), value

    def raw(self, partition: InputPartition) -> Iterator[Any]:
        """The partition's messages as Arrow batches of ``raw_arrow_schema``."""
        import pyarrow as pa

        schema = raw_arrow_schema()
        cols: dict[str, list[Any]] = {name: [] for name in schema.names}
        for dataset, layout, value in self.arrow_messages(partition):
            cols["dataset"].append(dataset)
            cols["layout"].append(layout)
            if dataset is None:
                cols["value"].append(None)
                cols["text"].append(_text(value))
            else:
                cols["value"].append(value)
                cols["text"].append(None)
            if len(cols["text"]) >= 1_000:
                yield pa.RecordBatch.from_pydict(cols, schema=schema)
                cols = {name: [] for name in schema.names}
        if cols["text"]:
            yield pa.RecordBatch.from_pydict(cols, schema=schema)

    def json_texts(self, partition: InputPartition) -> Iterator[Any]:
        """The JSON messages' texts, as Arrow batches of one ``value`` string column."""
        import pyarrow as pa

        values: list[str] = []
        for dataset, _layout, value in self.arrow_messages(partition):
            if dataset is not None:
                continue
            values.append(_text(value))
            if len(values) >= 10_000:
                yield pa.RecordBatch.from_pydict({"value": values})
                values = []
        if values:
            yield pa.RecordBatch.from_pydict({"value": values})


def _text(value: bytes | None) -> str:
    return value.decode("utf-8", errors="replace") if value is not None else ""


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
            # A column added to the layout later (e.g. ``signer_key_id``) reads as nulls from
            # an older message.
            have = set(rows.schema.names)
            yield pa.RecordBatch.from_arrays(
                [rows.column(f.name).cast(f.type) if f.name in have
                 else pa.nulls(rows.num_rows, f.type) for f in schema],
                schema=schema)


def message_table(dataset: str, layout: str | None, value: bytes | None,
                  columns: Sequence[str], dictionary: Collection[str] = ()) -> Any:
    """The rows of one Arrow IPC message of ``dataset``, only ``columns``, typed as the
    dataset's schema types them but the string columns in ``dictionary``, which come
    dictionary-encoded (as the sink sends repeated strings; a message that sent them plain is
    encoded here). A column the message lacks reads as nulls. Only the wanted columns are
    decompressed (``included_fields``)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    schema = SCHEMAS[dataset]
    if layout != str(LAYOUT_VERSION) or value is None:
        # Rows of a layout this job does not know: countable as unknown schema versions.
        read = pa.Table.from_batches([_unknown_layout_rows(schema, (layout or "").encode())])
        have = set(schema.names)
    else:
        buffer = pa.py_buffer(value)
        positions = {name: i for i, name in enumerate(pa.ipc.read_schema(buffer).names)}
        have = set(positions)
        options = pa.ipc.IpcReadOptions(
            included_fields=sorted(positions[c] for c in columns if c in positions),
            use_threads=False)
        with pa.ipc.open_stream(buffer, options=options) as reader:
            read = reader.read_all()
    out = []
    for name in columns:
        field = schema.field(name)
        target = (pa.dictionary(pa.int32(), field.type) if name in dictionary else field.type)
        if name not in have:
            out.append(pa.nulls(read.num_rows, target))
            continue
        col = read[name]
        if col.type != target:
            if pa.types.is_dictionary(target) and not pa.types.is_dictionary(col.type):
                col = pc.dictionary_encode(col.cast(field.type))
            col = col.cast(target)
        out.append(col)
    return pa.table(out, names=list(columns))


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
