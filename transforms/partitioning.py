"""Where a transform writes each output record: the input partition, or a partition by key.

When the output topic has as many partitions as the input topic, record N of input partition P
goes to output partition P (keys, order and co-partitioning stay as they were). Otherwise the
partition is chosen from the key the way Apache Kafka's Java producer does it (murmur2 of the
key bytes, sign bit cleared, modulo the partition count), so records land where a Java
producer would have put them; a record without a key keeps its input partition modulo the
output's count, which is deterministic (a replay writes to the same partition).
"""

from __future__ import annotations

from sluice.codec.partitioner import partition_for_key


def output_partition(key: bytes | None, input_partition: int, input_count: int,
                     output_count: int) -> int:
    """The output partition of one record (module docstring has the rule)."""
    if input_count == output_count:
        return input_partition
    if key is None:
        return input_partition % output_count
    return partition_for_key(key, output_count)
