"""GuestInstance and the unchecked fast call path: results, bounds, deadlines, dead instances."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable

import pytest
import wasmtime

from sluice.filters.context import FilterRecord, RecordContext
from sluice.filters.engine import (
    MAX_CATCH_UP_TICKS,
    WATCH_S,
    FilterEngine,
    default_engine,
    native_ticker_available,
)
from sluice.filters.guest import GuestFailure, GuestInstance
from sluice.filters.runtime import LoadedFilter

WAT = """
(module
  (memory (export "memory") 1 3)
  (global $g (mut i32) (i32.const 0))
  (func (export "neg32") (result i32) (i32.const -5))
  (func (export "big64") (param i64) (result i64) (i64.mul (local.get 0) (i64.const 2)))
  (func (export "sum") (param i32 i32 i32 i32) (result i64)
    (i64.extend_i32_u (i32.add (i32.add (local.get 0) (local.get 1))
                               (i32.add (local.get 2) (local.get 3)))))
  (func (export "bump") (global.set $g (i32.add (global.get $g) (i32.const 1))))
  (func (export "get") (result i32) (global.get $g))
  (func (export "boom") unreachable)
  (func (export "f32") (param f32) (result f32) (local.get 0))
)
"""


def guest(timeout_ms: int = 50) -> GuestInstance:
    engine = default_engine()
    return GuestInstance(engine, wasmtime.Module(engine.engine, WAT),
                         wasmtime.Linker(engine.engine), memory_bytes=2 * 65536,
                         timeout_ms=timeout_ms)


class _InFlight:
    depth = 1  # a guest call in progress keeps a ticker awake


# Engines hold what they track weakly: one for the module's life stays registered.
_IN_FLIGHT = _InFlight()


def _keep_awake(*engines: FilterEngine) -> None:
    """Each engine's ticker awake, as if a guest call were in progress."""
    for engine in engines:
        engine.register(_IN_FLIGHT)
        engine.wake()


def _count_busy_calls(engine: FilterEngine) -> list[int]:
    """A list that gets an item each time the engine asks whether calls are in flight."""
    asked: list[int] = []
    busy = engine.busy

    def counted() -> bool:
        asked.append(1)
        return busy()

    engine.busy = counted  # type: ignore[method-assign]
    return asked


def _wait_until_parked(engine: FilterEngine) -> None:
    deadline = time.monotonic() + 2
    while not engine.idle and time.monotonic() < deadline:
        time.sleep(0.01)


def test_results_and_arguments() -> None:
    g = guest()
    neg, big, total = g.func("neg32"), g.func("big64"), g.func("sum")
    assert neg is not None and big is not None and total is not None
    assert neg() == -5
    assert big(2**40) == 2**41
    assert big(-3) == -6
    assert total(1, 2, 3, 4) == 10
    assert total.sig == (("i32", "i32", "i32", "i32"), ("i64",))
    with pytest.raises(TypeError):
        total(1, 2)
    bump, get = g.func("bump"), g.func("get")
    assert bump is not None and get is not None
    assert bump() == 0 and bump() == 0 and get() == 2
    assert g.func("missing") is None and g.func("memory") is None


def test_float_signatures_are_refused_for_the_fast_path() -> None:
    with pytest.raises(GuestFailure, match="unsupported signature"):
        guest().func("f32")


def test_trap_kills_the_instance() -> None:
    g = guest()
    boom, get = g.func("boom"), g.func("get")
    assert boom is not None and get is not None
    with pytest.raises(GuestFailure) as info:
        boom()
    assert info.value.kind == "trap" and "unreachable" in info.value.message
    assert g.dead
    with pytest.raises(GuestFailure, match="instance is dead"):
        get()


def test_memory_bounds_and_growth_cap() -> None:
    g = guest()
    g.write(10, b"abc")
    assert g.read(10, 3) == b"abc"
    assert g.read(0, 0) == b""
    with pytest.raises(GuestFailure, match="outside linear memory"):
        g.read(65535, 2)
    with pytest.raises(GuestFailure, match="outside linear memory"):
        g.write(-1, b"x")
    assert g.grow(1) == 65536
    with pytest.raises(GuestFailure) as info:
        g.grow(1)  # the store's cap is two pages
    assert info.value.kind == "memory"


def test_view_reads_guest_memory_in_place_within_bounds() -> None:
    g = guest()
    g.write(100, b"hello")
    view = g.view(100, 5)
    assert bytes(view) == b"hello"
    g.write(100, b"HELLO")  # a view, not a copy: it sees what the guest writes next
    assert bytes(view) == b"HELLO"
    assert bytes(g.view(0, 0)) == b""
    for ptr, n in ((65535, 2), (-1, 1), (0, -1), (0, 65537)):
        with pytest.raises(GuestFailure, match="outside linear memory"):
            g.view(ptr, n)


