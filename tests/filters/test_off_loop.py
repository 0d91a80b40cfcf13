"""What running filters off the event loop relies on: the guest runs without the GIL, and a
native-path timeout is not spent a second time by the decoding path."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from sluice.filters.chain import FilterChain
from sluice.filters.config import FilterSpec
from sluice.filters.context import FilterRecord, RecordContext
from sluice.filters.guest import GuestFailure
from sluice.filters.pipeline import filter_produce
from sluice.filters.runtime import LoadedFilter
from tests.filters.test_native_path import make_batch

# Measures time: run alone, after the tests that run on two workers (scripts/dev.sh).
pytestmark = pytest.mark.serial

CTX = RecordContext("orders", 0, "produce", "client-1", None)
UPPER = Path(__file__).resolve().parents[2] / "filters" / "examples" / "upper" / "upper.wasm"


def test_a_spinning_guest_does_not_hold_the_gil(load_wat: Callable[..., LoadedFilter]) -> None:
    f = load_wat("sluice_upper", timeout_ms=300)
    f.run_batch(CTX, [FilterRecord(0, 0, None, b"warm", [])])
    done = threading.Event()

    def spin() -> None:
        f.run_batch(CTX, [FilterRecord(0, 0, None, b"LOOP", [])])
        done.set()

    thread = threading.Thread(target=spin)
    thread.start()
    gaps: list[float] = []
    last = time.perf_counter()
    while not done.is_set():
        time.sleep(0.001)
        now = time.perf_counter()
        gaps.append(now - last)
        last = now
    thread.join()
    # Holding the GIL for the whole 300 ms deadline would show as one gap of ~300 ms.
    assert len(gaps) > 20 and max(gaps) < 0.1, (len(gaps), max(gaps))


def test_a_native_timeout_is_not_run_again(tmp_path: Path) -> None:
    chain = FilterChain.from_specs(
        [FilterSpec(name="upper", module=str(UPPER), topics=("*",))],
        cache_dir=tmp_path / "cache",
    )
    try:
        f = chain.filters[0]
        assert f.native
        runner: Any = f._runner
        calls = {"run": 0}
        real_run = runner.run

        def counting_run(*args: Any, **kwargs: Any) -> Any:
            calls["run"] += 1
            return real_run(*args, **kwargs)

        def timed_out(*args: Any, **kwargs: Any) -> Any:
            raise GuestFailure("timeout", "exceeded the 100 ms deadline")

        runner.run = counting_run
        runner.run_native = timed_out
        out = filter_produce(chain, CTX, make_batch([b"a", b"b"]))
        assert calls["run"] == 0, "the decoding path called the guest again"
        assert out.error_code != 0 and "timeout" in (out.error_message or "")
        assert f.failures["timeout"] == 1 and f.native_fallbacks == 1

        # A trap (not a timeout) on the native path is still redone by the reference path.
        def trapped(*args: Any, **kwargs: Any) -> Any:
            raise GuestFailure("trap", "unreachable")

        runner.run_native = trapped
        out = filter_produce(chain, CTX, make_batch([b"a", b"b"]))
        assert calls["run"] == 1 and out.error_code == 0
    finally:
        chain.close()
