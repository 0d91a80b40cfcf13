"""Wasm modules built from sources under tests/, and compiled modules, once per pytest session.

Several test files build the same probe filters (tests/filters/sdk/probe_*), and under xdist
their workers would each compile them (Go, Rust, AssemblyScript, QuickJS: ~40 s of CPU in
all). The first worker to ask builds a source into a directory all workers of the session
share (the parent of their base temporary directories), holding a lock file; the others wait
on the lock and load the same file. Builds are reproducible (filters/build.py --check holds
the committed modules to it), so a module built by another worker has the bytes this one
would have built.

Compiling a module is the other repeated cost: wasmtime takes ~14 s of CPU for a Python
component (filters/examples/*-py) and 2-3 s for a Go or JavaScript one. `session_module_cache`
is one compiled-module cache directory for the whole session, which the workers share
(filters/module_cache.py compiles a module once between the processes sharing a directory:
one compiles under the artifact's lock file, the others wait and load what it wrote).
"""

from __future__ import annotations

import fcntl
import hashlib
import os
from pathlib import Path

import pytest

from sluice.filters.build import build_filter


def _shared_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    base = tmp_path_factory.getbasetemp()
    # Under xdist a worker's base is <session's base>/popen-gwN.
    session = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base
    d = session / "session-builds"
    d.mkdir(exist_ok=True)
    return d


def built_once(tmp_path_factory: pytest.TempPathFactory, source_dir: Path) -> Path:
    """The module `source_dir` builds to, built by whichever worker of the session asked first."""
    source_dir = source_dir.resolve()
    key = f"{source_dir.name}-{hashlib.sha256(str(source_dir).encode()).hexdigest()[:12]}"
    d = _shared_dir(tmp_path_factory)
    out = d / f"{key}.wasm"
    with open(d / f"{key}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        if not out.is_file():
            # Built beside and renamed: a build that fails leaves no module for the next asker.
            partial = d / f"{key}.partial.wasm"
            build_filter(source_dir, partial)
            partial.rename(out)
    return out


def session_module_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The session's compiled-module cache directory, shared by every worker (and, through
    $SLUICE_MODULE_CACHE set by tests/conftest.py, by the proxies the tests start)."""
    d = _shared_dir(tmp_path_factory) / "module-cache"
    d.mkdir(exist_ok=True)
    return d
