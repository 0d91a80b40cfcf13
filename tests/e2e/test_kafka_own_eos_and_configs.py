"""Two of the proxy's own connections on Apache Kafka's SASL_SSL listener with exactly the ACLs
docs/SECURITY.md ("The proxy's own connections") lists: an exactly-once transform, and the
DescribeConfigs look-up of the admin filters.

Exactly-once: `sluice transform run` as `sluice-proxy` (SCRAM-SHA-512 over TLS, from the config
file) reads an input whose log holds aborted transactions between committed records, is
killed with SIGKILL under load and restarted; a `read_committed` consumer of the output sees
every committed input record transformed exactly once and nothing of an aborted transaction
(input or the killed process's own), and agrees with the log replayed by hand
(tests/transforms/committed_log.py). Without the documented transactional-id ACL the transform
fails with Kafka's authorization error instead of running.

DescribeConfigs: an IncrementalAlterConfigs through the proxy is judged on the topic's
current config, which the proxy reads itself as `sluice-proxy`; a rewrite's defaults fill only
what is not set on the topic. Without DescribeConfigs on the topic the proxy cannot read it and
refuses the change (POLICY_VIOLATION) instead of judging an empty config.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import (
    AclBinding,
    AclOperation,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    NewTopic,
    ResourceType,
)

from sluice.kafka_security import PROXY_USER
from sluice.proxy.net.kafka_settings import cluster_settings
from sluice.proxy.ops.config_load import build_config
from sluice.transforms.config import with_security
from sluice.transforms.listing import transform_lag
from tests.e2e.clients import QUIET, unique, wait_for_leaders
from tests.harness.kafka_admin import KafkaAdmin, wait_until
from tests.harness.kafka_broker import KafkaCluster
from tests.harness.proxy import SluiceProxy
from tests.transforms.committed_log import committed_records
from tests.transforms.runner_proc import TransformProcess, write_config

pytestmark = pytest.mark.kafka

PRINCIPAL = f"User:{PROXY_USER}"
PARTITIONS = 3
RECORDS = 3000
HOUR_MS = 3_600_000
POLICY_VIOLATION = 44


def admin_conf(kafka: KafkaCluster) -> dict[str, Any]:
    return {**kafka.client_config("SASL_SSL", "admin", "SCRAM-SHA-512"), **QUIET}


def security_yaml(folder: Path, kafka: KafkaCluster) -> str:
    """The config file's `upstream_tls:` and `upstream_sasl:` sections (sluice-proxy)."""
    secret = folder / "sluice-proxy.password"
    secret.write_text(kafka.password(PROXY_USER) + "\n")
    return yaml.safe_dump({
        "upstream_tls": {"ca": str(kafka.ca_cert)},
        "upstream_sasl": {"mechanism": "SCRAM-SHA-512", "username": PROXY_USER,
                          "password_file": str(secret)},
    })


@pytest.fixture
def admin(kafka_broker: KafkaCluster) -> KafkaAdmin:
    return KafkaAdmin(kafka_broker)


def create_topics(kafka: KafkaCluster, *topics: NewTopic) -> None:
    from confluent_kafka.admin import AdminClient

    client = AdminClient(admin_conf(kafka))
    for fut in client.create_topics(list(topics)).values():
        fut.result(30)
    for topic in topics:
        wait_for_leaders(kafka.bootstrap, topic.topic)


# ------------------------------------------------------------------ exactly-once transform


def transform_acls(admin: KafkaAdmin, src: str, dst: str, group: str,
                   transactions: bool = True) -> list[AclBinding]:
    """docs/SECURITY.md's transform lines for `sluice-proxy`."""
    grants = admin.grant(PRINCIPAL, ResourceType.TOPIC, src, AclOperation.READ)
    grants += admin.grant(PRINCIPAL, ResourceType.GROUP, group, AclOperation.READ)
    grants += admin.grant(PRINCIPAL, ResourceType.TOPIC, dst, AclOperation.WRITE)
    if transactions:
        grants += admin.grant(PRINCIPAL, ResourceType.TRANSACTIONAL_ID, group,
                              AclOperation.WRITE, AclOperation.DESCRIBE, prefixed=True)
    return grants


def load(kafka: KafkaCluster, topic: str, done: threading.Event) -> None:
    """RECORDS numbered records (idempotent), and every 500 an aborted transaction holding one
    record per partition; ~400 records/s so that a kill lands mid-load."""
    conf = admin_conf(kafka)
    producer = Producer({**conf, "enable.idempotence": True, "linger.ms": 5})
    aborter = Producer({**conf, "transactional.id": unique("eos-aborts")})
    aborter.init_transactions(30)
    for i in range(RECORDS):
        producer.produce(topic, f"rec-{i:05d}".encode(), f"k{i}".encode(),
                         partition=i % PARTITIONS)
        if i % 100 == 99:
            producer.poll(0)
            if i % 500 == 499:
                aborter.begin_transaction()
                for p in range(PARTITIONS):
                    aborter.produce(topic, f"aborted-{i:05d}-{p}".encode(), partition=p)
                aborter.flush(30)
                aborter.abort_transaction(30)
            time.sleep(0.25)
    assert producer.flush(30) == 0
    done.set()


