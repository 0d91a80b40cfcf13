"""The native fast path (``sluice_filter_records``) against the decoding path (``sluice_filter``).

Both paths must give the same outcome for every batch: the same bytes forwarded, the same
errors, the same per-filter counts. The decoding path is the reference; the native path is
only allowed to be faster. Guests come from the C SDK (tests/filters/sdk/probe_c: each record
value is a command) and the shipped pii-mask; `native_bad.wat` returns a broken native answer.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sluice.codec.records import (
    BatchHeader,
    Record,
    build_batch,
    crc32c,
    decode_records,
    split_batches,
)
from sluice.filters.build import build_filter
from sluice.filters.chain import FilterChain
from sluice.filters.config import FilterSpec
from sluice.filters.context import RecordContext
from sluice.filters.module_cache import ModuleCache
from sluice.filters.native_io import decode_native_output
from sluice.filters.pipeline import (
    CORRUPT_MESSAGE,
    INVALID_RECORD,
    FetchOutcome,
    ProduceOutcome,
    filter_fetch,
    filter_produce,
)
from sluice.filters.records_io import AbiError

PROBE = Path(__file__).resolve().parent / "sdk" / "probe_c"
PRODUCE = RecordContext("orders", 3, "produce", "app", "User:alice")
FETCH = RecordContext("orders", 3, "fetch", "app", "User:alice")
COMMANDS = [b"keep", b"drop", b"ctx", b"count", b"headers", b"json", b"other", b"fail", None]


@pytest.fixture(scope="module")
def probe_wasm(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_filter(PROBE, tmp_path_factory.mktemp("probe") / "probe.wasm")


@pytest.fixture(scope="module")
def chains(probe_wasm: Path, tmp_path_factory: pytest.TempPathFactory) -> Any:
    """name -> chain. Hypothesis calls the test many times: chains are built once."""
    from sluice.filters.runtime import shared_cache

    cache: ModuleCache = shared_cache(None, tmp_path_factory.mktemp("cache"))
    both = frozenset({"produce", "fetch"})

    def make(*specs: FilterSpec) -> FilterChain:
        return FilterChain.from_specs(list(specs), cache=cache)

    built = {
        "probe": make(FilterSpec(name="probe", module=str(probe_wasm), topics=("*",),
                                 apply_to=both, config={"limit": 4})),
        "probe-pass": make(FilterSpec(name="probe", module=str(probe_wasm), topics=("*",),
                                      apply_to=both, on_error="pass")),
        "mask-then-probe": make(
            FilterSpec(name="mask", module="builtin:pii-mask", topics=("*",), apply_to=both),
            FilterSpec(name="probe", module=str(probe_wasm), topics=("*",), apply_to=both)),
        "probe-twice": make(
            FilterSpec(name="first", module=str(probe_wasm), topics=("*",), apply_to=both),
            FilterSpec(name="second", module=str(probe_wasm), topics=("*",), apply_to=both)),
    }
    yield built
    for c in built.values():
        c.close()


def make_batch(values: list[bytes | None], *, codec: int = 0, producer_id: int = -1,
               keys: list[bytes | None] | None = None, base_offset: int = 0,
               ts_deltas: list[int] | None = None) -> bytes:
    n = len(values)
    deltas = ts_deltas or [i * 7 for i in range(n)]
    records = [Record(i, deltas[i], (keys[i] if keys else f"k{i}".encode()), v,
                      [("in", str(i).encode()), ("doc", b'{"a": [0, {"b": "x"}]}')])
               for i, v in enumerate(values)]
    base_ts = 1_700_000_000_000
    header = BatchHeader(base_offset, 0, -1, 2, 0, codec, max(n - 1, 0), base_ts,
                         base_ts + max(deltas, default=0), producer_id,
                         0 if producer_id >= 0 else -1, 0 if producer_id >= 0 else -1, n)
    return build_batch(header, records)


def both_paths(chain: FilterChain, run: Callable[..., Any], ctx: RecordContext,
               data: bytes) -> tuple[Any, Any]:
    native = run(chain, ctx, data)
    original = chain.native_for
    chain.native_for = lambda *a, **k: False  # type: ignore[method-assign]
    try:
        slow = run(chain, ctx, data)
    finally:
        chain.native_for = original  # type: ignore[method-assign]
    return native, slow


def summary(out: ProduceOutcome | FetchOutcome) -> tuple[object, ...]:
    records = None if out.records is None else bytes(out.records)
    stats = [(s.name, s.kept, s.rewritten, s.dropped, s.rejected, s.detector_counts,
              s.errors) for s in out.stats]
    extra = (out.all_dropped,) if isinstance(out, ProduceOutcome) else ()
    return (records, out.error_code, out.error_message, out.record_errors, stats, out.changed,
            *extra)


values_st = st.lists(st.one_of(st.sampled_from(COMMANDS), st.binary(max_size=40)),
                     min_size=1, max_size=12)


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(values=values_st, codec=st.integers(0, 4), idempotent=st.booleans(),
       fetch=st.booleans(),
       chain_name=st.sampled_from(["probe", "probe-pass", "mask-then-probe", "probe-twice"]),
       base_offset=st.integers(0, 2**40), null_keys=st.booleans())
def test_native_and_decoding_paths_agree(chains: Any, values: list[bytes | None], codec: int,
                                         idempotent: bool, fetch: bool, chain_name: str,
                                         base_offset: int, null_keys: bool) -> None:
    chain = chains[chain_name]
    keys: list[bytes | None] | None = [None] * len(values) if null_keys else None
    data = make_batch(values, codec=codec, producer_id=5 if idempotent else -1, keys=keys,
                      base_offset=base_offset if fetch else 0)
    if fetch:
        native, slow = both_paths(chain, filter_fetch, FETCH, data)
    else:
        native, slow = both_paths(chain, filter_produce, PRODUCE, data)
    assert summary(native) == summary(slow)


def test_native_path_is_taken_and_sees_the_context(chains: Any) -> None:
    chain = chains["probe"]
    probe = chain.filters[0]
    assert probe.native and chain.native_for("orders", "produce", "User:alice")
    data = make_batch([b"ctx", b"keep"], base_offset=40)
    calls: list[int] = []
    original = probe.run_native

    def spy(*args: Any, **kw: Any) -> Any:
        calls.append(args[2])
        return original(*args, **kw)

    probe.run_native = spy  # type: ignore[method-assign]
    try:
        out = filter_fetch(chain, FETCH, data)
    finally:
        probe.run_native = original  # type: ignore[method-assign]
    assert calls == [2]
    (b,), _ = split_batches(out.records)
    recs = decode_records(b)
    # topic|partition|client|principal|direction|absolute offset|timestamp|limit
    assert recs[0].value == b"orders|3|app|User:alice|1|40|1700000000000|4"
    assert recs[1].value == b"keep"
    assert b.header.base_offset == 40 and b.header.last_offset_delta == 1


def test_a_failing_call_falls_back_and_the_policy_applies_once(chains: Any) -> None:
    chain = chains["probe"]
    probe = chain.filters[0]
    before_fallbacks, before_failures = probe.native_fallbacks, sum(probe.failures.values())
    out = filter_produce(chain, PRODUCE, make_batch([b"keep", b"fail"]))
    assert out.error_code == INVALID_RECORD and out.records is None
    assert "asked to fail" in (out.error_message or "")
    assert probe.native_fallbacks == before_fallbacks + 1
    assert sum(probe.failures.values()) == before_failures + 1


def _corrupt_inside(data: bytes, extra: bytes) -> bytes:
    """The batch with `extra` appended to its (uncompressed) records and a valid CRC."""
    body = bytearray(data + extra)
    length = len(body) - 12
    body[8:12] = length.to_bytes(4, "big")
    body[17:21] = crc32c(bytes(body[21:])).to_bytes(4, "big")
    return bytes(body)


@pytest.mark.parametrize("fetch", [False, True])
def test_records_the_codec_refuses_are_refused_on_the_native_path(chains: Any,
                                                                  fetch: bool) -> None:
    data = _corrupt_inside(make_batch([b"keep", b"keep"]), b"\x00")
    run, ctx = (filter_fetch, FETCH) if fetch else (filter_produce, PRODUCE)
    native, slow = both_paths(chains["probe"], run, ctx, data)
    assert native.error_code == CORRUPT_MESSAGE
    assert summary(native) == summary(slow)


def test_a_native_answer_the_codec_refuses_is_redone_by_the_decoding_path(
        make_chain: Callable[..., FilterChain]) -> None:
    chain = make_chain("native_bad")
    assert chain.native_for("orders", "produce")
    data = make_batch([b"a", b"b", b"c"], codec=3)
    out = filter_produce(chain, PRODUCE, data)
    # sluice_filter keeps everything: the producer's bytes go on untouched.
    assert out.records is data and not out.changed and out.error_code == 0
    fetched = filter_fetch(chain, FETCH, data)
    assert fetched.records is data


def test_a_trap_on_the_native_path_is_contained(make_chain: Callable[..., FilterChain]) -> None:
    chain = make_chain("native_bad")
    f = chain.filters[0]
    ctx = RecordContext("trap", 0, "produce", "app", None)
    out = filter_produce(chain, ctx, make_batch([b"a"]))
    # The trap discards the instance; sluice_filter on a fresh one keeps the record.
    assert out.error_code == 0 and not out.changed
    assert f.native_fallbacks == 1 and f.instantiations == 2


def test_a_rewrite_feeds_the_next_filter_in_kafka_encoding(chains: Any) -> None:
    chain = chains["mask-then-probe"]
    value = b'{"email": "ann@example.com", "card": "4111 1111 1111 1111"}'
    out = filter_produce(chain, PRODUCE, make_batch([value], codec=2))
    # mask then probe: the masked JSON is not a probe command, so probe rejects it.
    assert out.error_code == INVALID_RECORD
    assert out.record_errors == [(0, "filter probe: unknown command")]
    mask_stats = out.stats[0]
    assert (mask_stats.rewritten, mask_stats.detector_counts) == (1, {"email": 1, "card": 1})


@pytest.mark.parametrize("buf, problem", [
    (b"", "truncated"),
    (b"\x02\x00\x00\x00\x00\x00\xff\xff\xff\xff\x00\x00\x00\x00\x00\x00\x00\x00", None),
    (b"\x01\x00\x00\x00\x07\xff\xff\xff\xff\x00\x00\x00\x00\x00\x00\x00\x00", "unknown fate"),
    (b"\x01\x00\x00\x00\x01\xff\xff\xff\xff\x00\x00\x00\x00\x00\x00\x00\x00", "unchanged"),
    (b"\x01\x00\x00\x00\x03\xff\xff\xff\xff\x00\x00\x00\x00\x00\x00\x00\x00", "unchanged"),
    (b"\x01\x00\x00\x00\x03\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00", "reject reasons"),
    (b"\x01\x00\x00\x00\x00\xff\xff\xff\xff\x00\x00\x00\x00\x00\x00\x00\x00!", "unexpected"),
])
def test_native_output_layout_errors(buf: bytes, problem: str | None) -> None:
    if problem is None:
        with pytest.raises(AbiError, match="fates for 1 records"):
            decode_native_output(buf, 1)
        return
    with pytest.raises(AbiError, match=problem):
        decode_native_output(buf, 1)


def test_native_output_fields() -> None:
    reason = b"too big"
    buf = (b"\x03\x00\x00\x00" + bytes([0, 3, 1]) + (4).to_bytes(4, "little") + b"abcd"
           + (1).to_bytes(4, "little") + (1).to_bytes(4, "little")
           + len(reason).to_bytes(4, "little") + reason
           + (2).to_bytes(4, "little")
           + (1).to_bytes(4, "little") + b"x" + (5).to_bytes(4, "little")
           + (1).to_bytes(4, "little") + b"x" + (2).to_bytes(4, "little"))
    out = decode_native_output(buf, 3)
    assert (out.fates, out.records, out.rejects, out.detector_counts) == (
        bytes([0, 3, 1]), b"abcd", {1: "too big"}, {"x": 7})


@settings(max_examples=300, deadline=None)
@given(buf=st.binary(max_size=64), count=st.integers(0, 8))
def test_native_output_decoder_raises_only_abi_errors(buf: bytes, count: int) -> None:
    try:
        out = decode_native_output(buf, count)
    except AbiError:
        return
    assert len(out.fates) == count

