"""Apache Kafka started from its Maven Central jars: every listener, ACLs, SASL failures, the
three-node cluster, and the Sluice proxy in front of it.

confluent-kafka (librdkafka) is the client throughout. The ACL set-up is the realistic one:
`alice` may use topics and groups whose names start with `alice.`, `bob` has no ACL at all,
and `admin` is a super user.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaError, Producer
from confluent_kafka.admin import (
    AclBinding,
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    AdminClient,
    NewTopic,
    ResourcePatternType,
    ResourceType,
)

from sluice import kafka_broker
from tests.harness.kafka_broker import (
    KAFKA39_VERSION,
    KafkaCluster,
    KafkaNotInstalled,
    KafkaStartError,
)
from tests.harness.kafka_endpoint import session_kafka_version
from tests.harness.proxy import SluiceProxy

pytestmark = pytest.mark.kafka

QUIET = {"log_level": 0}
ALICE_PREFIX = "alice."


def unique(prefix: str) -> str:
    return f"{prefix}{uuid.uuid4().hex[:8]}"


def admin_client(kafka: KafkaCluster) -> AdminClient:
    return AdminClient({**kafka.client_config("SASL_PLAINTEXT", "admin", "SCRAM-SHA-512")})


def create_topic(kafka: KafkaCluster, name: str, partitions: int = 1, replicas: int = 1) -> None:
    admin = admin_client(kafka)  # kept referenced: its futures fail once it is destroyed
    futures = admin.create_topics([NewTopic(name, partitions, replicas)])
    for fut in futures.values():
        fut.result(30)


def settled_partitions(
    admin: AdminClient, topic: str, replicas: int, timeout: float = 30
) -> list[Any]:
    """The topic's partitions once each has a leader and all its replicas in sync: Kafka
    answers CreateTopics before every broker's metadata has the new partitions (Tansu does not
    make a client wait for that)."""
    deadline = time.monotonic() + timeout
    while True:
        meta = admin.list_topics(topic, timeout=30).topics[topic]
        parts = list(meta.partitions.values())
        if (
            meta.error is None
            and parts
            and all(p.leader >= 0 and len(p.isrs) == replicas for p in parts)
        ):
            return parts
        assert time.monotonic() < deadline, (meta.error, [(p.id, p.leader, p.isrs) for p in parts])
        time.sleep(0.2)


def produce(conf: dict[str, Any], topic: str, values: list[bytes]) -> list[KafkaError | None]:
    """Produce `values` and wait for every delivery report; the error of each (None: ok)."""
    producer = Producer({"linger.ms": 5, "message.timeout.ms": 20000, **QUIET, **conf})
    reports: list[KafkaError | None] = []
    for value in values:
        producer.produce(topic, value=value, on_delivery=lambda err, _msg: reports.append(err))
    assert producer.flush(60) == 0, "records still undelivered after 60 s"
    return reports


def consume(conf: dict[str, Any], topic: str, group: str, count: int) -> list[bytes]:
    consumer = Consumer({**conf, **QUIET, "group.id": group, "auto.offset.reset": "earliest"})
    consumer.subscribe([topic])
    values: list[bytes] = []
    deadline = time.monotonic() + 60  # the first group also creates __consumer_offsets
    try:
        while len(values) < count and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is None:
                continue
            assert msg.error() is None, msg.error()
            values.append(msg.value())
    finally:
        consumer.close()
    return values


def client_errors(conf: dict[str, Any], until: Callable[[KafkaError], bool]) -> list[KafkaError]:
    """What the client's error callback reports while it tries to reach the cluster, until
    an error `until` accepts (or 20 s)."""
    seen: list[KafkaError] = []
    producer = Producer({**conf, **QUIET, "error_cb": seen.append})
    deadline = time.monotonic() + 20
    while not any(until(e) for e in seen) and time.monotonic() < deadline:
        producer.poll(0.2)
    producer.flush(0)
    return seen


@pytest.fixture(scope="module")
def kafka(kafka_broker: KafkaCluster) -> Iterator[KafkaCluster]:
    """The session's single node, with ACLs for alice on her prefix (topics and groups)."""
    fields = [
        (
            resource,
            ALICE_PREFIX,
            ResourcePatternType.PREFIXED,
            "User:alice",
            "*",
            AclOperation.ALL,
            AclPermissionType.ALLOW,
        )
        for resource in (ResourceType.TOPIC, ResourceType.GROUP)
    ]
    admin = admin_client(kafka_broker)
    for fut in admin.create_acls([AclBinding(*f) for f in fields]).values():
        fut.result(30)
    yield kafka_broker
    for fut in admin.delete_acls([AclBindingFilter(*f) for f in fields]).values():
        fut.result(30)


