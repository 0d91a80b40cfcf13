"""The proxy's CPU per GB on the consume side alone, this checkout against another tree,
interleaved: what a Fetch response costs the proxy per byte, with nothing produced through it.

    python -m bench.consume_cpu --baseline DIR [--workload 1|2] [--records 1000000] [--pairs 6]
                                [--variant sluice|mask-fetch|encrypt]

One broker (`--broker kafka` by default) and two `sluice serve` in front of it, this checkout's
and the tree at DIR's (bench/baseline.py). A topic is filled once, directly (workload 1: one
partition, ~200-byte JSON values, uncompressed, ~1 MB Fetch responses at bench.chunked's
consumer settings; workload 2: six partitions, lz4). Then each pair reads the whole topic
through each proxy in turn (A B, then B A in the next pair) with a fresh batch-API consumer
(bench/workload.py `consume`), and the proxy's CPU over the read, from its CPU clock
(bench/cpu_clock.py), is divided by the bytes of the records' values read. Prints each
side's CPU s/GB and records/s per pair and the median of per-pair ratios (this / baseline),
with the load average.
`--variant` names the Sluice configuration both proxies run (bench/rig.py `SLUICE_CONFIGS`;
`sluice`, no filters, by default; `mask-fetch` for builtin:pii-mask on fetch).
Throughput on the shared machine moves with everything else running; the CPU per GB of the
proxy's own process much less.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from pathlib import Path

from bench import baseline, cpu_clock, rig, workload


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--baseline", type=Path, required=True)
    ap.add_argument("--broker", choices=rig.BROKERS, default="kafka")
    ap.add_argument("--workload", type=int, choices=(1, 2), default=1)
    ap.add_argument("--records", type=int, default=1_000_000)
    ap.add_argument("--pairs", type=int, default=6)
    ap.add_argument("--variant", choices=sorted(rig.SLUICE_CONFIGS), default="sluice")
    args = ap.parse_args(argv)
    source = baseline.prepare(args.baseline)
    partitions, compression = (1, "none") if args.workload == 1 else (6, "lz4")
    names = [args.variant, args.variant + rig.BASE]
    with rig.rig(names, [], "", args.broker, source) as points:
        bootstrap = points[args.variant].broker
        topic = workload.make_topic(bootstrap, partitions)
        values = workload.json_records(args.records)
        workload.produce(bootstrap, topic, values, compression)
        wire = sum(len(v) for v in values)  # per GB of record values, as the other benches
        for name in names:  # warm-up: each proxy reads the topic once, unmeasured
            workload.consume(points[name].target.bootstrap, topic, args.records)
        cpu: dict[str, list[float]] = {n: [] for n in names}
        rate: dict[str, list[float]] = {n: [] for n in names}
        for pair in range(args.pairs):
            order = names if pair % 2 == 0 else names[::-1]
            for name in order:
                target = points[name].target
                before = cpu_clock.cpu_seconds(target.pid)
                got = workload.consume(target.bootstrap, topic, args.records)
                spent = cpu_clock.cpu_seconds(target.pid) - before
                cpu[name].append(spent / wire * 1e9)
                rate[name].append(got.records / got.seconds)
            print(f"pair {pair + 1}/{args.pairs}: CPU s/GB this {cpu[names[0]][-1]:.3f} "
                  f"base {cpu[names[1]][-1]:.3f}; records/s this {rate[names[0]][-1]:.0f} "
                  f"base {rate[names[1]][-1]:.0f}; load {os.getloadavg()[0]:.1f}", flush=True)
    ratios = [a / b for a, b in zip(cpu[names[0]], cpu[names[1]], strict=True)]
    speed = [a / b for a, b in zip(rate[names[0]], rate[names[1]], strict=True)]
    print(f"workload {args.workload}: {args.records} records, {wire / 1e6:.0f} MB of values "
          f"a read; this / baseline CPU s/GB {statistics.median(ratios):.3f} "
          f"({min(ratios):.3f}..{max(ratios):.3f}), median {statistics.median(cpu[names[0]]):.3f} "
          f"against {statistics.median(cpu[names[1]]):.3f}; records/s "
          f"{statistics.median(speed):.3f} ({min(speed):.3f}..{max(speed):.3f}); "
          f"load {' '.join(f'{x:.1f}' for x in os.getloadavg())}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
