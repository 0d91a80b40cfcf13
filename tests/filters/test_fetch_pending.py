"""lz4 fetch batches decompressed straight into the guest's memory (codec/lz4_section.py,
`pipeline.plan_fetch`'s `pending`) against the path that opens them in Python first: the same
outcome for any partition (bytes, error code and message, counts, stats), damaged and
oversized batches included, and the pending path really taken."""

from __future__ import annotations

import struct
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sluice.codec import lz4_section
from sluice.codec.batch_limits import BatchLimits
from sluice.codec.compression import CODEC_LZ4, CODEC_NONE
from sluice.codec.records import HEADER_SIZE, BatchHeader, Record, build_batch, crc32c
from sluice.filters import pipeline
from sluice.filters.chain import FilterChain
from sluice.filters.config import FilterSpec
from sluice.filters.context import RecordContext
from sluice.filters.pipeline import FetchOutcome, filter_fetch

pytestmark = pytest.mark.skipif(not lz4_section.AVAILABLE,
                                reason="no liblz4.so.1 or native module on this host")

FETCH = RecordContext("orders", 0, "fetch", "app", None)

values_st = st.lists(
    st.one_of(
        st.builds(lambda i, n: (b'{"email": "user%d@example.com", "card": "4111 1111 1111 1111",'
                                b' "note": "%s"}' % (i, b"x" * n)),
                  st.integers(0, 10**6), st.integers(0, 300)),
        st.binary(max_size=200),
    ),
    min_size=1, max_size=40)


@pytest.fixture(scope="module")
def chain() -> Iterator[FilterChain]:
    # A long deadline: on a loaded machine a call that runs out of it is rejected by one
    # path and not the other, which is the load, not the path.
    spec = FilterSpec(name="mask", module="builtin:pii-mask", config={}, topics=("orders",),
                      apply_to=frozenset({"fetch"}), timeout_ms=10_000)
    made = FilterChain.from_specs([spec])
    yield made
    made.close()


def _batch(values: list[bytes], codec: int, base: int, headers: int = 0) -> bytes:
    recs = [Record(j, j, None, v, [("h", b"v")] * headers) for j, v in enumerate(values)]
    n = len(recs)
    return build_batch(BatchHeader(base, 0, 0, 2, 0, codec, n - 1, 1_700_000_000,
                                   1_700_000_000 + n - 1, -1, -1, -1, n), recs)


def _with_crc(batch: bytearray) -> bytes:
    """`batch` with its CRC made right again (so that the damage is the codec's to find)."""
    struct.pack_into(">I", batch, 17, crc32c(memoryview(batch)[21:]))
    return bytes(batch)


def _damaged(batch: bytes, at: int, value: int, count: int | None) -> bytes:
    out = bytearray(batch)
    if len(out) > HEADER_SIZE:
        out[HEADER_SIZE + at % (len(out) - HEADER_SIZE)] = value
    if count is not None:
        struct.pack_into(">i", out, HEADER_SIZE - 4, count)
    return _with_crc(out)


def _summary(outcome: FetchOutcome) -> tuple[Any, ...]:
    return (bytes(outcome.records), outcome.error_code, outcome.error_message, outcome.changed,
            outcome.records_in, outcome.records_out,
            [(s.name, s.kept, s.rewritten, s.dropped, s.rejected, s.errors)
             for s in outcome.stats])


def _both(chain: FilterChain, data: bytes, monkeypatch: pytest.MonkeyPatch,
          limits: BatchLimits) -> tuple[tuple[Any, ...], tuple[Any, ...], int]:
    """(outcome with pending sections, outcome without, pending sections written)."""
    written = []
    real = lz4_section.PendingSection.write_into

    def spy(self: lz4_section.PendingSection, address: int) -> int:
        written.append(self.count)
        return real(self, address)

    with monkeypatch.context() as m:
        m.setattr(lz4_section.PendingSection, "write_into", spy)
        pending = _summary(filter_fetch(chain, FETCH, data, limits=limits))
    with monkeypatch.context() as m:
        m.setattr(pipeline, "PENDING_AVAILABLE", False)
        opened = _summary(filter_fetch(chain, FETCH, data, limits=limits))
    return pending, opened, len(written)


