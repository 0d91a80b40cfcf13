"""The ``sluice audit`` subcommand: run the PySpark audit and billing job over telemetry."""

from __future__ import annotations

import argparse
from pathlib import Path
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


def read_security(path: str) -> dict[str, str]:
    """librdkafka settings of a proxy config file's upstream_tls:/upstream_sasl: (ValueError
    naming the file, line and field of a mistake), for ``--config``."""
    from sluice.proxy.net.kafka_settings import cluster_settings
    from sluice.proxy.ops.config import ConfigFileError
    from sluice.proxy.ops.config_load import build_config

    try:
        # Only the cluster sections matter; the addresses are placeholders.
        config = build_config(("127.0.0.1", 0), [("127.0.0.1", 9092)], Path(path))
    except ConfigFileError as exc:
        raise ValueError(f"--config: {exc}") from None
    return cluster_settings(config)


def run(args: argparse.Namespace) -> int:
    try:
        from sluice.spark_audit.job import run_from_args
    except ImportError as exc:
        print(f"sluice audit: needs pyspark and pyarrow (pip install 'sluice[spark]'): {exc}")
        return 2
    return run_from_args(args, read_security)
