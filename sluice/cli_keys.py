"""The ``sluice keys`` subcommand: list, create, rotate and delete the key-encryption keys that
``builtin:encrypt`` uses, in the KMS named by a config file's ``kms:`` section.

    sluice keys list   --config FILE [--json]
    sluice keys create NAME --config FILE
    sluice keys rotate NAME --config FILE
    sluice keys delete NAME --config FILE --yes

Rotation adds a KEK version used for new data keys; older versions keep decrypting what they
wrapped. Deletion destroys every version of NAME: records encrypted under it can never be read
again (crypto-shredding), so it asks for ``--yes``. With AWS KMS it touches only the keys of
the config's ``alias_prefix``, and AWS makes the deletion final when its 7-day waiting period
ends. A running proxy notices within its filters'
``data_key_cache_seconds``. Exit status: 0 done, 1 the KMS failed or has no such key, 2 usage
or config error. Key material is never printed.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "keys", help="list, create, rotate or delete record-encryption keys",
        description="Manage the key-encryption keys of builtin:encrypt in the KMS of a config "
                    "file's kms: section (docs/ENCRYPTION.md).")
    sub = parser.add_subparsers(dest="keys_command", metavar="ACTION")
    parser.set_defaults(func=lambda _args: _usage(parser))

    def action(name: str, help_text: str, with_name: bool = True) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help_text, description=help_text)
        if with_name:
            p.add_argument("name", metavar="NAME", help="the key's name (config.key)")
        p.add_argument("--config", type=Path, required=True, metavar="FILE",
                       help="the proxy config file whose kms: section names the KMS")
        p.add_argument("--json", action="store_true", help="print JSON")
        p.set_defaults(func=run)
        return p

    action("list", "list keys with their current, live and destroyed versions", False)
    action("create", "create a key (no-op when it exists)")
    action("rotate", "add a key version and make it current; old versions stay readable")
    delete = action("delete", "destroy every version of a key: its records become unreadable "
                              "for good (crypto-shredding)")
    delete.add_argument("--yes", action="store_true",
                        help="confirm: records encrypted under this key become unreadable")


def _usage(parser: argparse.ArgumentParser) -> int:
    parser.print_help(sys.stderr)
    return 2


def _fail(message: str, code: int) -> int:
    print(f"sluice keys: {message}", file=sys.stderr)
    return code


def run(args: argparse.Namespace) -> int:
    from sluice.crypto.kms import KmsError, parse_kms_section
    from sluice.crypto.kms_clients import open_kms
    from sluice.filters.yaml_lines import ConfigError, load_yaml_with_lines

    path: Path = args.config
    try:
        data, lines = load_yaml_with_lines(path)
        raw = data.get("kms") if isinstance(data, dict) else None
        settings = parse_kms_section(raw, lines, path.resolve().parent)
    except ConfigError as exc:
        return _fail(str(exc), 2)
    except OSError as exc:
        return _fail(f"{path}: cannot read config file: {exc.strerror or exc}", 2)
    if settings is None:
        return _fail(f"{path}: no kms: section", 2)
    command = args.keys_command
    if command == "delete" and not args.yes:
        return _fail(f"deleting {args.name!r} makes every record encrypted under it "
                     "unreadable for good; add --yes to confirm", 2)
    try:
        kms = open_kms(settings)
        if command == "list":
            infos = kms.list_keys()
        else:
            infos = [getattr(kms, f"{command}_key")(args.name)]
    except KmsError as exc:
        return _fail(f"{type(exc).__name__}: {exc}", 1)
    if args.json:
        print(json.dumps([i.as_dict() for i in infos], indent=1))
        return 0
    if not infos:
        print(f"no keys in the {settings.type} KMS")
    for info in infos:
        state = f"current {info.current_version}" if info.current_version else "deleted"
        destroyed = (f", destroyed {', '.join(info.destroyed_versions)}"
                     if info.destroyed_versions else "")
        print(f"{info.name}: {state}; versions {', '.join(info.versions) or '-'}{destroyed}")
    return 0
