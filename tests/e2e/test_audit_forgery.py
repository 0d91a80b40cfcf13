"""Forged telemetry against the audit (issue 26, "An audit that cannot be forged").

Real clients produce card numbers and e-mail addresses through a proxy whose telemetry goes
to a Parquet directory and to a Kafka topic, tagged with a telemetry key. An attacker with
write access to the topic (or the directory) but no key then adds what was measured against
the audit: a record batch billing 5 TB to another principal, messages written ahead of time
under the ids of the real ones (message ids, event ids, and the finding ids whose newest
version the audit keeps: this erased a masked-PII detection), a message signed with a key
the audit does not trust, a copy of a real message in another partition, and for the files a
forged copy of a published file found before the real one. Given the key, the audit's
billing, compliance and audit reports are those of the genuine telemetry, and its summary
counts every forged unit; without the key the same input is visibly polluted.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from confluent_kafka import Producer

from sluice.proxy import telemetry as t
from sluice.proxy.telemetry.kafka_arrow import encode_batch
from sluice.telemetry_schema import integrity as ig
from sluice.telemetry_schema.columns import ColumnarBuffers
from tests.e2e.clients import QUIET, confluent_produce, create_topic, unique
from tests.harness.broker import TansuBroker
from tests.harness.proxy import SluiceProxy

pytestmark = [pytest.mark.spark, pytest.mark.timeout(1200)]

FIVE_TB = 5 * 10**12
COMPARED = ("billing", "compliance", "audit")


@dataclass
class Setup:
    bootstrap: str
    key: Path
    telemetry: Path
    topic: str
    pay: str
    work: Path


def _messages(bootstrap: str, topic: str) -> list[Any]:
    """Every message of ``topic`` (all partitions, in order), as the audit's reader sees it."""
    from sluice.spark_audit.kafka_arrow_source import KafkaArrowReader

    reader = KafkaArrowReader({"bootstrap.servers": bootstrap, "subscribe": topic,
                               "dataset": "raw"})
    return [msg for partition in reader.partitions() for msg in reader.messages(partition)]


@pytest.fixture(scope="module")
def spark_session() -> Iterator[Any]:
    from sluice.spark_audit.session import get_session

    session, created = get_session("local[2]", {"spark.driver.memory": "1g"})
    yield session
    if created:
        session.stop()


@pytest.fixture(scope="module")
def setup(broker: TansuBroker, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Setup]:
    # The session's Kafka node: the proxy's Kafka telemetry sink writes to it.
    work = tmp_path_factory.mktemp("forgery")
    key = work / "telemetry.key"
    ig.write_key(key, ig.new_key())
    pay, topic = unique("forge.pay"), unique("sluice-telemetry")
    tele = work / "telemetry"
    config = work / "sluice.yaml"
    config.write_text(json.dumps({
        "filters": [{"name": "mask-pay", "module": "builtin:pii-mask", "topics": [pay],
                     "apply_to": ["produce"]}],
        "telemetry": {"dir": str(tele), "key_file": str(key),
                      "kafka": {"bootstrap": broker.bootstrap, "topic": topic,
                                "create_partitions": 2}},
    }))
    proxy = SluiceProxy(upstream=broker.bootstrap, config=config).start()
    try:
        create_topic(proxy.bootstrap, pay, partitions=1)
        values = [json.dumps({"i": i, "email": f"u{i}@example.com",
                              "card": "4111 1111 1111 1111"}).encode() for i in range(30)]
        confluent_produce(proxy.bootstrap, pay, [(None, v) for v in values],
                          **{"client.id": "svc-a"})
    finally:
        proxy.stop()
    yield Setup(broker.bootstrap, key, tele, topic, pay, work)


def _audit(source: str, out: Path, keys: list[Path] | None) -> Any:
    from sluice.spark_audit.job import run_audit

    return run_audit(source, str(out), master="local[2]",
                     telemetry_keys=[str(k) for k in keys] if keys else None)


def _reports(out: Path) -> dict[str, list[dict[str, Any]]]:
    return {name: pq.read_table(out / f"{name}.parquet").to_pylist() for name in COMPARED}


def _forged_billing_event(instance: str, pay: str, event_id: str) -> dict[str, Any]:
    event = t.record_batch_event(
        t.ProxyInfo("attacker", 1, instance), connection_id=f"{instance}-9",
        client_address="10.0.0.9:1", client_id="svc-a", principal="User:victim",
        api="produce", topic=pay, partition=0, offset_first=0, offset_last=10**9 - 1,
        records_in=10**9, records_out=10**9, bytes_in=FIVE_TB, bytes_out=FIVE_TB, filters=[])
    event["event_id"] = event_id  # a real event's id, written ahead of it
    return event


