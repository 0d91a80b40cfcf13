"""The ``sluice serve`` subcommand: run the proxy in the foreground.

Contract (tests and bench rely on it): ``sluice serve --listen HOST:PORT --upstream HOST:PORT
[--config FILE]`` prints one line containing ``listening`` when ready and stops cleanly on
SIGTERM or Ctrl-C.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from sluice.proxy.net.hostport import parse_hostport


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "serve",
        help="run the proxy in the foreground",
        description="Run the Kafka proxy. Clients bootstrap at --listen; each broker node gets "
        "its own port after it (listen port + 1, + 2, ...) unless node_ports are configured.",
    )
    p.add_argument(
        "--listen", required=True, metavar="HOST:PORT", help="bootstrap address clients connect to"
    )
    p.add_argument(
        "--upstream",
        required=True,
        metavar="HOST:PORT",
        help="bootstrap address of the real Kafka cluster (comma-separated for several)",
    )
    p.add_argument(
        "--config", type=Path, metavar="FILE", help="YAML config file (filters, telemetry, ...)"
    )
    p.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    p.add_argument(
        "--advertised-host",
        metavar="HOST",
        help="host name clients are told to reach the proxy at (overrides proxy.advertised_host; "
        "default: the --listen host, or 127.0.0.1 when listening on all interfaces)",
    )
    p.add_argument(
        "--workers",
        type=int,
        default=1,
        metavar="N",
        help="run N proxy processes sharing the listening ports (SO_REUSEPORT) to use N cores; "
        "the limits and metrics port apply per worker (worker k serves metrics on port + k)",
    )
    p.set_defaults(func=run_serve)


def run_serve(args: argparse.Namespace) -> int:
    from sluice.proxy.ops.app import run
    from sluice.proxy.ops.config_load import ConfigFileError, build_config
    from sluice.proxy.telemetry.logs import configure_logging

    configure_logging(args.log_level)
    try:
        listen = parse_hostport(args.listen, "--listen")
        upstream = [parse_hostport(u, "--upstream") for u in args.upstream.split(",") if u.strip()]
        config = build_config(listen, upstream, args.config)
        config.workers = args.workers
        if args.advertised_host:
            config.advertised_host = args.advertised_host
        if args.workers < 1:
            raise ValueError(f"--workers {args.workers}: must be at least 1")
        if args.workers > 1 and listen[1] == 0:
            raise ValueError("--workers needs a fixed --listen port (not 0)")
    except (ValueError, ConfigFileError) as exc:
        print(f"sluice serve: {exc}", file=sys.stderr)
        return 2
    if config.workers > 1:
        from sluice.proxy.ops.workers import supervise

        return supervise(config)
    try:
        return run(config)
    except ConfigFileError as exc:
        print(f"sluice serve: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"sluice serve: cannot listen on {args.listen}: {exc.strerror}", file=sys.stderr)
        return 1
