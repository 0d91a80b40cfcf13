"""The CPU time of another process in nanoseconds, for the benchmarks' CPU s/GB and CPU per
request of every process in the middle (HAProxy, Kroxylicious's JVM, `sluice serve` and its
workers) and of the brokers.

psutil reads a process's user and system time from /proc/PID/stat, in clock ticks of 10 ms,
each of the two truncated: a reading is up to 20 ms short, and so is the difference of two.
A workload-2 slice costs the proxy a few tens of ms, a handful of ticks. The kernel keeps
the same total in nanoseconds: the scheduler's run time of every thread of the process,
threads that have exited included (`sum_exec_runtime`; the kernel scales the two fields of
/proc/PID/stat so that they add up to it). Any process may read it through that process's
CPU clock (clock_getcpuclockid(3)), whose id Linux derives from the PID; Python's
`time.clock_gettime_ns` reads it.

Not used, and why: the sum of /proc/PID/task/*/schedstat gives the same nanoseconds for the
threads alive at the moment of reading, and loses every thread that has exited since (a
thread pool that shrinks, a JVM's compiler threads, the short-lived threads of a Python
program), so the difference of two sums can even be negative. `schedstat_seconds` keeps it for
the comparison (`python -m bench.cpu_clock PID`). taskstats (netlink) gives the same run time
per process, through a socket and a genetlink family look-up: nothing more for this use.

The same files' second field, the time a thread was runnable but waiting for a core, is what
`runqueue_wait_seconds` sums for the latency workload (over a window of long-lived threads,
where losing exited threads does not matter).

    python -m bench.cpu_clock PID [--seconds 60] [--every 5]

samples a running process and its children every `--every` seconds and prints the CPU
seconds by each source, cumulative, side by side.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from dataclasses import dataclass

import psutil

#: Linux's clock id of a process's CPU clock: ~pid << 3 | CPUCLOCK_SCHED (2), the process-wide
#: flavour (bit 2 clear), as glibc's clock_getcpuclockid builds it.
_CPUCLOCK_SCHED = 2


def process_clock(pid: int) -> int:
    """The clock id of process `pid`'s CPU clock (all its threads, exited ones included)."""
    if pid <= 0:
        raise ValueError(f"pid {pid}: expected a positive process id")
    return ((~pid) << 3) | _CPUCLOCK_SCHED


def process_cpu_ns(pid: int) -> int | None:
    """CPU nanoseconds process `pid` has run so far, user and system, every thread it ever
    had; None if there is no such process (any more)."""
    try:
        return time.clock_gettime_ns(process_clock(pid))
    except OSError:  # EINVAL: no such process
        return None


def tick_seconds(pid: int) -> float | None:
    """The same from /proc/PID/stat (psutil): user + system, in 10 ms clock ticks."""
    try:
        t = psutil.Process(pid).cpu_times()
    except psutil.NoSuchProcess:
        return None
    return t.user + t.system


def _schedstat_field(pid: int, index: int) -> float:
    """Field `index` of the schedstat files of the threads of `pid` alive now, summed, in
    seconds (0: time on a core, 1: time runnable but waiting for one)."""
    total = 0
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except FileNotFoundError:
        return 0.0
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                total += int(f.read().split()[index])
        except (FileNotFoundError, ProcessLookupError, IndexError, ValueError):
            continue  # the thread ended while we looked
    return total / 1e9


def schedstat_seconds(pid: int) -> float:
    """The run time of the threads of `pid` alive now, summed from their schedstat files
    (threads that exited are not counted: see the module's docstring)."""
    return _schedstat_field(pid, 0)


def runqueue_wait_seconds(pid: int | None) -> float:
    """Seconds the threads of `pid` and its children alive now have spent runnable but
    waiting for a core (schedstat's second field), summed; 0.0 for None. Over a window of
    long-lived threads (an event loop, a thread pool) the difference of two readings is the
    time work was ready and the machine had no core for it: the part of a latency tail that
    is the scheduler's, not the program's."""
    if pid is None:
        return 0.0
    return sum(_schedstat_field(p, 1) for p in _family(pid))


@dataclass(frozen=True)
class CpuTimes:
    """CPU seconds of a process and its children, read at one moment from both sources."""

    seconds: float  # the process CPU clocks (nanoseconds)
    ticks: float  # /proc/PID/stat through psutil (10 ms ticks)

    def __sub__(self, other: CpuTimes) -> CpuTimes:
        return CpuTimes(self.seconds - other.seconds, self.ticks - other.ticks)

    def __add__(self, other: CpuTimes) -> CpuTimes:
        return CpuTimes(self.seconds + other.seconds, self.ticks + other.ticks)


NONE = CpuTimes(0.0, 0.0)


def _family(pid: int) -> list[int]:
    """`pid` and its children, recursively (a `sluice serve --workers N` forks N workers)."""
    try:
        proc = psutil.Process(pid)
        return [pid, *(c.pid for c in proc.children(recursive=True))]
    except psutil.NoSuchProcess:
        return []


def cpu_times(pid: int | None) -> CpuTimes:
    """CPU seconds of `pid` and all its children so far, by both sources; zero for None. A
    process that ends between the listing and its reading counts as zero in both."""
    if pid is None:
        return NONE
    ns, ticks = 0, 0.0
    for p in _family(pid):
        clock = process_cpu_ns(p)
        tick = tick_seconds(p)
        if clock is None or tick is None:
            continue
        ns += clock
        ticks += tick
    return CpuTimes(ns / 1e9, ticks)


def cpu_seconds(pid: int | None) -> float:
    """CPU seconds of `pid` and all its children so far, from their CPU clocks (0.0: None)."""
    if pid is None:
        return 0.0
    return sum(process_cpu_ns(p) or 0 for p in _family(pid)) / 1e9


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("pid", type=int, help="the process to watch (its children too)")
    ap.add_argument("--seconds", type=float, default=60.0, help="how long to watch")
    ap.add_argument("--every", type=float, default=5.0, help="seconds between samples")
    args = ap.parse_args(argv)
    if not psutil.pid_exists(args.pid) or args.pid <= 0:
        ap.error(f"no process {args.pid}")
    if args.every <= 0 or args.seconds <= 0:
        ap.error("--seconds and --every must be above 0")
    start = cpu_times(args.pid)
    sched0 = sum(schedstat_seconds(p) for p in _family(args.pid))
    print("elapsed s | CPU clock s | psutil ticks s | ticks - clock ms | schedstat sum s")
    began = time.monotonic()
    while time.monotonic() - began < args.seconds:
        time.sleep(args.every)
        if not psutil.pid_exists(args.pid):
            print(f"process {args.pid} ended", file=sys.stderr)
            break
        now = cpu_times(args.pid) - start
        sched = sum(schedstat_seconds(p) for p in _family(args.pid)) - sched0
        print(f"{time.monotonic() - began:9.1f} | {now.seconds:11.4f} | {now.ticks:14.2f} "
              f"| {1000 * (now.ticks - now.seconds):16.1f} | {sched:15.4f}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
