"""`check_batch` (the in-place check of an uncompressed batch's records) agrees with
`check_section` (the check behind a neutral header) on good and damaged batches."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sluice.codec.errors import CorruptBatch
from sluice.codec.records import (
    HEADER_SIZE,
    BatchHeader,
    Record,
    build_batch,
    check_batch,
    check_section,
)

values = st.lists(st.one_of(st.none(), st.binary(max_size=300)), min_size=1, max_size=20)


def batch(vals: list[bytes | None], codec: int = 0, count: int | None = None) -> bytes:
    records = [Record(i, 0, None, v, []) for i, v in enumerate(vals)]
    n = len(records)
    header = BatchHeader(7, 0, -1, 2, 0, codec, n - 1, 0, 0, -1, -1, -1, n)
    data = bytearray(build_batch(header, records))
    if count is not None:
        data[57:61] = count.to_bytes(4, "big", signed=True)
    return bytes(data)


def verdict(check: object, *args: object) -> bool:
    try:
        check(*args)  # type: ignore[operator]
    except CorruptBatch:
        return False
    return True


@settings(max_examples=200, deadline=None)
@given(vals=values, data=st.data())
def test_check_batch_agrees_with_check_section(
    vals: list[bytes | None], data: st.DataObject
) -> None:
    good = batch(vals)
    check_batch(good)
    check_batch(memoryview(good))
    # Damage: a wrong record count, bytes cut off the end, or bytes added after the records.
    damage = data.draw(st.sampled_from(["count", "cut", "extra"]))
    if damage == "count":
        count = data.draw(st.integers(0, 40).filter(lambda c: c != len(vals)))
        bad, declared = batch(vals, count=count), count
    elif damage == "cut":
        cut = data.draw(st.integers(1, len(good) - HEADER_SIZE)) if len(good) > HEADER_SIZE else 0
        bad, declared = good[: len(good) - cut], len(vals)
    else:
        bad, declared = good + data.draw(st.binary(min_size=1, max_size=5)), len(vals)
    in_place = verdict(check_batch, bad)
    assert in_place == verdict(check_section, bad[HEADER_SIZE:], declared)
    if damage in ("count", "cut") and bad != good:
        assert not in_place


def test_compressed_batches_are_refused() -> None:
    with pytest.raises(ValueError, match="uncompressed"):
        check_batch(batch([b"x" * 100], codec=3))
    with pytest.raises(CorruptBatch):
        check_batch(b"\x00" * 20)
