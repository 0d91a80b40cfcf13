"""Kafka's own command-line tools (4.4.0, run from the installed jars) through the Sluice proxy.

`kafka-topics`, `kafka-configs`, `kafka-console-producer`/`-consumer`, `kafka-consumer-groups`,
`kafka-acls` and the two perf tests, each pointed at a `sluice serve` in front of the session's
Kafka node; what they changed is checked directly on Kafka. The data-policy test binds a
policy with `kafka-configs` exactly as docs/CONFIGURATION.md shows.
"""

from __future__ import annotations

import functools
import json
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import KafkaError, Producer
from confluent_kafka.admin import (
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    AdminClient,
    ResourcePatternType,
    ResourceType,
)

from tests.e2e.clients import QUIET, confluent_consume, create_topic, unique
from tests.harness.kafka_broker import KafkaCluster
from tests.harness.kafka_tools import run_tool, write_properties
from tests.harness.proxy import SluiceProxy

pytestmark = pytest.mark.kafka

SECRET = "alice@example.com"
MASKED = "*****@*******.***"
MASKING = """
filters:
  - name: mask-in
    module: builtin:pii-mask
    topics: ["tp.*"]
    apply_to: [produce]
  - name: mask-out
    module: builtin:pii-mask
    topics: ["tf.*"]
    apply_to: [fetch]
"""


@pytest.fixture(scope="module")
def proxy(kafka_broker: KafkaCluster) -> Iterator[SluiceProxy]:
    with SluiceProxy(upstream=kafka_broker.bootstrap) as p:
        yield p


