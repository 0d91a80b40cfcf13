"""Attacks on the filter fleet and data policies, black box: a real `sluice serve` on Tansu,
records written straight to the broker (bypassing the proxy), Kafka's own admin clients.

A proxy that trusts only the operator's key (and the proxies' own key for policies) must not
change what it runs for a forged, unsigned, bare-tombstone, untrusted or junk record; a fleet
topic deleted on the broker must not unbind anything; ``x-data-policy`` in any spelling never
reaches the broker.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    NewTopic,
)
from prometheus_client.parser import text_string_to_metric_families

from sluice.filters.config import BUILTIN_DIR
from sluice.proxy.ops.fleet import filter_record_value, removal_payload, signed_filter_value
from sluice.proxy.ops.fleet_signing import sign
from sluice.proxy.ops.policies import policy_payload, policy_record_value
from tests.e2e.clients import QUIET, confluent_produce, create_topic, unique
from tests.harness.broker import TansuBroker
from tests.harness.kafka_broker import KafkaCluster
from tests.harness.ports import free_port
from tests.harness.proxy import SluiceProxy
from tests.proxy.fleet_keys import intruder, operator, proxy_key, trust_yaml
from tests.proxy.test_fleet import fleet_args, produce_and_read, sluice
from tests.proxy.test_reload import events, telemetry_events, wait_for

PII = (BUILTIN_DIR / "pii-mask.wasm").read_bytes()
KEY = "x-data-policy"
POLICY = json.dumps({"filters": [{"name": "pii", "apply_to": "produce",
                                  "config": {"mask": "+"}}]})


def metric(port: int, name: str, **labels: str) -> float:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        text = resp.read().decode()
    total = 0.0
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == name and set(labels.items()) <= set(s.labels.items()):
                total += s.value
    return total


def config(tmp_path: Path, fleet_topic: str, port: int | None, name: str = "sluice",
           trust: str | None = None, cache: str = "modules") -> Path:
    path = tmp_path / f"{name}.yaml"
    path.write_text(
        f"fleet:\n  topic: {fleet_topic}\n  heartbeat_seconds: 1\n  poll_seconds: 0.5\n"
        f"{trust_yaml() if trust is None else trust}"
        f'policy_admins: ["User:ANONYMOUS"]\n'
        f"module_cache_dir: {json.dumps(str(tmp_path / cache))}\n"
        f"telemetry:\n  dir: {json.dumps(str(tmp_path / 'telemetry' / name))}\n"
        f"  format: jsonl\n  fsync: false\n"
        + (f"metrics:\n  listen: 127.0.0.1:{port}\n" if port else ""), encoding="utf-8")
    return path


def running(proxy: SluiceProxy) -> list[str]:
    installed = events(proxy, "chain_installed")
    return [f["name"] for f in installed[-1]["filters"]] if installed else []


def has(proxy: SluiceProxy, names: list[str]) -> bool:
    return running(proxy) == names


def deploy(broker: TansuBroker, fleet_topic: str, topic: str, mask: str = "#") -> None:
    proc = sluice("filter", "deploy", "pii", "builtin:pii-mask", "--topics", topic,
                  "--on", "produce", "--config-json", json.dumps({"mask": mask}),
                  *fleet_args(broker, fleet_topic))
    assert proc.returncode == 0, proc.stderr
    assert f"signed by key {operator().key_id}" in proc.stdout


def test_forged_unsigned_tombstone_and_untrusted_records_change_nothing(
    broker: TansuBroker, start_proxy: Callable[..., SluiceProxy], tmp_path: Path
) -> None:
    topic, fleet_topic, port = unique("signed-data"), unique("_sluice_filters"), free_port()
    create_topic(broker.bootstrap, topic)
    proxy = start_proxy(config=config(tmp_path, fleet_topic, port))
    deploy(broker, fleet_topic, topic)
    wait_for(functools.partial(has, proxy, ["pii"]), 30, "signed deploy applied")
    assert b"#" in produce_and_read(broker, proxy, topic, "signed")

    # Straight to the broker, as anyone with write access to the fleet topic could.
    forged = filter_record_value({"name": "evil", "topics": ["*"],
                                  "apply_to": ["produce", "fetch"], "config": {"mask": "E"}},
                                 "builtin:pii-mask", PII, "operator@forged")
    untrusted_removal = sign(intruder(), b"pii",
                             dict(removal_payload("pii", "intruder"), seq=2**62))
    untrusted_deploy = signed_filter_value(
        intruder(), {"name": "evil2", "topics": ["*"], "apply_to": ["produce"]},
        "builtin:pii-mask", PII, "intruder", 2**62)
    # Junk with a module of its own: refused before anything is written to the cache.
    junk = filter_record_value({"name": "junk", "topics": ["*"], "apply_to": ["produce"]},
                               "junk.wasm", os.urandom(200_000), "operator@forged")
    confluent_produce(broker.bootstrap, fleet_topic, [
        (b"pii", None), (b"evil", forged), (b"pii", untrusted_removal),
        (b"evil2", untrusted_deploy), (b"pii", b"\x00junk"), (b"junk", junk)])
    wait_for(lambda: metric(port, "sluice_fleet_records_refused_total") >= 6, 30,
             "six refusals counted")
    assert metric(port, "sluice_fleet_records_refused_total", reason="unsigned") == 3
    cached = sorted(p.name for p in (tmp_path / "modules" / "fleet").glob("*.wasm"))
    assert cached == [f"{hashlib.sha256(PII).hexdigest()}.wasm"]
    assert metric(port, "sluice_fleet_records_refused_total", reason="untrusted_key") == 2
    assert metric(port, "sluice_fleet_records_refused_total", reason="unreadable") == 1
    refusals = events(proxy, "fleet_record_refused")
    assert 1 <= len(refusals) <= 3  # logged once per reason, not per record
    assert all("junk" not in json.dumps(e) and "module_b64" not in json.dumps(e)
               for e in refusals)
    assert running(proxy) == ["pii"]
    assert b"#" in produce_and_read(broker, proxy, topic, "still")
    assert metric(port, "sluice_fleet_topic_lost_total") == 0
    other = unique("other")
    create_topic(broker.bootstrap, other)
    assert b"E" not in produce_and_read(broker, proxy, other, "other").split(b" mail ")[1]

    # `filter list` with the trusted key shows what the proxies apply, and who signed it.
    pub = f"{operator().path}.pub"
    proc = sluice("filter", "list", "--json", "--trusted-key", pub,
                  *fleet_args(broker, fleet_topic))
    assert proc.returncode == 0, proc.stderr
    listing = json.loads(proc.stdout)
    assert [(f["name"], f["signer"]) for f in listing["filters"]] == [("pii", operator().key_id)]

    # An operator's signed removal works.
    proc = sluice("filter", "remove", "pii", *fleet_args(broker, fleet_topic))
    assert proc.returncode == 0, proc.stderr
    wait_for(functools.partial(has, proxy, []), 30, "signed removal applied")
    assert b"@example.com" in produce_and_read(broker, proxy, topic, "removed")
    # Replaying the old signed deploy (read back from the topic) changes nothing either.
    [old] = [v for k, v in fleet_values(broker, fleet_topic) if k == b"pii"][:1]
    confluent_produce(broker.bootstrap, fleet_topic, [(b"pii", old)])
    wait_for(lambda: metric(port, "sluice_fleet_records_refused_total", reason="replay") >= 1,
             30, "replay refused")
    assert running(proxy) == []

    # Telemetry names the key that signed the code that touched each batch.
    assert proxy.stop() == 0
    touched = [f for e in telemetry_events(tmp_path / "telemetry" / "sluice")
               if e.get("type") == "record_batch" and e.get("topic") == topic
               for f in e["filters"]]
    assert len(touched) == 2  # "signed" and "still"
    assert {(f["name"], f["signer_key_id"]) for f in touched} == {("pii", operator().key_id)}


@pytest.mark.spark
@pytest.mark.timeout(900)
def test_audit_report_names_the_key_that_signed_the_fleet_filter(
    broker: TansuBroker, start_proxy: Callable[..., SluiceProxy], tmp_path: Path
) -> None:
    """`sluice audit` over the proxy's telemetry: the run of the batches the signed fleet
    filter touched, and its module, name the operator's key id."""
    pq = pytest.importorskip("pyarrow.parquet")
    topic, fleet_topic = unique("signed-audit"), unique("_sluice_filters")
    create_topic(broker.bootstrap, topic)
    proxy = start_proxy(config=config(tmp_path, fleet_topic, None))
    deploy(broker, fleet_topic, topic)
    wait_for(functools.partial(has, proxy, ["pii"]), 30, "signed deploy applied")
    assert b"#" in produce_and_read(broker, proxy, topic, "signed")
    assert proxy.stop() == 0
    out = tmp_path / "report"
    proc = sluice("audit", "--telemetry", str(tmp_path / "telemetry" / "sluice"),
                  "--out", str(out), timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    sha = hashlib.sha256(PII).hexdigest()
    runs = [r for r in pq.read_table(out / "audit.parquet").to_pylist() if r["topic"] == topic]
    assert [(r["module_sha256"], r["api"], r["signer_key_ids"]) for r in runs] == [
        (sha, "produce", [operator().key_id])]
    [module] = [r for r in pq.read_table(out / "audit_modules.parquet").to_pylist()
                if r["module_sha256"] == sha]
    assert module["signer_key_ids"] == [operator().key_id]
    assert operator().key_id in (out / "report.html").read_text(encoding="utf-8")


def fleet_values(broker: TansuBroker, fleet_topic: str) -> list[tuple[bytes, bytes]]:
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": unique("g"),
                         "enable.auto.commit": False, **QUIET})
    try:
        tp = TopicPartition(fleet_topic, 0, 0)
        _low, high = consumer.get_watermark_offsets(tp, timeout=10)
        consumer.assign([tp])
        out: list[tuple[bytes, bytes]] = []
        while True:
            msg = consumer.poll(5)
            if msg is None:
                return out
            if msg.error():
                continue
            if msg.value():
                out.append((msg.key(), msg.value()))
            if (msg.offset() or 0) >= high - 1:
                return out
    finally:
        consumer.close()


