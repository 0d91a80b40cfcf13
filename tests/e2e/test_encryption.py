"""Record encryption end to end: real clients (confluent-kafka, kafka-python, aiokafka) with
SASL/PLAIN principals, a real `sluice serve`, Apache Kafka's own SASL_PLAINTEXT listener (its
users, their passwords and ACLs granting them the test topics). The
stored bytes are read straight from the broker (not through the proxy) to prove that no
plaintext reached it; an allowed principal reads exactly what was produced; any other reads
the ciphertext.

Failure cases: the KMS (AWS KMS on moto's server) stopping refuses produce with a retriable
error and fails an allowed fetch; a record edited in the broker fails its partition; a key
deleted with `sluice keys delete` makes its records unreadable (crypto-shredding).
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
import yaml
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import (
    AclBinding,
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    AdminClient,
    NewTopic,
    ResourcePatternType,
    ResourceType,
)

from sluice.codec.records import records_section
from sluice.crypto.kms_local import version_number
from tests.e2e.clients import QUIET, unique, wait_for_leaders
from tests.harness.kafka_broker import KafkaCluster
from tests.harness.moto import AWS_ENV, MotoServer
from tests.harness.proxy import SluiceProxy
from tests.harness.validating_relay import Relayed, fetch_batches
from tests.harness.validating_relay import relayed as relay_in_front

# The principals, each a SCRAM/PLAIN user of the session's Kafka node; `admin` is its super
# user, the others may use the test topics and groups through the ACLs `sasl_broker` adds.
USERS = ("app", "billing-eu", "bob", "admin")
# Their passwords: random per Kafka run, filled in by the `sasl_broker` fixture.
PASSWORDS: dict[str, str] = {}
Rec = tuple[bytes | None, bytes | None, list[tuple[str, bytes]]]


def sasl(user: str) -> dict[str, Any]:
    return {"security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "PLAIN",
            "sasl.username": user, "sasl.password": PASSWORDS[user]}


def card_values(n: int, tag: str) -> list[bytes]:
    return [json.dumps({"card": f"4111-{tag}-{i:05d}", "name": f"Holder {i}",
                        "amount": i * 1.5}).encode() for i in range(n)]


@dataclass(frozen=True)
class SaslBroker:
    """Kafka's SASL_PLAINTEXT listener (the address the proxy dials and admin reads from)."""

    bootstrap: str


@pytest.fixture(scope="module")
def sasl_broker(kafka_broker: KafkaCluster) -> Iterator[SaslBroker]:
    PASSWORDS.update({user: kafka_broker.password(user) for user in USERS})
    bootstrap = kafka_broker.bootstrap_for("SASL_PLAINTEXT")
    bindings = grant_topics_and_groups(bootstrap, [user for user in USERS if user != "admin"])
    yield SaslBroker(bootstrap)
    # The node is the session's: other modules (tests/e2e/test_kafka_tools.py) count on `bob`
    # having no ACL at all.
    client = AdminClient({"bootstrap.servers": bootstrap, **QUIET, **sasl("admin")})
    filters = [AclBindingFilter(b.restype, b.name, b.resource_pattern_type, b.principal, b.host,
                                b.operation, b.permission_type) for b in bindings]
    for future in client.delete_acls(filters).values():
        future.result(20)


def grant_topics_and_groups(bootstrap: str, users: list[str]) -> list[AclBinding]:
    """ACLs (made by the super user `admin`): every operation on every topic, group and
    transactional id."""
    client = AdminClient({"bootstrap.servers": bootstrap, **QUIET, **sasl("admin")})
    bindings = [
        AclBinding(kind, "*", ResourcePatternType.LITERAL, f"User:{user}", "*",
                   AclOperation.ALL, AclPermissionType.ALLOW)
        for user in users
        for kind in (ResourceType.TOPIC, ResourceType.GROUP, ResourceType.TRANSACTIONAL_ID)
    ]
    for future in client.create_acls(bindings).values():
        future.result(20)
    return bindings


