"""What Sluice costs next to the broker and a plain TCP relay, measured in interleaved slices.

    python -m bench.bench_proxy --workload 1,2,3        # the whole benchmark (one run)
    python -m bench.bench_proxy --workload 1 --quick    # a few seconds: checks the harness

Workloads (issue 12, "The benchmark must show the truth"):

1. ~200-byte JSON values, every one holding an e-mail address and a card number, no
   compression, one partition, acks=all, linger.ms=5, confluent-kafka; produced, then read
   back with the batch consume API;
2. the same with lz4 and 6 partitions;
3. small requests: one record per Produce request (linger 0, acks=all) at a fixed rate
   (`--rate`, default 2 000/s), latency p50/p99, measured side by side with a producer
   straight to the broker in the same window (bench.latency).

Variants: `direct` (clients to the broker), `aa` (direct again, measured at another moment of
the same slice: the A/A row, the noise), `relay` (HAProxy in TCP mode; its broker advertises
the relay's port so every connection crosses it), `kroxylicious` (Kroxylicious, a peer proxy
in Java, no filters; bench/kroxylicious.py), `sluice` (`sluice serve`, no filters),
`mask-produce` and `mask-fetch` (builtin:pii-mask on produce / on fetch for the bench topics),
`encrypt` (builtin:encrypt, whole values, on produce and fetch, decrypting for the benchmark's
unauthenticated clients; a local keyring in a temporary directory), `kroxylicious-encrypt`
(Kroxylicious's RecordEncryption filter on every topic: whole values, AES-256-GCM, one KEK in
its in-memory KMS).
Only when named in `--variants`: `encrypt-fields` (builtin:encrypt in fields mode, sealing
the "card" member), `sluice-own` (`sluice serve` in front of a broker of its own, as relay
is) and `aa-own` (a direct client of a broker of its own, no middle: the control for those
two).

`--broker tansu` (the default: the bundled Tansu, memory storage) or `--broker kafka` (Apache
Kafka 4.4 from its jars, one KRaft node, `sluice/kafka_broker.py`, with Kafka's own default
JVM settings: G1, 1 GiB heap). The relay variant gets a broker of its own that advertises the
relay's port; every other variant shares one broker.

Before the first slice of a throughput workload every variant runs one unmeasured produce and
consume of `--warmup` records, so that the JVMs in the middle (Kroxylicious) and the broker
have compiled their hot paths before anything is timed; Sluice finishes its own warm-up
before it is used (bench/targets.py).

Every process stays up for the whole run. A run is `--slices` slices; in each slice every
variant produces once to a fresh topic of its own and reads it back with a fresh consumer, in
an order rotated by one each slice (as one read per slice always ran); then `--reads` - 1 more
rounds (default 3 reads in all) in which a fresh consumer of every variant reads its topic
again, each round in the slice's order rotated by one more, so a variant's reads are spread
over the slice as direct's are. A variant's consume speed in a slice is its records over the
seconds of all its reads. A variant's ratio in a slice is its speed over direct's speed in the
same slice; the table gives the median of those per-slice ratios with their range. Latency
differences are taken inside one window (the variant's probe and a direct probe run at once),
and likewise summarised over slices.

Why several interleaved reads (docs/PERFORMANCE.md, "What the consume figure measures"): in
workload 2 one Fetch brings a read's whole backlog, and the rest of its ~0.5 s is the client
taking 500 000 records out of librdkafka, the same work for every variant; a single read
measured that one client stretch at one moment of the slice, and varied with it.

CPU s/GB: user+system CPU of the process in the middle (its CPU clock, in nanoseconds, and
its children's, so `--workers N` counts every worker: bench/cpu_clock.py) during produce and
consume, over the payload bytes it carried both ways, over all slices (every slice carries the
same bytes, so this is the mean of the per-slice figures; a slice's consume CPU is the mean of
its reads'). The same figure from psutil's 10 ms
clock ticks (/proc/PID/stat), read at the same moments, is printed under the table for
comparison: it is the same total, truncated to ticks at each reading. Under it too, each
side's share: the middle's CPU s per GB carried one way in the produce and in a (mean) read,
the mean of slices (also on each slice's line). CPU µs/request
(workload 3): its CPU in the latency window per record (one Produce request and response
each), median over slices; run-queue wait µs/request (workload 3): the time its threads were
runnable but had no core in the window (their schedstat files, bench/cpu_clock.py), per
request, median over slices: the scheduler's share of the added latency, which CPU per
request does not show. Filter jobs inline / pool (workload 3): every Sluice variant
serves its `/metrics` on a free 127.0.0.1 port (unless `--proxy-yaml` has its own `metrics:`),
scraped before and after each window; the table sums `sluice_filter_jobs_total` over the
windows and gives the pool's share (bench/filter_jobs.py).

Client CPU µs/rec: the CPU of this process (the confluent-kafka client, its librdkafka threads
included) per record over each whole produce or consume call, the client's set-up and close
included (median of slices): a client that costs more per record hides more of a proxy's cost
on a machine whose cores they share (bench.chunked's long-lived producer costs less).

`--baseline DIR` runs each Sluice variant a second time from another source tree (an earlier
commit), as `VARIANT@base` in the same slices, and prints the ratios between the two: before
and after figures from one interleaved run (bench/baseline.py).

`--workers N` and `--proxy-arg ARG` (repeatable) are passed to every `sluice serve`;
`--proxy-yaml TEXT` is appended to every Sluice variant's config file (for thread-pool and
similar settings), so scaling can be measured with the same command.
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from bench import baseline, cpu_clock, filter_jobs, latency, pairs, targets, workload
from bench.rig import BASE, Point, add_rig_arguments, rig, variant_names, with_baseline

# Per-slice ratios printed under the throughput table: (numerator, denominator).
COMPARISONS = [
    ("sluice", "relay"),
    ("sluice", "kroxylicious"),
    ("kroxylicious", "relay"),
    ("encrypt", "kroxylicious-encrypt"),
]

@dataclass(frozen=True)
class Workload:
    number: int
    compression: str
    partitions: int
    latency: bool = False

    def describe(self, records: int, rate: int, seconds: float, reads: int = 1) -> str:
        if self.latency:
            return (
                f"workload 3: one ~200-byte record per Produce request, {rate} requests/s, "
                f"acks=all, linger 0, no compression, 1 partition, {seconds:g} s windows"
            )
        return (
            f"workload {self.number}: {records} ~200-byte JSON records per slice (e-mail and card "
            f"number in each), compression={self.compression}, {self.partitions} partition(s), "
            "acks=all, linger.ms=5, confluent-kafka; read back "
            f"{reads} time(s) per slice, each by a fresh consumer with consume(num_messages=10000)"
        )


WORKLOADS = {
    1: Workload(1, "none", 1),
    2: Workload(2, "lz4", 6),
    3: Workload(3, "none", 1, latency=True),
}


@dataclass
class Throughput:
    """Per-slice measurements of one variant (None: not measured in that slice)."""

    produce: list[float | None] = field(default_factory=list)  # records/s
    consume: list[float | None] = field(default_factory=list)  # records/s
    cpu_per_gb: list[float | None] = field(default_factory=list)
    #: the same from psutil's 10 ms ticks, read at the same moments (for comparison)
    cpu_per_gb_ticks: list[float | None] = field(default_factory=list)
    client_produce: list[float | None] = field(default_factory=list)  # client CPU µs/record
    client_consume: list[float | None] = field(default_factory=list)
    first: list[float | None] = field(default_factory=list)  # s to a read's first record
    #: the middle's CPU s per GB of payload carried one way, in the produce and in a (mean)
    #: read: which side a variant's CPU s/GB comes from
    cpu_produce: list[float | None] = field(default_factory=list)
    cpu_read: list[float | None] = field(default_factory=list)

    def cpu_per_gb_overall(self, ticks: bool = False) -> float:
        """CPU seconds over GB carried, over all slices (`ticks`: psutil's figure)."""
        present = [x for x in (self.cpu_per_gb_ticks if ticks else self.cpu_per_gb)
                   if x is not None]
        return sum(present) / len(present) if present else math.nan


@dataclass
class Latency:
    """Per-slice latency windows of one variant, in ms, with the direct probe beside it."""

    p50: list[float] = field(default_factory=list)
    p99: list[float] = field(default_factory=list)
    ref_p50: list[float] = field(default_factory=list)
    ref_p99: list[float] = field(default_factory=list)
    late: list[float] = field(default_factory=list)  # share of sends > 1 ms late
    cpu_per_request: list[float | None] = field(default_factory=list)  # µs
    cpu_per_request_ticks: list[float | None] = field(default_factory=list)  # psutil's
    #: µs the middle process's threads waited, runnable, for a core (per request of the window)
    wait_per_request: list[float | None] = field(default_factory=list)
    #: Filter jobs run inline / in the pool in each window (None: the proxy does not count
    #: them, or is not Sluice).
    jobs: list[filter_jobs.Jobs | None] = field(default_factory=list)

    def jobs_total(self) -> filter_jobs.Jobs | None:
        """The filter jobs of every slice summed; None unless every slice counted them."""
        if not self.jobs or any(j is None for j in self.jobs):
            return None
        return sum((j for j in self.jobs if j is not None), filter_jobs.Jobs(0, 0))


@dataclass
class Result:
    workload: Workload
    records: int
    payload_bytes: int
    throughput: dict[str, Throughput] = field(default_factory=dict)
    latency: dict[str, Latency] = field(default_factory=dict)
    seconds: float = 0.0


@dataclass(frozen=True)
class Phases:
    """One produce + consume phase through a point: wall seconds of each, the CPU seconds the
    process in the middle spent in each (0.0 without one; its CPU clocks, and psutil's ticks
    at the same moments), and this process's own (the client's) CPU seconds over each whole
    call."""

    records: int
    produce_seconds: float
    consume_records: int
    consume_seconds: float
    middle_produce_cpu: float
    middle_consume_cpu: float
    client_produce_cpu: float
    client_consume_cpu: float
    middle_produce_ticks: float = 0.0
    middle_consume_ticks: float = 0.0


def phases(point: Point, w: Workload, values: list[bytes]) -> Phases:
    """Produce `values` through `point` to a fresh topic, read them back, drop the topic."""
    bootstrap = point.target.bootstrap
    topic = workload.make_topic(bootstrap, partitions=w.partitions)
    try:
        cpu0 = cpu_clock.cpu_times(point.target.pid)
        client0 = time.process_time()
        p = workload.produce(bootstrap, topic, values, w.compression)
        client1 = time.process_time()
        cpu1 = cpu_clock.cpu_times(point.target.pid)
        c = workload.consume(bootstrap, topic, len(values))
        client2 = time.process_time()
        cpu2 = cpu_clock.cpu_times(point.target.pid)
    finally:
        workload.delete_topic(point.broker, topic)
    produce, consume = cpu1 - cpu0, cpu2 - cpu1
    return Phases(len(values), p, c.records, c.seconds, produce.seconds, consume.seconds,
                  client1 - client0, client2 - client1, produce.ticks, consume.ticks)


@dataclass(frozen=True)
class Slice:
    """One variant's produce and consume reads in one slice, as the tables use them."""

    produce: float  # records/s
    consume: float  # records/s over all its reads
    first: float  # seconds from a read's assignment to its first record, median of reads
    cpu_per_gb: float | None  # the middle's CPU s/GB (None: direct)
    cpu_per_gb_ticks: float | None  # the same from psutil's ticks
    client_produce: float  # the client's own CPU µs per record producing (set-up, close too)
    client_consume: float  # and consuming
    reads: tuple[float, ...] = ()  # seconds of each read, in the order they ran
    #: the middle's CPU s per GB one way in the produce and in the mean read (None: direct)
    cpu_produce: float | None = None
    cpu_read: float | None = None


@dataclass(frozen=True)
class Call:
    """One timed client call through a point: records, wall seconds, the CPU of the process in
    the middle (NONE without one) and of this process (the client, librdkafka's threads
    included) over the whole call, and for a read the seconds to its first record."""

    records: int
    seconds: float
    middle: cpu_clock.CpuTimes
    client: float
    first: float = 0.0


def _produce(point: Point, w: Workload, topic: str, values: list[bytes]) -> Call:
    cpu0, client0 = cpu_clock.cpu_times(point.target.pid), time.process_time()
    seconds = workload.produce(point.target.bootstrap, topic, values, w.compression)
    client, cpu = time.process_time() - client0, cpu_clock.cpu_times(point.target.pid) - cpu0
    return Call(len(values), seconds, cpu, client)


def _consume(point: Point, topic: str, records: int) -> Call:
    cpu0, client0 = cpu_clock.cpu_times(point.target.pid), time.process_time()
    c = workload.consume(point.target.bootstrap, topic, records)
    client, cpu = time.process_time() - client0, cpu_clock.cpu_times(point.target.pid) - cpu0
    return Call(c.records, c.seconds, cpu, client, c.first)


def read_rounds(names: Sequence[str], slice_index: int, reads: int) -> list[list[str]]:
    """The consume rounds of one slice: every round reads every variant once, round r in the
    slice's order (pairs.rotation) rotated by r more, so no variant always reads at the same
    moment of the slice or after the same neighbour. Round 0 is the slice's own order: there
    each read follows its variant's produce (throughput_slice)."""
    order = pairs.rotation(names, slice_index)
    return [pairs.rotation(order, r) for r in range(reads)]


def combine(produced: Call, reads: Sequence[Call], payload: int, middle: bool) -> Slice:
    """One variant's slice from its produce and its reads: the consume speed over all reads;
    the middle's CPU per GB over one produce and one (mean) read, both ways, as one read per
    slice measured it; the client's CPU per record of each."""
    if not reads:
        raise ValueError("a slice needs at least one read")
    gb = 2 * payload / 1e9
    n = len(reads)
    cpu = produced.middle + sum((r.middle for r in reads), cpu_clock.NONE)
    per_gb = (produced.middle.seconds + (cpu.seconds - produced.middle.seconds) / n) / gb
    per_gb_ticks = (produced.middle.ticks + (cpu.ticks - produced.middle.ticks) / n) / gb
    read_records = sum(r.records for r in reads)
    return Slice(
        produced.records / produced.seconds,
        read_records / sum(r.seconds for r in reads),
        statistics.median(r.first for r in reads),
        per_gb if middle else None,
        per_gb_ticks if middle else None,
        1e6 * produced.client / produced.records,
        1e6 * sum(r.client for r in reads) / read_records,
        tuple(r.seconds for r in reads),
        produced.middle.seconds / (gb / 2) if middle else None,
        (cpu.seconds - produced.middle.seconds) / n / (gb / 2) if middle else None,
    )


def throughput_slice(
    points: dict[str, Point],
    w: Workload,
    values: list[bytes],
    slice_index: int = 0,
    reads: int = 1,
) -> dict[str, Slice]:
    """One slice of every variant in `points`, in the rounds of read_rounds: in the first, each
    variant produces `values` to a fresh topic of its own and a fresh consumer reads it back
    at once, so each produce follows a read as when a slice read once (with every produce
    first and back to back, the A/A produce ratio spread more: docs/PERFORMANCE.md); in the
    others, fresh consumers read every topic again. The topics are dropped at the end."""
    names = list(points)
    payload = sum(len(v) for v in values)
    topics: dict[str, str] = {}
    produced: dict[str, Call] = {}
    consumed: dict[str, list[Call]] = {name: [] for name in names}
    try:
        for r, order in enumerate(read_rounds(names, slice_index, reads)):
            for name in order:
                point = points[name]
                if not r:
                    topics[name] = workload.make_topic(point.target.bootstrap,
                                                       partitions=w.partitions)
                    produced[name] = _produce(point, w, topics[name], values)
                consumed[name].append(_consume(point, topics[name], len(values)))
    finally:
        for name, topic in topics.items():
            workload.delete_topic(points[name].broker, topic)
    return {
        name: combine(produced[name], consumed[name], payload,
                      points[name].target.pid is not None)
        for name in names
    }


@dataclass(frozen=True)
class MiddleCost:
    """What one latency window cost the process in the middle, per request: CPU by both
    sources, and the time its threads were runnable but had no core (schedstat)."""

    cpu: cpu_clock.CpuTimes
    wait_us: float


def latency_slice(
    point: Point, via_topic: str, reference: tuple[str, str], rate: int, seconds: float
) -> tuple[latency.Paired, MiddleCost | None, filter_jobs.Jobs | None]:
    """One paired window: the variant's probe and a probe straight to `reference` (a broker
    address and topic) at once; with what the window cost the process in the middle per
    request (None: direct) and, for Sluice, the filter jobs it ran inline and in its pool in
    the window (its `/metrics` scraped before and after, outside the CPU measurement)."""
    jobs0 = filter_jobs.scrape(point.metrics) if point.metrics else None
    pid = point.target.pid
    cpu0, wait0 = cpu_clock.cpu_times(pid), cpu_clock.runqueue_wait_seconds(pid)
    pair = latency.paired(reference, (point.target.bootstrap, via_topic), rate, seconds)
    cpu = cpu_clock.cpu_times(pid) - cpu0
    wait = cpu_clock.runqueue_wait_seconds(pid) - wait0
    jobs1 = filter_jobs.scrape(point.metrics) if point.metrics else None
    cost = None
    if pid is not None:
        n = len(pair.via.latency)
        cost = MiddleCost(cpu_clock.CpuTimes(1e6 * cpu.seconds / n, 1e6 * cpu.ticks / n),
                          1e6 * wait / n)
    jobs = jobs1 - jobs0 if jobs0 is not None and jobs1 is not None else None
    return pair, cost, jobs


def measure(
    w: Workload,
    points: dict[str, Point],
    slices: int,
    records: int,
    rate: int,
    seconds: float,
    warmup: int = 0,
    reads: int = 1,
) -> Result:
    values = workload.json_records(records)
    payload = sum(len(v) for v in values)
    result = Result(w, records, payload)
    names = list(points)
    if warmup and not w.latency:
        # Unmeasured: lets every JVM on the path (Kroxylicious, a Kafka broker) compile its hot
        # paths before the first timed slice.
        few = values[:warmup]
        for name in names:
            began = time.monotonic()
            throughput_slice({name: points[name]}, w, few)
            print(
                f"  warm-up {name:20s} {len(few)} records, {time.monotonic() - began:.1f} s",
                file=sys.stderr,
                flush=True,
            )
    started = time.monotonic()
    latency_topics: dict[str, tuple[str, tuple[str, str]]] = {}
    if w.latency:
        # The direct row of the latency workload already pairs two direct probes: it is the
        # A/A row there, so `aa` is not run twice.
        names = [n for n in names if n != "aa"]
        # The probe beside every variant goes to the main broker (the relay's own broker
        # advertises the relay's port, so a probe bootstrapping there would cross the relay).
        main_broker = points["direct"].broker
        for name in names:
            via = workload.make_topic(points[name].target.bootstrap, partitions=1)
            ref = (main_broker, workload.make_topic(main_broker, partitions=1))
            latency_topics[name] = (via, ref)
        time.sleep(0.5)
    for s in range(slices):
        if not w.latency:
            _throughput_slice(result, points, values, s, slices, reads)
            continue
        for name in pairs.rotation(names, s):
            point = points[name]
            line = f"  slice {s + 1}/{slices} {name:20s}"
            via_topic, reference = latency_topics[name]
            pair, cost, jobs = latency_slice(point, via_topic, reference, rate, seconds)
            per_request = None if cost is None else cost.cpu
            row = result.latency.setdefault(name, Latency())
            row.p50.append(1000 * pair.via.quantile(0.5))
            row.p99.append(1000 * pair.via.quantile(0.99))
            row.ref_p50.append(1000 * pair.direct.quantile(0.5))
            row.ref_p99.append(1000 * pair.direct.quantile(0.99))
            row.late.append(max(pair.via.late(), pair.direct.late()))
            row.cpu_per_request.append(None if per_request is None else per_request.seconds)
            row.cpu_per_request_ticks.append(
                None if per_request is None else per_request.ticks)
            row.wait_per_request.append(None if cost is None else cost.wait_us)
            row.jobs.append(jobs)
            line += (
                f" p50 {row.p50[-1]:6.2f} p99 {row.p99[-1]:7.2f} ms | direct p50 "
                f"{row.ref_p50[-1]:6.2f} p99 {row.ref_p99[-1]:7.2f} ms | late "
                f"{100 * row.late[-1]:.1f} %"
            )
            if cost is not None:
                line += (f" | {cost.cpu.seconds:.0f} µs CPU/request, {cost.wait_us:.0f} µs "
                         f"waiting for a core")
            if jobs is not None:
                line += f" | filter jobs inline / pool {jobs.text()}"
            print(line, file=sys.stderr, flush=True)
    result.seconds = time.monotonic() - started
    return result


def _throughput_slice(
    result: Result, points: dict[str, Point], values: list[bytes], s: int, slices: int,
    reads: int,
) -> None:
    """Slice `s` of a throughput workload, added to `result` and printed."""
    measured = throughput_slice(points, result.workload, values, s, reads)
    for name in pairs.rotation(list(points), s):
        sl = measured[name]
        trow = result.throughput.setdefault(name, Throughput())
        trow.produce.append(sl.produce)
        trow.consume.append(sl.consume)
        trow.first.append(sl.first)
        trow.cpu_per_gb.append(sl.cpu_per_gb)
        trow.cpu_per_gb_ticks.append(sl.cpu_per_gb_ticks)
        trow.client_produce.append(sl.client_produce)
        trow.client_consume.append(sl.client_consume)
        trow.cpu_produce.append(sl.cpu_produce)
        trow.cpu_read.append(sl.cpu_read)
        line = (f"  slice {s + 1}/{slices} {name:20s} produce {sl.produce:9.0f} rec/s  "
                f"consume {sl.consume:9.0f} rec/s (first record {1000 * sl.first:4.0f} ms, "
                f"reads {' '.join(f'{x:.2f}' for x in sl.reads)} s)")
        if sl.cpu_per_gb is not None and sl.cpu_per_gb_ticks is not None:
            line += f"  {sl.cpu_per_gb:5.3f} CPU s/GB (ticks {sl.cpu_per_gb_ticks:5.2f})"
        if sl.cpu_produce is not None and sl.cpu_read is not None:
            line += f", produce / read {sl.cpu_produce:5.3f} / {sl.cpu_read:5.3f}"
        print(line, file=sys.stderr, flush=True)


def report(result: Result) -> str:
    """The result as a markdown table (plus the lines that say what the table means)."""
    if result.workload.latency:
        return _latency_report(result)
    return _throughput_report(result)


def _throughput_report(result: Result) -> str:
    rows = result.throughput
    base = rows.get("direct")
    lines = [
        "| variant | produce rec/s | produce ratio (range) | consume rec/s "
        "| consume ratio (range) | CPU s/GB | client CPU µs/rec p / c |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for name, row in rows.items():
        p_ratio = pairs.summarise(pairs.ratios(row.produce, base.produce)) if base else pairs.EMPTY
        c_ratio = pairs.summarise(pairs.ratios(row.consume, base.consume)) if base else pairs.EMPTY
        cpu = row.cpu_per_gb_overall()
        lines.append(
            f"| {name} | {pairs.median(row.produce):.0f} | {p_ratio.ratio_text()} "
            f"| {pairs.median(row.consume):.0f} | {c_ratio.ratio_text()} "
            f"| {'-' if math.isnan(cpu) else f'{cpu:.3f}'} "
            f"| {pairs.median(row.client_produce):.2f} / {pairs.median(row.client_consume):.2f} |"
        )
    lines.append("")
    both = [(n, r.cpu_per_gb_overall(), r.cpu_per_gb_overall(ticks=True))
            for n, r in rows.items()]
    both = [(n, a, b) for n, a, b in both if not math.isnan(a)]
    if both:
        lines.append(
            "CPU s/GB from the CPU clocks (ns) / from psutil's 10 ms ticks, read at the same "
            "moments: " + ", ".join(f"{n} {a:.3f} / {b:.3f}" for n, a, b in both) + "."
        )
    split = [(n, _mean(r.cpu_produce), _mean(r.cpu_read)) for n, r in rows.items()]
    split = [(n, a, b) for n, a, b in split if not math.isnan(a)]
    if split:
        lines.append(
            "CPU s per GB carried one way, in the produce / in a read (means of slices): "
            + ", ".join(f"{n} {a:.3f} / {b:.3f}" for n, a, b in split) + "."
        )
    firsts = [(n, pairs.median(r.first)) for n, r in rows.items()]
    lines.append(
        "First record after (ms from a consumer's assignment, median of slices): "
        + ", ".join(f"{n} {1000 * f:.0f}" for n, f in firsts if not math.isnan(f))
        + ". The path shows there and wherever later Fetches keep the client waiting; the "
        "rest of a read is the client taking records out of librdkafka."
    )
    if base:
        mb = result.payload_bytes / result.records / 1e6
        p, c = pairs.median(base.produce), pairs.median(base.consume)
        lines.append(
            f"Direct speed (median of slices): produce {p:.0f} records/s ({p * mb:.0f} MB/s), "
            f"consume {c:.0f} records/s ({c * mb:.0f} MB/s)."
        )
        if c < p:
            lines.append(
                "WARNING: direct consume is slower than direct produce: the consuming client, "
                "not the path, may be what the consume column measures."
            )
    against_base = [(n, n + BASE) for n in rows if n + BASE in rows]
    for top, bottom in [*COMPARISONS, *against_base]:
        if top not in rows or bottom not in rows:
            continue
        a, b = rows[top], rows[bottom]
        pr = pairs.summarise(pairs.ratios(a.produce, b.produce))
        cr = pairs.summarise(pairs.ratios(a.consume, b.consume))
        cpu_a, cpu_b = a.cpu_per_gb_overall(), b.cpu_per_gb_overall()
        cpu_text = f"; CPU s/GB {cpu_a / cpu_b:.2f}x" if cpu_b > 0 else ""
        lines.append(
            f"{top} / {bottom} (median of per-slice ratios): produce {pr.ratio_text()}, "
            f"consume {cr.ratio_text()}{cpu_text}."
        )
    return "\n".join(lines)


def _mean(values: Sequence[float | None]) -> float:
    present = [x for x in values if x is not None]
    return sum(present) / len(present) if present else math.nan


def _latency_report(result: Result) -> str:
    lines = [
        "| variant | p50 ms | p99 ms | direct p50 ms | direct p99 ms | added p50 ms (range) "
        "| added p99 ms (range) | CPU µs/request | run-queue wait µs/request | late sends % "
        "| filter jobs inline / pool (pool share) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, row in result.latency.items():
        a50 = pairs.summarise(pairs.differences(row.p50, row.ref_p50))
        a99 = pairs.summarise(pairs.differences(row.p99, row.ref_p99))
        cpu = pairs.median(row.cpu_per_request)
        wait = pairs.median(row.wait_per_request)
        jobs = row.jobs_total()
        lines.append(
            f"| {name} | {pairs.median(row.p50):.2f} | {pairs.median(row.p99):.2f} "
            f"| {pairs.median(row.ref_p50):.2f} | {pairs.median(row.ref_p99):.2f} "
            f"| {a50.added_text()} | {a99.added_text()} "
            f"| {'-' if math.isnan(cpu) else f'{cpu:.0f}'} "
            f"| {'-' if math.isnan(wait) else f'{wait:.0f}'} "
            f"| {100 * max(row.late):.1f} | {'-' if jobs is None else jobs.text()} |"
        )
    lines.append("")
    both = [(n, pairs.median(r.cpu_per_request), pairs.median(r.cpu_per_request_ticks))
            for n, r in result.latency.items()]
    both = [(n, a, b) for n, a, b in both if not math.isnan(a)]
    if both:
        lines.append(
            "CPU µs/request from the CPU clocks (ns) / from psutil's 10 ms ticks, read at the "
            "same moments: " + ", ".join(f"{n} {a:.1f} / {b:.1f}" for n, a, b in both) + "."
        )
    lines.append(
        "Run-queue wait: the time the middle process's threads were runnable but had no core "
        "(their schedstat files), per request of the window: the scheduler's share of its "
        "latency tail."
    )
    lines.append(
        "Filter jobs: sluice_filter_jobs_total from each Sluice variant's /metrics, the "
        "difference over each window, summed over slices (-: not counted, e.g. no thread pool)."
    )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--workload", default="1,2,3", help="comma-separated: 1, 2, 3")
    add_rig_arguments(ap)
    ap.add_argument(
        "--baseline",
        default="",
        metavar="DIR",
        help="another Sluice source tree (a git worktree of an earlier commit): each Sluice "
        "variant also runs from it as VARIANT@base, interleaved, and is compared with it "
        "(bench/baseline.py)",
    )
    ap.add_argument("--slices", type=int, default=7, help="interleaved slices per workload")
    ap.add_argument(
        "--records", type=int, default=500_000, help="records per variant and slice (1 and 2)"
    )
    ap.add_argument(
        "--reads", type=int, default=3,
        help="consume reads per variant and slice, interleaved across variants (1 and 2)"
    )
    ap.add_argument("--rate", type=int, default=2000, help="requests/s of each probe (3)")
    ap.add_argument("--seconds", type=float, default=5.0, help="latency window per slice (3)")
    ap.add_argument("--workers", type=int, default=1, help="`sluice serve --workers N`")
    ap.add_argument(
        "--cpus-proxy",
        default="",
        metavar="CPUS",
        help="pin every process in the middle (Sluice and its workers, HAProxy, Kroxylicious) "
        "to these CPUs (taskset's list: 1, 0,2, 2-3)",
    )
    ap.add_argument(
        "--cpus-rest",
        default="",
        metavar="CPUS",
        help="pin the benchmark's clients and the brokers to these CPUs",
    )
    ap.add_argument(
        "--warmup",
        type=int,
        default=500_000,
        help="records of one unmeasured phase per variant before workloads 1 and 2 (0: none); "
        "a JVM in the middle compiles its hot paths over the first few hundred thousand",
    )
    ap.add_argument(
        "--quick",
        action="store_true",
        help="tiny run that checks the harness (2 slices, 3 000 records read twice, 1 s windows at "
        "200/s)",
    )
    args = ap.parse_args(argv)
    try:
        numbers = [int(x) for x in args.workload.split(",") if x.strip()]
    except ValueError:
        ap.error(f"--workload {args.workload!r}: expected numbers among 1, 2, 3")
    if not numbers or any(n not in WORKLOADS for n in numbers):
        ap.error(f"--workload {args.workload!r}: expected numbers among 1, 2, 3")
    names = variant_names(ap, args.variants)
    if args.workers < 1:
        ap.error("--workers must be at least 1")
    if args.warmup < 0:
        ap.error("--warmup must be 0 or more")
    if args.reads < 1:
        ap.error("--reads must be at least 1")
    try:
        cpus_proxy = targets.parse_cpus(args.cpus_proxy) if args.cpus_proxy else None
        cpus_rest = targets.parse_cpus(args.cpus_rest) if args.cpus_rest else None
    except ValueError as e:
        ap.error(f"--cpus-proxy/--cpus-rest {e}")
    if cpus_rest is not None:
        # Before any thread or child exists: the clients' threads, the latency probes and the
        # brokers inherit it.
        os.sched_setaffinity(0, cpus_rest)
    if args.quick:
        args.slices, args.records, args.rate, args.seconds = 2, 3000, 200, 1.0
        args.reads = min(args.reads, 2)
        args.warmup = min(args.warmup, 1000)
    source = None
    if args.baseline:
        try:
            source = baseline.prepare(Path(args.baseline))
        except (ValueError, OSError, subprocess.CalledProcessError) as e:
            ap.error(f"--baseline {args.baseline}: {e}")
        names = with_baseline(names)
    proxy_args = [*(["--workers", str(args.workers)] if args.workers > 1 else []), *args.proxy_arg]
    with rig(names, proxy_args, args.proxy_yaml, args.broker, source) as points:
        if cpus_proxy is not None:
            for point in points.values():
                if point.target.pid is not None:
                    targets.pin(point.target.pid, cpus_proxy)
        for n in numbers:
            w = WORKLOADS[n]
            print(f"workload {n} ...", file=sys.stderr, flush=True)
            result = measure(
                w, points, args.slices, args.records, args.rate, args.seconds, args.warmup,
                args.reads,
            )
            print(f"{w.describe(args.records, args.rate, args.seconds, args.reads)}")
            print(
                f"broker: {args.broker}; "
                f"{args.slices} interleaved slices, medians of per-slice pairs; "
                f"sluice serve {' '.join(proxy_args) or '(defaults)'}; "
                f"CPUs: middle {args.cpus_proxy or 'any'}, clients and brokers "
                f"{args.cpus_rest or 'any'}; "
                f"{result.seconds:.0f} s"
            )
            print()
            print(report(result))
            print()
            sys.stdout.flush()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