@pytest.fixture(scope="module")
def masking_proxy(
    kafka_broker: KafkaCluster, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[SluiceProxy]:
    cfg = tmp_path_factory.mktemp("tools-masking") / "sluice.yaml"
    cfg.write_text(MASKING)
    with SluiceProxy(upstream=kafka_broker.bootstrap, config=cfg) as p:
        yield p


def stored_values(kafka: KafkaCluster, topic: str, count: int) -> list[str]:
    """`count` values of `topic` read directly from Kafka (no proxy)."""
    return [v.decode() for _, v in confluent_consume(kafka.bootstrap, topic, count)
            if v is not None]


def test_kafka_topics(kafka_broker: KafkaCluster, proxy: SluiceProxy) -> None:
    topic = unique("tools.topics")
    server = ["--bootstrap-server", proxy.bootstrap]
    run_tool("kafka-topics", *server, "--create", "--topic", topic, "--partitions", "3",
             "--replication-factor", "1", "--config", "retention.ms=3600000")
    assert topic in run_tool("kafka-topics", *server, "--list").stdout.split()
    described = run_tool("kafka-topics", *server, "--describe", "--topic", topic).stdout
    assert re.search(r"PartitionCount:\s*3\b", described), described
    assert "retention.ms=3600000" in described
    # every partition's leader is the proxy's view of node 1
    assert len(re.findall(r"Leader: 1\b", described)) == 3, described
    run_tool("kafka-topics", *server, "--alter", "--topic", topic, "--partitions", "5")
    meta = AdminClient({"bootstrap.servers": kafka_broker.bootstrap, **QUIET}).list_topics(
        topic, timeout=30)
    assert len(meta.topics[topic].partitions) == 5
    run_tool("kafka-topics", *server, "--delete", "--topic", topic)
    deadline = time.monotonic() + 30
    while topic in run_tool("kafka-topics", *server, "--list").stdout.split():
        assert time.monotonic() < deadline, "topic still listed 30 s after --delete"
        time.sleep(0.5)


def test_console_producer_consumer_and_consumer_groups(
    kafka_broker: KafkaCluster, proxy: SluiceProxy
) -> None:
    topic, group = unique("tools.console"), unique("tools-group")
    create_topic(kafka_broker.bootstrap, topic, partitions=2)
    server = ["--bootstrap-server", proxy.bootstrap]
    lines = [f"k{i}:console value {i}" for i in range(20)]
    run_tool("kafka-console-producer", *server, "--topic", topic, "--reader-property",
             "parse.key=true", "--reader-property", "key.separator=:",
             input="\n".join(lines) + "\n")
    out = run_tool("kafka-console-consumer", *server, "--topic", topic, "--group", group,
                   "--from-beginning", "--max-messages", "20", "--timeout-ms", "30000",
                   "--formatter-property", "print.key=true", "--formatter-property",
                   "key.separator=:").stdout
    assert sorted(out.splitlines()) == sorted(lines)

    assert group in run_tool("kafka-consumer-groups", *server, "--list").stdout.split()
    described = run_tool("kafka-consumer-groups", *server, "--describe", "--group", group,
                         "--offsets").stdout
    rows = [line.split() for line in described.splitlines() if topic in line]
    # GROUP TOPIC PARTITION CURRENT-OFFSET LOG-END-OFFSET LAG ...
    assert len(rows) == 2 and sum(int(r[3]) for r in rows) == 20, described
    assert all(r[5] == "0" for r in rows), described
    run_tool("kafka-consumer-groups", *server, "--reset-offsets", "--group", group, "--topic",
             topic, "--to-earliest", "--execute")
    described = run_tool("kafka-consumer-groups", *server, "--describe", "--group", group,
                         "--offsets").stdout
    rows = [line.split() for line in described.splitlines() if topic in line]
    assert sum(int(r[5]) for r in rows) == 20, described  # the whole topic is lag again
    deleted = run_tool("kafka-consumer-groups", *server, "--delete", "--group", group).stdout
    assert "was successful" in deleted, deleted
    deadline = time.monotonic() + 15
    while group in run_tool("kafka-consumer-groups", *server, "--list").stdout.split():
        assert time.monotonic() < deadline, "group still listed 15 s after --delete"
        time.sleep(0.5)


def test_console_tools_through_filters(
    kafka_broker: KafkaCluster, masking_proxy: SluiceProxy
) -> None:
    produced, fetched = unique("tp.console"), unique("tf.console")
    for topic in (produced, fetched):
        create_topic(kafka_broker.bootstrap, topic)
    values = [f"console {i} mail {SECRET}" for i in range(5)]
    text = "\n".join(values) + "\n"
    run_tool("kafka-console-producer", "--bootstrap-server", masking_proxy.bootstrap, "--topic",
             produced, input=text)
    held = stored_values(kafka_broker, produced, 5)
    assert len(held) == 5 and all(MASKED in v and SECRET not in v for v in held), held

    run_tool("kafka-console-producer", "--bootstrap-server", kafka_broker.bootstrap, "--topic",
             fetched, input=text)
    out = run_tool("kafka-console-consumer", "--bootstrap-server", masking_proxy.bootstrap,
                   "--topic", fetched, "--from-beginning", "--max-messages", "5",
                   "--timeout-ms", "30000").stdout.splitlines()
    assert len(out) == 5 and all(MASKED in v and SECRET not in v for v in out), out
    assert stored_values(kafka_broker, fetched, 5) == values


def test_kafka_configs_alters_and_describes(
    kafka_broker: KafkaCluster, proxy: SluiceProxy
) -> None:
    topic = unique("tools.configs")
    create_topic(kafka_broker.bootstrap, topic)
    server = ["--bootstrap-server", proxy.bootstrap]
    entity = ["--entity-type", "topics", "--entity-name", topic]
    run_tool("kafka-configs", *server, "--alter", *entity, "--add-config",
             "retention.ms=7200000,max.message.bytes=500000")
    deadline = time.monotonic() + 10
    while True:  # Kafka applies a config change through its metadata log
        out = run_tool("kafka-configs", *server, "--describe", *entity).stdout
        if "retention.ms=7200000" in out:
            break
        assert time.monotonic() < deadline, out
        time.sleep(0.2)
    assert "max.message.bytes=500000" in out
    run_tool("kafka-configs", *server, "--alter", *entity, "--delete-config", "retention.ms")
    deadline = time.monotonic() + 10
    while "retention.ms=" in run_tool("kafka-configs", *server, "--describe", *entity).stdout:
        assert time.monotonic() < deadline
        time.sleep(0.2)


def test_perf_tests(kafka_broker: KafkaCluster, proxy: SluiceProxy) -> None:
    topic = unique("tools.perf")
    create_topic(kafka_broker.bootstrap, topic, partitions=2)
    out = run_tool("kafka-producer-perf-test", "--topic", topic, "--num-records", "2000",
                   "--record-size", "200", "--throughput", "-1", "--producer-props",
                   f"bootstrap.servers={proxy.bootstrap}", "acks=all").stdout
    assert re.search(r"^2000 records sent", out, re.MULTILINE), out
    out = run_tool("kafka-consumer-perf-test", "--bootstrap-server", proxy.bootstrap,
                   "--topic", topic, "--num-records", "2000", "--timeout", "30000").stdout
    # header line, then start.time, end.time, data.consumed.in.MB, MB.sec,
    # data.consumed.in.nMsg, ...
    header, row = out.strip().splitlines()[-2:]
    fields = dict(zip([h.strip() for h in header.split(",")],
                      [v.strip() for v in row.split(",")], strict=False))
    assert int(fields["data.consumed.in.nMsg"]) == 2000, out
    direct = AdminClient({"bootstrap.servers": kafka_broker.bootstrap, **QUIET})
    meta = direct.list_topics(topic, timeout=30).topics[topic]
    assert len(meta.partitions) == 2


# ---------------------------------------------------------------- ACLs on the SASL listener


@pytest.fixture(scope="module")
def sasl_proxy(kafka_broker: KafkaCluster) -> Iterator[SluiceProxy]:
    """A proxy whose upstream is Kafka's SASL_PLAINTEXT listener (clients authenticate
    through it as they would to the broker)."""
    with SluiceProxy(upstream=kafka_broker.bootstrap_for("SASL_PLAINTEXT")) as p:
        yield p


def sasl_settings(kafka: KafkaCluster, user: str) -> dict[str, str]:
    password = kafka.password(user)
    return {
        "security.protocol": "SASL_PLAINTEXT",
        "sasl.mechanism": "SCRAM-SHA-512",
        "sasl.jaas.config": "org.apache.kafka.common.security.scram.ScramLoginModule required "
                            f'username="{user}" password="{password}";',
    }


def produce_as(kafka: KafkaCluster, via: SluiceProxy, user: str, topic: str) -> KafkaError | None:
    conf = kafka.client_config("SASL_PLAINTEXT", user, "SCRAM-SHA-512")
    conf["bootstrap.servers"] = via.bootstrap
    producer = Producer({**conf, **QUIET, "message.timeout.ms": 15000})
    reports: list[KafkaError | None] = []
    producer.produce(topic, b"acl test", on_delivery=lambda err, _msg: reports.append(err))
    assert producer.flush(30) == 0
    return reports[0]


def test_kafka_acls_through_a_proxy_on_the_sasl_listener(
    kafka_broker: KafkaCluster, sasl_proxy: SluiceProxy, tmp_path: Path
) -> None:
    topic = unique("tools.acl")
    create_topic(kafka_broker.bootstrap, topic)
    admin_props = write_properties(tmp_path / "admin.properties",
                                   sasl_settings(kafka_broker, "admin"))
    server = ["--bootstrap-server", sasl_proxy.bootstrap, "--command-config", str(admin_props)]
    # bob has no ACL: the broker's denial reaches him through the proxy as its error code
    error = produce_as(kafka_broker, sasl_proxy, "bob", topic)
    assert error is not None and error.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED
    run_tool("kafka-acls", *server, "--add", "--allow-principal", "User:bob", "--operation",
             "Write", "--operation", "Describe", "--topic", topic)
    listed = run_tool("kafka-acls", *server, "--list", "--topic", topic).stdout
    assert "principal=User:bob" in listed and "operation=WRITE" in listed, listed
    # the broker holds them (read directly, as the super user on PLAINTEXT)
    direct = AdminClient({"bootstrap.servers": kafka_broker.bootstrap, **QUIET})
    anyone: Any = None  # AclBindingFilter's "any principal, any host"
    found = direct.describe_acls(AclBindingFilter(
        ResourceType.TOPIC, topic, ResourcePatternType.LITERAL, anyone, anyone, AclOperation.ANY,
        AclPermissionType.ANY)).result(30)
    assert {(b.principal, b.operation) for b in found} == {
        ("User:bob", AclOperation.WRITE), ("User:bob", AclOperation.DESCRIBE)}
    # ACL metadata reaches the broker's authorizer asynchronously
    deadline = time.monotonic() + 15
    while (error := produce_as(kafka_broker, sasl_proxy, "bob", topic)) is not None:
        assert time.monotonic() < deadline, error
        time.sleep(0.5)
    run_tool("kafka-acls", *server, "--remove", "--force", "--allow-principal", "User:bob",
             "--operation", "Write", "--operation", "Describe", "--topic", topic)
    assert "User:bob" not in run_tool("kafka-acls", *server, "--list", "--topic", topic).stdout


def test_no_secret_in_a_failed_tools_message(tmp_path: Path) -> None:
    from tests.harness.kafka_tools import ToolFailed, run_java

    with pytest.raises(ToolFailed) as err:
        run_java("NoSuchMainClass", "--user", "bob", "--password", "hunter2", timeout=60)
    assert "hunter2" not in str(err.value) and "--user bob <redacted> <redacted>" in str(err.value)


# ---------------------------------------------------------------- data policies (kafka-configs)

POLICY = '{"filters":[{"name":"pii","apply_to":"produce","config":{"mask":"#"}}]}'
# The file form takes what `--add-config` cannot: a list of directions.
POLICY_BOTH = '{"filters":[{"name":"pii","apply_to":["produce","fetch"],"config":{"mask":"+"}}]}'


def test_kafka_configs_binds_a_data_policy(
    kafka_broker: KafkaCluster, tmp_path: Path
) -> None:
    """`x-data-policy` set, shown and deleted with kafka-configs as docs/CONFIGURATION.md
    shows, through a proxy that follows a signed fleet on Kafka; then in force (masked)."""
    from tests.e2e.test_policies import chain_binds
    from tests.proxy.fleet_keys import trust_yaml
    from tests.proxy.test_fleet import sluice
    from tests.proxy.test_reload import wait_for

    topic, fleet_topic = unique("tools.policy"), unique("_sluice_filters")
    create_topic(kafka_broker.bootstrap, topic)
    cfg = tmp_path / "sluice.yaml"
    cfg.write_text(
        f"fleet:\n  topic: {fleet_topic}\n  heartbeat_seconds: 1\n  poll_seconds: 0.5\n"
        f"{trust_yaml()}"
        'policy_admins: ["User:ANONYMOUS"]\n'
        f"module_cache_dir: {json.dumps(str(tmp_path / 'modules'))}\n", encoding="utf-8")
    with SluiceProxy(upstream=kafka_broker.bootstrap, config=cfg) as proxy:
        deployed = sluice("filter", "deploy", "pii", "builtin:pii-mask", "--topics",
                          unique("elsewhere"), "--on", "produce", "--bootstrap",
                          kafka_broker.bootstrap, "--fleet-topic", fleet_topic)
        assert deployed.returncode == 0, deployed.stderr
        wait_for(functools.partial(chain_binds, proxy, "pii", True), 30, "fleet deploy")
        binding = f"policy:{topic}/pii"
        server = ["--bootstrap-server", proxy.bootstrap]
        entity = ["--entity-type", "topics", "--entity-name", topic]

        def produce_one(tag: str, via: str) -> None:
            run_tool("kafka-console-producer", "--bootstrap-server", via, "--topic", topic,
                     input=f"{tag} mail {SECRET}\n")

        produce_one("before", proxy.bootstrap)
        run_tool("kafka-configs", *server, "--alter", *entity, "--add-config",
                 f"x-data-policy={POLICY}")
        wait_for(functools.partial(chain_binds, proxy, binding, True), 30, "policy bound")
        described = run_tool("kafka-configs", *server, "--describe", *entity).stdout
        # as the proxy received it: kafka-configs drops the value's square brackets
        assert "x-data-policy=" + POLICY.replace("[", "").replace("]", "") in described, described
        produce_one("after", proxy.bootstrap)
        held = stored_values(kafka_broker, topic, 2)
        assert held[0] == f"before mail {SECRET}"
        assert SECRET not in held[1] and "#####@" in held[1], held

        run_tool("kafka-configs", *server, "--alter", *entity, "--delete-config",
                 "x-data-policy")
        wait_for(functools.partial(chain_binds, proxy, binding, False), 30, "policy unbound")
        assert "x-data-policy" not in run_tool(
            "kafka-configs", *server, "--describe", *entity).stdout

        policy_file = tmp_path / "policy.properties"
        policy_file.write_text(f"x-data-policy={POLICY_BOTH}\n")
        run_tool("kafka-configs", *server, "--alter", *entity, "--add-config-file",
                 str(policy_file))
        wait_for(functools.partial(chain_binds, proxy, binding, True), 30, "policy bound")
        produce_one("file", proxy.bootstrap)
        produce_one("direct", kafka_broker.bootstrap)  # stored in the clear ...
        held = stored_values(kafka_broker, topic, 4)
        assert SECRET not in held[2] and "+++++@" in held[2], held
        assert SECRET in held[3], held
        # ... and masked when read through the proxy (the policy's fetch direction)
        out = run_tool("kafka-console-consumer", *server, "--topic", topic, "--from-beginning",
                       "--max-messages", "4", "--timeout-ms", "30000").stdout.splitlines()
        assert len(out) == 4 and not any(SECRET in v for v in out), out
