"""The validating relay itself: real clients pass its checks, broken batches are caught.

The filter tests run the proxy against the session's Apache Kafka node behind this relay (which
rewrites Kafka's endpoints to its own): the first tests show that every connection goes through
it there and that Kafka refuses what the relay flags. The tests that show each check can fail
send batches Kafka would refuse, so they run on a Tansu of their own behind the relay: Tansu
stores them, which is why a relay was needed before the filter tests ran on Kafka.
"""

from __future__ import annotations

import struct
import time
from collections.abc import Iterator

import pytest

from sluice.codec.records import BatchHeader, Record, build_batch
from tests.e2e.clients import confluent_consume, confluent_produce, create_topic, unique
from tests.harness.validating_relay import (
    BatchValidator,
    Relayed,
    RelayedBroker,
    exchange,
    produce_frame,
    produce_response,
    relayed,
)

VERSION = 9
CORRUPT_MESSAGE = 2


@pytest.fixture(scope="module")
def kafka_stack(broker: object) -> Iterator[Relayed]:
    """The relay in front of the session's Kafka node (the filter tests' stack)."""
    with relayed(broker) as s:
        yield s


@pytest.fixture(scope="module")
def stack() -> Iterator[RelayedBroker]:
    """A Tansu of its own behind the relay: it stores the broken batches Kafka refuses."""
    with RelayedBroker() as s:
        yield s


def batch(
    n: int,
    *,
    compression: int = 0,
    producer_id: int = -1,
    epoch: int = -1,
    base_sequence: int = -1,
    base_offset: int = 0,
) -> bytes:
    now = int(time.time() * 1000)
    records = [Record(i, i, None, f"v{i}".encode(), []) for i in range(n)]
    header = BatchHeader(
        base_offset, 0, -1, 2, 0, compression, n - 1, now, now + n - 1,
        producer_id, epoch, base_sequence, n,
    )
    return build_batch(header, records)


def send(stack: Relayed, topic: str, records: bytes, cid: int = 1) -> int:
    bodies = exchange(stack.bootstrap, [produce_frame(cid, VERSION, {(topic, 0): records})])
    assert len(bodies) == 1
    response = produce_response(VERSION, bodies[0])
    return int(response.responses[0].partition_responses[0].error_code)


def new_violations(stack: Relayed, before: int) -> list[str]:
    return [str(v) for v in stack.relay.violations[before:]]


@pytest.mark.parametrize("idempotent", [True, False], ids=["idempotent", "plain"])
def test_real_producer_passes_and_every_connection_goes_through_the_relay(
    kafka_stack: Relayed, idempotent: bool
) -> None:
    stack = kafka_stack
    topic = unique("relay-ok")
    create_topic(stack.bootstrap, topic, partitions=2)
    sent = [(f"k{i}".encode(), f"value {i}".encode()) for i in range(200)]
    connections = stack.relay.connections
    confluent_produce(
        stack.bootstrap, topic, sent,
        **{"compression.type": "zstd", "enable.idempotence": idempotent},
    )
    assert stack.relay.connections > connections
    stack.relay.assert_clean()
    seen = stack.relay.validator.batches_for(topic)
    assert sum(b.header.record_count for b in seen) == 200
    assert {b.header.compression for b in seen} == {4}
    assert all(b.header.has_producer_id == idempotent for b in seen)
    assert sorted(confluent_consume(stack.bootstrap, topic, 200)) == sorted(sent)


def test_bad_crc_is_caught_by_the_relay_and_refused_by_kafka(kafka_stack: Relayed) -> None:
    stack = kafka_stack
    topic = unique("relay-kcrc")
    create_topic(stack.bootstrap, topic)
    raw = bytearray(batch(3))
    raw[-1] ^= 0xFF
    before = len(stack.relay.violations)
    assert send(stack, topic, bytes(raw)) == CORRUPT_MESSAGE  # Kafka checks CRCs itself
    assert any("CRC32C mismatch" in v for v in new_violations(stack, before))


def test_bad_crc_is_caught_although_tansu_stores_it(stack: RelayedBroker) -> None:
    """On Tansu: it stores the corrupt batch Kafka refuses (the test above)."""
    topic = unique("relay-crc")
    create_topic(stack.bootstrap, topic)
    raw = bytearray(batch(3))
    raw[-1] ^= 0xFF  # flip a payload byte; the stored CRC no longer matches
    before = len(stack.relay.violations)
    assert send(stack, topic, bytes(raw)) == 0  # Tansu takes it: hence the relay
    assert any("CRC32C mismatch" in v for v in new_violations(stack, before))


