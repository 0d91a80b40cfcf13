"""A producer or consumer that runs as fast as it can for a while, in its own process, and
prints what it moved per 100 ms as JSON (the quota tests run two at once without sharing a
GIL with each other or with pytest).

    python -m tests.e2e.quota_load produce BOOTSTRAP TOPIC CLIENT_ID SECONDS
    python -m tests.e2e.quota_load consume BOOTSTRAP TOPIC CLIENT_ID SECONDS

Output: {"start": monotonic start, "buckets": {"<100 ms index>": bytes}, "errors": [...],
"throttle_events": n}. Produce counts delivered value bytes (acks=all) by delivery time;
consume counts value bytes by arrival time.
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any

from confluent_kafka import Consumer, KafkaError, Producer

VALUE = b"q" * 10_000


def produce(bootstrap: str, topic: str, client_id: str, seconds: float) -> dict[str, Any]:
    buckets: dict[int, int] = {}
    errors: list[str] = []
    throttles = [0]
    start = time.monotonic()

    def delivered(err: Any, msg: Any) -> None:
        if err is not None:
            if err.code() != KafkaError._PURGE_QUEUE:
                errors.append(str(err))
            return
        slot = int((time.monotonic() - start) * 10)
        buckets[slot] = buckets.get(slot, 0) + len(msg.value())

    def throttled(event: Any) -> None:
        throttles[0] += 1

    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "client.id": client_id,
            "acks": "all",
            "linger.ms": 2,
            # Small batches: the throttle follows each request closely (a 1 MB batch would
            # be a whole second of a 1 MB/s quota).
            "batch.size": 65536,
            "queue.buffering.max.kbytes": 8192,
            "throttle_cb": throttled,
        }
    )
    deadline = start + seconds
    while time.monotonic() < deadline:
        try:
            producer.produce(topic, VALUE, on_delivery=delivered)
        except BufferError:
            producer.poll(0.01)
            continue
        producer.poll(0)
    # What is still queued locally was never sent: purge it (not an error), then wait for
    # the requests in flight.
    producer.purge(in_queue=True, in_flight=False)
    producer.flush(30)
    return {"start": start, "buckets": buckets, "errors": errors, "throttle_events": throttles[0]}


def consume(bootstrap: str, topic: str, client_id: str, seconds: float) -> dict[str, Any]:
    buckets: dict[int, int] = {}
    errors: list[str] = []
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "client.id": client_id,
            "group.id": f"{client_id}-{time.time_ns()}",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
            "session.timeout.ms": 6000,
            "fetch.max.bytes": 1048576,  # librdkafka: >= message.max.bytes
            "max.partition.fetch.bytes": 262144,
        }
    )
    consumer.subscribe([topic])
    start = time.monotonic()
    deadline = start + seconds
    while time.monotonic() < deadline:
        for msg in consumer.consume(500, 0.1):
            if msg.error() is not None:
                if msg.error().code() != KafkaError._PARTITION_EOF:
                    errors.append(str(msg.error()))
                continue
            slot = int((time.monotonic() - start) * 10)
            buckets[slot] = buckets.get(slot, 0) + len(msg.value() or b"")
    consumer.close()
    return {"start": start, "buckets": buckets, "errors": errors, "throttle_events": 0}


def main() -> None:
    mode, bootstrap, topic, client_id, seconds = sys.argv[1:6]
    run = produce if mode == "produce" else consume
    print(json.dumps(run(bootstrap, topic, client_id, float(seconds))), flush=True)


if __name__ == "__main__":
    main()
