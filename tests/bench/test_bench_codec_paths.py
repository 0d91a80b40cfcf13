"""The codec micro-benchmark runs end to end and reports every step (no timing asserted)."""

from __future__ import annotations

import pytest

from bench import bench_codec_paths


def test_every_step_is_measured(capsys: pytest.CaptureFixture[str]) -> None:
    assert (
        bench_codec_paths.main(["--records", "20", "--rounds", "1", "--min-seconds", "0.001"]) == 0
    )
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| ")][1:]
    names = [row.split("|")[1].strip() for row in rows]
    for step in (
        "kio decode + re-encode",
        "scan + splice",
        "scan_produce_offsets",
        "check_batch (in place)",
        "filter_produce pii-mask",
        "filter_fetch pii-mask",
    ):
        assert any(step in name for name in names), step
    assert all(float(row.split("|")[2]) > 0 for row in rows)
