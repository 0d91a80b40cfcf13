"""The audit job with trusted telemetry keys (``--telemetry-key``) on files Spark reads itself:
JSON Lines, ``--dedupe``, and the ``binaryFile`` check used for Hadoop URLs. Only files whose
tag verifies reach the reports; a forged file, an altered copy found first and a file tagged
with another key are counted and change nothing."""

from __future__ import annotations

import json
import shutil
import uuid
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

from sluice.proxy import telemetry as t
from sluice.spark_audit import sources
from sluice.spark_audit.job import run_audit
from sluice.telemetry_schema import integrity as ig
from tests.spark_audit import known_telemetry as k
from tests.spark_audit.test_audit_job import billing_figures
from tests.spark_audit.test_columnar_input import report_rows

pytestmark = [pytest.mark.spark, pytest.mark.timeout(900)]

KEY = ig.new_key()


def _key_file(tmp_path: Path) -> Path:
    path = tmp_path / "telemetry.key"
    if not path.exists():
        ig.write_key(path, KEY)
    return path


def _jsonl(directory: Path, tagger: ig.Tagger | None) -> list[Path]:
    for proxy in (k.A, k.B):
        sink = t.FileSink(proxy, directory, fsync=False, tagger=tagger)
        for event in k.events():
            if event["proxy"]["instance_id"] == proxy.instance_id:
                sink.emit(event)
        sink.close(timeout=10)
    return sorted(directory.glob("*.jsonl"))


def _forge(directory: Path, genuine: list[Path]) -> None:
    """An untagged file billing a stranger, a copy of a real file found first (``aaa/`` sorts
    before the real names) whose first event's counts are changed, under the real tag, and a
    file tagged with another key."""
    forged = dict(k.events()[5])
    forged.update(principal="User:victim", bytes_in=5 * 10**12, records_out=10**9)
    line = json.dumps(forged) + "\n"
    (directory / "sluice-telemetry-forged-000001-x.jsonl").write_text(line)
    copy = directory / "aaa" / genuine[0].name
    copy.parent.mkdir()
    text = genuine[0].read_text().replace('"records_out":', '"records_out":9', 1)
    copy.write_text(text)
    shutil.copy(f"{genuine[0]}{ig.TAG_SUFFIX}", f"{copy}{ig.TAG_SUFFIX}")
    other = directory / "sluice-telemetry-forged-000002-x.jsonl"
    other.write_text(line)
    mac = ig.Tagger(ig.new_key()).file_mac(other.name)
    mac.update(line.encode())
    ig.write_sidecar(other, mac.tag(), fsync=False)


def test_json_lines_files_verify_and_forged_ones_change_nothing(spark: Any,
                                                                tmp_path: Path) -> None:
    key = _key_file(tmp_path)
    tele = tmp_path / "telemetry"
    genuine = _jsonl(tele, ig.Tagger(KEY))
    assert genuine and all(Path(f"{p}{ig.TAG_SUFFIX}").is_file() for p in genuine)
    clean = run_audit(str(tele), str(tmp_path / "clean"), telemetry_keys=[str(key)])
    assert clean.events == len(k.events())
    assert clean.integrity["accepted"] == {"files": len(genuine)}
    assert billing_figures(tmp_path / "clean") == k.EXPECTED_BILLING

    _forge(tele, genuine)
    result = run_audit(str(tele), str(tmp_path / "forged"), telemetry_keys=[str(key)])
    assert report_rows(tmp_path / "forged") == report_rows(tmp_path / "clean")
    assert result.integrity["refused"] == {"bad_tag": {"jsonl": 1}, "no_tag": {"jsonl": 1},
                                           "unknown_key": {"jsonl": 1}}
    # Without the key, the forged rows are billed.
    run_audit(str(tele), str(tmp_path / "unverified"))
    assert billing_figures(tmp_path / "unverified") != k.EXPECTED_BILLING


def test_dedupe_reads_only_verified_parquet_files(spark: Any, tmp_path: Path) -> None:
    key = _key_file(tmp_path)
    tele = tmp_path / "telemetry"
    for proxy in (k.A, k.B):
        sink = t.ParquetSink(proxy, tele, fsync=False, tagger=ig.Tagger(KEY))
        for event in k.events():
            if event["proxy"]["instance_id"] == proxy.instance_id:
                sink.emit(event)
        sink.close(timeout=10)
    published = sorted(tele.rglob("*.parquet"))
    # A forged copy of every record batch file, found first, billing its rows to a stranger.
    for path in published:
        if path.parts[-4] != "record_batch":
            continue
        copy = tele / "aaa" / path.relative_to(tele)
        copy.parent.mkdir(parents=True, exist_ok=True)
        table = pq.read_table(path)
        table = table.set_column(table.schema.get_field_index("principal"), "principal",
                                 pa.array(["User:victim"] * table.num_rows, pa.string()))
        pq.write_table(table, copy)
        shutil.copy(f"{path}{ig.TAG_SUFFIX}", f"{copy}{ig.TAG_SUFFIX}")
    result = run_audit(str(tele), str(tmp_path / "out"), dedupe=True, telemetry_keys=[str(key)])
    assert result.events == len(k.events())
    assert billing_figures(tmp_path / "out") == k.EXPECTED_BILLING
    copies = sum(1 for p in published if p.parts[-4] == "record_batch")
    assert result.integrity["refused"] == {"bad_tag": {"record_batch": copies}}
    assert result.integrity["accepted"] == {"files": len(published)}


