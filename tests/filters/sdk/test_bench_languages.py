"""`python -m sluice.filters.bench --only languages` runs the seven builds of `upper` side by side
(and `--only builtins` builtin:rules against builtin:pii-mask)
(a smoke run: what it measures is reported, never asserted on)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sluice.filters import bench


def test_languages_report_has_every_sdk_and_path(capsys: pytest.CaptureFixture[str]) -> None:
    assert bench.main(["--only", "languages", "--quick"]) == 0
    report = json.loads(capsys.readouterr().out)["languages"]
    assert sorted(report) == ["assemblyscript", "c", "go", "js", "python", "rust", "zig"]
    for lang, row in report.items():
        for path in ("decoding_path", "native_call", "native_path", "decoding_pipeline"):
            assert row[f"{path}_records_per_s"] > 0, (lang, path)
        assert row["pipeline_native_over_decoding"] > 0, lang
        assert row["module_bytes"] > 0
        assert row["compile_ms"] > 0 and row["first_call_ms"] > 0
    assert report["c"]["native_path_vs_c"] == 1.0


def test_builtins_report_rules_against_pii_mask(capsys: pytest.CaptureFixture[str]) -> None:
    assert bench.main(["--only", "builtins", "--quick"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert "languages" not in report
    rows = report["builtins"]
    assert sorted(rows) == ["load_average_after", "load_average_before", "pii-mask", "rules"]
    assert len(rows["load_average_before"]) == 3
    for name in ("pii-mask", "rules"):
        for key in ("native_call", "native_path"):
            assert rows[name][f"{key}_records_per_s"] > 0
            assert rows[name][f"{key}_cpu_records_per_s"] > 0
    for key in ("native_call", "native_path", "native_call_cpu", "native_path_cpu"):
        assert rows["rules"][f"{key}_vs_pii_mask"] > 0


def test_builtins_baseline_runs_in_the_same_turns(capsys: pytest.CaptureFixture[str]) -> None:
    # The module builtin:rules replaced answers the bench batch the same way: it may join.
    old = Path(__file__).resolve().parents[1] / "builtin" / "data" / "rules-tree-reference.wasm"
    assert bench.main(["--only", "builtins", "--quick", "--baseline", str(old)]) == 0
    rows = json.loads(capsys.readouterr().out)["builtins"]
    assert rows["rules-baseline"]["native_call_cpu_vs_pii_mask"] > 0
    assert rows["rules-baseline"]["native_path_records_per_s"] > 0


def test_a_filters_warning_during_the_run_goes_to_stderr_not_into_the_report(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A call past its deadline on a loaded machine logs `filter_failure` (filters/runtime.py):
    # stdout must still hold only the JSON report.
    from sluice.filters import runtime

    def languages(seconds: float, tmp: Path) -> dict[str, float]:
        runtime.log.warning("filter_failure", filter="upper-c", kind="timeout")
        return {"c": 1.0}

    monkeypatch.setattr(bench, "bench_languages", languages)
    assert bench.main(["--only", "languages", "--quick"]) == 0
    out, err = capsys.readouterr()
    assert json.loads(out)["languages"] == {"c": 1.0}
    assert "filter_failure" in err
