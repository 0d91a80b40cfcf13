"""Filters on records, end to end: real clients -> `sluice serve` -> validating relay -> Kafka.

Masking on produce and on fetch, drop and reject for plain and idempotent producers with each
compression codec, both seed ABIs, and the offsets telemetry reports. Every batch the proxy
forwards is checked by the relay the way Apache Kafka's broker would check it.
"""

from __future__ import annotations

import json
import struct
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from confluent_kafka import Consumer, Producer, TopicPartition

from sluice.codec.compression import CODEC_NAMES
from sluice.codec.records import BatchHeader, Record, build_batch
from sluice.filters.config import FilterSpec
from sluice.filters.runtime import load_filter
from tests.e2e.clients import (
    QUIET,
    aiokafka_produce,
    confluent_produce,
    create_topic,
    kafka_python_produce,
    unique,
)
from tests.harness.proxy import SluiceProxy
from tests.harness.session_builds import session_module_cache
from tests.harness.validating_relay import (
    Relayed,
    RelayedKafka,
    exchange,
    fetch_batches,
    fetch_stored,
    produce_frame,
    produce_response,
    relayed,
)
from tests.harness.validating_relay import StoredRecord as Stored

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "filters" / "examples"
CODECS = list(CODEC_NAMES)  # none, gzip, snappy, lz4, zstd
INVALID_RECORD = 87
INVALID_DIFFERENT_RECORD = -138  # librdkafka: another record of the same batch was invalid
OUT_OF_ORDER_SEQUENCE_NUMBER = 45
PRODUCER_FENCED = 90
PRODUCE_VERSION = 9


@dataclass(frozen=True)
class Delivery:
    partition: int
    offset: int
    error: int | None
    value: bytes | None


# --------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def stack(broker: object) -> Iterator[Relayed]:
    with relayed(broker) as s:
        yield s


@pytest.fixture(scope="module")
def telemetry_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("telemetry")


@pytest.fixture(scope="module")
def proxy(
    stack: Relayed, tmp_path_factory: pytest.TempPathFactory, telemetry_dir: Path
) -> Iterator[SluiceProxy]:
    def entry(name: str, module: str, topics: str, **kw: Any) -> dict[str, Any]:
        kw.setdefault("apply_to", ["produce"])
        return {"name": name, "module": module, "topics": [topics], **kw}

    require_user = {"required_fields": ["user_id"]}
    config = {
        "module_cache_dir": str(session_module_cache(tmp_path_factory)),
        "telemetry": {"dir": str(telemetry_dir), "format": "jsonl"},
        "filters": [
            entry("mask-in", "builtin:pii-mask", "pmask-*", apply_to=["produce"]),
            entry("mask-out", "builtin:pii-mask", "fmask-*", apply_to=["fetch"]),
            entry(
                "require-user",
                "builtin:json-validate",
                "jvdrop-*",
                config={**require_user, "action": "drop"},
            ),
            entry(
                "require-user-strict",
                "builtin:json-validate",
                "jvreject-*",
                config={**require_user, "action": "reject"},
            ),
            entry(
                "require-user-out",
                "builtin:json-validate",
                "fdrop-*",
                apply_to=["fetch"],
                config={**require_user, "action": "drop"},
            ),
            entry("enrich", str(EXAMPLES / "enrich" / "enrich.wasm"), "enrich-*"),
            entry("enrich-go", str(EXAMPLES / "enrich-go" / "enrich-go.wasm"), "genrich-*"),
            entry("enrich-js", str(EXAMPLES / "enrich-js" / "enrich-js.wasm"), "jsenrich-*"),
            entry("enrich-py", str(EXAMPLES / "enrich-py" / "enrich-py.wasm"), "penrich-*"),
            entry(
                "minify",
                str(EXAMPLES / "inplace-enrich" / "inplace-enrich.wasm"),
                "inplace-*",
                function="transform_record",
            ),
            entry(
                "upper",
                str(EXAMPLES / "connect-functions" / "connect-functions.wasm"),
                "upper-*",
                function="to_upper",
            ),
            entry(
                "keyed",
                str(EXAMPLES / "connect-functions" / "connect-functions.wasm"),
                "v2k-*",
                function="value_to_key",
            ),
        ],
    }
    path = tmp_path_factory.mktemp("records-config") / "sluice.yaml"
    path.write_text(yaml.safe_dump(config))
    # The session's module cache may not hold them yet: the proxy then compiles the Go and
    # JavaScript examples (1-2 MB each, seconds apiece on a loaded machine) before it listens.
    # The Python module (a component with CPython inside) takes tens of seconds to compile on
    # a loaded machine: compile it into the proxy's cache first, so the proxy's start
    # deserializes it, as a proxy restart does.
    load_filter(FilterSpec(name="enrich-py",
                           module=str(EXAMPLES / "enrich-py" / "enrich-py.wasm")),
                cache_dir=config["module_cache_dir"]).close()
    p = SluiceProxy(upstream=stack.bootstrap, config=path).start(timeout=120)
    try:
        yield p
    finally:
        p.stop()


