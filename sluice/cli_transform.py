"""The ``sluice transform`` subcommand: run the ``transforms:`` of a config file, or list them.

    sluice transform run CONFIG --bootstrap HOST:PORT [--metrics HOST:PORT]
    sluice transform list CONFIG --bootstrap HOST:PORT [--json]

``run`` prints one line containing ``transforms_running`` when every transform has started,
and stops cleanly (finishing the batch in hand, leaving the consumer groups) on SIGTERM or
Ctrl-C. Exit status 2 for a config problem, 1 when a transform cannot start (missing topic,
unreachable broker).
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
from pathlib import Path
from typing import Any

from sluice.proxy.net.hostport import parse_hostport


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "transform", help="run or list transforms (chains writing other topics)",
        description="Transforms read input topics, run a filter chain and write an output "
                    "topic (docs/TRANSFORMS.md).")
    sub = parser.add_subparsers(dest="transform_command", metavar="ACTION")
    parser.set_defaults(func=lambda _args: _usage(parser))
    run = sub.add_parser("run", help="run the config's transforms in the foreground",
                         description="Run every entry of the config's transforms: section "
                                     "until SIGTERM or Ctrl-C.")
    run.add_argument("config", type=Path, metavar="CONFIG", help="the YAML config file")
    run.add_argument("--bootstrap", required=True, metavar="HOST:PORT",
                     help="the Kafka brokers (comma-separated), not the proxy")
    run.add_argument("--metrics", metavar="HOST:PORT",
                     help="serve Prometheus /metrics here (default: the config's "
                          "metrics.listen, if any)")
    run.add_argument("--log-level", default="info",
                     choices=["debug", "info", "warning", "error"])
    run.set_defaults(func=cmd_run)
    lst = sub.add_parser("list", help="show each transform's committed offsets and lag",
                         description="Read each transform's consumer group offsets and the "
                                     "input log ends from Kafka and print the lag per "
                                     "partition.")
    lst.add_argument("config", type=Path, metavar="CONFIG", help="the YAML config file")
    lst.add_argument("--bootstrap", required=True, metavar="HOST:PORT",
                     help="the Kafka brokers (comma-separated), not the proxy")
    lst.add_argument("--json", action="store_true", help="one JSON object per partition")
    lst.set_defaults(func=cmd_list)


def _usage(parser: argparse.ArgumentParser) -> int:
    parser.print_help(sys.stderr)
    return 2


def _load(path: Path, bootstrap: str) -> Any:
    from sluice.proxy.ops.config_load import build_config

    upstream = [parse_hostport(u, "--bootstrap") for u in bootstrap.split(",") if u.strip()]
    config = build_config(("127.0.0.1", 0), upstream, path)
    if not config.transforms:
        raise ValueError(f"{path}: no transforms: section (docs/TRANSFORMS.md)")
    return config


def cmd_run(args: argparse.Namespace) -> int:
    from sluice.filters.runtime import FilterLoadError
    from sluice.proxy import telemetry
    from sluice.proxy.net.kafka_settings import cluster_settings
    from sluice.proxy.ops.config_load import ConfigFileError
    from sluice.proxy.telemetry.logs import configure_logging, log
    from sluice.transforms.supervisor import TransformError, TransformSupervisor

    configure_logging(args.log_level)
    try:
        config = _load(args.config, args.bootstrap)
        metrics_listen = parse_hostport(args.metrics, "--metrics") if args.metrics \
            else config.metrics_listen
        info = telemetry.proxy_info()
        sink = telemetry.make_sink(config.telemetry, info.instance_id, proxy=info,
                                   security=cluster_settings(config))
    except (ValueError, ConfigFileError, telemetry.TelemetryConfigError) as exc:
        print(f"sluice transform run: {exc}", file=sys.stderr)
        return 2
    supervisor = TransformSupervisor(config.transforms, args.bootstrap,
                                     cache_dir=config.module_cache_dir, sink=sink, info=info,
                                     security=cluster_settings(config))
    try:
        supervisor.prepare()
    except (TransformError, FilterLoadError) as exc:
        print(f"sluice transform run: {exc}", file=sys.stderr)
        sink.close(timeout=5)
        return 1
    if metrics_listen is not None:
        from prometheus_client import CollectorRegistry, start_http_server

        registry = CollectorRegistry(auto_describe=False)
        registry.register(supervisor.collector())
        start_http_server(metrics_listen[1], metrics_listen[0], registry)
        log.info("metrics_serving", address=f"{metrics_listen[0]}:{metrics_listen[1]}")
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    supervisor.start()
    log.info("transforms_running", transforms=[s.name for s in config.transforms],
             instance=info.instance_id)
    while not stop.wait(1.0):
        failed = [s for s in supervisor.statuses() if s.state == "failed"]
        if failed and len(failed) == len(supervisor.runners):
            break
    failed_names = [s.name for s in supervisor.statuses() if s.state == "failed"]
    supervisor.stop()
    sink.close(timeout=5)
    log.info("transforms_stopped", failed=failed_names)
    return 1 if failed_names else 0


def cmd_list(args: argparse.Namespace) -> int:
    from sluice.proxy.net.kafka_settings import cluster_settings
    from sluice.proxy.ops.config_load import ConfigFileError
    from sluice.transforms.config import with_security
    from sluice.transforms.listing import format_table, transform_lag
    from sluice.transforms.runner import TransformError

    try:
        config = _load(args.config, args.bootstrap)
    except (ValueError, ConfigFileError) as exc:
        print(f"sluice transform list: {exc}", file=sys.stderr)
        return 2
    try:
        security = cluster_settings(config)
        rows = [row for spec in config.transforms
                for row in transform_lag(with_security(spec, security), args.bootstrap)]
    except TransformError as exc:
        print(f"sluice transform list: {exc}", file=sys.stderr)
        return 1
    if args.json:
        for row in rows:
            print(json.dumps(row.as_dict(), sort_keys=True))
    else:
        print(format_table(rows))
    return 0
