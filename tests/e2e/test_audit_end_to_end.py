"""Known traffic through the proxy with real clients, then the Spark job: the reports must
equal what was sent, and the audit's offsets must be the offsets the broker assigned; and the
same job on a real standalone Spark cluster gives the same reports."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

from tests.e2e.clients import QUIET, create_topic, kafka_python_produce, unique
from tests.harness.broker import TansuBroker
from tests.harness.proxy import SluiceProxy
from tests.harness.spark_cluster import SparkStandalone

pytestmark = [pytest.mark.spark, pytest.mark.timeout(1200)]


def _rows(out: Path, report: str) -> list[dict[str, Any]]:
    return pq.read_table(out / f"{report}.parquet").to_pylist()  # type: ignore[no-any-return]


def _produce_with_offsets(
    bootstrap: str, topic: str, values: list[bytes], client_id: str
) -> list[tuple[int, int]]:
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "client.id": client_id,
            "linger.ms": 20,
            "enable.idempotence": True,
            **QUIET,
        }
    )
    placed: list[tuple[int, int]] = []
    errors: list[str] = []

    def delivered(err: Any, msg: Any) -> None:
        if err is not None:
            errors.append(str(err))
        else:
            placed.append((msg.partition(), msg.offset()))

    for i, value in enumerate(values):
        producer.produce(topic, key=f"k{i}".encode(), value=value, on_delivery=delivered)
    assert producer.flush(30) == 0
    assert not errors, errors
    return placed


def _consume(bootstrap: str, topic: str, count: int, client_id: str) -> int:
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": unique("g"),
            "client.id": client_id,
            "enable.auto.commit": False,
            **QUIET,
        }
    )
    try:
        parts = consumer.list_topics(topic, timeout=10).topics[topic].partitions
        consumer.assign([TopicPartition(topic, p, 0) for p in parts])
        got = 0
        deadline = time.monotonic() + 30
        while got < count and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is not None and not msg.error():
                got += 1
        return got
    finally:
        consumer.close()


def _high_watermarks(bootstrap: str, topic: str) -> dict[int, int]:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": unique("w"), **QUIET})
    try:
        return {p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1]
                for p in (0, 1)}
    finally:
        consumer.close()


def _stored_offsets(bootstrap: str, topic: str, count: int) -> dict[int, list[int]]:
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": unique("s"),
            "enable.auto.commit": False,
            **QUIET,
        }
    )
    out: dict[int, list[int]] = defaultdict(list)
    try:
        consumer.assign([TopicPartition(topic, p, 0) for p in (0, 1)])
        deadline = time.monotonic() + 30
        while sum(len(v) for v in out.values()) < count and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is not None and not msg.error():
                out[msg.partition()].append(msg.offset())
    finally:
        consumer.close()
    return {p: sorted(v) for p, v in out.items()}


@dataclass
class Traffic:
    telemetry: Path
    pay: str
    view: str
    placed: list[tuple[int, int]]
    stored: dict[int, list[int]]


@pytest.fixture(scope="module")
def traffic(broker: TansuBroker, tmp_path_factory: pytest.TempPathFactory) -> Traffic:
    """Known traffic through the proxy (Parquet telemetry, the default) with real clients."""
    tmp_path = tmp_path_factory.mktemp("audit-e2e")
    pay, view = unique("audit.pay"), unique("audit.view")
    tele = tmp_path / "telemetry"
    config = tmp_path / "sluice.yaml"
    config.write_text(
        json.dumps(
            {
                "filters": [
                    {
                        "name": "mask-pay",
                        "module": "builtin:pii-mask",
                        "topics": [pay],
                        "apply_to": ["produce"],
                    },
                    {
                        "name": "mask-view",
                        "module": "builtin:pii-mask",
                        "topics": [view],
                        "apply_to": ["fetch"],
                    },
                ],
                "telemetry": {"dir": str(tele)},
            }
        )
    )
    proxy = SluiceProxy(upstream=broker.bootstrap, config=config).start()
    try:
        create_topic(proxy.bootstrap, pay, partitions=2)
        create_topic(proxy.bootstrap, view, partitions=1)
        # svc-a: 40 records, one e-mail each, idempotent librdkafka.
        a_values = [
            json.dumps({"i": i, "email": f"a{i}@example.com"}).encode() for i in range(40)
        ]
        placed = _produce_with_offsets(proxy.bootstrap, pay, a_values, "svc-a")
        # svc-b: 25 records, an e-mail and a Luhn-valid card each, kafka-python.
        b_values = [
            (
                None,
                json.dumps(
                    {"i": i, "email": f"b{i}@example.org", "card": "4111 1111 1111 1111"}
                ).encode(),
            )
            for i in range(25)
        ]
        assert kafka_python_produce(proxy.bootstrap, pay, b_values, client_id="svc-b") == 25
        # 30 plain records to the fetch-filtered topic, then read once through the proxy.
        v_values = [
            json.dumps({"i": i, "email": f"v{i}@example.net"}).encode() for i in range(30)
        ]
        _produce_with_offsets(broker.bootstrap, view, v_values, "loader")
        assert _consume(proxy.bootstrap, view, 30, "reader") == 30
        # Offsets the broker assigned to everything on `pay`, read back directly; Kafka's
        # high watermarks agree with them (Tansu's ListOffsets LATEST did not).
        stored = _stored_offsets(broker.bootstrap, pay, 65)
        assert _high_watermarks(broker.bootstrap, pay) == {
            p: offsets[-1] + 1 for p, offsets in stored.items()}
    finally:
        proxy.stop()

    return Traffic(tele, pay, view, placed, stored)


@pytest.fixture(scope="module")
def local_report(traffic: Traffic, tmp_path_factory: pytest.TempPathFactory) -> Path:
    from sluice.spark_audit.job import run_audit

    out = tmp_path_factory.mktemp("audit-e2e-report")
    result = run_audit(str(traffic.telemetry), str(out), master="local[2]")
    assert Path(result.html).is_file()
    assert result.skipped == {"malformed": {}, "unknown_schema_version": {}}
    return out


def test_reports_equal_the_traffic_sent(traffic: Traffic, local_report: Path) -> None:
    out = local_report
    pay, view, placed, stored = traffic.pay, traffic.view, traffic.placed, traffic.stored
    billing = _rows(out, "billing")
    by_client: dict[tuple[str | None, str], dict[str, int]] = defaultdict(lambda: defaultdict(int))
    for row in billing:
        for col in (
            "produce_records_in",
            "produce_records_out",
            "fetch_records_in",
            "fetch_records_out",
        ):
            by_client[(row["client_id"], row["topic"])][col] += int(row[col] or 0)
    assert by_client[("svc-a", pay)]["produce_records_in"] == 40
    assert by_client[("svc-a", pay)]["produce_records_out"] == 40
    assert by_client[("svc-b", pay)]["produce_records_in"] == 25
    assert by_client[("reader", view)]["fetch_records_in"] == 30
    assert by_client[("reader", view)]["fetch_records_out"] == 30

    compliance = _rows(out, "compliance")
    detections: dict[tuple[str, str], int] = defaultdict(int)
    for row in compliance:
        if row["kind"] == "detection":
            detections[(row["topic"], row["name"])] += int(row["count"])
    assert detections[(pay, "email")] == 65
    assert detections[(pay, "card")] == 25
    assert detections[(view, "email")] == 30

    # Audit: per partition, the produce offset runs cover exactly what the broker assigned.
    audit = [r for r in _rows(out, "audit") if r["topic"] == pay and r["api"] == "produce"]
    assert audit, "no audit rows for the produce topic"
    assert sum(len(v) for v in stored.values()) == 65
    for partition in (0, 1):
        runs = [r for r in audit if r["partition"] == partition]
        offsets = stored.get(partition, [])
        if not offsets:
            assert not runs
            continue
        assert offsets == list(range(len(offsets)))
        assert [(r["offset_first"], r["offset_last"]) for r in runs] == [(0, max(offsets))]
    a_by_partition: dict[int, list[int]] = defaultdict(list)
    for partition, offset in placed:
        a_by_partition[partition].append(offset)
    for partition, offsets in a_by_partition.items():
        run = next(r for r in audit if r["partition"] == partition)
        assert run["offset_first"] <= min(offsets) and max(offsets) <= run["offset_last"]
    assert sum(int(r["kept"] or 0) + int(r["rewritten"] or 0) for r in audit) == 65


def _all_rows(out: Path) -> dict[str, list[dict[str, Any]]]:
    from sluice.spark_audit.reports import REPORT_NAMES

    return {name: _rows(out, name) for name in REPORT_NAMES}


def test_standalone_cluster_reports_equal_local_mode(
    traffic: Traffic, local_report: Path, tmp_path: Path
) -> None:
    """The same job on a real Spark standalone cluster (master + worker from the pyspark
    wheel on 127.0.0.1), run through `sluice audit --master spark://...`, writing its reports
    through a Hadoop filesystem URL: every report equals the local-mode one."""
    cluster = SparkStandalone(tmp_path / "cluster").start()
    try:
        out = tmp_path / "cluster-report"
        conf = [arg for k, v in cluster.driver_conf.items() for arg in ("--conf", f"{k}={v}")]
        proc = subprocess.run(
            [sys.executable, "-m", "sluice", "audit", "--telemetry", str(traffic.telemetry),
             "--out", f"file://{out}", "--master", cluster.url, *conf],
            capture_output=True, text=True, timeout=600,
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
        # The executors ran on the worker: it made a work folder for the application.
        assert list((tmp_path / "cluster" / "work").glob("app-*"))
    finally:
        cluster.stop()
    assert _all_rows(out) == _all_rows(local_report)
