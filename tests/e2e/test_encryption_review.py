"""The design review's findings on ``builtin:encrypt`` (issue 30), end to end: real
confluent-kafka clients with SCRAM principals, a real `sluice serve`, Apache Kafka's own
SASL_PLAINTEXT listener (the session's node: users made for this module and ACLs on its
topics, both removed after; its PLAINTEXT listener where the principal must be ANONYMOUS),
AWS KMS on moto's server. One test per finding; each failed before the fix.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AclOperation, AdminClient, NewTopic, ResourceType

from tests.crypto.layout_edit import wrapped_dek
from tests.e2e.clients import QUIET, unique
from tests.harness.broker import TansuBroker
from tests.harness.kafka_admin import KafkaAdmin
from tests.harness.kafka_broker import KafkaCluster
from tests.harness.moto import AWS_ENV, MotoServer
from tests.harness.proxy import SluiceProxy

# Made for this module (SCRAM-SHA-512); `app` and `admin` (the super user) are the node's own,
# their passwords filled in by `sasl_broker`.
USERS = {"card-1": "card-Pa55-2", "iban-1": "iban-Pa55-3", "both-1": "both-Pa55-4",
         "hr-1": "hr-Pa55-6"}
MADE = tuple(USERS)
Rec = tuple[bytes | None, bytes | None, list[tuple[str, bytes]]]


def sasl(user: str | None) -> dict[str, Any]:
    if user is None:
        return {}
    return {"security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "SCRAM-SHA-512",
            "sasl.username": user, "sasl.password": USERS[user]}


@dataclass(frozen=True)
class SaslBroker:
    """Kafka's SASL_PLAINTEXT listener (the address the proxy dials and admin reads from)."""

    bootstrap: str


@pytest.fixture(scope="module")
def sasl_broker(kafka_broker: KafkaCluster) -> Iterator[SaslBroker]:
    USERS.update({user: kafka_broker.password(user) for user in ("app", "admin")})
    admin = KafkaAdmin(kafka_broker)
    grants = []
    try:
        for user in MADE:
            admin.add_scram_user(user, USERS[user])
        for user in (*MADE, "app"):
            principal = f"User:{user}"
            for kind, name in ((ResourceType.TOPIC, "pay-"), (ResourceType.TOPIC, "hr-"),
                               (ResourceType.GROUP, "g-")):
                grants += admin.grant(principal, kind, name, AclOperation.ALL, prefixed=True)
        bootstrap = kafka_broker.bootstrap_for("SASL_PLAINTEXT")
        wait_for_login(bootstrap, MADE)
        yield SaslBroker(bootstrap)
    finally:
        admin.revoke(grants)
        for user in MADE:
            admin.remove_scram_user(user)


def wait_for_login(bootstrap: str, users: tuple[str, ...], timeout: float = 20) -> None:
    """Until Kafka knows every user made at run time (its metadata log applies them)."""
    deadline = time.monotonic() + timeout
    for user in users:
        while True:
            try:
                AdminClient({"bootstrap.servers": bootstrap, **QUIET, **sasl(user)}
                            ).list_topics(timeout=5)
                break
            except KafkaException:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.3)


def enc(name: str, topics: list[str], **config: Any) -> dict[str, Any]:
    return {"name": name, "module": "builtin:encrypt", "topics": topics,
            "apply_to": ["produce", "fetch"], "config": config}


def write_config(tmp_path: Path, filters: list[dict[str, Any]],
                 kms: dict[str, Any] | None = None) -> Path:
    (tmp_path / "telemetry").mkdir(exist_ok=True)
    path = tmp_path / "sluice.yaml"
    path.write_text(yaml.safe_dump({
        "filters": filters, "kms": kms or {"type": "local", "path": "keys.json"},
        "telemetry": {"dir": str(tmp_path / "telemetry"), "format": "jsonl"}}))
    return path


def create_topic(bootstrap: str, topic: str, user: str | None = "admin") -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap, **QUIET, **sasl(user)})
    for fut in admin.create_topics([NewTopic(topic, 1, 1)]).values():
        fut.result(20)


