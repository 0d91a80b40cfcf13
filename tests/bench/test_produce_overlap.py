"""bench.produce_overlap runs both passes and reports the jobs that ran at once; profile_proxy's
per-thread split reads py-spy's `--threads --idle` stacks."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench import produce_overlap, profile_proxy


def test_produce_overlap_runs_both_passes(capsys: pytest.CaptureFixture[str]) -> None:
    assert produce_overlap.main(["--requests", "3", "--records", "50", "--pairs", "2"]) == 0
    out = capsys.readouterr().out
    assert "one at a time:" in out and "most jobs at once 1" in out
    assert "side by side:" in out and "most jobs at once 2" in out


def test_per_thread_split_counts_idle_samples(tmp_path: Path) -> None:
    collapsed = tmp_path / "stacks.txt"
    collapsed.write_text(
        "thread (7): sluice-filter_0;_worker (concurrent/futures/thread.py:81) 30\n"
        "thread (7): sluice-filter_0;_worker (concurrent/futures/thread.py:83);"
        "RawFunc.__call__ (filters/guest.py:292) 10\n"
        "thread (1): MainThread;Runner.run (asyncio/runners.py:118) 5\n",
        encoding="utf-8",
    )
    text = profile_proxy.summarise(collapsed, 5)
    assert "thread (7): sluice-filter_0: 40 samples, idle 75% (_worker 75%)" in text
    assert "thread (1): MainThread: 5 samples, idle 100% (Runner.run 100%)" in text
