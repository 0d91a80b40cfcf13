"""Builds `sluice.codec._passthrough`, the pass-through fast path's readers
(codec/passthrough.c), as a CPython extension. Run by ``scripts/dev.sh install``; by hand::

    .venv/bin/python -m sluice.codec.passthrough_build

The compiled module lands next to this file (it is not committed). Without it the Python
readers it stands in for run alone, with the same answers (codec/passthrough.py;
tests/codec/test_passthrough_native.py holds the two to that).
"""

from __future__ import annotations

import sys
from pathlib import Path

from sluice.native_build import build_extension_beside

HERE = Path(__file__).resolve().parent


def main() -> int:
    return build_extension_beside("sluice.codec._passthrough", [HERE / "passthrough.c"], HERE)


if __name__ == "__main__":
    sys.exit(main())
