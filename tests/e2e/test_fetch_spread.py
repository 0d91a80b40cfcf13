"""A consumer reading a masked topic through a real `sluice serve` in front of Apache Kafka: the
Fetch responses' partitions, or runs of the batches of a topic's one partition, are masked on
two filter threads at once (builtin pii-mask keeps no state between calls), and the consumer
gets every record, masked, in each partition's order."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml
from confluent_kafka import Consumer, TopicPartition

from tests.e2e.clients import QUIET, confluent_produce, create_topic, unique
from tests.harness.ports import free_port
from tests.harness.proxy import SluiceProxy
from tests.harness.raw_kafka import scrape, series

PARTITIONS = 6
PER_PARTITION = 1500


def spread_responses(metrics_port: int) -> float:
    (line,) = series(scrape(metrics_port), "sluice_fetch_spread_responses_total")
    return float(line.rsplit(" ", 1)[1])


def consume_all(bootstrap: str, topic: str, count: int, *, decode: bool = True
                ) -> dict[int, list[Any]]:
    """Every partition's values in order (decoded as JSON, or the raw bytes)."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": unique("spread"),
                         "enable.auto.commit": False, **QUIET})
    got: dict[int, list[Any]] = {p: [] for p in range(PARTITIONS)}
    try:
        consumer.assign([TopicPartition(topic, p, 0) for p in range(PARTITIONS)])
        n = 0
        idle = 0
        while n < count and idle < 60:
            batch = consumer.consume(1000, 0.5)
            idle = 0 if batch else idle + 1
            for msg in batch:
                assert msg.error() is None, msg.error()
                value = msg.value()
                got[msg.partition()].append(json.loads(value) if decode else value)
                n += 1
    finally:
        consumer.close()
    return got


def test_masked_partitions_are_filtered_side_by_side_and_arrive_in_order(
    broker: Any, tmp_path: Path
) -> None:
    topic = unique("spread-pii")
    create_topic(broker.bootstrap, topic, partitions=PARTITIONS)
    records = [
        (f"k{i}".encode(), json.dumps({
            "seq": i, "user": f"user{i}@example.com", "note": "x" * 120,
        }).encode())
        for i in range(PARTITIONS * PER_PARTITION)
    ]
    placed = confluent_produce(broker.bootstrap, topic, records, **{"compression.type": "lz4"})
    sent: dict[int, list[int]] = {p: [] for p in range(PARTITIONS)}
    for i, (partition, _offset) in enumerate(placed):
        sent[partition].append(i)
    assert sum(1 for seqs in sent.values() if seqs) >= 3, "keys spread over the partitions"
    metrics = free_port()
    config = {
        "metrics": {"listen": f"127.0.0.1:{metrics}"},
        "proxy": {"filter_threads": 2},
        "filters": [{"name": "mask", "module": "builtin:pii-mask", "topics": [topic],
                     "apply_to": ["fetch"]}],
    }
    path = tmp_path / "sluice.yaml"
    path.write_text(yaml.safe_dump(config), encoding="utf-8")
    with SluiceProxy(upstream=broker.bootstrap, config=path) as proxy:
        got = consume_all(proxy.bootstrap, topic, len(records))
        spread = spread_responses(metrics)
    for partition, seqs in sent.items():
        values = got[partition]
        assert [v["seq"] for v in values] == seqs, f"partition {partition} out of order"
        for v in values:
            assert "@example.com" not in v["user"], "an e-mail address reached the consumer"
            assert v["note"] == "x" * 120
    assert spread >= 1, "no Fetch response was filtered on two threads"


def test_one_large_partition_is_masked_in_runs_and_arrives_in_order(
    broker: Any, tmp_path: Path
) -> None:
    """The benchmark's workload 1 in small: one uncompressed partition, read with fetch sizes
    that bring several MiB in one response. With one partition there is nothing else to
    share, so any response filtered on two threads was cut into runs of batches."""
    topic = unique("split-pii")
    create_topic(broker.bootstrap, topic, partitions=1)
    count = 30_000
    records = [
        (None, json.dumps({
            "seq": i, "user": f"user{i}@example.com", "note": "y" * 130,
        }).encode())
        for i in range(count)
    ]
    # Batches of ~128 KiB, so that a response holds dozens of them.
    placed = confluent_produce(broker.bootstrap, topic, records,
                               **{"batch.size": 131072, "linger.ms": 20})
    assert [offset for _partition, offset in placed] == list(range(count))
    metrics = free_port()
    config = {
        "metrics": {"listen": f"127.0.0.1:{metrics}"},
        "proxy": {"filter_threads": 2},
        "filters": [{"name": "mask", "module": "builtin:pii-mask", "topics": [topic],
                     "apply_to": ["fetch"]}],
    }
    path = tmp_path / "sluice.yaml"
    path.write_text(yaml.safe_dump(config), encoding="utf-8")
    with SluiceProxy(upstream=broker.bootstrap, config=path) as proxy:
        consumer = Consumer({
            "bootstrap.servers": proxy.bootstrap, "group.id": unique("split"),
            "enable.auto.commit": False, "max.partition.fetch.bytes": 8 << 20,
            "fetch.max.bytes": 16 << 20, **QUIET,
        })
        got: list[tuple[int, Any]] = []
        try:
            consumer.assign([TopicPartition(topic, 0, 0)])
            idle = 0
            while len(got) < count and idle < 60:
                batch = consumer.consume(10_000, 0.5)
                idle = 0 if batch else idle + 1
                for msg in batch:
                    assert msg.error() is None, msg.error()
                    got.append((msg.offset(), json.loads(msg.value())))
        finally:
            consumer.close()
        spread = spread_responses(metrics)
    assert [offset for offset, _v in got] == list(range(count)), "offsets out of order"
    assert [v["seq"] for _o, v in got] == list(range(count)), "records out of order"
    for _offset, v in got:
        assert "@example.com" not in v["user"], "an e-mail address reached the consumer"
        assert v["note"] == "y" * 130
    assert spread >= 1, "no Fetch response of the one partition was filtered in runs"
