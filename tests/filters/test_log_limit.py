"""Repeated warnings are rate-limited: the first of each kind, then one per interval with the
count of those suppressed (filters/log_limit.py), and the filter runtime uses it for the
per-batch warnings that once flooded the log (a partition blocked by a data policy)."""

from __future__ import annotations

from typing import Any

import pytest

from sluice.filters.config import FilterSpec
from sluice.filters.context import FilterRecord, RecordContext
from sluice.filters.decisions import PartitionError
from sluice.filters.log_limit import RepeatLimiter
from sluice.filters.runtime import load_filter


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Recorder:
    """A logger that keeps what it was asked to log."""

    def __init__(self) -> None:
        self.lines: list[tuple[str, dict[str, Any]]] = []

    def warning(self, event: str, **fields: Any) -> None:
        self.lines.append((event, fields))


def test_first_then_one_per_interval_with_the_suppressed_count() -> None:
    clock = FakeClock()
    limiter = RepeatLimiter(10.0, clock=clock)
    out = Recorder()
    logged = [limiter.warning(out, "k", "blocked", topic="t") for _ in range(500)]
    assert logged[0] and not any(logged[1:])
    assert out.lines == [("blocked", {"suppressed": 0, "topic": "t"})]
    clock.now += 9.9
    assert not limiter.warning(out, "k", "blocked", topic="t")
    clock.now += 0.1
    assert limiter.warning(out, "k", "blocked", topic="t")
    assert out.lines[-1] == ("blocked", {"suppressed": 500, "topic": "t"})
    clock.now += 60
    assert limiter.warning(out, "k", "blocked", topic="t")
    assert out.lines[-1][1]["suppressed"] == 0


def test_keys_are_independent() -> None:
    clock = FakeClock()
    limiter = RepeatLimiter(10.0, clock=clock)
    out = Recorder()
    for _ in range(3):
        for key in ("a", "b", ("c", 1)):
            limiter.warning(out, key, "e", key=str(key))
    assert [f["key"] for _, f in out.lines] == ["a", "b", "('c', 1)"]


def test_the_number_of_keys_is_bounded() -> None:
    clock = FakeClock()
    limiter = RepeatLimiter(10.0, max_keys=3, clock=clock)
    for k in range(100):
        assert limiter.admit(k) == 0
    assert len(limiter._seen) == 3
    assert limiter.admit(99) is None  # the most recent ones are still remembered
    assert limiter.admit(0) == 0  # forgotten: logged again, which is harmless


def test_bad_settings_are_refused() -> None:
    with pytest.raises(ValueError):
        RepeatLimiter(-1)
    with pytest.raises(ValueError):
        RepeatLimiter(1, max_keys=0)


def test_a_blocked_partition_logs_once_per_interval_not_per_batch() -> None:
    # A junk policy record once produced 6 178 warnings in seconds: builtin:block fails every
    # batch of the topic, and clients retry as fast as they can.
    f = load_filter(FilterSpec(name="policy:crm", module="builtin:block",
                               config={"reason": "unreadable policy"}))
    clock = FakeClock()
    f.repeats = RepeatLimiter(10.0, clock=clock)
    out = Recorder()
    f._log = out  # type: ignore[assignment]
    records = [FilterRecord(0, 0, None, b"x")]
    for partition in range(4):
        ctx = RecordContext(topic="crm", partition=partition, direction="produce")
        for _ in range(250):
            with pytest.raises(PartitionError):
                f.run_batch(ctx, records)
    assert f.failures["partition"] == 1000  # every one is still counted
    assert [e for e, _ in out.lines] == ["filter_partition_error"]
    assert out.lines[0][1]["suppressed"] == 0 and out.lines[0][1]["topic"] == "crm"
    clock.now += 10
    with pytest.raises(PartitionError):
        f.run_batch(RecordContext(topic="crm", partition=0, direction="produce"), records)
    assert out.lines[-1][1]["suppressed"] == 999
    # another topic is its own warning
    with pytest.raises(PartitionError):
        f.run_batch(RecordContext(topic="other", partition=0, direction="produce"), records)
    assert [f["topic"] for _, f in out.lines] == ["crm", "crm", "other"]
