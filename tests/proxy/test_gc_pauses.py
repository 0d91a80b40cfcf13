"""The collector in the proxy: the start-up heap is frozen, and every collection is timed and
reported when the proxy stops."""

from __future__ import annotations

import gc
import json
import threading
import time
from collections.abc import Callable, Iterator

import pytest

from sluice.proxy.ops.gc_pauses import GcPauses, ThreadGcTime, freeze_startup_heap
from tests.harness.proxy import SluiceProxy


@pytest.fixture
def unfrozen() -> Iterator[None]:
    yield
    gc.unfreeze()


def test_collections_are_counted_per_generation_until_uninstalled() -> None:
    ticks = iter(range(0, 1000, 2))  # every collection "takes" 2 clock units
    pauses = GcPauses(clock=lambda: float(next(ticks)))
    pauses.install()
    try:
        gc.collect(0)
        gc.collect(2)
        gc.collect(2)
    finally:
        pauses.uninstall()
    gc.collect(2)  # not counted any more
    summary = pauses.summary()
    assert summary["gen2"] == {"collections": 2, "total_ms": 4000.0, "max_ms": 2000.0}
    # Automatic young collections may run in between; the forced one is there.
    assert summary["gen0"]["collections"] >= 1
    assert pauses._callback not in gc.callbacks


def test_freezing_takes_surviving_objects_out_of_full_collections(unfrozen: None) -> None:
    keep = [[i] for i in range(20_000)]  # tracked objects that survive
    frozen = freeze_startup_heap()
    assert frozen >= len(keep)
    # The kept objects left the collector's generations. (The freeze count is not compared
    # again: any thread freeing a frozen object in between lowers it.)
    in_generations = {id(o) for g in range(3) for o in gc.get_objects(generation=g)}
    assert not any(id(k) in in_generations for k in keep)
    tracked = len(gc.get_objects(generation=2))
    assert tracked < frozen, "frozen objects are still in the oldest generation"


def test_proxy_freezes_its_heap_and_reports_pauses_when_it_stops(
    start_proxy: Callable[..., SluiceProxy],
) -> None:
    proxy = start_proxy()
    # The heap is frozen once the codec's hot schemas are prepared (warmup.py).
    deadline = time.monotonic() + 30
    while not any('"codec_warmed"' in line for line in proxy.output):
        assert time.monotonic() < deadline, proxy.output[-5:]
        time.sleep(0.05)
    proxy.stop()
    lines = [json.loads(line) for line in proxy.output if '"gc_pauses"' in line]
    assert len(lines) == 1, proxy.output[-5:]
    report = lines[0]
    # kio's schema classes alone are tens of thousands of objects.
    assert report["frozen"] > 10_000
    # Every version of Produce requests is among the prepared schemas.
    assert report["warmed_schemas"] > 13
    for gen in ("gen0", "gen1", "gen2"):
        assert set(report[gen]) == {"collections", "total_ms", "max_ms"}


def test_collections_are_charged_to_the_thread_that_ran_them() -> None:
    keep = [[i] for i in range(100_000)]  # something for a full collection to walk
    meter = ThreadGcTime()
    meter.install()
    seen: dict[str, float] = {}

    def other() -> None:
        before = meter.seconds()
        gc.collect()
        seen["other"] = meter.seconds() - before

    try:
        here = meter.seconds()
        t = threading.Thread(target=other)
        t.start()
        t.join()
        assert meter.seconds() == here, "another thread's collection is not this thread's"
        gc.collect()
        assert meter.seconds() > here
    finally:
        meter.uninstall()
    del keep
    assert seen["other"] > 0
    gc.collect()
    assert meter._callback not in gc.callbacks
