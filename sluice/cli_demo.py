"""The ``sluice demo`` subcommand: the main job on an embedded default."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "demo",
        help="run a local broker, the proxy with the shipped filters, traffic and the audit job",
        description="Start the bundled Tansu broker (or Apache Kafka: --broker kafka) and the "
        "proxy with pii-mask, a fetch-side "
        "mask and topic-policy; send traffic with PII from real clients; show records as "
        "produced, stored and consumed; try a denied topic; run the audit job; print where "
        "the HTML report is. Everything it starts is stopped at the end, also on Ctrl-C.",
    )
    p.add_argument(
        "--out",
        type=Path,
        default=Path("sluice-demo-out"),
        help="folder for the config, proxy log, telemetry and reports (default: %(default)s)",
    )
    p.add_argument(
        "--records", type=int, default=500, help="payment events to produce (default: %(default)s)"
    )
    p.add_argument(
        "--broker",
        choices=("tansu", "kafka"),
        default="tansu",
        help="the local broker: the bundled Tansu (default, starts in a fraction of a second) "
        "or one Apache Kafka node from the jars `bash scripts/dev.sh install` fetched",
    )
    p.add_argument("--skip-audit", action="store_true", help="stop after the traffic (no Spark)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from sluice.demo import demo_banner, run_demo

    if args.records < 5:
        print("sluice demo: --records must be at least 5", file=sys.stderr)
        return 2
    print(demo_banner(), flush=True)
    try:
        return run_demo(args.out, args.records, args.skip_audit, args.broker)
    except KeyboardInterrupt:
        print("\ninterrupted: every process the demo started has been stopped", file=sys.stderr)
        return 130
    except Exception as exc:  # a demo failure is reported, with its cause, not as a traceback
        print(f"sluice demo: failed: {exc}", file=sys.stderr)
        return 1
