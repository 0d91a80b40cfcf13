"""The wasmtime Engine every filter shares, and the epoch ticker that enforces call deadlines.

One Engine per process (per configuration): compiled modules, the on-disk cache key and the
epoch counter all hang off it. The engine is built with epoch interruption enabled; a daemon
thread increments the epoch every `tick_ms`, and each guest call sets its store's deadline to
``ceil(timeout_ms / tick_ms) + 1`` ticks, so a runaway loop traps within about one tick of its
deadline. A ticker that wakes late adds at most MAX_CATCH_UP_TICKS at once, so time it was not
scheduled is not charged to a call that has only just started. wasmtime releases the GIL while
guest code runs, so a looping guest cannot starve the ticker.

The ticker is native when `filters/_epoch_ticker` is built (`filters/epoch_ticker.c`, by
`scripts/dev.sh install`): a C thread that calls wasmtime's epoch increment on a clone of the
engine and never takes the GIL. The Python ticker it replaced woke 500 times a second for
~34 µs of CPU each, and each wake-up had to win the GIL from the event loop (issue 29: ~8 µs of
CPU per request at 2 000 one-record requests/s, and a loop thread waiting for the GIL when it
came back from a socket call). The Python ticker stays as the fallback when the module is not
built, and for a test clock.

The ticker only runs while guests are busy: a thread waking 500 times a second costs CPU even
without the GIL. After `idle_after_s` without any guest call started or in flight it parks (the
native ticker on a condition variable; a Python thread, the watcher, decides, asking every
WATCH_S; the Python ticker asks itself every IDLE_CHECK_S); the outermost guest call
(`GuestInstance.enter`) wakes it. The hand-over is race-free because the ticker is parked and
publishes ``idle = True`` *before* its last check of the instances' call depth, and a call
raises its depth *before* reading ``idle``. A runaway guest keeps its depth raised, so the
ticker never parks under it and its deadline holds.

`fingerprint` names every setting that changes generated code; serialized modules are only
valid for an engine with the same fingerprint and wasmtime version (see module_cache).
"""

from __future__ import annotations

import ctypes
import hashlib
import importlib.metadata
import math
import os
import platform
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any, Final

import wasmtime
from wasmtime import _bindings as _wt_bindings

try:  # the native ticker (filters/epoch_ticker.c), built at install
    from sluice.filters._epoch_ticker import (  # type: ignore[import-not-found, unused-ignore]
        lib as _et_lib,
    )
except ImportError:  # pragma: no cover - exercised only where the module was not built
    _et_lib = None

DEFAULT_TICK_MS: Final = 2.0
#: Ticks a late ticker may add at once; the rest of a long gap is not charged to guests.
MAX_CATCH_UP_TICKS: Final = 2
#: How often the ticker asks whether a guest call is in flight (to park after idle_after_s).
IDLE_CHECK_S: Final = 0.01
#: How often the native ticker's watcher (a Python thread, so it takes the GIL) asks the same.
WATCH_S: Final = 0.05
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


def native_ticker_available() -> bool:
    """Whether the native epoch ticker was built (`scripts/dev.sh install`)."""
    return _et_lib is not None


class _NativeTicker:
    """The C thread of filters/epoch_ticker.c, on a clone of the engine it owns until `stop`."""

    def __init__(self, engine: wasmtime.Engine, interval_s: float, max_catch_up: int) -> None:
        dll = _wt_bindings.dll
        clone = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p)(("wasmtime_engine_clone", dll))
        self._delete = ctypes.CFUNCTYPE(None, ctypes.c_void_p)(("wasm_engine_delete", dll))
        increment = ctypes.cast(dll.wasmtime_engine_increment_epoch, ctypes.c_void_p).value
        # The thread's own reference: the epoch counter is the engine's, shared by the clone,
        # and a clone cannot be freed under the thread by Python's collector or at exit.
        self._engine = clone(ctypes.cast(engine.ptr(), ctypes.c_void_p).value)
        self._pid = os.getpid()
        self._t = _et_lib.et_start(increment or 0, self._engine or 0,
                                   max(1, round(interval_s * 1e9)), max_catch_up, 1)
        if not self._t:
            self._delete(self._engine)
            raise RuntimeError("could not start the native epoch ticker")

    def park(self) -> None:
        if self._t is not None:
            _et_lib.et_park(self._t)

    def resume(self) -> None:
        if self._t is not None:
            _et_lib.et_resume(self._t)

    def ticks(self) -> int:
        return int(_et_lib.et_ticks(self._t)) if self._t is not None else 0

    def stop(self) -> None:
        # After a fork the thread does not exist in this process: leave the memory alone.
        if self._t is not None and os.getpid() == self._pid:
            _et_lib.et_stop(self._t)
            self._delete(self._engine)
        self._t = None


