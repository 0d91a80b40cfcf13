"""Kafka's default partitioner for keyed records: murmur2 of the key bytes, made positive,
modulo the partition count.

This is the Java client's `BuiltInPartitioner.partitionForKey` (and librdkafka's
`murmur2_random` for non-null keys), so a record the proxy produces lands in the same
partition as the same key produced by those clients. Pure functions, no I/O.
"""

from __future__ import annotations

_SEED = 0x9747B28C
_M = 0x5BD1E995
_MASK = 0xFFFFFFFF


def murmur2(data: bytes) -> int:
    """32-bit MurmurHash2 as Kafka's `Utils.murmur2` computes it, as a signed int."""
    length = len(data)
    h = (_SEED ^ length) & _MASK
    tail = length & ~3
    for i in range(0, tail, 4):
        k = int.from_bytes(data[i : i + 4], "little")
        k = (k * _M) & _MASK
        k ^= k >> 24
        k = (k * _M) & _MASK
        h = ((h * _M) & _MASK) ^ k
    rest = length - tail
    if rest == 3:
        h ^= data[tail + 2] << 16
    if rest >= 2:
        h ^= data[tail + 1] << 8
    if rest >= 1:
        h ^= data[tail]
        h = (h * _M) & _MASK
    h ^= h >> 13
    h = (h * _M) & _MASK
    h ^= h >> 15
    return h - (1 << 32) if h & 0x80000000 else h


def partition_for_key(key: bytes, partitions: int) -> int:
    """The partition of a keyed record among `partitions` (> 0)."""
    if partitions <= 0:
        raise ValueError("a topic has at least one partition")
    # Utils.toPositive: clear the sign bit (not abs(), which differs for negative values).
    return (murmur2(key) & 0x7FFFFFFF) % partitions
