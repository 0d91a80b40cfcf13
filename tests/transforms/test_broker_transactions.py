"""What the bundled broker does with transactions: the facts docs/TRANSFORMS.md's table and the
runner's design (one transactional id per input partition) rest on. A change in Tansu that
breaks one of them fails here first.

Kept on Tansu (`tansu_broker`), the demo's default: these are Tansu's facts, several of which
Apache Kafka does not share (it hides aborted records from read_committed readers and fences
an old producer with a fatal error rather than a timeout); the transform tests themselves
run on Kafka (tests/transforms/conftest.py)."""

from __future__ import annotations

import time

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition

from tests.e2e.clients import QUIET, create_topic, unique
from tests.harness.broker import TansuBroker
from tests.transforms.committed_log import committed_records


def _member(bootstrap: str, group: str, topic: str) -> Consumer:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group,
                         "session.timeout.ms": 6000, "enable.auto.commit": False, **QUIET})
    consumer.subscribe([topic])
    return consumer


def _until_assigned(*consumers: Consumer, want: list[int], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for c in consumers:
            c.poll(0.1)
        if [len(c.assignment()) for c in consumers] == want:
            return
    raise AssertionError(f"assignments never became {want}")


def test_transactions_offsets_fencing_and_gaps(tansu_broker: TansuBroker) -> None:
    bs = tansu_broker.bootstrap
    src, out, group = unique("in"), unique("out"), unique("g")
    create_topic(bs, src, 2)
    create_topic(bs, out, 1)
    first = _member(bs, group, src)
    _until_assigned(first, want=[2])
    stale = first.consumer_group_metadata()

    producer = Producer({"bootstrap.servers": bs, "transactional.id": unique("tx"), **QUIET})
    producer.init_transactions(15)
    producer.begin_transaction()
    producer.produce(out, b"committed", partition=0)
    producer.send_offsets_to_transaction([TopicPartition(src, 0, 7)], stale, 15)
    producer.commit_transaction(15)
    producer.begin_transaction()
    producer.produce(out, b"aborted", partition=0)
    producer.flush(15)
    producer.send_offsets_to_transaction([TopicPartition(src, 0, 99)], stale, 15)
    producer.abort_transaction(15)
    # Offsets go with the commit, not with the abort.
    (tp,) = first.committed([TopicPartition(src, 0)], 15)
    assert tp.offset == 7

    # Gap 1: read_committed consumers are given the aborted record too.
    reader = Consumer({"bootstrap.servers": bs, "group.id": unique("r"),
                       "isolation.level": "read_committed", **QUIET})
    reader.assign([TopicPartition(out, 0, 0)])
    seen = []
    deadline = time.monotonic() + 10
    while len(seen) < 2 and time.monotonic() < deadline:
        m = reader.poll(0.2)
        if m is not None and not m.error():
            seen.append(m.value())
    reader.close()
    assert seen == [b"committed", b"aborted"]
    assert [v for _o, _k, v in committed_records(bs, out, 0)] == [b"committed"]

    # Gap 2: the offsets of a transaction that wrote no record are dropped (silently: the
    # commit succeeds), so the runner commits those on their own.
    producer.begin_transaction()
    producer.send_offsets_to_transaction([TopicPartition(src, 0, 9)], stale, 15)
    producer.commit_transaction(15)
    (tp,) = first.committed([TopicPartition(src, 0)], 15)
    assert tp.offset == 7

    # Gap 3: the consumer group generation is not checked (KIP-447): after a rebalance, a
    # new transactional producer commits offsets with the old member's metadata.
    second = _member(bs, group, src)
    _until_assigned(first, second, want=[1, 1])
    late = Producer({"bootstrap.servers": bs, "transactional.id": unique("tx"), **QUIET})
    late.init_transactions(15)
    late.begin_transaction()
    late.produce(out, b"late", partition=0)
    late.send_offsets_to_transaction([TopicPartition(src, 0, 11)], stale, 15)
    late.commit_transaction(15)
    (tp,) = second.committed([TopicPartition(src, 0)], 15)
    assert tp.offset == 11
    first.close()
    second.close()


def test_fencing_by_transactional_id(tansu_broker: TansuBroker) -> None:
    bs = tansu_broker.bootstrap
    out, txn = unique("out"), unique("tx")
    create_topic(bs, out, 1)
    old = Producer({"bootstrap.servers": bs, "transactional.id": txn, **QUIET})
    old.init_transactions(15)
    old.begin_transaction()
    old.produce(out, b"in flight", partition=0)
    old.flush(15)
    new = Producer({"bootstrap.servers": bs, "transactional.id": txn, **QUIET})
    new.init_transactions(15)  # aborts the open transaction and fences `old`
    # The fenced producer's EndTxn is not answered with PRODUCER_FENCED: it times out.
    with pytest.raises(KafkaException) as err:
        old.commit_transaction(5)
    assert err.value.args[0].code() == KafkaError._TIMED_OUT
    new.begin_transaction()
    new.produce(out, b"after", partition=0)
    new.commit_transaction(15)
    assert [v for _o, _k, v in committed_records(bs, out, 0)] == [b"after"]
