"""Where a transform writes each output record: the input partition, or a partition by key.

When the output topic has as many partitions as the input topic, record N of input partition P
goes to output partition P (keys, order and co-partitioning stay as they were). Otherwise the
partition is chosen from the key the way Apache Kafka's Java producer does it (murmur2 of the
key bytes, sign bit cleared, modulo the partition count), so records land where a Java
producer would have put them; a record without a key keeps its input partition modulo the
output's count, which is deterministic (a replay writes to the same partition).
"""

from __future__ import annotations

from typing import Final

_M: Final = 0x5BD1E995
_MASK: Final = 0xFFFFFFFF


def murmur2(data: bytes) -> int:
    """Kafka's murmur2 (org.apache.kafka.common.utils.Utils.murmur2) as a signed 32-bit int."""
    length = len(data)
    h = (0x9747B28C ^ length) & _MASK
    whole = length - length % 4
    for i in range(0, whole, 4):
        k = int.from_bytes(data[i:i + 4], "little")
        k = (k * _M) & _MASK
        k ^= k >> 24
        k = (k * _M) & _MASK
        h = (h * _M) & _MASK
        h ^= k
    tail = length % 4
    if tail == 3:
        h ^= data[whole + 2] << 16
    if tail >= 2:
        h ^= data[whole + 1] << 8
    if tail >= 1:
        h ^= data[whole]
        h = (h * _M) & _MASK
    h ^= h >> 13
    h = (h * _M) & _MASK
    h ^= h >> 15
    return h - (1 << 32) if h & 0x80000000 else h


def key_partition(key: bytes, partitions: int) -> int:
    """The partition Kafka's default partitioner picks for a non-null key."""
    return (murmur2(key) & 0x7FFFFFFF) % partitions


def output_partition(key: bytes | None, input_partition: int, input_count: int,
                     output_count: int) -> int:
    """The output partition of one record (module docstring has the rule)."""
    if input_count == output_count:
        return input_partition
    if key is None:
        return input_partition % output_count
    return key_partition(key, output_count)