def test_initial_memory_above_the_cap_fails_instantiation() -> None:
    engine = default_engine()
    module = wasmtime.Module(engine.engine, '(module (memory (export "memory") 10))')
    with pytest.raises(GuestFailure, match="instantiation failed"):
        GuestInstance(engine, module, wasmtime.Linker(engine.engine), memory_bytes=65536,
                      timeout_ms=50)


def test_engine_ticks_and_close() -> None:
    engine = FilterEngine(tick_ms=5)
    assert engine.ticks_for(100) == 21 and engine.ticks_for(1) == 2
    assert engine.running
    engine.close()
    assert not engine.running
    with pytest.raises(ValueError):
        FilterEngine(tick_ms=0)


def test_host_calls_do_not_extend_the_deadline(load_wat: Callable[..., LoadedFilter]) -> None:
    f = load_wat("connect_funcs", name="pull", function="pull_forever", timeout_ms=30)
    started = time.perf_counter()
    result = f.run_batch(RecordContext("t", 0, "produce"), [FilterRecord(0, 0, None, b"v", [])],
                         apply_policy=False)
    assert result.decisions[0].failure == "timeout: exceeded the 30 ms deadline"
    assert time.perf_counter() - started < 1.0


def test_parked_ticker_wakes_for_a_call_and_still_stops_loops() -> None:
    engine = FilterEngine(tick_ms=2)
    engine.idle_after_s = 0.02
    try:
        module = wasmtime.Module(engine.engine, '(module (func (export "spin") (loop $l (br $l))))')
        g = GuestInstance(engine, module, wasmtime.Linker(engine.engine), memory_bytes=65536,
                          timeout_ms=20)
        _wait_until_parked(engine)
        assert engine.idle, "ticker should park when no guest call is in flight"
        spin = g.func("spin")
        assert spin is not None
        started = time.perf_counter()
        with pytest.raises(GuestFailure) as info:
            spin()
        assert info.value.kind == "timeout"
        assert time.perf_counter() - started < 1.0
        assert not engine.busy()
    finally:
        engine.close()
    assert not engine.running


def test_start_function_loop_is_stopped_even_when_the_ticker_is_parked() -> None:
    engine = FilterEngine(tick_ms=2)
    engine.idle_after_s = 0.01
    try:
        _wait_until_parked(engine)
        assert engine.idle
        module = wasmtime.Module(engine.engine,
                                 '(module (func $s (loop $l (br $l))) (start $s))')
        with pytest.raises(GuestFailure) as info:
            GuestInstance(engine, module, wasmtime.Linker(engine.engine), memory_bytes=65536,
                          timeout_ms=20)
        assert info.value.kind == "timeout"
    finally:
        engine.close()


def test_a_late_ticker_does_not_charge_the_gap_to_guests() -> None:
    now = [1000.0]
    engine = FilterEngine(tick_ms=2, clock=lambda: now[0])
    ticks: list[int] = []
    engine._increment = lambda: ticks.append(1)
    _keep_awake(engine)
    try:
        time.sleep(0.05)
        assert ticks == []  # the (fake) clock has not moved: nothing was due
        now[0] += 0.005  # a normal late wake-up: 2 ticks due, both added
        deadline = time.monotonic() + 2
        while len(ticks) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert len(ticks) == 2
        now[0] += 1.0  # the ticker "was not scheduled" for a second: 500 ticks due
        time.sleep(0.1)
        assert len(ticks) == 2 + MAX_CATCH_UP_TICKS
    finally:
        engine.close()


@pytest.mark.serial
def test_the_ticker_asks_whether_calls_are_in_flight_only_now_and_then() -> None:
    # Every tick still advances the epoch, but walking the instances (to park when idle) is
    # done every IDLE_CHECK_S, not 500 times a second (the Python ticker, the fallback).
    engine = FilterEngine(tick_ms=2, native=False)
    ticks: list[int] = []
    engine._increment = lambda: ticks.append(1)
    asked = _count_busy_calls(engine)
    _keep_awake(engine)
    try:
        time.sleep(0.05)
        ticks.clear()
        asked.clear()
        time.sleep(0.4)
        assert len(ticks) >= 50, "the epoch advances every tick"
        assert 1 <= len(asked) <= len(ticks) // 3
    finally:
        engine.close()


needs_native = pytest.mark.skipif(not native_ticker_available(),
                                  reason="filters/_epoch_ticker not built (scripts/dev.sh install)")