def write_config(tmp_path: Path, kms: dict[str, Any], telemetry_format: str = "jsonl",
                 **extra: Any) -> Path:
    filt = {"name": "encrypt-payments", "module": "builtin:encrypt", "topics": ["enc-*"],
            "apply_to": ["produce", "fetch"],
            "config": {"key": "payments", "decrypt_for": ["User:billing-*"], **extra}}
    fields = {"name": "encrypt-cards", "module": "builtin:encrypt", "topics": ["fenc-*"],
              "apply_to": ["produce", "fetch"],
              "config": {"key": "cards", "decrypt_for": ["User:billing-*"],
                         "fields": ["card"], **extra}}
    (tmp_path / "telemetry").mkdir(exist_ok=True)
    config = {"filters": [filt, fields], "kms": kms,
              "telemetry": {"dir": str(tmp_path / "telemetry"), "format": telemetry_format}}
    path = tmp_path / "sluice.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


@pytest.fixture
def local_proxy(sasl_broker: SaslBroker, tmp_path: Path) -> Iterator[SluiceProxy]:
    config = write_config(tmp_path, {"type": "local", "path": "keys.json"})
    with SluiceProxy(upstream=sasl_broker.bootstrap, config=config) as p:
        yield p


def create_topic(bootstrap: str, topic: str) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap, **QUIET, **sasl("admin")})
    for fut in admin.create_topics([NewTopic(topic, 1, 1)]).values():
        fut.result(20)
    wait_for_leaders(bootstrap, topic, **sasl("admin"))


def produce(bootstrap: str, topic: str, records: list[Rec], user: str,
            **conf: Any) -> list[str]:
    """Error name per record ("" when delivered)."""
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20, **QUIET,
                         **sasl(user), **conf})
    errors = [""] * len(records)

    def done(i: int) -> Any:
        def cb(err: Any, _msg: Any) -> None:
            if err is not None:
                errors[i] = err.name()
        return cb

    for i, (key, value, headers) in enumerate(records):
        producer.produce(topic, key=key, value=value, headers=headers, on_delivery=done(i))
        producer.poll(0)
    assert producer.flush(60) == 0
    return errors


