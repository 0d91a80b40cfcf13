"""Command-line options of the audit job, shared by ``sluice audit`` and spark-submit.

Kept free of pyspark imports so that building the ``sluice`` CLI stays fast and works
without the ``spark`` extra installed.
"""

from __future__ import annotations

import argparse


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--telemetry",
        required=True,
        metavar="PATH",
        help="telemetry directory or any Spark path (s3a://, hdfs://), or kafka://HOST:PORT/TOPIC",
    )
    parser.add_argument(
        "--config",
        default=None,
        metavar="FILE",
        help="the proxy's config file: its upstream_tls: and upstream_sasl: secure the "
        "connection of a kafka:// --telemetry (python reader)",
    )
    parser.add_argument(
        "--out",
        required=True,
        metavar="DIR",
        help="output folder for reports: a local path or a Hadoop filesystem URL "
        "(file://, s3a://, hdfs://)",
    )
    parser.add_argument(
        "--master",
        default=None,
        metavar="URL",
        help="Spark master (default: local[*], or what spark-submit set)",
    )
    parser.add_argument(
        "--from",
        dest="time_from",
        default=None,
        metavar="T",
        help="only events at or after T (ISO-8601, date, or epoch ms; UTC if no zone)",
    )
    parser.add_argument(
        "--to", dest="time_to", default=None, metavar="T", help="only events before T"
    )
    parser.add_argument(
        "--input-format",
        choices=("auto", "columnar", "json"),
        default="auto",
        help="read the Parquet datasets and JSON Lines files found (auto, the default), or "
        "only one of them",
    )
    parser.add_argument(
        "--glob",
        default="*.jsonl",
        help="JSON Lines file names to read inside a telemetry directory (default *.jsonl; "
        "'' = every file that is not Parquet)",
    )
    parser.add_argument(
        "--kafka-reader",
        choices=("python", "spark"),
        default="python",
        help="for kafka:// sources: the built-in Python reader (default; reads Arrow and JSON "
        "messages) or Spark's Kafka connector (JSON messages only; needs its jar)",
    )
    parser.add_argument(
        "--dedupe",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="also drop repeated event ids across different files (a copy of one file is "
        "always read once; kafka:// input is always de-duplicated)",
    )
    parser.add_argument(
        "--telemetry-key",
        action="append",
        default=[],
        metavar="FILE",
        help="a telemetry key file (sluice telemetry keygen) whose tags to trust; repeatable "
        "(old and new key during a rotation). Only files and messages whose tag verifies "
        "reach the reports; the others are counted. Without it nothing is verified",
    )
    parser.add_argument(
        "--html",
        default=None,
        metavar="FILE",
        help="where to write the HTML summary (default OUT/report.html)",
    )
    parser.add_argument(
        "--conf",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="extra Spark setting (repeatable), e.g. --conf spark.driver.memory=8g",
    )


def parse_conf(items: list[str]) -> dict[str, str]:
    conf: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ValueError(f"--conf {item!r}: expected KEY=VALUE")
        conf[key.strip()] = value
    return conf
