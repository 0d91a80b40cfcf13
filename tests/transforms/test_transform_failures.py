"""Failure policies in a transform are the inline chain's: reject (not written, counted), pass
(written unchanged) and dead-letter (copied with the chain's headers, in the transaction)."""

from __future__ import annotations

import time
from pathlib import Path

import wasmtime
from confluent_kafka import Consumer, Producer, TopicPartition

from sluice.transforms.config import load_transform_specs
from sluice.transforms.supervisor import TransformSupervisor
from tests.e2e.clients import QUIET, create_topic, unique
from tests.harness.broker import TansuBroker
from tests.transforms.committed_log import committed_records

MODULES = Path(__file__).resolve().parents[1] / "filters" / "modules"
VALUES = [b"ok one", b"TRAP two", b"ok three"]


def _values(bootstrap: str, topic: str) -> list[bytes]:
    return [v or b"" for _o, _k, v in committed_records(bootstrap, topic, 0)]


def test_failure_policies(broker: TansuBroker, tmp_path: Path) -> None:
    bs = broker.bootstrap
    module = tmp_path / "sluice_upper.wasm"
    module.write_bytes(wasmtime.wat2wasm((MODULES / "sluice_upper.wat").read_text()))
    src, dlq = unique("in"), unique("dlq")
    outs = {policy: unique(f"out-{policy}") for policy in ("reject", "pass", "dead-letter")}
    for topic in (src, dlq, *outs.values()):
        create_topic(bs, topic, 1)
    body = "transforms:\n"
    for policy, out in outs.items():
        body += (f"  - name: t-{policy}\n    input: {src}\n    output: {out}\n"
                 f"    guarantee: exactly-once\n"
                 f"    filters: [{{name: up, module: {module}, on_error: {policy}"
                 + (f", dead_letter_topic: {dlq}" if policy == "dead-letter" else "") + "}]\n")
    config = tmp_path / "sluice.yaml"
    config.write_text(body)
    producer = Producer({"bootstrap.servers": bs, **QUIET})
    for value in VALUES:
        producer.produce(src, value, b"k", partition=0)
    assert producer.flush(10) == 0
    supervisor = TransformSupervisor(load_transform_specs(config), bs)
    supervisor.prepare()
    supervisor.start()
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            statuses = [s.snapshot() for s in supervisor.statuses()]
            if all(s.records_in == len(VALUES) and s.total_lag == 0 for s in statuses):
                break
            time.sleep(0.2)
        by_name = {s.name: s for s in statuses}
    finally:
        supervisor.stop()
    assert by_name["t-reject"].rejected == 1 and by_name["t-reject"].records_out == 2
    assert _values(bs, outs["reject"]) == [b"OK ONE", b"OK THREE"]
    assert _values(bs, outs["pass"]) == [b"OK ONE", b"TRAP two", b"OK THREE"]
    assert _values(bs, outs["dead-letter"]) == [b"OK ONE", b"OK THREE"]
    assert by_name["t-dead-letter"].dead_letters == 1
    consumer = Consumer({"bootstrap.servers": bs, "group.id": unique("g"), **QUIET})
    consumer.assign([TopicPartition(dlq, 0, 0)])
    letter = None
    deadline = time.monotonic() + 15
    while letter is None and time.monotonic() < deadline:
        m = consumer.poll(0.2)
        if m is not None and not m.error():
            letter = m
    consumer.close()
    assert letter is not None and letter.value() == b"TRAP two" and letter.key() == b"k"
    headers = {k: v for k, v in letter.headers() or []}
    assert headers["sluice.filter"] == b"up"
    assert headers["sluice.source.topic"] == src.encode()
    assert headers["sluice.source.direction"] == b"fetch"
    assert b"trap" in (headers["sluice.reason"] or b"").lower()
