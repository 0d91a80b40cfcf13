"""`python -m sluice.filters.bench --only languages` runs the seven builds of `upper` side by side
(and `--only builtins` builtin:rules against builtin:pii-mask)
(a smoke run: what it measures is reported, never asserted on)."""

from __future__ import annotations

import json

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
    assert sorted(rows) == ["pii-mask", "rules"]
    for row in rows.values():
        assert row["native_call_records_per_s"] > 0 and row["native_path_records_per_s"] > 0
    assert rows["rules"]["native_path_vs_pii_mask"] > 0