def read_output(kafka: KafkaCluster, topic: str, isolation: str) -> list[tuple[int, bytes]]:
    consumer = Consumer({**admin_conf(kafka), "group.id": unique("eos-check"),
                         "enable.auto.commit": False, "isolation.level": isolation})
    consumer.assign([TopicPartition(topic, p, 0) for p in range(PARTITIONS)])
    out: list[tuple[int, bytes]] = []
    idle = time.monotonic()
    try:
        while time.monotonic() - idle < 4:
            msg = consumer.poll(0.2)
            if msg is not None and not msg.error():
                out.append((msg.partition() or 0, msg.value() or b""))
                idle = time.monotonic()
    finally:
        consumer.close()
    return out


def caught_up(config: Path, kafka: KafkaCluster) -> bool:
    bootstrap = kafka.bootstrap_for("SASL_SSL")
    host, port = bootstrap.rsplit(":", 1)
    loaded = build_config(("127.0.0.1", 0), [(host, int(port))], config)
    spec = with_security(loaded.transforms[0], cluster_settings(loaded))
    rows = transform_lag(spec, bootstrap)
    # Aborted transactions and their markers take offsets too: at least this many.
    return bool(rows) and all(r.lag == 0 and r.committed >= RECORDS // PARTITIONS for r in rows)


def test_exactly_once_transform_over_sasl_ssl_with_its_acls(
    kafka_broker: KafkaCluster, admin: KafkaAdmin, tmp_path: Path
) -> None:
    kafka = kafka_broker
    src, dst, name = unique("eos-in"), unique("eos-out"), unique("eos-upper")
    group = f"sluice-transform-{name}"
    create_topics(kafka, NewTopic(src, PARTITIONS, 1), NewTopic(dst, PARTITIONS, 1))
    config = write_config(tmp_path, name, [src], dst, guarantee="exactly-once",
                          batch_records=100, extra=security_yaml(tmp_path, kafka))
    grants = transform_acls(admin, src, dst, group)
    bootstrap = kafka.bootstrap_for("SASL_SSL")
    first, restarted = TransformProcess(config, bootstrap), TransformProcess(config, bootstrap)
    done = threading.Event()
    loader = threading.Thread(target=load, args=(kafka, src, done), daemon=True)
    try:
        first.start()
        loader.start()
        first.wait_for("transform_assigned", 60)
        time.sleep(2)  # some batches committed, one likely open
        first.kill9()
        assert not done.is_set(), "the load finished before the kill: make it longer"
        restarted.start()
        loader.join(90)
        assert done.is_set()
        wait_until(lambda: caught_up(config, kafka), 120, "transform caught up")
        logs = first.output() + restarted.output()
    finally:
        for proc in (first, restarted):
            proc.stop()
        admin.revoke(grants)
    assert kafka.password(PROXY_USER) not in logs
    committed = read_output(kafka, dst, "read_committed")
    raw = read_output(kafka, dst, "read_uncommitted")
    replayed = [(p, v or b"") for p in range(PARTITIONS)
                for _o, _k, v in committed_records(kafka.bootstrap, dst, p)]
    assert sorted(committed) == sorted(replayed), "read_committed differs from the log replay"
    assert not [v for _p, v in raw if v.startswith(b"ABORTED")], "an aborted input record"
    got = Counter(v for _p, v in committed)
    expected = Counter(f"REC-{i:05d}".encode() for i in range(RECORDS))
    assert got == expected, (
        f"lost {sum((expected - got).values())}, duplicated {sum((got - expected).values())}"
    )
    assert all(int(v[4:]) % PARTITIONS == p for p, v in committed)
    print(f"records of the transform's aborted transactions in the output log: "
          f"{len(raw) - len(committed)}")


def test_exactly_once_without_the_transactional_id_acl_fails_with_kafkas_error(
    kafka_broker: KafkaCluster, admin: KafkaAdmin, tmp_path: Path
) -> None:
    kafka = kafka_broker
    src, dst, name = unique("eos-in"), unique("eos-out"), unique("eos-denied")
    group = f"sluice-transform-{name}"
    create_topics(kafka, NewTopic(src, 1, 1), NewTopic(dst, 1, 1))
    config = write_config(tmp_path, name, [src], dst, guarantee="exactly-once",
                          extra=security_yaml(tmp_path, kafka))
    grants = transform_acls(admin, src, dst, group, transactions=False)
    proc = TransformProcess(config, kafka.bootstrap_for("SASL_SSL"))
    try:
        producer = Producer(admin_conf(kafka))
        producer.produce(src, b"x")
        assert producer.flush(30) == 0
        proc.start()
        proc.wait_for("TRANSACTIONAL_ID_AUTHORIZATION_FAILED", 60)
    finally:
        proc.stop()
        admin.revoke(grants)
    assert read_output(kafka, dst, "read_uncommitted") == []


# ------------------------------------------------------------------ DescribeConfigs look-up


@pytest.fixture
def policed(kafka_broker: KafkaCluster, tmp_path: Path) -> Iterator[SluiceProxy]:
    """A proxy on SASL_SSL whose admin filter rewrites rw-* topics: retention.ms defaults to
    one day where the topic does not set it."""
    config = tmp_path / "sluice.yaml"
    policy = {"name": "topic-shaper", "module": "builtin:topic-policy", "topics": ["rw-*"],
              "apply_to": ["admin"],
              "config": {"defaults": {"retention.ms": str(24 * HOUR_MS)}}}
    config.write_text(security_yaml(tmp_path, kafka_broker)
                      + yaml.safe_dump({"filters": [policy]}))
    with SluiceProxy(upstream=kafka_broker.bootstrap_for("SASL_SSL"), config=config) as proxy:
        yield proxy


def alter_through(proxy: SluiceProxy, kafka: KafkaCluster, *topics: str
                  ) -> dict[str, KafkaException | None]:
    """IncrementalAlterConfigs cleanup.policy=compact on `topics`, as admin through the proxy
    (its own SASL, relayed)."""
    from confluent_kafka.admin import AdminClient

    client = AdminClient({"bootstrap.servers": proxy.bootstrap, **QUIET,
                          "security.protocol": "SASL_PLAINTEXT",
                          "sasl.mechanism": "SCRAM-SHA-512", "sasl.username": "admin",
                          "sasl.password": kafka.password("admin")})
    resources = [ConfigResource("topic", t, incremental_configs=[ConfigEntry(
        "cleanup.policy", "compact", incremental_operation=AlterConfigOpType.SET)])
        for t in topics]
    out: dict[str, KafkaException | None] = {}
    for resource, future in client.incremental_alter_configs(resources).items():
        try:
            future.result(20)
            out[resource.name] = None
        except KafkaException as exc:
            out[resource.name] = exc
    return out


def configs(kafka: KafkaCluster, topic: str, expect: dict[str, str] | None = None
            ) -> dict[str, str | None]:
    from confluent_kafka.admin import AdminClient

    deadline = time.monotonic() + 5
    while True:  # Kafka applies a change through its metadata log: read until it shows
        client = AdminClient(admin_conf(kafka))
        (future,) = client.describe_configs([ConfigResource("topic", topic)]).values()
        found = {name: entry.value for name, entry in future.result(10).items()}
        if not expect or all(found.get(k) == v for k, v in expect.items()):
            return found
        if time.monotonic() > deadline:
            return found
        time.sleep(0.05)


def test_config_look_up_over_sasl_ssl_with_the_documented_acl(
    kafka_broker: KafkaCluster, admin: KafkaAdmin, policed: SluiceProxy
) -> None:
    kafka = kafka_broker
    own, bare = unique("rw-own"), unique("rw-bare")
    create_topics(kafka, NewTopic(own, 1, 1, config={"retention.ms": str(48 * HOUR_MS)}),
                  NewTopic(bare, 1, 1))
    # docs/SECURITY.md: Describe and DescribeConfigs on every topic.
    grants = admin.grant(PRINCIPAL, ResourceType.TOPIC, "*", AclOperation.DESCRIBE,
                         AclOperation.DESCRIBE_CONFIGS)
    try:
        assert alter_through(policed, kafka, own, bare) == {own: None, bare: None}
    finally:
        admin.revoke(grants)
    assert configs(kafka, own, {"cleanup.policy": "compact"})["retention.ms"] == str(48 * HOUR_MS)
    assert configs(kafka, bare, {"cleanup.policy": "compact"})["retention.ms"] == str(
        24 * HOUR_MS)
    output = "".join(policed.output)
    assert "Traceback" not in output and kafka.password(PROXY_USER) not in output


def test_without_describe_configs_the_alter_is_refused_not_guessed(
    kafka_broker: KafkaCluster, admin: KafkaAdmin, policed: SluiceProxy
) -> None:
    kafka = kafka_broker
    own = unique("rw-own")
    create_topics(kafka, NewTopic(own, 1, 1, config={"retention.ms": str(48 * HOUR_MS)}))
    # Describe only (topic ids): the proxy may not read the topic's config.
    grants = admin.grant(PRINCIPAL, ResourceType.TOPIC, "*", AclOperation.DESCRIBE)
    try:
        result = alter_through(policed, kafka, own)[own]
    finally:
        admin.revoke(grants)
    assert result is not None, "the alter was judged on a config the proxy could not read"
    err = result.args[0]
    assert err.code() == POLICY_VIOLATION, err
    assert "cannot read current config" in err.str(), err.str()
    found = configs(kafka, own)
    assert found["retention.ms"] == str(48 * HOUR_MS) and found["cleanup.policy"] == "delete"
    output = "".join(policed.output)
    failed = [line for line in policed.output if "admin_current_config_failed" in line]
    assert failed and "TOPIC_AUTHORIZATION_FAILED" in failed[-1], output[-2000:]
    assert kafka.password(PROXY_USER) not in output and "Traceback" not in output
