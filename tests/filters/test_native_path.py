"""The native fast path (``sluice_filter_records``) against the decoding path (``sluice_filter``).

Both paths must give the same outcome for every batch: the same bytes forwarded, the same
errors, the same per-filter counts. The decoding path is the reference; the native path is
only allowed to be faster. Guests come from the C SDK (tests/filters/sdk/probe_c: each record
value is a command), the Zig, Rust, AssemblyScript, Go and JavaScript SDKs
(tests/filters/sdk/probe_zig, probe_rust, probe_as, probe_go, probe_js: the same commands),
the shipped pii-mask and the upper and enrich examples in every language; `native_bad.wat`
returns a broken native answer.
"""

from __future__ import annotations

import gc
import tracemalloc
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sluice.codec.batch_counts import count_records
from sluice.codec.records import (
    BatchHeader,
    Record,
    build_batch,
    crc32c,
    decode_records,
    split_batches,
)
from sluice.filters import native_io, pipeline
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
from sluice.filters.records_io import MAX_DETECTOR_NAME_BYTES, MAX_DETECTORS, AbiError
from tests.harness.session_builds import built_once, session_module_cache

PROBE = Path(__file__).resolve().parent / "sdk" / "probe_c"
EXAMPLES = Path(__file__).resolve().parents[2] / "filters" / "examples"
# Every example with a Sluice ABI port, by name: the committed modules.
PORTS = ["upper", "upper-c", "upper-rust", "upper-as", "upper-go", "upper-js", "enrich",
         "enrich-rust", "enrich-as", "enrich-go", "enrich-js", "pii-mask-go", "upper-py",
         "enrich-py"]
# The probes that mirror probe_zig, by language; each has a "<lang>-probe" chain and a
# "<lang>-like-c" one whose "ctx" text equals the C probe's.
SDK_PROBES = {"zig": "probe_zig", "rust": "probe_rust", "as": "probe_as", "go": "probe_go",
              "js": "probe_js"}
PRODUCE = RecordContext("orders", 3, "produce", "app", "User:alice")
FETCH = RecordContext("orders", 3, "fetch", "app", "User:alice")
COMMANDS = [b"keep", b"drop", b"ctx", b"count", b"headers", b"json", b"other", b"fail", None,
            b"reject", b"key"]


