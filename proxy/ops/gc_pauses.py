"""Python's cyclic garbage collector in a long-running proxy: the start-up heap frozen out of
its reach, and every collection timed.

After start-up the proxy holds ~66 000 GC-tracked objects (kio's schema classes, the filter
runtime, structlog, ...). A full (generation 2) collection walks all of them on the event-loop
thread: 14-25 ms on the benchmark machine, during which no byte is relayed. Nearly all of them
live as long as the process, so `freeze_startup_heap` moves them to the permanent generation,
which no collection visits; a full collection then took < 0.1 ms. Young collections are not
affected (they only walk new objects).

`GcPauses` times every collection through ``gc.callbacks`` (two clock reads per collection);
the proxy logs the summary when it stops, so a benchmark can see whether the collector paused
the loop and for how long.

`thread_gc_time` counts the CPU time collections took on each thread, so that a filter job
is not charged for a collection that happened to start inside it (net/job_placement.py: a
young collection took ~1 ms on the loaded benchmark machine, twice the budget of a job that
runs inline, and moved a fast filter to the thread pool).
"""

from __future__ import annotations

import gc
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any


def freeze_startup_heap() -> int:
    """Collect what start-up left behind, then freeze every surviving object so later
    collections skip it. Returns the number of frozen objects."""
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()


@dataclass(slots=True)
class GenerationPauses:
    count: int = 0
    total: float = 0.0
    longest: float = 0.0


class _GcCallback:
    """A `gc.callbacks` entry that can be installed and removed (idempotently)."""

    def _callback(self, phase: str, info: dict[str, int]) -> None:
        raise NotImplementedError

    def install(self) -> None:
        if self._callback not in gc.callbacks:
            gc.callbacks.append(self._callback)

    def uninstall(self) -> None:
        if self._callback in gc.callbacks:
            gc.callbacks.remove(self._callback)


class GcPauses(_GcCallback):
    """Count, total and longest pause of the collections of each generation (seconds)."""

    def __init__(self, clock: Callable[[], float] = time.perf_counter) -> None:
        self._clock = clock
        self._started = 0.0
        self.generations = [GenerationPauses() for _ in range(3)]

    def _callback(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._started = self._clock()
            return
        pause = self._clock() - self._started
        gen = self.generations[info["generation"]]
        gen.count += 1
        gen.total += pause
        if pause > gen.longest:
            gen.longest = pause

    def summary(self) -> dict[str, Any]:
        """Log fields: per generation, collections, total and longest pause in ms."""
        out: dict[str, Any] = {}
        for i, gen in enumerate(self.generations):
            out[f"gen{i}"] = {
                "collections": gen.count,
                "total_ms": round(gen.total * 1000, 3),
                "max_ms": round(gen.longest * 1000, 3),
            }
        return out


class ThreadGcTime(_GcCallback):
    """CPU seconds the cyclic GC has spent on the calling thread since `install` (a
    collection runs on the thread whose allocation triggered it)."""

    def __init__(self) -> None:
        self._local = threading.local()
        #: The calling thread's total so far. A partial of the builtin `getattr` rather than a
        #: method: no Python frame for a read made twice per filter job (issue 29).
        self.seconds: Callable[[], float] = partial(getattr, self._local, "total", 0.0)

    def _callback(self, phase: str, info: dict[str, int]) -> None:
        local = self._local
        if phase == "start":
            local.started = time.thread_time()
            return
        started = getattr(local, "started", None)
        if started is not None:
            local.total = getattr(local, "total", 0.0) + time.thread_time() - started
            local.started = None


#: The process's meter: installed by the proxy's server, read by the sessions around each job.
thread_gc_time = ThreadGcTime()
