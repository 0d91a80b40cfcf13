"""A transform keeps key, headers and timestamp, picks output partitions by key when the counts
differ, writes telemetry naming input and output offsets and the module version, and runs
inside `sluice serve` with its lag in the proxy's /metrics."""

from __future__ import annotations

import itertools
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
from confluent_kafka import Consumer, TopicPartition

from sluice.codec.partitioner import partition_for_key as key_partition
from sluice.local_broker import free_port
from tests.e2e.clients import QUIET, create_topic, unique
from tests.harness.broker import TansuBroker
from tests.harness.proxy import SluiceProxy
from tests.transforms.committed_log import committed_records
from tests.transforms.live_run import produce_numbered, run_exactly_once_upper, wait_for
from tests.transforms.runner_proc import write_config


def _read(bootstrap: str, topic: str, partitions: int, n: int) -> list[object]:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": unique("r"), **QUIET})
    consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
    out = []
    deadline = time.monotonic() + 30
    while len(out) < n and time.monotonic() < deadline:
        m = consumer.poll(0.2)
        if m is not None and not m.error():
            out.append(m)
    consumer.close()
    return out


def test_records_partitions_and_telemetry(broker: TansuBroker, tmp_path: Path) -> None:
    bs = broker.bootstrap
    n = 300
    run = run_exactly_once_upper(bs, tmp_path, n)  # 2 input partitions, 3 output: by key
    spec, dst, status = run.spec, run.dst, run.status
    assert status.guarantee == "exactly-once" and status.records_out == n
    assert status.transactions_committed >= n // 50
    messages = _read(bs, dst, 3, n)
    assert len(messages) == n
    for m in messages:
        i = int(m.key()[4:])
        assert m.value() == f"VALUE {i}".encode()
        assert m.timestamp()[1] == 1_700_000_000_000 + i
        assert m.headers() == [("trace", f"t{i}".encode()), ("empty", None)]
        assert m.partition() == key_partition(m.key(), 3)
    # The default (Parquet) sink: one transform_batch row per batch and output partition.
    rows = transform_rows(tmp_path / "tel")
    firsts = [r for r in rows if r["output_index"] == 0]
    assert sum(r["records_in"] for r in firsts) == n
    assert sum(r["output_records"] for r in rows) == n
    sha = rows[0]["module_sha256s"][0]
    assert len(sha) == 64 and all(r["module_sha256s"] == [sha] for r in rows)
    assert all(r["transform"] == spec.name and r["output_topic"] == dst for r in rows)
    # Input ranges tile each input partition without gap or overlap.
    for part in (0, 1):
        ranges = sorted((r["input_offset_first"], r["input_offset_last"])
                        for r in firsts if r["input_partition"] == part)
        assert ranges[0][0] == 0 and ranges[-1][1] == n // 2 - 1
        assert all(b[0] == a[1] + 1 for a, b in itertools.pairwise(ranges))
    # Output ranges name the offsets where the records really are (committed ones).
    committed = {(p, o) for p in range(3) for o, _k, _v in committed_records(bs, dst, p)}
    named = {(r["output_partition"], off) for r in rows
             for off in range(r["output_offset_first"], r["output_offset_last"] + 1)}
    assert len(committed) == n and committed <= named


def transform_rows(directory: Path) -> list[dict[str, Any]]:
    """Every row of the published ``transform_batch`` Parquet dataset under ``directory``."""
    files = sorted((directory / "transform_batch").rglob("*.parquet"))
    assert files, f"no transform_batch files under {directory}"
    return [row for f in files for row in pq.read_table(f).to_pylist()]


def test_serve_runs_transforms_with_lag_in_metrics(broker: TansuBroker, tmp_path: Path,
                                                   start_proxy: Callable[..., SluiceProxy]
                                                   ) -> None:
    bs = broker.bootstrap
    src, dst = unique("lower"), unique("upper")
    create_topic(bs, src, 2)
    create_topic(bs, dst, 2)
    metrics_port = free_port()
    config = write_config(tmp_path, unique("t"), [src], dst, guarantee="at-least-once",
                          extra=f"metrics:\n  listen: 127.0.0.1:{metrics_port}\n")
    start_proxy(config)
    produce_numbered(bs, src, 200, 2)

    def lag_zero() -> bool:
        body = urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics").read().decode()
        lags = [line for line in body.splitlines()
                if line.startswith("sluice_transform_lag_records{")]
        return len(lags) == 2 and all(line.endswith(" 0.0") for line in lags) and \
            'sluice_transform_records_out_total{transform=' in body and \
            any(line.endswith(" 200.0") for line in body.splitlines()
                if line.startswith("sluice_transform_records_in_total"))

    wait_for(lag_zero)
    assert len(_read(bs, dst, 2, 200)) == 200
