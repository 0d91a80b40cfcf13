"""The filter fleet end to end: two `sluice serve` processes follow one fleet topic on Tansu;
`sluice filter deploy/remove/list` drive both within seconds."""

from __future__ import annotations

import functools
import hashlib
import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, TopicPartition

from sluice.filters.config import BUILTIN_DIR
from tests.e2e.clients import QUIET, confluent_consume, confluent_produce, create_topic, unique
from tests.harness.broker import TansuBroker
from tests.harness.proxy import SluiceProxy
from tests.proxy.fleet_keys import operator, proxy_key, trust_yaml
from tests.proxy.test_reload import events, telemetry_events, wait_for

PII_SHA = hashlib.sha256((BUILTIN_DIR / "pii-mask.wasm").read_bytes()).hexdigest()
MASKED = re.compile(rb"([*#+]+)@([*#+]+)\.([*#+]+)")


def sluice(*args: str, timeout: float = 60,
           signing_key: str | None = None) -> subprocess.CompletedProcess[str]:
    """Run the CLI; deploy and remove sign with the operator's key ($SLUICE_SIGNING_KEY)."""
    env = dict(os.environ, SLUICE_SIGNING_KEY=signing_key or operator().path,
               SLUICE_TRUSTED_KEYS=f"{operator().path}.pub,{proxy_key().path}.pub")
    return subprocess.run([sys.executable, "-m", "sluice", *args], capture_output=True,
                          text=True, timeout=timeout, env=env)


def fleet_args(broker: TansuBroker, fleet_topic: str) -> list[str]:
    return ["--bootstrap", broker.bootstrap, "--fleet-topic", fleet_topic]


def listing(broker: TansuBroker, fleet_topic: str) -> dict[str, Any]:
    proc = sluice("filter", "list", "--json", *fleet_args(broker, fleet_topic))
    assert proc.returncode == 0, proc.stderr
    data: dict[str, Any] = json.loads(proc.stdout)
    return data


def iso_seconds(text: str) -> float:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def fleet_records(broker: TansuBroker, fleet_topic: str) -> list[tuple[bytes, int]]:
    """(key, timestamp ms) of the fleet topic's filter records."""
    consumer = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": unique("g"),
                         "enable.auto.commit": False, **QUIET})
    try:
        tp = TopicPartition(fleet_topic, 0, 0)
        _low, high = consumer.get_watermark_offsets(tp, timeout=10)
        consumer.assign([tp])
        out: list[tuple[bytes, int]] = []
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is None or msg.error():
                continue
            key = msg.key()
            if key is not None and not key.startswith(b"instance:"):
                out.append((key, msg.timestamp()[1]))
            if (msg.offset() or 0) >= high - 1:
                break  # read up to the end as of the call
        return out
    finally:
        consumer.close()


def installed(proxy: SluiceProxy, generation: int) -> dict[str, Any] | None:
    found = [e for e in events(proxy, "chain_installed") if e["generation"] == generation]
    return found[0] if found else None


def produce_and_read(broker: TansuBroker, via: SluiceProxy, topic: str, tag: str) -> bytes:
    """Produce one record with an e-mail address through `via`; return it as stored."""
    value = f"{tag} mail {tag}@example.com".encode()
    [(partition, offset)] = confluent_produce(via.bootstrap, topic, [(tag.encode(), value)])
    stored = confluent_consume(broker.bootstrap, topic, offset + 1, timeout=30)
    key, got = stored[offset]
    assert key == tag.encode() and partition == 0
    assert got is not None
    return got


