"""The proxy's CPU per short-lived client, this checkout against another tree, interleaved:
what a client's connections and start-up exchanges cost, apart from the bytes it moves.

    python -m bench.client_cpu --baseline DIR [--records 1500] [--pairs 12] [--broker kafka]

Every slice of `bench_proxy` produces with a fresh producer and reads with fresh consumers,
each opening its connections and asking ApiVersions, Metadata (and a consumer FindCoordinator)
anew, so a client's fixed cost is part of its CPU s/GB. One broker and two `sluice serve` in
front of it, this checkout's and the tree at DIR's (bench/baseline.py), no filters. Each pair
runs, through each proxy in turn (A B, then B A), a producer of `--records` workload-2 records
(six partitions, lz4: one or two Produce requests) to a fresh topic and a consumer reading
them back, and takes the proxy's CPU over each (bench/cpu_clock.py). Prints each side's
CPU per producer and per consumer, and the medians of per-pair ratios (this / baseline), with
the load average.
"""

from __future__ import annotations

import argparse
import os
import statistics
from pathlib import Path

from bench import baseline, cpu_clock, rig, workload

PHASES = ("produce", "consume")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--baseline", type=Path, required=True)
    ap.add_argument("--broker", choices=rig.BROKERS, default="kafka")
    ap.add_argument("--records", type=int, default=1500)
    ap.add_argument("--pairs", type=int, default=12)
    args = ap.parse_args(argv)
    source = baseline.prepare(args.baseline)
    names = ["sluice", "sluice" + rig.BASE]
    values = workload.json_records(args.records)
    cpu: dict[tuple[str, str], list[float]] = {(n, p): [] for n in names for p in PHASES}
    with rig.rig(names, [], "", args.broker, source) as points:
        for name in names:  # warm-up, unmeasured: each proxy's first clients
            point = points[name]
            topic = workload.make_topic(point.broker, 6)
            workload.produce(point.target.bootstrap, topic, values)
            workload.consume(point.target.bootstrap, topic, args.records)
        for pair in range(args.pairs):
            for name in names if pair % 2 == 0 else names[::-1]:
                point = points[name]
                topic = workload.make_topic(point.broker, 6)
                for phase in PHASES:
                    before = cpu_clock.cpu_seconds(point.target.pid)
                    if phase == "produce":
                        workload.produce(point.target.bootstrap, topic, values)
                    else:
                        workload.consume(point.target.bootstrap, topic, args.records)
                    cpu[name, phase].append(cpu_clock.cpu_seconds(point.target.pid) - before)
            print(f"pair {pair + 1}/{args.pairs}: ms per producer / consumer: this "
                  f"{1e3 * cpu[names[0], 'produce'][-1]:.2f} / "
                  f"{1e3 * cpu[names[0], 'consume'][-1]:.2f}, base "
                  f"{1e3 * cpu[names[1], 'produce'][-1]:.2f} / "
                  f"{1e3 * cpu[names[1], 'consume'][-1]:.2f}; load {os.getloadavg()[0]:.1f}",
                  flush=True)
    for phase in PHASES:
        this, base = cpu[names[0], phase], cpu[names[1], phase]
        ratios = [a / b for a, b in zip(this, base, strict=True) if b > 0]
        print(f"{phase}: {1e3 * statistics.median(this):.2f} ms of CPU per client against "
              f"{1e3 * statistics.median(base):.2f} (medians of {len(this)}); this / baseline "
              f"{statistics.median(ratios):.3f} ({min(ratios):.2f}..{max(ratios):.2f})")
    print(f"load average {os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
