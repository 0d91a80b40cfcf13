"""Hot reload under live traffic: a confluent-kafka producer keeps producing through the proxy
while the config file switches pii-mask from '*' to '#' and back, with invalid configs in
between. No client error, every record carries the mask of the chain that was installed when
its batch passed, invalid configs leave the running chain alone, connections stay open."""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import re
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from confluent_kafka import Producer

from sluice.filters.config import BUILTIN_DIR
from tests.e2e.clients import QUIET, confluent_consume, create_topic, unique
from tests.harness.broker import TansuBroker
from tests.harness.proxy import SluiceProxy

PII_SHA = hashlib.sha256((BUILTIN_DIR / "pii-mask.wasm").read_bytes()).hexdigest()
EMAIL = re.compile(rb"([*#]+)@([*#]+)\.([*#]+)")


def config_text(topic: str, mask: str | None, telemetry: Path, apply_to: str = "produce") -> str:
    cfg = f"    config: {{mask: {json.dumps(mask)}}}\n" if mask is not None else ""
    return (
        "filters:\n"
        "  - name: pii\n"
        "    module: builtin:pii-mask\n"
        f"    topics: [{json.dumps(topic)}]\n"
        f"    apply_to: [{apply_to}]\n"
        f"{cfg}"
        "telemetry:\n"
        f"  dir: {json.dumps(str(telemetry))}\n"
        "  format: jsonl\n"
        "  fsync: false\n"
    )


