"""bench_sdk_framing builds its filters with two headers and times both (no timing asserted)."""

from __future__ import annotations

import pytest

from bench import bench_sdk_framing
from sluice.filters.build import SDK_DIR


def test_prints_each_filter_with_both_headers_and_their_ratio(
        capsys: pytest.CaptureFixture[str]) -> None:
    header = SDK_DIR / "sluice_filter.h"
    bench_sdk_framing.main(["--against", str(header), "--records", "40", "--batch", "10",
                            "--rounds", "1"])
    out = capsys.readouterr().out
    assert f"B = {header}" in out
    rows = {line.split()[0]: line.split()[1:] for line in out.splitlines()
            if line.split() and line.split()[0] in bench_sdk_framing.FILTERS}
    assert set(rows) == {"keep", "rewrite", "mixed"}
    for cells in rows.values():
        a_ns, a_b, b_ns, b_b, ratio = (float(c) for c in cells)
        assert a_ns > 0 and b_ns > 0 and a_b > 0 and b_b > 0
        assert ratio == pytest.approx(a_ns / b_ns, abs=0.01)
