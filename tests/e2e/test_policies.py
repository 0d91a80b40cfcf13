"""Data policies set with Kafka's own admin clients (confluent-kafka, kafka-python) through two
`sluice serve` processes that follow one fleet topic on Apache Kafka.

Kafka applies a config change through its metadata log: a DescribeConfigs right after an
IncrementalAlterConfigs may show the old value for a moment, so read-backs wait for it."""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    ConfigSource,
)
from kafka.admin import ConfigResource as KpConfigResource
from kafka.admin import ConfigResourceType, KafkaAdminClient

from tests.e2e.clients import QUIET, create_topic, unique
from tests.harness.broker import TansuBroker
from tests.harness.proxy import SluiceProxy
from tests.proxy.fleet_keys import trust_yaml
from tests.proxy.test_fleet import MASKED, fleet_args, produce_and_read, sluice
from tests.proxy.test_reload import events, telemetry_events, wait_for

KEY = "x-data-policy"
PII = json.dumps({"filters": [{"name": "pii", "apply_to": ["produce"],
                               "config": {"mask": "#"}}]})


def admin(bootstrap: str) -> AdminClient:
    return AdminClient({"bootstrap.servers": bootstrap, **QUIET})


def incremental(bootstrap: str, topic: str, entries: list[ConfigEntry]) -> None:
    resource = ConfigResource(ConfigResource.Type.TOPIC, topic, incremental_configs=entries)
    client = admin(bootstrap)  # held until the answer: a collected client cancels its futures
    for future in client.incremental_alter_configs([resource]).values():
        future.result(timeout=30)


def set_entry(name: str, value: str) -> ConfigEntry:
    return ConfigEntry(name, value, incremental_operation=AlterConfigOpType.SET)


def refused(bootstrap: str, topic: str, entries: list[ConfigEntry]) -> KafkaError:
    with pytest.raises(KafkaException) as err:
        incremental(bootstrap, topic, entries)
    error: KafkaError = err.value.args[0]
    return error


def described_with(bootstrap: str, topic: str, name: str, value: str) -> dict[str, Any] | None:
    """The topic's configs once `name` shows `value` (None before)."""
    found = described(bootstrap, topic)
    return found if name in found and found[name].value == value else None


def described(bootstrap: str, topic: str) -> dict[str, Any]:
    client = admin(bootstrap)
    (future,) = client.describe_configs(
        [ConfigResource(ConfigResource.Type.TOPIC, topic)]).values()
    return {name: entry for name, entry in future.result(timeout=30).items()}


def chain_binds(proxy: SluiceProxy, name: str, present: bool) -> bool:
    installed = events(proxy, "chain_installed")
    if not installed:
        return False
    names = [f["name"] for f in installed[-1]["filters"]]
    return (name in names) == present


