"""A compressed fetched batch built from the guest's new section where it lies in guest memory
(`pipeline._finisher`, `native_io.decode_native_output`'s `finish`) against the section copied
out first, as before: the same outcome for any partition (bytes, error code and message,
counts, stats), the finish really taken, a section the codec's check refuses declined and
refused as before, and the filter's time without the batch's compression."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sluice.codec import lz4_frame
from sluice.codec import records as records_module
from sluice.codec.compression import CODEC_GZIP, CODEC_LZ4, CODEC_NONE, CODEC_SNAPPY, CODEC_ZSTD
from sluice.codec.records import BatchHeader, decode_records, split_batches
from sluice.filters import pipeline
from sluice.filters.chain import FilterChain
from sluice.filters.config import FilterSpec
from sluice.filters.context import RecordContext
from sluice.filters.native_io import Finish
from sluice.filters.pipeline import FetchOutcome, filter_fetch, filter_produce
from tests.filters.test_fetch_pending import FETCH, _batch, values_st
from tests.filters.test_fetch_pending import chain as chain  # the module's pii-mask chain

pytestmark = pytest.mark.skipif(not lz4_frame.AVAILABLE, reason="no liblz4.so.1 on this host")


def _summary(outcome: FetchOutcome) -> tuple[Any, ...]:
    return (bytes(outcome.records), outcome.error_code, outcome.error_message, outcome.changed,
            outcome.records_in, outcome.records_out,
            [(s.name, s.kept, s.rewritten, s.dropped, s.rejected, s.errors, s.detector_counts)
             for s in outcome.stats])


def _both(chain: FilterChain, data: bytes, monkeypatch: pytest.MonkeyPatch,
          ctx: RecordContext = FETCH) -> tuple[tuple[Any, ...], tuple[Any, ...], list[bool]]:
    """(outcome with the finish, outcome with every finish declined, whether each finish
    offered took its section)."""
    taken: list[bool] = []
    real = pipeline._finisher

    def spied(header: BatchHeader) -> Finish:
        finish = real(header)

        def spy(section: memoryview, count: int) -> bytes | None:
            done = finish(section, count)
            taken.append(done is not None)
            return done

        return spy

    with monkeypatch.context() as m:
        m.setattr(pipeline, "_finisher", spied)
        finished = _summary(filter_fetch(chain, ctx, data))
    with monkeypatch.context() as m:
        m.setattr(pipeline, "_finisher", lambda header: lambda section, count: None)
        copied = _summary(filter_fetch(chain, ctx, data))
    return finished, copied, taken


def _without_finish(chain: FilterChain, data: bytes, monkeypatch: pytest.MonkeyPatch,
                    ctx: RecordContext = FETCH) -> tuple[Any, ...]:
    """The outcome of the path before the finish: none offered at all (not one declining)."""
    with monkeypatch.context() as m:
        m.setattr(pipeline, "_finisher", lambda header: None)
        return _summary(filter_fetch(chain, ctx, data))


@settings(max_examples=80, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(values=values_st, codec=st.sampled_from([CODEC_NONE, CODEC_LZ4, CODEC_GZIP]),
       size=st.integers(1, 15))
def test_finished_and_copied_sections_give_the_same_outcome(
        chain: FilterChain, values: list[bytes], codec: int, size: int,
        monkeypatch: pytest.MonkeyPatch) -> None:
    data = b"".join(_batch(values[i:i + size], codec, 100 + i)
                    for i in range(0, len(values), size))
    finished, copied, taken = _both(chain, data, monkeypatch)
    assert finished == copied
    if codec == CODEC_NONE:
        assert not taken  # an uncompressed batch is written around its copy (batch_around)
    else:
        # Every section a guest changed was taken where it lay, and only those.
        assert all(taken) and bool(taken) == finished[3]


def test_a_section_the_check_refuses_is_declined_and_refused_as_before(
        make_chain: Callable[..., FilterChain], monkeypatch: pytest.MonkeyPatch) -> None:
    # native_bad's sluice_filter_records rewrites every record into three garbage bytes.
    bad = make_chain("native_bad", stateless=True)  # poolable: no lock held through a finish
    data = _batch([b"a", b"b", b"c"], CODEC_LZ4, 0)
    finished, copied, taken = _both(bad, data, monkeypatch)
    assert taken == [False]  # offered, declined: copied out, refused, the decoding path
    assert finished == copied and finished[0] == data and not finished[3]


def test_the_filter_time_leaves_the_finish_out(chain: FilterChain,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    real = pipeline._finisher
    pause = 0.3

    def slow(header: BatchHeader) -> Finish:
        finish = real(header)

        def late(section: memoryview, count: int) -> bytes | None:
            time.sleep(pause)
            return finish(section, count)

        return late

    data = _batch([b'{"email": "ann@example.com"}'] * 5, CODEC_LZ4, 0)
    monkeypatch.setattr(pipeline, "_finisher", slow)
    start = time.perf_counter_ns()
    out = filter_fetch(chain, FETCH, data)
    spent = time.perf_counter_ns() - start
    assert out.changed and spent >= pause * 1e9
    (stats,) = out.stats
    assert stats.rewritten == 5 and stats.time_ns < spent - pause * 1e9 + 1e6


CODECS = [CODEC_NONE, CODEC_GZIP, CODEC_SNAPPY, CODEC_LZ4, CODEC_ZSTD]


@pytest.fixture(scope="module")
def chains() -> Iterator[dict[str, FilterChain]]:
    """pii-mask alone, after json-validate (which drops what is not JSON), and before it,
    dropping or rejecting (the finish then takes json-validate's section, fewer records than
    the batch holds)."""
    def spec(name: str, module: str, config: dict[str, Any] | None = None) -> FilterSpec:
        return FilterSpec(name=name, module=module, config=config or {}, topics=("orders",),
                          apply_to=frozenset({"fetch"}), timeout_ms=10_000)

    mask = spec("mask", "builtin:pii-mask")
    valid = spec("valid", "builtin:json-validate", {"action": "drop"})
    made = {"mask": FilterChain.from_specs([mask]),
            "valid-mask": FilterChain.from_specs([valid, mask]),
            "mask-valid": FilterChain.from_specs([mask, valid]),
            "mask-reject": FilterChain.from_specs([mask, spec("valid", "builtin:json-validate")])}
    yield made
    for c in made.values():
        c.close()


@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(values=values_st, codec=st.sampled_from(CODECS), size=st.integers(1, 15),
       which=st.sampled_from(["mask", "valid-mask", "mask-valid", "mask-reject"]))
def test_every_codec_and_chain_gives_what_the_path_without_a_finish_gives(
        chains: dict[str, FilterChain], values: list[bytes], codec: int, size: int, which: str,
        monkeypatch: pytest.MonkeyPatch) -> None:
    # The baseline is the path before the finish (no `finish` offered at all), not a finish
    # that declines: several batches a partition, every codec, drops before and in the last
    # filter.
    chain = chains[which]
    data = b"".join(_batch(values[i:i + size], codec, 100 + i)
                    for i in range(0, len(values), size))
    finished, _, taken = _both(chain, data, monkeypatch)
    assert finished == _without_finish(chain, data, monkeypatch)
    # A builtin's section always passes the check: every finish offered takes it.
    assert all(taken) and (codec != CODEC_NONE or not taken)


def test_a_compression_error_in_the_finish_is_not_the_filters(
        chain: FilterChain, monkeypatch: pytest.MonkeyPatch) -> None:
    # The host's compression fails (as liblz4 or the allocator may): that is no failure of
    # the guest, whose call succeeded. The error surfaces as on the copy-out path, and the
    # filter is neither counted as falling back nor its instance dropped, nor run again.
    data = _batch([b'{"email": "ann@example.com"}'] * 5, CODEC_LZ4, 0)
    (f,) = chain.filters
    filter_fetch(chain, FETCH, data)  # an instance made
    fallbacks = f.native_fallbacks
    instantiations = sum(r.instantiations for r in f._made)

    def broken(*args: Any, **kw: Any) -> bytes:
        raise lz4_frame.Lz4Error("compression failed")

    with monkeypatch.context() as m:
        m.setattr(records_module, "compress", broken)
        with pytest.raises(lz4_frame.Lz4Error):
            filter_fetch(chain, FETCH, data)
    assert f.native_fallbacks == fallbacks
    assert sum(r.instantiations for r in f._made) == instantiations
    assert filter_fetch(chain, FETCH, data).changed


@pytest.mark.parametrize("codec", CODECS)
def test_a_decrypted_batch_masked_on_fetch_is_finished_as_without_a_finish(
        make_chain: Callable[..., FilterChain], make_spec: Callable[..., FilterSpec],
        tmp_path: Path, codec: int, monkeypatch: pytest.MonkeyPatch) -> None:
    # encrypt's fetch path: its opened section (trusted, lent from the sealer's buffer) is
    # the guest's input, and the guest's section is finished where it lies.
    from sluice.crypto.kms import KmsSettings

    kms = KmsSettings("local", path=str(tmp_path / "keys.json"))
    enc = make_spec("builtin:encrypt", name="enc", kms=kms,
                    config={"key": "orders", "decrypt_for": ["User:alice"]})
    mask = make_spec("builtin:pii-mask", name="mask", apply_to=frozenset({"fetch"}))
    produce = RecordContext("orders", 0, "produce", "app", "User:alice")
    fetch = RecordContext("orders", 0, "fetch", "app", "User:alice")
    values = [b'{"email": "ann%d@example.com", "n": %d}' % (i, i) for i in range(30)]
    sealer = make_chain(enc)
    sealed = b""
    for i in range(0, 30, 7):  # a produce request holds one batch a partition
        stored = filter_produce(sealer, produce, _batch(values[i:i + 7], codec, 100 + i))
        assert stored.error_code == 0 and stored.records is not None
        sealed += bytes(stored.records)
    chain = make_chain(enc, mask)
    finished, _, taken = _both(chain, sealed, monkeypatch, fetch)
    assert finished == _without_finish(chain, sealed, monkeypatch, fetch)
    assert finished[1] == 0 and finished[3]  # no error, changed
    assert all(taken) and len(taken) == (0 if codec == CODEC_NONE else 5)
    batches, _ = split_batches(finished[0])
    opened = b"".join(bytes(r.value or b"") for b in batches for r in decode_records(b))
    assert b"ann3@example.com" not in opened and b'"n": 3' in opened


def test_a_filter_run_under_its_lock_is_not_held_through_the_finish(
        make_chain: Callable[..., FilterChain], make_spec: Callable[..., FilterSpec],
        monkeypatch: pytest.MonkeyPatch) -> None:
    # A filter that keeps state (not poolable: one instance, its calls serialised under its
    # lock) must not hold that lock through the batch's compression: the other filter
    # threads' batches would wait behind it (gzip of a large section takes milliseconds), and
    # a job on the event loop would find the lock taken. Its section is copied out instead,
    # and the batch compressed after the lock is released, as before the finish.
    chain = make_chain(make_spec("builtin:pii-mask", name="mask", stateless=False,
                                 apply_to=frozenset({"fetch"})))
    (f,) = chain.filters
    assert not f.poolable
    held: list[bool] = []
    real = pipeline._finisher

    def spied(header: BatchHeader) -> Finish:
        finish = real(header)

        def spy(section: memoryview, count: int) -> bytes | None:
            held.append(f._lock.locked())
            return finish(section, count)

        return spy

    data = b"".join(_batch([b'{"email": "ann%d@example.com"}' % i] * 4, codec, 10 * i)
                    for i, codec in enumerate([CODEC_LZ4, CODEC_GZIP, CODEC_ZSTD]))
    with monkeypatch.context() as m:
        m.setattr(pipeline, "_finisher", spied)
        finished = _summary(filter_fetch(chain, FETCH, data))
    assert finished[3] and finished == _without_finish(chain, data, monkeypatch)
    assert not any(held), "the finish ran under the filter's lock"
