"""lz4 Produce batches decompressed straight into the guest's memory and rebuilt from the
guest's new section where it lies (`pipeline.filter_produce`'s pending path, as on fetch)
against the path that opens them in Python and copies the section out: the same outcome for
any partition (bytes, error code and message, record errors, counts, stats), damaged and
oversized batches included; the pending path really taken, and never for a topic whose
records a filter screens for its reserved header prefix."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sluice.codec import lz4_section
from sluice.codec.batch_limits import BatchLimits
from sluice.codec.compression import CODEC_LZ4, CODEC_NONE
from sluice.codec.records import HEADER_SIZE
from sluice.crypto.kms import KmsSettings
from sluice.filters import pipeline
from sluice.filters.chain import FilterChain
from sluice.filters.config import FilterSpec
from sluice.filters.context import RecordContext
from sluice.filters.pipeline import ProduceOutcome, filter_produce
from tests.filters.test_fetch_pending import _batch, _damaged, values_st

pytestmark = pytest.mark.skipif(not lz4_section.AVAILABLE,
                                reason="no liblz4.so.1 or native module on this host")

PRODUCE = RecordContext("orders", 0, "produce", "app", None)


@pytest.fixture(scope="module")
def chain() -> Iterator[FilterChain]:
    # A long deadline, as in test_fetch_pending: the load must not decide a record's fate.
    spec = FilterSpec(name="mask", module="builtin:pii-mask", config={}, topics=("orders",),
                      apply_to=frozenset({"produce"}), timeout_ms=10_000)
    made = FilterChain.from_specs([spec])
    yield made
    made.close()


def _summary(outcome: ProduceOutcome) -> tuple[Any, ...]:
    return (None if outcome.records is None else bytes(outcome.records), outcome.error_code,
            outcome.error_message, outcome.record_errors, outcome.changed, outcome.all_dropped,
            outcome.records_in, outcome.records_out,
            [(s.name, s.kept, s.rewritten, s.dropped, s.rejected, s.errors)
             for s in outcome.stats])


def _both(chain: FilterChain, data: bytes, monkeypatch: pytest.MonkeyPatch,
          limits: BatchLimits) -> tuple[tuple[Any, ...], tuple[Any, ...], int, int]:
    """(outcome with pending sections, outcome without, pending sections written, new
    batches built where the guest left them)."""
    written: list[int] = []
    finished: list[bool] = []
    real_write = lz4_section.PendingSection.write_into
    real_run = pipeline._run_native

    def spy(self: lz4_section.PendingSection, address: int) -> int:
        written.append(self.count)
        return real_write(self, address)

    def ran(*args: Any) -> Any:
        got = real_run(*args)
        finished.append(got is not None and got[0].finished)
        return got

    with monkeypatch.context() as m:
        m.setattr(lz4_section.PendingSection, "write_into", spy)
        m.setattr(pipeline, "_run_native", ran)
        pending = _summary(filter_produce(chain, PRODUCE, data, limits=limits))
    with monkeypatch.context() as m:
        m.setattr(pipeline, "PENDING_AVAILABLE", False)
        m.setattr(pipeline, "_finisher", lambda header, fetch=True: lambda section, n: None)
        opened = _summary(filter_produce(chain, PRODUCE, data, limits=limits))
    return pending, opened, len(written), sum(finished)


@settings(max_examples=80, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(values=values_st, codec=st.sampled_from([CODEC_NONE, CODEC_LZ4]),
       damage=st.none() | st.tuples(st.integers(0, 10**6), st.integers(0, 255)),
       count=st.none() | st.integers(-1, 50), headers=st.integers(0, 3),
       max_bytes=st.sampled_from([1 << 20, 300]), max_headers=st.sampled_from([1000, 5]))
def test_pending_and_opened_produce_batches_give_the_same_outcome(
        chain: FilterChain, values: list[bytes], codec: int,
        damage: tuple[int, int] | None, count: int | None, headers: int, max_bytes: int,
        max_headers: int, monkeypatch: pytest.MonkeyPatch) -> None:
    data = _batch(values, codec, 0, headers)
    if damage is not None or count is not None:
        # Its payload or its declared count damaged (the CRC made right).
        at, value = damage if damage is not None else (0, -1)
        data = (_damaged(data, at, value, count) if value >= 0
                else _damaged(data, 0, data[HEADER_SIZE], count))
    limits = BatchLimits(max_bytes=max_bytes, max_records=10_000, max_headers=max_headers)
    pending, opened, written, finished = _both(chain, data, monkeypatch, limits)
    assert pending == opened
    if codec == CODEC_LZ4 and pending[1] == 0 and max_bytes == 1 << 20:
        # The batch went to the guest pending, and a rewritten one was built where the
        # guest left its section.
        assert written == 1 and finished == int(pending[4])


def test_the_pending_path_masks_and_refuses_as_the_opened_one(
        chain: FilterChain, monkeypatch: pytest.MonkeyPatch) -> None:
    limits = BatchLimits()
    good = _batch([b'{"email": "someone@example.com"}'] * 30, CODEC_LZ4, 0)
    pending, opened, written, finished = _both(chain, good, monkeypatch, limits)
    assert pending == opened and written == 1 and finished == 1
    assert pending[0] is not None and b"someone@example.com" not in pending[0] and pending[4]
    # One record fewer declared than the section holds: refused before the guest sees it
    # (by the header's last offset delta; with a delta to match, by the section's check:
    # test_produce_pending_chains.py).
    short = _damaged(good, 0, good[HEADER_SIZE], 29)
    both = _both(chain, short, monkeypatch, limits)
    assert both[0] == both[1] and both[0][1] == pipeline.CORRUPT_MESSAGE
    assert "corrupt record batch" in str(both[0][2])
    # A batch with nothing to mask is forwarded as it came, not rebuilt.
    clean = _batch([b'{"note": "nothing here"}'] * 30, CODEC_LZ4, 0)
    kept = _both(chain, clean, monkeypatch, limits)
    assert kept[0] == kept[1] and kept[0][0] == clean and not kept[0][4] and kept[3] == 0


def test_a_screened_topic_takes_no_pending_section(tmp_path: Path) -> None:
    """A filter that reserves a header prefix on the topic (builtin:encrypt, here on fetch
    only) screens every produced section in the host first, so the mask on produce gets the
    section opened in Python."""
    specs = [
        FilterSpec(name="mask", module="builtin:pii-mask", config={}, topics=("orders",),
                   apply_to=frozenset({"produce"})),
        FilterSpec(name="seal", module="builtin:encrypt", topics=("orders",),
                   apply_to=frozenset({"fetch"}), config={"key": "orders"},
                   kms=KmsSettings("local", path=str(tmp_path / "keys.json"))),
    ]
    chain = FilterChain.from_specs(specs)
    try:
        if not chain.reserved_for("orders"):
            pytest.skip("builtin:encrypt reserves no prefix in this configuration")
        assert chain.pending_room("orders", "produce") == 0
        assert chain.pending_room("orders", "fetch") == 0
    finally:
        chain.close()


def test_the_filter_time_leaves_the_decompression_out(
        chain: FilterChain, monkeypatch: pytest.MonkeyPatch) -> None:
    """The filter's time (`sluice_filter_seconds_total`, telemetry's `filter_time_ns`) is
    the guest's, as when the batch was opened in Python before the filter ran: not the
    host's decompression and check of a pending section into its memory."""
    real = lz4_section.lz4_frame.decompress_into
    pause = 0.3
    slept: list[float] = []

    def slow(*args: Any) -> int:
        time.sleep(pause)
        slept.append(pause)
        return int(real(*args))

    monkeypatch.setattr(lz4_section.lz4_frame, "decompress_into", slow)
    out = filter_produce(chain, PRODUCE, _batch([b'{"email": "ann@example.com"}'] * 5,
                                                CODEC_LZ4, 0))
    (stats,) = out.stats
    assert out.changed and stats.rewritten == 5 and slept == [pause]
    assert stats.time_ns < pause * 1e9