def test_policies_through_kafka_admin_clients(
    broker: TansuBroker, start_proxy: Callable[..., SluiceProxy], tmp_path: Path
) -> None:
    topic = unique("policy-data")
    legacy_topic = unique("policy-legacy")
    fleet_topic = unique("_sluice_filters")
    for t in (topic, legacy_topic):
        create_topic(broker.bootstrap, t)
    cache = tmp_path / "modules"
    tele = tmp_path / "telemetry"

    def config(name: str, admins: list[str]) -> Path:
        path = tmp_path / f"{name}.yaml"
        path.write_text(
            f"fleet:\n  topic: {fleet_topic}\n  heartbeat_seconds: 1\n  poll_seconds: 0.5\n"
            f"{trust_yaml()}"
            f"policy_admins: {json.dumps(admins)}\n"
            f"module_cache_dir: {json.dumps(str(cache))}\n"
            f"telemetry:\n  dir: {json.dumps(str(tele / name))}\n  format: jsonl\n"
            f"  fsync: false\n", encoding="utf-8")
        return path

    # p1's clients (User:ANONYMOUS) may set policies; p2 allows only User:ops-* (nobody here).
    p1 = start_proxy(config=config("p1", ["User:ANONYMOUS"]))
    p2 = start_proxy(config=config("p2", ["User:ops-*"]))
    # The filter is deployed for another topic; the policy binds it to `topic` as well.
    proc = sluice("filter", "deploy", "pii", "builtin:pii-mask", "--topics", unique("elsewhere"),
                  "--on", "produce", "--config-json", '{"mask": "*"}',
                  *fleet_args(broker, fleet_topic))
    assert proc.returncode == 0, proc.stderr
    for p in (p1, p2):
        wait_for(functools.partial(chain_binds, p, "pii", True), 30, "fleet deploy")
    assert b"@example.com" in produce_and_read(broker, p2, topic, "before")

    # set, with another key in the same resource: that one reaches the broker untouched
    incremental(p1.bootstrap, topic, [set_entry(KEY, PII), set_entry("retention.ms", "123456")])
    direct = wait_for(lambda: described_with(broker.bootstrap, topic, "retention.ms", "123456"),
                      10, "retention.ms applied")
    assert KEY not in direct
    binding = f"policy:{topic}/pii"
    for p in (p1, p2):  # both proxies, without a restart
        wait_for(functools.partial(chain_binds, p, binding, True), 30, "policy bound")
    masked = produce_and_read(broker, p2, topic, "after")
    assert b"@example.com" not in masked and MASKED.search(masked) and b"#" in masked, masked

    # DescribeConfigs through either proxy shows it beside the broker's own configs
    for p in (p1, p2):
        via = wait_for(lambda p=p: described_with(p.bootstrap, topic, KEY, PII), 10, "policy")
        assert via[KEY].value == PII and via["retention.ms"].value == "123456"
        assert via[KEY].source == ConfigSource.DYNAMIC_TOPIC_CONFIG.value
        assert not via[KEY].is_sensitive
    kp = KafkaAdminClient(bootstrap_servers=p1.bootstrap, request_timeout_ms=30000)
    try:
        # config_filter "all": Tansu's own configs come with a source "modified" would skip.
        found = kp.describe_configs([KpConfigResource(ConfigResourceType.TOPIC, topic)],
                                    config_filter="all")
        assert found["topic"][topic][KEY]["value"] == PII
        assert found["topic"][topic]["retention.ms"]["value"] == "123456"

        # kafka-python's alter_configs (IncrementalAlterConfigs: Tansu does not list the legacy
        # AlterConfigs, so neither does the proxy; that API is covered by the unit tests)
        legacy = json.dumps({"filters": [{"name": "pii", "apply_to": "produce"}]})
        result = kp.alter_configs([KpConfigResource(ConfigResourceType.TOPIC, legacy_topic,
                                                    configs={KEY: legacy})],
                                  raise_on_unknown=False)
        assert result == {"topic": {legacy_topic: "OK"}}
        wait_for(lambda: described(p2.bootstrap, legacy_topic).get(KEY), 30, "legacy policy")
        assert described(p2.bootstrap, legacy_topic)[KEY].value == legacy
        bad = kp.alter_configs([KpConfigResource(ConfigResourceType.TOPIC, legacy_topic,
                                                 configs={KEY: '{"filters": 1}'})],
                               raise_on_unknown=False)
        assert "InvalidConfig" in bad["topic"][legacy_topic], bad
        assert "filters" in bad["topic"][legacy_topic]
    finally:
        kp.close()

    # a principal outside policy_admins is refused, and nothing of that resource is applied
    error = refused(p2.bootstrap, topic, [ConfigEntry(KEY, None, incremental_operation=(
        AlterConfigOpType.DELETE)), set_entry("retention.ms", "999")])
    assert error.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED, error
    assert "policy_admins" in error.str()
    assert described(broker.bootstrap, topic)["retention.ms"].value == "123456"
    # malformed -> INVALID_CONFIG naming the field; a filter the fleet lacks, likewise
    error = refused(p1.bootstrap, topic, [set_entry(KEY, json.dumps(
        {"filters": [{"name": "pii", "apply_to": "prodcue"}]}))])
    assert error.code() == KafkaError.INVALID_CONFIG
    assert "x-data-policy: filters[0].apply_to" in error.str(), error.str()
    error = refused(p1.bootstrap, topic, [set_entry(KEY, json.dumps(
        {"filters": [{"name": "nope", "apply_to": "fetch"}]}))])
    assert error.code() == KafkaError.INVALID_CONFIG and "'nope'" in error.str()
    error = refused(p1.bootstrap, topic, [ConfigEntry(
        KEY, PII, incremental_operation=AlterConfigOpType.APPEND)])
    assert error.code() == KafkaError.INVALID_CONFIG

    # delete -> no longer applied, on both proxies
    incremental(p1.bootstrap, topic, [ConfigEntry(
        KEY, None, incremental_operation=AlterConfigOpType.DELETE)])
    for p in (p1, p2):
        wait_for(functools.partial(chain_binds, p, binding, False), 30, "policy unbound")
    assert b"@example.com" in produce_and_read(broker, p2, topic, "deleted")
    assert KEY not in described(p1.bootstrap, topic)

    for p in (p1, p2):
        assert p.stop() == 0  # flushes telemetry
    admin_events = [e for e in telemetry_events(tele / "p1") if e["type"] == "admin"]
    seen = {(e["op"], e["resource"], e["decision"], e["error_code"]) for e in admin_events}
    assert ("set_policy", topic, "allow", 0) in seen
    assert ("delete_policy", topic, "allow", 0) in seen
    assert ("set_policy", topic, "deny", 40) in seen
    p2_events = [e for e in telemetry_events(tele / "p2") if e["type"] == "admin"]
    assert ("delete_policy", topic, "deny", 29) in {
        (e["op"], e["resource"], e["decision"], e["error_code"]) for e in p2_events}


