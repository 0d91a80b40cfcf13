"""What a second core buys the proxy, and how many cores a deployment needs.

    python -m bench.scaling --broker kafka                  # ≈ 15 min on 2 cores
    python -m bench.scaling --variants sluice --quick       # seconds: checks the harness

The clients (this process, its librdkafka threads) and the broker are pinned to `--cpus-rest`
(default: the lowest CPU), as `taskset` pins them. Every Sluice variant (`sluice`, pass-through;
`mask-produce`, `mask-fetch`: builtin:pii-mask on one direction; `encrypt`: builtin:encrypt,
whole values, both directions; configs from bench/rig.py) runs once per layout
(bench/scaling_plan.py), each its own `sluice serve` pinned, with every thread and worker, to
the layout's CPUs:

- `1cpu`: one CPU of its own, one worker, the default filter thread pool (2 threads);
- `2cpu`: that CPU and one more, one worker: its filter threads may run on the second;
- `2cpu-w2`: the same two CPUs, `--workers 2`;
- optional: `1cpu-t0` (`proxy.filter_threads: 0`, filters on the event loop), `2cpu-t4`.

A layout's CPUs are taken from those not in `--cpus-rest` first. On a 2-CPU machine the second
CPU of a 2-CPU layout is the clients' and broker's: the run then shows what letting the proxy
onto their core does, not what a free core would buy, and says so.

All of it starts once and stays up; every slice produces `--records` workload-1 (or 2) records
through each point and reads them back, in an order rotated by one each slice, with `direct`
(clients to the broker) in every slice. For every point and phase it reports the median
records/s, its per-slice ratio to direct and to the same variant's `1cpu` layout, the cores the
proxy kept busy (its CPU, every worker and thread, over the phase's wall time; the consume
phase's CPU includes the consumer's metadata request before its clock starts, a few ms) and its
CPU s/GB (its CPU over the payload carried in that phase, summed over slices). The sizing
table takes the `1cpu` layout's CPU s/GB per kind of traffic (bench/sizing.py): cores per GB/s.

Every process is started by this command and stopped by it (by PID, through the rig's context
managers), also on an error or Ctrl-C.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import psutil

from bench import bench_proxy, pairs, rig, scaling_plan, sizing, targets, workload
from bench.bench_proxy import WORKLOADS, Phases, Workload
from bench.rig import Point
from bench.scaling_plan import CpuPlan, Layout

VARIANTS = ("sluice", "mask-produce", "mask-fetch", "encrypt")
PHASES = ("produce", "consume")


def point_name(variant: str, layout: str) -> str:
    return f"{variant}/{layout}"


@dataclass
class Run:
    """Every point's phases, slice by slice (direct's too)."""

    workload: Workload
    records: int
    payload_bytes: int
    phases: dict[str, list[Phases]] = field(default_factory=dict)
    seconds: float = 0.0
    #: Share of the measured span each CPU was busy, every process on the machine counted.
    cpu_busy: list[float] = field(default_factory=list)

    def rates(self, name: str, phase: str) -> list[float | None]:
        out: list[float | None] = []
        for ph in self.phases.get(name, []):
            if phase == "produce":
                out.append(ph.records / ph.produce_seconds if ph.produce_seconds else None)
            else:
                out.append(ph.consume_records / ph.consume_seconds if ph.consume_seconds else None)
        return out

    def cpu(self, name: str, phase: str) -> tuple[float, float]:
        """The middle's CPU seconds and the wall seconds of `phase`, summed over slices."""
        cpu = wall = 0.0
        for ph in self.phases.get(name, []):
            if phase == "produce":
                cpu, wall = cpu + ph.middle_produce_cpu, wall + ph.produce_seconds
            else:
                cpu, wall = cpu + ph.middle_consume_cpu, wall + ph.consume_seconds
        return cpu, wall

    def cost(self, name: str, phase: str) -> float:
        """CPU s/GB of the middle in `phase`, over every slice."""
        cpu, _ = self.cpu(name, phase)
        return sizing.cpu_s_per_gb(cpu, self.payload_bytes * len(self.phases.get(name, [])))

    def busy(self, name: str, phase: str) -> float:
        return sizing.cores_busy(*self.cpu(name, phase))


def measure(w: Workload, points: dict[str, Point], slices: int, records: int,
            warmup: int) -> Run:
    values = workload.json_records(records)
    run = Run(w, records, sum(len(v) for v in values))
    names = list(points)
    if warmup:
        few = values[:warmup]
        for name in names:
            began = time.monotonic()
            bench_proxy.phases(points[name], w, few)
            print(f"  warm-up {name:22s} {len(few)} records, {time.monotonic() - began:.1f} s",
                  file=sys.stderr, flush=True)
    started = time.monotonic()
    machine0 = psutil.cpu_times(percpu=True)
    for s in range(slices):
        for name in pairs.rotation(names, s):
            ph = bench_proxy.phases(points[name], w, values)
            run.phases.setdefault(name, []).append(ph)
            p, c = ph.records / ph.produce_seconds, ph.consume_records / ph.consume_seconds
            print(
                f"  slice {s + 1}/{slices} {name:22s} produce {p:9.0f}"
                f" rec/s  consume {c:9.0f} rec/s  proxy CPU"
                f" {ph.middle_produce_cpu:.2f} / {ph.middle_consume_cpu:.2f} s",
                file=sys.stderr, flush=True,
            )
    run.seconds = time.monotonic() - started
    run.cpu_busy = [busy_share(a, b) for a, b in zip(machine0, psutil.cpu_times(percpu=True),
                                                      strict=True)]
    return run


