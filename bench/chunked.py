"""The proxy benchmark's second harness: long-lived producers, flushed chunks, alternating pairs.

    python -m bench.chunked --variants direct,aa,sluice,mask-produce,mask-fetch --pairs 6
    python -m bench.chunked --quick                  # seconds: checks the harness

bench.bench_proxy builds a fresh producer per slice and times a consumer from its assignment.
This harness measures the same rig (bench/rig.py: the broker of `--broker tansu|kafka`, HAProxy,
Kroxylicious, `sluice serve` with the same filter configs) the way an application runs, and the
way the outside measurements of issue 29 were taken:

- every variant, and direct, has one client process for the whole run
  (bench/chunk_client.py): its producer is created once and flushes `--chunk` records at a
  time (default 100 000), so its connections through the proxy stay open between chunks;
- a pair compares direct with one variant on fresh topics of their own. Produce chunks
  alternate A B B A (B A A B in the next pair), so a drift of the machine's speed during the
  pair hits both sides alike; then each side's topic (twice --chunk records) is read by a fresh
  batch-API consumer, again A B B A, timed from its first record to the chunk's last
  (connection set-up and the first fetch's wait are left out). A pair's ratio is the
  variant's records/s over direct's in that pair;
- `--pairs` rounds (default 20): every round holds one pair per variant, in an order rotated
  by one each round. `aa` pairs direct with a second direct client: the A/A row, the noise;
- the table gives the median of per-pair ratios with their spread (min..max), the middle
  process's CPU s/GB (its CPU clock in ns, bench/cpu_clock.py, over the bytes it carried both
  ways), and the client's own CPU:
  µs per record of its whole process (Python and librdkafka threads) and the share of the
  timed span its Python thread was on a CPU ("busy"). A busy share near 100 % means the client,
  not the path, set the pace: the run then says so under the table.

Read the A/A row first. A pair cancels a drift of the machine, not a difference between the
two processes themselves, and these live for the whole run: on the loaded 2-core machine two
identical direct clients differed for a whole run (the A/A produce median of 6-8 pairs ranged
0.74-1.25 over seven runs, most pairs of one run on the same side of 1). A difference smaller
than that needs more runs, not more pairs; bench.bench_proxy, with a new client per slice,
spreads the same effect over its slices instead.

Workload: `--workload 1` (default; ~200-byte JSON values, no compression, one partition,
acks=all, linger.ms=5) or `2` (lz4, 6 partitions), as in bench.bench_proxy. Before the first
pair every side runs an unmeasured `--warmup` (records, default 500 000) so JVMs in the path
have compiled their hot paths.

Is direct capped by the client? No, not on the 2-core machine this was written on (Tansu, a
loaded machine): the direct producer's Python thread was on a CPU 37-44 % of a chunk's time
and its process spent 0.8 µs of CPU per record (librdkafka's threads included), about half a
core at 600 000 records/s; the direct consumer's thread 23-28 %, 0.6 µs per record. The
broker and the rest of the machine set the pace. The run prints both figures for every row,
and a warning when direct's Python thread is busy more than 90 % of the time.
"""

from __future__ import annotations

import argparse
import contextlib
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from bench import baseline, pairs, targets, workload
from bench.bench_proxy import WORKLOADS, Workload
from bench.chunk_client import ChunkClient, Timed
from bench.rig import Point, add_rig_arguments, rig, variant_names, with_baseline

#: The Python thread of a client busier than this for a median chunk set the pace itself.
CLIENT_BOUND = 0.9


@dataclass
class Row:
    """Per-pair measurements of one variant (direct's own row: every pair's direct side)."""

    produce: list[float] = field(default_factory=list)  # records/s
    consume: list[float] = field(default_factory=list)
    produce_ratio: list[float] = field(default_factory=list)
    consume_ratio: list[float] = field(default_factory=list)
    produce_client: list[Timed] = field(default_factory=list)  # every chunk
    consume_client: list[Timed] = field(default_factory=list)
    middle_cpu: float = 0.0  # seconds, over the whole run
    middle_bytes: int = 0
    # CPU seconds per produce chunk (in produce_client's order) of the process in the middle
    # and of the broker behind it: with the client's own, what one record costs in all
    produce_middle: list[float] = field(default_factory=list)
    produce_broker: list[float] = field(default_factory=list)

    def cpu_per_gb(self) -> float | None:
        return self.middle_cpu / (self.middle_bytes / 1e9) if self.middle_bytes else None