def incremental(bootstrap: str, topic: str, name: str, value: str | None,
                op: AlterConfigOpType = AlterConfigOpType.SET) -> None:
    client = AdminClient({"bootstrap.servers": bootstrap, **QUIET})
    resource = ConfigResource(ConfigResource.Type.TOPIC, topic,
                              incremental_configs=[ConfigEntry(name, value,
                                                               incremental_operation=op)])
    for future in client.incremental_alter_configs([resource]).values():
        future.result(timeout=30)


def test_policies_are_signed_and_junk_or_glob_records_block_nothing(
    broker: TansuBroker, start_proxy: Callable[..., SluiceProxy], tmp_path: Path
) -> None:
    topic, clear = unique("pol-signed"), unique("pol-clear")
    fleet_topic, port = unique("_sluice_filters"), free_port()
    for t in (topic, clear):
        create_topic(broker.bootstrap, t)
    proxy = start_proxy(config=config(tmp_path, fleet_topic, port))
    deploy(broker, fleet_topic, unique("elsewhere"))
    wait_for(functools.partial(has, proxy, ["pii"]), 30, "deploy")
    # Set through the proxy (in another case): the proxy signs it with its own key.
    incremental(proxy.bootstrap, topic, "X-Data-Policy", POLICY)
    binding = f"policy:{topic}/pii"
    wait_for(functools.partial(has, proxy, ["pii", binding]), 30, "policy bound")
    listing = json.loads(sluice("filter", "list", "--json", "--trusted-key",
                                f"{proxy_key().path}.pub", *fleet_args(broker, fleet_topic)
                                ).stdout)
    assert [(p["topic"], p["signer"]) for p in listing["policies"]] == [
        (topic, proxy_key().key_id)]

    # Junk and globs straight to the broker: `policy:*` (even validly signed), `policy:c*`,
    # an unsigned forged policy blocking `clear`, a bare tombstone removing the real one.
    glob_signed = sign(proxy_key(), b"policy:*",
                       dict(policy_payload("*", POLICY, "x", "y"), seq=2**62))
    confluent_produce(broker.bootstrap, fleet_topic, [
        (b"policy:*", b"\x00not json"), (b"policy:*", glob_signed),
        (b"policy:c*", b"{}"), (f"policy:{topic}".encode(), None),
        (f"policy:{clear}".encode(), policy_record_value(
            clear, json.dumps({"filters": [{"name": "missing", "apply_to": "produce"}]}),
            "User:forged"))])
    wait_for(lambda: metric(port, "sluice_fleet_records_refused_total") >= 5, 30, "refusals")
    assert metric(port, "sluice_fleet_records_refused_total", reason="invalid_name") == 3
    assert metric(port, "sluice_fleet_records_refused_total", reason="unsigned") == 2
    assert not events(proxy, "policy_blocked")
    assert running(proxy) == ["pii", binding]
    assert b"@example.com" in produce_and_read(broker, proxy, clear, "clear")
    masked = produce_and_read(broker, proxy, topic, "masked")
    assert b"@example.com" not in masked and b"+" in masked

    # The sanctioned DELETE (signed by the proxy) still works.
    incremental(proxy.bootstrap, topic, KEY, None, AlterConfigOpType.DELETE)
    wait_for(functools.partial(has, proxy, ["pii"]), 30, "policy removed")


