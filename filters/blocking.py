"""Whether the running thread may wait: a filter job that runs inline on the proxy's event loop
may not (a KMS call, a lock another thread holds), and must give the job back instead.

The proxy runs a small or cheap filter job on the loop itself rather than handing it to the
filter thread pool (proxy/net/job_placement.py). Host filters that could wait (``builtin:encrypt``
asks its KMS for a data key now and then) are still eligible when they honour this module: code
that is about to wait calls `check()`, which raises `WouldBlock` on a thread inside
`forbidden()`. The caller of `forbidden()` catches it and runs the job again in the pool, from
its start; nothing it did before is kept, so the work done before the raise must be safe to do
twice (counting a data key's uses twice only rotates the key sooner).

`WouldBlock` derives from BaseException so that the filters' own `except Exception` handlers
(failure policies, the encrypt filter's retriable error) let it through untouched.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

_state = threading.local()


class WouldBlock(BaseException):
    """Raised on a thread that may not wait, where the code would have waited."""


@contextmanager
def forbidden() -> Iterator[None]:
    """Within this block, `check()` on this thread raises `WouldBlock`."""
    before = forbid()
    try:
        yield
    finally:
        restore(before)


def forbid() -> bool:
    """`forbidden()` without the context manager, for the per-job path (a generator-based
    context manager costs a few µs, a few % of a one-record inline job): from now on `check()`
    on this thread raises `WouldBlock`. Returns what `restore` puts back; call it in a
    ``finally``."""
    before: bool = getattr(_state, "forbidden", False)
    _state.forbidden = True
    return before


def restore(before: bool) -> None:
    """Undo `forbid()` with the value it returned."""
    _state.forbidden = before


def allowed() -> bool:
    """Whether the running thread may wait."""
    return not getattr(_state, "forbidden", False)


def check() -> None:
    """Raise `WouldBlock` when the running thread may not wait."""
    if getattr(_state, "forbidden", False):
        raise WouldBlock()


def acquire(lock: threading.Lock) -> None:
    """Take `lock`: waiting for it when the thread may wait, else only if it is free now."""
    if not getattr(_state, "forbidden", False):
        lock.acquire()
    elif not lock.acquire(blocking=False):
        raise WouldBlock()