@pytest.fixture(autouse=True)
def relay_stays_clean(stack: Relayed) -> Iterator[None]:
    yield
    stack.relay.assert_clean()


# --------------------------------------------------------------------------- helpers


def produce_report(
    bootstrap: str,
    topic: str,
    items: list[tuple[int, bytes | None, bytes | None]],
    **conf: Any,
) -> list[Delivery]:
    """Produce (partition, key, value) items with confluent-kafka; one Delivery per item in
    send order, errors included (never raises for a delivery error)."""
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "linger.ms": 50,
            "message.timeout.ms": 20000,
            **QUIET,
            **conf,
        }
    )
    results: list[Delivery | None] = [None] * len(items)

    def done(idx: int) -> Any:
        def cb(err: Any, msg: Any) -> None:
            results[idx] = Delivery(
                msg.partition(), msg.offset(), err.code() if err else None, msg.value()
            )

        return cb

    for i, (partition, key, value) in enumerate(items):
        producer.produce(topic, key=key, value=value, partition=partition, on_delivery=done(i))
    assert producer.flush(30) == 0, "records still undelivered (a partition got no answer?)"
    assert all(r is not None for r in results)
    return [r for r in results if r is not None]


def consume(
    bootstrap: str, topic: str, partitions: int, expect: int, **conf: Any
) -> dict[int, list[Stored]]:
    """`expect` records from every partition of `topic`, read by a real consumer (through the
    proxy when `bootstrap` is the proxy's), by partition in offset order."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": unique("reader"),
            "enable.auto.commit": False,
            "check.crcs": True,  # as the Java consumer does by default
            **QUIET,
            **conf,
        }
    )
    out: dict[int, list[Stored]] = {p: [] for p in range(partitions)}
    try:
        consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
        deadline = time.monotonic() + 30
        got = 0
        while got < expect and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is None:
                continue
            assert not msg.error(), msg.error()
            headers = [(str(k), v if isinstance(v, bytes) else None) for k, v in
                       list(msg.headers() or [])]
            out[int(msg.partition() or 0)].append(
                Stored(int(msg.offset() or 0), msg.key(), msg.value(), headers)
            )
            got += 1
        assert got == expect, f"consumed {got} of {expect} records"
        return out
    finally:
        consumer.close()


def broker_records(stack: Relayed, topic: str, partitions: int) -> dict[int, list[Stored]]:
    """What the broker stored, read with raw Fetch requests (not through the proxy)."""
    return fetch_stored(stack.bootstrap, topic, partitions)


def pii_value(i: int) -> bytes:
    return json.dumps(
        {"n": i, "email": f"user{i}@example.com", "card": "4111 1111 1111 1111", "note": "ok"}
    ).encode()


def assert_masked(value: bytes | None, i: int) -> None:
    assert value is not None
    doc = json.loads(value)
    assert doc["n"] == i and doc["note"] == "ok"
    assert "example.com" not in doc["email"] and "@" in doc["email"], doc
    assert set(doc["card"].replace(" ", "")) == {"*"}, doc


def user_event(i: int, with_user: bool) -> bytes:
    doc: dict[str, Any] = {"seq": i}
    if with_user:
        doc["user_id"] = f"u{i}"
    return json.dumps(doc).encode()


def codec_id(codec: str) -> int:
    return CODECS.index(codec)


def raw_batch(values: list[bytes], compression: int) -> bytes:
    now = int(time.time() * 1000)
    records = [Record(i, 0, None, v, []) for i, v in enumerate(values)]
    n = len(records)
    header = BatchHeader(0, 0, -1, 2, 0, compression, n - 1, now, now, -1, -1, -1, n)
    return build_batch(header, records)


# --------------------------------------------------------------------------- masking


@pytest.mark.parametrize("idempotent", [False, True], ids=["plain", "idempotent"])
@pytest.mark.parametrize("codec", CODECS)
def test_mask_on_produce_stores_masked_records(
    stack: Relayed, proxy: SluiceProxy, codec: str, idempotent: bool
) -> None:
    topic = unique("pmask")
    create_topic(proxy.bootstrap, topic, partitions=2)
    n = 40
    confluent_produce(
        proxy.bootstrap,
        topic,
        [(f"k{i}".encode(), pii_value(i)) for i in range(n)],
        # Small batches: several in flight per partition, so sequence numbers are exercised.
        **{"compression.type": codec, "enable.idempotence": idempotent, "batch.num.messages": 4},
    )
    stored = broker_records(stack, topic, 2)
    values = [r.value for part in stored.values() for r in part]
    assert len(values) == n
    for value in values:
        assert value is not None
        assert_masked(value, json.loads(value)["n"])
    seen = stack.relay.validator.batches_for(topic)
    assert len(seen) >= 10 and {b.header.compression for b in seen} == {codec_id(codec)}
    assert all(b.header.has_producer_id == idempotent for b in seen)


@pytest.mark.parametrize("codec", CODECS)
def test_mask_on_fetch_keeps_stored_records_intact(
    stack: Relayed, proxy: SluiceProxy, codec: str
) -> None:
    topic = unique("fmask")
    create_topic(proxy.bootstrap, topic, partitions=2)
    n = 30
    sent = {i: pii_value(i) for i in range(n)}
    confluent_produce(
        proxy.bootstrap,
        topic,
        [(f"k{i}".encode(), v) for i, v in sent.items()],
        **{"compression.type": codec},
    )
    stored = broker_records(stack, topic, 2)
    assert sorted(r.value for p in stored.values() for r in p if r.value) == sorted(sent.values())
    via_proxy = consume(proxy.bootstrap, topic, 2, n)
    for p, records in via_proxy.items():
        # Same offsets and keys as stored; only values changed.
        assert [(r.offset, r.key) for r in records] == [(r.offset, r.key) for r in stored[p]]
        for r in records:
            assert r.key is not None
            assert_masked(r.value, int(r.key[1:]))


# --------------------------------------------------------------------------- drop and reject


@pytest.mark.parametrize("codec", CODECS)
def test_drop_with_plain_producer_stores_the_rest(
    stack: Relayed, proxy: SluiceProxy, codec: str
) -> None:
    topic = unique("jvdrop")
    create_topic(proxy.bootstrap, topic, partitions=2)
    items: list[tuple[int, bytes | None, bytes | None]] = [
        (0, None, user_event(i, with_user=i % 3 != 0)) for i in range(30)
    ]
    # Partition 1 gets only records that are dropped: it still needs an answer.
    items += [(1, None, user_event(100 + i, with_user=False)) for i in range(5)]
    deliveries = produce_report(
        proxy.bootstrap, topic, items, **{"compression.type": codec, "enable.idempotence": False}
    )
    assert [d.error for d in deliveries] == [None] * len(items)
    stored = broker_records(stack, topic, 2)
    kept = [v for p, _k, v in items if p == 0 and b"user_id" in (v or b"")]
    assert [r.value for r in stored[0]] == kept
    assert [r.offset for r in stored[0]] == list(range(len(kept)))
    assert stored[1] == []
    seen = stack.relay.validator.batches_for(topic)
    assert {b.partition for b in seen} == {0}
    assert {b.header.compression for b in seen} == {codec_id(codec)}
    assert sum(b.header.record_count for b in seen) == len(kept)


@pytest.mark.parametrize("codec", CODECS)
def test_drop_in_idempotent_batch_becomes_reject(
    stack: Relayed, proxy: SluiceProxy, codec: str
) -> None:
    topic = unique("jvdrop")
    create_topic(proxy.bootstrap, topic, partitions=2)
    conf = {"compression.type": codec, "enable.idempotence": True}
    producer = Producer({"bootstrap.servers": proxy.bootstrap, "linger.ms": 100, **QUIET, **conf})
    first: list[Delivery] = []
    later: list[Delivery] = []

    def sink(into: list[Delivery]) -> Any:
        def cb(err: Any, msg: Any) -> None:
            into.append(
                Delivery(msg.partition(), msg.offset(), err.code() if err else None, msg.value())
            )

        return cb

    # One request: partition 0 holds records without user_id, partition 1 only good ones.
    bad = {user_event(i, with_user=False) for i in (0, 3)}
    for i in range(6):
        value = user_event(i, with_user=i not in (0, 3))
        producer.produce(topic, value, partition=0, on_delivery=sink(first))
    producer.produce(topic, user_event(50, True), partition=1, on_delivery=sink(first))
    assert producer.flush(20) == 0
    by_value = {d.value: d for d in first}
    for i in range(6):
        value = user_event(i, with_user=i not in (0, 3))
        expected = INVALID_RECORD if value in bad else INVALID_DIFFERENT_RECORD
        assert by_value[value].error == expected, by_value[value]
    assert by_value[user_event(50, True)].error is None  # the other partition went through

    # The producer goes on with valid batches (librdkafka bumps its epoch after the error).
    for i in range(60, 64):
        producer.produce(topic, user_event(i, True), partition=0, on_delivery=sink(later))
    assert producer.flush(20) == 0
    assert len(later) == 4
    assert OUT_OF_ORDER_SEQUENCE_NUMBER not in {d.error for d in later}
    seen = stack.relay.validator.batches_for(topic)
    p0 = [b for b in seen if b.partition == 0]
    p1 = [b for b in seen if b.partition == 1]
    assert p0 and all(b.header.record_count == 4 for b in p0)  # the rejected batch never left
    assert p0[0].header.producer_epoch > p1[0].header.producer_epoch
    # The relay checked these batches as Apache Kafka would (a higher epoch starting at
    # sequence 0 is accepted), and Kafka, which handed out the bumped epoch (KIP-360), stores
    # them. Tansu (SLUICE_E2E_BROKER=tansu) fences epochs it did not hand out itself, so there
    # the only error allowed is the broker's own PRODUCER_FENCED.
    broker_codes = {a.error_code for a in stack.relay.validator.answers_for(topic)
                    if a.partition == 0}
    if isinstance(stack, RelayedKafka):
        assert broker_codes == {0}
        assert [d.error for d in later] == [None] * 4
    for d in later:
        assert d.error in (None, PRODUCER_FENCED), d
        if d.error is not None:
            assert PRODUCER_FENCED in broker_codes
    assert p0[0].header.base_sequence == 0


@pytest.mark.parametrize("codec", CODECS)
def test_reject_fails_only_its_partition_in_one_request(
    stack: Relayed, proxy: SluiceProxy, codec: str
) -> None:
    strict, lenient = unique("jvreject"), unique("jvdrop")
    create_topic(proxy.bootstrap, strict, partitions=2)
    create_topic(proxy.bootstrap, lenient, partitions=2)
    cid = codec_id(codec)
    good = [user_event(i, True) for i in range(4)]
    parts = {
        (strict, 0): raw_batch([good[0], user_event(9, False), good[1], b"not json"], cid),
        (strict, 1): raw_batch(good, cid),
        (lenient, 0): raw_batch([good[2], user_event(8, False), good[3]], cid),
        (lenient, 1): raw_batch([user_event(7, False)], cid),  # every record dropped
    }
    (body,) = exchange(proxy.bootstrap, [produce_frame(1, PRODUCE_VERSION, parts)])
    response = produce_response(PRODUCE_VERSION, body)
    answers = {
        (t.name, int(p.index)): p for t in response.responses for p in t.partition_responses
    }
    assert set(answers) == set(parts)
    rejected = answers[(strict, 0)]
    assert int(rejected.error_code) == INVALID_RECORD
    errors = {int(e.batch_index): e.batch_index_error_message for e in rejected.record_errors}
    assert set(errors) == {1, 3}
    assert all(m.startswith("filter require-user-strict: ") for m in errors.values()), errors
    assert "user_id" in errors[1] and rejected.error_message
    for key in ((strict, 1), (lenient, 0), (lenient, 1)):
        assert int(answers[key].error_code) == 0, (key, answers[key])
    stored_strict = broker_records(stack, strict, 2)
    stored_lenient = broker_records(stack, lenient, 2)
    assert stored_strict[0] == []
    assert [r.value for r in stored_strict[1]] == good
    assert [r.value for r in stored_lenient[0]] == [good[2], good[3]]
    assert stored_lenient[1] == []


def test_reject_reason_reaches_the_client(proxy: SluiceProxy) -> None:
    from kafka import KafkaProducer
    from kafka.errors import InvalidRecordError

    topic = unique("jvreject")
    create_topic(proxy.bootstrap, topic)
    producer = KafkaProducer(bootstrap_servers=proxy.bootstrap, retries=0)
    try:
        ok = producer.send(topic, user_event(1, True))
        ok.get(timeout=20)
        bad = producer.send(topic, user_event(2, False))
        with pytest.raises(InvalidRecordError, match=r"filter require-user-strict: .*user_id"):
            bad.get(timeout=20)
        producer.send(topic, user_event(3, True)).get(timeout=20)  # and it carries on
    finally:
        producer.close()


def test_fetch_drop_keeps_emptied_batches(stack: Relayed, proxy: SluiceProxy) -> None:
    topic = unique("fdrop")
    create_topic(stack.bootstrap, topic)
    layout = [(3, False), (2, True), (2, False), (1, True), (2, False)]  # (records, valid?)
    for cid, (count, valid) in enumerate(layout):
        values = [user_event(cid * 10 + i, valid) for i in range(count)]
        frame = produce_frame(cid, PRODUCE_VERSION, {(topic, 0): raw_batch(values, 0)})
        (body,) = exchange(stack.bootstrap, [frame])
        assert int(produce_response(PRODUCE_VERSION, body).responses[0]
                   .partition_responses[0].error_code) == 0
    direct = fetch_batches(stack.bootstrap, topic, 0, 0)
    filtered = fetch_batches(proxy.bootstrap, topic, 0, 0)  # CRCs checked on the way
    assert [(b.header.base_offset, b.header.last_offset_delta) for b in filtered] == [
        (b.header.base_offset, b.header.last_offset_delta) for b in direct
    ]
    assert [b.header.record_count for b in filtered] == [0, 2, 0, 1, 0]
    # The trap: a fetch from the last, emptied batch must still let the consumer advance.
    (last,) = fetch_batches(proxy.bootstrap, topic, 0, 8)
    assert (last.header.base_offset, last.header.next_offset) == (8, 10)
    got = consume(proxy.bootstrap, topic, 1, 3)[0]
    assert [r.offset for r in got] == [3, 4, 7]


def test_transactional_records_and_markers_through_fetch_masking(
    stack: Relayed, proxy: SluiceProxy
) -> None:
    topic = unique("fmask")
    create_topic(proxy.bootstrap, topic)
    producer = Producer(
        {"bootstrap.servers": proxy.bootstrap, "transactional.id": unique("tx"), **QUIET}
    )
    producer.init_transactions(15)
    for start, count in ((0, 4), (10, 2)):
        producer.begin_transaction()
        for i in range(start, start + count):
            producer.produce(topic, pii_value(i), key=f"k{i}".encode())
        producer.commit_transaction(15)
    seen = stack.relay.validator.batches_for(topic)
    assert seen and all(b.header.is_transactional for b in seen)
    # Kafka answers EndTxn once the commit is decided and writes the partition's marker after
    # (Tansu writes it before answering): wait for the second marker.
    deadline = time.monotonic() + 15
    while True:
        direct = fetch_batches(stack.bootstrap, topic, 0, 0)
        markers = [b for b in direct if b.header.is_control]
        if len(markers) >= 2 or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert len(markers) == 2
    filtered = fetch_batches(proxy.bootstrap, topic, 0, 0)
    # Control batches (commit markers) pass through byte for byte.
    assert [bytes(b.data) for b in filtered if b.header.is_control] == [
        bytes(b.data) for b in markers
    ]
    assert all(b.header.is_transactional for b in filtered)
    got = consume(proxy.bootstrap, topic, 1, 6, **{"isolation.level": "read_committed"})[0]
    assert [r.offset for r in got] == [0, 1, 2, 3, 5, 6]
    for r in got:
        assert r.key is not None
        assert_masked(r.value, int(r.key[1:]))


def test_acks_zero_gets_no_answer_even_when_refused(
    stack: Relayed, proxy: SluiceProxy
) -> None:
    topic = unique("jvreject")
    create_topic(proxy.bootstrap, topic)
    frames = [
        produce_frame(1, PRODUCE_VERSION, {(topic, 0): raw_batch([b"{}"], 0)}, acks=0),
        produce_frame(
            2, PRODUCE_VERSION, {(topic, 0): raw_batch([user_event(2, True)], 0)}, acks=0
        ),
        produce_frame(3, PRODUCE_VERSION, {(topic, 0): raw_batch([user_event(3, True)], 0)}),
    ]
    # Only the acks=-1 request is answered, and its answer is the first thing on the wire.
    (body,) = exchange(proxy.bootstrap, frames, replies=1)
    (correlation_id,) = struct.unpack_from(">i", body)
    assert correlation_id == 3
    assert int(produce_response(PRODUCE_VERSION, body).responses[0]
               .partition_responses[0].error_code) == 0
    stored = broker_records(stack, topic, 1)[0]
    assert [r.value for r in stored] == [user_event(2, True), user_event(3, True)]


@pytest.mark.parametrize("version", [3, 5, 7, 8])
def test_reject_answers_every_produce_version(
    stack: Relayed, proxy: SluiceProxy, version: int
) -> None:
    topic = unique("jvreject")
    create_topic(proxy.bootstrap, topic)
    bad = produce_frame(1, version, {(topic, 0): raw_batch([b"{}"], 0)})
    good = produce_frame(2, version, {(topic, 0): raw_batch([user_event(1, True)], 0)})
    # Both on one connection: the refusal must not cost the client its connection.
    first, second = exchange(proxy.bootstrap, [bad, good])
    refused = produce_response(version, first).responses[0].partition_responses[0]
    assert int(refused.error_code) == INVALID_RECORD
    if version >= 8:
        assert [int(e.batch_index) for e in refused.record_errors] == [0]
    accepted = produce_response(version, second).responses[0].partition_responses[0]
    assert int(accepted.error_code) == 0
    assert [r.value for r in broker_records(stack, topic, 1)[0]] == [user_event(1, True)]


def test_python_clients_mask_and_reject(stack: Relayed, proxy: SluiceProxy) -> None:
    import aiokafka.errors
    import kafka.errors

    clients: list[tuple[Any, str, dict[str, Any]]] = [
        (kafka_python_produce, "gzip", {"retries": 0}),
        (aiokafka_produce, "lz4", {}),
    ]
    for produce, compression, no_retry in clients:
        masked = unique("pmask")
        create_topic(proxy.bootstrap, masked)
        produce(
            proxy.bootstrap, masked, [(b"k1", pii_value(1))], compression_type=compression
        )
        (record,) = broker_records(stack, masked, 1)[0]
        assert_masked(record.value, 1)
        strict = unique("jvreject")
        create_topic(proxy.bootstrap, strict)
        # A Kafka error (aiokafka does not know code 87 by name), not a dropped connection.
        with pytest.raises((kafka.errors.InvalidRecordError, aiokafka.errors.UnknownError)):
            produce(proxy.bootstrap, strict, [(None, b"{}")], **no_retry)
        assert broker_records(stack, strict, 1)[0] == []


# --------------------------------------------------------------------------- seed ABIs


@pytest.mark.parametrize("prefix", ["enrich", "genrich", "jsenrich", "penrich"],
                         ids=["c", "go", "js", "python"])
def test_sluice_abi_example_enriches_and_drops(stack: Relayed, proxy: SluiceProxy,
                                               prefix: str) -> None:
    topic = unique(prefix)
    create_topic(proxy.bootstrap, topic)
    items: list[tuple[int, bytes | None, bytes | None]] = [
        (0, None, b'{"user_id": "a"}'),
        (0, None, b'{"anonymous": true}'),
        (0, None, b'{"user_id": "b", "timestamp": "2020-01-01T00:00:00.000Z"}'),
    ]
    deliveries = produce_report(proxy.bootstrap, topic, items, **{"enable.idempotence": False})
    assert [d.error for d in deliveries] == [None] * 3
    stored = [json.loads(r.value or b"") for r in broker_records(stack, topic, 1)[0]]
    assert [d["user_id"] for d in stored] == ["a", "b"]
    assert stored[0]["timestamp"].endswith("Z") and len(stored[0]["timestamp"]) == 24
    assert stored[1]["timestamp"] == "2020-01-01T00:00:00.000Z"


def test_javascript_enrich_rejects_like_the_c_original(proxy: SluiceProxy) -> None:
    """The producer gets the same reject reason (the C SDK parser's message) from the
    JavaScript port as from the C filter, through the proxy; the batch's good record is
    stored by neither (a reject fails the partition's batch)."""
    from kafka import KafkaProducer
    from kafka.errors import InvalidRecordError

    reasons = {}
    for prefix, name in (("enrich", "enrich"), ("jsenrich", "enrich-js")):
        topic = unique(prefix)
        create_topic(proxy.bootstrap, topic)
        producer = KafkaProducer(bootstrap_servers=proxy.bootstrap, retries=0)
        try:
            for value in (b"not json", b"[1]", b'{"user_id": 1,}'):
                with pytest.raises(InvalidRecordError, match=f"filter {name}: ") as err:
                    producer.send(topic, value).get(timeout=20)
                reasons.setdefault(prefix, []).append(
                    str(err.value).split(f"filter {name}: ", 1)[1])
            producer.send(topic, b'{"user_id": 2, "timestamp": 1}').get(timeout=20)
        finally:
            producer.close()
    assert reasons["jsenrich"] == reasons["enrich"]
    assert reasons["enrich"][0].startswith("value is not a JSON object: unexpected token")
    assert reasons["enrich"][1].startswith("value is not a JSON object")
    assert "expected member name" in reasons["enrich"][2]


@pytest.mark.parametrize(("prefix", "name"), [("enrich", "enrich"), ("penrich", "enrich-py")],
                         ids=["c", "python"])
def test_enrich_reject_reason_reaches_the_producer(proxy: SluiceProxy, prefix: str,
                                                   name: str) -> None:
    from kafka import KafkaProducer
    from kafka.errors import InvalidRecordError

    topic = unique(prefix)
    create_topic(proxy.bootstrap, topic)
    producer = KafkaProducer(bootstrap_servers=proxy.bootstrap, retries=0)
    try:
        bad = producer.send(topic, b'{"user_id": 1,}')
        with pytest.raises(InvalidRecordError, match=rf"filter {name}: value is not a JSON "
                                                     r"object: expected member name"):
            bad.get(timeout=20)
        producer.send(topic, b'{"user_id": 2}').get(timeout=20)  # and it carries on
    finally:
        producer.close()


def test_inplace_abi_transform_record(stack: Relayed, proxy: SluiceProxy) -> None:
    topic = unique("inplace")
    create_topic(proxy.bootstrap, topic)
    items: list[tuple[int, bytes | None, bytes | None]] = [
        (0, b"k1", b'{ "user_id" : 1,\n  "tags" : [ "a", "b" ] }'),
        (0, b"k2", b'{ "no_user": true }'),  # transform_record returns -2: dropped
        (0, b"k3", b'{"user_id": 3}'),
    ]
    deliveries = produce_report(proxy.bootstrap, topic, items, **{"enable.idempotence": False})
    assert [d.error for d in deliveries] == [None] * 3
    stored = broker_records(stack, topic, 1)[0]
    assert [(r.key, r.value) for r in stored] == [
        (b"k1", b'{"user_id":1,"tags":["a","b"]}'),
        (b"k3", b'{"user_id":3}'),
    ]
    # Not JSON: transform_record returns -1, an error: on_error reject fails the batch.
    (failed,) = produce_report(
        proxy.bootstrap, topic, [(0, None, b"plain text")], **{"enable.idempotence": False}
    )
    assert failed.error == INVALID_RECORD
    assert len(broker_records(stack, topic, 1)[0]) == 2


def test_connect_abi_to_upper_and_value_to_key(stack: Relayed, proxy: SluiceProxy) -> None:
    upper, keyed = unique("upper"), unique("v2k")
    create_topic(proxy.bootstrap, upper)
    create_topic(proxy.bootstrap, keyed)
    sent = [(f"key-{i}".encode(), f"hello wasm {i}".encode()) for i in range(10)]
    confluent_produce(proxy.bootstrap, upper, sent, **{"compression.type": "lz4"})
    confluent_produce(proxy.bootstrap, keyed, sent, **{"compression.type": "snappy"})
    got_upper = broker_records(stack, upper, 1)[0]
    assert [(r.key, r.value) for r in got_upper] == [(k, v.upper()) for k, v in sent]
    got_keyed = broker_records(stack, keyed, 1)[0]
    assert [(r.key, r.value) for r in got_keyed] == [(v, v) for _k, v in sent]


# --------------------------------------------------------------------------- telemetry


def _produce_events(directory: Path, topic: str) -> list[dict[str, Any]]:
    events = []
    for path in sorted(directory.glob("*.jsonl*")):
        for line in path.read_text().splitlines():
            try:
                event = json.loads(line)
            except json.JSONDecodeError:
                continue  # a line being written
            if (
                event.get("type") == "record_batch"
                and event.get("api") == "produce"
                and event.get("topic") == topic
            ):
                events.append(event)
    return events


def test_telemetry_produce_offsets_are_the_brokers(
    stack: Relayed, proxy: SluiceProxy, telemetry_dir: Path
) -> None:
    topic = unique("pmask")
    create_topic(proxy.bootstrap, topic, partitions=3)
    n = 120
    offsets = confluent_produce(
        proxy.bootstrap,
        topic,
        [(f"k{i}".encode(), pii_value(i)) for i in range(n)],
        **{"compression.type": "gzip", "linger.ms": 1, "batch.num.messages": 7},
    )
    delivered = {(p, o) for p, o in offsets}
    deadline = time.monotonic() + 15
    covered: set[tuple[int, int]] = set()
    while time.monotonic() < deadline:
        events = _produce_events(telemetry_dir, topic)
        covered = {
            (e["partition"], o)
            for e in events
            if e["offset_first"] is not None
            for o in range(e["offset_first"], e["offset_last"] + 1)
        }
        if len(covered) >= n:
            break
        time.sleep(0.2)
    assert covered == delivered
    assert sum(e["records_out"] for e in events) == n
    assert all(e["error_code"] == 0 and e["filters"][0]["name"] == "mask-in" for e in events)
    masked = sum(e["filters"][0]["rewritten"] for e in events)
    assert masked == n


def test_telemetry_offsets_after_drops_are_the_stored_ones(
    stack: Relayed, proxy: SluiceProxy, telemetry_dir: Path
) -> None:
    # The producer's per-record offsets are off after a drop (a documented Kafka-side effect);
    # telemetry must report what the broker stored.
    topic = unique("jvdrop")
    create_topic(proxy.bootstrap, topic)
    items: list[tuple[int, bytes | None, bytes | None]] = [
        (0, None, user_event(i, with_user=i % 4 != 1)) for i in range(40)
    ]
    produce_report(
        proxy.bootstrap, topic, items,
        **{"enable.idempotence": False, "linger.ms": 1, "batch.num.messages": 6},
    )
    stored = {r.offset for r in broker_records(stack, topic, 1)[0]}
    assert len(stored) == 30
    deadline = time.monotonic() + 15
    covered: set[int] = set()
    while time.monotonic() < deadline and covered != stored:
        events = _produce_events(telemetry_dir, topic)
        covered = {
            o
            for e in events
            if e["offset_first"] is not None
            for o in range(e["offset_first"], e["offset_last"] + 1)
        }
        time.sleep(0.2)
    assert covered == stored
    assert sum(e["records_in"] for e in events) == 40
    assert sum(e["filters"][0]["dropped"] for e in events) == 10
