"""Micro-benchmarks of the filter host: ``python -m sluice.filters.bench [--quick]``.

Measures what docs/FILTER_ABI.md reports: the cost of one guest call through wasmtime-py's
``Func.__call__`` against the unchecked fast path (`RawFunc`), records/s with one call per
batch of 100 against one call per record, how fast the epoch deadline stops an infinite loop,
and compiling a module against deserializing its cached artifact (the guest modules are small
WAT texts below); and ``languages``: the shipped ``upper`` example built with each SDK (C, Zig,
Rust, AssemblyScript, Go, JavaScript, Python: ``filters/examples/upper*``) side by side, through the
decoding path (``run_batch``) and the native path the proxy takes (``filter_produce``);
``builtins``: ``builtin:rules`` against ``builtin:pii-mask`` on the same batch (``--baseline
OLD.wasm`` adds another rules module to the same turns, e.g. the previous build). Prints one
JSON object; ``--only languages`` or ``--only builtins`` runs that part alone.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import structlog
import wasmtime

from sluice.filters.config import FilterSpec
from sluice.filters.context import FilterRecord, RecordContext
from sluice.filters.engine import default_engine
from sluice.filters.guest import GuestInstance
from sluice.filters.module_cache import ModuleCache
from sluice.filters.runtime import LoadedFilter, load_filter

# Sluice ABI v1: keeps every record (output = count + zero bytes), or loops forever when the
# batch holds a record whose value starts with "LOOP" (checked on the first record only).
_KEEP_WAT = """
(module
  (memory (export "memory") 2)
  (func (export "sluice_abi_version") (result i32) (i32.const 1))
  (func (export "sluice_alloc") (param $n i32) (result i32)
    (local $need i32)
    (local.set $need (i32.add (i32.const 65536) (i32.add (i32.mul (local.get $n) (i32.const 2))
                                                         (i32.const 4096))))
    (if (i32.gt_u (local.get $need) (i32.mul (memory.size) (i32.const 65536)))
      (then (drop (memory.grow (i32.add (i32.div_u (i32.sub (local.get $need)
          (i32.mul (memory.size) (i32.const 65536))) (i32.const 65536)) (i32.const 1))))))
    (i32.const 65536))
  (func (export "add") (param i32 i32) (result i64)
    (i64.extend_i32_u (i32.add (local.get 0) (local.get 1))))
  (func (export "spin") (loop $l (br $l)))
  (func (export "sluice_filter") (param $in i32) (param $len i32) (result i64)
    (local $pos i32) (local $n i32) (local $out i32)
    (local.set $pos (i32.add (local.get $in) (i32.const 5)))
    (local.set $pos (i32.add (i32.add (local.get $pos) (i32.const 4)) (i32.load (local.get $pos))))
    (local.set $pos (i32.add (local.get $pos) (i32.const 4)))
    (local.set $pos (i32.add (i32.add (local.get $pos) (i32.const 4)) (i32.load (local.get $pos))))
    (local.set $pos (i32.add (i32.add (local.get $pos) (i32.const 4)) (i32.load (local.get $pos))))
    (local.set $n (i32.load (local.get $pos)))
    (local.set $out (i32.add (local.get $in) (local.get $len)))
    (i32.store (local.get $out) (local.get $n))
    (memory.fill (i32.add (local.get $out) (i32.const 4)) (i32.const 0) (local.get $n))
    (i64.or (i64.shl (i64.extend_i32_u (local.get $out)) (i64.const 32))
            (i64.extend_i32_u (i32.add (local.get $n) (i32.const 4)))))
)
"""

# In-place ABI: upper-cases the value in place (one call per record).
_INPLACE_WAT = """
(module
  (memory (export "memory") 1)
  (func (export "transform_record") (param $p i32) (param $n i32) (param $k i32) (param $kn i32)
                                    (result i64)
    (local $i i32) (local $c i32)
    (block $done
      (loop $next
        (br_if $done (i32.ge_u (local.get $i) (local.get $n)))
        (local.set $c (i32.load8_u (i32.add (local.get $p) (local.get $i))))
        (if (i32.and (i32.ge_u (local.get $c) (i32.const 97))
                     (i32.le_u (local.get $c) (i32.const 122)))
          (then (i32.store8 (i32.add (local.get $p) (local.get $i))
                            (i32.sub (local.get $c) (i32.const 32)))))
        (local.set $i (i32.add (local.get $i) (i32.const 1)))
        (br $next)))
    (i64.extend_i32_u (local.get $n)))
)
"""


def _rate(fn: Callable[[], int], seconds: float) -> float:
    """Median units/s over 3 runs of about `seconds` each (fn returns units done)."""
    rates = []
    for _ in range(3):
        done = 0
        started = time.perf_counter()
        while True:
            done += fn()
            elapsed = time.perf_counter() - started
            if elapsed >= seconds:
                break
        rates.append(done / elapsed)
    return statistics.median(rates)


def _interleaved(fns: dict[str, Callable[[], int]], seconds: float,
                 rounds: int = 9) -> dict[str, float]:
    """Median units/s of each fn over `rounds` turns of `seconds / 3` each, taken in turn."""
    rates: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            done = 0
            started = time.perf_counter()
            while True:
                done += fn()
                elapsed = time.perf_counter() - started
                if elapsed >= seconds / 3:
                    break
            rates[name].append(done / elapsed)
    return {name: statistics.median(r) for name, r in rates.items()}


def _interleaved_clocks(fns: dict[str, Callable[[], int]], seconds: float,
                        rounds: int = 9) -> dict[str, tuple[float, float]]:
    """Like `_interleaved`, but each slice is timed on two clocks at once: the wall clock and
    this thread's CPU time (the guest runs on the calling thread), so time the shared machine
    gives to other processes does not count. Median (wall, cpu) units/s of each fn."""
    wall: dict[str, list[float]] = {name: [] for name in fns}
    cpu: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            done = 0
            w0, c0 = time.perf_counter(), time.thread_time()
            while True:
                done += fn()
                c = time.thread_time() - c0
                if c >= seconds / 3:
                    break
            wall[name].append(done / (time.perf_counter() - w0))
            cpu[name].append(done / c)
    return {name: (statistics.median(wall[name]), statistics.median(cpu[name])) for name in fns}


def _record(i: int) -> FilterRecord:
    value = json.dumps({"user_id": i, "email": f"user{i}@example.com", "amount": 12.5,
                        "note": "x" * 120}).encode()[:200].ljust(200, b" ")
    return FilterRecord(i, 0, f"key-{i}".encode(), value, [("trace", b"abc123")])


def bench_calls(seconds: float) -> dict[str, float]:
    engine = default_engine()
    module = wasmtime.Module(engine.engine, _KEEP_WAT)
    guest = GuestInstance(engine, module, wasmtime.Linker(engine.engine),
                          memory_bytes=16 << 20, timeout_ms=1000)
    func = guest.exports["add"]
    assert isinstance(func, wasmtime.Func)
    store = guest.store
    store.set_epoch_deadline(1 << 40)

    def checked() -> int:
        for i in range(1000):
            func(store, i, 2)
        return 1000

    raw = guest.func("add")
    assert raw is not None

    def unchecked() -> int:
        for i in range(1000):
            raw(i, 2)
        return 1000

    return {"func_call_per_s": _rate(checked, seconds),
            "unchecked_call_per_s": _rate(unchecked, seconds)}


def bench_records(seconds: float, tmp: Path) -> dict[str, float]:
    keep = tmp / "keep.wasm"
    keep.write_bytes(wasmtime.wat2wasm(_KEEP_WAT))
    inplace = tmp / "inplace.wasm"
    inplace.write_bytes(wasmtime.wat2wasm(_INPLACE_WAT))
    cache = ModuleCache(default_engine(), tmp / "cache")
    ctx = RecordContext("bench", 0, "produce", "bench", None)
    batch = [_record(i) for i in range(100)]
    out: dict[str, float] = {}
    f = load_filter(FilterSpec(name="keep", module=str(keep)), cache=cache)
    out["sluice_abi_batch100_records_per_s"] = _rate(
        lambda: len(f.run_batch(ctx, batch).decisions), seconds)
    out["sluice_abi_per_record_records_per_s"] = _rate(
        lambda: sum(len(f.run_batch(ctx, [r]).decisions) for r in batch), seconds)
    g = load_filter(FilterSpec(name="inplace", module=str(inplace)), cache=cache)
    out["inplace_abi_upper_records_per_s"] = _rate(
        lambda: len(g.run_batch(ctx, batch).decisions), seconds)
    builtin = Path(__file__).resolve().parent / "builtin" / "pii-mask.wasm"
    if builtin.is_file():
        pii = load_filter(FilterSpec(name="pii", module="builtin:pii-mask"), cache=cache)
        out["pii_mask_batch100_records_per_s"] = _rate(
            lambda: len(pii.run_batch(ctx, batch).decisions), seconds)
    return out


def bench_pipeline(seconds: float, tmp: Path) -> dict[str, float]:
    """filter_produce / filter_fetch over one batch of 100 x 200-byte records (codec none)."""
    from sluice.codec.records import BatchHeader, Record, build_batch
    from sluice.filters.chain import FilterChain
    from sluice.filters.pipeline import filter_fetch, filter_produce

    keep = tmp / "keep-p.wasm"
    keep.write_bytes(wasmtime.wat2wasm(_KEEP_WAT))
    records = [Record(i, 0, r.key, r.value, r.headers) for i, r in
               enumerate(_record(i) for i in range(100))]
    header = BatchHeader(0, 0, -1, 2, 0, 0, 99, 1_700_000_000_000, 1_700_000_000_000, -1, -1,
                         -1, 100)
    raw = build_batch(header, records)
    cache = ModuleCache(default_engine(), tmp / "cache-p")
    out: dict[str, float] = {}
    produce = RecordContext("bench", 0, "produce", "bench", None)
    fetch = RecordContext("bench", 0, "fetch", "bench", None)
    chain = FilterChain.from_specs([FilterSpec(name="keep", module=str(keep),
                                               apply_to=frozenset({"produce", "fetch"}))],
                                   cache=cache)
    out["produce_keep_records_per_s"] = _rate(
        lambda: 100 if filter_produce(chain, produce, raw).error_code == 0 else 0, seconds)
    out["fetch_keep_records_per_s"] = _rate(
        lambda: 100 if filter_fetch(chain, fetch, raw).error_code == 0 else 0, seconds)
    builtin = Path(__file__).resolve().parent / "builtin" / "pii-mask.wasm"
    if builtin.is_file():
        pii = FilterChain.from_specs([FilterSpec(name="pii", module="builtin:pii-mask",
                                                 apply_to=frozenset({"produce"}))],
                                     cache=cache)
        out["produce_pii_mask_records_per_s"] = _rate(
            lambda: 100 if filter_produce(pii, produce, raw).changed else 0, seconds)
    return out


# The upper example in every SDK language: filters/examples/<dir>/<dir>.wasm.
UPPER_PORTS = {"c": "upper-c", "zig": "upper", "rust": "upper-rust",
               "assemblyscript": "upper-as", "go": "upper-go", "js": "upper-js",
               "python": "upper-py"}


def _upper_runs(f: LoadedFilter, chain: Any, ctx: RecordContext, batch: list[FilterRecord],
                raw: bytes) -> tuple[Callable[[], int], Callable[[], int], Callable[[], int],
                                     Callable[[], int]]:
    """One batch through the decoding path, the native call alone, the whole native path,
    and the whole pipeline on the decoding path (`filter_produce` with the native path off:
    the host decodes the batch, calls `sluice_filter`, rebuilds the batch)."""
    from sluice.filters.pipeline import filter_produce

    section = raw[61:]  # the records section after the v2 batch header

    def decoding_pipeline() -> int:
        original = chain.native_for
        chain.native_for = lambda *a, **k: False
        try:
            return 100 if filter_produce(chain, ctx, raw).changed else 0
        finally:
            chain.native_for = original

    def decoding() -> int:
        return len(f.run_batch(ctx, batch).decisions)

    def native_call() -> int:
        return 100 if f.run_native(ctx, section, 100) is not None else 0

    def native_path() -> int:
        return 100 if filter_produce(chain, ctx, raw).changed else 0

    return decoding, native_call, native_path, decoding_pipeline


def bench_languages(seconds: float, tmp: Path) -> dict[str, Any]:
    """records/s of `upper` per SDK language, batches of 100 x 200-byte records (every record
    rewritten), and each language's rate as a fraction of C's: through the decoding path
    (`run_batch`: records as Python objects, `sluice_filter`), the native call alone
    (`run_native`: `sluice_filter_records` on the records section) and the whole native path
    (`filter_produce`: CRC check, the call, the codec's check, the rebuilt batch). The last
    two are also taken in turn with the whole pipeline on the decoding path (`filter_produce`
    with the native path off), so `pipeline_native_over_decoding` says which entry point the
    proxy should use for that language, from figures measured side by side."""
    from sluice.codec.records import BatchHeader, Record, build_batch
    from sluice.filters.chain import FilterChain

    examples = Path(__file__).resolve().parent / "examples"
    batch = [_record(i) for i in range(100)]
    raw = build_batch(BatchHeader(0, 0, -1, 2, 0, 0, 99, 1_700_000_000_000, 1_700_000_000_000,
                                  -1, -1, -1, 100),
                      [Record(i, 0, r.key, r.value, r.headers) for i, r in enumerate(batch)])
    ctx = RecordContext("bench", 0, "produce", "bench", None)
    cache = ModuleCache(default_engine(), tmp / "cache-lang")
    decoding: dict[str, Callable[[], int]] = {}
    guest: dict[str, Callable[[], int]] = {}
    native: dict[str, Callable[[], int]] = {}
    pipelines: dict[str, Callable[[], int]] = {}
    out: dict[str, Any] = {}
    opened: list[Any] = []
    for lang, name in UPPER_PORTS.items():
        module = examples / name / f"{name}.wasm"
        spec = FilterSpec(name=name, module=str(module), apply_to=frozenset({"produce"}))
        started = time.perf_counter()
        f = load_filter(spec, cache=cache)  # compiles: the cache is empty
        compile_ms = (time.perf_counter() - started) * 1000
        # First-call latency as a proxy start sees it with a warm cache: deserialize,
        # instantiate (Go: its runtime's _initialize), sluice_init, then the first batch.
        started = time.perf_counter()
        first = load_filter(spec, cache=ModuleCache(default_engine(), tmp / "cache-lang"))
        first.run_batch(ctx, batch)
        first_call_ms = (time.perf_counter() - started) * 1000
        # A fresh instance of the compiled module (what a trap costs: the next call makes one;
        # Python: CPython's pre-initialised heap is copied in, init runs again).
        runner: Any = first._runner
        inst = []
        for _ in range(5):
            runner.discard()
            started = time.perf_counter()
            runner.guest()
            inst.append((time.perf_counter() - started) * 1000)
        first.close()
        chain = FilterChain.from_specs([spec], cache=cache)
        opened += [f, chain]
        (decoding[lang], guest[lang], native[lang],
         pipelines[f"{lang} decoding"]) = _upper_runs(f, chain, ctx, batch, raw)
        pipelines[f"{lang} native"] = native[lang]
        out[lang] = {"module_bytes": module.stat().st_size,
                     "compile_ms": round(compile_ms, 1),
                     "first_call_ms": round(first_call_ms, 2),
                     "instantiate_ms": round(statistics.median(inst), 2)}
    # Languages take turns in short slices, so a burst of load on the shared machine hits
    # them all alike instead of whichever ran at that moment.
    for path, fns in (("decoding_path_records_per_s", decoding),
                      ("native_call_records_per_s", guest),
                      ("native_path_records_per_s", native)):
        for lang, rate in _interleaved(fns, seconds).items():
            out[lang][path] = rate
    # Each language's two whole-pipeline paths back to back, in turn: their ratio is what
    # the choice of entry point gains, whatever the machine's load did meanwhile.
    rates = _interleaved(pipelines, seconds)
    for lang in UPPER_PORTS:
        out[lang]["decoding_pipeline_records_per_s"] = rates[f"{lang} decoding"]
        out[lang]["pipeline_native_over_decoding"] = round(
            rates[f"{lang} native"] / rates[f"{lang} decoding"], 3)
    for thing in opened:
        thing.close()
    for path in ("decoding_path_records_per_s", "native_call_records_per_s",
                 "native_path_records_per_s"):
        c_rate = out["c"][path]
        for lang in UPPER_PORTS:
            out[lang][path.replace("records_per_s", "vs_c")] = round(out[lang][path] / c_rate, 3)
    return out


# builtin:rules as docs/WRITING_FILTERS.md measures it: four rules (remove, hash with a salt,
# truncate, a drop condition). Every record of the bench batch has an `email`, so every record
# is hashed and rewritten: the hash rule's full cost, not a rule set that mostly passes through.
BENCH_RULES: list[dict[str, Any]] = [
    {"field": "amount", "action": "remove"},
    {"field": "email", "action": "hash", "salt": "pepper"},
    {"field": "note", "action": "truncate", "length": 40},
    {"field": "user_id", "action": "drop", "when": {"equals": -1}},
]


def bench_builtins(seconds: float, tmp: Path, baseline: Path | None = None) -> dict[str, Any]:
    """records/s of `builtin:rules` (BENCH_RULES) and `builtin:pii-mask` (defaults) on the same
    records section (100 x 200-byte JSON records; both rewrite every record: pii-mask masks the
    e-mail address), taking turns in short slices: the native call alone (`run_native`) and the
    whole native path (`filter_produce`), each slice timed on the wall clock and on this
    thread's CPU time, and rules as a fraction of pii-mask on each. `baseline` (a rules .wasm,
    e.g. the previous build) joins the same turns as "rules-baseline"; its output must equal
    the shipped module's."""
    from sluice.codec.records import BatchHeader, Record, build_batch
    from sluice.filters.chain import FilterChain
    from sluice.filters.pipeline import filter_produce

    batch = [_record(i) for i in range(100)]
    raw = build_batch(BatchHeader(0, 0, -1, 2, 0, 0, 99, 1_700_000_000_000, 1_700_000_000_000,
                                  -1, -1, -1, 100),
                      [Record(i, 0, r.key, r.value, r.headers) for i, r in enumerate(batch)])
    section = raw[61:]
    ctx = RecordContext("bench", 0, "produce", "bench", None)
    cache = ModuleCache(default_engine(), tmp / "cache-builtins")
    modules = {"rules": "builtin:rules", "pii-mask": "builtin:pii-mask"}
    configs: dict[str, dict[str, Any]] = {"rules": {"rules": BENCH_RULES}, "pii-mask": {}}
    if baseline is not None:
        modules["rules-baseline"] = str(baseline)
        configs["rules-baseline"] = configs["rules"]
    calls: dict[str, Callable[[], int]] = {}
    paths: dict[str, Callable[[], int]] = {}
    opened: list[Any] = []
    for name, config in configs.items():
        spec = FilterSpec(name=name, module=modules[name], config=config,
                          apply_to=frozenset({"produce"}))
        f = load_filter(spec, cache=cache)
        chain = FilterChain.from_specs([spec], cache=cache)
        opened += [f, chain]
        if filter_produce(chain, ctx, raw).changed is False:
            raise RuntimeError(f"{modules[name]} changed nothing: the bench would not measure it")

        def call(f: LoadedFilter = f) -> int:
            return 100 if f.run_native(ctx, section, 100) is not None else 0

        def path(chain: Any = chain) -> int:
            return 100 if filter_produce(chain, ctx, raw).changed else 0

        calls[name], paths[name] = call, path
    if baseline is not None:
        ours, theirs = (load_filter(FilterSpec(name=n, module=modules[n], config=configs[n]),
                                    cache=cache) for n in ("rules", "rules-baseline"))
        opened += [ours, theirs]
        if ours.run_native(ctx, section, 100) != theirs.run_native(ctx, section, 100):
            raise RuntimeError(f"{baseline} answers the bench batch differently")
    out: dict[str, Any] = {"load_average_before": [round(x, 2) for x in os.getloadavg()]}
    out.update({name: {} for name in configs})
    for key, fns in (("native_call", calls), ("native_path", paths)):
        for name, (wall, cpu) in _interleaved_clocks(fns, seconds).items():
            out[name][f"{key}_records_per_s"] = wall
            out[name][f"{key}_cpu_records_per_s"] = cpu
        for name in configs:
            if name == "pii-mask":
                continue
            for clock in ("", "_cpu"):
                out[name][f"{key}{clock}_vs_pii_mask"] = round(
                    out[name][f"{key}{clock}_records_per_s"] /
                    out["pii-mask"][f"{key}{clock}_records_per_s"], 3)
    out["load_average_after"] = [round(x, 2) for x in os.getloadavg()]
    for thing in opened:
        thing.close()
    return out