@pytest.mark.serial
@pytest.mark.kafka
def test_fleet_topic_deleted_on_the_broker_keeps_the_filters(
    kafka_broker: KafkaCluster, tmp_path: Path
) -> None:
    # Against Apache Kafka: after a topic is deleted, Tansu answers Metadata in a way that
    # crashes librdkafka 2.16 (the fleet's client; docs/COMPATIBILITY.md).
    broker = kafka_broker
    started: list[SluiceProxy] = []

    def start_proxy(config: Path) -> SluiceProxy:
        started.append(SluiceProxy(upstream=broker.bootstrap, config=config).start())
        return started[-1]

    try:
        _deleted_topic_keeps_filters(broker, start_proxy, tmp_path)
    finally:
        for proxy in started:
            proxy.stop()


def _deleted_topic_keeps_filters(broker: Any, start_proxy: Callable[..., SluiceProxy],
                                 tmp_path: Path) -> None:
    topic, fleet_topic, port = unique("lost-data"), unique("_sluice_filters"), free_port()
    create_topic(broker.bootstrap, topic)
    path = config(tmp_path, fleet_topic, port)
    proxy = start_proxy(config=path)
    deploy(broker, fleet_topic, topic)
    wait_for(functools.partial(has, proxy, ["pii"]), 30, "deploy")
    client = AdminClient({"bootstrap.servers": broker.bootstrap, **QUIET})
    for future in client.delete_topics([fleet_topic]).values():
        future.result(timeout=30)
    lost = wait_for(lambda: events(proxy, "fleet_topic_lost"), 40, "fleet_topic_lost")
    assert lost[0]["level"] == "error" and lost[0]["keeping_filters"] == ["pii"]
    assert metric(port, "sluice_fleet_topic_lost_total") >= 1
    assert running(proxy) == ["pii"]
    assert b"#" in produce_and_read(broker, proxy, topic, "after-delete")

    # A restart keeps them too (the last verified state is kept beside the modules).
    proxy.stop()
    port2 = free_port()
    again = start_proxy(config=config(tmp_path, fleet_topic, port2, "again"))
    assert events(again, "fleet_state_restored")
    wait_for(functools.partial(has, again, ["pii"]), 30, "restored on restart")
    assert b"#" in produce_and_read(broker, again, topic, "after-restart")

    # Recovery: the proxy's state file written back; a proxy with an empty cache applies it.
    state = tmp_path / "modules" / "fleet" / f"state-{fleet_topic}.json"
    proc = sluice("filter", "restore", str(state), *fleet_args(broker, fleet_topic))
    assert proc.returncode == 0, proc.stderr
    fresh = start_proxy(config=config(tmp_path, fleet_topic, None, "fresh",
                                      cache="fresh-modules"))
    assert not events(fresh, "fleet_state_restored")
    wait_for(functools.partial(has, fresh, ["pii"]), 30, "restored from the topic")
    assert b"#" in produce_and_read(broker, fresh, topic, "after-restore")


