"""The ``sluice audit`` subcommand: run the PySpark audit and billing job over telemetry."""

from __future__ import annotations

import argparse
from typing import Any

from sluice.spark_audit.options import add_arguments


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "audit",
        help="audit, billing and compliance reports from proxy telemetry (PySpark)",
        description=(
            "Read Sluice telemetry (JSON Lines files, Parquet, or a Kafka topic) and write "
            "audit, billing and compliance reports as Parquet and CSV plus an HTML summary. "
            "Runs Spark in local mode unless --master is given. Needs the 'spark' extra "
            "(pyspark, pyarrow) and Java 17."
        ),
    )
    add_arguments(parser)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    try:
        from sluice.spark_audit.job import run_from_args
    except ImportError as exc:
        print(f"sluice audit: needs pyspark and pyarrow (pip install 'sluice[spark]'): {exc}")
        return 2
    return run_from_args(args)
