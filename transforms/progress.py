"""What a running transform has done and how far behind it is: the numbers behind `/metrics`.

A runner thread updates its `TransformStatus`; readers (the Prometheus collector, tests) take
`snapshot()` copies, so no lock is held while the runner works. Lag of a partition = the
input's high watermark (from the consumer's own fetch responses: the bundled broker's
ListOffsets answer for the log end is wrong) minus the next offset the transform will commit.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field, replace
from typing import Any


@dataclass(frozen=True, slots=True)
class PartitionProgress:
    """One assigned input partition: next offset to commit, log end, and the difference."""

    topic: str
    partition: int
    committed: int | None  # next input offset the group resumes at (None: nothing committed)
    high_watermark: int | None  # None until the consumer has fetched from the partition
    lag: int | None


@dataclass(slots=True)
class TransformStatus:
    """Counters of one transform in this process."""

    name: str
    guarantee: str = "unresolved"
    state: str = "starting"  # starting, waiting (for a topic), running, failed, stopped
    error: str | None = None
    records_in: int = 0
    records_out: int = 0
    dropped: int = 0
    rejected: int = 0
    dead_letters: int = 0
    batches: int = 0
    transactions_committed: int = 0
    transactions_aborted: int = 0
    retries: int = 0  # batches re-read after a failed write or commit
    partitions: dict[tuple[str, int], PartitionProgress] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def update(self, **changes: Any) -> None:
        with self._lock:
            for key, value in changes.items():
                setattr(self, key, value)

    def add(self, **deltas: int) -> None:
        with self._lock:
            for key, value in deltas.items():
                setattr(self, key, getattr(self, key) + value)

    def set_partitions(self, partitions: Iterable[PartitionProgress]) -> None:
        table = {(p.topic, p.partition): p for p in partitions}
        with self._lock:
            self.partitions = table

    def snapshot(self) -> TransformStatus:
        with self._lock:
            return replace(self, partitions=dict(self.partitions), _lock=threading.Lock())

    @property
    def total_lag(self) -> int | None:
        lags = [p.lag for p in self.partitions.values()]
        if not lags or any(lag is None for lag in lags):
            return None
        return sum(lag for lag in lags if lag is not None)


class TransformCollector:
    """A Prometheus collector over the statuses `source()` returns (registered in a registry
    by `sluice serve` and `sluice transform run`)."""

    def __init__(self, source: Callable[[], list[TransformStatus]]) -> None:
        self._source = source

    def describe(self) -> list[Any]:
        return []

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        statuses = [s.snapshot() for s in self._source()]
        lag = GaugeMetricFamily("sluice_transform_lag_records",
                                "Input records not yet transformed, per input partition",
                                labels=["transform", "topic", "partition"])
        committed = GaugeMetricFamily("sluice_transform_committed_offset",
                                      "Next input offset the transform's group resumes at",
                                      labels=["transform", "topic", "partition"])
        high = GaugeMetricFamily("sluice_transform_high_watermark",
                                 "Input partition log end seen by the transform",
                                 labels=["transform", "topic", "partition"])
        up = GaugeMetricFamily("sluice_transform_running",
                               "1 when the transform runs, 0 when it failed or stopped",
                               labels=["transform", "guarantee"])
        counters = {
            key: CounterMetricFamily(f"sluice_transform_{key}", text, labels=["transform"])
            for key, text in (
                ("records_in", "Input records read and processed"),
                ("records_out", "Records written to the output topic"),
                ("dropped", "Input records a filter dropped"),
                ("rejected", "Input records a filter rejected (not written)"),
                ("dead_letters", "Records written to a dead-letter topic"),
                ("transactions_committed", "Transactions committed (exactly-once mode)"),
                ("transactions_aborted", "Transactions aborted (exactly-once mode)"),
                ("retries", "Batches read again after a failed write or commit"),
            )
        }
        for s in statuses:
            up.add_metric([s.name, s.guarantee], 1.0 if s.state == "running" else 0.0)
            for key, family in counters.items():
                family.add_metric([s.name], float(getattr(s, key)))
            for p in s.partitions.values():
                labels = [s.name, p.topic, str(p.partition)]
                if p.lag is not None:
                    lag.add_metric(labels, float(p.lag))
                if p.committed is not None:
                    committed.add_metric(labels, float(p.committed))
                if p.high_watermark is not None:
                    high.add_metric(labels, float(p.high_watermark))
        yield up
        yield lag
        yield committed
        yield high
        yield from counters.values()
