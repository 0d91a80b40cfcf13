"""Seed 000's Rust `transform_record` (serde_json + chrono), built as written with
`cargo build --target wasm32-unknown-unknown --release` from the committed Cargo.lock
(filters/examples/seed000-rust), run unmodified on the in-place ABI: in the filter runtime, as a
produce filter behind a real proxy in front of Tansu, and as a transform from an input topic into
an output topic (seed 000's `rpk transform create --input-topic --output-topic`).

What "as written" gives outside Redpanda: a record that already has a timestamp is parsed and
written back by serde_json (members sorted, whitespace gone), or dropped (-2) without a
user_id; a record without a timestamp reaches `chrono::Utc::now()`, which panics on
wasm32-unknown-unknown (the target has no clock), so the call traps and the failure policy
applies. Text that is not JSON returns -1, an error.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest
from confluent_kafka import KafkaError, Producer

from sluice.filters.config import FilterSpec
from sluice.filters.context import FilterRecord, RecordContext
from sluice.filters.decisions import Action
from sluice.filters.runtime import load_filter
from sluice.transforms.config import load_transform_specs
from sluice.transforms.supervisor import TransformSupervisor
from tests.e2e.clients import QUIET, create_topic, unique
from tests.harness.broker import TansuBroker
from tests.harness.proxy import SluiceProxy
from tests.transforms.committed_log import committed_records

MODULE = (Path(__file__).resolve().parents[2] / "filters" / "examples" / "seed000-rust"
          / "seed000-rust.wasm")
STAMPED = b'{ "user_id": 7,  "timestamp": "2020-01-01T00:00:00.000Z", "event": "click" }'
STAMPED_OUT = b'{"event":"click","timestamp":"2020-01-01T00:00:00.000Z","user_id":7}'
ANONYMOUS = b'{"timestamp": "2020-01-01T00:00:00.000Z", "event": "view"}'
UNSTAMPED = b'{"user_id": 8, "event": "buy"}'


def test_runs_unmodified_on_the_inplace_abi() -> None:
    f = load_filter(FilterSpec(name="seed000", module=str(MODULE)))
    assert f.abi == "inplace"
    ctx = RecordContext(topic="raw-events", partition=0, direction="produce", client_id="t")
    recs = [FilterRecord(i, 0, b"k", v, []) for i, v in
            enumerate([STAMPED, ANONYMOUS, UNSTAMPED, b"not json"])]
    got = f.run_batch(ctx, recs, apply_policy=False).decisions
    assert (got[0].action, got[0].value) == (Action.REWRITE, STAMPED_OUT)
    assert got[1].action == Action.DROP
    assert got[2].action == Action.REJECT and got[2].failure is not None
    assert "unreachable" in got[2].failure  # chrono::Utc::now() panicked: no clock
    assert got[3].failure is not None and "returned -1" in got[3].failure


def _produce(bootstrap: str, topic: str, values: list[bytes]) -> list[KafkaError | None]:
    errors: list[KafkaError | None] = []
    p = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": False,
                  "linger.ms": 0, "retries": 0, **QUIET})
    for v in values:
        p.produce(topic, v, b"k", on_delivery=lambda err, _msg: errors.append(err))
        p.flush(30)  # one record per batch: a reject fails only its own
    return errors


def test_as_a_produce_filter_behind_the_proxy(tmp_path: Path, broker: TansuBroker,
                                              start_proxy: Callable[..., SluiceProxy]) -> None:
    cfg = tmp_path / "sluice.yaml"
    cfg.write_text(f"filters:\n  - name: seed000\n    module: {MODULE}\n"
                   "    topics: [\"raw-events-*\"]\n    apply_to: [produce]\n")
    proxy = start_proxy(config=cfg)
    topic = f"raw-events-{uuid.uuid4().hex[:8]}"
    create_topic(broker.bootstrap, topic, 1)
    errors = _produce(proxy.bootstrap, topic, [STAMPED, ANONYMOUS, UNSTAMPED])
    assert errors[0] is None and errors[1] is None
    assert errors[2] is not None and errors[2].code() == KafkaError.INVALID_RECORD
    stored = [v for _o, _k, v in committed_records(broker.bootstrap, topic, 0)]
    assert stored == [STAMPED_OUT]


@pytest.mark.serial
def test_as_a_transform_into_an_output_topic(tmp_path: Path, broker: TansuBroker) -> None:
    bs = broker.bootstrap
    raw, processed, dlq = unique("raw-events"), unique("processed-events"), unique("dlq")
    for t in (raw, processed, dlq):
        create_topic(bs, t, 1)
    cfg = tmp_path / "sluice.yaml"
    cfg.write_text(f"transforms:\n  - name: my-wasm-transform\n    input: {raw}\n"
                   f"    output: {processed}\n"
                   f"    filters: [{{name: seed000, module: {MODULE}, "
                   f"function: transform_record, on_error: dead-letter, "
                   f"dead_letter_topic: {dlq}}}]\n")
    assert _produce(bs, raw, [STAMPED, ANONYMOUS, UNSTAMPED]) == [None, None, None]
    supervisor = TransformSupervisor(load_transform_specs(cfg), bs)
    supervisor.prepare()
    supervisor.start()
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            (status,) = [s.snapshot() for s in supervisor.statuses()]
            if status.records_in == 3 and status.total_lag == 0:
                break
            time.sleep(0.2)
    finally:
        supervisor.stop()
    assert [v for _o, _k, v in committed_records(bs, processed, 0)] == [STAMPED_OUT]
    assert [v for _o, _k, v in committed_records(bs, dlq, 0)] == [UNSTAMPED]
    assert status.dropped == 1 and status.dead_letters == 1
