"""The ``sluice config`` subcommand: check a config file the way ``sluice serve`` loads it.

    sluice config check FILE [--json]

Loads FILE with the proxy's own loader, loads every filter module (so a module that does not
compile, or whose ``config`` its ``sluice_init`` refuses, fails here and not at start-up),
validates ``telemetry:`` and ``fleet:`` without opening files or connections, and prints a
summary. Exit status 0 when the file is usable, 2 (with ``FILE:LINE: FIELD: reason`` on
stderr) when it is not.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from sluice.proxy.ops.reload import error_fields


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "config", help="check a proxy config file",
        description="Work with the proxy's YAML config file (see docs/CONFIGURATION.md).")
    sub = parser.add_subparsers(dest="config_command", metavar="ACTION")
    parser.set_defaults(func=lambda _args: _usage(parser))
    check = sub.add_parser(
        "check", help="validate a config file and load its filters, without serving",
        description="Load FILE exactly as `sluice serve --config FILE` would: parse and "
                    "validate every section, load and initialise every filter module, check "
                    "the telemetry and fleet settings (without opening files or connections), "
                    "then print a summary. Exit status 0: usable; 2: not (the message names "
                    "the file, line and field).")
    check.add_argument("file", type=Path, metavar="FILE", help="the YAML config file")
    check.add_argument("--json", action="store_true",
                       help="print the summary (or the error) as one JSON object")
    check.set_defaults(func=cmd_check)


def _usage(parser: argparse.ArgumentParser) -> int:
    parser.print_help(sys.stderr)
    return 2


def check_file(path: Path) -> dict[str, Any]:
    """Summary of a usable config file; raises ConfigFileError/ConfigError if it is not."""
    from sluice.proxy.ops.app import load_chain
    from sluice.proxy.ops.config import ProxyConfig
    from sluice.proxy.ops.reload import check_telemetry, fleet_settings, load_checked_config

    # listen/upstream come from flags, not the file: placeholders that nothing here dials.
    base = ProxyConfig(listen=("127.0.0.1", 9092), upstream=[("127.0.0.1", 9092)])
    config = load_checked_config(path, base)
    chain = load_chain(config)
    try:
        filters = chain.describe() if chain is not None else []
    finally:
        if chain is not None:
            chain.close()
    specs = {s.name: s for s in config.filters}
    for line in filters:
        line["module"] = specs[str(line["name"])].module
    fleet = fleet_settings(config)
    summary: dict[str, Any] = {
        "file": str(path),
        "ok": True,
        "filters": filters,
        "telemetry": check_telemetry(config.telemetry),
        "fleet": None if fleet is None else {
            "topic": fleet.topic, "bootstrap": fleet.bootstrap or "the --upstream cluster",
            "poll_seconds": fleet.poll_seconds, "heartbeat_seconds": fleet.heartbeat_seconds,
            "startup_wait_seconds": fleet.startup_wait_seconds,
            "create_topic": fleet.create_topic,
            "trusted_key_ids": sorted(fleet.trust().keys),
            "signing_key_id": fleet.signing_key.key_id if fleet.signing_key else None,
            "allow_unsigned": fleet.allow_unsigned},
        "proxy": {"advertised_host": config.advertised_host,
                  "node_ports": {str(k): v for k, v in config.node_ports.items()}},
        "policy_admins": list(config.policy_admins or ()),
        "max_frame_size": config.max_frame_size,
        "module_cache_dir": config.module_cache_dir,
        # Other sections by key name only: their values may hold secrets.
        "sections": {name: sorted(str(k) for k in value) if isinstance(value, dict) else []
                     for name, value in config.raw.items()
                     if name in ("metrics", "tls", "upstream_tls", "upstream_sasl",
                                 "dead_letters", "limits")},
    }
    return summary


def _print(summary: dict[str, Any]) -> None:
    out = sys.stdout
    print(f"{summary['file']}: OK", file=out)
    filters = summary["filters"]
    print(f"filters ({len(filters)}, in chain order"
          f"{'; fleet filters follow' if summary['fleet'] else ''}):"
          if filters else "filters: none in this file", file=out)
    for f in filters:
        print(f"  {f['name']}: {f['module']}  ({f['abi']} ABI)", file=out)
        print(f"    sha256   {f['sha256']}", file=out)
        print(f"    topics   {', '.join(f['topics'])}", file=out)
        print(f"    apply_to {', '.join(f['apply_to'])}   on_error {f['on_error']}", file=out)
    print(f"telemetry: {summary['telemetry']}", file=out)
    fleet = summary["fleet"]
    if fleet is None:
        print("fleet: off", file=out)
    else:
        print(f"fleet: topic {fleet['topic']} at {fleet['bootstrap']} (poll "
              f"{fleet['poll_seconds']:g} s, heartbeat {fleet['heartbeat_seconds']:g} s, "
              f"start-up wait {fleet['startup_wait_seconds']:g} s)", file=out)
        print(f"fleet trust: records signed by key(s) {', '.join(fleet['trusted_key_ids']) or '-'}"
              f"; policies signed by {fleet['signing_key_id'] or 'nobody (no signing_key)'}"
              + ("; UNSIGNED RECORDS ACCEPTED (allow_unsigned)" if fleet["allow_unsigned"]
                 else ""), file=out)
        admins = summary["policy_admins"]
        print("data policies (x-data-policy): "
              + (f"set by {', '.join(admins)}" if admins
                 else "nobody may set them (no policy_admins)"), file=out)
    proxy = summary["proxy"]
    if proxy["advertised_host"] or proxy["node_ports"]:
        ports = ", ".join(f"{k}->{v}" for k, v in proxy["node_ports"].items()) or "automatic"
        print(f"proxy: advertised_host {proxy['advertised_host'] or '(from --listen)'}, "
              f"node_ports {ports}", file=out)
    for name, keys in summary["sections"].items():
        print(f"{name}: {', '.join(keys) if keys else '(empty)'}", file=out)
    if summary["module_cache_dir"]:
        print(f"module_cache_dir: {summary['module_cache_dir']}", file=out)


def cmd_check(args: argparse.Namespace) -> int:
    from sluice.filters.yaml_lines import ConfigError
    from sluice.proxy.ops.config import ConfigFileError

    path: Path = args.file
    try:
        summary = check_file(path)
    except (ConfigFileError, ConfigError) as exc:
        if args.json:
            print(json.dumps({"file": str(path), "ok": False, "error": str(exc),
                              **error_fields(exc)}))
        else:
            print(f"sluice config check: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(summary, default=str))
    else:
        _print(summary)
    return 0