def rewrite(path: Path, text: str) -> float:
    """Replace the file the way editors do (write + rename); returns the time it happened."""
    tmp = path.with_suffix(".tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)
    return time.time()


def events(proxy: SluiceProxy, name: str) -> list[dict[str, Any]]:
    out = []
    for line in list(proxy.output):
        if f'"{name}"' not in line:
            continue
        try:
            event = json.loads(line)
        except ValueError:
            continue
        if event.get("event") == name:
            out.append(event)
    return out


def wait_for(check: Callable[[], Any], timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


class LiveProducer(threading.Thread):
    """Produces records with an e-mail address in a loop until stopped; counts errors."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        super().__init__(daemon=True)
        self.producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5,
                                  "acks": "all", **QUIET})
        self.topic = topic
        self.sent = 0
        self.delivered = 0
        self.errors: list[str] = []
        self.stop_flag = threading.Event()

    def _done(self, err: Any, _msg: Any) -> None:
        if err is not None:
            self.errors.append(str(err))
        else:
            self.delivered += 1

    def run(self) -> None:
        while not self.stop_flag.is_set():
            n = self.sent
            self.producer.produce(self.topic, key=str(n).encode(),
                                  value=f"n={n} mail user{n}@example.com".encode(),
                                  on_delivery=self._done)
            self.sent += 1
            self.producer.poll(0)
            time.sleep(0.003)
        self.producer.flush(30)

    def wait_delivered(self, more: int, timeout: float = 30) -> None:
        target = self.delivered + more
        wait_for(lambda: self.delivered >= target, timeout, f"{more} more deliveries")


def telemetry_events(directory: Path) -> list[dict[str, Any]]:
    out = []
    for file in sorted(directory.glob("*.jsonl")):
        for line in file.read_text(encoding="utf-8").splitlines():
            if line.strip():
                out.append(json.loads(line))
    return out


def test_hot_reload_under_live_traffic(
    broker: TansuBroker, start_proxy: Callable[..., SluiceProxy], tmp_path: Path
) -> None:
    topic = unique("reload")
    create_topic(broker.bootstrap, topic)
    tele = tmp_path / "telemetry"
    path = tmp_path / "sluice.yaml"
    path.write_text(config_text(topic, None, tele), encoding="utf-8")
    proxy = start_proxy(config=path)
    live = LiveProducer(proxy.bootstrap, topic)
    live.start()
    timings: dict[str, float] = {}
    try:
        live.wait_delivered(50)

        # '*' -> '#'
        written = rewrite(path, config_text(topic, "#", tele))
        ev = wait_for(lambda: events(proxy, "chain_installed"), 10, "switch to '#'")[-1]
        timings["to_hash_s"] = time.time() - written
        timings["to_hash_total_ms"] = ev["total_ms"]
        assert ev["trigger"] == "file-changed" and ev["generation"] == 1
        live.wait_delivered(50)

        # Invalid configs: a bad field, then a module config the filter refuses, then bad YAML.
        rewrite(path, config_text(topic, "#", tele, apply_to="prodcue"))
        refused = wait_for(lambda: events(proxy, "config_reload_refused"), 10, "refusal 1")[-1]
        assert refused["file"] == str(path)
        assert refused["line"] == 5 and refused["field"] == "filters[0].apply_to[0]"
        assert "prodcue" in refused["reason"]
        live.wait_delivered(30)
        rewrite(path, config_text(topic, "", tele))
        refused = wait_for(lambda: events(proxy, "config_reload_refused")[1:], 10,
                           "refusal 2")[-1]
        assert refused["field"] == "filters[0].config" and refused["line"] == 2
        assert "mask must be a non-empty string" in refused["reason"]
        rewrite(path, "filters: [\n")
        wait_for(lambda: events(proxy, "config_reload_refused")[2:], 10, "refusal 3")
        live.wait_delivered(30)
        assert len(events(proxy, "chain_installed")) == 1, "an invalid config was installed"

        # back to '*' (SIGHUP path: the file is valid again and the watcher or SIGHUP reloads)
        written = rewrite(path, config_text(topic, "*", tele))
        proxy.send_signal(signal.SIGHUP)
        ev = wait_for(lambda: events(proxy, "chain_installed")[1:], 10, "switch back")[0]
        timings["back_s"] = time.time() - written
        assert ev["generation"] == 2
        live.wait_delivered(50)
    finally:
        live.stop_flag.set()
        live.join(60)
    assert not live.errors, live.errors[:5]
    assert live.delivered == live.sent

    stored = confluent_consume(broker.bootstrap, topic, live.sent, timeout=60)
    assert len(stored) == live.sent
    masks = []
    for key, value in stored:
        assert value is not None and b"@example.com" not in value, (key, value)
        m = EMAIL.search(value)
        assert m is not None, value
        masks.append(chr(m.group(1)[0]))
    # Stored in produce order (one partition): one run of '*', one of '#', one of '*'.
    runs = [masks[0]] + [b for a, b in itertools.pairwise(masks) if a != b]
    assert runs == ["*", "#", "*"], runs
    assert masks.count("#") >= 160  # everything produced while '#' was installed

    # Connections were never reset: no connection closed while the producer ran.
    for name in ("connection_closed_by_proxy", "connection_failed", "upstream_closed",
                 "upstream_connect_failed"):
        assert not events(proxy, name), name
    proxy.stop()
    tel = telemetry_events(tele)
    conns = [e for e in tel if e.get("type") == "connection"]
    opens = [e for e in conns if e.get("phase") == "open"]
    closes = [e for e in conns if e.get("phase") == "close"]
    # librdkafka: one bootstrap connection and one to the broker node; each opened once.
    assert 1 <= len(opens) <= 3, opens
    assert len(closes) == len(opens)  # closed only when the producer went away
    batches = [e for e in tel if e.get("type") == "record_batch" and e.get("topic") == topic]
    assert sum(e["records_out"] for e in batches) == live.sent
    assert {f["name"] for e in batches for f in e["filters"]} == {"pii"}
    assert all(f["module_sha256"] == PII_SHA for e in batches for f in e["filters"])
    print(f"reload timings: {timings}")


def test_rebuilt_module_file_is_reloaded(
    start_proxy: Callable[..., SluiceProxy], tmp_path: Path
) -> None:
    """The watcher also follows the module files the config names (a rebuild in place)."""
    module = tmp_path / "mine.wasm"
    module.write_bytes((BUILTIN_DIR / "pii-mask.wasm").read_bytes())
    path = tmp_path / "sluice.yaml"
    path.write_text("filters:\n  - name: mine\n    module: mine.wasm\n    topics: [t]\n"
                    "    apply_to: [produce]\n", encoding="utf-8")
    proxy = start_proxy(config=path)
    other = (BUILTIN_DIR / "json-validate.wasm").read_bytes()
    tmp = tmp_path / "mine.tmp"
    tmp.write_bytes(other)
    os.replace(tmp, module)
    ev = wait_for(lambda: events(proxy, "chain_installed"), 10, "reload after rebuild")[-1]
    assert ev["trigger"] == "file-changed"
    assert [f["sha256"] for f in ev["filters"]] == [hashlib.sha256(other).hexdigest()]


def test_sighup_without_config_file_is_reported(
    start_proxy: Callable[..., SluiceProxy]
) -> None:
    proxy = start_proxy()
    proxy.send_signal(signal.SIGHUP)
    [ev] = wait_for(lambda: events(proxy, "config_reload_unavailable"), 10, "refusal")
    assert ev["trigger"] == "sighup" and "without --config" in ev["reason"]
    assert proxy.process is not None and proxy.process.poll() is None  # still serving
