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
  Inline, a job over within `max_seconds` of wall time is charged that wall time, an upper
  bound of its CPU time on the loop's thread, which saves a read of the CPU clock (a system
  call) per job; one that took longer is charged its CPU time, as in the pool.

A kind that is learning (in the pool) loses two of its fast runs for each run over
`max_seconds`: outliers (a busy core) only delay it, a slow kind never gets there.
A kind running inline that has a run over `max_seconds` goes back to the pool and needs
`backoff` times as many fast runs as last time (up to `learn * max_backoff`): a first run on
the loop thread (the module is instantiated per thread) must not ban a fast filter, while
records crafted to make a filter slow must not stall the loop every `learn` batches. So once
a kind is found out, the loop stalls at most once per `learn * max_backoff` of its jobs, each
stall bounded by a Wasm filter's `timeout_ms`.

Rare outliers must not send a fast kind to the pool for good (issue 29's tail): on the loaded
2-core machine a one-record pii-mask job (~70 µs of CPU) took 0.5-1 ms about once in 8 000
runs with no collection, page fault or preemption inside it, and every young-generation
collection that fell inside a job (~1 ms) was charged to it. With each one quadrupling the fast
runs needed and nothing ever lowering them, the kind ratcheted to 32 768 within a minute and
ran about half its jobs in the pool, where each one-record request paid the two thread hops
(1-2 ms under load) and the connection's later requests waited behind it. So:

- the session charges a job its thread's CPU time less what the cyclic GC spent on that thread
  meanwhile (`gc_pauses.thread_gc_time`): a collection pauses the loop wherever the job runs
  (it holds the GIL), so it says nothing about the kind;
- a run inline over `max_seconds` but within `tolerance` backs the kind off only if another
  one did within its last `strike_window` runs: the loop stalls at most `tolerance` once per
  `strike_window` jobs of a kind that way, a run over `tolerance` backs it off at once;
- after `learn * max_backoff` fast runs in a row inline, the kind needs `backoff` times fewer
  fast runs (never fewer than `learn`): the bound above holds, since each step down takes
  as many clean jobs as the longest back-off.

Jobs whose cost follows their size (`scales`: only the proxy's own native code runs, e.g. the
encrypt filter's sealer, never a guest) may also run inline above `max_bytes`, up to
`scaled_max_bytes`, when their kind has proved fast (as above, a run over `max_bytes` counting
as fast when within `scaled_max_seconds`) and its cost estimated from the size is within
`scaled_max_seconds`: the kind's CPU seconds per byte, learnt from its jobs over
`max_bytes` (a costlier run raises the rate at once, cheaper ones lower it slowly). The budget is
about what the hand-off itself costs under load (two thread wake-ups: 1-2 ms of wall time on a
busy 2-core machine), so the loop stalls no longer than the connection would have waited. The
size is the declared one (`paths/base.job_size`): a compressed batch whose codec declares no
binding size (gzip, zstd) is never estimated, it goes to the pool; an LZ4 batch counts as the
bound its block headers give (the decompressor holds the frame to it). A scaled job inline
that takes more than twice the budget backs its kind off as a slow run does.

Thread safety: `record` is called from pool threads. Each update is a few list item
assignments; a lost update between two threads only delays or hastens a placement change by
one job, which the rule tolerates, so no lock is taken on the data path.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from sluice.proxy.contract import INLINE_MAX_BYTES, INLINE_SCALED_MAX_BYTES

#: Defaults: a job must stay well under the thread hop it saves to be worth inlining, and a
#: stall of the loop this long is below the latency noise of a loaded machine.
MAX_SECONDS = 0.0005
#: A run inline up to this long is an outlier if it is the only one in STRIKE_WINDOW runs.
TOLERANCE = 0.002
STRIKE_WINDOW = 1024
MAX_BYTES = INLINE_MAX_BYTES
LEARN = 8
BACKOFF = 4
MAX_BACKOFF = 4096
MAX_KEYS = 4096
SCALED_MAX_SECONDS = 0.001
SCALED_MAX_BYTES = INLINE_SCALED_MAX_BYTES


@dataclass
class JobPlacement:
    max_seconds: float = MAX_SECONDS
    max_bytes: int = MAX_BYTES
    learn: int = LEARN
    backoff: int = BACKOFF
    max_backoff: int = MAX_BACKOFF
    max_keys: int = MAX_KEYS
    tolerance: float = TOLERANCE
    strike_window: int = STRIKE_WINDOW
    scaled_max_seconds: float = SCALED_MAX_SECONDS
    scaled_max_bytes: int = SCALED_MAX_BYTES
    # key -> [fast runs in a row (up to the next), fast runs needed to run inline,
    #         runs since the last tolerated outlier, fast runs in a row inline]
    _kinds: dict[str, list[int]] = field(default_factory=dict)
    # key -> CPU seconds per byte of its scaled jobs over max_bytes
    _rates: dict[str, float] = field(default_factory=dict)
    inline_runs: int = 0
    pool_runs: int = 0

    def inline(self, key: str | None, size: int, scales: bool = False) -> bool:
        """Whether a job of kind `key` and `size` bytes may run inline on the loop (`scales`:
        its cost follows its size, see the module docstring)."""
        if key is not None:
            kind = self._kinds.get(key)
            if kind is not None and kind[0] >= kind[1] and (
                size <= self.max_bytes
                or (
                    scales
                    and size <= self.scaled_max_bytes
                    and size * self._rates.get(key, 1.0) <= self.scaled_max_seconds
                )
            ):
                self.inline_runs += 1
                return True
        self.pool_runs += 1
        return False

    def gave_back(self) -> None:
        """A job `inline` placed on the loop would have waited there and went to the pool:
        counted where it ran."""
        self.inline_runs -= 1
        self.pool_runs += 1

    def record(self, key: str | None, seconds: float, size: int = 0,
               scales: bool = False, ran_inline: bool = False) -> None:
        """How long a job of kind `key` and `size` bytes took (CPU seconds of the thread that
        ran it), and whether it ran inline."""
        if key is None:
            return
        kind = self._kinds.get(key)
        if kind is None:
            if len(self._kinds) >= self.max_keys:
                # Bounded: a forgotten kind learns again in the pool (losing its back-off).
                self._kinds.clear()
                self._rates.clear()
            kind = self._kinds[key] = [0, self.learn, self.strike_window, 0]
        if scales and size > self.max_bytes:
            # Not a small job: it teaches the rate; within the budget it counts as a fast
            # run, and as a slow one only when it ran inline and took well over the budget
            # (in the pool a large job is expected to take long).
            rate = seconds / size
            old = self._rates.get(key)
            self._rates[key] = rate if old is None or rate > old else old + (rate - old) / 8
            if seconds <= self.scaled_max_seconds:
                if kind[0] < kind[1]:
                    kind[0] += 1
            elif ran_inline and seconds > 2 * self.scaled_max_seconds:
                kind[1] = min(kind[1] * self.backoff, self.learn * self.max_backoff)
                kind[0] = kind[3] = 0
            return
        kind[2] += 1
        if seconds <= self.max_seconds:
            if kind[0] < kind[1]:
                kind[0] += 1
            elif kind[3] + 1 >= self.learn * self.max_backoff:
                # A long clean run inline: one step of back-off is forgiven.
                kind[0] = kind[1] = max(self.learn, kind[1] // self.backoff)
                kind[3] = 0
            else:
                kind[3] += 1
        elif kind[0] >= kind[1]:  # it was running inline
            kind[3] = 0
            if seconds <= self.tolerance and kind[2] > self.strike_window:
                kind[2] = 0  # a lone outlier: noted, the kind stays inline
                return
            kind[2] = 0
            kind[1] = min(kind[1] * self.backoff, self.learn * self.max_backoff)
            kind[0] = 0
        else:  # learning: an outlier costs two fast runs, a slow kind never gets there
            kind[0] = max(0, kind[0] - 2)