def test_fleet_deploy_remove_list_with_two_proxies(
    broker: TansuBroker, start_proxy: Callable[..., SluiceProxy], tmp_path: Path
) -> None:
    topic = unique("fleet-data")
    fleet_topic = unique("_sluice_filters")
    create_topic(broker.bootstrap, topic)
    cache = tmp_path / "modules"
    tele = tmp_path / "telemetry"
    config = tmp_path / "sluice.yaml"
    config.write_text(
        f"fleet:\n  topic: {fleet_topic}\n  heartbeat_seconds: 1\n{trust_yaml()}"
        f"module_cache_dir: {json.dumps(str(cache))}\n"
        f"telemetry:\n  dir: {json.dumps(str(tele))}\n  format: jsonl\n  fsync: false\n",
        encoding="utf-8")
    p1 = start_proxy(config=config)
    p2 = start_proxy(config=config)
    for p in (p1, p2):
        # The first proxy creates the topic; both read it to its end before listening.
        assert events(p, "fleet_synced"), p.output[-5:]
    assert b"@example.com" in produce_and_read(broker, p1, topic, "before1")

    # deploy -> both proxies mask within seconds
    proc = sluice("filter", "deploy", "pii", "builtin:pii-mask", "--topics", topic,
                  "--on", "produce", "--config-json", '{"mask": "#"}',
                  *fleet_args(broker, fleet_topic))
    deployed_at = time.time()
    assert proc.returncode == 0, proc.stderr
    assert f"sha256 {PII_SHA}" in proc.stdout
    for p in (p1, p2):
        ev = wait_for(functools.partial(installed, p, 1), 10, "fleet deploy on a proxy")
        assert [(f["name"], f["sha256"], f["source"]) for f in ev["filters"]] == [
            ("pii", PII_SHA, "fleet")]
    # From the deploy record's timestamp on the broker to the switch in the slower proxy.
    [(_, record_ms)] = [(k, ts) for k, ts in fleet_records(broker, fleet_topic) if k == b"pii"]
    switched = max(iso_seconds(str((installed(p, 1) or {})["timestamp"])) for p in (p1, p2))
    propagation = switched - record_ms / 1000
    assert 0 <= propagation < 5, propagation
    assert time.time() - deployed_at < 10
    for p, tag in ((p1, "after1"), (p2, "after2")):
        value = produce_and_read(broker, p, topic, tag)
        assert b"@example.com" not in value and MASKED.search(value), value
        assert b"#" in value
    assert (cache / "fleet" / f"{PII_SHA}.wasm").read_bytes() == (
        BUILTIN_DIR / "pii-mask.wasm").read_bytes()

    # list: what is deployed, and which instance runs which sha256
    def both_current() -> dict[str, Any] | None:
        data = listing(broker, fleet_topic)
        live = [i for i in data["instances"] if i["live"]]
        running = [f for i in live for f in i["filters"] if f["name"] == "pii"]
        if len(live) == 2 and len(running) == 2:
            return data
        return None

    data = wait_for(both_current, 15, "both heartbeats with pii")
    [f] = data["filters"]
    assert (f["name"], f["sha256"], f["topics"], f["apply_to"], f["config"]) == (
        "pii", PII_SHA, [topic], ["produce"], {"mask": "#"})
    assert sorted(i["pid"] for i in data["instances"]) == sorted(
        p.process.pid for p in (p1, p2) if p.process is not None)
    for inst in data["instances"]:
        [run] = inst["filters"]
        assert (run["sha256"], run["source"], run["fleet_offset"]) == (
            PII_SHA, "fleet", f["offset"])
    text = sluice("filter", "list", *fleet_args(broker, fleet_topic))
    assert text.returncode == 0
    assert text.stdout.count(PII_SHA) == 3 and text.stdout.count("current") == 2

    # A version the proxies cannot run is refused; the running version stays.
    bad = sluice("filter", "deploy", "pii", "builtin:pii-mask", "--topics", topic,
                 "--on", "produce", "--config-json", '{"mask": ""}', "--no-verify",
                 "--wait", "15", *fleet_args(broker, fleet_topic))
    assert bad.returncode == 1, bad.stdout + bad.stderr
    assert bad.stdout.count("refused: ") == 2, bad.stdout
    for p in (p1, p2):
        [refusal] = events(p, "fleet_filter_refused")
        assert refusal["keeping"] == PII_SHA and "mask must be a non-empty" in refusal["reason"]
    assert b"#" in produce_and_read(broker, p2, topic, "still")

    # remove -> both stop masking (deploy --wait / remove --wait report the instances)
    proc = sluice("filter", "remove", "pii", "--wait", "15", *fleet_args(broker, fleet_topic))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.count(": ok") == 2
    for p in (p1, p2):
        ev = wait_for(functools.partial(installed, p, 2), 10, "fleet remove on a proxy")
        assert ev["filters"] == []
    for p, tag in ((p1, "gone1"), (p2, "gone2")):
        assert b"@example.com" in produce_and_read(broker, p, topic, tag)
    assert sluice("filter", "remove", "pii", *fleet_args(broker, fleet_topic)).returncode == 1

    # A stopped proxy says goodbye (tombstone): list shows only the other one.
    p1.stop()
    data = listing(broker, fleet_topic)
    assert data["filters"] == []
    assert [i["pid"] for i in data["instances"]] == [p2.process.pid if p2.process else -1]
    p2.stop()

    # Telemetry names the module version that touched each batch.
    batches = [e for e in telemetry_events(tele)
               if e.get("type") == "record_batch" and e.get("topic") == topic]
    touched = [e for e in batches if e["filters"]]
    assert len(touched) == 3  # after1, after2, still
    assert all(f["name"] == "pii" and f["module_sha256"] == PII_SHA
               for e in touched for f in e["filters"])
    print(f"fleet propagation to both proxies: {propagation:.2f} s")