@dataclass
class Run:
    workload: Workload
    chunk: int
    record_bytes: float
    rows: dict[str, Row] = field(default_factory=dict)
    pairs: int = 0
    seconds: float = 0.0


def _order(first: str, second: str, round_index: int) -> list[str]:
    """A B B A in even rounds, B A A B in odd ones."""
    a, b = (first, second) if round_index % 2 == 0 else (second, first)
    return [a, b, b, a]


class Harness:
    """The rig's points and one long-lived client per side."""

    def __init__(self, w: Workload, points: dict[str, Point], clients: dict[str, ChunkClient],
                 chunk: int) -> None:
        self.w = w
        self.points = points
        self.clients = clients
        self.chunk = chunk
        # The broker's process, for its CPU per record (None: not found, counted as 0).
        self.brokers = {name: targets.listener_pid(p.broker) for name, p in points.items()}

    def _topics(self, names: Sequence[str]) -> dict[str, str]:
        topics = {}
        for name in names:
            topics[name] = workload.make_topic(
                self.points[name].target.bootstrap, partitions=self.w.partitions
            )
            self.clients[name].prepare(topics[name])
        return topics

    def _drop(self, topics: dict[str, str]) -> None:
        for name, topic in topics.items():
            workload.delete_topic(self.points[name].broker, topic)

    def _timed(self, name: str, run: Run | None, op: str, topic: str, records: int) -> Timed:
        """One chunk of `op` by `name`'s client, with the middle process's CPU around it."""
        pid = self.points[name].target.pid
        broker = self.brokers.get(name)
        cpu0, broker0 = targets.cpu_seconds(pid), targets.cpu_seconds(broker)
        client = self.clients[name]
        t = client.produce(topic, records) if op == "produce" else client.consume(topic, records)
        middle = targets.cpu_seconds(pid) - cpu0
        if run is not None:
            row = run.rows.setdefault(name, Row())
            if op == "produce":
                row.produce_middle.append(middle)
                row.produce_broker.append(targets.cpu_seconds(broker) - broker0)
            if pid is not None:
                row.middle_cpu += middle
                row.middle_bytes += int(records * run.record_bytes)
        return t

    def warm(self, name: str, records: int) -> None:
        """Unmeasured produce and consume of `records` through `name`."""
        topics = self._topics([name])
        try:
            left = records
            while left > 0:
                n = min(left, self.chunk)
                self._timed(name, None, "produce", topics[name], n)
                left -= n
            self._timed(name, None, "consume", topics[name], records + 1)
        finally:
            self._drop(topics)

    def pair(self, run: Run, name: str, round_index: int) -> tuple[float, float]:
        """Direct against `name` on fresh topics; their (produce, consume) ratio."""
        order = _order("direct", name, round_index)
        # The aa side is a second direct client: the pair still needs two topics and processes.
        topics = self._topics(["direct", name])
        try:
            produced: dict[str, list[Timed]] = {"direct": [], name: []}
            for side in order:
                produced[side].append(
                    self._timed(side, run, "produce", topics[side], self.chunk)
                )
            consumed: dict[str, list[Timed]] = {"direct": [], name: []}
            held = 2 * self.chunk + 1  # two chunks and the record prepare() delivered
            for side in order:
                consumed[side].append(self._timed(side, run, "consume", topics[side], held))
        finally:
            self._drop(topics)
        rates = {}
        for side in ("direct", name):
            row = run.rows.setdefault(side, Row())
            p = _rate(produced[side])
            c = _rate(consumed[side])
            row.produce.append(p)
            row.consume.append(c)
            row.produce_client.extend(produced[side])
            row.consume_client.extend(consumed[side])
            rates[side] = (p, c)
        ratio = (rates[name][0] / rates["direct"][0], rates[name][1] / rates["direct"][1])
        row = run.rows[name]
        row.produce_ratio.append(ratio[0])
        row.consume_ratio.append(ratio[1])
        return ratio