def busy_share(before: Any, after: Any) -> float:
    """The share of the time between two psutil.cpu_times samples of one CPU it was not idle."""
    idle = (after.idle + getattr(after, "iowait", 0.0)) - (
        before.idle + getattr(before, "iowait", 0.0))
    # Linux counts guest time inside user time already.
    total = sum(v for k, v in after._asdict().items() if not k.startswith("guest")) - sum(
        v for k, v in before._asdict().items() if not k.startswith("guest"))
    return 1 - idle / total if total > 0 else math.nan


def stray_threads(pid: int, cpus: frozenset[int]) -> tuple[int, list[int]]:
    """How many threads the process `pid` and its children have, and those allowed onto a CPU
    outside `cpus` (a thread started after pinning inherits its creator's CPUs, so the filter
    pool's threads, started on first use, should have none)."""
    proc = psutil.Process(pid)
    seen, stray = 0, []
    for p in (proc, *proc.children(recursive=True)):
        with contextlib.suppress(psutil.NoSuchProcess):
            for t in p.threads():
                with contextlib.suppress(ProcessLookupError):
                    seen += 1
                    if not os.sched_getaffinity(t.id) <= cpus:
                        stray.append(t.id)
    return seen, stray


def _num(x: float, digits: int = 2) -> str:
    return "-" if math.isnan(x) else f"{x:.{digits}f}"


