"""The fetch host-share micro-benchmark runs the fetch path's real job on a masked response and
times the guest's calls apart from it (no timing asserted beyond its sign)."""

from __future__ import annotations

from bench import bench_fetch_host
from bench.workload import json_records
from sluice.codec.compression import CODEC_NONE
from sluice.filters.chain import FilterChain
from sluice.filters.config import FilterSpec
from sluice.proxy.paths.fetch import FetchPath
from tests.proxy.paths.frames import joined


def test_the_job_it_times_masks_the_response() -> None:
    values = json_records(50)
    frame = bench_fetch_host.fetch_frame([bench_fetch_host.batches(values, CODEC_NONE, 20, 0)])
    assert frame.count(b"@example.com") == 50
    spec = FilterSpec(name="mask-pii", module="builtin:pii-mask", config={},
                      topics=("bench-*",), apply_to=frozenset({"fetch"}))
    chain = FilterChain.from_specs([spec])
    try:
        done = bench_fetch_host.whole(FetchPath(), bench_fetch_host._Ctx(chain), frame)
    finally:
        chain.close()
    assert b"@example.com" not in joined(done.frame)


def test_both_workloads_are_measured() -> None:
    for workload in (1, 2):
        whole, guest, walls = bench_fetch_host.measure(workload, 600, 100, 1)
        assert whole > guest > 0
        assert walls is None


def test_threads_time_the_job_alone_and_spread() -> None:
    _, _, walls = bench_fetch_host.measure(2, 6000, 500, 1, threads=2)
    assert walls is not None and walls[0] > 0 and walls[1] > 0