@settings(max_examples=80, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(values=values_st, codec=st.sampled_from([CODEC_NONE, CODEC_LZ4]),
       size=st.integers(1, 15), damage=st.none() | st.tuples(st.integers(0, 10**6),
                                                               st.integers(0, 255)),
       count=st.none() | st.integers(-1, 50), headers=st.integers(0, 3),
       max_bytes=st.sampled_from([1 << 20, 300]), max_headers=st.sampled_from([1000, 5]))
def test_pending_and_opened_sections_give_the_same_outcome(
        chain: FilterChain, values: list[bytes], codec: int, size: int,
        damage: tuple[int, int] | None, count: int | None, headers: int, max_bytes: int,
        max_headers: int, monkeypatch: pytest.MonkeyPatch) -> None:
    batches = [_batch(values[i:i + size], codec, 100 + i, headers)
               for i in range(0, len(values), size)]
    if damage is not None or count is not None:
        # The last batch damaged: its payload, or its declared count (the CRC made right).
        at, value = damage if damage is not None else (0, -1)
        last = batches[-1]
        batches[-1] = (_damaged(last, at, value, count) if value >= 0
                       else _damaged(last, 0, last[HEADER_SIZE], count))
    limits = BatchLimits(max_bytes=max_bytes, max_records=10_000, max_headers=max_headers)
    pending, opened, written = _both(chain, b"".join(batches), monkeypatch, limits)
    assert pending == opened
    if codec == CODEC_LZ4 and pending[1] == 0 and max_bytes == 1 << 20:
        # Every lz4 batch went to the guest pending (under a limit below what its frame's
        # blocks may yield, a batch is opened the usual way, which holds it to the limit).
        assert written == len(batches)


def test_the_pending_path_masks_and_refuses_as_the_opened_one(
        chain: FilterChain, monkeypatch: pytest.MonkeyPatch) -> None:
    limits = BatchLimits()
    good = _batch([b'{"email": "someone@example.com"}'] * 30, CODEC_LZ4, 0)
    pending, opened, written = _both(chain, good, monkeypatch, limits)
    assert pending == opened and written == 1
    assert b"someone@example.com" not in pending[0] and pending[3]  # masked, so rebuilt
    # One record fewer declared than the section holds: refused before the guest sees it.
    short = _damaged(good, 0, good[HEADER_SIZE], 29)
    both = _both(chain, good + short, monkeypatch, limits)
    assert both[0] == both[1] and both[0][1] == pipeline.CORRUPT_MESSAGE
    assert "corrupt record batch" in str(both[0][2])
    # ... and the filter's next batch is filtered as ever (on the instance kept).
    again = _both(chain, good, monkeypatch, limits)
    assert again[0] == pending


def test_refused_batches_do_not_cost_an_instance_each() -> None:
    """Review (round 38): a stored lz4 batch the codec refuses comes back on every fetch of
    its offset (the consumer's position does not move past it), and a Fetch names many
    partitions. Each refusal made the filter's instance afresh (~0.6 ms, on the event loop
    for an inline job, against ~0.03 ms to refuse the batch in Python). The instance is kept
    until the inputs its `sluice_alloc` handed out for refused batches reach a quarter of
    its memory cap (a guest that frees its input in the call keeps those), so a stream of
    refusals costs an instantiation per few MiB refused, and never the guest's memory."""
    spec = FilterSpec(name="mask", module="builtin:pii-mask", config={}, topics=("orders",),
                      apply_to=frozenset({"fetch"}), timeout_ms=10_000, max_memory_mb=16)
    chain = FilterChain.from_specs([spec])
    try:
        f = chain.filters[0]
        good = _batch([b'{"email": "someone@example.com"}'] * 30, CODEC_LZ4, 0)
        first = _summary(filter_fetch(chain, FETCH, good))
        assert first[1] == 0 and b"someone@example.com" not in first[0]
        short = _damaged(good, 0, good[HEADER_SIZE], 29)
        before = f.instantiations
        for _ in range(50):
            out = filter_fetch(chain, FETCH, short)
            assert out.error_code == pipeline.CORRUPT_MESSAGE and out.records == b""
        assert f.instantiations - before <= 1
        # ~1.5 MiB sections: past a quarter of 16 MiB every few refusals, the instance is
        # made afresh (what a guest that frees its input in the call leaked goes with it).
        big = _batch([b'{"email": "someone@example.com", "pad": "%s"}' % (b"x" * 1000)] * 1500,
                     CODEC_LZ4, 0)
        big_short = _damaged(big, 0, big[HEADER_SIZE], 1499)
        before = f.instantiations
        for _ in range(12):
            out = filter_fetch(chain, FETCH, big_short)
            assert out.error_code == pipeline.CORRUPT_MESSAGE
        assert 1 <= f.instantiations - before <= 6
        assert _summary(filter_fetch(chain, FETCH, good)) == first
    finally:
        chain.close()


def _xxh32_byte(data: bytes) -> int:
    """The LZ4 frame descriptor's checksum: the second byte of xxHash32 (seed 0) of `data`
    (under 4 bytes: xxHash32's path for single trailing bytes only)."""
    assert len(data) < 4
    p1, p2, p3, p5 = 2654435761, 2246822519, 3266489917, 374761393
    m = 0xFFFFFFFF
    h = (p5 + len(data)) & m
    for b in data:
        h = (h + b * p5) & m
        h = (((h << 11) | (h >> 21)) & m) * p1 & m
    h ^= h >> 15
    h = h * p2 & m
    h ^= h >> 13
    h = h * p3 & m
    h ^= h >> 16
    return (h >> 8) & 0xFF


def _literal_block(chunk: bytes) -> bytes:
    """One compressed LZ4 block holding `chunk` as a single run of literals: valid, and its
    block-header bound is 255 times what it yields (the most any compressed block claims)."""
    n = len(chunk) - 15
    body = b"\xf0" + b"\xff" * (n // 255) + bytes([n % 255]) + chunk
    return struct.pack("<I", len(body)) + body


def test_a_frame_claiming_more_than_the_guest_holds_stays_on_the_native_path() -> None:
    """Review (round 38): the guest allocates a pending section's bound, and a valid frame
    may claim 255 times what it holds. 134 KB of records in 4 MiB blocks of literal
    runs claim 28 MiB: a guest capped at 16 MiB could not allocate it, and the batch went to
    the decoding path (~14 times the CPU per record). Such a batch is opened in Python and
    takes the native path with its real size."""
    spec = FilterSpec(name="mask", module="builtin:pii-mask", config={}, topics=("orders",),
                      apply_to=frozenset({"fetch"}), timeout_ms=10_000, max_memory_mb=16)
    chain = FilterChain.from_specs([spec])
    try:
        values = [b'{"email": "user%d@example.com", "n": "%s"}' % (i, b"x" * 60)
                  for i in range(1200)]
        batch = bytearray(_batch(values, CODEC_NONE, 0))
        section = bytes(batch[HEADER_SIZE:])
        step = -(-len(section) // 7)
        flg, bd = 0x60, 0x70  # version 01, independent blocks; 4 MiB blocks
        frame = (b"\x04\x22\x4d\x18" + bytes([flg, bd, _xxh32_byte(bytes([flg, bd]))])
                 + b"".join(_literal_block(section[i:i + step])
                            for i in range(0, len(section), step))
                 + b"\x00\x00\x00\x00")
        lz4 = bytearray(batch[:HEADER_SIZE] + frame)
        struct.pack_into(">i", lz4, 8, len(lz4) - 12)
        struct.pack_into(">h", lz4, 21, CODEC_LZ4)
        data = _with_crc(lz4)
        f = chain.filters[0]
        out = filter_fetch(chain, FETCH, data)
        assert out.error_code == 0 and out.changed and b"user7@example.com" not in out.records
        assert f.native_fallbacks == 0
    finally:
        chain.close()
