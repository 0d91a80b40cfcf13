"""Real Kafka clients driven the same way against any bootstrap address (broker or proxy).

Each helper produces or consumes with one client library and returns plain Python values, so a
test can run it once directly against the broker and once through the proxy and compare.
"""

from __future__ import annotations

import asyncio
import subprocess
import time
import uuid
from collections.abc import Iterable
from typing import Any

from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

Rec = tuple[bytes | None, bytes | None]

QUIET = {"log_level": 3}


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def create_topic(
    bootstrap: str, name: str, partitions: int = 1, config: dict[str, str] | None = None
) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap, **QUIET})
    futures = admin.create_topics([NewTopic(name, partitions, 1, config=config or {})])
    for fut in futures.values():
        fut.result(15)
    wait_for_leaders(bootstrap, name, partitions)


def wait_for_leaders(
    bootstrap: str, name: str, partitions: int = 1, timeout: float = 15, **conf: Any
) -> None:
    """Wait until `bootstrap`'s metadata shows a leader for each of the topic's partitions.

    Apache Kafka creates a topic through its metadata log: for a moment after CreateTopics
    answers, Metadata may not list it and a Produce or Fetch gets NOT_LEADER_OR_FOLLOWER
    (Tansu serves it at once). Clients retry by themselves; raw-frame tests do not."""
    admin = AdminClient({"bootstrap.servers": bootstrap, **QUIET, **conf})
    deadline = time.monotonic() + timeout
    while True:
        topic = admin.list_topics(name, timeout=10).topics.get(name)
        if (topic is not None and topic.error is None and len(topic.partitions) >= partitions
                and all(p.leader >= 0 for p in topic.partitions.values())):
            break
        if time.monotonic() > deadline:
            raise TimeoutError(f"topic {name}: no leader for every partition after {timeout} s")
        time.sleep(0.05)
    # Metadata can name a leader a moment before that broker serves the partition (its
    # metadata cache is updated before its replicas): ask each leader for the partition's
    # offsets until it answers (ListOffsets gets NOT_LEADER_OR_FOLLOWER until then).
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "sluice-tests-wait",
                         **QUIET, **conf})
    try:
        for partition in range(partitions):
            while True:
                try:
                    consumer.get_watermark_offsets(TopicPartition(name, partition), timeout=5)
                    break
                except KafkaException:
                    if time.monotonic() > deadline:
                        raise TimeoutError(
                            f"topic {name}[{partition}]: its leader does not serve it after "
                            f"{timeout} s") from None
                    time.sleep(0.05)
    finally:
        consumer.close()


def confluent_produce(
    bootstrap: str, topic: str, records: Iterable[Rec], **conf: Any
) -> list[tuple[int, int]]:
    """Produce and wait; returns (partition, offset) per record in send order."""
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, **QUIET, **conf})
    results: list[tuple[int, int] | None] = []
    errors: list[str] = []

    def done(idx: int) -> Any:
        def cb(err: Any, msg: Any) -> None:
            if err is not None:
                errors.append(str(err))
            else:
                results[idx] = (msg.partition(), msg.offset())

        return cb

    for i, (key, value) in enumerate(records):
        results.append(None)
        producer.produce(topic, key=key, value=value, on_delivery=done(i))
        producer.poll(0)
    remaining = producer.flush(30)
    assert remaining == 0, f"{remaining} records not delivered"
    assert not errors, errors
    assert all(r is not None for r in results)
    return [r for r in results if r is not None]


def confluent_consume(
    bootstrap: str,
    topic: str,
    count: int,
    group: str | None = None,
    timeout: float = 40,
    **conf: Any,
) -> list[Rec]:
    """Consume `count` records; in a consumer group when `group` is given, else by assignment."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": group or unique("assign"),
            "auto.offset.reset": "earliest",
            "enable.auto.commit": group is not None,
            "session.timeout.ms": 6000,
            **QUIET,
            **conf,
        }
    )
    try:
        if group is None:
            md = consumer.list_topics(topic, timeout=10)
            parts = md.topics[topic].partitions
            consumer.assign([TopicPartition(topic, p, 0) for p in parts])
        else:
            consumer.subscribe([topic])
        out: list[Rec] = []
        deadline = time.monotonic() + timeout
        while len(out) < count and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is None:
                continue
            if msg.error():
                raise KafkaException(msg.error())
            out.append((msg.key(), msg.value()))
        return out
    finally:
        consumer.close()


def kafka_python_produce(bootstrap: str, topic: str, records: Iterable[Rec], **conf: Any) -> int:
    from kafka import KafkaProducer

    producer = KafkaProducer(bootstrap_servers=bootstrap, **conf)
    futures = [producer.send(topic, key=k, value=v) for k, v in records]
    producer.flush(30)
    for fut in futures:
        fut.get(timeout=30)
    producer.close()
    return len(futures)


def kafka_python_consume(
    bootstrap: str, topic: str, count: int, group: str | None, timeout: float = 40
) -> list[Rec]:
    from kafka import KafkaConsumer

    consumer = KafkaConsumer(
        topic,
        bootstrap_servers=bootstrap,
        group_id=group,
        auto_offset_reset="earliest",
        session_timeout_ms=6000,
        heartbeat_interval_ms=1000,
        consumer_timeout_ms=int(timeout * 1000),
    )
    out: list[Rec] = []
    try:
        for msg in consumer:
            out.append((msg.key, msg.value))
            if len(out) >= count:
                break
    finally:
        consumer.close()
    return out


def aiokafka_produce(bootstrap: str, topic: str, records: list[Rec], **conf: Any) -> int:
    from aiokafka import AIOKafkaProducer

    async def run() -> int:
        producer = AIOKafkaProducer(bootstrap_servers=bootstrap, **conf)
        await producer.start()
        try:
            futs = [await producer.send(topic, key=k, value=v) for k, v in records]
            for fut in futs:
                await fut
        finally:
            await producer.stop()
        return len(records)

    return asyncio.run(run())


def aiokafka_consume(
    bootstrap: str, topic: str, count: int, group: str | None, timeout: float = 40
) -> list[Rec]:
    from aiokafka import AIOKafkaConsumer

    async def run() -> list[Rec]:
        consumer = AIOKafkaConsumer(
            topic,
            bootstrap_servers=bootstrap,
            group_id=group,
            auto_offset_reset="earliest",
            session_timeout_ms=6000,
            heartbeat_interval_ms=1000,
        )
        await consumer.start()
        out: list[Rec] = []
        try:
            deadline = time.monotonic() + timeout
            while len(out) < count and time.monotonic() < deadline:
                batch = await consumer.getmany(timeout_ms=500)
                for msgs in batch.values():
                    out.extend((m.key, m.value) for m in msgs)
        finally:
            await consumer.stop()
        return out

    return asyncio.run(run())


def kcat(
    *args: str, input: bytes | None = None, timeout: float = 60
) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        ["kcat", *args], input=input, capture_output=True, timeout=timeout, check=False
    )