def test_key_rotation_resigns_what_is_in_force(
    broker: TansuBroker, start_proxy: Callable[..., SluiceProxy], tmp_path: Path
) -> None:
    topic, fleet_topic = unique("rotate-data"), unique("_sluice_filters")
    create_topic(broker.bootstrap, topic)
    deploy(broker, fleet_topic, topic)
    new = tmp_path / "new.key"
    assert sluice("filter", "keygen", str(new)).returncode == 0
    proc = sluice("filter", "resign", "--trusted-key", f"{operator().path}.pub",
                  *fleet_args(broker, fleet_topic), signing_key=str(new))
    assert proc.returncode == 0, proc.stderr
    assert "re-signed pii" in proc.stdout
    only_new = f"  trusted_keys: [{json.dumps(str(new) + '.pub')}]\n"
    proxy = start_proxy(config=config(tmp_path, fleet_topic, None, trust=only_new))
    wait_for(functools.partial(has, proxy, ["pii"]), 30, "re-signed record applied")
    assert b"#" in produce_and_read(broker, proxy, topic, "rotated")


def create(bootstrap: str, topic: NewTopic) -> KafkaException | None:
    client = AdminClient({"bootstrap.servers": bootstrap, **QUIET})
    for future in client.create_topics([topic]).values():
        try:
            future.result(30)
        except KafkaException as exc:
            return exc
    return None


