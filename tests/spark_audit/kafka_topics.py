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
    from confluent_kafka import Consumer, Producer

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"g-{topic}",
                         "auto.offset.reset": "earliest"})
    consumer.subscribe([topic])
    original = None
    try:
        while original is None:
            msg = consumer.poll(1.0)
            if msg is not None and not msg.error() and dict(msg.headers() or []).get(
                    "sluice-dataset") == dataset.encode():
                original = msg
    finally:
        consumer.close()
    producer = Producer({"bootstrap.servers": bootstrap})
    producer.produce(topic, original.value(), original.key(), headers=original.headers())
    assert producer.flush(30) == 0
