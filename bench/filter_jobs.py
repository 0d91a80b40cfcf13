"""Where a Sluice variant's filter jobs ran, inline on the event loop or in the thread pool,
read from the proxy's own `/metrics` (`sluice_filter_jobs_total{where="inline"|"pool"}`,
proxy/telemetry/metrics.py) so that bench.bench_proxy can print the pool's share per variant.

A `sluice serve --workers N` serves worker k's metrics on the configured port + k
(docs/CONFIGURATION.md, *metrics*): `Jobs.scrape` sums the N ports. A proxy without a thread
pool, or a source tree older than the metric, has no such samples: that reads as no counts
(None), not as zero jobs.
"""

from __future__ import annotations

import re
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass

METRIC = "sluice_filter_jobs_total"
_SAMPLE = re.compile(
    rf'^{METRIC}\{{(?:[^}}]*,)?where="(?P<where>[a-z]+)"(?:,[^}}]*)?\}}\s+(?P<value>\S+)'
)


@dataclass(frozen=True)
class Jobs:
    """Filter jobs counted so far (or in a window: the difference of two scrapes)."""

    inline: int
    pool: int

    def __sub__(self, earlier: Jobs) -> Jobs:
        return Jobs(self.inline - earlier.inline, self.pool - earlier.pool)

    def __add__(self, other: Jobs) -> Jobs:
        return Jobs(self.inline + other.inline, self.pool + other.pool)

    @property
    def total(self) -> int:
        return self.inline + self.pool

    def text(self) -> str:
        """`inline / pool (pool share %)`, the report's cell."""
        share = f"{100 * self.pool / self.total:.3f} %" if self.total else "-"
        return f"{self.inline} / {self.pool} ({share})"


def parse(text: str) -> Jobs | None:
    """The counts in a Prometheus text exposition (summed over every sample of each place);
    None when it has no `sluice_filter_jobs_total` sample."""
    counts = {"inline": 0.0, "pool": 0.0}
    seen = False
    for line in text.splitlines():
        m = _SAMPLE.match(line)
        if m is None or m["where"] not in counts:
            continue
        counts[m["where"]] += float(m["value"])
        seen = True
    return Jobs(int(counts["inline"]), int(counts["pool"])) if seen else None


def scrape(ports: Sequence[int], timeout: float = 10.0) -> Jobs | None:
    """The counts summed over the `/metrics` of every port on 127.0.0.1 (one per worker);
    None if no port had the metric."""
    total: Jobs | None = None
    for port in ports:
        url = f"http://127.0.0.1:{port}/metrics"
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            jobs = parse(resp.read().decode("utf-8"))
        if jobs is not None:
            total = jobs if total is None else total + jobs
    return total
