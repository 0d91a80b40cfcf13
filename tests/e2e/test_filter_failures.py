"""Failure policies end to end: filters that trap, loop forever and exhaust their memory
(on produce, and on fetch where a failure must never stall the consumer).

The test filter (tests/filters/modules/sluice_upper.wat, compiled here) upper-cases values and
misbehaves on markers: "TRAP..." hits `unreachable`, "LOOP..." never returns (the per-call CPU
deadline stops it), "GROW..." grows memory until the cap refuses, then traps. The same module is
bound three times with `on_error` reject, pass and dead-letter. Whatever it does, the proxy
keeps serving, and every batch it forwards passes the validating relay's Kafka checks.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import wasmtime
import yaml
from confluent_kafka import Producer

from sluice.codec.records import BatchHeader, Record, build_batch
from tests.e2e.clients import QUIET, create_topic, unique
from tests.harness.proxy import SluiceProxy
from tests.harness.session_builds import session_module_cache
from tests.harness.validating_relay import (
    Relayed,
    StoredRecord,
    exchange,
    fetch_batches,
    fetch_stored,
    produce_frame,
    produce_response,
    relayed,
)

MODULES = Path(__file__).resolve().parents[1] / "filters" / "modules"
INVALID_RECORD = 87
TIMEOUT_MS = 50
FAULTS = {"TRAP": "trap", "LOOP": "timeout", "GROW": "memory"}
POLICIES = {"reject": "freject", "pass": "fpass", "dead-letter": "fdl"}
FILTER_NAMES = {"reject": "fault-reject", "pass": "fault-pass", "dead-letter": "fault-dl"}


@pytest.fixture(scope="module")
def stack(broker: object) -> Iterator[Relayed]:
    with relayed(broker) as s:
        yield s


@pytest.fixture(scope="module")
def dlq(stack: Relayed) -> str:
    name = unique("sluice-dlq")
    create_topic(stack.bootstrap, name)
    return name


@pytest.fixture(scope="module")
def proxy(
    stack: Relayed, dlq: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[SluiceProxy]:
    work = tmp_path_factory.mktemp("failures")
    module = work / "sluice_upper.wasm"
    module.write_bytes(wasmtime.wat2wasm((MODULES / "sluice_upper.wat").read_text()))
    limits = {"timeout_ms": TIMEOUT_MS, "max_memory_mb": 4, "apply_to": ["produce"]}
    filters = [
        {
            "name": FILTER_NAMES[policy],
            "module": str(module),
            "topics": [f"{prefix}-*"],
            "on_error": policy,
            **limits,
        }
        for policy, prefix in POLICIES.items()
    ]
    filters[2]["dead_letter_topic"] = dlq
    for policy in ("reject", "pass"):
        filters.append(
            {
                "name": f"fetch-{policy}",
                "module": str(module),
                "topics": [f"ff{policy}-*"],
                "on_error": policy,
                **limits,
                "apply_to": ["fetch"],
            }
        )
    config = {
        "module_cache_dir": str(session_module_cache(tmp_path_factory)),
        "filters": filters,
    }
    path = work / "sluice.yaml"
    path.write_text(yaml.safe_dump(config))
    with SluiceProxy(upstream=stack.bootstrap, config=path) as p:
        yield p


@pytest.fixture(autouse=True)
def relay_stays_clean(stack: Relayed) -> Iterator[None]:
    yield
    stack.relay.assert_clean()


def produce_one(bootstrap: str, topic: str, value: bytes) -> tuple[int | None, float]:
    """Produce one record with confluent-kafka: (error code or None, seconds to the report)."""
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "enable.idempotence": False,
            "linger.ms": 0,
            "message.timeout.ms": 20000,
            **QUIET,
        }
    )
    producer.list_topics(topic, timeout=10)  # connect first: time only the produce
    outcome: list[int | None] = []

    def done(err: Any, _msg: Any) -> None:
        outcome.append(err.code() if err else None)

    start = time.monotonic()
    producer.produce(topic, value, on_delivery=done)
    assert producer.flush(30) == 0
    return outcome[0], time.monotonic() - start


def stored(stack: Relayed, topic: str) -> list[StoredRecord]:
    return fetch_stored(stack.bootstrap, topic, 1)[0]


def headers_of(record: StoredRecord) -> dict[str, bytes]:
    return {k: v or b"" for k, v in record.headers}


@pytest.mark.serial  # measures time: run alone
@pytest.mark.parametrize("policy", list(POLICIES))
@pytest.mark.parametrize("fault", list(FAULTS))
def test_failure_policy(
    stack: Relayed, proxy: SluiceProxy, dlq: str, fault: str, policy: str
) -> None:
    topic = unique(POLICIES[policy])
    create_topic(proxy.bootstrap, topic)
    value = f"{fault} payload {topic}".encode()
    error, seconds = produce_one(proxy.bootstrap, topic, value)
    # The call deadline stops a looping filter after ~timeout_ms: the answer comes fast.
    assert seconds < 3, f"{fault}: the produce took {seconds:.1f}s"
    if policy == "pass":
        assert error is None
        assert [r.value for r in stored(stack, topic)] == [value]  # unchanged
    else:
        assert error == INVALID_RECORD
        assert stored(stack, topic) == []
    if policy == "dead-letter":
        deadline = time.monotonic() + 15
        letters: list[StoredRecord] = []
        while time.monotonic() < deadline and not letters:
            letters = [r for r in stored(stack, dlq) if r.value == value]
            time.sleep(0.1 if not letters else 0)
        assert len(letters) == 1, "the record did not reach the dead-letter topic"
        h = headers_of(letters[0])
        assert h["sluice.filter"] == FILTER_NAMES[policy].encode()
        assert len(h["sluice.filter.sha256"]) == 64
        assert h["sluice.source.topic"] == topic.encode()
        assert h["sluice.source.partition"] == b"0"
        assert h["sluice.source.direction"] == b"produce"
        reason = h["sluice.reason"].decode()
        assert reason.startswith(f"filter {FILTER_NAMES[policy]} failed: {FAULTS[fault]}:"), reason
    # The proxy is up, and the filter (a fresh instance after the trap) works again.
    assert proxy.process is not None and proxy.process.poll() is None
    assert produce_one(proxy.bootstrap, topic, b"after the fault")[0] is None
    assert stored(stack, topic)[-1].value == b"AFTER THE FAULT"


def test_reject_reasons_name_the_filter_and_the_failure_kind(
    stack: Relayed, proxy: SluiceProxy
) -> None:
    topics = {fault: unique("freject") for fault in FAULTS}
    for topic in topics.values():
        create_topic(proxy.bootstrap, topic)
    other = unique("fpass")
    create_topic(proxy.bootstrap, other)
    now = int(time.time() * 1000)

    def batch(value: bytes) -> bytes:
        return build_batch(
            BatchHeader(0, 0, -1, 2, 0, 0, 0, now, now, -1, -1, -1, 1),
            [Record(0, 0, None, value, [])],
        )

    parts = {(t, 0): batch(f"{fault} x".encode()) for fault, t in topics.items()}
    parts[(other, 0)] = batch(b"fine")
    start = time.monotonic()
    (body,) = exchange(proxy.bootstrap, [produce_frame(1, 9, parts)])
    # One loop and one memory exhaustion in the request: still answered quickly.
    assert time.monotonic() - start < 3
    response = produce_response(9, body)
    answers = {t.name: p for t in response.responses for p in t.partition_responses}
    for fault, topic in topics.items():
        answer = answers[topic]
        assert int(answer.error_code) == INVALID_RECORD
        (err,) = answer.record_errors
        assert err.batch_index == 0
        message = err.batch_index_error_message
        assert message.startswith("filter fault-reject"), message
        assert f"filter fault-reject failed: {FAULTS[fault]}: " in message, message
    assert int(answers[other].error_code) == 0
    assert [r.value for r in stored(stack, other)] == [b"FINE"]


@pytest.mark.parametrize("policy", ["reject", "pass"])
def test_fetch_failures_never_stall_the_consumer(
    stack: Relayed, proxy: SluiceProxy, policy: str
) -> None:
    from confluent_kafka import Consumer, TopicPartition

    topic = unique(f"ff{policy}")
    create_topic(stack.bootstrap, topic)
    now = int(time.time() * 1000)
    values = [b"hello", b"TRAP x", b"LOOP y", b"GROW z", b"world"]
    for cid, value in enumerate(values):
        batch = build_batch(
            BatchHeader(0, 0, -1, 2, 0, 0, 0, now, now, -1, -1, -1, 1),
            [Record(0, 0, None, value, [])],
        )
        exchange(stack.bootstrap, [produce_frame(cid, 9, {(topic, 0): batch})])
    batches = fetch_batches(proxy.bootstrap, topic, 0, 0)
    assert [b.header.base_offset for b in batches] == [0, 1, 2, 3, 4]
    counts = [b.header.record_count for b in batches]
    assert counts == ([1, 0, 0, 0, 1] if policy == "reject" else [1, 1, 1, 1, 1])
    consumer = Consumer(
        {
            "bootstrap.servers": proxy.bootstrap,
            "group.id": unique("g"),
            "check.crcs": True,
            **QUIET,
        }
    )
    try:
        consumer.assign([TopicPartition(topic, 0, 0)])
        got: list[bytes | None] = []
        deadline = time.monotonic() + 20
        want = 2 if policy == "reject" else 5
        while len(got) < want and time.monotonic() < deadline:
            msg = consumer.poll(0.3)
            if msg is not None and not msg.error():
                got.append(msg.value())
    finally:
        consumer.close()
    expected = [b"HELLO", b"WORLD"] if policy == "reject" else [b"HELLO", *values[1:4], b"WORLD"]
    assert got == expected
