"""Where a filter job runs: in the filter thread pool, or inline on the event loop.

Filters run off the event loop so that a slow one cannot stall other connections (issue 11,
hole 5). For the smallest batches the hop costs more than the work: handing a job to the pool
and its result back costs ~30 µs of CPU and a thread wake-up on each side, while pii-mask on a
one-record batch costs about as much again. `JobPlacement` lets a job run inline only when
its kind has earned it:

- the path marked it as eligible (`Job.inline_key` set; paths leave it unset for chains with
  host filters, which may wait on a KMS);
- it is small (`Job.size` <= `max_bytes`);
- jobs of the same kind (same key: the path and its topics) have taken under `max_seconds`
  of CPU time `learn` times, net of outliers (below), wherever they ran. The session measures
  the running thread's CPU time: a job that may run inline cannot block, so that is how long
  it would hold the loop (wall time in the pool would count the wait for the GIL under load).

A kind that is learning (in the pool) loses two of its fast runs for each run over
`max_seconds`: outliers (a GC pause, a busy core) only delay it, a slow kind never gets there.
A kind running inline that has a run over `max_seconds` goes back to the pool and needs
`backoff` times as many fast runs as last time (up to `learn * max_backoff`): a first run on
the loop thread (the module is instantiated per thread) must not ban a fast filter, while
records crafted to make a filter slow must not stall the loop every `learn` batches. So once
a kind is found out, the loop stalls at most once per `learn * max_backoff` of its jobs, each
stall bounded by a Wasm filter's `timeout_ms`.

Thread safety: `record` is called from pool threads. Each update is a few list item
assignments; a lost update between two threads only delays or hastens a placement change by
one job, which the rule tolerates, so no lock is taken on the data path.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from sluice.proxy.contract import INLINE_MAX_BYTES

#: Defaults: a job must stay well under the thread hop it saves to be worth inlining, and a
#: stall of the loop this long is below the latency noise of a loaded machine.
MAX_SECONDS = 0.0005
MAX_BYTES = INLINE_MAX_BYTES
LEARN = 8
BACKOFF = 4
MAX_BACKOFF = 4096
MAX_KEYS = 4096


@dataclass
class JobPlacement:
    max_seconds: float = MAX_SECONDS
    max_bytes: int = MAX_BYTES
    learn: int = LEARN
    backoff: int = BACKOFF
    max_backoff: int = MAX_BACKOFF
    max_keys: int = MAX_KEYS
    # key -> [fast runs in a row, fast runs needed to run inline]
    _kinds: dict[str, list[int]] = field(default_factory=dict)
    inline_runs: int = 0
    pool_runs: int = 0

    def inline(self, key: str | None, size: int) -> bool:
        """Whether a job of kind `key` and `size` bytes may run inline on the loop."""
        if key is not None and size <= self.max_bytes:
            kind = self._kinds.get(key)
            if kind is not None and kind[0] >= kind[1]:
                self.inline_runs += 1
                return True
        self.pool_runs += 1
        return False

    def record(self, key: str | None, seconds: float) -> None:
        """How long a job of kind `key` took (CPU seconds of the thread that ran it)."""
        if key is None:
            return
        kind = self._kinds.get(key)
        if kind is None:
            if len(self._kinds) >= self.max_keys:
                # Bounded: a forgotten kind learns again in the pool (losing its back-off).
                self._kinds.clear()
            kind = self._kinds[key] = [0, self.learn]
        if seconds <= self.max_seconds:
            if kind[0] < kind[1]:
                kind[0] += 1
        elif kind[0] >= kind[1]:  # it was running inline: back off
            kind[1] = min(kind[1] * self.backoff, self.learn * self.max_backoff)
            kind[0] = 0
        else:  # learning: an outlier costs two fast runs, a slow kind never gets there
            kind[0] = max(0, kind[0] - 2)
