"""The Rust SDK as a Cargo package: a filter crate that depends on it by path builds offline
with the cargo next to the rustc `sluice filter build` uses, as docs/WRITING_FILTERS.md
section 4 shows, and the module does what the same source built by `sluice filter build` does."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

from sluice.filters.build import SDK_DIR, build_filter, find_rustc
from sluice.filters.config import FilterSpec
from sluice.filters.context import FilterRecord, RecordContext
from sluice.filters.runtime import load_filter

GUIDE = Path(__file__).resolve().parents[3] / "docs" / "WRITING_FILTERS.md"
UPPER_RS = Path(__file__).resolve().parents[3] / "filters" / "examples" / "upper-rust"


def test_cargo_builds_a_filter_against_the_sdk_package(tmp_path: Path) -> None:
    (manifest,) = re.findall(r"```toml\n(.*?)```", GUIDE.read_text(), flags=re.DOTALL)
    manifest = manifest.replace("<the Sluice checkout>/filters/sdk/rust",
                                str(SDK_DIR / "rust"))
    (tmp_path / "Cargo.toml").write_text(manifest)
    (tmp_path / "filter.rs").write_text((UPPER_RS / "filter.rs").read_text())
    rustc = find_rustc()
    cargo = Path(rustc).with_name("cargo")
    env = dict(os.environ, RUSTC=rustc, CARGO_HOME=str(tmp_path / "cargo-home"))
    proc = subprocess.run([str(cargo), "build", "--offline", "--release", "--target",
                           "wasm32-unknown-unknown"], cwd=tmp_path, env=env,
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    built = tmp_path / "target" / "wasm32-unknown-unknown" / "release" / "redact_ssn.wasm"
    ctx = RecordContext("t", 0, "produce", "c", "p")
    records = [FilterRecord(0, 0, b"k", b"ab\xc3\xa9", []), FilterRecord(1, 0, None, None, [])]
    reference = build_filter(UPPER_RS, tmp_path / "reference.wasm")
    results = []
    for module in (built, reference):
        f = load_filter(FilterSpec(name="u", module=str(module)))
        res = f.run_batch(ctx, records)
        results.append(([(d.action, d.value) for d in res.decisions], res.detector_counts))
        f.close()
    assert results[0] == results[1]
    assert results[0][0][0][1] == b"AB\xc3\xa9"