def test_count_not_matching_last_offset_delta_is_caught(stack: RelayedBroker) -> None:
    """On Tansu: the broken batches are ones Kafka would refuse; the relay must flag them."""
    topic = unique("relay-count")
    create_topic(stack.bootstrap, topic)
    now = int(time.time() * 1000)
    records = [Record(i, 0, None, b"x", []) for i in range(3)]
    # last_offset_delta 4 for 3 records: Kafka's "Inconsistent batch offset range".
    header = BatchHeader(0, 0, -1, 2, 0, 0, 4, now, now, -1, -1, -1, 3)
    before = len(stack.relay.violations)
    send(stack, topic, build_batch(header, records))
    found = new_violations(stack, before)
    assert any("Inconsistent batch offset range" in v for v in found), found


def test_two_batches_and_nonzero_base_offset_are_caught(stack: RelayedBroker) -> None:
    """On Tansu: the broken batches are ones Kafka would refuse; the relay must flag them."""
    topic = unique("relay-two")
    create_topic(stack.bootstrap, topic)
    before = len(stack.relay.violations)
    send(stack, topic, batch(2) + batch(2))
    send(stack, topic, batch(2, base_offset=7), cid=2)
    found = new_violations(stack, before)
    assert any("2 batches (Produce v3+ needs exactly one)" in v for v in found), found
    assert any("base offset 7" in v for v in found), found


def test_offset_deltas_out_of_order_are_caught(stack: RelayedBroker) -> None:
    """On Tansu: the broken batches are ones Kafka would refuse; the relay must flag them."""
    topic = unique("relay-deltas")
    create_topic(stack.bootstrap, topic)
    now = int(time.time() * 1000)
    records = [Record(d, 0, None, b"x", []) for d in (0, 2, 1)]
    header = BatchHeader(0, 0, -1, 2, 0, 0, 2, now, now, -1, -1, -1, 3)
    before = len(stack.relay.violations)
    send(stack, topic, build_batch(header, records))
    assert any("not 0..n-1" in v for v in new_violations(stack, before))


def test_sequence_gap_is_caught_and_retries_and_new_epochs_are_not(stack: RelayedBroker) -> None:
    """On Tansu: the broken batches are ones Kafka would refuse; the relay must flag them."""
    topic = unique("relay-seq")
    create_topic(stack.bootstrap, topic)
    pid = 987_654
    before = len(stack.relay.violations)
    send(stack, topic, batch(3, producer_id=pid, epoch=0, base_sequence=0))
    send(stack, topic, batch(2, producer_id=pid, epoch=0, base_sequence=3), cid=2)
    send(stack, topic, batch(2, producer_id=pid, epoch=0, base_sequence=3), cid=3)  # a retry
    send(stack, topic, batch(1, producer_id=pid, epoch=1, base_sequence=0), cid=4)  # new epoch
    assert new_violations(stack, before) == []
    send(stack, topic, batch(2, producer_id=pid, epoch=1, base_sequence=3), cid=5)  # gap
    send(stack, topic, batch(1, producer_id=pid, epoch=2, base_sequence=4), cid=6)
    send(stack, topic, batch(1, producer_id=pid, epoch=0, base_sequence=5), cid=7)  # fenced
    send(stack, topic, batch(1, producer_id=pid, epoch=1, base_sequence=-1), cid=8)
    found = new_violations(stack, before)
    assert len(found) == 4, found
    assert "sequence 3 after 0 (OUT_OF_ORDER_SEQUENCE_NUMBER)" in found[0]
    assert "new epoch 2 starts at sequence 4" in found[1]
    assert "epoch 0 is fenced" in found[2]
    assert "an idempotent batch needs both" in found[3]


def test_legacy_magic_and_unknown_codec_are_caught_without_the_broker() -> None:
    validator = BatchValidator()
    legacy = bytearray(batch(1))
    legacy[16] = 1
    unknown = bytearray(batch(1))
    unknown[22] |= 0x07  # low byte of attributes: compression bits 7
    for cid, records in enumerate((bytes(legacy), bytes(unknown))):
        frame = produce_frame(cid, VERSION, {("t", 0): records})
        (size,) = struct.unpack_from(">i", frame)
        validator.check_frame(frame[4 : 4 + size])
    found = [str(v) for v in validator.snapshot()]
    assert any("magic 1" in v for v in found), found
    assert any("unknown compression codec 7" in v for v in found), found
