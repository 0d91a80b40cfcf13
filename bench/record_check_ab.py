"""The native records check (codec/record_check.c, `rc_check_section`) of this checkout against
another tree's, in one process, taking turns (thread CPU, ns per record).

    python -m bench.record_check_ab --baseline DIR [--pairs 60] [--calls 40]

The check runs on every filtered batch twice (the input before any filter, a guest's output
after it) on both paths. Both modules check the same workload-1 records sections (bench/workload.py,
the ~200-byte JSON values of bench_proxy), of 4 000 records (a chunked-harness Produce)
and 1 400 (a w2 batch): `--pairs` pairs, each module `--calls` calls a turn, the order
flipped every pair. `DIR` is prepared as `bench/baseline.py` prepares it (its native modules
built in place), so its module is the one its tree builds.
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import time
from pathlib import Path
from types import ModuleType

from bench.bench_produce_host import produce_batch
from bench.workload import json_records
from sluice.codec.records import HEADER_SIZE

_GLOB = "_record_check.cpython-*.so"


def _load(folder: Path) -> ModuleType:
    """The `_record_check` module built in `folder` (a tree's codec/)."""
    (path,) = sorted(folder.glob(_GLOB))
    spec = importlib.util.spec_from_file_location("_record_check", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def measure(mods: dict[str, ModuleType], records: int, pairs: int,
            calls: int) -> dict[str, list[float]]:
    """ns per record of each module's check, per turn."""
    section = memoryview(produce_batch(json_records(records)))[HEADER_SIZE:]
    got: dict[str, list[float]] = {name: [] for name in mods}
    for turn in range(pairs):
        order = list(mods.items())
        for name, mod in order if turn % 2 else reversed(order):
            buf = mod.ffi.from_buffer("uint8_t[]", section)
            where = mod.ffi.new("int64_t *")
            check = mod.lib.rc_check_section
            if check(buf, len(section), records, 1 << 20, where) != 0:
                raise SystemExit(f"{name}: the check refused a well-formed section")
            start = time.thread_time_ns()
            for _ in range(calls):
                check(buf, len(section), records, 1 << 20, where)
            got[name].append((time.thread_time_ns() - start) / calls / records)
    return got


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--baseline", type=Path, required=True, help="another Sluice source tree")
    ap.add_argument("--pairs", type=int, default=60)
    ap.add_argument("--calls", type=int, default=40)
    args = ap.parse_args(argv)
    from bench import baseline

    baseline.prepare(args.baseline)  # builds its native modules in place
    here = Path(__file__).resolve().parent.parent / "codec"
    mods = {"base": _load(args.baseline.resolve() / "codec"), "this": _load(here)}
    for records in (4000, 1400):
        got = measure(mods, records, args.pairs, args.calls)
        ratios = sorted(t / b for t, b in zip(got["this"], got["base"], strict=True))
        tenth = len(ratios) // 10
        print(f"{records} records: base {statistics.median(got['base']):.2f} ns/record, "
              f"this {statistics.median(got['this']):.2f}; this/base per pair median "
              f"{statistics.median(ratios):.3f} (p10..p90 {ratios[tenth]:.3f}.."
              f"{ratios[-1 - tenth]:.3f})")


if __name__ == "__main__":
    main()