def consume(bootstrap: str, topic: str, count: int, user: str, timeout: float = 30
            ) -> tuple[list[Rec], list[str]]:
    """Records (key, value, headers) from offset 0, and the consumer errors seen."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": unique("g"),
                         "enable.auto.commit": False, **QUIET, **sasl(user)})
    out: list[Rec] = []
    errors: list[str] = []
    try:
        consumer.assign([TopicPartition(topic, 0, 0)])
        deadline = time.monotonic() + timeout
        while len(out) < count and time.monotonic() < deadline:
            msg = consumer.poll(0.3)
            if msg is None:
                continue
            if msg.error():
                errors.append(msg.error().name())
                continue
            out.append((msg.key(), msg.value(), list(msg.headers() or [])))
    finally:
        consumer.close()
    return out, errors


def produced_records(values: list[bytes]) -> list[Rec]:
    return [(f"k{i}".encode(), v, [("trace-id", f"t-{i}".encode())])
            for i, v in enumerate(values)]


def assert_ciphertext(stored: list[Rec], produced: list[Rec], plaintext: list[bytes],
                      fields: bool = False) -> None:
    assert len(stored) == len(produced)
    for (key, value, headers), (pkey, _pvalue, pheaders), secret in zip(
            stored, produced, plaintext, strict=True):
        assert key == pkey  # record keys stay in the clear (partitioning, compaction)
        assert value is not None and secret not in value
        names = [h[0] for h in headers]
        assert headers[:len(pheaders)] == pheaders and "sluice.enc" in names
        assert b"4111-" not in value and all(b"4111-" not in (h[1] or b"") for h in headers)
        if fields:
            doc = json.loads(value)  # the rest of the document stays readable
            assert doc["card"].startswith("sluice:enc:1:") and doc["name"].startswith("Holder")


@pytest.mark.parametrize("codec", ["none", "gzip", "snappy", "lz4", "zstd"])
def test_confluent_idempotent_all_codecs(sasl_broker: SaslBroker, local_proxy: SluiceProxy,
                                         codec: str) -> None:
    topic = unique("enc-" + codec)
    create_topic(local_proxy.bootstrap, topic)
    values = card_values(40, codec)
    records = produced_records(values)
    assert produce(local_proxy.bootstrap, topic, records, "app", **{
        "enable.idempotence": True, "compression.type": codec}) == [""] * 40
    direct, _ = consume(sasl_broker.bootstrap, topic, 40, "admin")  # the broker's bytes
    assert_ciphertext(direct, records, [v[:20] for v in values])
    allowed, errors = consume(local_proxy.bootstrap, topic, 40, "billing-eu")
    assert not errors and allowed == records  # exact keys, values and headers
    refused, errors = consume(local_proxy.bootstrap, topic, 40, "bob")
    assert not errors and refused == direct  # the stored ciphertext, unchanged


def test_fields_with_kafka_python(sasl_broker: SaslBroker, local_proxy: SluiceProxy) -> None:
    from kafka import KafkaConsumer, KafkaProducer

    topic = unique("fenc-kp")
    create_topic(local_proxy.bootstrap, topic)
    values = card_values(25, "kp")
    records = produced_records(values)
    creds = {"security_protocol": "SASL_PLAINTEXT", "sasl_mechanism": "PLAIN"}
    producer = KafkaProducer(bootstrap_servers=local_proxy.bootstrap, **creds,
                             sasl_plain_username="app", sasl_plain_password=PASSWORDS["app"],
                             compression_type="gzip")
    futures = [producer.send(topic, key=k, value=v, headers=h) for k, v, h in records]
    producer.flush(30)
    for fut in futures:
        fut.get(timeout=30)
    producer.close()

    def read(bootstrap: str, user: str) -> list[Rec]:
        consumer = KafkaConsumer(bootstrap_servers=bootstrap, **creds,
                                 sasl_plain_username=user, sasl_plain_password=PASSWORDS[user],
                                 auto_offset_reset="earliest", consumer_timeout_ms=20000)
        from kafka import TopicPartition as KTP

        consumer.assign([KTP(topic, 0)])
        out: list[Rec] = []
        for msg in consumer:
            out.append((msg.key, msg.value, [(k, v) for k, v in msg.headers]))
            if len(out) == len(records):
                break
        consumer.close()
        return out

    direct = read(sasl_broker.bootstrap, "admin")
    assert_ciphertext(direct, records, [v[:20] for v in values], fields=True)
    assert read(local_proxy.bootstrap, "billing-eu") == records
    assert read(local_proxy.bootstrap, "bob") == direct


def test_whole_values_with_aiokafka(sasl_broker: SaslBroker, local_proxy: SluiceProxy) -> None:
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
    from aiokafka import TopicPartition as ATP

    topic = unique("enc-aio")
    create_topic(local_proxy.bootstrap, topic)
    values = card_values(30, "aio")
    records = produced_records(values)

    def creds(user: str) -> dict[str, Any]:
        return {"security_protocol": "SASL_PLAINTEXT", "sasl_mechanism": "PLAIN",
                "sasl_plain_username": user, "sasl_plain_password": PASSWORDS[user]}

    async def write() -> None:
        # Not idempotent: Tansu answers aiokafka's InitProducerId v0 with
        # UNKNOWN_SERVER_ERROR even without the proxy (confluent covers idempotence above).
        producer = AIOKafkaProducer(bootstrap_servers=local_proxy.bootstrap,
                                    compression_type="gzip", **creds("app"))
        await producer.start()
        try:
            sent = [await producer.send(topic, key=k, value=v, headers=h)
                    for k, v, h in records]
            for fut in sent:
                await fut
        finally:
            await producer.stop()

    async def read(bootstrap: str, user: str) -> list[Rec]:
        consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False,
                                    **creds(user))
        await consumer.start()
        out: list[Rec] = []
        try:
            consumer.assign([ATP(topic, 0)])
            await consumer.seek_to_beginning()
            deadline = time.monotonic() + 30
            while len(out) < len(records) and time.monotonic() < deadline:
                for msgs in (await consumer.getmany(timeout_ms=500)).values():
                    out.extend((m.key, m.value, list(m.headers)) for m in msgs)
        finally:
            await consumer.stop()
        return out

    asyncio.run(write())
    direct = asyncio.run(read(sasl_broker.bootstrap, "admin"))
    assert_ciphertext(direct, records, [v[:20] for v in values])
    assert asyncio.run(read(local_proxy.bootstrap, "billing-eu")) == records
    assert asyncio.run(read(local_proxy.bootstrap, "bob")) == direct


def test_transactional_producer(sasl_broker: SaslBroker, local_proxy: SluiceProxy) -> None:
    topic = unique("enc-tx")
    create_topic(local_proxy.bootstrap, topic)
    values = card_values(10, "tx")
    records = produced_records(values)
    producer = Producer({"bootstrap.servers": local_proxy.bootstrap, **QUIET, **sasl("app"),
                         "transactional.id": unique("tx"), "compression.type": "lz4"})
    producer.init_transactions(20)
    producer.begin_transaction()
    for key, value, headers in records:
        producer.produce(topic, key=key, value=value, headers=headers)
    producer.commit_transaction(30)
    direct, _ = consume(sasl_broker.bootstrap, topic, 10, "admin")
    assert_ciphertext(direct, records, [v[:20] for v in values])
    allowed, errors = consume(local_proxy.bootstrap, topic, 10, "billing-eu")
    assert not errors and allowed == records


def events(tmp_path: Path, topic: str) -> list[dict[str, Any]]:
    out = []
    for path in sorted((tmp_path / "telemetry").glob("*.jsonl*")):
        for line in path.read_text().splitlines():
            event = json.loads(line)
            if event.get("type") == "record_batch" and event.get("topic") == topic:
                out.append(event)
    return out


def test_telemetry_names_key_versions_and_offsets(local_proxy: SluiceProxy,
                                                  tmp_path: Path) -> None:
    topic = unique("enc-audit")
    create_topic(local_proxy.bootstrap, topic)
    records = produced_records(card_values(30, "au"))
    assert produce(local_proxy.bootstrap, topic, records, "app") == [""] * 30
    consume(local_proxy.bootstrap, topic, 30, "billing-eu")
    consume(local_proxy.bootstrap, topic, 30, "bob")
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        evs = events(tmp_path, topic)
        fetches = {e["principal"] for e in evs if e["api"] == "fetch"}
        if {"User:billing-eu", "User:bob"} <= fetches:
            break
        time.sleep(0.3)
    produced = [e for e in evs if e["api"] == "produce"]
    covered = set()
    for e in produced:
        [f] = e["filters"]
        [kek] = [k for k in f["detectors"] if k.startswith("kek:payments:")]
        assert version_number(kek.rsplit(":", 1)[1]) == 1  # versions are N-RANDOM
        assert f["name"] == "encrypt-payments" and f["detectors"][kek] == e["records_out"]
        covered |= set(range(e["offset_first"], e["offset_last"] + 1))
    assert covered == set(range(30))
    decrypted = sum(f["detectors"].get("decrypted", 0) for e in evs if e["api"] == "fetch"
                    and e["principal"] == "User:billing-eu" for f in e["filters"])
    withheld = sum(f["detectors"].get("withheld", 0) for e in evs if e["api"] == "fetch"
                   and e["principal"] == "User:bob" for f in e["filters"])
    assert decrypted >= 30 and withheld >= 30


@pytest.mark.spark
def test_encryption_report_from_a_real_proxy(sasl_broker: SaslBroker, tmp_path: Path) -> None:
    """The default (Parquet) telemetry of a real proxy, through the audit job: which KEK
    version sealed which offsets, and what each principal read."""
    from sluice.spark_audit.job import run_audit

    config = write_config(tmp_path, {"type": "local", "path": "keys.json"},
                          telemetry_format="parquet")
    topic = unique("enc-report")
    records = produced_records(card_values(30, "rp"))
    with SluiceProxy(upstream=sasl_broker.bootstrap, config=config) as proxy:
        create_topic(proxy.bootstrap, topic)
        assert produce(proxy.bootstrap, topic, records, "app") == [""] * 30
        assert consume(proxy.bootstrap, topic, 30, "billing-eu")[0] == records
        assert len(consume(proxy.bootstrap, topic, 30, "bob")[0]) == 30
    # Stopping the proxy published its telemetry.
    assert list((tmp_path / "telemetry" / "encryption").rglob("*.parquet"))
    out = tmp_path / "report"
    run_audit(str(tmp_path / "telemetry"), str(out), master="local[2]")
    rows = [r for r in pq.read_table(out / "encryption.parquet").to_pylist()
            if r["topic"] == topic]
    sealed = [(r["partition"], r["key_name"], r["key_version"], r["offset_first"],
               r["offset_last"], r["records"]) for r in rows if r["section"] == "encrypted"]
    assert [(*r[:2], version_number(r[2]), *r[3:]) for r in sealed] == [
        (0, "payments", 1, 0, 29, 30)]
    reads = {r["principal"]: r for r in rows if r["section"] == "read"}
    assert set(reads) == {"User:billing-eu", "User:bob"}
    assert reads["User:billing-eu"]["decrypted"] >= 30 and reads["User:billing-eu"][
        "withheld"] == 0
    assert reads["User:bob"]["withheld"] >= 30 and reads["User:bob"]["decrypted"] == 0
    assert all(r["unreadable"] == 0 and r["failures"] == 0 for r in reads.values())


def test_tampered_record_is_an_error_never_data(sasl_broker: SaslBroker,
                                                local_proxy: SluiceProxy,
                                                tmp_path: Path) -> None:
    topic, forged = unique("enc-ok"), unique("enc-forged")
    create_topic(local_proxy.bootstrap, topic)
    create_topic(local_proxy.bootstrap, forged)
    records = produced_records(card_values(3, "tm"))
    assert produce(local_proxy.bootstrap, topic, records, "app") == ["", "", ""]
    stored, _ = consume(sasl_broker.bootstrap, topic, 3, "admin")
    key, value, headers = stored[1]
    assert value is not None
    flipped = value[:-1] + bytes([value[-1] ^ 1])
    # Someone with access to the broker writes an edited copy (straight to the broker).
    tampered: list[Rec] = [stored[0], (key, flipped, headers)]
    assert produce(sasl_broker.bootstrap, forged, tampered, "admin") == ["", ""]
    got, _errors = consume(local_proxy.bootstrap, forged, 1, "billing-eu", timeout=6)
    assert got == []  # the whole batch's partition fails: nothing is delivered as data
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        failed = [e for e in events(tmp_path, forged) if e["api"] == "fetch" and
                  e["error_code"] == 2]
        if failed:
            break
        time.sleep(0.3)
    assert failed and "failed authentication" in failed[0]["error_message"]
    assert failed[0]["filters"][0]["errors"]


def test_crypto_shredding_with_sluice_keys(sasl_broker: SaslBroker, tmp_path: Path) -> None:
    config = write_config(tmp_path, {"type": "local", "path": "keys.json"},
                          data_key_cache_seconds=0)
    topic = unique("enc-shred")
    records = produced_records(card_values(5, "sh"))
    with SluiceProxy(upstream=sasl_broker.bootstrap, config=config) as proxy:
        create_topic(proxy.bootstrap, topic)
        assert produce(proxy.bootstrap, topic, records, "app") == [""] * 5
        before, _ = consume(proxy.bootstrap, topic, 5, "billing-eu")
        assert before == records
        cmd = [sys.executable, "-m", "sluice", "keys", "delete", "payments", "--config",
               str(config), "--yes"]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        assert "destroyed 1" in done.stdout
        after, errors = consume(proxy.bootstrap, topic, 5, "billing-eu")
    stored, _ = consume(sasl_broker.bootstrap, topic, 5, "admin")
    assert not errors and after == stored  # the stored ciphertext, readable by nobody


@pytest.fixture
def moto_kms() -> Iterator[MotoServer]:
    with MotoServer() as server:
        yield server


def test_aws_kms_down_fails_closed(sasl_broker: SaslBroker, tmp_path: Path,
                                   moto_kms: MotoServer, monkeypatch: pytest.MonkeyPatch
                                   ) -> None:
    for k, v in AWS_ENV.items():
        monkeypatch.setenv(k, v)  # inherited by `sluice serve`
    kms = {"type": "aws", "endpoint_url": moto_kms.endpoint, "region": "us-east-1",
           "auto_create": True, "timeout_seconds": 1}
    # Every batch needs the KMS: a fresh data key per batch, no cached unwraps.
    config = write_config(tmp_path, kms, data_key_max_records=1, data_key_cache_seconds=0)
    topic = unique("enc-aws")
    first = produced_records(card_values(3, "aws"))
    with SluiceProxy(upstream=sasl_broker.bootstrap, config=config) as proxy:
        create_topic(proxy.bootstrap, topic)
        assert produce(proxy.bootstrap, topic, first[:1], "app") == [""]
        assert consume(proxy.bootstrap, topic, 1, "billing-eu")[0] == first[:1]
        moto_kms.stop()
        errors = produce(proxy.bootstrap, topic, first[1:], "app",
                         **{"message.timeout.ms": 5000, "enable.idempotence": True})
        assert all(errors), errors  # refused (retried until the delivery timeout)
        got, _ = consume(proxy.bootstrap, topic, 1, "billing-eu", timeout=6)
        assert got == []  # no ciphertext presented as plaintext, no plaintext either
        refused, _ = consume(proxy.bootstrap, topic, 1, "bob")
        assert len(refused) == 1 and b"4111-" not in (refused[0][1] or b"")
    stored, _ = consume(sasl_broker.bootstrap, topic, 5, "admin", timeout=6)
    assert len(stored) == 1  # nothing was stored while the KMS was down
    evs = events(tmp_path, topic)
    assert any(e["api"] == "produce" and e["error_code"] == 56 for e in evs)
    assert any(e["api"] == "fetch" and e["error_code"] == 56 for e in evs)


# ------------------------------------------------------------------ Kafka's batch checks
@pytest.fixture(scope="module")
def relayed(broker: object) -> Iterator[Relayed]:
    """The session's Kafka node (PLAINTEXT listener) behind the validating relay."""
    with relay_in_front(broker) as stack:
        yield stack


