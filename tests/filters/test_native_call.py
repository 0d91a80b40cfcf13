"""A Sluice-ABI guest's records call in one native call (native_call.NativeCall): each way it
fails fails the same with the host's SHA-256 pass ("pass": a host_sha256 guest), without it
("fused": any other guest with the records path) and on the step-by-step ctypes path kept for
where the native module is not built ("ctypes"). The guests and memory images are
test_host_sha256's."""

from __future__ import annotations

import gc
import types
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from sluice.filters import host_sha256, native_call
from sluice.filters.abi_sluice import RECORD_BUDGET_US
from sluice.filters.context import FilterRecord
from sluice.filters.guest import GuestFailure
from sluice.filters.module_cache import ModuleCache
from sluice.filters.native_io import native_input_head
from sluice.filters.runtime import LoadedFilter
from tests.filters.test_host_sha256 import (
    CTX,
    PLACEHOLDER,
    SLOT,
    Image,
    _failure,
    _hex,
    _load,
    _runner,
    _wat,
)

MODES = ["pass", "fused", "ctypes"]


@pytest.fixture(params=MODES)
def mode(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """Which path the filters loaded in the test take (set before they are loaded)."""
    name: str = request.param
    if name != "ctypes" and not native_call.AVAILABLE:
        pytest.skip("filters/_native_call not built (scripts/dev.sh install)")
    if name == "pass" and not host_sha256.AVAILABLE:
        pytest.skip("filters/_host_sha256 not built (scripts/dev.sh install)")
    if name == "ctypes":
        monkeypatch.setattr(native_call, "AVAILABLE", False)
    yield name


def _guest_wat(mode: str, image: Image, records_body: str | None = None,
               alloc_body: str = "(i32.const 61440)") -> str:
    """The test guest; it offers host_sha256 in every mode (on the ctypes path the host must
    decline: the pass runs only inside the native call), except "fused", which has no offer."""
    slot = None if mode == "fused" else SLOT
    return _wat(bytes(image.mem), slot, image.out_len, records_body, alloc_body)


@contextmanager
def _loaded(tmp_path: Path, cache: ModuleCache, mode: str, records_body: str | None = None,
            alloc_body: str = "(i32.const 61440)",
            timeout_ms: int = 100) -> Iterator[tuple[LoadedFilter, Image]]:
    """The test guest loaded as a filter over a one-request memory image, closed after."""
    image = Image([(b"s", b"v")])
    f = _load(tmp_path, cache, _guest_wat(mode, image, records_body, alloc_body), timeout_ms)
    try:
        yield f, image
    finally:
        f.close()


def _digest_or_placeholder(mode: str) -> bytes:
    """What the output's digest place holds after a successful call in `mode`."""
    return _hex(b"s", b"v") if mode == "pass" else PLACEHOLDER


def test_the_records_call_takes_the_mode_s_path(tmp_path: Path, module_cache: ModuleCache,
                                                mode: str) -> None:
    with _loaded(tmp_path, module_cache, mode) as (f, image):
        runner = _runner(f)
        guest = runner.guest()
        assert ("host_sha256" in f.capabilities) == (mode != "fused")
        assert runner.has_host_sha256 == (mode == "pass")
        fused = runner._fused
        if mode == "ctypes":
            assert fused is None
        else:
            assert isinstance(fused, native_call.NativeCall)
        out = runner.run_native(CTX, b"", 1, 0, 0)
        assert out.records is not None
        assert bytes(out.records)[2:66] == _digest_or_placeholder(mode)
        assert guest.read(image.section + 2, 64) == _digest_or_placeholder(mode)
        assert guest.depth == 0


def test_a_trap_in_the_records_call_fails_as_a_trap_and_runs_no_pass(
        tmp_path: Path, module_cache: ModuleCache, mode: str) -> None:
    with _loaded(tmp_path, module_cache, mode, "unreachable") as (f, image):
        guest = _runner(f).guest()
        fused = _runner(f)._fused
        failure = _failure(f)
        assert failure.kind == "trap" and "unreachable" in failure.message
        assert guest.dead and guest.depth == 0
        assert guest.read(image.section + 2, 64) == PLACEHOLDER  # the pass did not run
        if fused is not None:
            with pytest.raises(GuestFailure, match="dead after an earlier failure"):
                fused(0, 0, 1, 0)


def test_a_records_call_past_its_deadline_fails_as_a_timeout(
        tmp_path: Path, module_cache: ModuleCache, mode: str) -> None:
    spin = "(loop $l (br $l)) (i64.const 0)"
    with _loaded(tmp_path, module_cache, mode, spin, timeout_ms=10) as (f, _image):
        failure = _failure(f)
        assert failure.kind == "timeout" and "10 ms" in failure.message


def test_a_failed_records_call_keeps_no_export_of_its_input(
        tmp_path: Path, module_cache: ModuleCache, mode: str) -> None:
    """The input's buffer is given back when the call ends, a failed one too: the failure's
    traceback keeps the call's frames, and a memoryview still exported from one of them,
    once in a reference cycle, crashes CPython 3.11's collector (gh-77894: it clears the
    view, then frees it). That crash took pytest workers down under load."""
    with _loaded(tmp_path, module_cache, mode, "unreachable") as (f, _image):
        section = memoryview(bytearray(64))
        with pytest.raises(GuestFailure) as caught:
            _runner(f).run_native(CTX, section, 1, 0, 0)
        assert caught.value.kind == "trap" and caught.value.__traceback__ is not None
        section.release()  # BufferError while a kept frame still exports it


def test_a_batch_whose_records_call_timed_out_leaves_no_frame_in_a_cycle(
        tmp_path: Path, module_cache: ModuleCache, mode: str) -> None:
    """run_batch on the batch whose records call ran out of time takes that call's failure
    (not a second deadline), and neither the failure kept for it nor its replay ties the
    frames of the calls to it in a reference cycle: the collector, which would have to
    break such a cycle, finds none of their frames (they held the batch's buffers)."""
    spin = "(loop $l (br $l)) (i64.const 0)"
    with _loaded(tmp_path, module_cache, mode, spin, timeout_ms=10) as (f, _image):
        section = memoryview(bytearray(64))
        gc.collect()
        gc.disable()
        try:
            assert f.run_native(CTX, section, 1) is None
            section.release()  # the failure kept for run_batch exports nothing
            made = f.instantiations
            result = f.run_batch(CTX, [FilterRecord(0, 0, b"k", b"v", [])])
            assert result.failure is not None and "timeout" in result.failure
            assert f.instantiations == made  # the guest was not called again
            gc.set_debug(gc.DEBUG_SAVEALL)
            gc.collect()
            ours = [o.f_code.co_name for o in gc.garbage if isinstance(o, types.FrameType)
                    and "/filters/" in o.f_code.co_filename]
        finally:
            gc.set_debug(0)
            gc.garbage.clear()
            gc.enable()
        assert ours == []


def test_a_records_call_that_returns_an_error_runs_no_pass(
        tmp_path: Path, module_cache: ModuleCache, mode: str) -> None:
    with _loaded(tmp_path, module_cache, mode, "(i64.const -3)") as (f, image):
        guest = _runner(f).guest()
        failure = _failure(f)
        assert failure.kind == "error" and failure.message == "returned -3"
        assert not guest.dead and guest.depth == 0
        assert guest.read(image.section + 2, 64) == PLACEHOLDER


def test_an_input_that_does_not_fit_where_alloc_put_it_is_not_written(
        tmp_path: Path, module_cache: ModuleCache, mode: str) -> None:
    with _loaded(tmp_path, module_cache, mode) as (f, _image):
        guest = _runner(f).guest()
        before = guest.read(0, 1 << 16)
        with pytest.raises(GuestFailure, match="outside linear memory") as caught:
            _runner(f).run_native(CTX, b"\x00" * 5000, 1, 0, 0)  # sluice_alloc answers 61440
        assert caught.value.kind == "invalid-output"
        assert guest.read(0, 1 << 16) == before and guest.depth == 0


@pytest.mark.parametrize("kind", [bytes, bytearray, memoryview])
def test_the_input_is_written_from_any_buffer(tmp_path: Path, module_cache: ModuleCache,
                                              mode: str, kind: type) -> None:
    """The records section goes in as the pipeline holds it (a view of a request, too)."""
    with _loaded(tmp_path, module_cache, mode) as (f, _image):
        section = bytes(range(200))
        out = _runner(f).run_native(CTX, kind(section), 1, 0, 0)
        assert out.records is not None
        assert _digest_or_placeholder(mode) in bytes(out.records)
        guest = _runner(f).guest()
        head = native_input_head(CTX, 1, 0, 0)
        assert guest.read(61440, len(head) + len(section)) == head + section


@pytest.mark.parametrize(("alloc_body", "kind", "message"), [
    ("(i32.const 0)", "memory", f"sluice_alloc({len(native_input_head(CTX, 1, 0, 0)) + 1}) "
                                "returned 0"),
    ("(if (local.get 0) (then unreachable)) (i32.const 61440)", "trap", "unreachable"),
])
def test_an_alloc_that_fails_writes_nothing_and_calls_nothing(
        tmp_path: Path, module_cache: ModuleCache, mode: str, alloc_body: str, kind: str,
        message: str) -> None:
    """sluice_alloc, called by the same native call for a records section (the input's head
    and one byte here), fails as it does when Python calls it."""
    with _loaded(tmp_path, module_cache, mode, alloc_body=alloc_body) as (f, image):
        guest = _runner(f).guest()
        with pytest.raises(GuestFailure) as caught:
            _runner(f).run_native(CTX, b"\x00", 1, 0, 0)
        assert caught.value.kind == kind and message in caught.value.message
        assert guest.dead == (kind == "trap") and guest.depth == 0
        assert guest.read(image.section + 2, 64) == PLACEHOLDER  # no call, no pass


def test_the_deadline_grows_per_record_and_a_nested_call_keeps_the_outer_one(
        tmp_path: Path, module_cache: ModuleCache, mode: str,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The ticks the native call arms: the instance's deadline plus RECORD_BUDGET_US a record
    for an outermost call (sluice_alloc's own, alloc_ticks, without them); 0 (the deadline
    left as it is) for a call made inside another guest call."""
    if mode == "ctypes":
        pytest.skip("RawFunc arms the step-by-step calls (tests/filters/test_guest.py)")
    armed: list[int] = []
    real = native_call.nc_call_run
    assert real is not None

    def spy(call: Any, ticks: int, *args: Any) -> int:
        armed.append(ticks)
        return real(call, ticks, *args)

    monkeypatch.setattr(native_call, "nc_call_run", spy)
    with _loaded(tmp_path, module_cache, mode) as (f, image):
        runner = _runner(f)
        guest = runner.guest()
        if mode == "fused":  # run_native's extra for 1 000 records (the guest answers for 1)
            with pytest.raises(GuestFailure, match="1 fates for 1000 records"):
                runner.run_native(CTX, b"", 1000, 0, 0)
            extra = int(1000 * RECORD_BUDGET_US / 1000 / guest.engine.tick_ms)
            assert extra > 0 and armed.pop() == guest.ticks + extra
        fused = runner._fused
        assert fused is not None and fused._c.alloc_ticks == guest.ticks
        fused(0, 0, 1, 7)
        assert armed == [guest.ticks + 7]
        guest.write(image.section + 2, PLACEHOLDER)  # the digest's place as it was
        guest.depth = 1  # as inside another call of this instance
        try:
            fused(0, 0, 1, 7)
        finally:
            guest.depth = 0
        assert armed[1] == 0