def _rate(chunks: Sequence[Timed]) -> float:
    seconds = sum(t.seconds for t in chunks)
    return sum(t.records for t in chunks) / seconds if seconds > 0 else 0.0


def measure(
    w: Workload,
    points: dict[str, Point],
    chunk: int,
    rounds: int,
    warmup: int,
    shapes: bool = False,
    reports: bool = False,
) -> Run:
    values = workload.json_records(chunk)
    run = Run(w, chunk, sum(len(v) for v in values) / len(values))
    names = list(points)
    others = [n for n in names if n != "direct"]
    with contextlib.ExitStack() as stack:
        clients = {
            name: stack.enter_context(
                ChunkClient(
                    points[name].target.bootstrap, chunk, w.compression, shapes, reports
                )
            )
            for name in names
        }
        harness = Harness(w, points, clients, chunk)
        run.rows["direct"] = Row()
        for name in others:
            run.rows[name] = Row()
        if warmup:
            for name in names:
                began = time.monotonic()
                harness.warm(name, warmup)
                print(f"  warm-up {name:20s} {warmup} records, {time.monotonic() - began:.1f} s",
                      file=sys.stderr, flush=True)
        started = time.monotonic()
        for r in range(rounds):
            for name in pairs.rotation(others, r):
                p, c = harness.pair(run, name, r)
                d = run.rows["direct"]
                print(
                    f"  pair {r + 1}/{rounds} {name:20s} produce {p:5.2f} consume {c:5.2f} "
                    f"of direct ({d.produce[-1]:9.0f} / {d.consume[-1]:9.0f} rec/s)",
                    file=sys.stderr,
                    flush=True,
                )
        run.pairs = rounds
        run.seconds = time.monotonic() - started
    return run


def _client_text(chunks: Sequence[Timed]) -> tuple[str, str]:
    """(client CPU µs per record, Python thread busy %) of a side's chunks, medians."""
    if not chunks:
        return "-", "-"
    cpu = pairs.median([t.cpu_us_per_record for t in chunks])
    busy = pairs.median([t.busy for t in chunks])
    return f"{cpu:.2f}", f"{100 * busy:.0f}"


