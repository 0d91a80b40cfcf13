"""Produce and consume workloads with confluent-kafka (librdkafka), timed from the client side.

The consume side reads with the batch API (``Consumer.consume(num_messages=...)``) so that a
direct consume runs at the speed of the broker and the machine, not at the speed of a Python
loop over single messages: a consume phase slower than the produce phase of the same records
would measure the client, not the path. For the same reason the client's cyclic garbage
collector is paused while a consume is timed (paused_gc).
"""

from __future__ import annotations

import contextlib
import gc
import json
import random
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

QUIET = {"log_level": 3}


def json_records(n: int, size: int = 200, seed: int = 7) -> list[bytes]:
    """JSON values of about `size` bytes, every one holding an e-mail address and a card
    number (the PII that builtin:pii-mask rewrites), so a mask filter works on every record."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        doc = {
            "user_id": f"u{rng.randrange(10**6)}",
            "email": f"user{i}@example.com",
            "card": f"4111 1111 1111 {rng.randrange(10**4):04d}",
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


def delete_topic(bootstrap: str, topic: str) -> None:
    """Delete a benchmark topic so a long run does not fill the broker's memory storage."""
    admin = AdminClient({"bootstrap.servers": bootstrap, **QUIET})
    for fut in admin.delete_topics([topic], operation_timeout=20).values():
        fut.result(20)


def producer_config(
    bootstrap: str, records: int, compression: str = "lz4", linger_ms: int = 5
) -> dict[str, Any]:
    """The benchmark producer: acks=all, `linger_ms`, batches of up to 10 000 records, a local
    queue that holds `records` without blocking produce()."""
    return {
        "bootstrap.servers": bootstrap,
        "acks": "all",
        "linger.ms": linger_ms,
        "batch.num.messages": 10000,
        "compression.type": compression,
        "queue.buffering.max.messages": records + 1000,
        **QUIET,
    }


def consumer_config(bootstrap: str) -> dict[str, Any]:
    """The benchmark consumer (a fresh group, no commits), sized to read at the broker's speed."""
    return {
        "bootstrap.servers": bootstrap,
        "group.id": f"bench-{uuid.uuid4().hex[:6]}",
        "enable.auto.commit": False,
        # Keep the fetch queue full while Python takes each batch out. librdkafka 2.x
        # stops fetching for fetch.queue.backoff.ms (default 1 s) whenever its local queue
        # is full; with the default, a consumer that drains it a moment later still idles.
        "fetch.queue.backoff.ms": 1,
        "fetch.max.bytes": 64 << 20,
        "max.partition.fetch.bytes": 8 << 20,
        "queued.max.messages.kbytes": 256 << 10,
        **QUIET,
    }


def produce(
    bootstrap: str, topic: str, values: list[bytes], compression: str = "lz4", linger_ms: int = 5
) -> float:
    """Seconds to produce all values with acks=all, until every delivery is confirmed.

    Records are spread over the topic's partitions by librdkafka's default partitioner (no
    key: sticky batches per partition). Any delivery error fails the run."""
    producer = Producer(producer_config(bootstrap, len(values), compression, linger_ms))
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


@contextlib.contextmanager
def paused_gc() -> Iterator[None]:
    """Python's cyclic garbage collector off for the block (as it was after it).

    Why: a batch-API consume() returns 10 000 Message objects, all alive until the batch is
    handed back, so they outlive the young generations and set off full collections of the
    whole heap, 5-6 per 500 000 records, 25-50 % of a workload-2 consume's wall time and
    about 0.35 µs of the Python thread's CPU a record (measured when this was added; the wall
    share is in docs/PERFORMANCE.md, *What the consume figure measures*). Their
    length on a shared machine is noise the path did not make. Messages hold no reference
    cycles: reference counting frees them with the collector off."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


@dataclass(frozen=True)
class Consumed:
    """One consume phase: records read, the seconds it took from assignment to the last
    record, and the seconds from assignment to the first record (the first Fetch's way through
    the path; the rest is the client reading what that and later Fetches brought)."""

    records: int
    seconds: float
    first: float = 0.0


def consume(bootstrap: str, topic: str, count: int, batch: int = 10_000) -> Consumed:
    """Read `count` records from the start of every partition (assigned, no group join), with
    the batch API. The clock starts at assignment (the consumer has already fetched metadata
    through the same address) and stops at the last record; the garbage collector is paused
    in between (paused_gc)."""
    consumer = Consumer(consumer_config(bootstrap))
    try:
        md = consumer.list_topics(topic, timeout=10)
        parts = list(md.topics[topic].partitions)
        with paused_gc():
            start = time.perf_counter()
            consumer.assign([TopicPartition(topic, p, 0) for p in parts])
            got = 0
            first = 0.0
            deadline = start + 120
            while got < count and time.perf_counter() < deadline:
                # consume() waits for num_messages or the timeout: never ask for more than
                # are left, or the last call idles for the whole timeout.
                for m in consumer.consume(num_messages=min(batch, count - got), timeout=0.5):
                    err = m.error()
                    if err is not None:
                        raise KafkaException(err)
                    if not got:
                        first = time.perf_counter() - start
                    got += 1
            elapsed = time.perf_counter() - start
        if got < count:
            raise RuntimeError(f"consumed {got}/{count} records of {topic} in 120 s")
        return Consumed(got, elapsed, first)
    finally:
        consumer.close()
