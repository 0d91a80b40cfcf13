"""Filling a telemetry topic the way proxies do (through the real Kafka sinks), and delivering
one of its messages a second time, as an at-least-once producer may."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from sluice.proxy import telemetry as t


def emit_through_sinks(bootstrap: str, topic: str, events: list[dict[str, Any]],
                       proxies: Iterable[tuple[t.ProxyInfo, str]]) -> None:
    """Each (proxy, format) sends its own events (by instance id) through a Kafka sink of that
    format (``arrow``: Arrow IPC batches, ``json``: the older JSON sink) and closes it."""
    for proxy, fmt in proxies:
        sink = t.make_sink(
            {"kafka": {"bootstrap": bootstrap, "topic": topic, "create_partitions": 2,
                       "format": fmt}},
            proxy.instance_id,
            proxy=proxy,
        )
        assert isinstance(sink, t.ArrowKafkaSink) == (fmt == "arrow")
        mine = [e for e in events if e["proxy"]["instance_id"] == proxy.instance_id]
        for event in mine:
            sink.emit(event)
        sink.close(timeout=30)
        assert sink.stats()["written"] == len(mine), sink.stats()


def redeliver_one(bootstrap: str, topic: str, dataset: str) -> None:
    """Produce the first Arrow message of ``dataset`` in ``topic`` again, bytes and headers
    (its message id) unchanged."""
    from confluent_kafka import Producer

    from sluice.spark_audit.kafka_arrow_source import DATASET_HEADER, KafkaArrowReader

    # Read with the audit's own reader (assigned partitions: a consumer group's join and
    # rebalance took 20 s against the bundled broker).
    reader = KafkaArrowReader({"bootstrap.servers": bootstrap, "subscribe": topic,
                               "dataset": "raw"})
    original = next(msg for partition in reader.partitions()
                    for msg in reader.messages(partition)
                    if dict(msg.headers() or []).get(DATASET_HEADER) == dataset.encode())
    producer = Producer({"bootstrap.servers": bootstrap})
    producer.produce(topic, original.value(), original.key(), headers=original.headers())
    assert producer.flush(30) == 0
