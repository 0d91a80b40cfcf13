"""Every entry of the Kafka 3.9 smoke list (tests/harness/kafka39_smoke.py) still names a test:
a renamed or removed test would otherwise shrink the 3.9 run without anyone noticing."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.harness import kafka39_smoke

ROOT = Path(__file__).resolve().parents[1]


def test_every_smoke_entry_selects_a_test() -> None:
    env = dict(os.environ, SLUICE_E2E_BROKER="kafka39")
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
         "-m", kafka39_smoke.MARKER, *kafka39_smoke.files()],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120, check=False,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    ids = [line for line in proc.stdout.splitlines() if "::" in line]
    unmatched = [e for e in kafka39_smoke.SMOKE if not any(kafka39_smoke.selected_by(e, i)
                                                          for i in ids)]
    assert not unmatched, f"smoke entries that select no test: {unmatched}"
    assert len(ids) >= len(kafka39_smoke.SMOKE)
