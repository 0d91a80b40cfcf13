"""The Java client (`kafka-clients` 4.4.0) through the Sluice proxy in front of Apache Kafka.

`tests/java/ClientProbe.java`, compiled by the test against the installed jars, is the client:
idempotent and transactional producers, consumers with the classic and the KIP-848 `consumer`
group protocols, the Admin client, and the KIP-932 share consumer. What reached the broker is
read back directly from Kafka (confluent-kafka), never through the proxy.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from confluent_kafka import Consumer, KafkaError, TopicPartition

from tests.e2e.clients import QUIET, create_topic, unique
from tests.harness.kafka_broker import KafkaCluster
from tests.harness.kafka_tools import ClientProbe
from tests.harness.ports import free_port
from tests.harness.proxy import SluiceProxy
from tests.harness.raw_kafka import scrape, series
from tests.proxy.test_reload import events

pytestmark = pytest.mark.kafka

# builtin:pii-mask on produce for `jp.*` topics and on fetch for `jf.*` topics.
MASKING = """
filters:
  - name: mask-in
    module: builtin:pii-mask
    topics: ["jp.*"]
    apply_to: [produce]
  - name: mask-out
    module: builtin:pii-mask
    topics: ["jf.*"]
    apply_to: [fetch]
"""
SECRET = "alice@example.com"


def secret_values(tag: str, count: int) -> list[str]:
    return [f"{tag} {i} mail {SECRET}" for i in range(count)]


@pytest.fixture(scope="module")
def proxy(kafka_broker: KafkaCluster) -> Iterator[SluiceProxy]:
    """A proxy with no filters in front of the session's Kafka node."""
    with SluiceProxy(upstream=kafka_broker.bootstrap) as p:
        yield p


@pytest.fixture(scope="module")
def metrics_port() -> int:
    return free_port()


@pytest.fixture(scope="module")
def masking_proxy(
    kafka_broker: KafkaCluster, tmp_path_factory: pytest.TempPathFactory, metrics_port: int
) -> Iterator[SluiceProxy]:
    cfg = tmp_path_factory.mktemp("java-masking") / "sluice.yaml"
    cfg.write_text(MASKING + f"metrics:\n  listen: 127.0.0.1:{metrics_port}\n")
    with SluiceProxy(upstream=kafka_broker.bootstrap, config=cfg) as p:
        yield p


def requests_seen(metrics_port: int, api: str) -> float:
    """`sluice_requests_total` of one API, from the masking proxy's /metrics."""
    return sum(float(line.rsplit(" ", 1)[1])
               for line in series(scrape(metrics_port), "sluice_requests_total")
               if f'api="{api}"' in line)


def stored(kafka: KafkaCluster, topic: str, isolation: str = "read_uncommitted") -> list[str]:
    """Every value of partition 0 as Kafka holds it, read directly (no proxy) to its end."""
    consumer = Consumer({"bootstrap.servers": kafka.bootstrap, "group.id": unique("direct"),
                         "enable.auto.commit": False, "isolation.level": isolation,
                         "enable.partition.eof": True, **QUIET})
    try:
        consumer.assign([TopicPartition(topic, 0, 0)])
        out: list[str] = []
        for _ in range(200):
            msg = consumer.poll(0.5)
            if msg is None:
                continue
            error = msg.error()
            if error is not None:
                if error.code() == KafkaError._PARTITION_EOF:
                    return out
                raise AssertionError(error)
            value = msg.value()
            assert value is not None
            out.append(value.decode())
        raise AssertionError(f"no end of {topic} within 100 s, read {len(out)}")
    finally:
        consumer.close()


def test_idempotent_producer_through_the_proxy(
    kafka_broker: KafkaCluster, proxy: SluiceProxy, probe: ClientProbe
) -> None:
    topic = unique("java.idem")
    create_topic(kafka_broker.bootstrap, topic)
    values = [f"idempotent {i}" for i in range(50)]
    out = probe.run("produce", proxy.bootstrap, values, topic=topic, idempotent=True)
    assert out["idempotent"] is True
    assert out["offsets"] == list(range(50))
    assert stored(kafka_broker, topic) == values


@pytest.mark.parametrize(("protocol", "group_type"), [("classic", "Classic"),
                                                      ("consumer", "Consumer")])
def test_consumer_group_protocols_through_the_proxy(
    kafka_broker: KafkaCluster, proxy: SluiceProxy, probe: ClientProbe, protocol: str,
    group_type: str
) -> None:
    topic = unique("java.group")
    create_topic(kafka_broker.bootstrap, topic)
    values = [f"{protocol} {i}" for i in range(20)]
    probe.run("produce", proxy.bootstrap, values, topic=topic)
    group = unique(f"java-{protocol}")
    out = probe.run("consume", proxy.bootstrap, topic=topic, group=group, protocol=protocol,
                    count=len(values))
    assert out["values"] == values
    # the broker itself says which protocol the group runs (asked through the proxy)
    assert out["group_type"] == group_type
    assert out["members"] == 1 and out["generation"] >= 1
    # the commit went through the proxy: a second member of the group reads nothing new
    again = probe.run("consume", proxy.bootstrap, topic=topic, group=group, protocol=protocol,
                      count=1, timeout_ms=3000)
    assert again["values"] == []


