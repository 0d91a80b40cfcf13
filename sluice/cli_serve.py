"""The ``sluice serve`` subcommand: run the proxy in the foreground."""

from __future__ import annotations

from typing import Any


def register(subparsers: Any) -> None:
    del subparsers  # filled in with the proxy core
