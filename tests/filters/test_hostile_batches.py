"""Hostile batches through the filter pipeline (issue 26, item 5): bombs cost one partition
error, declared counts that lie are corrupt, and nothing reaches the other side unfiltered,
on the native path (builtin:pii-mask exports sluice_filter_records) and on the decoding path
(the sluice_upper test module does not)."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest

from sluice.codec.batch_limits import BatchLimits
from sluice.codec.records import split_batches
from sluice.filters.chain import FilterChain
from sluice.filters.context import RecordContext
from sluice.filters.pipeline import (
    CORRUPT_MESSAGE,
    MESSAGE_TOO_LARGE,
    filter_fetch,
    filter_produce,
)
from tests.harness.hostile_batches import MiB, batch, bomb, bomb_section, records_of

PRODUCE = RecordContext("orders", 0, "produce", "app", None)
FETCH = RecordContext("orders", 0, "fetch", "app", None)
CODECS = [0, 1, 2, 3, 4]
MakeChain = Callable[..., FilterChain]
ADDRESS = b"mail alice.smith@example.com"


@pytest.fixture(params=["native", "decoding"])
def chain(request: pytest.FixtureRequest, make_chain: MakeChain) -> FilterChain:
    if request.param == "native":
        made = make_chain("builtin:pii-mask", name="pii")
        assert made.native_for("orders", "produce")
    else:
        made = make_chain("sluice_upper", name="upper")
        assert not made.native_for("orders", "produce")
    return made


def _cpu(run: Callable[[], object]) -> float:
    start = time.process_time()
    run()
    return time.process_time() - start


@pytest.mark.parametrize("codec", CODECS)
def test_a_bomb_costs_one_partition_error_on_produce(chain: FilterChain, codec: int) -> None:
    data = bomb(codec, 10 * MiB)
    spent = _cpu(lambda: filter_produce(chain, PRODUCE, data))
    out = filter_produce(chain, PRODUCE, data)
    assert out.records is None
    assert out.error_code == MESSAGE_TOO_LARGE
    assert out.record_errors == []
    assert "max_batch_records" in (out.error_message or "")
    assert spent < 0.05, f"refusing the bomb took {spent:.3f} s of CPU"


@pytest.mark.parametrize("codec", [1, 2, 3, 4])
def test_a_lying_bomb_stops_at_the_byte_limit(chain: FilterChain, codec: int) -> None:
    data = batch(codec, bomb_section(64 * MiB), 1)
    limits = BatchLimits(max_bytes=4 * MiB)
    out = filter_produce(chain, PRODUCE, data, limits=limits)
    assert (out.records, out.error_code) == (None, MESSAGE_TOO_LARGE)
    assert "max_batch_bytes" in (out.error_message or "")
    fetched = filter_fetch(chain, FETCH, data, limits=limits)
    assert (fetched.records, fetched.error_code) == (b"", CORRUPT_MESSAGE)


@pytest.mark.parametrize("codec", CODECS)
def test_a_stored_bomb_costs_one_partition_error_on_fetch(chain: FilterChain, codec: int) -> None:
    data = bomb(codec, 10 * MiB)
    spent = _cpu(lambda: filter_fetch(chain, FETCH, data))
    out = filter_fetch(chain, FETCH, data)
    assert (out.records, out.error_code) == (b"", CORRUPT_MESSAGE)
    assert spent < 0.05, f"refusing the stored bomb took {spent:.3f} s of CPU"


@pytest.mark.parametrize("codec", CODECS)
@pytest.mark.parametrize("declared", [1, 3])
def test_a_count_that_does_not_match_the_records_is_corrupt(
    chain: FilterChain, codec: int, declared: int
) -> None:
    """Two records with PII, declared as one or three: never forwarded, in either direction
    (the native path used to mask the one record a filter reads and forward that)."""
    data = batch(codec, records_of([ADDRESS, ADDRESS]), declared)
    out = filter_produce(chain, PRODUCE, data)
    assert (out.records, out.error_code) == (None, CORRUPT_MESSAGE)
    fetched = filter_fetch(chain, FETCH, data)
    assert (fetched.records, fetched.error_code) == (b"", CORRUPT_MESSAGE)


@pytest.mark.parametrize("codec", CODECS)
def test_no_record_declared_with_a_record_inside_never_passes_a_fetch_filter(
    chain: FilterChain, codec: int
) -> None:
    data = batch(codec, records_of([ADDRESS]), 0)
    out = filter_fetch(chain, FETCH, data)
    assert (out.records, out.error_code) == (b"", CORRUPT_MESSAGE)
    assert ADDRESS not in bytes(out.records)


def test_an_empty_batch_as_the_log_cleaner_writes_it_still_passes(chain: FilterChain) -> None:
    data = batch(0, b"", 0, last_offset_delta=4)
    out = filter_fetch(chain, FETCH, data)
    assert out.error_code == 0 and out.records is data


@pytest.mark.parametrize("codec", CODECS)
def test_produce_count_must_match_the_offset_range(chain: FilterChain, codec: int) -> None:
    """Kafka's broker refuses a client batch whose last offset delta is not count - 1."""
    data = batch(codec, records_of([b"a", b"b"]), 2, last_offset_delta=5)
    out = filter_produce(chain, PRODUCE, data)
    assert (out.records, out.error_code) == (None, CORRUPT_MESSAGE)
    assert "last offset delta 5" in (out.error_message or "")
    # On fetch a compacted batch keeps its offset range with fewer records: that passes...
    assert filter_fetch(chain, FETCH, data).error_code == 0
    # ...but more records than offsets does not.
    crowded = batch(codec, records_of([b"a", b"b"]), 2, last_offset_delta=0)
    assert filter_fetch(chain, FETCH, crowded).error_code == CORRUPT_MESSAGE


def test_record_counts_at_the_limit_pass_and_one_more_does_not(chain: FilterChain) -> None:
    limits = BatchLimits(max_records=50)
    values = [ADDRESS] * 50
    out = filter_produce(chain, PRODUCE, batch(4, records_of(values), 50), limits=limits)
    assert out.error_code == 0 and out.records is not None
    (kept,), _ = split_batches(out.records)
    assert kept.header.record_count == 50
    over = filter_produce(chain, PRODUCE, batch(4, records_of([*values, b"x"]), 51),
                          limits=limits)
    assert over.error_code == MESSAGE_TOO_LARGE
