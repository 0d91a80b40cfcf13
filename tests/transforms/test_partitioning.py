"""Output partitions: same partition when counts match, else Kafka's murmur2 of the key."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from sluice.codec.partitioner import murmur2
from sluice.codec.partitioner import partition_for_key as key_partition
from sluice.transforms.partitioning import output_partition


def test_murmur2_matches_kafka_vectors() -> None:
    # From Apache Kafka's UtilsTest.testMurmur2.
    vectors = {
        b"21": -973932308,
        b"foobar": -790332482,
        b"a-little-bit-long-string": -985981536,
        b"a-little-bit-longer-string": -1486304829,
        b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8": -58897971,
        b"abc": 479470107,
    }
    for data, expected in vectors.items():
        assert murmur2(data) == expected, data


@given(st.binary(max_size=64), st.integers(0, 63), st.integers(1, 64), st.integers(1, 64))
def test_partition_is_in_range(key: bytes, part: int, n_in: int, n_out: int) -> None:
    p = output_partition(key, part % n_in, n_in, n_out)
    assert 0 <= p < n_out
    if n_in == n_out:
        assert p == part % n_in
    else:
        assert p == key_partition(key, n_out)


def test_null_key_keeps_input_partition_modulo() -> None:
    assert output_partition(None, 5, 6, 4) == 1
