"""`sluice transform list`: each transform's committed input offsets, log ends and lag, read
from Kafka (the transform's consumer group), so it works from any machine.

The log end of each input partition comes from a Fetch response's high watermark: the bundled
broker answers ListOffsets(LATEST) with the last batch's base offset + 1, not the log end.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaException, TopicPartition

from sluice.transforms.config import TransformSpec
from sluice.transforms.runner import TransformError, client_settings


@dataclass(frozen=True, slots=True)
class PartitionLag:
    transform: str
    group: str
    topic: str
    partition: int
    committed: int | None
    end: int | None
    lag: int | None
    output: str
    guarantee: str

    def as_dict(self) -> dict[str, object]:
        return asdict(self)


def transform_lag(spec: TransformSpec, bootstrap: str, timeout: float = 10.0) -> list[PartitionLag]:
    """Committed offset, log end and lag of every input partition of `spec`."""
    consumer = Consumer({**client_settings(spec, bootstrap), "group.id": spec.group,
                         "enable.auto.commit": False, "auto.offset.reset": "earliest",
                         "fetch.wait.max.ms": 10})
    try:
        partitions: list[TopicPartition] = []
        for topic in spec.inputs:
            try:
                meta = consumer.list_topics(topic, timeout=timeout).topics.get(topic)
            except KafkaException as exc:
                raise TransformError(f"cannot reach the broker at {bootstrap}: "
                                     f"{exc.args[0].str()}") from None
            if meta is None or meta.error is not None:
                raise TransformError(f"transform {spec.name}: topic {topic!r} does not exist")
            partitions += [TopicPartition(topic, p) for p in sorted(meta.partitions)]
        committed = {(tp.topic, tp.partition): tp.offset
                     for tp in consumer.committed(partitions, timeout=timeout)}
        # Fetch from where the group stands: the response carries the high watermark.
        consumer.assign([TopicPartition(tp.topic, tp.partition,
                                        c if (c := committed[(tp.topic, tp.partition)]) >= 0
                                        else OFFSET_BEGINNING) for tp in partitions])
        ends: dict[tuple[str, int], int] = {}
        deadline = time.monotonic() + timeout
        while len(ends) < len(partitions) and time.monotonic() < deadline:
            consumer.poll(0.05)
            for tp in partitions:
                _low, high = consumer.get_watermark_offsets(tp, cached=True)
                if high >= 0:
                    ends[(tp.topic, tp.partition)] = high
    finally:
        consumer.close()
    rows: list[PartitionLag] = []
    for tp in partitions:
        key = (tp.topic, tp.partition)
        done: int | None = committed[key] if committed[key] >= 0 else None
        end = ends.get(key)
        lag = None if end is None else end - (done or 0)
        rows.append(PartitionLag(spec.name, spec.group, tp.topic, tp.partition, done, end,
                                 None if lag is None else max(0, lag), spec.output,
                                 spec.guarantee))
    return rows


def format_table(rows: Sequence[PartitionLag]) -> str:
    """Rows as an aligned text table (what `sluice transform list` prints)."""
    head = ("TRANSFORM", "INPUT", "PARTITION", "COMMITTED", "END", "LAG", "OUTPUT", "GUARANTEE")
    cells = [head] + [
        (r.transform, r.topic, str(r.partition), _cell(r.committed), _cell(r.end), _cell(r.lag),
         r.output, r.guarantee) for r in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(head))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip()
                     for row in cells)


def _cell(value: int | None) -> str:
    return "-" if value is None else str(value)