def bench_epoch(runs: int) -> dict[str, Any]:
    engine = default_engine()
    module = wasmtime.Module(engine.engine, _KEEP_WAT)
    result: dict[str, Any] = {"tick_ms": engine.tick_ms}
    for timeout_ms in (10, 50):
        stops = []
        for _ in range(runs):
            guest = GuestInstance(engine, module, wasmtime.Linker(engine.engine),
                                  memory_bytes=16 << 20, timeout_ms=timeout_ms)
            spin = guest.func("spin")
            assert spin is not None
            started = time.perf_counter()
            try:
                spin()
            except Exception:  # the GuestFailure("timeout") we are timing
                pass
            stops.append((time.perf_counter() - started) * 1000)
        result[f"timeout_{timeout_ms}ms_stop_ms_median"] = statistics.median(stops)
        result[f"timeout_{timeout_ms}ms_stop_ms_max"] = max(stops)
    return result


def bench_compile(tmp: Path, runs: int) -> dict[str, float]:
    engine = default_engine()
    sources = {"keep_wat": bytes(wasmtime.wat2wasm(_KEEP_WAT))}
    builtin = Path(__file__).resolve().parent / "builtin" / "pii-mask.wasm"
    if builtin.is_file():
        sources["pii_mask"] = builtin.read_bytes()
    out: dict[str, float] = {}
    for name, data in sources.items():
        compile_s, load_s = [], []
        for i in range(runs):
            d = tmp / f"c-{name}-{i}"
            compile_s.append(ModuleCache(engine, d).load(data).load_seconds)
            load_s.append(ModuleCache(engine, d).load(data).load_seconds)
        out[f"{name}_bytes"] = len(data)
        out[f"{name}_compile_ms"] = statistics.median(compile_s) * 1000
        out[f"{name}_deserialize_ms"] = statistics.median(load_s) * 1000
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="short runs (smoke test)")
    parser.add_argument("--only", choices=("languages", "builtins"),
                        help="run one part: languages = upper in C, Zig, Rust, AssemblyScript, "
                             "Go, JavaScript, Python; builtins = builtin:rules against "
                             "builtin:pii-mask")
    parser.add_argument("--baseline", type=Path, metavar="RULES.wasm",
                        help="builtins: another builtin:rules module (e.g. the previous build) "
                             "in the same turns, reported as rules-baseline")
    args = parser.parse_args(argv)
    # The report is JSON on stdout: a filter's warnings (a call past its deadline on a loaded
    # machine) go to stderr, or they would break it for whoever parses it.
    logs = structlog.get_config()
    structlog.configure(logger_factory=structlog.PrintLoggerFactory(sys.stderr),
                        cache_logger_on_first_use=False)
    try:
        report = _run(args)
    finally:
        structlog.configure(**logs)
    print(json.dumps(report, indent=2))
    return 0


def _run(args: argparse.Namespace) -> dict[str, Any]:
    """The report of the parts `args` asks for."""
    seconds = 0.05 if args.quick else 1.0
    runs = 2 if args.quick else 7
    with tempfile.TemporaryDirectory() as tmpdir:
        tmp = Path(tmpdir)
        report: dict[str, Any] = {"wasmtime": default_engine().fingerprint_text}
        if args.only is None:
            report["calls"] = bench_calls(seconds)
            report["records"] = bench_records(seconds, tmp)
            report["pipeline"] = bench_pipeline(seconds, tmp)
            report["epoch"] = bench_epoch(runs)
            report["compile"] = bench_compile(tmp, runs)
        if args.only in (None, "builtins"):
            report["builtins"] = bench_builtins(seconds, tmp, args.baseline)
        if args.only in (None, "languages"):
            report["languages"] = bench_languages(seconds, tmp)
    return report


if __name__ == "__main__":
    raise SystemExit(main())
