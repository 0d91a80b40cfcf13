"""`map_ordered`: items on the caller's thread and pool helpers, results in order, and no
deadlock when every pool thread is itself a caller waiting on helpers queued behind it."""

from __future__ import annotations

import gc
import threading
import time
import weakref
from concurrent.futures import ThreadPoolExecutor

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sluice.filters.parallel import Helpers, map_ordered


def test_two_threads_run_items_at_once() -> None:
    barrier = threading.Barrier(2, timeout=10)  # broken unless two items overlap

    def meet(i: int) -> tuple[int, int]:
        if i < 2:
            barrier.wait()
        return i, threading.get_ident()

    with ThreadPoolExecutor(1) as pool:
        out = map_ordered(meet, list(range(6)), Helpers(pool.submit, 2))
    assert [i for i, _ in out] == list(range(6))
    assert len({t for _, t in out}) == 2


@settings(max_examples=50, deadline=None)
@given(items=st.lists(st.integers(), max_size=30), threads=st.integers(1, 4))
def test_results_come_in_the_items_order(items: list[int], threads: int) -> None:
    with ThreadPoolExecutor(threads) as pool:
        assert map_ordered(lambda x: x * 3 + 1, items, Helpers(pool.submit, threads)) == [
            x * 3 + 1 for x in items]


def test_the_first_error_by_order_is_raised_after_the_started_items_finish() -> None:
    finished: list[int] = []

    def work(i: int) -> int:
        if i in (3, 5):
            raise ValueError(f"item {i}")
        time.sleep(0.01)
        finished.append(i)
        return i

    with ThreadPoolExecutor(2) as pool, pytest.raises(ValueError, match="item 3"):
        map_ordered(work, list(range(8)), Helpers(pool.submit, 2))
    assert sorted(finished) == [0, 1, 2, 4, 6, 7]


@pytest.mark.serial
def test_jobs_of_a_full_pool_that_spread_on_it_do_not_deadlock() -> None:
    """Both pool threads run a job that hands helpers to the same pool: the helpers queue
    behind the jobs, so each job does its items itself and never waits on a queued helper."""
    with ThreadPoolExecutor(2) as pool:
        started = threading.Barrier(2, timeout=10)

        def job(k: int) -> list[int]:
            started.wait()  # both threads busy before either queues a helper
            return map_ordered(lambda x: x + k, list(range(20)), Helpers(pool.submit, 2))

        jobs = [pool.submit(job, k) for k in (0, 100)]
        assert [j.result(timeout=20) for j in jobs] == [
            list(range(20)), [x + 100 for x in range(20)]]


def test_a_shut_down_pool_leaves_the_work_to_the_caller() -> None:
    pool = ThreadPoolExecutor(1)
    pool.shutdown()
    assert map_ordered(str, [1, 2, 3], Helpers(pool.submit, 2)) == ["1", "2", "3"]


class _Piece:
    """An item or a result that can be watched for being freed (a Fetch response's partition
    and its filtered records hold views of the whole response frame)."""


def test_a_helper_still_queued_keeps_nothing_of_a_finished_job_alive() -> None:
    """When every other pool thread is busy, the caller runs all the items itself and returns,
    while its helper stays queued behind other jobs. The job's response is then sent and no
    longer counted against the connection (`max_held_response_bytes`); the queued helper must
    not keep its items, results or function alive until the pool reaches it."""
    busy = threading.Event()
    with ThreadPoolExecutor(1) as pool:
        pool.submit(busy.wait, 10)  # the pool's one thread is taken
        items = [_Piece() for _ in range(4)]
        def fn(item: _Piece) -> _Piece:
            return _Piece()

        out = map_ordered(fn, items, Helpers(pool.submit, 2))
        watched = [weakref.ref(x) for x in (*items, *out)] + [weakref.ref(fn)]
        del items, out, fn
        gc.collect()
        alive = sum(ref() is not None for ref in watched)
        busy.set()
    assert alive == 0
