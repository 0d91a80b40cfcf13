"""Produce and consume workloads with confluent-kafka (librdkafka), timed from the client side."""

from __future__ import annotations

import json
import random
import time
import uuid
from typing import Any

from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

QUIET = {"log_level": 3}


def json_records(n: int, size: int = 200, seed: int = 7) -> list[bytes]:
    """JSON values of about `size` bytes, some with PII (emails, card numbers)."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        doc = {
            "user_id": f"u{rng.randrange(10**6)}",
            "email": f"user{i}@example.com",
            "card": "4111 1111 1111 1111" if i % 3 == 0 else "order-12345",
            "amount": rng.randrange(10**5) / 100,
            "note": "",
        }
        raw = json.dumps(doc)
        doc["note"] = "x" * max(0, size - len(raw))
        out.append(json.dumps(doc).encode())
    return out


def make_topic(bootstrap: str, partitions: int = 3) -> str:
    name = f"bench-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": bootstrap, **QUIET})
    for fut in admin.create_topics([NewTopic(name, partitions, 1)]).values():
        fut.result(20)
    return name


def produce(bootstrap: str, topic: str, values: list[bytes], compression: str = "lz4") -> float:
    """Seconds to produce all values with acks=all, until every delivery is confirmed."""
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "linger.ms": 5,
            "batch.num.messages": 10000,
            "compression.type": compression,
            "queue.buffering.max.messages": len(values) + 1000,
            **QUIET,
        }
    )
    producer.list_topics(topic, timeout=10)  # connect and learn metadata before the clock starts
    errors: list[str] = []

    def delivered(err: Any, _msg: Any) -> None:
        if err is not None:
            errors.append(str(err))

    start = time.perf_counter()
    for v in values:
        producer.produce(topic, value=v, on_delivery=delivered)
    left = producer.flush(120)
    elapsed = time.perf_counter() - start
    if left or errors:
        raise RuntimeError(f"{left} records not delivered, {len(errors)} failed: {errors[:2]}")
    return elapsed


def consume(bootstrap: str, topic: str, count: int) -> float:
    """Seconds to read `count` records from the start of every partition (assigned, no group)."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"bench-{uuid.uuid4().hex[:6]}",
            "enable.auto.commit": False,
            **QUIET,
        }
    )
    try:
        md = consumer.list_topics(topic, timeout=10)
        parts = list(md.topics[topic].partitions)
        start = time.perf_counter()
        consumer.assign([TopicPartition(topic, p, 0) for p in parts])
        got = 0
        deadline = start + 120
        while got < count and time.perf_counter() < deadline:
            msgs = consumer.consume(10000, 0.5)
            got += sum(1 for m in msgs if not m.error())
        elapsed = time.perf_counter() - start
        if got < count:
            raise RuntimeError(f"consumed {got}/{count}")
        return elapsed
    finally:
        consumer.close()