def test_fleet_filters_follow_the_config_file_filters(
    broker: TansuBroker, start_proxy: Callable[..., SluiceProxy], tmp_path: Path
) -> None:
    """Order: config-file filters first, then fleet filters by name; a fleet filter named like
    a file filter is left out."""
    topic = unique("fleet-order")
    fleet_topic = unique("_sluice_filters")
    create_topic(broker.bootstrap, topic)
    for name in ("zz-second", "aa-first", "mask"):
        proc = sluice("filter", "deploy", name, "builtin:pii-mask", "--topics", topic,
                      "--on", "produce", *fleet_args(broker, fleet_topic))
        assert proc.returncode == 0, proc.stderr
    config = tmp_path / "sluice.yaml"
    config.write_text(
        "filters:\n  - name: mask\n    module: builtin:pii-mask\n"
        f"    topics: [{topic}]\n    apply_to: [produce]\n    config: {{mask: '#'}}\n"
        f"fleet:\n  topic: {fleet_topic}\n  heartbeat_seconds: 1\n{trust_yaml()}",
        encoding="utf-8")
    proxy = start_proxy(config=config)
    ev = events(proxy, "chain_installed")[-1]
    assert [(f["name"], f["source"]) for f in ev["filters"]] == [
        ("mask", "file"), ("aa-first", "fleet"), ("zz-second", "fleet")]
    [shadow] = events(proxy, "fleet_filter_shadowed")
    assert shadow["names"] == ["mask"]
    # The file's filter ('#') ran first, so the fleet's '*' filters found nothing left to mask.
    value = produce_and_read(broker, proxy, topic, "order")
    assert MASKED.search(value) and b"*" not in value.split(b" mail ")[1]


def _leb128(n: int) -> bytes:
    out = bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def test_fleet_carries_a_multi_megabyte_module(
    broker: TansuBroker, start_proxy: Callable[..., SluiceProxy], tmp_path: Path
) -> None:
    """A 3 MiB module (pii-mask plus a custom section of random bytes) travels inline."""
    name = b"padding"
    payload = _leb128(len(name)) + name + os.urandom(3 * 1024 * 1024)
    big = (BUILTIN_DIR / "pii-mask.wasm").read_bytes() + b"\x00" + _leb128(len(payload)) + payload
    module = tmp_path / "big.wasm"
    module.write_bytes(big)
    sha = hashlib.sha256(big).hexdigest()
    topic = unique("fleet-big")
    fleet_topic = unique("_sluice_filters")
    create_topic(broker.bootstrap, topic)
    config = tmp_path / "sluice.yaml"
    config.write_text(f"fleet:\n  topic: {fleet_topic}\n{trust_yaml()}module_cache_dir: cache\n",
                      encoding="utf-8")
    proxy = start_proxy(config=config)
    proc = sluice("filter", "deploy", "big", str(module), "--topics", topic, "--on", "produce",
                  "--wait", "30", *fleet_args(broker, fleet_topic))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"sha256 {sha}" in proc.stdout
    ev = wait_for(functools.partial(installed, proxy, 1), 10, "big module installed")
    assert [f["sha256"] for f in ev["filters"]] == [sha]
    assert (tmp_path / "cache" / "fleet" / f"{sha}.wasm").read_bytes() == big
    value = produce_and_read(broker, proxy, topic, "big")
    assert b"@example.com" not in value and MASKED.search(value)
