"""Failure policies in a transform are the inline chain's: reject (not written, counted), pass
(written unchanged) and dead-letter (copied with the chain's headers, in the transaction)."""

from __future__ import annotations

import time
from pathlib import Path

import wasmtime
from confluent_kafka import Consumer, Producer, TopicPartition

from sluice.transforms.config import load_transform_specs
from sluice.transforms.listing import transform_lag
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
    create_topic(bs, src, 2)
    for topic in (dlq, *outs.values()):
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
    # Partition 1: one record every filter fails on, so t-reject writes nothing for it (an
    # exactly-once batch with no output still commits its offset).
    producer.produce(src, b"TRAP alone", b"k", partition=1)
    assert producer.flush(10) == 0
    supervisor = TransformSupervisor(load_transform_specs(config), bs)
    supervisor.prepare()
    supervisor.start()
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            statuses = [s.snapshot() for s in supervisor.statuses()]
            if all(s.records_in == len(VALUES) + 1 and s.total_lag == 0 for s in statuses):
                break
            time.sleep(0.2)
        by_name = {s.name: s for s in statuses}
    finally:
        supervisor.stop()
    assert by_name["t-reject"].rejected == 2 and by_name["t-reject"].records_out == 2
    for spec in load_transform_specs(config):
        rows = transform_lag(spec, bs)
        assert [(r.partition, r.committed, r.lag) for r in rows] == [(0, 3, 0), (1, 1, 0)]
    assert _values(bs, outs["reject"]) == [b"OK ONE", b"OK THREE"]
    assert sorted(_values(bs, outs["pass"])) == [b"OK ONE", b"OK THREE", b"TRAP alone",
                                                 b"TRAP two"]
    assert _values(bs, outs["dead-letter"]) == [b"OK ONE", b"OK THREE"]
    assert by_name["t-dead-letter"].dead_letters == 2
    consumer = Consumer({"bootstrap.servers": bs, "group.id": unique("g"), **QUIET})
    consumer.assign([TopicPartition(dlq, 0, 0)])
    letters = []
    deadline = time.monotonic() + 15
    while len(letters) < 2 and time.monotonic() < deadline:
        m = consumer.poll(0.2)
        if m is not None and not m.error():
            letters.append(m)
    consumer.close()
    assert sorted(m.value() for m in letters) == [b"TRAP alone", b"TRAP two"]
    (letter,) = [m for m in letters if m.value() == b"TRAP two"]
    assert letter.key() == b"k"
    headers = {k: v for k, v in letter.headers() or []}
    assert headers["sluice.filter"] == b"up"
    assert headers["sluice.source.topic"] == src.encode()
    assert headers["sluice.source.direction"] == b"fetch"
    assert b"trap" in (headers["sluice.reason"] or b"").lower()
