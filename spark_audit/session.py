"""Getting a SparkSession for the audit job: local by default, any master on request.

PySpark starts Python workers with ``PYSPARK_PYTHON``; pointing it at the interpreter that
runs the job (``sys.executable``) means the workers see the same packages (pyarrow,
confluent-kafka, sluice) without users setting anything. On a cluster, executors must have
those packages too (or receive them with ``--py-files`` / an archive).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping

from pyspark.sql import SparkSession

from sluice.spark_audit import class_archive

APP_NAME = "sluice-audit"

# Settings that suit a small local run; a cluster's spark-defaults or --conf override them.
LOCAL_DEFAULTS: dict[str, str] = {
    "spark.driver.memory": "4g",
    "spark.sql.shuffle.partitions": "8",
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.execution.arrow.pyspark.enabled": "true",
    # Local mode stays on loopback: no driver port on an external interface.
    "spark.driver.host": "127.0.0.1",
    "spark.driver.bindAddress": "127.0.0.1",
}

JAVA_OPTIONS = "spark.driver.extraJavaOptions"
# The JVM only ferries bytes between the job's Python tasks and the driver here: its
# optimising JIT compiler cost more CPU than it saved. Measured on the 10M-event bench data,
# four runs each: session start 7.3-8.1 s instead of 9.5-11.2 s, a cold run 6.5-7.6 s
# (10.5-12.0 CPU s) instead of 7.2-8.8 s (11.9-15.3 CPU s), warm runs alike. Old JSON Lines
# telemetry, parsed by Spark SQL in the JVM, reads as fast on a first run and slower after
# (100,000 events: 21-22 s instead of 14-16 s on a second run in a session). Local mode adds
# the class archive's options when there is one (``class_archive``).
LOCAL_JAVA_OPTIONS = "-XX:TieredStopAtLevel=1"

# Settings for any master that a --conf overrides: the Python workers fork from a daemon that
# imports pyspark from the installed package instead of Spark's zip (``python_daemon``).
DEFAULTS: dict[str, str] = {
    "spark.python.daemon.module": "sluice.spark_audit.python_daemon",
}

ALWAYS: dict[str, str] = {
    # Billing hours and report times are UTC whatever the machine's zone.
    "spark.sql.session.timeZone": "UTC",
    "spark.sql.sources.partitionOverwriteMode": "static",
}


def local_defaults() -> dict[str, str]:
    """``LOCAL_DEFAULTS`` and the driver JVM's options (``LOCAL_JAVA_OPTIONS``, and those of
    the class archive if it was recorded)."""
    java = f"{LOCAL_JAVA_OPTIONS} {class_archive.use_options()}".strip()
    return {**LOCAL_DEFAULTS, JAVA_OPTIONS: java}


def prepare_python_env() -> None:
    """Make Spark's Python workers use this interpreter unless the user chose another."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)


def get_session(
    master: str | None = None, conf: Mapping[str, str] | None = None
) -> tuple[SparkSession, bool]:
    """The active session if there is one, else a new one; returns (session, created_here).

    ``master`` None means: whatever spark-submit configured, else ``local[*]``.
    """
    prepare_python_env()
    active = SparkSession.getActiveSession()
    if active is not None:
        for key, value in (conf or {}).items():
            try:
                active.conf.set(key, value)
            except Exception:  # static settings cannot change on a running session
                continue
        for key, value in ALWAYS.items():
            active.conf.set(key, value)
        return active, False
    builder = SparkSession.builder.appName(APP_NAME)
    # Under spark-submit the JVM already runs with its --master and --conf settings.
    under_submit = "PYSPARK_GATEWAY_PORT" in os.environ
    effective_master = master or ("" if under_submit else "local[*]")
    if effective_master:
        builder = builder.master(effective_master)
    if effective_master.startswith("local"):
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
        for key, value in local_defaults().items():
            if key not in (conf or {}):
                builder = builder.config(key, value)
    for key, value in {**DEFAULTS, **ALWAYS, **dict(conf or {})}.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    return spark, True
