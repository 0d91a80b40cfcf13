"""bench.request_cpu: `--baseline DIR` runs the other side's `sluice serve` from that source
tree (bench/baseline.py), beside this checkout's."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

from bench import baseline, request_cpu


def test_a_baseline_proxy_runs_the_given_tree(tmp_path: Path) -> None:
    root = Path(__file__).resolve().parents[2]
    tree = tmp_path / "tree"
    for entry in ("sluice", *baseline.ROOMS):
        shutil.copytree(root / entry, tree / entry,
                        ignore=shutil.ignore_patterns("__pycache__", "*.so"))
    source = baseline.prepare(tree)
    # No broker behind it: `sluice serve` listens all the same, and dials upstream per client.
    proxy = request_cpu.Proxy(sys.executable, "127.0.0.1:1", None, source)
    try:
        maps = Path(f"/proc/{proxy.process.pid}/maps").read_text(encoding="ascii", errors="replace")
    finally:
        proxy.stop()
    # The native records check is loaded by the codec, which `sluice serve` imports: from the
    # tree's copy, built there by `prepare`, not from this checkout.
    loaded = {line.split()[-1] for line in maps.splitlines() if line.endswith(".so")}
    assert any(Path(p).is_relative_to(tree.resolve()) for p in loaded), sorted(loaded)
    assert not any(Path(p).is_relative_to(root / "codec") for p in loaded)


def test_other_and_baseline_together_are_refused(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        request_cpu.main(["--other", sys.executable, "--baseline", "."])
    assert exc.value.code == 2
    assert "give one" in capsys.readouterr().err
