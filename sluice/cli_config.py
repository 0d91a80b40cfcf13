"""The `sluice config` subcommand (not implemented yet)."""

from __future__ import annotations

import argparse
from typing import Any


def register(subparsers: Any) -> None:
    del subparsers  # filled in by the issue that builds `sluice config`


def _unused(args: argparse.Namespace) -> int:
    return 2
