"""Kafka's default partitioner (murmur2): the Java client's reference values, and the partition
librdkafka's `murmur2_random` partitioner really chose for the same keys on a live broker."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sluice.codec.partitioner import murmur2, partition_for_key
from tests.e2e.clients import confluent_produce, create_topic, unique
from tests.harness.broker import TansuBroker


def test_murmur2_matches_the_java_clients_reference_values() -> None:
    # Apache Kafka's UtilsTest.testMurmur2 (clients/src/test/.../utils/UtilsTest.java).
    cases = {
        b"21": -973932308,
        b"foobar": -790332482,
        b"a-little-bit-long-string": -985981536,
        b"a-little-bit-longer-string": -1486304829,
        b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8": -58897971,
        bytes([ord("a"), ord("b"), ord("c")]): 479470107,
    }
    for key, expected in cases.items():
        assert murmur2(key) == expected, key


@given(st.binary(max_size=64), st.integers(min_value=1, max_value=10_000))
def test_partition_is_in_range_and_ignores_the_sign(key: bytes, partitions: int) -> None:
    p = partition_for_key(key, partitions)
    assert 0 <= p < partitions
    assert p == (murmur2(key) & 0x7FFFFFFF) % partitions


def test_partition_count_must_be_positive() -> None:
    with pytest.raises(ValueError):
        partition_for_key(b"k", 0)


def test_partitions_match_librdkafka_murmur2_random(broker: TansuBroker) -> None:
    """The golden truth: confluent-kafka (librdkafka, Java-compatible partitioner) produces the
    keys, and the delivery reports say where each landed."""
    topic = unique("murmur2")
    partitions = 7
    create_topic(broker.bootstrap, topic, partitions)
    keys = [f"key-{i}".encode() for i in range(150)]
    keys += [b"\x00", b"\xff\xfe\xfd", b"a-little-bit-longer-string", bytes(range(256))]
    placed = confluent_produce(
        broker.bootstrap, topic, [(k, b"v") for k in keys], partitioner="murmur2_random"
    )
    landed = {key: partition for key, (partition, _) in zip(keys, placed, strict=True)}
    assert len(set(landed.values())) == partitions  # the keys spread over every partition
    for key, partition in landed.items():
        assert partition_for_key(key, partitions) == partition, key