def report(run: Run, variants: Sequence[str], layouts: Sequence[Layout], cpus: CpuPlan) -> str:
    """The throughput table, what a second core bought, and the sizing table, in markdown."""
    mb = run.payload_bytes / run.records / 1e6
    lines = [
        "| point | proxy CPUs | produce rec/s (MB/s) | / direct | / 1cpu | cores busy "
        "| CPU s/GB | consume rec/s (MB/s) | / direct | / 1cpu | cores busy | CPU s/GB |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    names = ["direct"] + [point_name(v, lay.name) for v in variants for lay in layouts]
    for name in names:
        variant, _, layout = name.partition("/")
        where = "-" if not layout else CpuPlan.text(cpus.proxy[layout]) + (
            " (shared)" if cpus.shares(layout) else "")
        cells = [name, where]
        for phase in PHASES:
            rates = run.rates(name, phase)
            rate = pairs.median(rates)
            vs_direct = pairs.summarise(pairs.ratios(rates, run.rates("direct", phase)))
            basis = point_name(variant, scaling_plan.BASIS)
            vs_basis = (pairs.summarise(pairs.ratios(rates, run.rates(basis, phase)))
                        if layout and layout != scaling_plan.BASIS else pairs.EMPTY)
            middle = bool(layout)
            cells += [
                f"{_num(rate, 0)} ({_num(rate * mb, 0)})",
                vs_direct.ratio_text() if middle else "-",
                vs_basis.ratio_text(),
                _num(run.busy(name, phase)) if middle else "-",
                _num(run.cost(name, phase)) if middle else "-",
            ]
        lines.append("| " + " | ".join(cells) + " |")
    lines += [
        "",
        "Ratios: medians of per-slice ratios (range). Cores busy: the proxy's CPU (every worker "
        "and thread) over the phase's wall time. CPU s/GB: its CPU in the phase over the "
        "payload carried in it, every slice together.",
    ]
    costs = {kind: run.cost(point_name(v, scaling_plan.BASIS), phase)
             for kind, v, phase in sizing.KINDS if v in variants}
    if costs:
        lines += [
            "",
            f"Sizing from the {scaling_plan.BASIS} layout (the proxy alone on a CPU):",
            "",
            "| traffic through the proxy | CPU s/GB | cores per GB/s "
            f"| cores to give it for 1 GB/s (≤ {sizing.UTILISATION:.0%} busy) |",
            "|---|---:|---:|---:|",
        ]
        for kind, cost in costs.items():
            need = (sizing.cores_needed({kind: 1.0}, {kind: cost})
                    if not math.isnan(cost) else None)
            lines.append(
                f"| {kind} | {_num(cost)} | {_num(sizing.cores_per_gb_s(cost))} "
                f"| {need.cores if need else '-'} |"
            )
    return "\n".join(lines)


def machine_note(cpus: CpuPlan, layouts: Sequence[Layout], load: tuple[float, float]) -> str:
    allowed = os.sched_getaffinity(0) | cpus.rest | {c for s in cpus.proxy.values() for c in s}
    shared = [lay.name for lay in layouts if cpus.shares(lay.name)]
    text = (
        f"{os.cpu_count()} CPUs on the machine, {len(allowed)} used; clients and broker on CPU "
        f"{CpuPlan.text(cpus.rest)}; "
        + "; ".join(f"{lay.name}: {lay.describe()} on CPU {CpuPlan.text(cpus.proxy[lay.name])}"
                    for lay in layouts)
        + f". 1-minute load average {load[0]:.1f} at the start, {load[1]:.1f} at the end."
    )
    if shared:
        text += (
            f"\nNOTE: the proxy in {', '.join(shared)} shares CPU {CpuPlan.text(cpus.rest)} "
            "with the clients and the broker (too few CPUs for a free one): their rows show "
            "what letting the proxy onto that core does, not what a core of its own would buy. "
            "CPU s/GB is the figure that carries over to a larger machine."
        )
    return text


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--broker", choices=rig.BROKERS, default="tansu",
                    help="the broker: the bundled Tansu or Apache Kafka (one node)")
    ap.add_argument("--workload", type=int, choices=(1, 2), default=1,
                    help="1: no compression, one partition; 2: lz4, 6 partitions")
    ap.add_argument("--variants", default=",".join(VARIANTS),
                    help=f"comma-separated, among {', '.join(VARIANTS)}")
    ap.add_argument("--layouts", default=",".join(scaling_plan.DEFAULT_LAYOUTS),
                    help=f"comma-separated, among {', '.join(scaling_plan.LAYOUTS)} "
                    f"({scaling_plan.BASIS} is always run)")
    ap.add_argument("--cpus-rest", default="", metavar="CPUS",
                    help="CPUs of the clients and the broker (taskset's list; default the "
                    "lowest CPU this process may use)")
    ap.add_argument("--slices", type=int, default=5, help="interleaved slices")
    ap.add_argument("--records", type=int, default=500_000, help="records per point and slice")
    ap.add_argument("--warmup", type=int, default=100_000,
                    help="records of one unmeasured phase per point first (0: none)")
    ap.add_argument("--quick", action="store_true",
                    help="a tiny run that checks the harness (1 slice, 3 000 records)")
    args = ap.parse_args(argv)
    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    unknown = [v for v in variants if v not in VARIANTS]
    if unknown or not variants:
        ap.error(f"--variants {args.variants!r}: expected names among {', '.join(VARIANTS)}")
    variants = list(dict.fromkeys(variants))
    if args.slices < 1 or args.records < 1 or args.warmup < 0:
        ap.error("--slices and --records must be at least 1, --warmup at least 0")
    if not hasattr(os, "sched_setaffinity"):
        ap.error("pinning processes to CPUs needs Linux's sched_setaffinity (what taskset uses)")
    try:
        layouts = scaling_plan.parse_layouts(args.layouts)
        rest = targets.parse_cpus(args.cpus_rest) if args.cpus_rest else None
        cpus = scaling_plan.plan(os.sched_getaffinity(0), layouts, rest)
    except ValueError as e:  # PlanError too
        ap.error(str(e))
    if args.quick:
        args.slices, args.records, args.warmup = 1, 3000, 0
    w = WORKLOADS[args.workload]
    own = os.sched_getaffinity(0)
    # Before any thread or child exists: the client's librdkafka threads and the broker
    # inherit it; each `sluice serve` is then moved to its layout's CPUs.
    os.sched_setaffinity(0, cpus.rest)
    try:
        load0 = os.getloadavg()[0]
        with contextlib.ExitStack() as stack:
            main_broker = stack.enter_context(rig.broker(args.broker))
            points: dict[str, Point] = {
                "direct": Point(targets.Target(main_broker, None), main_broker)}
            for variant in variants:
                for layout in layouts:
                    point = rig.sluice_point(stack, variant, main_broker, layout.proxy_args(),
                                             layout.proxy_yaml())
                    assert point.target.pid is not None
                    targets.pin(point.target.pid, set(cpus.proxy[layout.name]))
                    points[point_name(variant, layout.name)] = point
            print(f"workload {args.workload}, {len(points)} points ...", file=sys.stderr,
                  flush=True)
            run = measure(w, points, args.slices, args.records, args.warmup)
            checked = 0
            for name, point in points.items():
                if point.target.pid is None:
                    continue
                seen, stray = stray_threads(point.target.pid, cpus.proxy[name.split("/")[1]])
                if stray:
                    raise RuntimeError(f"{name}: threads {stray} left their CPUs")
                checked += seen
        load1 = os.getloadavg()[0]
    finally:
        os.sched_setaffinity(0, own)
    print(w.describe(args.records, 0, 0))
    print(f"broker: {args.broker}; {args.slices} interleaved slices; {run.seconds:.0f} s")
    print(machine_note(cpus, layouts, (load0, load1)))
    print("CPUs busy over the measured slices, every process on the machine counted: "
          + ", ".join(f"CPU {i} {b:.0%}" for i, b in enumerate(run.cpu_busy))
          + " (a CPU busier than this run's own processes keep it is shared with other work)")
    print(f"After the run every proxy thread ({checked}, workers and filter threads included) "
          "was still pinned to its layout's CPUs.")
    print()
    print(report(run, variants, layouts, cpus))
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