def _rows_message(events: list[dict[str, Any]], dataset: str) -> bytes:
    buffers = ColumnarBuffers("forger")
    for e in events:
        buffers.add(e)
    return encode_batch(buffers.rows_for_flush()[dataset])


def _zeroed_findings(value: bytes) -> bytes:
    """A real finding message's rows, each at a far higher version with its counts at 0: the
    newest version of an id is the one the audit keeps."""
    table = pa.ipc.open_stream(value).read_all()
    table = table.set_column(table.schema.get_field_index("version"), "version",
                             pc.add(table["version"], 1000))
    for col in ("n", "events"):
        table = table.set_column(table.schema.get_field_index(col), col,
                                 pa.repeat(pa.scalar(0, pa.int64()), table.num_rows))
    return encode_batch(table.combine_chunks().to_batches()[0])


def test_forged_kafka_messages_change_no_report(setup: Setup, spark_session: Any) -> None:
    genuine = _messages(setup.bootstrap, setup.topic)
    headers = [dict(m.headers() or []) for m in genuine]
    assert genuine and all(ig.TAG_HEADER in h for h in headers)
    findings = [m for m, h in zip(genuine, headers, strict=True)
                if h["sluice-dataset"] == b"finding"]
    batches = [m for m, h in zip(genuine, headers, strict=True)
               if h["sluice-dataset"] == b"record_batch"]
    assert findings and batches
    instance = genuine[0].key().decode()
    real_event_id = pa.ipc.open_stream(batches[0].value()).read_all()["event_id"][0].as_py()

    forged_topic = unique("sluice-telemetry-forged")
    create_topic(setup.bootstrap, forged_topic, partitions=2)
    producer = Producer({"bootstrap.servers": setup.bootstrap, **QUIET})
    home = genuine[0].partition()
    other = 1 - home
    untrusted = ig.Tagger(ig.new_key())

    def send(value: bytes, partition: int, dataset: bytes, message_id: bytes,
             tag: bytes | None) -> None:
        hdrs = [("sluice-dataset", dataset), ("sluice-layout", b"1"),
                ("sluice-message-id", message_id)]
        if tag is not None:
            hdrs.append((ig.TAG_HEADER, tag))
        producer.produce(forged_topic, value, instance.encode(), partition=partition,
                         headers=hdrs)

    # Written ahead of the real messages, under their message ids.
    billing = _rows_message([_forged_billing_event(instance, setup.pay, real_event_id)],
                            "record_batch")
    batch_id = dict(batches[0].headers())["sluice-message-id"]
    send(billing, home, b"record_batch", batch_id, None)  # no tag
    for m in findings:  # a guessed tag under the real key's id
        mid = dict(m.headers())["sluice-message-id"]
        key_id = dict(m.headers())[ig.TAG_HEADER].split(b":")[0]
        send(_zeroed_findings(m.value()), home, b"finding", mid, key_id + b":" + b"0" * 64)
    fields = ig.kafka_arrow_fields(instance.encode(), b"record_batch", b"1", b"x-1")
    send(billing, home, b"record_batch", b"x-1",
         untrusted.tag(ig.KAFKA_ARROW, fields, billing))  # another key's valid tag
    # The real messages, as the proxy wrote them, then a copy of one in the other partition.
    for m in genuine:
        producer.produce(forged_topic, m.value(), m.key(), partition=m.partition(),
                         headers=m.headers())
    producer.produce(forged_topic, batches[0].value(), batches[0].key(), partition=other,
                     headers=batches[0].headers())
    assert producer.flush(30) == 0

    base = setup.work / "kafka-genuine"
    result = _audit(f"kafka://{setup.bootstrap}/{setup.topic}", base, [setup.key])
    assert result.integrity["refused_total"] == 0
    assert result.integrity["accepted"] == {"kafka": len(genuine)}
    clean = _reports(base)
    detections = {r["name"]: r["count"] for r in clean["compliance"]
                  if r["kind"] == "detection" and r["topic"] == setup.pay}
    assert detections.get("card") == 30 and detections.get("email") == 30

    out = setup.work / "kafka-forged"
    result = _audit(f"kafka://{setup.bootstrap}/{forged_topic}", out, [setup.key])
    assert _reports(out) == clean
    assert result.integrity["refused"] == {
        "bad_tag": {"finding": len(findings)},
        "no_tag": {"record_batch": 1},
        "replayed": {"record_batch": 1},
        "unknown_key": {"record_batch": 1},
    }
    assert result.integrity["refused_total"] == len(findings) + 3
    assert result.integrity["missing_messages"] == {}
    html = Path(result.html).read_text()
    assert "Refused, in no report" in html and "no tag (record_batch)" in html

    # Without the key the same topic is what the attack measured: 5 TB billed to the victim.
    polluted = setup.work / "kafka-unverified"
    result = _audit(f"kafka://{setup.bootstrap}/{forged_topic}", polluted, None)
    assert result.integrity["verified"] is False
    billed = {r["principal"]: r["produce_bytes_in"] for r in _reports(polluted)["billing"]}
    assert billed.get("User:victim") == 2 * FIVE_TB
    assert "Unverified telemetry" in Path(result.html).read_text()