def test_the_spark_check_for_hadoop_urls_agrees_with_the_driver(
    spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tele = tmp_path / "telemetry"
    genuine = _jsonl(tele, ig.Tagger(KEY))
    _forge(tele, genuine)
    files = [(p.name, str(p)) for p in sorted(tele.rglob("*.jsonl"))]
    listed = {str(p) for p in tele.rglob("*")}
    verifier = ig.Verifier([KEY])
    driver = sources.check_files(spark, verifier, files, listed)
    monkeypatch.setattr(sources, "is_local", lambda _path: False)
    through_spark = sources.check_files(spark, verifier, files, listed)
    assert through_spark == driver
    assert sorted(v or "ok" for v in driver.values()) == sorted(
        ["ok"] * len(genuine) + [ig.BAD_TAG, ig.NO_TAG, ig.UNKNOWN_KEY])


def test_kafka_json_and_arrow_messages_written_ahead_change_nothing(
    spark: Any, broker: Any, tmp_path: Path
) -> None:
    """inst-a through the Arrow sink, inst-b through the JSON sink, both tagged; before them,
    in both partitions, JSON messages under real event ids with forged counts (the JSON path
    keeps one event per id) and no tag, or the real key's id and a guessed tag."""
    key = _key_file(tmp_path)
    topic = f"sluice-telemetry-verified-{uuid.uuid4().hex[:8]}"
    producer = Producer({"bootstrap.servers": broker.bootstrap, "log_level": 3})
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    for fut in admin.create_topics([NewTopic(topic, 2)]).values():
        fut.result(15)
    b_events = [e for e in k.events() if e["proxy"]["instance_id"] == k.B.instance_id
                and e["type"] == "record_batch"]
    guessed = f"{KEY.key_id}:{'ab' * 32}".encode()
    for partition in (0, 1):
        for event, tag in ((b_events[0], None), (b_events[1], guessed)):
            forged = {**event, "principal": "User:victim", "bytes_in": 5 * 10**12}
            producer.produce(topic, json.dumps(forged).encode(), k.B.instance_id.encode(),
                             partition=partition,
                             headers=[(ig.TAG_HEADER, tag)] if tag else None)
    assert producer.flush(30) == 0
    for proxy, fmt in ((k.A, "arrow"), (k.B, "json")):
        sink = t.make_sink({"kafka": {"bootstrap": broker.bootstrap, "topic": topic,
                                      "format": fmt}, "key_file": str(key)},
                           proxy.instance_id, proxy=proxy)
        mine = [e for e in k.events() if e["proxy"]["instance_id"] == proxy.instance_id]
        for event in mine:
            sink.emit(event)
        sink.close(timeout=30)
        assert sink.stats()["written"] == len(mine)
    out = tmp_path / "out"
    result = run_audit(f"kafka://{broker.bootstrap}/{topic}", str(out),
                       telemetry_keys=[str(key)])
    assert result.events == len(k.events())
    assert billing_figures(out) == k.EXPECTED_BILLING
    assert result.integrity["refused"] == {"bad_tag": {"(json)": 2}, "no_tag": {"(json)": 2}}
    b_count = sum(1 for e in k.events() if e["proxy"]["instance_id"] == k.B.instance_id)
    assert result.integrity["accepted"]["kafka"] >= b_count + 1
    with pytest.raises(ValueError, match="--kafka-reader spark cannot verify"):
        run_audit(f"kafka://{broker.bootstrap}/{topic}", str(out), kafka_reader="spark",
                  telemetry_keys=[str(key)])


def test_copies_across_partitions_and_missing_numbers() -> None:
    """The driver's part of the Kafka checks, on the ids the tasks report: a message id read
    in two partitions is skipped in all but the lowest; numbers missing below an instance's
    highest are counted."""
    from sluice.spark_audit.rollups import missing_messages, replayed_ids

    def ids(partition: int, *names: str) -> pa.Table:
        return pa.table({"partition": pa.array([partition] * len(names), pa.int32()),
                         "message_id": pa.array([n.encode() for n in names], pa.binary())})

    tasks = [ids(0, "a-1", "a-2", "a-4", "b-1"), ids(1, "b-2", "a-2", "b-3"), ids(2, "a-2")]
    assert replayed_ids(tasks) == {1: frozenset({b"a-2"}), 2: frozenset({b"a-2"})}
    assert replayed_ids([ids(0, "a-1"), ids(1, "a-2")]) == {}
    assert missing_messages(tasks) == {"a": 1}  # a-3; b-1..3 are all there
    assert missing_messages([ids(0, "x-y-5")]) == {"x-y": 4}