@pytest.fixture(scope="module")
def probe_wasm(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return built_once(tmp_path_factory, PROBE)


@pytest.fixture(scope="module")
def sdk_probes(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return {lang: built_once(tmp_path_factory, PROBE.parent / d) for lang, d in SDK_PROBES.items()}


@pytest.fixture(scope="module")
def chains(probe_wasm: Path, sdk_probes: dict[str, Path],
           tmp_path_factory: pytest.TempPathFactory) -> Any:
    """name -> chain. Hypothesis calls the test many times: chains are built once."""
    zig_probe_wasm = sdk_probes["zig"]
    from sluice.filters.runtime import shared_cache

    cache: ModuleCache = shared_cache(None, session_module_cache(tmp_path_factory))
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
        "probe-then-zig": make(
            FilterSpec(name="probe", module=str(probe_wasm), topics=("*",), apply_to=both),
            FilterSpec(name="zig", module=str(zig_probe_wasm), topics=("*",), apply_to=both,
                       on_error="pass")),
        "zig-then-probe": make(
            FilterSpec(name="zig", module=str(zig_probe_wasm), topics=("*",), apply_to=both,
                       on_error="pass"),
            FilterSpec(name="probe", module=str(probe_wasm), topics=("*",), apply_to=both)),
    }
    for lang, wasm in sdk_probes.items():
        built[f"{lang}-probe"] = make(FilterSpec(name=lang, module=str(wasm), topics=("*",),
                                                 apply_to=both, config={"prefix": "z:"}))
        # Its "ctx" text equals the C probe's without config (limit 1000).
        built[f"{lang}-like-c"] = make(FilterSpec(name=lang, module=str(wasm), topics=("*",),
                                                  apply_to=both, config={"prefix": "1000"}))
    for lang in ("rust", "as", "go", "js"):
        built[f"probe-then-{lang}"] = make(
            FilterSpec(name="probe", module=str(probe_wasm), topics=("*",), apply_to=both),
            FilterSpec(name=lang, module=str(sdk_probes[lang]), topics=("*",), apply_to=both,
                       on_error="pass"))
    for name in PORTS:
        built[name] = make(FilterSpec(name=name, module=str(EXAMPLES / name / f"{name}.wasm"),
                                      topics=("*",), apply_to=both))
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


@contextmanager
def native_answers() -> Iterator[list[Any]]:
    """Collects what the pipeline's native attempt returned (None: it fell back)."""
    answers: list[Any] = []
    original = pipeline._run_native

    def spy(*args: Any) -> Any:
        answers.append(original(*args))
        return answers[-1]

    pipeline._run_native = spy
    try:
        yield answers
    finally:
        pipeline._run_native = original


def summary(out: ProduceOutcome | FetchOutcome) -> tuple[object, ...]:
    records = None if out.records is None else bytes(out.records)
    stats = [(s.name, s.kept, s.rewritten, s.dropped, s.rejected, s.detector_counts,
              s.errors) for s in out.stats]
    extra = (out.all_dropped,) if isinstance(out, ProduceOutcome) else ()
    return (records, out.error_code, out.error_message, out.record_errors, stats, out.changed,
            *extra)


values_st = st.lists(st.one_of(st.sampled_from(COMMANDS), st.binary(max_size=40)),
                     min_size=1, max_size=12)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(values=values_st, codec=st.integers(0, 4), idempotent=st.booleans(),
       fetch=st.booleans(),
       chain_name=st.sampled_from(["probe", "probe-pass", "mask-then-probe", "probe-twice",
                                   "zig-probe", "probe-then-zig", "zig-then-probe",
                                   "rust-probe", "as-probe", "probe-then-rust", "probe-then-as",
                                   "go-probe", "probe-then-go", "js-probe", "probe-then-js",
                                   *PORTS]),
       base_offset=st.integers(0, 2**40), null_keys=st.booleans())
def test_native_and_decoding_paths_agree(chains: Any, values: list[bytes | None], codec: int,
                                         idempotent: bool, fetch: bool, chain_name: str,
                                         base_offset: int, null_keys: bool) -> None:
    chain = chains[chain_name]
    keys: list[bytes | None] | None = [None] * len(values) if null_keys else None
    data = make_batch(values, codec=codec, producer_id=5 if idempotent else -1, keys=keys,
                      base_offset=base_offset if fetch else 0)
    with native_answers() as answers:
        if fetch:
            native, slow = both_paths(chain, filter_fetch, FETCH, data)
        else:
            native, slow = both_paths(chain, filter_produce, PRODUCE, data)
    assert summary(native) == summary(slow)
    if not fetch:
        # The counts telemetry reports come from the headers both paths parsed: they equal a
        # count of what is forwarded, on both paths.
        for out in (native, slow):
            assert out.records_in == len(values)
            if out.records is not None:
                assert out.records_out == count_records(out.records)
    else:
        # Fetch telemetry likewise, and the splice takes the output as the pieces it was
        # built from: together they are the records, byte for byte.
        for fetched in (native, slow):
            assert isinstance(fetched, FetchOutcome)
            assert b"".join(fetched.pieces) == bytes(fetched.records)
            assert fetched.size == len(fetched.records)
            if not fetched.error_code:
                assert fetched.records_out == count_records(fetched.records)
    if b"fail" not in values:
        # No filter is asked to fail: the native answer itself was used, not the fallback
        # (a section the codec refuses would be redone silently and still agree).
        assert len(answers) == 1 and answers[0] is not None


def fetch_counting_native_calls(chain: FilterChain, probe: Any,
                                data: bytes) -> tuple[FetchOutcome, list[int]]:
    """filter_fetch, recording the record count of every native call `probe` gets."""
    calls: list[int] = []
    original = probe.run_native

    def spy(*args: Any, **kw: Any) -> Any:
        calls.append(args[2])
        return original(*args, **kw)

    probe.run_native = spy
    try:
        return filter_fetch(chain, FETCH, data), calls
    finally:
        probe.run_native = original


def test_native_path_is_taken_and_sees_the_context(chains: Any) -> None:
    chain = chains["probe"]
    probe = chain.filters[0]
    assert probe.native and chain.native_for("orders", "produce", "User:alice")
    data = make_batch([b"ctx", b"keep"], base_offset=40)
    out, calls = fetch_counting_native_calls(chain, probe, data)
    assert calls == [2]
    (b,), _ = split_batches(out.records)
    recs = decode_records(b)
    # topic|partition|client|principal|direction|absolute offset|timestamp|limit
    assert recs[0].value == b"orders|3|app|User:alice|1|40|1700000000000|4"
    assert recs[1].value == b"keep"
    assert b.header.base_offset == 40 and b.header.last_offset_delta == 1


LANGS = pytest.mark.parametrize("lang", sorted(SDK_PROBES))


@LANGS
def test_sdk_modules_export_the_native_entry_point(chains: Any, lang: str) -> None:
    # The committed examples and a freshly built probe: all come from the SDKs.
    assert all(chains[name].filters[0].native for name in PORTS)
    chain = chains[f"{lang}-probe"]
    probe = chain.filters[0]
    assert probe.native and chain.native_for("orders", "fetch", "User:alice")
    data = make_batch([b"ctx", b"keep", b"count", None], base_offset=40)
    fallbacks = probe.native_fallbacks
    out, calls = fetch_counting_native_calls(chain, probe, data)
    assert calls == [4] and probe.native_fallbacks == fallbacks
    (b,), _ = split_batches(out.records)
    recs = decode_records(b)
    # topic|partition|client|principal|direction|absolute offset|timestamp|prefix
    assert recs[0].value == b"orders|3|app|User:alice|1|40|1700000000000|z:"
    assert [r.value for r in recs[1:]] == [b"keep", b"count"]
    assert [r.offset_delta for r in recs] == [0, 1, 2]
    stats = out.stats[0]
    assert (stats.kept, stats.rewritten, stats.dropped) == (2, 1, 1)
    assert stats.detector_counts == {"a": 2, "b": 1}


def _section(batch: bytes) -> bytes:
    """The records section of an uncompressed batch (after the 61-byte v2 header)."""
    return batch[61:]


@LANGS
def test_sdk_native_answer_is_kafkas_record_encoding(chains: Any, lang: str) -> None:
    zig = chains[f"{lang}-probe"].filters[0]
    values: list[bytes | None] = [b"keep", b"v", b"drop", b"keep", b"reject", b"count"]
    data = make_batch(values, keys=[b"a", None, b"b", b"c", b"d", b"e"],
                      ts_deltas=[5, -3, 0, 2**40, 9, 1])
    out = zig.run_native(PRODUCE, _section(data), len(values), timestamp_base=1)
    assert out is not None
    assert out.fates == bytes([0, 1, 2, 0, 3, 0])
    assert out.rejects == {4: "no"} and out.detector_counts == {"seen": 1, "a": 2, "b": 1}
    (batch,), _ = split_batches(data)
    recs = decode_records(batch)
    # Kept records as they came; the rewrite keeps its attributes and both deltas.
    rewritten = Record(1, -3, None, b"z:v@orders", [("h", None)], recs[1].attributes)
    expected = build_batch(batch.header, [recs[0], rewritten, recs[3], recs[5]])
    assert out.records == _section(expected)
    # Nothing changed: the section is not sent back at all.
    kept = zig.run_native(PRODUCE, _section(make_batch([b"keep", b"count"])), 2)
    assert kept is not None and kept.records is None and kept.fates == bytes([0, 0])


shared_st = st.lists(st.tuples(st.sampled_from([b"ctx", b"count", b"drop", b"keep"]),
                               st.one_of(st.none(), st.binary(max_size=300)),
                               st.integers(-(2**62), 2**62)),
                     min_size=1, max_size=10)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(recs=shared_st, fetch=st.booleans(), offset_base=st.integers(0, 2**40),
       timestamp_base=st.integers(-(2**40), 2**40))
@LANGS
def test_sdk_and_c_give_the_same_native_answer_for_the_same_decisions(
        chains: Any, lang: str, recs: list[tuple[bytes, bytes | None, int]], fetch: bool,
        offset_base: int, timestamp_base: int) -> None:
    c_probe = chains["probe-twice"].filters[0]  # no config: its "ctx" ends with limit 1000
    data = make_batch([v for v, _, _ in recs], keys=[k for _, k, _ in recs],
                      ts_deltas=[t for _, _, t in recs])
    ctx = FETCH if fetch else PRODUCE
    c_answer, zig_answer = (
        f.run_native(ctx, _section(data), len(recs), offset_base=offset_base if fetch else 0,
                     timestamp_base=timestamp_base)
        for f in (c_probe, chains[f"{lang}-like-c"].filters[0]))
    assert c_answer is not None
    assert c_answer == zig_answer


def _varint(v: int) -> bytes:
    z = (v << 1) ^ (v >> 63)
    out = bytearray()
    while z > 0x7F:
        out.append((z & 0x7F) | 0x80)
        z >>= 7
    return bytes(out + bytes([z]))


def _record(body: bytes) -> bytes:
    return _varint(len(body)) + body


# attributes, timestampDelta 0, offsetDelta 0, null key, value "keep"
_HEAD = b"\x00\x00\x00\x01" + _varint(4) + b"keep"
_GOOD = _record(_HEAD + _varint(1) + _varint(1) + b"h" + _varint(-1))


@pytest.mark.parametrize("section", [
    pytest.param(_GOOD + b"\x00", id="bytes after the last record"),
    pytest.param(_GOOD[:-1], id="truncated"),
    pytest.param(_GOOD + _GOOD, id="more records than record_count"),
    pytest.param(_record(_HEAD + _varint(1) + _varint(-1) + _varint(-1)), id="null header key"),
    pytest.param(_record(_HEAD + _varint(40) + b"\x00\x00"), id="header count beyond the record"),
    pytest.param(_record(_HEAD + _varint(0) + b"\x00"), id="bytes left inside the record"),
    pytest.param(_record(_HEAD + _varint(-2)), id="header count below zero"),
    pytest.param(_record(b"\x00\x00" + _varint(2**31) + _HEAD[3:] + _varint(0)),
                 id="33-bit offsetDelta"),
    pytest.param(_record(b"\x00\x00\x00" + _varint(-2) + _varint(4) + b"keep" + _varint(0)),
                 id="key length -2"),
    pytest.param(_varint(-1), id="negative record length"),
    pytest.param(b"\xff" * 11, id="varint longer than ten bytes"),
])
@LANGS
def test_sdk_and_c_refuse_the_same_malformed_sections(chains: Any, section: bytes,
                                                      lang: str) -> None:
    c_probe, zig = chains["probe-twice"].filters[0], chains[f"{lang}-like-c"].filters[0]
    good = [f.run_native(PRODUCE, _GOOD, 1) for f in (c_probe, zig)]
    assert good[0] is not None and good[0] == good[1]
    before = (c_probe.native_fallbacks, zig.native_fallbacks)
    assert c_probe.run_native(PRODUCE, section, 1) is None
    assert zig.run_native(PRODUCE, section, 1) is None
    assert (c_probe.native_fallbacks, zig.native_fallbacks) == (before[0] + 1, before[1] + 1)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(recs=shared_st, where=st.integers(0, 2**16), byte=st.integers(1, 255),
       how=st.sampled_from(["flip", "cut", "append"]))
@LANGS
def test_sdk_and_c_refuse_the_same_damaged_sections(
        chains: Any, lang: str, recs: list[tuple[bytes, bytes | None, int]], where: int, byte: int,
        how: str) -> None:
    section = _section(make_batch([v for v, _, _ in recs], keys=[k for _, k, _ in recs],
                                  ts_deltas=[t for _, _, t in recs]))
    i = where % len(section)
    damaged = {"flip": section[:i] + bytes([section[i] ^ byte]) + section[i + 1:],
               "cut": section[:i], "append": section + bytes([byte])}[how]
    answers = [f.run_native(PRODUCE, damaged, len(recs))
               for f in (chains["probe-twice"].filters[0],
                         chains[f"{lang}-like-c"].filters[0])]
    # A flipped value byte may change a command, and the probes differ on unknown ones.
    assert (answers[0] is None) == (answers[1] is None)
    if how != "flip":
        assert answers == [None, None]


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


@pytest.fixture(scope="module")
def mask_chains(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """builtin:pii-mask alone: with its defaults, and with keys and headers switched off."""
    from sluice.filters.runtime import shared_cache

    cache: ModuleCache = shared_cache(None, tmp_path_factory.mktemp("mask-cache"))
    both = frozenset({"produce", "fetch"})
    built = {name: FilterChain.from_specs(
        [FilterSpec(name="mask", module="builtin:pii-mask", topics=("*",), apply_to=both,
                    config=config)], cache=cache)
        for name, config in (("defaults", {}), ("keys-off", {"keys": False}),
                             ("headers-off", {"headers": False}),
                             ("x-user-only", {"headers": ["x-user"]}))}
    yield built
    for c in built.values():
        c.close()


# "4111 1111 1111 1111" in full-width digits (U+FF10-U+FF19)
FULL_WIDTH_CARD = "".join(chr(ord(c) + 0xFEE0) if c != " " else c
                          for c in "4111 1111 1111 1111").encode()
PII_PARTS = st.sampled_from([b"ann@example.com", b"4111 1111 1111 1111", b"4111_1111_1111_1111",
                             FULL_WIDTH_CARD, b"+44 20 7946 0958",
                             b'{"mail": "b@c.io", "n": 4111111111111111}', b"nothing here",
                             # labelled bare phones, secret names, addresses glued to CJK
                             b'{"phone": "13094964558", "aws.secretKey": "x/y+z"}',
                             "Tel. 810 12 25 41 メールa@b.jpです".encode(),
                             b"aws.secretKey=abc/def (11) 96123-7455x12",
                             b"\xef\xbc\x94\xff", b""])
PII_BYTES = st.one_of(st.none(), PII_PARTS, st.lists(PII_PARTS, max_size=3).map(b" ".join),
                      st.binary(max_size=24))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(records=st.lists(st.tuples(PII_BYTES, PII_BYTES,
                                  st.lists(st.tuples(st.sampled_from(["x-user", "trace", ""]),
                                                     PII_BYTES), max_size=3)),
                        min_size=1, max_size=6),
       chain_name=st.sampled_from(["defaults", "keys-off", "headers-off", "x-user-only"]),
       fetch=st.booleans(), codec=st.integers(0, 2))
def test_pii_mask_of_keys_values_and_headers_agrees_on_both_paths(
        mask_chains: Any, records: list[tuple[bytes | None, bytes | None,
                                              list[tuple[str, bytes | None]]]],
        chain_name: str, fetch: bool, codec: int) -> None:
    # Keys and header values are masked by default: the native path (the guest rewrites
    # Kafka's record encoding) and the decoding path must store the same bytes.
    n = len(records)
    recs = [Record(i, i, key, value, headers) for i, (key, value, headers) in enumerate(records)]
    base_ts = 1_700_000_000_000
    header = BatchHeader(7 if fetch else 0, 0, -1, 2, 0, codec, n - 1, base_ts, base_ts + n - 1,
                         -1, -1, -1, n)
    data = build_batch(header, recs)
    chain = mask_chains[chain_name]
    with native_answers() as answers:
        native, slow = both_paths(chain, filter_fetch if fetch else filter_produce,
                                  FETCH if fetch else PRODUCE, data)
    assert summary(native) == summary(slow)
    assert len(answers) == 1 and answers[0] is not None
    if native.records is None:
        return
    (b,), _ = split_batches(native.records)
    for before, after in zip(recs, decode_records(b), strict=True):
        # Nothing the filter was told to leave is touched.
        if chain_name == "keys-off":
            assert after.key == before.key
        if chain_name == "headers-off":
            assert after.headers == before.headers
        if chain_name == "x-user-only":
            assert [h for h in after.headers if h[0] != "x-user"] == [
                h for h in before.headers if h[0] != "x-user"]
        if chain_name == "defaults" and before.key and b"ann@example.com" in before.key:
            assert after.key is not None and b"ann@example.com" not in after.key


def test_pii_mask_masks_key_and_headers_on_the_native_path(mask_chains: Any) -> None:
    rec = Record(0, 0, b"ann@example.com", b"card 4111_1111_1111_1111",
                 [("x-user", FULL_WIDTH_CARD), ("trace", b"t-1")])
    data = build_batch(BatchHeader(0, 0, -1, 2, 0, 0, 0, 1, 1, -1, -1, -1, 1), [rec])
    chain = mask_chains["defaults"]
    assert chain.filters[0].native
    out = filter_produce(chain, PRODUCE, data)
    (b,), _ = split_batches(out.records)
    (got,) = decode_records(b)
    assert got.key == b"***@*******.***"
    assert got.value == b"card ****_****_****_****"
    assert got.headers == [("x-user", b"**** **** **** ****"), ("trace", b"t-1")]
    assert out.stats[0].detector_counts == {"email": 1, "card": 2}


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


@pytest.mark.parametrize("as_view", [False, True])
def test_native_output_fields(as_view: bool) -> None:
    reason = b"too big"
    buf = (b"\x03\x00\x00\x00" + bytes([0, 3, 1]) + (4).to_bytes(4, "little") + b"abcd"
           + (1).to_bytes(4, "little") + (1).to_bytes(4, "little")
           + len(reason).to_bytes(4, "little") + reason
           + (2).to_bytes(4, "little")
           + (1).to_bytes(4, "little") + b"x" + (5).to_bytes(4, "little")
           + (1).to_bytes(4, "little") + b"x" + (2).to_bytes(4, "little"))
    # The host reads a guest's output in place (a view of its memory, which the guest's next
    # call overwrites): what the result keeps must be copies, not views of it.
    scratch = bytearray(buf)
    out = decode_native_output(memoryview(scratch) if as_view else buf, 3)
    scratch[:] = bytes(len(scratch))
    assert (out.fates, out.records, out.rejects, out.detector_counts) == (
        bytes([0, 3, 1]), b"abcd", {1: "too big"}, {"x": 7})
    assert type(out.fates) is bytes and type(out.records) is bytes


def _all_kept_output(detectors: list[tuple[bytes, int]]) -> bytes:
    """A one-record output that keeps it, with these detector entries."""
    out = b"\x01\x00\x00\x00\x00" + (0xFFFFFFFF).to_bytes(4, "little") + bytes(4)
    out += len(detectors).to_bytes(4, "little")
    for name, n in detectors:
        out += len(name).to_bytes(4, "little") + name + n.to_bytes(4, "little")
    return out


def _summed(detectors: list[tuple[bytes, int]]) -> dict[str, int] | None:
    """What the detector section means (None: a name is not UTF-8)."""
    counts: dict[str, int] = {}
    for name, n in detectors:
        try:
            text = name.decode()
        except UnicodeDecodeError:
            return None
        counts[text] = counts.get(text, 0) + n
    return counts


# Names of two lengths from a small alphabet (with a byte that is not UTF-8 on its own), so
# that sections of the same entry count and size but other names or duplicates come up often.
_NAMES = st.sampled_from([b"ab", b"cd", b"ab", b"\xff\xfe", b"xyz", b"uvw"])


@settings(max_examples=300, deadline=None)
@given(sections=st.lists(st.lists(st.tuples(_NAMES, st.integers(0, 2**32 - 1)), max_size=4),
                         min_size=1, max_size=6),
       as_view=st.booleans())
def test_native_output_detectors_read_as_they_are_after_other_layouts(
        sections: list[list[tuple[bytes, int]]], as_view: bool) -> None:
    # decode_native_output keeps the layout of a detector section it read (by entry count and
    # size) to read the next one like it at once: one of the same size with other names, or
    # a name twice, must still read as written.
    for detectors in sections:
        buf = _all_kept_output(detectors)
        want = _summed(detectors)
        if want is None:
            with pytest.raises(AbiError, match="not valid UTF-8"):
                decode_native_output(memoryview(bytearray(buf)) if as_view else buf, 1)
            continue
        out = decode_native_output(memoryview(bytearray(buf)) if as_view else buf, 1)
        assert out.detector_counts == want
        assert list(out.detector_counts) == list(want)  # first-seen order


def _decoded(buf: bytes | memoryview) -> tuple[str, object]:
    """What decode_native_output makes of a one-record output: its counters or its error."""
    try:
        return "ok", list(decode_native_output(buf, 1).detector_counts.items())
    except AbiError as exc:
        return "error", str(exc)


@st.composite
def _crafted_sections(draw: st.DrawFn) -> bytes:
    """A one-record output whose detector section a hostile guest wrote: names of other
    lengths under the same total size, length fields that lie, a wrong entry count, a cut or
    trailing bytes."""
    entries = draw(st.lists(st.tuples(_NAMES, st.integers(0, 2**32 - 1)), max_size=4))
    buf = _all_kept_output(entries)
    head = len(buf) - sum(8 + len(name) for name, _ in entries) - 4
    section = bytearray(buf[head:])
    pos = 4
    for name, _ in entries:  # a length field off by a little reads the names shifted
        section[pos:pos + 4] = max(0, len(name) + draw(st.integers(-2, 2))).to_bytes(4, "little")
        pos += 8 + len(name)
    if draw(st.booleans()):
        section[0:4] = draw(st.integers(0, 6)).to_bytes(4, "little")
    out = buf[:head] + bytes(section) + draw(st.binary(max_size=3))
    return out[:draw(st.integers(head, len(out)))]


@settings(max_examples=300, deadline=None)
@given(warm=st.lists(st.lists(st.tuples(_NAMES, st.integers(0, 2**32 - 1)), min_size=1,
                              max_size=4), max_size=4),
       crafted=st.lists(_crafted_sections(), min_size=1, max_size=4), as_view=st.booleans())
def test_native_output_detectors_read_the_same_with_or_without_the_layouts_seen_before(
        warm: list[list[tuple[bytes, int]]], crafted: list[bytes], as_view: bool) -> None:
    # The layouts kept from earlier outputs (any filter's: they are per process) may only make
    # a read faster: a crafted section reads, or fails, exactly as with nothing kept before,
    # which is the entry-by-entry reader of before the layouts.
    for detectors in warm:
        _decoded(_all_kept_output(detectors))
    for buf in crafted:
        got = _decoded(memoryview(bytearray(buf)) if as_view else buf)
        kept = native_io._LAYOUTS
        native_io._LAYOUTS = {}
        try:
            assert got == _decoded(buf)
        finally:
            native_io._LAYOUTS = kept


def test_native_output_keeps_nothing_the_size_of_a_guests_detector_section() -> None:
    # A guest may report up to MAX_DETECTORS distinct counter names of up to
    # MAX_DETECTOR_NAME_BYTES each (~66 KB a section). The layouts kept to read the next
    # section like it must not keep such a section: at ~20 times its size for its names, their
    # text and a Struct of three codes an entry, and up to 256 of them for as many sizes, a
    # guest would make the proxy hold ~300 MB after its batches are gone.
    names = [bytes((i & 127, i >> 7 & 127)) * 125 for i in range(MAX_DETECTORS)]
    sizes = (MAX_DETECTORS, MAX_DETECTORS - 1)
    outputs = [_all_kept_output([(name, 1) for name in names[:n]]) for n in sizes]
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for n, buf in zip(sizes, outputs, strict=True):
            assert len(decode_native_output(buf, 1).detector_counts) == n
        gc.collect()
        kept = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert kept < len(outputs[0]) // 4, f"{kept} bytes kept after {len(outputs[0])}-byte outputs"


@settings(max_examples=300, deadline=None)
@given(buf=st.binary(max_size=64), count=st.integers(0, 8))
def test_native_output_decoder_raises_only_abi_errors(buf: bytes, count: int) -> None:
    try:
        out = decode_native_output(buf, count)
    except AbiError:
        return
    assert len(out.fates) == count



def test_a_guest_section_is_checked_even_when_the_sealer_comes_after_it(
        make_chain: Callable[..., FilterChain], make_spec: Callable[..., FilterSpec],
        tmp_path: Path) -> None:
    """Only a section the proxy's own native code wrote skips the pipeline's second check: a
    guest's (here three garbage bytes) is never trusted, also when builtin:encrypt's sealer
    runs after it, and the batch is redone by the decoding path."""
    from sluice.crypto.kms import KmsSettings

    kms = KmsSettings("local", path=str(tmp_path / "keys.json"))
    enc = make_spec("builtin:encrypt", name="enc", kms=kms,
                    config={"key": "orders", "decrypt_for": ["User:alice"]})
    data = make_batch([b'{"a": 1}', b'{"a": 2}', b'{"a": 3}'])
    section = bytes(data[61:])
    guest = make_chain("native_bad")
    alone = guest.run_native(PRODUCE, section, 3)
    assert alone is not None and alone.changed and not alone.trusted
    sealer = make_chain(enc)
    sealed = sealer.run_native(PRODUCE, section, 3)
    assert sealed is not None and sealed.changed and sealed.trusted
    both = make_chain(make_spec("native_bad"), enc)
    after = both.run_native(PRODUCE, section, 3)
    assert after is None or not after.trusted
    out = filter_produce(both, PRODUCE, data)
    assert out.error_code == 0 and out.records is not None
    stored = bytes(out.records)
    assert b'{"a": 2}' not in stored
    back = filter_fetch(make_chain(enc), FETCH, stored)
    assert back.error_code == 0 and bytes(back.records) == data


def test_native_output_with_room_copies_the_section_once_behind_it() -> None:
    # The section is copied out of the guest's memory once, behind room for a batch header,
    # and the result still keeps nothing of the guest's memory.
    buf = (b"\x02\x00\x00\x00" + bytes([1, 0]) + (4).to_bytes(4, "little") + b"abcd"
           + bytes(4) + bytes(4))
    scratch = bytearray(buf)
    out = decode_native_output(memoryview(scratch), 2, 61)
    scratch[:] = bytes(len(scratch))
    assert out.framed is not None and len(out.framed) == 61 + 4
    assert isinstance(out.records, memoryview) and out.records.obj is out.framed
    assert bytes(out.records) == b"abcd" and bytes(out.framed[61:]) == b"abcd"
    # Every record kept: nothing copied, nothing framed.
    kept = decode_native_output(b"\x01\x00\x00\x00\x00" + (4).to_bytes(4, "little") + b"abcd"
                                + bytes(8), 1, 61)
    assert kept.records is None and kept.framed is None


@pytest.mark.parametrize("fetch", [False, True])
def test_a_guest_section_becomes_the_uncompressed_batch_in_place(mask_chains: Any,
                                                                 fetch: bool) -> None:
    # pii-mask rewrites every record of an uncompressed batch: the batch forwarded is the
    # buffer the guest's section was copied into (the header written in front of it), not a
    # second copy, and it is what the decoding path builds.
    values = [b'{"email": "ann%d@example.com", "card": "4111 1111 1111 1111"}' % i
              for i in range(50)]
    data = make_batch(values, base_offset=900 if fetch else 0)
    chain = mask_chains["defaults"]
    with native_answers() as answers:
        native, slow = both_paths(chain, filter_fetch if fetch else filter_produce,
                                  FETCH if fetch else PRODUCE, data)
    assert len(answers) == 1 and answers[0] is not None
    nat, built_here = answers[0]
    assert nat.framed is not None and built_here is nat.framed
    assert summary(native) == summary(slow)
    built = native.pieces[0] if fetch else native.records
    assert built is nat.framed
    assert b"ann0@example.com" not in built


@pytest.mark.parametrize("entries, name_len, error", [
    (MAX_DETECTORS, 4, None),
    (MAX_DETECTORS + 1, 4, "detector count 257 is over the limit of 256"),
    (1, MAX_DETECTOR_NAME_BYTES, None),
    (1, MAX_DETECTOR_NAME_BYTES + 1, "a detector name is over the limit of 256 bytes"),
])
def test_native_output_bounds_its_detector_entries_and_names(
        entries: int, name_len: int, error: str | None) -> None:
    # The counts go into every telemetry event of the batch: a guest must not make those as
    # large as its memory. The limits are the per-record ABI's too.
    names = [f"{i:0{name_len}d}".encode() for i in range(entries)]
    buf = _all_kept_output([(name, 1) for name in names])
    if error is None:
        assert len(decode_native_output(buf, 1).detector_counts) == entries
    else:
        with pytest.raises(AbiError, match=error):
            decode_native_output(buf, 1)
