"""A consumer reading a masked topic through a real `sluice serve` in front of Apache Kafka: the
Fetch responses' partitions, or runs of the batches of a topic's one partition, are masked on
two filter threads at once (builtin pii-mask keeps no state between calls), and the consumer
gets every record, masked, in each partition's order."""

from __future__ import annotations

from pathlib import Path
from typing import Any

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


def test_masked_partitions_are_filtered_side_by_side_and_arrive_in_order(
    broker: Any, tmp_path: Path
) -> None:
    topic = unique("spread-pii")
    create_topic(broker.bootstrap, topic, partitions=PARTITIONS)
    records = [(f"k{i}".encode(), value)
               for i, value in enumerate(json_values(PARTITIONS * PER_PARTITION, "x" * 120))]
    placed = confluent_produce(broker.bootstrap, topic, records, **{"compression.type": "lz4"})
    sent = sent_by_partition(placed, PARTITIONS)
    assert sum(1 for seqs in sent.values() if seqs) >= 3, "keys spread over the partitions"
    metrics = free_port()
    path = two_thread_config(tmp_path, metrics, {
        "name": "mask", "module": "builtin:pii-mask", "topics": [topic], "apply_to": ["fetch"],
    })
    with SluiceProxy(upstream=broker.bootstrap, config=path) as proxy:
        got = consume_partitions(proxy.bootstrap, topic, PARTITIONS, len(records))
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
    records = [(None, value) for value in json_values(count, "y" * 130)]
    # Batches of ~128 KiB, so that a response holds dozens of them.
    placed = confluent_produce(broker.bootstrap, topic, records,
                               **{"batch.size": 131072, "linger.ms": 20})
    assert [offset for _partition, offset in placed] == list(range(count))
    metrics = free_port()
    path = two_thread_config(tmp_path, metrics, {
        "name": "mask", "module": "builtin:pii-mask", "topics": [topic], "apply_to": ["fetch"],
    })
    with SluiceProxy(upstream=broker.bootstrap, config=path) as proxy:
        got = consume_large_partition(proxy.bootstrap, topic, count, "split")
        spread = spread_responses(metrics)
    assert [offset for offset, _v in got] == list(range(count)), "offsets out of order"
    assert [v["seq"] for _o, v in got] == list(range(count)), "records out of order"
    for _offset, v in got:
        assert "@example.com" not in v["user"], "an e-mail address reached the consumer"
        assert v["note"] == "y" * 130
    assert spread >= 1, "no Fetch response of the one partition was filtered in runs"
