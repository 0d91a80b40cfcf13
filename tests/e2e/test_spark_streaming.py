"""A Spark Structured Streaming query (Spark's `kafka` source and sink, trigger availableNow)
through the Sluice proxy, with builtin:pii-mask bound on fetch to its input topic.

The same query runs twice in one local Spark session (tests/harness/spark_streaming.py): once
reading and writing through the proxy on the raw input, once directly against Kafka on a copy
of the input with the filter applied (read through the proxy by confluent-kafka, partition by
partition, written directly, so offsets line up). Both outputs, read directly from Kafka, must
be equal record for record (output partition, key, value), and no e-mail address may reach
either.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition

from tests.e2e.clients import QUIET, create_topic, unique
from tests.harness.kafka_endpoint import KafkaEndpoint
from tests.harness.proxy import SluiceProxy
from tests.harness.spark_streaming import QueryRun, run_queries

pytestmark = [pytest.mark.spark, pytest.mark.timeout(600)]

SECRET_DOMAIN = "@example.com"
MASK_INPUT = """
filters:
  - name: mask-input
    module: builtin:pii-mask
    topics: ["ssf.*"]
    apply_to: [fetch]
"""
PARTITIONS = 2

Row = tuple[int, bytes | None, bytes]  # (partition, key, value)


@pytest.fixture(scope="module")
def masking_proxy(
    broker: KafkaEndpoint, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[SluiceProxy]:
    cfg = tmp_path_factory.mktemp("spark-masking") / "sluice.yaml"
    cfg.write_text(MASK_INPUT)
    with SluiceProxy(upstream=broker.bootstrap, config=cfg) as p:
        yield p


def produce(bootstrap: str, topic: str, rows: list[Row]) -> None:
    """Each row to its own partition, in order (no idempotence needed: one try each)."""
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, **QUIET})
    errors: list[str] = []

    def report(err: KafkaError | None, _msg: object) -> None:
        if err is not None:
            errors.append(str(err))

    for partition, key, value in rows:
        producer.produce(topic, value=value, key=key, partition=partition, on_delivery=report)
    assert producer.flush(30) == 0 and not errors, errors


def read_all(bootstrap: str, topic: str) -> list[Row]:
    """Every record of every partition of `topic` to its end, partition by partition."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": unique("ss-read"),
                         "enable.auto.commit": False, "enable.partition.eof": True, **QUIET})
    try:
        consumer.assign([TopicPartition(topic, p, 0) for p in range(PARTITIONS)])
        out: list[Row] = []
        ended: set[int] = set()
        for _ in range(400):
            msg = consumer.poll(0.25)
            if msg is None:
                continue
            error, partition = msg.error(), msg.partition()
            assert partition is not None
            if error is not None:
                if error.code() == KafkaError._PARTITION_EOF:
                    ended.add(partition)
                    if len(ended) == PARTITIONS:
                        return out
                    continue
                raise AssertionError(error)
            value = msg.value()
            assert value is not None
            out.append((partition, msg.key(), value))
        raise AssertionError(f"no end of {topic} within 100 s (got {len(out)})")
    finally:
        consumer.close()


def test_structured_streaming_query_through_a_fetch_filter(
    broker: KafkaEndpoint, masking_proxy: SluiceProxy, tmp_path_factory: pytest.TempPathFactory
) -> None:
    raw, masked_copy = unique("ssf.input"), unique("ss.input-masked")
    via_proxy, direct = unique("ss.out-proxy"), unique("ss.out-direct")
    for topic in (raw, masked_copy, via_proxy, direct):
        create_topic(broker.bootstrap, topic, partitions=PARTITIONS)
    # Three kinds of record: with an address (masked), without (unchanged), and one the
    # query's `where` drops.
    rows: list[Row] = []
    for i in range(40):
        kind = i % 4
        text = (f"drop #{i}" if kind == 3 else
                f"order #{i} from user{i}{SECRET_DOMAIN}" if kind < 2 else f"order #{i}")
        rows.append((i % PARTITIONS, f"k{i}".encode(), text.encode()))
    produce(broker.bootstrap, raw, rows)

    # The input with the filter applied: read through the proxy, written directly.
    masked = read_all(masking_proxy.bootstrap, raw)
    assert len(masked) == len(rows)
    original = {(partition, key): value for partition, key, value in rows}
    for partition, key, value in masked:
        assert SECRET_DOMAIN.encode() not in value, value
        before = original[(partition, key)]
        assert (value == before) == (SECRET_DOMAIN.encode() not in before), (before, value)
    produce(broker.bootstrap, masked_copy, masked)

    work = tmp_path_factory.mktemp("spark-streaming")
    report = run_queries([
        QueryRun(masking_proxy.bootstrap, raw, via_proxy, str(work / "cp-proxy")),
        QueryRun(broker.bootstrap, masked_copy, direct, str(work / "cp-direct")),
    ])
    print("spark report:", report)
    assert [r["rows"] for r in report["runs"]] == [len(rows), len(rows)], report

    proxied, straight = read_all(broker.bootstrap, via_proxy), read_all(broker.bootstrap, direct)
    # What the query makes of the masked input: each record but the dropped ones, its value
    # upper-cased after its input partition and offset.
    expected: list[tuple[bytes | None, bytes]] = []
    for partition in range(PARTITIONS):
        in_partition = [(key, value) for p, key, value in masked if p == partition]
        for offset, (key, value) in enumerate(in_partition):
            upper = value.decode().upper()
            if not upper.startswith("DROP"):
                expected.append((key, f"{partition}|{offset}|{upper}".encode()))
    assert len(expected) == len(rows) - len(rows) // 4
    assert sorted((key, value) for _p, key, value in proxied) == sorted(expected)
    # Record for record: the same keys in the same output partitions with the same values.
    # (Two Spark tasks, one per input partition, write to each output partition: their records
    # may interleave differently from run to run, so the sorted lists are compared.)
    assert sorted(proxied) == sorted(straight)
    assert not any(SECRET_DOMAIN.upper().encode() in value for _p, _k, value in proxied)
