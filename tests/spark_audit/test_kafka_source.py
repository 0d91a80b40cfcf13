"""Reading the telemetry topic on a real broker through the Python Kafka data source."""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import pytest

from sluice.cli import main as sluice_main
from sluice.proxy import telemetry as t
from tests.spark_audit import known_telemetry as k
from tests.spark_audit.kafka_topics import emit_through_sinks, redeliver_one
from tests.spark_audit.test_audit_job import billing_figures

pytestmark = [pytest.mark.spark, pytest.mark.timeout(600)]


@pytest.fixture(scope="module")
def telemetry_topic(broker: Any) -> tuple[str, int]:
    """The known events produced by the JSON Kafka sink (one sink per proxy instance, as in
    production), plus one duplicate delivered to the other partition, as an at-least-once
    retry might. Returns (topic, messages on the topic)."""
    from confluent_kafka import Producer

    topic = f"sluice-telemetry-{uuid.uuid4().hex[:8]}"
    by_instance: dict[str, list[dict[str, Any]]] = {}
    for event in k.events():
        by_instance.setdefault(event["proxy"]["instance_id"], []).append(event)
    for proxy in (k.A, k.B):
        sink = t.make_sink(
            {
                "kafka": {
                    "bootstrap": broker.bootstrap,
                    "topic": topic,
                    "create_partitions": 2,
                    "format": "json",
                }
            },
            proxy.instance_id,
            proxy=proxy,
        )
        for event in by_instance[proxy.instance_id]:
            sink.emit(event)
        sink.close(timeout=30)
        stats = sink.stats()
        assert stats["written"] == len(by_instance[proxy.instance_id]), stats
    producer = Producer({"bootstrap.servers": broker.bootstrap})
    for partition in (0, 1):
        producer.produce(topic, json.dumps(k.events()[3]).encode(), partition=partition)
    assert producer.flush(30) == 0
    return topic, len(k.events()) + 2


def test_data_source_reads_every_partition_to_its_end(
    spark: Any, broker: Any, telemetry_topic: tuple[str, int]
) -> None:
    from sluice.spark_audit.kafka_source import FORMAT_NAME, KafkaBatchSource

    topic, total = telemetry_topic
    spark.dataSource.register(KafkaBatchSource)
    df = (
        spark.read.format(FORMAT_NAME)
        .option("bootstrap.servers", broker.bootstrap)
        .option("subscribe", topic)
        .load()
    )
    assert df.rdd.getNumPartitions() == 2
    got = df.select("partition", "offset", "topic", "value").collect()
    assert len(got) == total
    assert {r["topic"] for r in got} == {topic}
    for partition in (0, 1):
        offsets = sorted(r["offset"] for r in got if r["partition"] == partition)
        assert offsets == list(range(len(offsets)))  # every offset from 0 to the end
        assert offsets  # each partition holds at least the duplicate
    ids = sorted(json.loads(r["value"])["event_id"] for r in got)
    assert ids == sorted([e["event_id"] for e in k.events()] + [k.events()[3]["event_id"]] * 2)


def test_data_source_starting_offsets(
    spark: Any, broker: Any, telemetry_topic: tuple[str, int]
) -> None:
    from sluice.spark_audit.kafka_source import FORMAT_NAME, KafkaBatchSource

    topic, total = telemetry_topic
    spark.dataSource.register(KafkaBatchSource)
    df = (
        spark.read.format(FORMAT_NAME)
        .option("bootstrap.servers", broker.bootstrap)
        .option("subscribe", topic)
        .option("startingOffsets", json.dumps({"0": 1, "1": 1}))
        .load()
    )
    assert df.count() == total - 2
    assert df.filter("offset = 0").count() == 0


def test_audit_job_over_kafka_dedupes_and_matches_known_figures(
    spark: Any, broker: Any, telemetry_topic: tuple[str, int], tmp_path: Path
) -> None:
    topic, _total = telemetry_topic
    out = tmp_path / "kafka-report"
    code = sluice_main(
        ["audit", "--telemetry", f"kafka://{broker.bootstrap}/{topic}", "--out", str(out)]
    )
    assert code == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["events"] == len(k.events())  # the duplicates are gone
    assert billing_figures(out) == k.EXPECTED_BILLING


