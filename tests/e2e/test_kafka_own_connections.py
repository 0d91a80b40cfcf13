"""Every connection the proxy opens itself, against Apache Kafka's SASL_SSL listener with ACLs.

The proxy's config names the cluster's CA (`upstream_tls:`) and the `sluice-proxy` SCRAM-SHA-512
user (`upstream_sasl:`), and nothing else: the fleet follower, `sluice filter deploy/list`, the
dead-letter writer, the topic-id look-up, the Kafka telemetry sink, a transform and the audit's
`kafka://` reader all take their TLS and SASL from there. `sluice-proxy` gets exactly the ACLs
docs/SECURITY.md ("The proxy's own connections") lists; without them the proxy says what is
missing in one log line, without a traceback, and does not start (fails closed), and the CLI
exits 1 with the same message. No secret appears in any output.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import wasmtime
from confluent_kafka import Consumer, Producer, TopicPartition
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

from sluice.kafka_security import PROXY_USER
from sluice.proxy.net.upstream_client import UpstreamDialer
from sluice.proxy.ops.config_load import build_config
from sluice.proxy.ops.fleet_kafka import READER_GROUP
from sluice.proxy.paths.topics import TopicRegistry
from tests.e2e.clients import QUIET, confluent_produce, unique
from tests.harness.kafka_broker import KafkaCluster
from tests.harness.proxy import SluiceProxy
from tests.proxy.fleet_keys import trust_yaml
from tests.proxy.test_fleet import sluice
from tests.proxy.test_reload import events, wait_for

pytestmark = pytest.mark.kafka

MODULES = Path(__file__).resolve().parents[1] / "filters" / "modules"
PRINCIPAL = f"User:{PROXY_USER}"


def admin_conf(kafka: KafkaCluster) -> dict[str, Any]:
    return {**kafka.client_config("SASL_SSL", "admin", "SCRAM-SHA-512"), **QUIET}


def proxy_acls(fleet: str, dlq: str, telemetry: str, transform_in: str, transform_out: str,
               group: str) -> list[AclBinding]:
    """What docs/SECURITY.md grants `sluice-proxy`, as confluent-kafka bindings."""
    lit = ResourcePatternType.LITERAL
    allow = AclPermissionType.ALLOW
    grants = [
        (ResourceType.TOPIC, fleet, AclOperation.READ),
        (ResourceType.TOPIC, fleet, AclOperation.WRITE),
        (ResourceType.TOPIC, fleet, AclOperation.CREATE),
        (ResourceType.TOPIC, dlq, AclOperation.WRITE),
        (ResourceType.TOPIC, telemetry, AclOperation.WRITE),
        (ResourceType.TOPIC, transform_in, AclOperation.READ),
        (ResourceType.TOPIC, transform_out, AclOperation.WRITE),
        (ResourceType.GROUP, group, AclOperation.READ),
        (ResourceType.GROUP, READER_GROUP, AclOperation.DESCRIBE),
        # Topic ids of any topic a client uses (Metadata), and its configs (admin filters).
        (ResourceType.TOPIC, "*", AclOperation.DESCRIBE),
        (ResourceType.TOPIC, "*", AclOperation.DESCRIBE_CONFIGS),
    ]
    return [AclBinding(kind, name, lit, PRINCIPAL, "*", op, allow) for kind, name, op in grants]


def run_admin(kafka: KafkaCluster, call: str, arg: Any) -> None:
    admin = AdminClient(admin_conf(kafka))
    for fut in getattr(admin, call)(arg).values():
        fut.result(30)


def write_config(folder: Path, kafka: KafkaCluster, names: dict[str, str],
                 password: str | None = None, fleet_section: bool = True) -> Path:
    """The proxy's config: the cluster's security once, and the features that connect."""
    secret = folder / "sluice-proxy.password"
    secret.write_text((password or kafka.password(PROXY_USER)) + "\n")
    module = folder / "sluice_upper.wasm"
    module.write_bytes(wasmtime.wat2wasm((MODULES / "sluice_upper.wat").read_text()))
    sasl_ssl = kafka.bootstrap_for("SASL_SSL")
    config = {
        "upstream_tls": {"ca": str(kafka.ca_cert)},
        "upstream_sasl": {"mechanism": "SCRAM-SHA-512", "username": PROXY_USER,
                          "password_file": secret.name},
        "module_cache_dir": str(folder / "modules"),
        "filters": [{"name": "upper-dl", "module": str(module), "topics": [names["data"]],
                     "apply_to": ["produce"], "on_error": "dead-letter",
                     "dead_letter_topic": names["dlq"]}],
        "telemetry": {"kafka": {"bootstrap": sasl_ssl, "topic": names["telemetry"]}},
        "transforms": [{"name": names["transform"], "input": names["t_in"],
                        "output": names["t_out"], "guarantee": "at-least-once",
                        "group": names["group"],
                        "filters": [{"name": "up", "module": str(module)}]}],
    }
    fleet = {"topic": names["fleet"], "heartbeat_seconds": 1, "poll_seconds": 0.5,
             "startup_wait_seconds": 20}
    # One YAML line per section (JSON is YAML), then the fleet's keys (trust_yaml's lines).
    lines = [f"{key}: {json.dumps(value)}" for key, value in config.items()]
    path = folder / "sluice.yaml"
    if not fleet_section:
        path.write_text("\n".join(lines) + "\n", encoding="utf-8")
        return path
    lines.append("fleet:")
    lines += [f"  {key}: {json.dumps(value)}" for key, value in fleet.items()]
    path.write_text("\n".join(lines) + "\n" + trust_yaml(), encoding="utf-8")
    return path


def fleet_cli(config: Path, kafka: KafkaCluster, fleet: str, *args: str,
              timeout: float = 90) -> subprocess.CompletedProcess[str]:
    return sluice(*args, "--config", str(config), "--bootstrap", kafka.bootstrap_for("SASL_SSL"),
                  "--fleet-topic", fleet, timeout=timeout)


def read_all(kafka: KafkaCluster, topic: str, count: int, timeout: float = 40) -> list[Any]:
    consumer = Consumer({**admin_conf(kafka), "group.id": unique("check"),
                         "enable.auto.commit": False})
    try:
        parts = consumer.list_topics(topic, timeout=10).topics[topic].partitions
        consumer.assign([TopicPartition(topic, p, 0) for p in parts])
        out: list[Any] = []
        deadline = time.monotonic() + timeout
        while len(out) < count and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is not None and msg.error() is None:
                out.append(msg)
        return out
    finally:
        consumer.close()


def no_secret(kafka: KafkaCluster, *texts: str) -> None:
    for user in ("admin", PROXY_USER):
        secret = kafka.password(user)
        for text in texts:
            assert secret not in text, f"{user}'s password in the output"


@pytest.fixture(scope="module")
def names() -> dict[str, str]:
    return {"data": unique("own-data"), "fleet_data": unique("own-fleet-data"),
            "dlq": unique("own-dlq"), "telemetry": unique("own-telemetry"),
            "fleet": unique("own-fleet"), "t_in": unique("own-tin"), "t_out": unique("own-tout"),
            "transform": "own-upper", "group": unique("own-group")}


@pytest.fixture(scope="module")
def kafka(kafka_broker: KafkaCluster, names: dict[str, str]) -> Iterator[KafkaCluster]:
    run_admin(kafka_broker, "create_topics",
              [NewTopic(names[k], 1, 1) for k in ("data", "fleet_data", "dlq", "telemetry",
                                                  "t_in", "t_out")])
    yield kafka_broker


def test_every_own_connection_works_over_sasl_ssl_with_exactly_its_acls(
    kafka: KafkaCluster, names: dict[str, str], tmp_path: Path
) -> None:
    acls = proxy_acls(names["fleet"], names["dlq"], names["telemetry"], names["t_in"],
                      names["t_out"], names["group"])
    run_admin(kafka, "create_acls", acls)
    config = write_config(tmp_path, kafka, names)
    proxy = SluiceProxy(upstream=kafka.bootstrap_for("SASL_SSL"), config=config)
    try:
        proxy.start(timeout=60)
        # The fleet follower created the topic and read it, as sluice-proxy over TLS.
        wait_for(lambda: events(proxy, "fleet_synced"), 30, "fleet synced")
        assert events(proxy, "fleet_topic_created")

        # sluice filter deploy (and the wait for the proxy's heartbeat) with --config.
        deploy = fleet_cli(config, kafka, names["fleet"], "filter", "deploy", "pii",
                           "builtin:pii-mask", "--topics", names["fleet_data"],
                           "--on", "produce", "--config-json", '{"mask": "#"}', "--wait", "30")
        assert deploy.returncode == 0, deploy.stderr
        listing = fleet_cli(config, kafka, names["fleet"], "filter", "list", "--json")
        assert listing.returncode == 0, listing.stderr
        listed = json.loads(listing.stdout)
        assert [f["name"] for f in listed["filters"]] == ["pii"]
        assert len(listed["instances"]) == 1

        # A client (admin, its own SASL through the proxy) meets the fleet's filter.
        client = {"security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "SCRAM-SHA-512",
                  "sasl.username": "admin", "sasl.password": kafka.password("admin")}
        wait_for(lambda: any("pii" in json.dumps(e) for e in events(proxy, "chain_installed")),
                 30, "fleet filter installed")
        confluent_produce(proxy.bootstrap, names["fleet_data"],
                          [(b"k", b"mail me at someone@example.com")], **client)
        [stored] = read_all(kafka, names["fleet_data"], 1)
        assert b"someone@example.com" not in stored.value() and b"#" in stored.value()

        # Dead letters: the filter traps on TRAP; the letter reaches the dead-letter topic.
        confluent_produce(proxy.bootstrap, names["data"], [(b"k", b"fine")], **client)
        producer_errors: list[str] = []
        p = Producer({"bootstrap.servers": proxy.bootstrap, **client, **QUIET,
                      "message.send.max.retries": 0})
        p.produce(names["data"], key=b"k", value=b"TRAP now",
                  on_delivery=lambda err, _m: producer_errors.append(str(err)))
        p.flush(30)
        assert producer_errors and producer_errors[0] != "None", "the trapped record was kept"
        [letter] = read_all(kafka, names["dlq"], 1)
        assert letter.value() == b"TRAP now"
        stored_data = read_all(kafka, names["data"], 2, timeout=5)
        assert [m.value() for m in stored_data] == [b"FINE"]

        # The Kafka telemetry sink wrote the events (Arrow IPC batches).
        assert read_all(kafka, names["telemetry"], 1)

        # The transform (at least once) read its input and wrote its output, as sluice-proxy.
        confluent_produce(kafka.bootstrap_for("SASL_SSL"), names["t_in"], [(b"k", b"abc")],
                          **{k: v for k, v in admin_conf(kafka).items()
                             if k != "bootstrap.servers"})
        [out] = read_all(kafka, names["t_out"], 1)
        assert out.value() == b"ABC"
        listed_lag = sluice("transform", "list", str(config), "--bootstrap",
                            kafka.bootstrap_for("SASL_SSL"), "--json")
        assert listed_lag.returncode == 0, listed_lag.stderr
        assert json.loads(listed_lag.stdout.splitlines()[0])["committed"] == 1

        # Topic ids: the proxy's look-up (Metadata of all topics) as sluice-proxy.
        registry = TopicRegistry()
        dialer = UpstreamDialer(proxy_config(config, kafka))
        asyncio.run(registry._fetch(dialer.connect))
        assert names["data"] in registry.names.values()

    finally:
        proxy.stop()
        run_admin(kafka, "delete_acls", [filter_of(b) for b in acls])
    output = "".join(proxy.output)
    assert "Traceback" not in output
    no_secret(kafka, output, deploy.stdout, deploy.stderr, listing.stdout)


def proxy_config(path: Path, kafka: KafkaCluster) -> Any:
    host, port = kafka.bootstrap_for("SASL_SSL").rsplit(":", 1)
    return build_config(("127.0.0.1", 0), [(host, int(port))], path)


def test_audit_reads_kafka_telemetry_with_the_config_files_credentials(
    kafka: KafkaCluster, names: dict[str, str], tmp_path: Path
) -> None:
    """`sluice audit --telemetry kafka://... --config` as an auditor (alice: read the telemetry
    topic, groups `sluice-audit-*`), over SASL_SSL; the first test filled the topic."""
    if not read_all(kafka, names["telemetry"], 1, timeout=5):
        pytest.skip("needs the telemetry the first test of this file writes")
    lit, pre = ResourcePatternType.LITERAL, ResourcePatternType.PREFIXED
    acls = [AclBinding(ResourceType.TOPIC, names["telemetry"], lit, "User:alice", "*",
                       AclOperation.READ, AclPermissionType.ALLOW),
            AclBinding(ResourceType.GROUP, "sluice-audit-", pre, "User:alice", "*",
                       AclOperation.READ, AclPermissionType.ALLOW)]
    run_admin(kafka, "create_acls", acls)
    secret = tmp_path / "alice.password"
    secret.write_text(kafka.password("alice"))
    config = tmp_path / "auditor.yaml"
    config.write_text(f"upstream_tls: {{ca: {json.dumps(str(kafka.ca_cert))}}}\n"
                      f"upstream_sasl: {{mechanism: SCRAM-SHA-512, username: alice, "
                      f"password_file: {json.dumps(str(secret))}}}\n", encoding="utf-8")
    out = tmp_path / "report"
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "sluice", "audit", "--telemetry",
             f"kafka://{kafka.bootstrap_for('SASL_SSL')}/{names['telemetry']}",
             "--config", str(config), "--out", str(out)],
            capture_output=True, text=True, timeout=300)
    finally:
        run_admin(kafka, "delete_acls", [filter_of(b) for b in acls])
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["events"] > 0
    assert kafka.password("alice") not in proc.stdout + proc.stderr


def filter_of(b: AclBinding) -> AclBindingFilter:
    return AclBindingFilter(b.restype, b.name, b.resource_pattern_type, b.principal, b.host,
                            b.operation, b.permission_type)


def test_without_acls_the_proxy_and_the_cli_fail_closed_with_a_clear_error(
    kafka: KafkaCluster, names: dict[str, str], tmp_path: Path
) -> None:
    fresh = dict(names, fleet=unique("own-fleet-denied"))
    config = write_config(tmp_path, kafka, fresh)
    proc = subprocess.run(
        [sys.executable, "-m", "sluice", "serve", "--listen", "127.0.0.1:0", "--upstream",
         kafka.bootstrap_for("SASL_SSL"), "--config", str(config)],
        capture_output=True, text=True, timeout=90)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 2, out
    assert "fleet_access_denied" in out
    assert "the cluster refused the proxy's own connection" in proc.stderr
    assert "authorization failed" in proc.stderr.lower() and PROXY_USER in proc.stderr
    assert "Traceback" not in out

    deploy = fleet_cli(config, kafka, fresh["fleet"], "filter", "deploy", "pii",
                       "builtin:pii-mask", "--topics", "x", "--on", "produce")
    assert deploy.returncode == 1, deploy.stderr
    assert "authorization failed" in deploy.stderr.lower(), deploy.stderr
    assert "Traceback" not in deploy.stderr
    no_secret(kafka, out, deploy.stdout, deploy.stderr)

    # Without the fleet, the proxy serves; a dead letter it may not write is logged as failed,
    # naming the broker's error, and the record it stands for is still refused, never stored.
    (tmp_path / "nofleet").mkdir()
    plain = write_config(tmp_path / "nofleet", kafka, fresh, fleet_section=False)
    client = {"security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "SCRAM-SHA-512",
              "sasl.username": "admin", "sasl.password": kafka.password("admin"), **QUIET,
              "message.send.max.retries": 0}
    with SluiceProxy(upstream=kafka.bootstrap_for("SASL_SSL"), config=plain) as proxy:
        reports: list[Any] = []
        producer = Producer({"bootstrap.servers": proxy.bootstrap, **client})
        producer.produce(fresh["data"], value=b"TRAP denied",
                         on_delivery=lambda err, _m: reports.append(err))
        producer.flush(30)
        assert reports and reports[0] is not None, "the trapped record was accepted"
        failed = wait_for(lambda: events(proxy, "dead_letter_failed"), 30, "dead_letter_failed")
        assert "TOPIC_AUTHORIZATION_FAILED" in failed[0]["error"], failed
    assert all(m.value() != b"TRAP denied" for m in read_all(kafka, fresh["data"], 10, 5))
    assert "Traceback" not in "".join(proxy.output)
    no_secret(kafka, "".join(proxy.output))


def test_a_wrong_password_is_refused_by_name_without_echoing_it(
    kafka: KafkaCluster, names: dict[str, str], tmp_path: Path
) -> None:
    wrong = "not-the-password-" + unique("x")
    config = write_config(tmp_path, kafka, dict(names, fleet=unique("own-fleet-pw")),
                          password=wrong)
    listing = fleet_cli(config, kafka, unique("own-fleet-pw"), "filter", "list", timeout=60)
    assert listing.returncode == 1
    assert "authentication" in listing.stderr.lower(), listing.stderr
    assert wrong not in listing.stdout + listing.stderr
    assert "Traceback" not in listing.stderr
