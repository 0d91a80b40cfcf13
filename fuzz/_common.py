"""Shared set-up for the atheris targets: import path and the run entry point."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def run(test_one_input: Callable[[bytes], None]) -> None:
    """Fuzz `test_one_input` with atheris (libFuzzer flags pass through), or, with
    ``--replay FILE...``, run it once per file (no atheris needed: reproduces a crash)."""
    if "--replay" in sys.argv:
        for name in sys.argv[sys.argv.index("--replay") + 1 :]:
            test_one_input(Path(name).read_bytes())
            print(f"ok {name}")
        return
    import atheris

    atheris.Setup(sys.argv, test_one_input)
    atheris.Fuzz()
