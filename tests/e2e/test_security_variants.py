"""The next tries of a careful attacker after issue 26's findings, black box.

A real `sluice serve` following a signed fleet on the e2e broker (Apache Kafka), records
written straight to the broker as anyone with write access to the fleet topic could, and
Kafka's own clients or raw frames through the proxy:

- policy records made unreadable every other way (bad JSON, wrong schema, a record naming
  another topic, a tampered signature, a record signed for another key, an untrusted key, a
  huge value, malformed keys): none
  changes the policy in force, and a signed policy that cannot be used blocks its own topic
  only;
- an older, validly signed policy written again (a rollback) changes nothing;
- a policy on a glob resource name, and ``X-Data-Policy`` through the legacy AlterConfigs;
- the fleet topic truncated on the broker (DeleteRecords) unbinds nothing;
- the fleet module cache stays within ``fleet.cache_max_mb`` as modules are replaced.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient

from sluice.codec.messages import ApiKey
from sluice.filters.config import BUILTIN_DIR
from sluice.proxy.ops.fleet_signing import next_seq, sign
from sluice.proxy.ops.policies import policy_payload, policy_record_value
from tests.e2e.clients import QUIET, confluent_produce, create_topic, unique
from tests.e2e.test_internal_topics import batch, call, item, produce
from tests.e2e.test_signed_fleet import (
    KEY,
    POLICY,
    broker_configs,
    config,
    deploy,
    fleet_values,
    incremental,
    metric,
    running,
)
from tests.harness.broker import TansuBroker
from tests.harness.kafka_broker import KafkaCluster
from tests.harness.ports import free_port
from tests.harness.proxy import SluiceProxy
from tests.proxy.fleet_keys import intruder, proxy_key, trust_yaml
from tests.proxy.test_fleet import _leb128, fleet_args, produce_and_read, sluice
from tests.proxy.test_reload import events, wait_for

INVALID_CONFIG = 40


def bound(proxy: SluiceProxy, names: set[str]) -> bool:
    return names <= set(running(proxy))


def refused(port: int, reason: str) -> float:
    return metric(port, "sluice_fleet_records_refused_total", reason=reason)


def installs(proxy: SluiceProxy) -> int:
    return len(events(proxy, "chain_installed"))


def test_unreadable_policy_records_block_at_most_their_own_topic(
    broker: TansuBroker, start_proxy: Callable[..., SluiceProxy], tmp_path: Path
) -> None:
    topic, clear, broken = unique("pol-kept"), unique("pol-clear"), unique("pol-broken")
    fleet_topic, port = unique("_sluice_filters"), free_port()
    for t in (topic, clear, broken):
        create_topic(broker.bootstrap, t)
    proxy = start_proxy(config=config(tmp_path, fleet_topic, port))
    deploy(broker, fleet_topic, unique("elsewhere"))
    wait_for(functools.partial(bound, proxy, {"pii"}), 30, "deploy")
    incremental(proxy.bootstrap, topic, KEY, POLICY)
    binding = f"policy:{topic}/pii"
    wait_for(functools.partial(bound, proxy, {"pii", binding}), 30, "policy bound")

    key = f"policy:{topic}".encode()
    off = json.dumps({"filters": []})
    tampered = json.loads(sign(proxy_key(), key, dict(policy_payload(topic, off, "x"),
                                                      seq=next_seq())))
    tampered["signed"] = tampered["signed"].replace('"set_by":"x"', '"set_by":"y"')
    huge = json.dumps({"format": 2, "signed": "x" * (1024 * 1024 + 1),
                       "key_id": proxy_key().key_id, "signature": "AAAA"}).encode()
    confluent_produce(broker.bootstrap, fleet_topic, [
        (key, b"{not json"),                                                    # unreadable
        (key, sign(proxy_key(), key, {"type": "filter", "seq": next_seq(),      # unreadable
                                      "name": "pii"})),
        (key, sign(proxy_key(), key, dict(policy_payload(clear, off, "x"),      # unreadable
                                          seq=next_seq()))),
        (key, huge),                                                            # unreadable
        (b"policy:\xff", b"{}"),                                                # unreadable
        (key, json.dumps(tampered).encode()),                                   # bad_signature
        (key, sign(proxy_key(), f"policy:{clear}".encode(), dict(               # bad_signature
            policy_payload(topic, off, "x"), seq=next_seq()))),  # signed for another key
        (key, sign(intruder(), key, dict(policy_payload(topic, off, "x"),       # untrusted_key
                                         seq=next_seq()))),
        (key, policy_record_value(topic, off, "User:forged")),                  # unsigned
        (b"policy:", b"{}"), (b"policy:a/b", b"{}"),                            # invalid_name
        (f"policy:{topic}*".encode(), b"{}"),                                   # invalid_name
        # Signed by a trusted key, but not a policy: blocks `broken` and nothing else.
        (f"policy:{broken}".encode(), sign(proxy_key(), f"policy:{broken}".encode(), dict(
            policy_payload(broken, "not a policy", "x"), seq=next_seq()))),
    ], **{"message.max.bytes": 4 * 1024 * 1024})
    wait_for(lambda: metric(port, "sluice_fleet_records_refused_total") >= 12, 30, "refusals")
    wait_for(functools.partial(bound, proxy, {f"policy:{broken}/*"}), 30, "broken blocked")
    assert {r: refused(port, r) for r in ("unreadable", "bad_signature", "untrusted_key",
                                          "unsigned", "invalid_name", "replay")} == {
        "unreadable": 5, "bad_signature": 2, "untrusted_key": 1, "unsigned": 1,
        "invalid_name": 3, "replay": 0}
    assert bound(proxy, {"pii", binding})
    masked = produce_and_read(broker, proxy, topic, "kept")
    assert b"@example.com" not in masked and b"+" in masked, masked
    assert b"@example.com" in produce_and_read(broker, proxy, clear, "clear")
    codes = produce(proxy.port, {broken: batch(b"k", b"v"), clear: batch(b"k", b"v")})
    assert codes[clear] == 0 and codes[broken] != 0, codes
    # Logged once per reason at most, never with the record's contents.
    refusals = events(proxy, "fleet_record_refused")
    assert 1 <= len(refusals) <= 5 and not any("xxxx" in json.dumps(e) for e in refusals)


def test_an_older_signed_policy_written_again_does_not_roll_back(
    broker: TansuBroker, start_proxy: Callable[..., SluiceProxy], tmp_path: Path
) -> None:
    topic, fleet_topic, port = unique("pol-rollback"), unique("_sluice_filters"), free_port()
    create_topic(broker.bootstrap, topic)
    proxy = start_proxy(config=config(tmp_path, fleet_topic, port))
    deploy(broker, fleet_topic, unique("elsewhere"))
    wait_for(functools.partial(bound, proxy, {"pii"}), 30, "deploy")
    incremental(proxy.bootstrap, topic, KEY, POLICY)  # masks with '+'
    wait_for(functools.partial(bound, proxy, {f"policy:{topic}/pii"}), 30, "policy bound")
    before = installs(proxy)
    newer = POLICY.replace('"mask": "+"', '"mask": "="')
    assert newer != POLICY
    incremental(proxy.bootstrap, topic, KEY, newer)
    wait_for(lambda: installs(proxy) > before, 30, "newer policy installed")
    assert b"=" in produce_and_read(broker, proxy, topic, "newer")
    key = f"policy:{topic}".encode()
    old = next(v for k, v in fleet_values(broker, fleet_topic) if k == key)
    assert json.loads(json.loads(old)["signed"])["value"] == POLICY  # the '+' policy
    confluent_produce(broker.bootstrap, fleet_topic, [(key, old)])
    wait_for(lambda: refused(port, "replay") >= 1, 30, "replay refused")
    value = produce_and_read(broker, proxy, topic, "after-replay")
    assert b"@example.com" not in value and b"=" in value and b"+" not in value, value


def alter_legacy(port: int, resource: str, configs: dict[str, str]) -> tuple[int, str]:
    """Kafka's legacy AlterConfigs (v1) of one topic resource, as raw frames."""
    api = ApiKey.ALTER_CONFIGS
    answer = call(port, api, 1, validate_only=False, resources=(item(
        api, 1, ("resources",), resource_type=2, resource_name=resource, configs=tuple(
            item(api, 1, ("resources", "configs"), name=n, value=v) for n, v in configs.items())
    ),))
    [result] = answer.responses
    return int(result.error_code), str(result.error_message or "")


