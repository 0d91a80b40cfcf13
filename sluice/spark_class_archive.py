"""Record the driver JVM's class archive (``class_archive``) for this Python environment.

    python -m sluice.spark_class_archive [--force] [--to PATH]

Runs a small audit job in local mode (a filter load and a few record batches, written by the
proxy's own Parquet sink to a temporary folder) in a JVM that writes the classes it loaded when it
exits, then moves the archive into place. ``scripts/dev.sh`` runs it when it installs or
updates the virtualenv. Without ``--force`` an existing archive is kept; ``--to`` records to
another path than the one sessions use (``class_archive.archive_path``).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from sluice.proxy import telemetry
from sluice.spark_audit.class_archive import archive_path, record_options
from sluice.spark_audit.job import run_audit
from sluice.spark_audit.session import JAVA_OPTIONS, LOCAL_JAVA_OPTIONS, get_session

# How long the JVM may take to write the archive (about 118 MB) when it exits, in seconds.
EXIT_TIMEOUT_S = 300


def write_telemetry(directory: Path) -> None:
    """A filter load and three record batches through the proxy's Parquet sink: the job runs
    its Spark job, its merge and its reports on them as on real telemetry (which Java classes
    load does not depend on how much data there is)."""
    info = telemetry.ProxyInfo(host="record-classes", pid=1, instance_id="record-classes")
    sink = telemetry.make_sink({"dir": str(directory)}, info.instance_id, proxy=info)
    module = "0" * 64
    sink.emit(telemetry.filter_loaded_event(info, name="pii", module_sha256=module,
                                            topics=["orders"], apply_to={"produce"}))
    for i in range(3):
        sink.emit(telemetry.record_batch_event(
            info, connection_id="c-1", client_address="127.0.0.1:1", client_id="app",
            principal=None, api="produce", topic="orders", partition=0,
            offset_first=10 * i, offset_last=10 * i + 9, records_in=10, records_out=10,
            bytes_in=1000, bytes_out=1000,
            filters=[telemetry.filter_entry("pii", module, kept=9, rewritten=1,
                                            detectors={"email": 1}, time_ns=1000)]))
    sink.close(timeout=30)


def _stop_jvm(spark: Any) -> None:
    """Stop the session and wait for its JVM to exit: it writes the archive on its way out
    (it exits when its standard input closes)."""
    gateway = spark.sparkContext._gateway
    spark.stop()
    proc = getattr(gateway, "proc", None)
    if proc is None:
        raise RuntimeError("the session's JVM was not started by this process")
    gateway.shutdown()
    if proc.stdin is not None:
        proc.stdin.close()
    proc.wait(timeout=EXIT_TIMEOUT_S)


def record(target: Path) -> float:
    """Record the archive to ``target``; returns the seconds it took."""
    started = time.perf_counter()
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    partial.unlink(missing_ok=True)
    with tempfile.TemporaryDirectory(prefix="sluice-record-classes-") as work:
        write_telemetry(Path(work) / "telemetry")
        spark, created = get_session(
            "local[*]",
            {JAVA_OPTIONS: f"{LOCAL_JAVA_OPTIONS} {record_options(partial)}"})
        if not created:
            raise RuntimeError("a Spark session is already running in this process")
        run_audit(str(Path(work) / "telemetry"), str(Path(work) / "report"))
        _stop_jvm(spark)
    if not partial.is_file():
        raise RuntimeError(f"the JVM wrote no class archive at {partial}")
    partial.replace(target)
    return time.perf_counter() - started


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--force", action="store_true", help="record again if it exists")
    parser.add_argument("--to", type=Path, default=None,
                        help="where to write it (default: where sessions look for it)")
    args = parser.parse_args(argv)
    target = args.to or archive_path()
    if target.is_file() and not args.force:
        print(f"class archive: {target} (kept; --force records it again)")
        return 0
    seconds = record(target)
    print(f"class archive: recorded {target} ({target.stat().st_size / 1e6:.0f} MB) "
          f"in {seconds:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
