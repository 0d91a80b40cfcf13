"""FilterPool (net/filter_pool.py): the proxy's filter threads, without a future per call."""

from __future__ import annotations

import threading
import time

import pytest

from sluice.proxy.net.filter_pool import FilterPool


def test_runs_each_callable_once_on_its_named_threads_started_on_first_use() -> None:
    pool = FilterPool(2, name="t-pool")
    assert not [t for t in threading.enumerate() if t.name.startswith("t-pool_")]
    seen: list[tuple[int, str]] = []
    done = threading.Semaphore(0)

    def job(i: int) -> None:
        seen.append((i, threading.current_thread().name))
        done.release()

    for i in range(50):
        pool.submit(lambda i=i: job(i))  # type: ignore[misc]
    for _ in range(50):
        assert done.acquire(timeout=10)
    pool.shutdown()
    assert sorted(i for i, _ in seen) == list(range(50))
    assert {name for _, name in seen} <= {"t-pool_0", "t-pool_1"}
    assert not [t for t in threading.enumerate() if t.name.startswith("t-pool_")], "stopped"


def test_a_callable_that_raises_does_not_stop_its_thread() -> None:
    pool = FilterPool(1)
    ran = threading.Event()

    def broken() -> None:
        raise ValueError("boom")

    pool.submit(broken)
    pool.submit(ran.set)
    assert ran.wait(10)
    pool.shutdown()


def test_shutdown_with_cancel_runs_what_was_taken_and_reports_what_was_queued() -> None:
    pool = FilterPool(1)
    gate, started = threading.Event(), threading.Event()
    ran: list[str] = []
    never: list[str] = []

    def held() -> None:
        started.set()
        gate.wait(10)
        ran.append("held")

    pool.run(held, lambda: never.append("held"))
    assert started.wait(10)
    pool.run(lambda: ran.append("queued"), lambda: never.append("queued"))
    pool.submit(lambda: ran.append("helper"))  # nothing to report for it
    threading.Timer(0.05, gate.set).start()
    pool.shutdown(wait=True, cancel_futures=True)
    assert ran == ["held"] and never == ["queued"]
    with pytest.raises(RuntimeError):
        pool.submit(lambda: None)


def test_shutdown_without_cancel_runs_what_was_queued_first() -> None:
    pool = FilterPool(1)
    ran: list[int] = []
    pool.submit(lambda: time.sleep(0.05))
    for i in range(5):
        pool.submit(lambda i=i: ran.append(i))  # type: ignore[misc]
    pool.shutdown(wait=True)
    assert ran == [0, 1, 2, 3, 4]


def test_a_pool_needs_a_thread() -> None:
    with pytest.raises(ValueError, match="at least one thread"):
        FilterPool(0)


@pytest.mark.parametrize("error", [SystemExit(3), KeyboardInterrupt()])
def test_a_callable_raising_a_base_exception_does_not_stop_its_thread(
        error: BaseException) -> None:
    """Round 39 review: the pool's threads outlive SystemExit and KeyboardInterrupt too (a
    thread's `SystemExit` would end it silently, and the jobs queued behind would wait)."""
    pool = FilterPool(1)
    ran = threading.Event()

    def broken() -> None:
        raise error

    pool.submit(broken)
    pool.submit(ran.set)
    assert ran.wait(10)
    pool.shutdown()
