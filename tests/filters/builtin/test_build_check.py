"""Every committed .wasm under filters/ is what its source builds to (filters/build.py --check)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from sluice.filters.build import BUILTIN_DIR, targets

ROOT = Path(__file__).resolve().parents[3]


def test_targets_cover_builtins_and_examples() -> None:
    names = {t.name for t in targets()}
    assert {"pii-mask", "topic-policy", "json-validate"} <= names
    assert {"enrich", "upper", "connect-functions", "inplace-enrich"} <= names
    assert sorted(p.stem for p in BUILTIN_DIR.glob("*.wasm")) == sorted(
        t.name for t in targets() if t.output.parent == BUILTIN_DIR)


def test_committed_modules_match_their_sources() -> None:
    proc = subprocess.run([sys.executable, str(ROOT / "filters" / "build.py"), "--check"],
                          capture_output=True, text=True, cwd="/")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.count("ok ") == len(targets())
