"""lz4 batches masked on fetch and recompressed by the proxy (codec/lz4_frame.py, fast frames
without block checksums, as Kafka's producers write them), read by every client: librdkafka
(confluent-kafka), kafka-python (python-lz4), aiokafka (cramjam) and the Java client, each
getting the masked values, while the broker keeps them in the clear. The consumers ask for
more than `proxy.filtered_fetch_max_bytes`, set to a few batches here, so each of their Fetch
requests goes to the broker with its max_bytes lowered."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
import yaml
from confluent_kafka import Producer

from tests.e2e.clients import (
    QUIET,
    aiokafka_consume,
    confluent_consume,
    create_topic,
    kafka_python_consume,
    unique,
)
from tests.harness.kafka_tools import ClientProbe
from tests.harness.proxy import SluiceProxy

COUNT = 2000
CAP = 16 * 1024  # a few batches a response


@pytest.fixture(scope="module")
def proxy(broker: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[SluiceProxy]:
    path = tmp_path_factory.mktemp("recompressed") / "sluice.yaml"
    path.write_text(yaml.safe_dump({
        "proxy": {"filtered_fetch_max_bytes": CAP},
        "filters": [{"name": "mask", "module": "builtin:pii-mask", "topics": ["rl-*"],
                     "apply_to": ["fetch"]}]}))
    with SluiceProxy(upstream=broker.bootstrap, config=path) as p:
        yield p


def values_of(tag: str) -> list[bytes]:
    return [json.dumps({"email": f"user{i}@{tag}.example.com", "n": i}).encode()
            for i in range(COUNT)]


def produced(broker: Any, tag: str) -> tuple[str, list[bytes]]:
    topic = unique(f"rl-{tag}")
    create_topic(broker.bootstrap, topic, partitions=1)
    values = values_of(tag)
    producer = Producer({"bootstrap.servers": broker.bootstrap, "compression.type": "lz4",
                         "linger.ms": 5, "batch.num.messages": 200, **QUIET})
    for value in values:
        producer.produce(topic, value=value)
    assert producer.flush(60) == 0
    return topic, values


def test_python_clients_read_masked_recompressed_lz4(broker: Any, proxy: SluiceProxy) -> None:
    topic, values = produced(broker, "py")
    assert [v for _k, v in confluent_consume(broker.bootstrap, topic, COUNT)] == values
    masked = [v for _k, v in confluent_consume(proxy.bootstrap, topic, COUNT)]
    assert len(masked) == COUNT and not any(b"example" in v for v in masked)
    assert [json.loads(v)["n"] for v in masked] == list(range(COUNT))
    assert [v for _k, v in kafka_python_consume(proxy.bootstrap, topic, COUNT, None)] == masked
    assert [v for _k, v in aiokafka_consume(proxy.bootstrap, topic, COUNT, None)] == masked


def test_the_java_consumer_reads_masked_recompressed_lz4(
        broker: Any, proxy: SluiceProxy, probe: ClientProbe) -> None:
    topic, values = produced(broker, "java")
    masked = [v for _k, v in confluent_consume(proxy.bootstrap, topic, COUNT)]
    assert masked != values
    got = probe.run("consume", proxy.bootstrap, topic=topic, group=unique("rl-java"),
                    count=COUNT)
    assert got["offsets"] == list(range(COUNT))  # CRCs checked, every record decompressed
    assert [v.encode() for v in got["values"]] == masked
