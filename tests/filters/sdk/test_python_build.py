"""What goes into a Python filter's component: the filter, the SDK and CPython's standard
library, nothing of the machine that builds it."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from sluice.filters.build import BuildError, build_filter

MARKER = "sluice_builder_only_marker"


def test_the_builders_site_packages_are_not_bundled(tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """componentize-py appends a site-packages to the guest's path: $VIRTUAL_ENV's, else the
    one that `python3` on $PATH names. A package that only the builder's python3 has must not
    end up in the module (it used to: the build walked and mounted that whole directory)."""
    site = tmp_path / "site-packages"
    site.mkdir()
    (site / f"{MARKER}.py").write_text("VALUE = 1\n")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "python3"
    # What `python3 -c 'import site; ...'` prints for componentize-py: the site directories.
    fake.write_text(f"#!/bin/sh\necho '{site}'\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.delenv("VIRTUAL_ENV", raising=False)

    src = tmp_path / "filt"
    src.mkdir()
    (src / "filter.py").write_text(
        f"import {MARKER}  # noqa: F401\n"
        "import sluice_filter as sluice\n\n\n"
        "@sluice.on_record\n"
        "def f(rec):\n"
        "    return sluice.keep()\n")
    with pytest.raises(BuildError, match=f"No module named '{MARKER}'"):
        build_filter(src, tmp_path / "out.wasm")