def test_a_deleted_message_is_counted(setup: Setup, spark_session: Any) -> None:
    genuine = _messages(setup.bootstrap, setup.topic)
    assert len(genuine) > 2
    topic = unique("sluice-telemetry-cut")
    create_topic(setup.bootstrap, topic, partitions=2)
    producer = Producer({"bootstrap.servers": setup.bootstrap, **QUIET})
    for m in genuine[:1] + genuine[2:]:  # the second message deleted
        producer.produce(topic, m.value(), m.key(), partition=m.partition(),
                         headers=m.headers())
    assert producer.flush(30) == 0
    result = _audit(f"kafka://{setup.bootstrap}/{topic}", setup.work / "cut", [setup.key])
    assert result.integrity["missing_messages"] == {genuine[0].key().decode(): 1}


def test_forged_files_change_no_report(setup: Setup, spark_session: Any) -> None:
    published = sorted(setup.telemetry.rglob("*.parquet"))
    assert published and all(Path(f"{p}{ig.TAG_SUFFIX}").is_file() for p in published)
    forged = setup.work / "telemetry-forged"
    shutil.copytree(setup.telemetry, forged)
    batch_file = next(p for p in published if p.parts[-4] == "record_batch")
    finding_file = next(p for p in published if p.parts[-4] == "finding")
    instance = pq.read_table(batch_file)["instance_id"][0].as_py()
    real_id = pq.read_table(batch_file)["event_id"][0].as_py()
    rows = ColumnarBuffers("forger")
    rows.add(_forged_billing_event(instance, setup.pay, real_id))
    table = pa.Table.from_batches([rows.rows_for_flush()["record_batch"]])
    hour_dir = forged / batch_file.relative_to(setup.telemetry).parent
    # An untagged file, and one with the tag of a real file beside it.
    pq.write_table(table, hour_dir / "forged-000001.parquet")
    pq.write_table(table, hour_dir / "forged-000002.parquet")
    shutil.copy(f"{batch_file}{ig.TAG_SUFFIX}", hour_dir / f"forged-000002.parquet{ig.TAG_SUFFIX}")
    # A forged copy of the real finding file, found first (``aaa/`` sorts before the
    # datasets), its detections at 0, with the real file's tag.
    copy = forged / "aaa" / finding_file.relative_to(setup.telemetry)
    copy.parent.mkdir(parents=True)
    real = pq.read_table(finding_file)
    zeroed = real.set_column(real.schema.get_field_index("n"), "n",
                             pa.repeat(pa.scalar(0, pa.int64()), real.num_rows))
    pq.write_table(zeroed, copy)
    shutil.copy(f"{finding_file}{ig.TAG_SUFFIX}", f"{copy}{ig.TAG_SUFFIX}")

    base = setup.work / "files-genuine"
    result = _audit(str(setup.telemetry), base, [setup.key])
    assert result.integrity["refused_total"] == 0
    assert result.integrity["accepted"] == {"files": len(published)}
    clean = _reports(base)
    assert any(r["kind"] == "detection" and r["count"] == 30 for r in clean["compliance"])

    out = setup.work / "files-forged"
    result = _audit(str(forged), out, [setup.key])
    assert _reports(out) == clean
    assert result.integrity["refused"] == {"bad_tag": {"finding": 1, "record_batch": 1},
                                           "no_tag": {"record_batch": 1}}
    assert result.integrity["accepted"] == {"files": len(published)}

    # Without the key the forged copy hides the real file and the 5 TB are billed.
    polluted = setup.work / "files-unverified"
    _audit(str(forged), polluted, None)
    reports = _reports(polluted)
    assert any(r["principal"] == "User:victim" for r in reports["billing"])
    assert reports["compliance"] != clean["compliance"]