@needs_native
@pytest.mark.serial
def test_the_native_ticker_advances_the_epoch_while_python_holds_the_gil() -> None:
    # Issue 29: the Python ticker had to win the GIL 500 times a second from the event loop.
    # The native one never asks for it: with switches held off, a busy Python loop on this
    # thread stops the Python ticker dead and does not slow the native one.
    native = FilterEngine(tick_ms=2)
    python = FilterEngine(tick_ms=2, native=False)
    assert native.native and not python.native
    _keep_awake(native, python)
    switch = sys.getswitchinterval()
    try:
        time.sleep(0.1)
        sys.setswitchinterval(30.0)
        before = (native.ticks_added(), python.ticks_added())
        end = time.perf_counter() + 0.3
        while time.perf_counter() < end:  # holds the GIL: no call here releases it
            pass
        after = (native.ticks_added(), python.ticks_added())
    finally:
        sys.setswitchinterval(switch)
        native.close()
        python.close()
    assert after[0] - before[0] >= 30, "the native ticker kept advancing the epoch"
    assert after[1] - before[1] <= MAX_CATCH_UP_TICKS + 1, "the Python one waited for the GIL"
    assert not native.running


@needs_native
@pytest.mark.serial
def test_the_native_tickers_watcher_asks_about_calls_only_now_and_then() -> None:
    engine = FilterEngine(tick_ms=2)
    asked = _count_busy_calls(engine)
    _keep_awake(engine)
    try:
        time.sleep(0.05)
        asked.clear()
        ticks = engine.ticks_added()
        time.sleep(0.4)
        ticks = engine.ticks_added() - ticks
        assert ticks >= 50, "the epoch advances every tick"
        assert 1 <= len(asked) <= 0.4 / WATCH_S + 2
        assert not engine.idle
    finally:
        engine.close()


@needs_native
def test_the_native_ticker_parks_and_a_call_wakes_it() -> None:
    engine = FilterEngine(tick_ms=2)
    engine.idle_after_s = 0.02
    try:
        _wait_until_parked(engine)
        assert engine.idle
        # `idle` is published as the ticker is told to park; a tick already under way may
        # still land (seen once in a full parallel run: 2 ticks), so count from a moment on.
        time.sleep(0.02)
        parked = engine.ticks_added()
        time.sleep(0.1)
        assert engine.ticks_added() - parked <= 1, "a parked ticker does not tick"
        module = wasmtime.Module(engine.engine, '(module (func (export "spin") (loop $l (br $l))))')
        g = GuestInstance(engine, module, wasmtime.Linker(engine.engine), memory_bytes=65536,
                          timeout_ms=40)
        spin = g.func("spin")
        assert spin is not None
        started = time.perf_counter()
        with pytest.raises(GuestFailure) as info:
            spin()
        assert info.value.kind == "timeout"
        assert 0.03 <= time.perf_counter() - started < 1.0
    finally:
        engine.close()


REACTOR_WAT = """
(module
  (import "wasi_snapshot_preview1" "poll_oneoff" (func $poll (param i32 i32 i32 i32) (result i32)))
  (memory (export "memory") 1)
  (global $g (mut i32) (i32.const 0))
  (func (export "_initialize") (global.set $g (i32.const 7)))
  (func (export "get") (result i32) (global.get $g))
  ;; two subscriptions at 0 (a clock, userdata 11; an fd read, userdata 22), events at 256,
  ;; nevents at 512: returns errno * 1000 + nevents
  (func (export "poll") (result i32)
    (i64.store (i32.const 0) (i64.const 11))
    (i32.store8 (i32.const 8) (i32.const 0))
    (i64.store (i32.const 48) (i64.const 22))
    (i32.store8 (i32.const 56) (i32.const 1))
    (i32.add (i32.mul (call $poll (i32.const 0) (i32.const 256) (i32.const 2) (i32.const 512))
                      (i32.const 1000))
             (i32.load (i32.const 512))))
  (func (export "event") (param i32) (result i64) (i64.load (local.get 0)))
)
"""


def test_reactor_initialize_runs_once_and_poll_oneoff_fires_at_once() -> None:
    """A WASI reactor (Go's c-shared modules) gets `_initialize` before anything else, and its
    scheduler's poll_oneoff returns at once: clocks fire, file descriptors report EBADF."""
    from sluice.filters.wasi_stubs import define_wasi_stubs

    engine = default_engine()
    linker = wasmtime.Linker(engine.engine)
    define_wasi_stubs(linker, {"poll_oneoff"})
    g = GuestInstance(engine, wasmtime.Module(engine.engine, REACTOR_WAT), linker,
                      memory_bytes=2 * 65536, timeout_ms=50)
    get, poll, event = g.func("get"), g.func("poll"), g.func("event")
    assert get is not None and poll is not None and event is not None
    assert get() == 7
    assert poll() == 2  # errno 0, two events
    assert event(256) == 11 and event(256 + 32) == 22
    errnos = g.read(256 + 8, 2), g.read(256 + 32 + 8, 2)
    assert errnos == (b"\0\0", b"\x08\0")  # the clock fired; the fd: EBADF