def test_missing_topic_is_reported(spark: Any, broker: Any, tmp_path: Path) -> None:
    from sluice.spark_audit.kafka_source import FORMAT_NAME, KafkaBatchSource

    spark.dataSource.register(KafkaBatchSource)
    df = (
        spark.read.format(FORMAT_NAME)
        .option("bootstrap.servers", broker.bootstrap)
        .option("subscribe", f"absent-{uuid.uuid4().hex[:6]}")
        .option("kafka.allow.auto.create.topics", "false")
        .load()
    )
    with pytest.raises(Exception, match="absent-"):
        df.count()


def test_audit_of_a_missing_topic_is_a_clear_error(
    spark: Any, broker: Any, tmp_path: Path, capsys: Any
) -> None:
    """A typo in the kafka:// URL: exit code 2 and one line naming the topic, no traceback."""
    topic = f"absent-{uuid.uuid4().hex[:6]}"
    code = sluice_main(["audit", "--telemetry", f"kafka://{broker.bootstrap}/{topic}",
                        "--out", str(tmp_path / "a")])
    err = capsys.readouterr().err
    assert code == 2
    assert topic in err and "Traceback" not in err


def test_no_broker_at_the_address_is_a_value_error() -> None:
    """What ``sluice audit`` prints as one line (exit code 2): the address and the cause."""
    import socket

    from sluice.spark_audit.kafka_arrow_source import KafkaArrowReader

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    reader = KafkaArrowReader({"bootstrap.servers": f"127.0.0.1:{port}", "subscribe": "t",
                               "dataset": "raw", "timeout.seconds": "2"})
    with pytest.raises(ValueError, match=f"127.0.0.1:{port}: topic 't'"):
        reader.partitions()


def test_columnar_topic_with_old_json_messages_and_a_redelivered_message(
    spark: Any, broker: Any, tmp_path: Path
) -> None:
    """inst-a through the Arrow IPC sink, inst-b through the old JSON sink (a fleet half
    upgraded), and one Arrow message delivered twice: the reports equal the known figures."""
    topic = f"sluice-telemetry-arrow-{uuid.uuid4().hex[:8]}"
    emit_through_sinks(broker.bootstrap, topic, k.events(), [(k.A, "arrow"), (k.B, "json")])
    redeliver_one(broker.bootstrap, topic, "record_batch")

    out = tmp_path / "arrow-report"
    code = sluice_main(
        ["audit", "--telemetry", f"kafka://{broker.bootstrap}/{topic}", "--out", str(out)]
    )
    assert code == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["events"] == len(k.events())
    assert billing_figures(out) == k.EXPECTED_BILLING

    # The same topic through the documented data source: one dataset's rows (strings as the
    # schema types them, whatever the sink dictionary-encoded), the redelivered message once.
    from sluice.spark_audit.kafka_arrow_source import (
        FORMAT_NAME,
        KafkaArrowReader,
        KafkaArrowSource,
    )

    spark.dataSource.register(KafkaArrowSource)
    batches = (spark.read.format(FORMAT_NAME).option("bootstrap.servers", broker.bootstrap)
               .option("subscribe", topic).option("dataset", "record_batch").load().collect())
    mine = [e for e in k.events() if e["type"] == "record_batch"
            and e["proxy"]["instance_id"] == k.A.instance_id]
    assert sorted(r["event_id"] for r in batches) == sorted(e["event_id"] for e in mine)
    assert {r["topic"] for r in batches} == {e["topic"] for e in mine}
    # Its other modes, straight from the reader: the JSON texts, and a row per message.
    reader = KafkaArrowReader({"bootstrap.servers": broker.bootstrap, "subscribe": topic,
                               "dataset": "raw"})
    texts = [json.loads(text) for p in reader.partitions() for b in reader.json_texts(p)
             for text in b.column("value").to_pylist()]
    assert sorted(e["event_id"] for e in texts) == sorted(
        e["event_id"] for e in k.events() if e["proxy"]["instance_id"] == k.B.instance_id)
    raw = [r for p in reader.partitions() for b in reader.raw(p) for r in b.to_pylist()]
    assert sum(1 for r in raw if r["dataset"] is None) == len(texts)
    arrow = [r for r in raw if r["dataset"] is not None]
    assert len({r["value"] for r in arrow}) == len(arrow)  # the redelivered one once