def test_policy_fails_closed_when_its_filter_is_removed(
    broker: TansuBroker, start_proxy: Callable[..., SluiceProxy], tmp_path: Path
) -> None:
    topic = unique("policy-closed")
    fleet_topic = unique("_sluice_filters")
    create_topic(broker.bootstrap, topic)
    path = tmp_path / "sluice.yaml"
    path.write_text(
        f"fleet:\n  topic: {fleet_topic}\n  poll_seconds: 0.5\n{trust_yaml()}"
        f'policy_admins: ["User:ANONYMOUS"]\n'
        f"module_cache_dir: {json.dumps(str(tmp_path / 'modules'))}\n", encoding="utf-8")
    proxy = start_proxy(config=path)
    proc = sluice("filter", "deploy", "pii", "builtin:pii-mask", "--topics", unique("elsewhere"),
                  "--on", "produce", *fleet_args(broker, fleet_topic))
    assert proc.returncode == 0, proc.stderr
    wait_for(functools.partial(chain_binds, proxy, "pii", True), 30, "fleet deploy")
    incremental(proxy.bootstrap, topic, [set_entry(KEY, PII)])
    wait_for(functools.partial(chain_binds, proxy, f"policy:{topic}/pii", True), 30, "bound")

    proc = sluice("filter", "remove", "pii", *fleet_args(broker, fleet_topic))
    assert proc.returncode == 0, proc.stderr
    assert f"the data policy of topic {topic!r} names 'pii'" in proc.stderr
    proc = sluice("filter", "list", *fleet_args(broker, fleet_topic))
    assert proc.returncode == 0, proc.stderr
    assert f"{topic}  filters pii" in proc.stdout and "BLOCKED: pii not deployed" in proc.stdout
    wait_for(functools.partial(chain_binds, proxy, "pii", False), 30, "filter removed")
    blocked = wait_for(lambda: events(proxy, "policy_blocked"), 10, "policy_blocked log")
    assert blocked[-1]["topic"] == topic and "not deployed" in blocked[-1]["reason"]
    # Records to that topic are refused (retriable), never stored unmasked.
    producer = Producer({"bootstrap.servers": proxy.bootstrap, "message.timeout.ms": 4000,
                         **QUIET})
    errors: list[KafkaError] = []
    producer.produce(topic, value=b"mail ann@example.com",
                     on_delivery=lambda err, _msg: errors.append(err))
    producer.flush(30)
    assert errors and errors[0] is not None, errors
    assert errors[0].code() in (KafkaError.KAFKA_STORAGE_ERROR, KafkaError._MSG_TIMED_OUT), errors
    consumer = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": unique("g"),
                         **QUIET})
    try:
        _low, high = consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=10)
    finally:
        consumer.close()
    assert high == 0, "a record reached the broker although its policy could not be applied"
