"""What the end-to-end tests of filtering on two threads share (test_fetch_spread.py,
test_fetch_spread_encrypt.py, test_produce_overlap.py): the proxy's config file, the JSON
records with an e-mail address in them, and consumers that read every record back in each
partition's order."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml
from confluent_kafka import Consumer, TopicPartition

from tests.e2e.clients import QUIET, unique
from tests.harness.raw_kafka import scrape, series

# The fetch-spread tests' workload: partitions enough to share between two threads.
PARTITIONS = 6
PER_PARTITION = 1500


def two_thread_config(tmp_path: Path, metrics: int, filter_: dict[str, Any],
                      **sections: Any) -> Path:
    """sluice.yaml in `tmp_path`: metrics on `metrics`, two filter threads, the one filter,
    and any further top-level sections (kms, ...)."""
    config = {
        "metrics": {"listen": f"127.0.0.1:{metrics}"},
        **sections,
        "proxy": {"filter_threads": 2},
        "filters": [filter_],
    }
    path = tmp_path / "sluice.yaml"
    path.write_text(yaml.safe_dump(config), encoding="utf-8")
    return path


def json_values(count: int, note: str) -> list[bytes]:
    """`count` JSON documents numbered by "seq", each with an e-mail address and a note."""
    return [
        json.dumps({"seq": i, "user": f"user{i}@example.com", "note": note}).encode()
        for i in range(count)
    ]


def sent_by_partition(placed: list[tuple[int, int]], partitions: int) -> dict[int, list[int]]:
    """The send indexes of the records each partition got, in send order."""
    sent: dict[int, list[int]] = {p: [] for p in range(partitions)}
    for i, (partition, _offset) in enumerate(placed):
        sent[partition].append(i)
    return sent


def spread_responses(metrics_port: int) -> float:
    (line,) = series(scrape(metrics_port), "sluice_fetch_spread_responses_total")
    return float(line.rsplit(" ", 1)[1])


def consume_partitions(bootstrap: str, topic: str, partitions: int, count: int, *,
                       group: str = "spread", decode: bool = True) -> dict[int, list[Any]]:
    """Every partition's values in order (decoded as JSON, or the raw bytes)."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": unique(group),
                         "enable.auto.commit": False, **QUIET})
    got: dict[int, list[Any]] = {p: [] for p in range(partitions)}
    try:
        consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
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


def consume_large_partition(bootstrap: str, topic: str, count: int, group: str
                            ) -> list[tuple[int, Any]]:
    """(offset, JSON value) of partition 0's records in order, read with fetch sizes that
    bring several MiB in one response."""
    consumer = Consumer({
        "bootstrap.servers": bootstrap, "group.id": unique(group),
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
    return got