class FilterEngine:
    """A wasmtime Engine with epoch interruption plus the thread that advances the epoch."""

    def __init__(self, tick_ms: float = DEFAULT_TICK_MS,
                 clock: Callable[[], float] = time.monotonic,
                 native: bool | None = None) -> None:
        """`native`: the C ticker (default: when built and the clock is the real one)."""
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
        #: Outermost guest calls started (the watcher parks only after none for a while).
        self.calls = 0
        self._ticks = 0
        self._instances: weakref.WeakSet[Any] = weakref.WeakSet()
        self._wake = threading.Event()
        self._stop = threading.Event()
        if native is None:
            native = _et_lib is not None and clock is time.monotonic
        if native and _et_lib is None:
            raise RuntimeError("the native epoch ticker is not built (scripts/dev.sh install)")
        self._native = (_NativeTicker(self.engine, tick_ms / 1000.0, MAX_CATCH_UP_TICKS)
                        if native else None)
        target = self._watch if self._native is not None else self._tick
        self._thread = threading.Thread(target=target, name="sluice-wasm-epoch", daemon=True)
        self._thread.start()

    @property
    def native(self) -> bool:
        """Whether the epoch is advanced by the native ticker (no GIL)."""
        return self._native is not None

    def ticks_added(self) -> int:
        """Epoch ticks added so far (tests, diagnostics)."""
        return self._native.ticks() if self._native is not None else self._ticks

    def register(self, instance: Any) -> None:
        """Track an instance whose ``depth`` (guest calls in flight) keeps the ticker awake."""
        self._instances.add(instance)

    def wake(self) -> None:
        """Called when a guest call starts: restart a parked ticker. The native ticker is
        resumed by its watcher, not here: a call into C that gives up the GIL on the event loop
        could hand the GIL to a filter thread."""
        self.calls += 1
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
                    self._ticks += 1
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

    def _watch(self) -> None:
        """The native ticker's watcher: parks it after `idle_after_s` without a guest call
        started or in flight, resumes it when a call wakes the engine. It takes the GIL
        1 / WATCH_S times a second, not 1 / tick."""
        native = self._native
        assert native is not None
        stop = self._stop
        native.resume()
        while True:
            quiet_since: float | None = None
            seen = self.calls
            while True:
                if stop.wait(WATCH_S):
                    return
                calls = self.calls
                if calls != seen or self.busy():
                    seen = calls
                    quiet_since = None
                elif quiet_since is None:
                    quiet_since = time.monotonic()
                elif time.monotonic() - quiet_since >= self.idle_after_s:
                    break
            # Parked and published before the last look at the instances: a call that raised
            # its depth after that look reads idle=True and wakes us (module docstring).
            self._wake.clear()
            native.park()
            self.idle = True
            if not self.busy():
                self._wake.wait()
                if stop.is_set():
                    return
            self.idle = False
            native.resume()

    def ticks_for(self, timeout_ms: float) -> int:
        """Epoch ticks to allow for a call of at most `timeout_ms` (at least two)."""
        return max(2, math.ceil(timeout_ms / self.tick_ms) + 1)

    def close(self) -> None:
        """Stop the ticker (tests; a process-wide engine lives as long as the process)."""
        self._stop.set()
        self._wake.set()
        self._thread.join(timeout=1.0)
        # The watcher calls into the native ticker: free it only once the watcher is gone (a
        # watcher still alive leaves the C thread running on its own engine clone, harmless).
        if self._native is not None and not self._thread.is_alive():
            self._native.stop()

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
