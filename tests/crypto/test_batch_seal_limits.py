"""The native batch sealer (crypto/batch_seal.py, crypto/batch_seal.c) at the edges of what it
is given: a record count the section cannot hold is refused with an error, never allocated
on trust."""

from __future__ import annotations

import tracemalloc
from collections.abc import Callable

import pytest

from sluice.codec.records import Record, encode_records
from sluice.crypto import batch_seal

pytestmark = pytest.mark.skipif(not batch_seal.AVAILABLE,
                                reason="native batch sealer not built (scripts/dev.sh install)")

KEY, PREFIX = bytes(range(32)), b"prefix"
NONCES = bytes(12 * 64)


def test_a_count_the_section_cannot_hold_is_refused_before_anything_is_allocated() -> None:
    """Every record takes at least 7 bytes (length, attributes, two deltas, key, value and
    header count, one byte each), so a count above a seventh of the section's size is
    malformed: each call refuses it before allocating anything of the count's size (its fate
    bytes, output room or plan), where the count alone used to size them."""
    section = bytes(encode_records([Record(0, 0, b"k", b"v", [], 0)]))
    count = 1_000_000  # room for ~60 MB of output if taken on trust
    packed = batch_seal.pack_paths(["a"])
    calls: list[Callable[[], object]] = [
        lambda: batch_seal.seal_section(section, count, KEY, NONCES, PREFIX),
        lambda: batch_seal.open_section(section, count, KEY, PREFIX, b"", 0),
        lambda: batch_seal.plan_fields(section, count, packed, 1, 8),
        lambda: batch_seal.seal_fields(section, count, KEY, NONCES, PREFIX, packed, 1, [], 8),
        lambda: batch_seal.open_fields(section, count, KEY, PREFIX, b"", 0),
    ]
    for i, call in enumerate(calls):
        tracemalloc.start()
        try:
            with pytest.raises(batch_seal.Malformed):
                call()
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        assert peak < count // 4, (i, peak)
    # The bound is exact: ten of the smallest records fill 70 bytes, and are read.
    smallest = bytes(encode_records([Record(i, 0, None, None, [], 0) for i in range(10)]))
    assert len(smallest) == 70
    assert batch_seal.seal_section(smallest, 10, KEY, NONCES, PREFIX)[1] == bytes(10)
    with pytest.raises(batch_seal.Malformed):
        batch_seal.open_section(section, -1, KEY, PREFIX, b"", 0)
