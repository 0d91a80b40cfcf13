"""The columnar Kafka telemetry sink: compact Arrow IPC batches, one dataset per message.

Every flush interval the rows of the columnar layout (``telemetry_columns``) are produced as
messages whose value is an Arrow IPC stream (one schema, one LZ4-compressed record batch of at
most ``MAX_ROWS_PER_MESSAGE`` rows, string columns dictionary-encoded but for those that are
unique per row, ``UNIQUE_COLUMNS``) and whose headers say what it holds:

- ``sluice-dataset``: the dataset name (``record_batch``, ``offset_run``...);
- ``sluice-layout``: the layout version (``1``);
- ``sluice-message-id``: ``<instance id>-<n>``, n = 1, 2, ... per sink: unique per message, so
  a reader can drop a message delivered twice, and count the messages missing between two;
- ``sluice-tag`` (with a telemetry key): ``<key id>:<HMAC-SHA256>`` over the key, these three
  headers and the value (``integrity``).

The key is the proxy instance id, so one instance's messages stay ordered in one partition.
The producer does not compress again (``compression.type`` ``none`` unless the config says
otherwise): the values are compressed already.
``sluice audit kafka://...`` reads these messages (and JSON messages of the old sink).
"""

from __future__ import annotations

import itertools
import time
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from sluice.proxy.telemetry.events import ProxyInfo
from sluice.proxy.telemetry.sinks import KafkaSink, TelemetryConfigError
from sluice.telemetry_schema.columns import (
    LAYOUT_VERSION,
    UNIQUE_COLUMNS,
    ColumnarBuffers,
    warm_up,
)
from sluice.telemetry_schema.integrity import KAFKA_ARROW, TAG_HEADER, kafka_arrow_fields

DEFAULT_FLUSH_SECONDS = 1.0
# Offset-run segments and finding counters restart this often (file sinks: at rotation).
DEFAULT_ROLLUP_SECONDS = 300.0
# Keeps one message well under Kafka's default 1 MB message size.
MAX_ROWS_PER_MESSAGE = 5000
_IPC_OPTIONS = pa.ipc.IpcWriteOptions(compression="lz4")


def dictionary_encoded(batch: pa.RecordBatch) -> pa.RecordBatch:
    """``batch`` with its string columns but ``UNIQUE_COLUMNS`` dictionary-encoded.

    Measured on the audit bench's data (1 million events, 275 messages): 39.6 MB of messages
    instead of 70.3 MB, and a reader groups by the dictionary indices instead of hashing the
    strings (0.15 CPU s instead of 0.23 for 850,000 record batch rows)."""
    columns = [
        pc.dictionary_encode(col) if pa.types.is_string(col.type) and name not in UNIQUE_COLUMNS
        else col
        for name, col in zip(batch.schema.names, batch.columns, strict=True)
    ]
    return pa.RecordBatch.from_arrays(columns, names=batch.schema.names)


def encode_batch(batch: pa.RecordBatch) -> bytes:
    """One record batch as an Arrow IPC stream (schema + batch + end marker), its repeated
    strings dictionary-encoded (``dictionary_encoded``)."""
    batch = dictionary_encoded(batch)
    out = pa.BufferOutputStream()
    with pa.ipc.new_stream(out, batch.schema, options=_IPC_OPTIONS) as writer:
        writer.write_batch(batch)
    return bytes(out.getvalue().to_pybytes())


class ArrowKafkaSink(KafkaSink):
    """Telemetry to a Kafka topic as Arrow IPC messages (see module doc)."""

    kind = "kafka-arrow"

    def __init__(
        self,
        proxy: ProxyInfo,
        bootstrap: str,
        topic: str,
        *,
        flush_seconds: float = DEFAULT_FLUSH_SECONDS,
        rollup_seconds: float = DEFAULT_ROLLUP_SECONDS,
        **kafka_options: Any,
    ) -> None:
        """``kafka_options``: those of ``KafkaSink`` (queue_size, producer_config...)."""
        if flush_seconds <= 0:
            raise TelemetryConfigError("telemetry.flush_seconds: must be > 0")
        self.flush_seconds = flush_seconds
        self.rollup_seconds = rollup_seconds
        self._buffers = ColumnarBuffers(proxy.instance_id)
        self._unflushed = 0
        self._flushed_at = time.monotonic()
        self._rollups_at = time.monotonic()
        self._message_ids = itertools.count(1)
        # The values are LZ4-compressed Arrow already: compressing the Kafka batch again
        # only costs CPU on both sides (a user's config can still ask for it).
        kafka_options["producer_config"] = {
            "compression.type": "none", **(kafka_options.get("producer_config") or {})}
        super().__init__(proxy, bootstrap, topic, **kafka_options)

    def _open_backend(self) -> None:
        warm_up()
        super()._open_backend()

    def _write_batch(self, batch: list[dict[str, Any]], gap: dict[str, Any] | None) -> int:
        if self._producer is None:
            raise RuntimeError("kafka producer not started")
        if gap is not None:
            self._buffers.add(gap)
        for event in batch:
            self._buffers.add(event)
        self._unflushed += len(batch)
        if time.monotonic() - self._flushed_at >= self.flush_seconds:
            self._produce_flush()
        self._producer.poll(0)
        return 0

    def _tick(self) -> None:
        now = time.monotonic()
        if now - self._rollups_at >= self.rollup_seconds:
            self._rollups_at = now
            self._buffers.close_rollups()
            self._produce_flush()
        elif now - self._flushed_at >= self.flush_seconds:
            self._produce_flush()
        super()._tick()

    def _produce_flush(self) -> None:
        self._flushed_at = time.monotonic()
        events, self._unflushed = self._unflushed, 0
        if not self._buffers.pending():
            if events:
                self._count_written(events)
            return
        producer = self._producer
        messages: list[tuple[str, bytes]] = []
        for dataset, rb in self._buffers.rows_for_flush().items():
            for start in range(0, rb.num_rows, MAX_ROWS_PER_MESSAGE):
                messages.append((dataset, encode_batch(rb.slice(start, MAX_ROWS_PER_MESSAGE))))
        # The flush's events count as written when every message of it is delivered.
        left = [len(messages)]
        failures: list[str] = []

        def delivered(err: Any, _msg: Any) -> None:
            left[0] -= 1
            if err is not None:
                failures.append(str(err))
            if left[0] == 0:
                with self._lock:
                    self._pending -= events
                if failures:
                    self._count_dropped_error(events, f"kafka delivery failed: {failures[0]}")
                else:
                    self._count_written(events)

        with self._lock:
            self._pending += events
        key = self._proxy.instance_id.encode()
        layout = str(LAYOUT_VERSION).encode()
        for dataset, value in messages:
            name = dataset.encode()
            message_id = f"{self._proxy.instance_id}-{next(self._message_ids)}".encode()
            headers = [
                ("sluice-dataset", name),
                ("sluice-layout", layout),
                ("sluice-message-id", message_id),
            ]
            if self._tagger is not None:
                headers.append((TAG_HEADER, self._tagger.tag(
                    KAFKA_ARROW, kafka_arrow_fields(key, name, layout, message_id), value)))
            self._produce(producer, value, key, delivered, headers)

    def _close_backend(self) -> None:
        if self._producer is not None:
            self._buffers.close_rollups()
            self._produce_flush()
        super()._close_backend()
