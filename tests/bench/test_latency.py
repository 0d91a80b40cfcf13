"""The side-by-side latency probes of bench.latency: their statistics, and one short paired
window against the test broker."""

from __future__ import annotations

import pytest

from bench import latency, workload
from tests.harness.broker import TansuBroker


def test_quantiles_late_share_and_added() -> None:
    # Four records due every 10 ms; the third left 5 ms late.
    via = latency.Latencies([0.0, 0.01, 0.025, 0.03], [0.004, 0.001, 0.003, 0.002], rate=100)
    direct = latency.Latencies([0.0, 0.01, 0.02, 0.03], [0.001, 0.001, 0.002, 0.001], rate=100)
    assert via.quantile(0.5) == 0.003
    assert via.quantile(0.99) == 0.004
    assert via.late() == 0.25
    assert direct.late() == 0.0
    pair = latency.Paired(direct, via)
    assert pair.added(0.5) == pytest.approx(0.002)
    assert pair.added(0.99) == pytest.approx(0.002)


def test_a_paired_window_delivers_every_record_on_both_sides(broker: TansuBroker) -> None:
    a = workload.make_topic(broker.bootstrap, partitions=1)
    b = workload.make_topic(broker.bootstrap, partitions=1)
    pair = latency.paired((broker.bootstrap, a), (broker.bootstrap, b), rate=200, seconds=1)
    for side in (pair.direct, pair.via):
        assert len(side.latency) == len(side.sent) == 200
        assert all(lat > 0 for lat in side.latency)
        # Sent in schedule order, the last one about a second after the start.
        assert side.sent == sorted(side.sent)
        assert 0.99 <= side.sent[-1] < 2.0