def broker_configs(broker: TansuBroker, topic: str) -> dict[str, Any]:
    client = AdminClient({"bootstrap.servers": broker.bootstrap, **QUIET})
    (future,) = client.describe_configs([ConfigResource("topic", topic)]).values()
    return {name.lower(): entry.value for name, entry in future.result(30).items()}


@pytest.mark.parametrize("with_fleet", [True, False])
def test_x_data_policy_in_any_case_never_reaches_the_broker(
    broker: TansuBroker, start_proxy: Callable[..., SluiceProxy], tmp_path: Path,
    with_fleet: bool
) -> None:
    path = config(tmp_path, unique("_sluice_filters"), None) if with_fleet else None
    proxy = start_proxy(config=path)
    topic = unique("xdp")
    error = create(proxy.bootstrap, NewTopic(topic, 1, 1, config={"X-Data-Policy": POLICY}))
    assert error is not None and error.args[0].code() == KafkaError.INVALID_CONFIG
    assert "AlterConfigs" in error.args[0].str()
    topics = AdminClient({"bootstrap.servers": broker.bootstrap, **QUIET}).list_topics(
        timeout=10).topics
    assert topic not in topics
    if with_fleet:
        return
    create_topic(broker.bootstrap, topic)
    with pytest.raises(KafkaException) as info:
        incremental(proxy.bootstrap, topic, "X-DATA-POLICY", POLICY)
    assert info.value.args[0].code() == KafkaError.INVALID_CONFIG
    assert KEY not in broker_configs(broker, topic)
