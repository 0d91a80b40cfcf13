"""The Kafka broker's class-data-sharing archive: recorded once per install of the jars.

Every broker and StorageTool JVM that `sluice/kafka_broker.py` starts maps the archive
(`-XX:SharedArchiveFile`) instead of loading and verifying the same classes from the jars.
Measured on the 2-core machine: a node starts in about 60% of the time and CPU (numbers in
docs/COMPATIBILITY.md). `python -m sluice.kafka_class_archive` records it (`scripts/dev.sh`
does, after installing the jars); a JVM it does not fit (another Java build, other jars)
ignores it and loads classes from the jars as without it.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from sluice.kafka_broker import (
    CLIENT_LISTENERS,
    KafkaCluster,
    KafkaNotInstalled,
    KafkaStartError,
    class_archive_path,
)
from sluice.kafka_security import ADMIN_USER


def record_class_archive() -> Path:
    """Record the class archive: one node started with `-XX:ArchiveClassesAtExit`, a record
    produced and consumed on every client listener (so that TLS and SASL classes are in it
    too), then stopped, which writes the archive. A JVM maps it only if it fits (the same
    JVM build and jars); otherwise it loads classes from the jars as without it."""
    from confluent_kafka import Consumer, Producer

    target = class_archive_path()
    partial = target.with_name(target.name + ".partial")
    partial.unlink(missing_ok=True)
    cluster = KafkaCluster(nodes=1, record_classes_to=partial)
    with cluster:
        for listener in CLIENT_LISTENERS:
            conf = cluster.client_config(listener, None if listener == "PLAINTEXT" else ADMIN_USER)
            producer = Producer({**conf, "log_level": 0})
            producer.produce("sluice.class-archive", value=listener.encode())
            if producer.flush(30):
                raise KafkaStartError(f"recording the class archive: no produce on {listener}")
            consumer = Consumer(
                {**conf, "log_level": 0, "group.id": "archive", "auto.offset.reset": "earliest"}
            )
            consumer.subscribe(["sluice.class-archive"])
            deadline = time.monotonic() + 30
            while consumer.poll(0.5) is None and time.monotonic() < deadline:
                pass
            consumer.close()
        cluster.stop(timeout=60)  # the JVM writes the archive while it exits
    if not partial.is_file():
        raise KafkaStartError(f"the broker wrote no class archive to {partial}")
    partial.replace(target)
    return target


def main(argv: list[str] | None = None) -> int:
    """`python -m sluice.kafka_class_archive` (what scripts/dev.sh runs)."""
    args = sys.argv[1:] if argv is None else argv
    if args:
        print("usage: python -m sluice.kafka_class_archive", file=sys.stderr)
        return 2
    began = time.monotonic()
    try:
        path = record_class_archive()
    except (KafkaNotInstalled, KafkaStartError) as exc:
        print(f"no Kafka class archive: {exc}", file=sys.stderr)
        return 1
    size = path.stat().st_size / 1e6
    print(
        f"Kafka class archive: recorded {path} ({size:.0f} MB) in {time.monotonic() - began:.0f} s"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
