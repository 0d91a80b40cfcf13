"""bench/filter_jobs.py and the latency workload's filter-jobs column: the counts come from
the proxy's own exposition text (its metrics code, and a real `sluice serve` scraped by the
benchmark), inline and pool kept apart and summed over slices."""

from __future__ import annotations

import pytest

from bench import bench_proxy, filter_jobs, rig
from sluice.proxy.telemetry.metrics import Metrics, MetricsServer
from tests.harness.raw_kafka import sample_value, scrape


def test_the_proxys_exposition_text_parses_into_inline_and_pool_counts() -> None:
    metrics = Metrics(job_placement=lambda: (49_988, 12))
    _, _, body = MetricsServer(metrics, "127.0.0.1", 0).render("/metrics")
    text = body.decode()
    assert filter_jobs.parse(text) == filter_jobs.Jobs(49_988, 12)
    # Without a thread pool the proxy has no placement and no such samples: not zero jobs.
    _, _, bare = MetricsServer(Metrics(), "127.0.0.1", 0).render("/metrics")
    assert filter_jobs.parse(bare.decode()) is None
    window = filter_jobs.Jobs(49_988, 12) - filter_jobs.Jobs(988, 2)
    assert window == filter_jobs.Jobs(49_000, 10)
    assert window.text() == "49000 / 10 (0.020 %)"


def test_workers_are_read_from_the_proxy_arguments() -> None:
    assert rig._workers([]) == 1
    assert rig._workers(["--workers", "3", "--log-level=info"]) == 3
    assert rig._workers(["--workers=2"]) == 2


def test_a_sluice_variant_serves_metrics_the_rig_scrapes() -> None:
    """The rig gives each Sluice variant a /metrics port; the scrape agrees with the raw
    text of the same endpoint."""
    with rig.rig(["direct", "mask-produce"], [], "", "tansu") as points:
        assert points["direct"].metrics == ()
        point = points["mask-produce"]
        (port,) = point.metrics
        jobs = filter_jobs.scrape(point.metrics)
        assert jobs is not None
        text = scrape(port)
        assert jobs.total == sample_value(text, filter_jobs.METRIC)


@pytest.mark.serial
def test_the_latency_report_counts_every_filtered_request_inline_or_in_the_pool(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """--quick: 2 slices of 1 s at 200 records/s; each probe also sends one record before
    the clock starts (bench/latency.py), inside the scraped window. mask-produce runs one
    filter job per Produce request (one record each, or a few when the client had to queue
    them); plain sluice has a pool but no filter."""
    assert bench_proxy.main(
        ["--workload", "3", "--quick", "--variants", "direct,sluice,mask-produce"]) == 0
    out = capsys.readouterr().out
    header = next(line for line in out.splitlines() if line.startswith("| variant |"))
    assert header.rstrip().endswith("| filter jobs inline / pool (pool share) |")
    cells = {}
    for name in ("direct", "sluice", "mask-produce"):
        row = next(line for line in out.splitlines() if line.startswith(f"| {name} |"))
        cells[name] = [c.strip() for c in row.strip("|").split("|")][-1]
    assert cells["direct"] == "-"
    assert cells["sluice"] == "0 / 0 (-)"
    inline, rest = cells["mask-produce"].split(" / ")
    pool = rest.split(" (")[0]
    assert 2 <= int(inline) + int(pool) <= 2 * (200 + 1)
