"""The wasmtime Engine every filter shares, and the epoch ticker that enforces CPU deadlines.

One Engine per process (per configuration): compiled modules, the on-disk cache key and the
epoch counter all hang off it. The engine is built with epoch interruption enabled; a daemon
thread increments the epoch every `tick_ms`, and each guest call sets its store's deadline to
``ceil(timeout_ms / tick_ms) + 1`` ticks, so a runaway loop traps within about one tick of its
deadline. A ticker that wakes late adds at most MAX_CATCH_UP_TICKS at once, so time it was not
scheduled is not charged to a call that has only just started. wasmtime releases the GIL while
guest code runs, so a looping guest cannot starve the ticker.

The ticker only runs while guests are busy: a thread waking 500 times a second costs ~3% of a
core and interrupts the proxy's thread for the GIL. After `idle_after_s` without any guest call
in flight (asked every IDLE_CHECK_S, not every tick) it parks on an Event; the outermost guest
call (`GuestInstance.enter`) wakes it. The hand-over is race-free because the ticker publishes
``idle = True`` *before* its last check of the instances' call depth, and a call raises its
depth *before* reading ``idle``.

`fingerprint` names every setting that changes generated code; serialized modules are only
valid for an engine with the same fingerprint and wasmtime version (see module_cache).
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import math
import platform
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any, Final

import wasmtime

DEFAULT_TICK_MS: Final = 2.0
#: Ticks a late ticker may add at once; the rest of a long gap is not charged to guests.
MAX_CATCH_UP_TICKS: Final = 2
#: How often the ticker asks whether a guest call is in flight (to park after idle_after_s).
IDLE_CHECK_S: Final = 0.01
# Settings that affect compiled code; part of the cache key. Change both together.
_ENGINE_SETTINGS: Final = (
    ("epoch_interruption", True),
    ("cranelift_opt_level", "speed"),
    ("max_wasm_stack", 512 * 1024),
    ("wasm_threads", False),
)


def wasmtime_version() -> str:
    """Version of the installed wasmtime-py (its artifacts are tied to it)."""
    try:
        return importlib.metadata.version("wasmtime")
    except importlib.metadata.PackageNotFoundError:  # pragma: no cover - vendored installs
        return "unknown"


class FilterEngine:
    """A wasmtime Engine with epoch interruption plus the thread that advances the epoch."""

    def __init__(self, tick_ms: float = DEFAULT_TICK_MS,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if tick_ms <= 0:
            raise ValueError("tick_ms must be positive")
        self._clock = clock
        cfg = wasmtime.Config()
        cfg.epoch_interruption = True
        cfg.cranelift_opt_level = "speed"
        cfg.max_wasm_stack = 512 * 1024
        cfg.wasm_threads = False
        self.engine = wasmtime.Engine(cfg)
        self._increment: Callable[[], None] = self.engine.increment_epoch
        self.tick_ms = tick_ms
        settings = ";".join(f"{k}={v}" for k, v in _ENGINE_SETTINGS)
        raw = f"wasmtime={wasmtime_version()};arch={platform.machine()};{settings}"
        self.fingerprint = hashlib.sha256(raw.encode()).hexdigest()[:16]
        self.fingerprint_text = raw
        self.idle_after_s = 0.1
        #: True while the ticker is parked; read on every outermost guest call.
        self.idle = False
        self._instances: weakref.WeakSet[Any] = weakref.WeakSet()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._tick, name="sluice-wasm-epoch", daemon=True)
        self._thread.start()

    def register(self, instance: Any) -> None:
        """Track an instance whose ``depth`` (guest calls in flight) keeps the ticker awake."""
        self._instances.add(instance)

    def wake(self) -> None:
        """Called when a guest call starts: restart a parked ticker."""
        if self.idle:
            self._wake.set()

    def busy(self) -> bool:
        """Whether any tracked instance is inside a guest call."""
        return any(inst.depth for inst in list(self._instances))

    def _tick(self) -> None:
        interval = self.tick_ms / 1000.0
        # Whether a guest call is in flight is asked every IDLE_CHECK_S, not every tick: the
        # question walks the instances, and the ticker runs 500 times a second whenever
        # filters are in use (at 50 µs of CPU a tick it cost ~12 µs per request of a proxy
        # serving 2 000 one-record requests a second, issue 29). A call that starts while
        # the ticker is parked wakes it (`wake`), so parking a little early or late is safe.
        check_every = max(1, round(IDLE_CHECK_S / interval))
        sleep = time.sleep
        clock = self._clock
        stop = self._stop
        while not stop.is_set():
            # Catch up from the clock, a little: a slightly late wake-up still advances the
            # epoch by the ticks that were due, so deadlines track real time. A long gap (the
            # ticker not scheduled: VM steal, a descheduled process, the GIL held elsewhere)
            # is not charged: it happened before or beside the guest's work, and charging it
            # at once can trap calls that have only just started (the likely cause of a keep-all
            # filter's timeout on a 100-record batch in filters.bench under 15-19 % steal).
            started = clock()
            done = 0
            quiet_since: float | None = None
            until_check = check_every
            while True:
                # A plain sleep: no lock or condition to set up per tick (`close` waits at
                # most one interval for the ticker to notice `stop`).
                sleep(interval)
                if stop.is_set():
                    return
                due = int((clock() - started) / interval)
                if due - done > MAX_CATCH_UP_TICKS:
                    done = due - MAX_CATCH_UP_TICKS
                increment = self._increment
                while done < due:
                    increment()
                    done += 1
                until_check -= 1
                if until_check:
                    continue
                until_check = check_every
                if self.busy():
                    quiet_since = None
                elif quiet_since is None:
                    quiet_since = time.monotonic()
                elif time.monotonic() - quiet_since >= self.idle_after_s:
                    break
            self.idle = True
            if self.busy():
                self.idle = False
                continue
            self._wake.wait()
            self._wake.clear()
            self.idle = False

    def ticks_for(self, timeout_ms: float) -> int:
        """Epoch ticks to allow for a call of at most `timeout_ms` (at least two)."""
        return max(2, math.ceil(timeout_ms / self.tick_ms) + 1)

    def close(self) -> None:
        """Stop the ticker (tests; a process-wide engine lives as long as the process)."""
        self._stop.set()
        self._wake.set()
        self._thread.join(timeout=1.0)

    @property
    def running(self) -> bool:
        return self._thread.is_alive()


_default: FilterEngine | None = None
_default_lock = threading.Lock()


def default_engine() -> FilterEngine:
    """The process-wide FilterEngine, created on first use."""
    global _default
    with _default_lock:
        if _default is None or not _default.running:
            _default = FilterEngine()
        return _default
