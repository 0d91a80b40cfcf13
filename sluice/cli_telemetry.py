"""The ``sluice telemetry`` subcommand: the telemetry key that authenticates telemetry.

    sluice telemetry keygen FILE [--force]     write a new key (mode 0600), print its id
    sluice telemetry key-id FILE               print the id of the key in FILE

The proxies name the file in ``telemetry: {key_file: FILE}`` and tag everything they write
with it; ``sluice audit --telemetry-key FILE`` trusts it (docs/TELEMETRY.md, "Authenticated
telemetry"). The key itself is never printed. Exit status: 0 done, 2 usage error or a file
that cannot be written or is not a key.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "telemetry", help="make the key that authenticates telemetry",
        description="Make or inspect the telemetry key: the proxies tag their telemetry with "
                    "it, the audit job verifies the tags (docs/TELEMETRY.md).")
    sub = parser.add_subparsers(dest="telemetry_command", metavar="ACTION")
    parser.set_defaults(func=lambda _args: _usage(parser))
    keygen = sub.add_parser("keygen", help="write a new telemetry key to FILE",
                            description="Write 32 random bytes (as hex) to FILE, readable by "
                                        "its owner only, and print the key's id.")
    keygen.add_argument("file", type=Path, metavar="FILE")
    keygen.add_argument("--force", action="store_true", help="replace FILE if it exists")
    keygen.set_defaults(func=_keygen)
    show = sub.add_parser("key-id", help="print the id of the key in FILE",
                          description="Print the id that tags made with the key in FILE carry.")
    show.add_argument("file", type=Path, metavar="FILE")
    show.set_defaults(func=_key_id)


def _usage(parser: argparse.ArgumentParser) -> int:
    parser.print_help(sys.stderr)
    return 2


def _keygen(args: argparse.Namespace) -> int:
    from sluice.telemetry_schema.integrity import new_key, write_key

    key = new_key()
    try:
        write_key(args.file, key, force=args.force)
    except FileExistsError:
        print(f"sluice telemetry keygen: {args.file}: exists (--force replaces it, and "
              "telemetry tagged with the old key then needs the old file to verify)",
              file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"sluice telemetry keygen: {args.file}: {exc.strerror or exc}", file=sys.stderr)
        return 2
    print(f"telemetry key {key.key_id} written to {args.file}")
    return 0


def _key_id(args: argparse.Namespace) -> int:
    from sluice.telemetry_schema.integrity import TelemetryKeyError, load_key

    try:
        key = load_key(args.file)
    except TelemetryKeyError as exc:
        print(f"sluice telemetry key-id: {exc}", file=sys.stderr)
        return 2
    print(key.key_id)
    return 0
