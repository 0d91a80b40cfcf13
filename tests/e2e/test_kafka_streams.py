"""A Kafka Streams application (kafka-streams 4.4.0, exactly-once v2, a repartition topic and a
state store's changelog) through the Sluice proxy, with pii-mask bound on fetch to its input.

The same application runs twice: through the proxy on the raw input, and directly against
Kafka on a copy of the input with the filter applied (read through the proxy, written
directly). Each run's final value per key must be the same, and nothing unmasked gets out.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from confluent_kafka import Consumer, KafkaError, TopicPartition

from tests.e2e.clients import QUIET, confluent_consume, confluent_produce, create_topic, unique
from tests.harness.kafka_broker import KafkaCluster
from tests.harness.kafka_tools import ClientProbe
from tests.harness.proxy import SluiceProxy

pytestmark = pytest.mark.kafka

SECRET_DOMAIN = "@example.com"
MASK_INPUT = """
filters:
  - name: mask-input
    module: builtin:pii-mask
    topics: ["ksf.*"]
    apply_to: [fetch]
"""
CATEGORIES = ("orders", "refunds", "support")


@pytest.fixture(scope="module")
def java(tmp_path_factory: pytest.TempPathFactory) -> ClientProbe:
    return ClientProbe(tmp_path_factory.mktemp("java-streams")).compile()


@pytest.fixture(scope="module")
def masking_proxy(
    kafka_broker: KafkaCluster, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[SluiceProxy]:
    cfg = tmp_path_factory.mktemp("streams-masking") / "sluice.yaml"
    cfg.write_text(MASK_INPUT)
    with SluiceProxy(upstream=kafka_broker.bootstrap, config=cfg) as p:
        yield p


def committed(kafka: KafkaCluster, topic: str) -> list[tuple[str, str]]:
    """Every (key, value) of partition 0 that a read_committed consumer sees, read directly."""
    consumer = Consumer({"bootstrap.servers": kafka.bootstrap, "group.id": unique("direct"),
                         "enable.auto.commit": False, "isolation.level": "read_committed",
                         "enable.partition.eof": True, **QUIET})
    try:
        consumer.assign([TopicPartition(topic, 0, 0)])
        out: list[tuple[str, str]] = []
        for _ in range(200):
            msg = consumer.poll(0.5)
            if msg is None:
                continue
            error = msg.error()
            if error is not None:
                if error.code() == KafkaError._PARTITION_EOF:
                    return out
                raise AssertionError(error)
            key, value = msg.key(), msg.value()
            assert key is not None and value is not None
            out.append((key.decode(), value.decode()))
        raise AssertionError(f"no end of {topic} within 100 s")
    finally:
        consumer.close()


def run_app(java: ClientProbe, bootstrap: str, source: str, sink: str, count: int,
            state_dir: str) -> dict[str, object]:
    app = unique("streams-app")
    out = java.run_main("StreamsProbe", "--bootstrap", bootstrap, "--application-id", app,
                        "--input", source, "--output", sink, "--records", str(count),
                        "--state-dir", state_dir, timeout=180)
    assert out["failure"] == "" and out["finished"] is True, out
    assert out["processed"] == count, out
    topics = out["topics"]
    assert isinstance(topics, list)
    assert f"{app}-by-category-repartition" in topics, topics
    assert f"{app}-per-category-changelog" in topics, topics
    return out


def test_kafka_streams_eos_v2_through_a_fetch_filter(
    kafka_broker: KafkaCluster, masking_proxy: SluiceProxy, java: ClientProbe,
    tmp_path_factory: pytest.TempPathFactory
) -> None:
    raw, filtered_copy = unique("ksf.input"), unique("ks.input-masked")
    via_proxy, direct = unique("ks.out-proxy"), unique("ks.out-direct")
    for topic in (raw, filtered_copy, via_proxy, direct):
        create_topic(kafka_broker.bootstrap, topic)
    records = [(f"k{i}".encode(),
                f"{CATEGORIES[i % 3]} #{i} from user{i}{SECRET_DOMAIN}".encode())
               for i in range(30)]
    confluent_produce(kafka_broker.bootstrap, raw, records)
    # the input with the filter applied: read through the proxy, written directly
    masked = confluent_consume(masking_proxy.bootstrap, raw, len(records))
    assert len(masked) == 30 and not any(SECRET_DOMAIN.encode() in (v or b"") for _, v in masked)
    confluent_produce(kafka_broker.bootstrap, filtered_copy, masked)

    state = tmp_path_factory.mktemp("streams-state")
    run_app(java, masking_proxy.bootstrap, raw, via_proxy, 30, str(state / "proxy"))
    run_app(java, kafka_broker.bootstrap, filtered_copy, direct, 30, str(state / "direct"))

    proxied, straight = committed(kafka_broker, via_proxy), committed(kafka_broker, direct)
    final_proxied, final_straight = dict(proxied), dict(straight)
    assert set(final_proxied) == set(CATEGORIES)
    assert final_proxied == final_straight
    for category in CATEGORIES:
        assert final_proxied[category].startswith("n=10;"), final_proxied[category]
    assert not any(SECRET_DOMAIN in v for _, v in proxied + straight)
