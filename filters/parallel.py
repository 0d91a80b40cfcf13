"""Running independent pieces of one filter job on several of the filter pool's threads at once.

A Fetch response's filtered partitions are independent of each other: `map_ordered` runs a
function over them on the calling thread and on helpers it hands to the pool (`Helpers`), and
returns the results in the items' order, so what is built from them (the spliced frame,
telemetry, dead letters) is the same as a serial pass would build.

The caller is itself one of the pool's threads, so it must never wait for work queued behind
it (with every thread a caller, nobody would run the queue): the items sit in one shared
queue that the caller works through too, a helper that starts late finds it empty and returns,
and at the end the caller waits only for items a helper has already started. The guest calls
(wasmtime through ctypes) and the compression codecs give up the GIL while they run, which is
what lets the threads overlap; the host's Python code between them does not.

No asyncio here: `Helpers.spawn` is whatever submits a callable to the pool
(`ThreadPoolExecutor.submit` in the proxy).
"""

from __future__ import annotations

import contextvars
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TypeVar

__all__ = ["Helpers", "map_ordered"]

T = TypeVar("T")
R = TypeVar("R")


@dataclass(frozen=True, slots=True)
class Helpers:
    """Threads a job may borrow: `spawn` queues a callable on the pool, which has `threads`
    threads (the caller's included)."""

    spawn: Callable[[Callable[[], None]], object]
    threads: int


class _Queue:
    """The items not yet taken, and how many taken ones are still running."""

    __slots__ = ("done", "next", "running", "size")

    def __init__(self, size: int) -> None:
        self.size = size
        self.next = 0
        self.running = 0
        self.done = threading.Condition(threading.Lock())

    def take(self) -> int | None:
        with self.done:
            i = self.next
            if i >= self.size:
                return None
            self.next = i + 1
            self.running += 1
            return i

    def finished(self) -> None:
        with self.done:
            self.running -= 1
            if not self.running:
                self.done.notify_all()

    def wait_running(self) -> None:
        with self.done:
            while self.running:
                self.done.wait()


def map_ordered(fn: Callable[[T], R], items: Sequence[T],
                helpers: Helpers | None) -> list[R]:
    """``[fn(item) for item in items]``, the items spread over the caller and up to
    ``helpers.threads - 1`` pool threads. An exception of `fn` is raised after every started
    item is done (the first by the items' order)."""
    n = len(items)
    width = 1 if helpers is None else min(helpers.threads, n)
    if width <= 1:
        return [fn(item) for item in items]
    results: list[R | None] = [None] * n
    errors: list[BaseException | None] = [None] * n
    queue = _Queue(n)
    # What a helper works with, emptied once every item is done: a helper still queued then
    # (the pool's other threads busy) must not keep the job's items and results, views of a
    # response frame, alive after the response went out and left the connection's count.
    job = [(fn, items, results, errors)]

    def work() -> None:
        while (i := queue.take()) is not None:
            # Taken, so the job is not emptied until this item is finished.
            run, todo, out, failed = job[0]
            try:
                out[i] = run(todo[i])
            except BaseException as exc:  # handed to the caller, in order
                failed[i] = exc
            finally:
                del run, todo, out, failed
                queue.finished()

    assert helpers is not None
    for _ in range(width - 1):
        # Each helper runs in a copy of the caller's context (its log fields); one copy per
        # thread, since a context cannot be entered by two threads at once.
        context = contextvars.copy_context()
        try:
            helpers.spawn(lambda context=context: context.run(work))  # type: ignore[misc]
        except RuntimeError:
            break  # the pool is shutting down: the caller does the rest
    work()
    queue.wait_running()
    job.clear()
    for exc in errors:
        if exc is not None:
            raise exc
    return results  # type: ignore[return-value]
