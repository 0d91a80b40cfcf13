"""The ``sluice`` command: one argparse tree whose subcommands live in their own modules.

Each ``sluice.cli_*`` module exposes ``register(subparsers)``, which adds its subcommand(s)
and sets ``func`` on the parser; ``func(args)`` returns the process exit code.

Exit codes (documented in docs/CONFIGURATION.md): 0 success, 1 runtime failure, 2 usage or
configuration error, 130 interrupted.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from sluice import __version__

_SUBCOMMAND_MODULES = (
    "sluice.cli_serve",
    "sluice.cli_filter",
    "sluice.cli_audit",
    "sluice.cli_config",
    "sluice.cli_demo",
    "sluice.cli_transform",
    "sluice.cli_keys",
    "sluice.cli_telemetry",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="sluice",
        description="Kafka wire-protocol proxy with a WebAssembly filter chain.",
    )
    parser.add_argument("--version", action="version", version=f"sluice {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in _SUBCOMMAND_MODULES:
        module = importlib.import_module(name)
        module.register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    func = getattr(args, "func", None)
    if func is None:
        parser.print_help()
        return 2
    try:
        return int(func(args))
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
