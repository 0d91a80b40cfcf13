"""Holding back a filter call's side effects on the filter's own counters and log, to apply later.

A Fetch partition split into runs of batches (`pipeline.plan_fetch`) is filtered on several
threads at once, and a run may filter batches that a serial pass would never have reached: the
serial pass stops at the first batch that fails the partition (a corrupt batch, a host filter's
`PartitionError`). What such a batch's run did must leave no trace, so each run is filtered
inside `deferred()`: the filter runtime hands its failure counts and warnings to `effect`,
which keeps them in the run's list instead of applying them, and the caller `commit`s the lists
of the runs a serial pass would have filtered, in their order, and drops the others.

Outside `deferred()` (every other call) `effect` applies at once. Pure code, no asyncio.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

__all__ = ["Effect", "commit", "deferred", "effect"]

Effect = Callable[[], object]

_local = threading.local()


@contextmanager
def deferred() -> Iterator[list[Effect]]:
    """Until the block ends, `effect` on this thread appends to the list it yields."""
    held: list[Effect] = []
    outer = getattr(_local, "held", None)
    _local.held = held
    try:
        yield held
    finally:
        _local.held = outer


def effect(fn: Effect) -> None:
    """Apply `fn` now, or hold it for `commit` inside `deferred()`."""
    held: list[Effect] | None = getattr(_local, "held", None)
    if held is None:
        fn()
    else:
        held.append(fn)


def commit(held: list[Effect]) -> None:
    """Apply held effects in the order they were held."""
    for fn in held:
        fn()
