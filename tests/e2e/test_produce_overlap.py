"""An idempotent producer (confluent-kafka, up to five requests in flight) writing a masked
topic through a real `sluice serve` in front of Apache Kafka: its pipelined Produce requests
are masked on two filter threads at once (builtin pii-mask keeps no state between calls), yet
the broker gets them in the order sent, so no sequence number is ever out of order, no record
is lost or written twice, and every record is stored masked, each partition in the order it
was produced.

Four partitions: librdkafka's idempotent producer keeps one request per partition in flight
(measured: with one partition each Produce left only after the previous one's answer), so
several partitions are what puts several of its requests in flight on one connection."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from confluent_kafka import Producer

from tests.e2e.clients import QUIET, create_topic, unique
from tests.e2e.filter_threads import consume_partitions, json_values, two_thread_config
from tests.harness.ports import free_port
from tests.harness.proxy import SluiceProxy
from tests.harness.raw_kafka import sample_value, scrape

RECORDS = 100_000
PARTITIONS = 4


def produce_idempotent(bootstrap: str, topic: str, values: list[bytes]) -> list[tuple[int, int]]:
    """Produce keyed values without polling in between (as fast as the client can queue them),
    then flush; (partition, offset) of each delivery report, in send order. Any delivery
    error fails."""
    producer = Producer({
        "bootstrap.servers": bootstrap, "enable.idempotence": True, "acks": "all",
        "max.in.flight.requests.per.connection": 5, "linger.ms": 5,
        "batch.num.messages": 2000, "queue.buffering.max.messages": len(values) + 1000,
        **QUIET,
    })
    producer.list_topics(topic, timeout=10)
    placed: list[tuple[int, int] | None] = [None] * len(values)
    errors: list[str] = []

    def delivered(i: int) -> Any:
        def report(err: Any, msg: Any) -> None:
            if err is not None:
                errors.append(str(err))
            else:
                placed[i] = (msg.partition(), msg.offset())
        return report

    for i, value in enumerate(values):
        producer.produce(topic, key=b"k%d" % (i % 97), value=value, on_delivery=delivered(i))
    assert producer.flush(90) == 0, "records not delivered"
    assert not errors, errors[:3]
    assert all(p is not None for p in placed)
    return [p for p in placed if p is not None]


def test_an_idempotent_producer_keeps_its_order_through_overlapping_masked_produce(
    broker: Any, tmp_path: Path
) -> None:
    topic = unique("overlap-pii")
    create_topic(broker.bootstrap, topic, partitions=PARTITIONS)
    values = json_values(RECORDS, "x" * 120)
    metrics = free_port()
    path = two_thread_config(tmp_path, metrics, {
        "name": "mask", "module": "builtin:pii-mask", "topics": [topic], "apply_to": ["produce"],
    })
    with SluiceProxy(upstream=broker.bootstrap, config=path) as proxy:
        placed = produce_idempotent(proxy.bootstrap, topic, values)
        overlapped = sample_value(scrape(metrics), "sluice_produce_overlapped_jobs_total")
    # Each partition's delivery reports in send order hold offsets 0..n-1: nothing was
    # reordered, lost or written twice.
    sent: dict[int, list[int]] = {p: [] for p in range(PARTITIONS)}
    for i, (partition, offset) in enumerate(placed):
        assert offset == len(sent[partition]), f"record {i}: offset {offset} out of order"
        sent[partition].append(i)
    got = consume_partitions(broker.bootstrap, topic, PARTITIONS, RECORDS, group="overlap")
    for partition, seqs in sent.items():
        docs = got[partition]
        assert [d["seq"] for d in docs] == seqs, f"partition {partition} stored out of order"
        for d in docs:
            assert "@example.com" not in d["user"], "an e-mail address reached the broker"
            assert d["note"] == "x" * 120
    assert overlapped >= 1, "no Produce request was filtered beside an earlier one"