def test_transactional_producer_commit_and_abort(
    kafka_broker: KafkaCluster, proxy: SluiceProxy, probe: ClientProbe
) -> None:
    topic = unique("java.txn")
    create_topic(kafka_broker.bootstrap, topic)
    lines = ["commit:c1", "commit:c2", "abort:a1", "abort:a2", "commit:c3", "abort:a3"]
    out = probe.run("transactional", proxy.bootstrap, lines, topic=topic,
                    transactional_id=unique("java-tx"))
    assert out["transactions"] == ["commit", "abort", "commit", "abort"]
    # the aborted records are in the log (read_uncommitted sees them) ...
    assert stored(kafka_broker, topic) == ["c1", "c2", "a1", "a2", "c3", "a3"]
    assert stored(kafka_broker, topic, "read_committed") == ["c1", "c2", "c3"]
    # ... and a read_committed Java consumer through the proxy never sees them
    got = probe.run("consume", proxy.bootstrap, topic=topic, group=unique("java-rc"),
                    isolation="read_committed", count=3, timeout_ms=8000)
    assert got["values"] == ["c1", "c2", "c3"]


def test_admin_client_through_the_proxy(
    kafka_broker: KafkaCluster, proxy: SluiceProxy, probe: ClientProbe
) -> None:
    topic = unique("java.admin")
    out = probe.run("admin", proxy.bootstrap, topic=topic, partitions=3)
    assert out["partitions"] == 3 and out["listed"] is True
    assert out["cluster_nodes"] == 1
    assert out["retention_before"] == "604800000"  # Kafka's default, a DEFAULT_CONFIG entry
    assert out["retention_after"] == "4321000"
    assert out["cleanup_policy_after"] == "compact"
    # and it is the broker that holds the change
    from confluent_kafka.admin import AdminClient, ConfigResource

    admin = AdminClient({"bootstrap.servers": kafka_broker.bootstrap, **QUIET})
    (future,) = admin.describe_configs([ConfigResource(ConfigResource.Type.TOPIC, topic)]).values()
    configs = future.result(30)
    assert configs["retention.ms"].value == "4321000"
    assert configs["cleanup.policy"].value == "compact"


def test_produce_filter_masks_what_java_producers_store(
    kafka_broker: KafkaCluster, masking_proxy: SluiceProxy, probe: ClientProbe
) -> None:
    idem, txn = unique("jp.idem"), unique("jp.txn")
    for topic in (idem, txn):
        create_topic(kafka_broker.bootstrap, topic)
    values = secret_values("idem", 5)
    out = probe.run("produce", masking_proxy.bootstrap, values, topic=idem, idempotent=True)
    assert out["offsets"] == list(range(5))
    lines = [f"commit:{v}" for v in secret_values("txn", 3)] + ["abort:aborted " + SECRET]
    probe.run("transactional", masking_proxy.bootstrap, lines, topic=txn,
              transactional_id=unique("java-tx"))
    for topic, count in ((idem, 5), (txn, 4)):
        held = stored(kafka_broker, topic)
        assert len(held) == count, held
        assert not any(SECRET in v for v in held), held
        assert all("*****@*******.***" in v for v in held), held
    assert len(stored(kafka_broker, txn, "read_committed")) == 3


def test_fetch_filter_masks_what_the_java_consumer_reads(
    kafka_broker: KafkaCluster, masking_proxy: SluiceProxy, probe: ClientProbe
) -> None:
    topic = unique("jf.classic")
    create_topic(kafka_broker.bootstrap, topic)
    values = secret_values("fetch", 5)
    probe.run("produce", kafka_broker.bootstrap, values, topic=topic)
    for protocol in ("classic", "consumer"):
        got = probe.run("consume", masking_proxy.bootstrap, topic=topic, protocol=protocol,
                        group=unique(f"jf-{protocol}"), count=5)
        assert len(got["values"]) == 5
        assert not any(SECRET in v for v in got["values"]), got
    assert stored(kafka_broker, topic) == values  # stored in the clear: the proxy masked it


def test_share_consumer_through_the_proxy(
    kafka_broker: KafkaCluster, proxy: SluiceProxy, probe: ClientProbe
) -> None:
    """KIP-932: Kafka 4.4 formats with share.version=2, so share groups are on."""
    topic = unique("java.share")
    create_topic(kafka_broker.bootstrap, topic)
    values = secret_values("share", 10)
    probe.run("produce", kafka_broker.bootstrap, values, topic=topic)
    out = probe.run("share", proxy.bootstrap, topic=topic, group=unique("java-share"), count=10)
    assert sorted(out["values"]) == sorted(values), out


def test_share_consumer_gets_no_unmasked_record_under_a_fetch_filter(
    kafka_broker: KafkaCluster, masking_proxy: SluiceProxy, probe: ClientProbe, metrics_port: int
) -> None:
    """ShareFetch returns records the fetch path does not filter: with a fetch filter bound
    the proxy hides it, and the Java share consumer gets nothing (and no record in the clear)."""
    topic = unique("jf.share")
    create_topic(kafka_broker.bootstrap, topic)
    values = secret_values("share", 5)
    probe.run("produce", kafka_broker.bootstrap, values, topic=topic)
    out = probe.run("share", masking_proxy.bootstrap, topic=topic, group=unique("jf-share"),
                    count=5, timeout_ms=8000)
    assert not any(SECRET in v for v in out["values"]), out
    assert out["values"] == [], out
    # The client joined its share group through the proxy, which does not advertise
    # ShareFetch: the client never sent one. (Before the proxy answered ApiVersions v5 itself,
    # the 4.4 client got the broker's list unfiltered and sent ShareFetch; each one closed its
    # connection, and it reconnected every 100 ms.)
    assert requests_seen(metrics_port, "share_group_heartbeat") > 0
    assert requests_seen(metrics_port, "share_fetch") == 0
    refused = [e for e in events(masking_proxy, "connection_closed_protocol_violation")
               if "SHARE_FETCH" in e.get("reason", "")]
    assert refused == []