def test_policies_name_one_topic_and_legacy_alter_configs_never_reach_the_broker(
    broker: TansuBroker, start_proxy: Callable[..., SluiceProxy], tmp_path: Path
) -> None:
    topic, fleet_topic = unique("pol-legacy"), unique("_sluice_filters")
    create_topic(broker.bootstrap, topic)
    proxy = start_proxy(config=config(tmp_path, fleet_topic, None))
    deploy(broker, fleet_topic, unique("elsewhere"))
    wait_for(functools.partial(bound, proxy, {"pii"}), 30, "deploy")
    # A policy admin on a glob resource: refused, through either API, and nothing recorded.
    with pytest.raises(KafkaException) as info:
        incremental(proxy.bootstrap, "c*", KEY, POLICY)
    assert info.value.args[0].code() == KafkaError.INVALID_CONFIG
    code, message = alter_legacy(proxy.port, "c*", {"X-Data-Policy": POLICY})
    assert code == INVALID_CONFIG and "not a Kafka topic name" in message, message
    # The legacy API with the key in another case: handled by the proxy (bound, signed),
    # never sent to the broker.
    code, message = alter_legacy(proxy.port, topic, {"X-Data-Policy": POLICY})
    assert code == 0, message
    wait_for(functools.partial(bound, proxy, {f"policy:{topic}/pii"}), 30, "legacy policy bound")
    masked = produce_and_read(broker, proxy, topic, "legacy")
    assert b"@example.com" not in masked and b"+" in masked, masked
    assert KEY not in broker_configs(broker, topic)
    keys = [k for k, _v in fleet_values(broker, fleet_topic)]
    assert f"policy:{topic}".encode() in keys
    assert not [k for k in keys if k.startswith(b"policy:c")]


