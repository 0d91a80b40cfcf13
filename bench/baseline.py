"""Another source tree of Sluice run next to this checkout, for before/after figures from one
interleaved run (`bench_proxy --baseline DIR`).

    git worktree add /tmp/sluice-base main      # or: git archive COMMIT | tar -x -C DIR
    python -m bench.bench_proxy --workload 1 --variants encrypt --baseline /tmp/sluice-base

The tree is used as it is on disk (its own Python, C and YAML; the same virtualenv and its
packages as this checkout). `prepare` makes a directory holding a `sluice` package whose
rooms are that tree's folders (the layout `pyproject.toml` maps at install), and a
`sitecustomize` that takes the editable install of this checkout off the import path, builds
the tree's native modules (crypto/batch_seal.c, codec/record_check.c, codec/passthrough.c,
filters/epoch_ticker.c, filters/host_sha256.c and filters/native_call.c where the tree has
them) in place, and returns
how to start a process that imports the tree: `sluice serve` runs with that directory on
PYTHONPATH and as its working directory.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

#: The rooms pyproject.toml maps into the `sluice` package (the `sluice` folder itself
#: holds the package's own modules).
ROOMS = ("codec", "crypto", "filters", "proxy", "spark_audit", "telemetry_schema", "transforms")
#: Native modules built at install, by their build scripts' module names.
BUILDS = ("sluice.crypto.batch_seal_build", "sluice.codec.record_check_build",
          "sluice.filters.epoch_ticker_build", "sluice.filters.host_sha256_build",
          "sluice.codec.passthrough_build", "sluice.filters.native_call_build")
_SITECUSTOMIZE = '''"""bench/baseline.py: `sluice` from this directory, not the editable install."""
import sys

sys.meta_path[:] = [f for f in sys.meta_path if "editable" not in getattr(f, "__module__", "")]
'''


@dataclass(frozen=True)
class Source:
    """How to start a process that imports the tree: extra environment and working
    directory (the working directory comes first on `python -m`'s import path)."""

    tree: Path
    env: dict[str, str]
    cwd: Path


def prepare(tree: Path) -> Source:
    """A `Source` for the Sluice source tree at `tree`, with its native modules built."""
    tree = tree.resolve()
    if not (tree / "sluice" / "__init__.py").is_file() or not (tree / "codec").is_dir():
        raise ValueError(f"{tree}: not a Sluice source tree (no sluice/__init__.py, codec/)")
    shim = Path(tempfile.mkdtemp(prefix="sluice-baseline-"))
    package = shim / "sluice"
    package.mkdir()
    for entry in (tree / "sluice").iterdir():
        if entry.name != "__pycache__":
            (package / entry.name).symlink_to(entry)
    for room in ROOMS:
        if (tree / room).is_dir():
            (package / room).symlink_to(tree / room, target_is_directory=True)
    (shim / "sitecustomize.py").write_text(_SITECUSTOMIZE, encoding="utf-8")
    source = Source(tree, {"PYTHONPATH": str(shim)}, shim)
    for module in BUILDS:
        # An older tree may lack a later native module (it then runs without it).
        if not (tree / Path(*module.split(".")[1:])).with_suffix(".py").is_file():
            continue
        # The build scripts write next to their own (resolved) file: into the tree.
        subprocess.run([sys.executable, "-m", module], check=True, cwd=shim,
                       env=dict(os.environ, **source.env), stdout=subprocess.DEVNULL)
    check = subprocess.run(
        [sys.executable, "-c", "import sluice.codec.records as m; print(m.__file__)"],
        check=True, cwd=shim, env=dict(os.environ, **source.env), capture_output=True,
        text=True)
    if not Path(check.stdout.strip()).resolve().is_relative_to(tree):
        raise RuntimeError(f"the baseline imports {check.stdout.strip()}, not {tree}")
    return source