def test_the_pinned_kafka_version_is_what_runs(kafka: KafkaCluster) -> None:
    log = kafka.log_tail(1, lines=10_000)
    assert f"Kafka version: {kafka.version}" in log
    assert kafka.version == session_kafka_version()  # 3.9 with SLUICE_E2E_BROKER=kafka39
    assert kafka.start_seconds > 0


@pytest.mark.parametrize(
    ("listener", "user", "mechanism"),
    [
        ("PLAINTEXT", None, "PLAIN"),
        ("SASL_PLAINTEXT", "alice", "PLAIN"),
        ("SASL_PLAINTEXT", "alice", "SCRAM-SHA-512"),
        ("SSL", "alice", "PLAIN"),
        ("SASL_SSL", "alice", "PLAIN"),
        ("SASL_SSL", "alice", "SCRAM-SHA-512"),
    ],
)
def test_produce_and_consume_on_every_listener(
    kafka: KafkaCluster, listener: str, user: str | None, mechanism: str
) -> None:
    topic = unique(ALICE_PREFIX)
    create_topic(kafka, topic)
    conf = kafka.client_config(listener, user, mechanism)
    values = [f"{listener}-{mechanism}-{i}".encode() for i in range(5)]
    assert produce(conf, topic, values) == [None] * 5
    assert consume(conf, topic, unique(ALICE_PREFIX), 5) == values


@pytest.mark.parametrize(
    ("listener", "user", "mechanism"),
    [
        # bob has no ACL at all, whichever way he authenticates
        ("SASL_SSL", "bob", "SCRAM-SHA-512"),
        ("SASL_PLAINTEXT", "bob", "PLAIN"),
        # bob's client certificate maps to User:bob, not to a super user
        ("SSL", "bob", "PLAIN"),
        # alice's ACLs cover her prefix only
        ("SASL_PLAINTEXT", "alice", "SCRAM-SHA-512"),
    ],
)
def test_an_acl_denial_reaches_the_client_as_topic_authorization_failed(
    kafka: KafkaCluster, listener: str, user: str, mechanism: str
) -> None:
    topic = unique("private.")
    create_topic(kafka, topic)
    reports = produce(kafka.client_config(listener, user, mechanism), topic, [b"nope"])
    assert len(reports) == 1 and reports[0] is not None
    assert reports[0].code() == KafkaError.TOPIC_AUTHORIZATION_FAILED


@pytest.mark.parametrize("listener", ["SASL_PLAINTEXT", "SASL_SSL"])
@pytest.mark.parametrize("mechanism", ["PLAIN", "SCRAM-SHA-512"])
def test_a_wrong_password_is_an_authentication_error(
    kafka: KafkaCluster, listener: str, mechanism: str
) -> None:
    conf = kafka.client_config(listener, "alice", mechanism)
    conf["sasl.password"] = "not-" + conf["sasl.password"]
    errors = client_errors(conf, until=lambda e: e.code() == KafkaError._AUTHENTICATION)
    assert any(e.code() == KafkaError._AUTHENTICATION for e in errors), errors


def test_without_a_client_certificate_the_ssl_listener_refuses(kafka: KafkaCluster) -> None:
    conf = kafka.client_config("SSL", "alice")
    del conf["ssl.certificate.location"], conf["ssl.key.location"]

    # the broker's TLS alert 42 (bad_certificate): librdkafka reports a transport failure
    def rejected(e: KafkaError) -> bool:
        return e.code() == KafkaError._TRANSPORT and "bad certificate" in e.str()

    errors = client_errors(conf, until=rejected)
    assert any(rejected(e) for e in errors), errors


def test_the_sluice_proxy_in_front_of_kafka_passes_records(kafka: KafkaCluster) -> None:
    topic = unique("through-proxy.")
    values = [f"via-sluice-{i}".encode() for i in range(20)]
    with SluiceProxy(upstream=kafka.bootstrap) as proxy:
        conf = {"bootstrap.servers": proxy.bootstrap}
        admin = AdminClient(conf)
        create = admin.create_topics([NewTopic(topic, 2, 1)])
        for fut in create.values():
            fut.result(30)
        assert produce(conf, topic, values) == [None] * len(values)
        got = consume(conf, topic, unique("group."), len(values))
    assert sorted(got) == sorted(values)


def test_three_nodes_lead_partitions_on_every_node(kafka_cluster: KafkaCluster) -> None:
    assert kafka_cluster.node_ids == [1, 2, 3]
    topic = unique("replicated.")
    create_topic(kafka_cluster, topic, partitions=3, replicas=3)
    parts = settled_partitions(admin_client(kafka_cluster), topic, 3)
    assert {len(p.replicas) for p in parts} == {3}
    assert {p.leader for p in parts} == {1, 2, 3}
    values = [f"rf3-{i}".encode() for i in range(30)]
    conf = kafka_cluster.client_config("SASL_SSL", "admin", "SCRAM-SHA-512")
    assert produce({**conf, "acks": "all"}, topic, values) == [None] * 30
    assert sorted(consume(conf, topic, unique("group."), 30)) == sorted(values)