@pytest.mark.serial
@pytest.mark.kafka
def test_fleet_topic_truncated_on_the_broker_keeps_the_filters(
    kafka_broker: KafkaCluster, tmp_path: Path
) -> None:
    broker: Any = kafka_broker  # DeleteRecords: Apache Kafka's own rules
    topic, fleet_topic, port = unique("trunc-data"), unique("_sluice_filters"), free_port()
    create_topic(broker.bootstrap, topic)
    with SluiceProxy(upstream=broker.bootstrap,
                     config=config(tmp_path, fleet_topic, port)) as proxy:
        deploy(broker, fleet_topic, topic)
        wait_for(functools.partial(bound, proxy, {"pii"}), 30, "deploy")
        assert b"#" in produce_and_read(broker, proxy, topic, "before")
        # Kafka refuses DeleteRecords on a compact-only topic (POLICY_VIOLATION): an attacker
        # with broker access but no key first adds `delete`, then deletes everything up to
        # the end (-1: the high watermark).
        incremental(broker.bootstrap, fleet_topic, "cleanup.policy", "compact,delete")
        admin = AdminClient({"bootstrap.servers": broker.bootstrap, **QUIET})
        for future in admin.delete_records([TopicPartition(fleet_topic, 0, -1)]).values():
            future.result(30)
        lost = wait_for(lambda: events(proxy, "fleet_topic_lost"), 40, "fleet_topic_lost")
        assert lost[0]["level"] == "error" and lost[0]["keeping_filters"] == ["pii"]
        assert metric(port, "sluice_fleet_topic_lost_total") >= 1
        assert "pii" in running(proxy)
        assert b"#" in produce_and_read(broker, proxy, topic, "after-truncation")


def padded_module(tag: int, size: int) -> bytes:
    """pii-mask with a custom section of random bytes: a distinct module of about `size`."""
    name = b"padding-%d" % tag
    payload = _leb128(len(name)) + name + os.urandom(size)
    return (BUILTIN_DIR / "pii-mask.wasm").read_bytes() + b"\x00" + _leb128(len(payload)) \
        + payload


def test_fleet_module_cache_stays_within_its_bound(
    broker: TansuBroker, start_proxy: Callable[..., SluiceProxy], tmp_path: Path
) -> None:
    topic, fleet_topic = unique("cache-data"), unique("_sluice_filters")
    create_topic(broker.bootstrap, topic)
    path = tmp_path / "sluice.yaml"
    path.write_text(f"fleet:\n  topic: {fleet_topic}\n  poll_seconds: 0.5\n"
                    f"  cache_max_mb: 1\n{trust_yaml()}module_cache_dir: cache\n",
                    encoding="utf-8")
    proxy = start_proxy(config=path)
    cache = tmp_path / "cache" / "fleet"
    shas = []
    for n in range(4):
        module = tmp_path / f"m{n}.wasm"
        module.write_bytes(padded_module(n, 400 * 1024))
        shas.append(hashlib.sha256(module.read_bytes()).hexdigest())
        proc = sluice("filter", "deploy", "pii", str(module), "--topics", topic, "--on",
                      "produce", "--wait", "30", *fleet_args(broker, fleet_topic))
        assert proc.returncode == 0, proc.stdout + proc.stderr

        def settled(sha: str = shas[-1]) -> bool:
            files = {p.name: p.stat().st_size for p in cache.glob("*.wasm")}
            return f"{sha}.wasm" in files and sum(files.values()) <= 1024 * 1024
        wait_for(settled, 30, f"module {n} cached within the bound")
    left = {p.name for p in cache.glob("*.wasm")}
    assert f"{shas[0]}.wasm" not in left and f"{shas[1]}.wasm" not in left, left
    assert f"{shas[-1]}.wasm" in left
    masked = produce_and_read(broker, proxy, topic, "cached")
    assert b"@example.com" not in masked
