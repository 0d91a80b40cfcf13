"""The filter thread pool: a few threads taking callables from one queue, nothing more.

`concurrent.futures.ThreadPoolExecutor` makes a `Future` per call (a `Condition` over an
`RLock`, Python-level `with` blocks to mark it running and to set its result, a callback
list) and a work item, and checks its thread count on every submit: ~40 Python calls per
filter job on top of the job, which on the loaded benchmark machine, where each job finds the
caches cold, cost tens of µs of a masked workload-1 Produce's hand-off (issue 29). Nothing
reads those futures: a filter job hands its own outcome back to the event loop
(`net/session.py`), and a fetch job's helpers report through their own queue
(`filters/parallel.py`). So `submit` queues the callable on a `queue.SimpleQueue` (C) and
returns nothing; `run` also takes what to call if the callable never runs, because the pool
shut down with `cancel_futures` first (the session then tells the connection, so the job's
chain lease is released).

The threads are started on the first call (`threads` of them, named ``sluice-filter_N`` as
the executor named them) and are daemon threads: `shutdown` asks them to stop after the
callables already taken, and waits for them only when asked to.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable

from sluice.proxy.telemetry.logs import log

__all__ = ["FilterPool"]

_Item = tuple[Callable[[], object], Callable[[], object] | None] | None


class FilterPool:
    """`threads` threads running the callables `submit` and `run` queue, in queue order."""

    def __init__(self, threads: int, name: str = "sluice-filter") -> None:
        if threads < 1:
            raise ValueError(f"a filter pool needs at least one thread, not {threads}")
        self.threads = threads
        self._queue: queue.SimpleQueue[_Item] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._closed = False
        self._name = name
        self._workers: list[threading.Thread] = []

    def submit(self, fn: Callable[[], object]) -> None:
        """Queue `fn` (RuntimeError once the pool is shut down). What `Helpers.spawn` takes."""
        self.run(fn)

    def run(self, fn: Callable[[], object], never_ran: Callable[[], object] | None = None,
            ) -> None:
        """Queue `fn`; `never_ran` is called instead if the pool shuts down with
        `cancel_futures` before a thread takes it. RuntimeError once shut down."""
        if not self._workers:
            self._start()
        if self._closed:
            raise RuntimeError("the filter pool is shut down")
        self._queue.put((fn, never_ran))

    def _start(self) -> None:
        """The threads, on the first call: a server that never filters (most tests) or that
        forks its workers first (`--workers`) has none to carry."""
        with self._lock:
            if self._workers or self._closed:
                return
            workers = [threading.Thread(target=self._work, name=f"{self._name}_{i}",
                                        daemon=True) for i in range(self.threads)]
            for worker in workers:
                worker.start()
            self._workers = workers

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        """Stop the threads once they have run what they took; with `cancel_futures`, the
        callables still queued are not run (their `never_ran` is called, here); without it
        they run first. With `wait`, return once every thread has stopped."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            workers = list(self._workers)
        if cancel_futures:
            while True:
                try:
                    item = self._queue.get_nowait()
                except queue.Empty:
                    break
                if item is not None and item[1] is not None:
                    _call(item[1])
        for _ in workers:
            self._queue.put(None)
        if wait:
            for worker in workers:
                if worker is not threading.current_thread():
                    worker.join()

    def _work(self) -> None:
        get = self._queue.get
        while True:
            item = get()
            if item is None:
                return
            _call(item[0])
            del item  # not kept alive while the thread waits for the next


def _call(fn: Callable[[], object]) -> None:
    try:
        fn()
    except BaseException as exc:  # the session's and the helpers' callables catch their own
        log.error("filter_pool_call_failed", error=repr(exc), exc_info=exc)
