"""Shared set-up of the dead-letter writer tests: configs, a writer run, and a consumer that
reports the partition of every record it reads."""

from __future__ import annotations

import time
from typing import Any

from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from sluice.filters.chain import DeadLetter
from sluice.proxy.net.tls import UpstreamTLS
from sluice.proxy.net.upstream_sasl import UpstreamSasl
from sluice.proxy.ops.config import ProxyConfig
from tests.e2e.clients import QUIET, unique

Landed = tuple[int, bytes | None, bytes | None, list[tuple[str, bytes | None]]]


def config_for(
    bootstrap: str, sasl: UpstreamSasl | None = None, tls: UpstreamTLS | None = None
) -> ProxyConfig:
    host, port = bootstrap.rsplit(":", 1)
    return ProxyConfig(
        listen=("127.0.0.1", 0), upstream=[(host, int(port))], upstream_sasl=sasl, upstream_tls=tls
    )


def letters(topic: str, count: int, keyed: bool = True, size: int = 10) -> list[DeadLetter]:
    return [
        DeadLetter(
            topic=topic,
            key=f"key-{i}".encode() if keyed else None,
            value=(f"value-{i}-".encode() + b"x" * size)[:size] if size else b"",
            headers=[("sluice.filter", b"pii-mask"), ("sluice.reason", b"test")],
        )
        for i in range(count)
    ]


def create_topic_with(bootstrap: str, name: str, partitions: int, **conf: Any) -> None:
    """CreateTopics through a listener that wants SASL or TLS (`conf`: librdkafka settings)."""
    admin = AdminClient({"bootstrap.servers": bootstrap, **QUIET, **conf})
    for fut in admin.create_topics([NewTopic(name, partitions, 1)]).values():
        fut.result(15)


def consume_with_partitions(
    bootstrap: str, topic: str, count: int, timeout: float = 30, **conf: Any
) -> list[Landed]:
    """(partition, key, value, headers) of `count` records of `topic`, from every partition."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": unique("dlq-reader"),
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
            **QUIET,
            **conf,
        }
    )
    try:
        parts = consumer.list_topics(topic, timeout=10).topics[topic].partitions
        consumer.assign([TopicPartition(topic, p, 0) for p in parts])
        out: list[Landed] = []
        deadline = time.monotonic() + timeout
        while len(out) < count and time.monotonic() < deadline:
            msg: Any = consumer.poll(0.5)
            if msg is None or msg.error():
                continue
            out.append((msg.partition(), msg.key(), msg.value(), list(msg.headers() or [])))
        return out
    finally:
        consumer.close()