def produce(bootstrap: str, topic: str, records: list[Rec], user: str | None,
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


def consume(bootstrap: str, topic: str, count: int, user: str | None, timeout: float = 30
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


def fetch_errors(tmp_path: Path, topic: str, code: int, timeout: float = 10
                 ) -> list[dict[str, Any]]:
    """Telemetry record_batch events of fetches of `topic` answered with `code`."""
    deadline = time.monotonic() + timeout
    found: list[dict[str, Any]] = []
    while time.monotonic() < deadline and not found:
        for path in sorted((tmp_path / "telemetry").glob("*.jsonl*")):
            for line in path.read_text().splitlines():
                event = json.loads(line)
                if (event.get("type") == "record_batch" and event.get("topic") == topic
                        and event.get("api") == "fetch" and event.get("error_code") == code):
                    found.append(event)
        time.sleep(0.3)
    return found


DOC = {"card": "4111-0000-1111", "iban": "DE89-3704-0044", "name": "Holder"}


def test_bound_keks_topics_and_reverse_unwrapping(sasl_broker: SaslBroker,
                                                  tmp_path: Path) -> None:
    """Finding 1: two fields-mode filters on one topic: a card reader never gets the IBAN
    (it did); nested seals unwrap in reverse; an hr record copied into a payments topic in the
    broker stays sealed for the payments readers."""
    config = write_config(tmp_path, [
        enc("card", ["pay-*"], key="cards", fields=["card"],
            decrypt_for=["User:card-*", "User:both-*"]),
        enc("iban", ["pay-*"], key="ibans", fields=["iban"],
            decrypt_for=["User:iban-*", "User:both-*"]),
        enc("hr", ["hr-*"], key="hr", decrypt_for=["User:hr-*"]),
    ])
    topic, hr_topic = unique("pay-x"), unique("hr-x")
    value = json.dumps(DOC).encode()
    produced: list[Rec] = [(b"k1", value, [("trace", b"t1")])]
    with SluiceProxy(upstream=sasl_broker.bootstrap, config=config) as proxy:
        create_topic(proxy.bootstrap, topic)
        create_topic(proxy.bootstrap, hr_topic)
        assert produce(proxy.bootstrap, topic, produced, "app") == [""]
        [card], errors = consume(proxy.bootstrap, topic, 1, "card-1")
        assert not errors and b"DE89" not in (card[1] or b"") and b"4111" not in (card[1] or b"")
        [iban], _ = consume(proxy.bootstrap, topic, 1, "iban-1")
        doc = json.loads(iban[1] or b"")
        assert doc["iban"] == DOC["iban"] and doc["card"].startswith("sluice:enc:1:")
        both, errors = consume(proxy.bootstrap, topic, 1, "both-1")
        assert not errors and both == produced
        # A withheld hr record, copied by someone with broker access into the payments topic.
        assert produce(proxy.bootstrap, hr_topic, [(b"e", b"salary 9000", [])], "app") == [""]
        [stored_hr], _ = consume(sasl_broker.bootstrap, hr_topic, 1, "admin")
        assert produce(sasl_broker.bootstrap, topic, [stored_hr], "admin") == [""]
        got, errors = consume(proxy.bootstrap, topic, 2, "both-1")
        assert not errors and got[0] == produced[0] and got[1] == stored_hr  # still sealed
        assert b"salary" not in (got[1][1] or b"")


def test_forged_encryption_headers_are_refused(sasl_broker: SaslBroker,
                                               tmp_path: Path) -> None:
    """Finding 2: a tombstone or a document without the listed fields, carrying a sluice.enc
    header, used to be stored and then fail every allowed fetch; now the produce is refused
    and the allowed readers keep reading."""
    config = write_config(tmp_path, [enc("card", ["pay-*"], key="cards", fields=["card"],
                                         decrypt_for=["User:card-*"])])
    topic = unique("pay-forged")
    good: Rec = (b"k", json.dumps(DOC).encode(), [])
    with SluiceProxy(upstream=sasl_broker.bootstrap, config=config) as proxy:
        create_topic(proxy.bootstrap, topic)
        assert produce(proxy.bootstrap, topic, [good], "app") == [""]
        forged: list[Rec] = [(b"k", None, [("sluice.enc", b"2;value")]),
                             (b"k", b'{"name": "x"}', [("sluice.enc", b"1;fields")])]
        for rec in forged:
            errors = produce(proxy.bootstrap, topic, [rec], "app",
                             **{"message.timeout.ms": 5000})
            assert errors == ["INVALID_RECORD"]
        assert produce(proxy.bootstrap, topic, [good], "app") == [""]
        got, errors = consume(proxy.bootstrap, topic, 2, "card-1")
        assert not errors and got == [good, good]
    stored, _ = consume(sasl_broker.bootstrap, topic, 3, "admin", timeout=5)
    assert len(stored) == 2  # nothing forged reached the broker


def test_fields_mode_edit_in_the_broker_is_an_error(sasl_broker: SaslBroker,
                                                    tmp_path: Path) -> None:
    """Finding 3: a clear member edited in the broker used to reach the allowed reader with
    error 0; now the partition fails (CORRUPT_MESSAGE) and the edit is never delivered."""
    config = write_config(tmp_path, [enc("card", ["pay-*"], key="cards", fields=["card"],
                                         decrypt_for=["User:card-*"])])
    topic = unique("pay-edit")
    produced: list[Rec] = [(b"k", json.dumps(DOC).encode(), [("trace", b"t")])]
    with SluiceProxy(upstream=sasl_broker.bootstrap, config=config) as proxy:
        create_topic(proxy.bootstrap, topic)
        assert produce(proxy.bootstrap, topic, produced, "app") == [""]
        [(key, value, headers)], _ = consume(sasl_broker.bootstrap, topic, 1, "admin")
        assert value is not None and b"Holder" in value
        edited = value.replace(b"Holder", b"Mallory")
        assert produce(sasl_broker.bootstrap, topic, [(key, edited, headers)], "admin") == [""]
        got, _ = consume(proxy.bootstrap, topic, 2, "card-1", timeout=6)
        assert got == []  # the partition fails: the edit is never delivered as data
    assert fetch_errors(tmp_path, topic, 2)


def test_dead_letter_config_is_refused(tmp_path: Path) -> None:
    """Finding 4: `on_error: dead-letter` would copy plaintext to the dead-letter topic."""
    filt = {**enc("card", ["pay-*"], key="cards"), "on_error": "dead-letter",
            "dead_letter_topic": "dlq"}
    config = write_config(tmp_path, [filt])
    done = subprocess.run([sys.executable, "-m", "sluice", "config", "check", str(config)],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    line = config.read_text().splitlines().index("  on_error: dead-letter") + 1
    assert f"sluice.yaml:{line}: filters[0].on_error: builtin:encrypt cannot use " \
           f"'dead-letter'" in done.stderr


def test_a_damaged_keyring_is_retriable_and_nothing_is_skipped(sasl_broker: SaslBroker,
                                                               tmp_path: Path) -> None:
    """Finding 5: a damaged keyring entry used to make the allowed fetch drop the records
    with error 0 (consumers moved past them); now the partition fails with 56 until the
    keyring is repaired, and then every record arrives."""
    config = write_config(tmp_path, [enc("card", ["pay-*"], key="cards", fields=["card"],
                                         decrypt_for=["User:card-*"],
                                         data_key_cache_seconds=0)])
    topic = unique("pay-damaged")
    produced: list[Rec] = [(b"k%d" % i, json.dumps({**DOC, "i": i}).encode(), [])
                           for i in range(5)]
    ring = tmp_path / "keys.json"
    with SluiceProxy(upstream=sasl_broker.bootstrap, config=config) as proxy:
        create_topic(proxy.bootstrap, topic)
        assert produce(proxy.bootstrap, topic, produced, "app") == [""] * 5
        good = ring.read_bytes()
        data = json.loads(good)
        for ver in data["keys"]["cards"]["versions"].values():
            ver["material"] = "%%damaged%%"
        ring.write_text(json.dumps(data))
        consumer = Consumer({"bootstrap.servers": proxy.bootstrap, "group.id": unique("g"),
                             "enable.auto.commit": False, **QUIET, **sasl("card-1")})
        got: list[Rec] = []
        try:
            consumer.assign([TopicPartition(topic, 0, 0)])
            deadline = time.monotonic() + 5
            while time.monotonic() < deadline:
                msg = consumer.poll(0.3)
                if msg is not None and not msg.error():
                    got.append((msg.key(), msg.value(), list(msg.headers() or [])))
            assert got == []  # nothing delivered, nothing skipped
            errors = produce(proxy.bootstrap, topic, produced[:1], "app",
                             **{"message.timeout.ms": 4000})
            assert errors == ["_MSG_TIMED_OUT"]  # retried (56), never refused for good (87)
            ring.write_bytes(good)  # repaired: the same consumer now reads everything
            deadline = time.monotonic() + 30
            while len(got) < 5 and time.monotonic() < deadline:
                msg = consumer.poll(0.3)
                if msg is not None and not msg.error():
                    got.append((msg.key(), msg.value(), list(msg.headers() or [])))
        finally:
            consumer.close()
        assert got == produced
    assert fetch_errors(tmp_path, topic, 56)


@pytest.fixture
def moto_kms() -> Iterator[MotoServer]:
    with MotoServer() as server:
        yield server


def test_aws_keys_delete_stays_in_its_alias_prefix(moto_kms: MotoServer, tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """Finding 6: `sluice keys delete NAME` used to disable every key tagged NAME in the
    account; now only the keys of the config's alias_prefix."""
    import boto3

    for k, v in AWS_ENV.items():
        monkeypatch.setenv(k, v)
    configs = {}
    for team in ("red", "blue"):
        path = tmp_path / f"{team}.yaml"
        path.write_text(yaml.safe_dump({"kms": {
            "type": "aws", "endpoint_url": moto_kms.endpoint, "region": "us-east-1",
            "alias_prefix": f"{team}/", "auto_create": True}}))
        configs[team] = path

    def keys(team: str, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "sluice", "keys", *args, "--config",
                               str(configs[team])], capture_output=True, text=True, timeout=60)

    for team in ("red", "blue"):
        assert keys(team, "create", "payments").returncode == 0
    assert keys("blue", "rotate", "payments").returncode == 0
    done = keys("red", "delete", "payments", "--yes")
    assert done.returncode == 0, done.stderr
    client = boto3.client("kms", region_name="us-east-1", endpoint_url=moto_kms.endpoint)
    states = {}
    for alias in client.list_aliases()["Aliases"]:
        if alias["AliasName"].startswith("alias/blue/"):
            states["current"] = client.describe_key(KeyId=alias["TargetKeyId"])[
                "KeyMetadata"]["KeyState"]
    listed = json.loads(keys("blue", "list", "--json").stdout)
    [blue] = [k for k in listed if k["name"] == "payments"]
    assert states == {"current": "Enabled"} and len(blue["versions"]) == 2
    assert not blue["destroyed_versions"]


def test_anonymous_and_the_per_key_bound_on_a_plain_broker(broker: TansuBroker,
                                                           tmp_path: Path) -> None:
    """Finding 7: `decrypt_for: ["User:*"]` used to let in every connection without a
    principal (User:ANONYMOUS); and one batch larger than data_key_max_records was sealed
    under one data key."""
    config = write_config(tmp_path, [enc("enc", ["anon-*"], key="k", decrypt_for=["User:*"],
                                         data_key_max_records=100)])
    topic = unique("anon-x")
    produced: list[Rec] = [(b"k%d" % i, b"secret %d" % i, []) for i in range(250)]
    with SluiceProxy(upstream=broker.bootstrap, config=config) as proxy:
        create_topic(proxy.bootstrap, topic, user=None)
        assert produce(proxy.bootstrap, topic, produced, None,
                       **{"linger.ms": 1000, "batch.num.messages": 10000}) == [""] * 250
        got, errors = consume(proxy.bootstrap, topic, 250, None)
    assert not errors and len(got) == 250
    assert all(b"secret" not in (v or b"") for _k, v, _h in got)  # withheld: ciphertext
    per_key: dict[bytes, int] = {}
    for _k, _v, headers in got:
        dek = wrapped_dek(headers)
        per_key[dek] = per_key.get(dek, 0) + 1
    assert max(per_key.values()) <= 100