def test_a_killed_node_restarts_and_rejoins(kafka_cluster: KafkaCluster) -> None:
    topic = unique("survives.")
    create_topic(kafka_cluster, topic, partitions=3, replicas=3)
    settled_partitions(admin_client(kafka_cluster), topic, 3)
    conf = {"bootstrap.servers": kafka_cluster.bootstrap}
    # the node is fenced after broker.session.timeout.ms (6 s), then leaders move
    durable = {**conf, "acks": "all", "message.timeout.ms": 45000}
    victim = 2
    pid = kafka_cluster.node(victim).pid
    kafka_cluster.kill(victim)
    try:
        assert not kafka_cluster.node(victim).running()
        # acks=all with min.insync.replicas=2: two nodes of three still take writes
        values = [f"while-down-{i}".encode() for i in range(10)]
        assert produce(durable, topic, values) == [None] * 10
    finally:
        kafka_cluster.restart(victim)
    assert kafka_cluster.node(victim).pid != pid
    # back in every partition's in-sync replicas
    admin = AdminClient({"bootstrap.servers": kafka_cluster.bootstrap})
    assert all(victim in p.isrs for p in settled_partitions(admin, topic, 3, timeout=60))
    assert sorted(consume(conf, topic, unique("group."), 10)) == sorted(values)


def test_the_sluice_proxy_in_front_of_three_nodes(kafka_cluster: KafkaCluster) -> None:
    """Partitions led by three nodes, each reached through its own proxy node port."""
    topic = unique("replicated-through-proxy.")
    create_topic(kafka_cluster, topic, partitions=3, replicas=3)
    values = [f"rf3-via-sluice-{i}".encode() for i in range(30)]
    with SluiceProxy(upstream=kafka_cluster.bootstrap) as proxy:
        conf = {"bootstrap.servers": proxy.bootstrap}
        admin = AdminClient(conf)
        assert {p.leader for p in settled_partitions(admin, topic, 3)} == {1, 2, 3}
        meta = admin.list_topics(topic, timeout=30)
        ports = {broker.port for broker in meta.brokers.values()}
        assert len(ports) == 3 and all(p != proxy.port for p in ports)
        assert not ports & {int(a.rsplit(":", 1)[1]) for a in kafka_cluster.bootstrap.split(",")}
        assert produce({**conf, "acks": "all"}, topic, values) == [None] * len(values)
        got = consume(conf, topic, unique("group."), len(values))
    assert sorted(got) == sorted(values)


def test_missing_jars_say_how_to_install_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SLUICE_KAFKA_LIBS", str(tmp_path))
    with pytest.raises(KafkaNotInstalled, match=r"scripts/dev\.sh install"):
        KafkaCluster().start()


def test_missing_39_jars_say_how_to_install_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SLUICE_KAFKA39_LIBS", str(tmp_path))
    with pytest.raises(KafkaNotInstalled, match=rf"{KAFKA39_VERSION}.*scripts/dev\.sh install"):
        KafkaCluster(version=KAFKA39_VERSION).start()


def test_an_unknown_version_is_named() -> None:
    with pytest.raises(ValueError, match=r"no Apache Kafka '3\.8\.0'.*4\.4\.0, 3\.9\.2"):
        KafkaCluster(version="3.8.0").start()


def test_a_bad_setting_fails_the_start_with_the_tool_output_and_leaves_nothing_running(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    cluster = KafkaCluster(extra_config={"num.io.threads": "zero"})
    with pytest.raises(KafkaStartError) as failure:
        cluster.start()
    message = str(failure.value)
    assert "StorageTool format failed" in message and "num.io.threads" in message
    assert all(node.process is None for node in cluster.node_list)
    assert cluster.folder is not None and (cluster.folder / "node-1" / "format.log").is_file()
    monkeypatch.setattr(cluster, "keep_files", False)
    monkeypatch.setattr(cluster, "_failed", False)
    cluster.stop()
    assert not cluster.folder.exists()


def test_a_cluster_id_never_starts_with_a_dash(monkeypatch: pytest.MonkeyPatch) -> None:
    """StorageTool would read `-t -xyz...` as an option: such ids are drawn again."""
    dashed = uuid.UUID(bytes=b"\xf8" + bytes(15))  # URL-safe base64 "-A..."
    plain = uuid.UUID(bytes=b"\x04" + bytes(15))
    draws = iter([dashed, plain])
    monkeypatch.setattr(kafka_broker.uuid, "uuid4", lambda: next(draws))
    assert kafka_broker.new_cluster_id() == "BAAAAAAAAAAAAAAAAAAAAA"
