"""Encrypted lz4 partitions read back through a real `sluice serve` in front of Apache Kafka:
builtin:encrypt opens a Fetch response's partitions on two filter threads at once (its fetch
side may be called concurrently), and the allowed consumer gets every record as produced, in
each partition's order, while the broker holds only ciphertext. A topic's one large partition
is opened in runs of its batches on the two threads, with the same result."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from confluent_kafka import Consumer, TopicPartition

from tests.e2e.clients import QUIET, confluent_produce, create_topic, unique
from tests.e2e.test_fetch_spread import PARTITIONS, PER_PARTITION, consume_all, spread_responses
from tests.harness.ports import free_port
from tests.harness.proxy import SluiceProxy


@pytest.mark.parametrize("fields", [None, ["user"]], ids=["whole-value", "fields"])
def test_encrypted_partitions_are_opened_side_by_side_and_arrive_in_order(
    broker: Any, tmp_path: Path, fields: list[str] | None
) -> None:
    topic = unique("spread-enc")
    create_topic(broker.bootstrap, topic, partitions=PARTITIONS)
    metrics = free_port()
    enc: dict[str, Any] = {"key": "spread", "decrypt_for": ["User:ANONYMOUS"]}
    if fields:
        enc["fields"] = fields
    config = {
        "metrics": {"listen": f"127.0.0.1:{metrics}"},
        "kms": {"type": "local", "path": str(tmp_path / "keys.json")},
        "proxy": {"filter_threads": 2},
        "filters": [{"name": "enc", "module": "builtin:encrypt", "topics": [topic],
                     "apply_to": ["produce", "fetch"], "config": enc}],
    }
    path = tmp_path / "sluice.yaml"
    path.write_text(yaml.safe_dump(config), encoding="utf-8")
    records = [
        (f"k{i}".encode(), json.dumps({
            "seq": i, "user": f"user{i}@example.com", "note": "x" * 120,
        }).encode())
        for i in range(PARTITIONS * PER_PARTITION)
    ]
    with SluiceProxy(upstream=broker.bootstrap, config=path) as proxy:
        placed = confluent_produce(proxy.bootstrap, topic, records,
                                   **{"compression.type": "lz4"})
        got = consume_all(proxy.bootstrap, topic, len(records))
        spread = spread_responses(metrics)
    sent: dict[int, list[int]] = {p: [] for p in range(PARTITIONS)}
    for i, (partition, _offset) in enumerate(placed):
        sent[partition].append(i)
    assert sum(1 for seqs in sent.values() if seqs) >= 3, "keys spread over the partitions"
    for partition, seqs in sent.items():
        values = got[partition]
        assert [v["seq"] for v in values] == seqs, f"partition {partition} out of order"
        for v in values:
            assert v["user"] == f"user{v['seq']}@example.com"
            assert v["note"] == "x" * 120
    # What the broker holds is sealed: read directly, no address is in the clear.
    stored = consume_all(broker.bootstrap, topic, len(records), decode=False)
    assert sum(len(v) for v in stored.values()) == len(records)
    assert not any(b"@example.com" in raw for v in stored.values() for raw in v)
    assert spread >= 1, "no Fetch response was opened on two threads"


@pytest.mark.parametrize("fields", [None, ["user"]], ids=["whole-value", "fields"])
def test_one_large_encrypted_partition_is_opened_in_runs_and_arrives_in_order(
    broker: Any, tmp_path: Path, fields: list[str] | None
) -> None:
    """One uncompressed partition sealed in batches of ~128 KiB, read with fetch sizes that
    bring several MiB in one response: with one partition, a response opened on two threads
    was cut into runs of batches."""
    topic = unique("split-enc")
    create_topic(broker.bootstrap, topic, partitions=1)
    metrics = free_port()
    enc: dict[str, Any] = {"key": "split", "decrypt_for": ["User:ANONYMOUS"]}
    if fields:
        enc["fields"] = fields
    config = {
        "metrics": {"listen": f"127.0.0.1:{metrics}"},
        "kms": {"type": "local", "path": str(tmp_path / "keys.json")},
        "proxy": {"filter_threads": 2},
        "filters": [{"name": "enc", "module": "builtin:encrypt", "topics": [topic],
                     "apply_to": ["produce", "fetch"], "config": enc}],
    }
    path = tmp_path / "sluice.yaml"
    path.write_text(yaml.safe_dump(config), encoding="utf-8")
    count = 20_000
    records = [
        (None, json.dumps({"seq": i, "user": f"user{i}@example.com", "note": "z" * 120}).encode())
        for i in range(count)
    ]
    with SluiceProxy(upstream=broker.bootstrap, config=path) as proxy:
        placed = confluent_produce(proxy.bootstrap, topic, records,
                                   **{"batch.size": 131072, "linger.ms": 20})
        assert [offset for _p, offset in placed] == list(range(count))
        consumer = Consumer({
            "bootstrap.servers": proxy.bootstrap, "group.id": unique("split-enc"),
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
    for offset, v in got:
        assert v == {"seq": offset, "user": f"user{offset}@example.com", "note": "z" * 120}
    assert spread >= 1, "no Fetch response of the one partition was opened in runs"