@pytest.mark.parametrize("codec", ["none", "gzip", "snappy", "lz4", "zstd"])
def test_forwarded_batches_pass_kafkas_checks_and_hold_no_plaintext(
        relayed: Relayed, tmp_path: Path, codec: str) -> None:
    """Through the validating relay (every produced batch checked as Apache Kafka would):
    idempotent batches keep their sequence numbers, counts and CRCs; the raw stored batches,
    decompressed, contain none of the produced values."""
    path = tmp_path / "sluice.yaml"
    path.write_text(yaml.safe_dump({
        "filters": [{"name": "enc", "module": "builtin:encrypt", "topics": ["enc-*"],
                     "apply_to": ["produce", "fetch"],
                     "config": {"key": "k", "decrypt_for": ["User:ANONYMOUS"]}}],
        "kms": {"type": "local", "path": "keys.json"}}))
    topic = unique("enc-relay-" + codec)
    values = card_values(300, codec)
    with SluiceProxy(upstream=relayed.bootstrap, config=path) as proxy:
        admin = AdminClient({"bootstrap.servers": proxy.bootstrap, **QUIET})
        for fut in admin.create_topics([NewTopic(topic, 1, 1)]).values():
            fut.result(20)
        producer = Producer({"bootstrap.servers": proxy.bootstrap, "enable.idempotence": True,
                             "compression.type": codec, "linger.ms": 5,
                             "batch.num.messages": 50, **QUIET})
        for i, value in enumerate(values):
            producer.produce(topic, key=b"k%d" % i, value=value)
        assert producer.flush(60) == 0
        consumer = Consumer({"bootstrap.servers": proxy.bootstrap, "group.id": unique("g"),
                             **QUIET})
        consumer.assign([TopicPartition(topic, 0, 0)])
        got: list[bytes | None] = []
        deadline = time.monotonic() + 30
        while len(got) < len(values) and time.monotonic() < deadline:
            msg = consumer.poll(0.3)
            if msg is not None and not msg.error():
                got.append(msg.value())
        consumer.close()
    relayed.relay.assert_clean()
    assert got == values
    stored_bytes = b"".join(
        bytes(records_section(b)) for b in fetch_batches(relayed.bootstrap, topic, 0, 0))
    assert stored_bytes and b"4111-" not in stored_bytes and b"Holder" not in stored_bytes
    assert stored_bytes.count(b"sluice.enc") >= 1  # the proxy's envelope header
