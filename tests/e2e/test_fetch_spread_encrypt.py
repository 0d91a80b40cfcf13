"""Encrypted lz4 partitions read back through a real `sluice serve` in front of Apache Kafka:
builtin:encrypt opens a Fetch response's partitions on two filter threads at once (its fetch
side may be called concurrently), and the allowed consumer gets every record as produced, in
each partition's order, while the broker holds only ciphertext. A topic's one large partition
is opened in runs of its batches on the two threads, with the same result."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.e2e.clients import confluent_produce, create_topic, unique
from tests.e2e.filter_threads import (
    PARTITIONS,
    PER_PARTITION,
    consume_large_partition,
    consume_partitions,
    json_values,
    sent_by_partition,
    spread_responses,
    two_thread_config,
)
from tests.harness.ports import free_port
from tests.harness.proxy import SluiceProxy


def encrypt_config(tmp_path: Path, metrics: int, topic: str, key: str,
                   fields: list[str] | None) -> Path:
    """builtin:encrypt on `topic` (produce and fetch) under `key` of a local KMS, whole value
    or `fields`, opened for the tests' anonymous consumer; two filter threads."""
    enc: dict[str, Any] = {"key": key, "decrypt_for": ["User:ANONYMOUS"]}
    if fields:
        enc["fields"] = fields
    return two_thread_config(
        tmp_path, metrics,
        {"name": "enc", "module": "builtin:encrypt", "topics": [topic],
         "apply_to": ["produce", "fetch"], "config": enc},
        kms={"type": "local", "path": str(tmp_path / "keys.json")},
    )


@pytest.mark.parametrize("fields", [None, ["user"]], ids=["whole-value", "fields"])
def test_encrypted_partitions_are_opened_side_by_side_and_arrive_in_order(
    broker: Any, tmp_path: Path, fields: list[str] | None
) -> None:
    topic = unique("spread-enc")
    create_topic(broker.bootstrap, topic, partitions=PARTITIONS)
    metrics = free_port()
    path = encrypt_config(tmp_path, metrics, topic, "spread", fields)
    records = [(f"k{i}".encode(), value)
               for i, value in enumerate(json_values(PARTITIONS * PER_PARTITION, "x" * 120))]
    with SluiceProxy(upstream=broker.bootstrap, config=path) as proxy:
        placed = confluent_produce(proxy.bootstrap, topic, records,
                                   **{"compression.type": "lz4"})
        got = consume_partitions(proxy.bootstrap, topic, PARTITIONS, len(records))
        spread = spread_responses(metrics)
    sent = sent_by_partition(placed, PARTITIONS)
    assert sum(1 for seqs in sent.values() if seqs) >= 3, "keys spread over the partitions"
    for partition, seqs in sent.items():
        values = got[partition]
        assert [v["seq"] for v in values] == seqs, f"partition {partition} out of order"
        for v in values:
            assert v["user"] == f"user{v['seq']}@example.com"
            assert v["note"] == "x" * 120
    # What the broker holds is sealed: read directly, no address is in the clear.
    stored = consume_partitions(broker.bootstrap, topic, PARTITIONS, len(records), decode=False)
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
    path = encrypt_config(tmp_path, metrics, topic, "split", fields)
    count = 20_000
    records = [(None, value) for value in json_values(count, "z" * 120)]
    with SluiceProxy(upstream=broker.bootstrap, config=path) as proxy:
        placed = confluent_produce(proxy.bootstrap, topic, records,
                                   **{"batch.size": 131072, "linger.ms": 20})
        assert [offset for _p, offset in placed] == list(range(count))
        got = consume_large_partition(proxy.bootstrap, topic, count, "split-enc")
        spread = spread_responses(metrics)
    assert [offset for offset, _v in got] == list(range(count)), "offsets out of order"
    for offset, v in got:
        assert v == {"seq": offset, "user": f"user{offset}@example.com", "note": "z" * 120}
    assert spread >= 1, "no Fetch response of the one partition was opened in runs"
