"""Running a real transform against the real broker until it has copied every input record,
for the tests that check what it wrote (records, telemetry, the audit job's report)."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from confluent_kafka import Producer

from sluice.proxy import telemetry
from sluice.transforms.config import TransformSpec, load_transform_specs
from sluice.transforms.supervisor import TransformSupervisor
from tests.e2e.clients import QUIET, create_topic, unique
from tests.transforms.runner_proc import write_config


def produce_numbered(bootstrap: str, topic: str, n: int, partitions: int) -> None:
    """Record i: key ``key-i``, value ``value i``, partition i % partitions, timestamp and
    headers derived from i (so input partition i % 2 holds input offset i // 2 for 2)."""
    producer = Producer({"bootstrap.servers": bootstrap, **QUIET})
    for i in range(n):
        producer.produce(topic, f"value {i}".encode(), f"key-{i}".encode(),
                         partition=i % partitions, timestamp=1_700_000_000_000 + i,
                         headers=[("trace", f"t{i}".encode()), ("empty", None)])
    assert producer.flush(15) == 0


def wait_for(predicate: Callable[[], bool], timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.2)
    raise AssertionError("condition not met in time")


@dataclass
class CompletedRun:
    src: str
    dst: str
    spec: TransformSpec
    status: Any  # the transform's status snapshot once it had copied every record
    sink: Any  # the telemetry sink it wrote to (closed), under tmp_path / "tel"


def run_exactly_once_upper(bootstrap: str, tmp_path: Path, n: int = 300) -> CompletedRun:
    """``n`` numbered records on a 2-partition input, transformed exactly-once in batches of
    50 into a 3-partition output (the counts differ: records go by key, and records of both
    inputs meet in each output), with telemetry in the default (Parquet) sink."""
    src, dst = unique("lower"), unique("upper")
    create_topic(bootstrap, src, 2)
    create_topic(bootstrap, dst, 3)
    produce_numbered(bootstrap, src, n, 2)
    config = write_config(tmp_path, unique("t"), [src], dst, guarantee="exactly-once",
                          batch_records=50)
    spec = load_transform_specs(config)[0]
    info = telemetry.proxy_info()
    sink = telemetry.make_sink({"dir": str(tmp_path / "tel")}, info.instance_id, proxy=info)
    supervisor = TransformSupervisor([spec], bootstrap, sink=sink, info=info)
    supervisor.prepare()
    supervisor.start()
    try:
        wait_for(lambda: supervisor.statuses()[0].snapshot().total_lag == 0
                 and supervisor.statuses()[0].snapshot().records_in == n)
        status = supervisor.statuses()[0].snapshot()
    finally:
        supervisor.stop()
        sink.close(timeout=5)
    return CompletedRun(src, dst, spec, status, sink)
