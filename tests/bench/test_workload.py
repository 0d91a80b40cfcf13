"""bench/workload.py's pieces that hold no broker: the collector pause around a timed consume."""

from __future__ import annotations

import gc

import pytest

from bench import workload


class _Cycle:
    def __init__(self) -> None:
        self.me = self


def test_the_collector_is_off_inside_and_as_it_was_after() -> None:
    assert gc.isenabled()
    collections = gc.get_stats()[0]["collections"]
    with workload.paused_gc():
        assert not gc.isenabled()
        # Enough new containers to set off several young collections were it on.
        held = [_Cycle() for _ in range(10 * gc.get_threshold()[0])]
        assert gc.get_stats()[0]["collections"] == collections
    assert gc.isenabled()
    del held


def test_the_collector_comes_back_when_the_block_raises_and_stays_off_if_it_was() -> None:
    with pytest.raises(RuntimeError), workload.paused_gc():
        raise RuntimeError("a failed consume")
    assert gc.isenabled()
    gc.disable()
    try:
        with workload.paused_gc():
            pass
        assert not gc.isenabled()
    finally:
        gc.enable()
