"""The benchmark's peer variants and its Kafka broker: Kroxylicious really passes records through
(and with its RecordEncryption filter really stores ciphertext that it opens again on fetch),
and a Kafka broker behind the relay advertises the relay, so the relay variant measures the
relay. Real processes: Tansu or Apache Kafka, Kroxylicious's JVM, HAProxy, confluent-kafka."""

from __future__ import annotations

import pytest
from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import AdminClient

from bench import kroxylicious, rig, targets, workload
from tests.harness.broker import TansuBroker
from tests.harness.ports import free_port

needs_jars = pytest.mark.skipif(
    not kroxylicious.available(), reason="Kroxylicious's jars are not installed"
)


def _stored(bootstrap: str, topic: str, count: int) -> list[tuple[bytes, list[str]]]:
    """The values and header names of the first `count` records as the broker stores them."""
    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": "raw", "log_level": 3}
    )
    try:
        consumer.assign([TopicPartition(topic, 0, 0)])
        out: list[tuple[bytes, list[str]]] = []
        for _ in range(200):
            if len(out) >= count:
                break
            for m in consumer.consume(num_messages=count - len(out), timeout=0.2):
                assert m.error() is None, m.error()
                out.append((m.value() or b"", [k for k, _ in m.headers() or []]))
        return out
    finally:
        consumer.close()


def test_config_maps_every_node_id_to_its_own_port() -> None:
    cfg = kroxylicious.config("127.0.0.1:9092", 40000, [111, 3], encrypt=False)
    gateway = cfg["virtualClusters"][0]["gateways"][0]["portIdentifiesNode"]  # type: ignore[index]
    assert gateway["bootstrapAddress"] == "127.0.0.1:40000"
    assert gateway["nodeStartPort"] == 40001
    assert [(r["start"], r["end"]) for r in gateway["nodeIdRanges"]] == [(111, 111), (3, 3)]
    assert "filterDefinitions" not in cfg
    enc = kroxylicious.config("127.0.0.1:9092", 40000, [1], encrypt=True)
    (definition,) = enc["filterDefinitions"]  # type: ignore[misc]
    assert definition["type"] == "RecordEncryption"
    assert enc["defaultFilters"] == ["encrypt"]
    (kek,) = definition["config"]["kmsConfig"]["existingKeks"]
    assert kek["alias"] == definition["config"]["selectorConfig"]["template"]


@needs_jars
@pytest.mark.parametrize("encrypt", [False, True], ids=["pass-through", "record-encryption"])
def test_kroxylicious_carries_records_and_encrypts_them_when_asked(
    broker: TansuBroker, encrypt: bool
) -> None:
    values = workload.json_records(50)
    with kroxylicious.kroxylicious(broker.bootstrap, encrypt=encrypt) as target:
        assert target.pid is not None
        topic = workload.make_topic(target.bootstrap, partitions=1)
        workload.produce(target.bootstrap, topic, values, compression="none")
        read = workload.consume(target.bootstrap, topic, len(values))
        assert read.records == len(values)
        assert targets.cpu_seconds(target.pid) > 0
    stored = _stored(broker.bootstrap, topic, len(values))
    assert len(stored) == len(values)
    if encrypt:
        assert all(b"@example.com" not in value for value, _ in stored)
        assert all(headers == ["kroxylicious.io/encryption"] for _, headers in stored)
    else:
        assert [value for value, _ in stored] == values


@pytest.mark.skipif(not targets.haproxy_available(), reason="haproxy not installed")
def test_a_kafka_broker_behind_the_relay_advertises_the_relay() -> None:
    port = free_port()
    with (
        rig.broker("kafka", advertised_port=port) as bootstrap,
        targets.haproxy_relay(bootstrap, port) as relay,
    ):
        admin = AdminClient({"bootstrap.servers": relay.bootstrap, "log_level": 3})
        brokers = admin.list_topics(timeout=20).brokers
        assert [(b.host, b.port) for b in brokers.values()] == [("127.0.0.1", port)]
        topic = workload.make_topic(relay.bootstrap, partitions=1)
        values = workload.json_records(20)
        workload.produce(relay.bootstrap, topic, values, compression="none")
        assert workload.consume(relay.bootstrap, topic, len(values)).records == len(values)