def report(run: Run) -> str:
    """The run as a markdown table, and what it says about the client."""
    lines = [
        "| variant | produce rec/s | produce ratio (range) | consume rec/s "
        "| consume ratio (range) | middle CPU s/GB | client CPU µs/rec p / c "
        "| client busy % p / c |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, row in run.rows.items():
        direct = name == "direct"
        pr = "-" if direct else pairs.summarise(row.produce_ratio).ratio_text()
        cr = "-" if direct else pairs.summarise(row.consume_ratio).ratio_text()
        per_gb = row.cpu_per_gb()
        pc, pb = _client_text(row.produce_client)
        cc, cb = _client_text(row.consume_client)
        lines.append(
            f"| {name} | {pairs.median(row.produce):.0f} | {pr} "
            f"| {pairs.median(row.consume):.0f} | {cr} "
            f"| {'-' if per_gb is None else f'{per_gb:.2f}'} | {pc} / {cc} | {pb} / {cb} |"
        )
    lines.append("")
    d = run.rows.get("direct")
    if d and d.produce:
        mb = run.record_bytes / 1e6
        p, c = pairs.median(d.produce), pairs.median(d.consume)
        lines.append(
            f"Direct (median of its {len(d.produce)} pair sides): produce {p:.0f} records/s "
            f"({p * mb:.0f} MB/s), consume {c:.0f} records/s ({c * mb:.0f} MB/s)."
        )
        for what, chunks in (("produce", d.produce_client), ("consume", d.consume_client)):
            busy = pairs.median([t.busy for t in chunks])
            if busy > CLIENT_BOUND:
                lines.append(
                    f"WARNING: direct's {what} client kept its Python thread busy "
                    f"{100 * busy:.0f} % of the time: the client may cap direct's {what} rate."
                )
    if any(t.requests for row in run.rows.values() for t in row.produce_client):
        lines += ["", *_shapes_report(run)]
    return "\n".join(lines)


def _shapes_report(run: Run) -> list[str]:
    """Records per request and round trips (librdkafka's statistics); where a produce chunk's
    time went (the loop handing records to librdkafka, then flush()'s tail), medians over
    chunks; and the CPU one produced record cost the client, the broker and the middle, over
    the run."""
    lines = [
        "| variant | records / Produce | Produce round trip ms | produce loop ms "
        "| flush tail ms | records / Fetch | Fetch round trip ms "
        "| produce CPU µs/rec client / broker / middle | all three | direct's all three / this |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    direct_total = None
    for name, row in run.rows.items():
        p, c = row.produce_client, row.consume_client
        # Sums over the run, not medians per chunk: one chunk's CPU swings with the load.
        records = sum(t.records for t in p)
        per_rec = [
            1e6 * sum(cpus) / records if records else 0.0
            for cpus in ([t.cpu for t in p], row.produce_broker, row.produce_middle)
        ]
        total = sum(per_rec)
        if name == "direct":
            direct_total = total
        cells = [
            f"{pairs.median([t.records_per_request for t in p]):.0f}",
            f"{pairs.median([t.rtt_us / 1000 for t in p]):.2f}",
            f"{pairs.median([1000 * (t.seconds - t.tail) for t in p]):.1f}",
            f"{pairs.median([1000 * t.tail for t in p]):.1f}",
            f"{pairs.median([t.records_per_request for t in c]):.0f}",
            f"{pairs.median([t.rtt_us / 1000 for t in c]):.2f}",
            " / ".join(f"{x:.2f}" for x in per_rec),
            f"{total:.2f}",
            f"{direct_total / total:.2f}" if direct_total and total else "-",
        ]
        lines.append(f"| {name} | {' | '.join(cells)} |")
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--workload", type=int, choices=(1, 2), default=1)
    add_rig_arguments(ap)
    ap.add_argument("--pairs", type=int, default=20, help="rounds: one pair per variant each")
    ap.add_argument("--chunk", type=int, default=100_000, help="records a producer flushes")
    ap.add_argument(
        "--warmup", type=int, default=500_000, help="unmeasured records per side first (0: none)"
    )
    ap.add_argument(
        "--shapes",
        action="store_true",
        help="also count the clients' requests and round trips (librdkafka statistics): "
        "records per Produce and per Fetch, to see whether a path changes the traffic's shape",
    )
    ap.add_argument(
        "--delivery-reports",
        action="store_true",
        help="a Python delivery callback per produced record (as bench.bench_proxy's producer "
        "has): more client CPU per record",
    )
    ap.add_argument(
        "--quick", action="store_true", help="a seconds-long run (2 pairs of 2 000-record chunks)"
    )
    ap.add_argument(
        "--baseline",
        default="",
        metavar="DIR",
        help="another Sluice source tree (bench/baseline.py): each Sluice variant also runs "
        "from it, as VARIANT@base, in the same rounds",
    )
    args = ap.parse_args(argv)
    names = variant_names(ap, args.variants)
    if args.quick:
        args.pairs, args.chunk, args.warmup = 2, 2000, min(args.warmup, 2000)
    if args.pairs < 1 or args.chunk < 1 or args.warmup < 0:
        ap.error("--pairs and --chunk must be at least 1, --warmup at least 0")
    w = WORKLOADS[args.workload]
    source = None
    if args.baseline:
        try:
            source = baseline.prepare(Path(args.baseline))
        except (ValueError, OSError, subprocess.CalledProcessError) as e:
            ap.error(f"--baseline {args.baseline}: {e}")
        names = with_baseline(names)
    with rig(names, args.proxy_arg, args.proxy_yaml, args.broker, source) as points:
        run = measure(w, points, args.chunk, args.pairs, args.warmup, args.shapes,
                      args.delivery_reports)
    print(
        f"workload {w.number}-like: ~200-byte JSON records, compression={w.compression}, "
        f"{w.partitions} partition(s), acks=all, linger.ms=5, confluent-kafka; one long-lived "
        f"producer per side flushing {args.chunk}-record chunks, fresh batch-API consumers per "
        f"{2 * args.chunk}-record topic timed from their first record"
    )
    print(
        f"broker: {args.broker}; {run.pairs} rounds of A B B A pairs (direct vs variant), "
        f"medians of per-pair ratios (min..max); sluice serve "
        f"{' '.join(args.proxy_arg) or '(defaults)'}; {run.seconds:.0f} s"
    )
    print()
    print(report(run))
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
