"""bench/cpu_clock.py: another process's CPU time read from its CPU clock, in nanoseconds, is
the total psutil reads from /proc/PID/stat in 10 ms ticks, counts threads that have exited
(which summing /proc/PID/task/*/schedstat does not), and resolves a few milliseconds."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Iterator

import psutil
import pytest

from bench import cpu_clock, targets

# A child that burns CPU when told: "main S" in its main thread, "thread S" in a thread that
# then exits; it answers "ok" once done.
_WORKER = """
import sys, threading, time
def burn(seconds):
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass
for line in sys.stdin:
    where, seconds = line.split()
    if where == "main":
        burn(float(seconds))
    else:
        t = threading.Thread(target=burn, args=(float(seconds),))
        t.start()
        t.join()
    print("ok", flush=True)
"""


@pytest.fixture
def worker() -> Iterator[subprocess.Popen[str]]:
    proc = subprocess.Popen([sys.executable, "-c", _WORKER], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    try:
        yield proc
    finally:
        proc.kill()
        proc.wait()


def _ask(proc: subprocess.Popen[str], where: str, seconds: float) -> None:
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write(f"{where} {seconds}\n")
    proc.stdin.flush()
    assert proc.stdout.readline() == "ok\n"


def test_the_clock_is_the_total_psutil_reads_in_ticks(worker: subprocess.Popen[str]) -> None:
    _ask(worker, "main", 0.25)
    # Read while the worker waits for its next line: nothing runs in between.
    clock = cpu_clock.process_cpu_ns(worker.pid)
    ticks = cpu_clock.tick_seconds(worker.pid)
    assert clock is not None and ticks is not None
    seconds = clock / 1e9
    assert seconds >= 0.25
    # /proc/PID/stat's user and system fields are each truncated to a 10 ms tick.
    assert ticks <= seconds + 1e-9 < ticks + 0.02
    both = cpu_clock.cpu_times(worker.pid)
    assert both.ticks == pytest.approx(ticks) and both.seconds >= seconds


def test_a_few_milliseconds_are_resolved(worker: subprocess.Popen[str]) -> None:
    _ask(worker, "main", 0.05)  # the interpreter's start-up settled
    before = cpu_clock.cpu_times(worker.pid)
    _ask(worker, "main", 0.003)
    spent = cpu_clock.cpu_times(worker.pid) - before
    # 3 ms burnt, plus reading the line and writing the answer: well under a tick more.
    assert 0.003 <= spent.seconds < 0.008
    # psutil sees whole ticks only: 0, 10 or 20 ms for the same 3 ms.
    assert round(spent.ticks * 100) == pytest.approx(spent.ticks * 100, abs=1e-6)


def test_threads_that_exited_are_counted(worker: subprocess.Popen[str]) -> None:
    _ask(worker, "main", 0.02)
    before = cpu_clock.cpu_times(worker.pid)
    sched0 = cpu_clock.schedstat_seconds(worker.pid)
    _ask(worker, "thread", 0.2)  # burnt in a thread that has exited by now
    spent = cpu_clock.cpu_times(worker.pid) - before
    assert spent.seconds >= 0.2
    assert spent.ticks > 0.18  # psutil has it too (within its ticks)
    # join() returns once Python is done with the thread, a moment before the kernel reaps it:
    # wait until only the main thread is listed (a loaded machine made that moment visible).
    deadline = time.monotonic() + 10
    while len(os.listdir(f"/proc/{worker.pid}/task")) > 1:
        assert time.monotonic() < deadline, "the burning thread never exited"
        time.sleep(0.01)
    # The live threads' schedstat files lost it: the reason it is not the source.
    assert cpu_clock.schedstat_seconds(worker.pid) - sched0 < 0.1


def _spawn_child(seconds: float) -> str:
    """Code that starts a child burning `seconds` of CPU, which then says so and sleeps."""
    return (
        "child = subprocess.Popen([sys.executable, '-c', "
        f"'import time\\nend = time.process_time() + {seconds}\\n"
        "while time.process_time() < end: pass\\nprint(1, flush=True)\\ntime.sleep(30)'],"
        " stdout=subprocess.PIPE)\n"
    )


@contextlib.contextmanager
def _parent_and_child(code: str) -> Iterator[tuple[int, int]]:
    """Runs `code` (which starts one child, then prints a line once what is measured is
    done) and yields the two PIDs while both still live; kills both afterwards."""
    proc = subprocess.Popen([sys.executable, "-c", "import os, subprocess, sys, time\n" + code
                             + "print('ready', flush=True)\ntime.sleep(30)\n"],
                            stdout=subprocess.PIPE)
    child = 0
    try:
        assert proc.stdout is not None and proc.stdout.readline() == b"ready\n"
        child = psutil.Process(proc.pid).children()[0].pid
        yield proc.pid, child
    finally:
        if child:
            with contextlib.suppress(psutil.NoSuchProcess):
                psutil.Process(child).kill()
        proc.kill()
        proc.wait()


def test_children_are_summed_and_a_gone_process_counts_nothing() -> None:
    code = (
        "end = time.process_time() + 0.1\n"
        "while time.process_time() < end: pass\n"
        + _spawn_child(0.15)
        + "child.stdout.readline()\n"
    )
    with _parent_and_child(code) as (pid, child):
        own, theirs = cpu_clock.process_cpu_ns(pid), cpu_clock.process_cpu_ns(child)
        assert own is not None and theirs is not None and theirs >= 0.15e9
        total = targets.cpu_seconds(pid)
        assert total >= (own + theirs) / 1e9 >= 0.25
        assert cpu_clock.cpu_times(pid).seconds >= total
    assert cpu_clock.process_cpu_ns(pid) is None
    assert cpu_clock.cpu_times(pid) == cpu_clock.NONE
    assert cpu_clock.cpu_times(None) == cpu_clock.NONE
    assert targets.cpu_seconds(None) == 0.0
    with pytest.raises(ValueError):
        cpu_clock.process_clock(0)


def test_run_queue_wait_counts_two_processes_sharing_one_core() -> None:
    # A parent and its child, both held to one core, each burning 0.3 s of CPU at once: while
    # one runs the other waits, so the two wait at least ~0.25 s between them.
    code = (
        "os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})\n"
        + _spawn_child(0.3)
        + "end = time.process_time() + 0.3\n"
        "while time.process_time() < end: pass\n"
        "child.stdout.readline()\n"
    )
    with _parent_and_child(code) as (pid, child):
        both = cpu_clock.runqueue_wait_seconds(pid)
        assert both >= 0.2
        assert both > cpu_clock.runqueue_wait_seconds(child) > 0.0
    assert cpu_clock.runqueue_wait_seconds(pid) == 0.0
    assert cpu_clock.runqueue_wait_seconds(None) == 0.0
