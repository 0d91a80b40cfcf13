"""The proxy's CPU per produced record on the produce side alone, this checkout against
another tree, interleaved: what a masked (or passed) workload-1 Produce costs the proxy per
record, in the chunked harness's shape, with nothing consumed through it.

    python -m bench.produce_cpu --baseline DIR [--variant mask-produce] [--pairs 20]

One broker (`--broker kafka` by default) and two `sluice serve` in front of it with the
variant's config (bench/rig.py), this checkout's and the tree at DIR's (bench/baseline.py).
Each side has one long-lived producer (bench/chunk_client.py, as bench.chunked's: librdkafka,
linger.ms=5, ~4 000 records a Produce request) on a topic of its own, which flushes `--chunk`
records (default 100 000) at a time: three unmeasured chunks each, then `--pairs` rounds of
A B B A (B A A B in the next). Each chunk's proxy CPU (its CPU clock, bench/cpu_clock.py) is
divided by its records. Prints both sides' median µs per record and the median of per-chunk
ratios (this / baseline, the chunks paired in order), with the load average. bench.chunked
--shapes gives the same figure beside the client's and the broker's, from fewer chunks and
with consumers in between; this one only produces, so a few percent show through the noise
of the shared machine.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
from pathlib import Path

from bench import baseline, cpu_clock, rig, workload
from bench.chunk_client import ChunkClient

#: Unmeasured chunks per side before the first pair (memos, the filter's job kind, the JIT).
WARM_CHUNKS = 3


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--baseline", type=Path, required=True)
    ap.add_argument("--broker", choices=rig.BROKERS, default="kafka")
    ap.add_argument("--variant", default="mask-produce", help="a Sluice variant of bench/rig.py")
    ap.add_argument("--chunk", type=int, default=100_000)
    ap.add_argument("--pairs", type=int, default=20)
    args = ap.parse_args(argv)
    source = baseline.prepare(args.baseline)
    names = [args.variant, args.variant + rig.BASE]
    per: dict[str, list[float]] = {n: [] for n in names}
    with rig.rig(names, [], "", args.broker, source) as points, contextlib.ExitStack() as stack:
        clients = {n: stack.enter_context(
            ChunkClient(points[n].target.bootstrap, args.chunk, "none", False, False))
            for n in names}
        topics = {}
        for name in names:
            topics[name] = workload.make_topic(points[name].target.bootstrap, partitions=1)
            clients[name].prepare(topics[name])
            for _ in range(WARM_CHUNKS):
                clients[name].produce(topics[name], args.chunk)
        for pair in range(args.pairs):
            order = names if pair % 2 == 0 else names[::-1]
            for name in [*order, *order[::-1]]:
                pid = points[name].target.pid
                before = cpu_clock.cpu_seconds(pid)
                got = clients[name].produce(topics[name], args.chunk)
                per[name].append((cpu_clock.cpu_seconds(pid) - before) / got.records * 1e6)
            print(f"pair {pair + 1}/{args.pairs}: µs per record this "
                  f"{statistics.median(per[names[0]][-2:]):.3f} base "
                  f"{statistics.median(per[names[1]][-2:]):.3f}; "
                  f"load {os.getloadavg()[0]:.1f}", flush=True)
    ratios = [a / b for a, b in zip(per[names[0]], per[names[1]], strict=True)]
    print(f"{args.variant}: proxy CPU µs per produced record, this "
          f"{statistics.median(per[names[0]]):.3f} against "
          f"{statistics.median(per[names[1]]):.3f}; this / baseline per chunk "
          f"{statistics.median(ratios):.3f} ({min(ratios):.2f}..{max(ratios):.2f}), "
          f"{len(ratios)} chunks each; load {' '.join(f'{x:.1f}' for x in os.getloadavg())}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
