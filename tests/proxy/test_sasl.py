"""SASL pass-through: the proxy learns who authenticated (PLAIN, SCRAM-SHA-256/512) without
taking part, puts ``User:<name>`` in telemetry, binds filters per principal, never logs secrets.

The broker side of the exchange is Apache Kafka's own SASL_PLAINTEXT listener (the session's
Kafka node: PLAIN and SCRAM-SHA-512 users, ACLs): the principals are the ones Kafka itself
authenticated. (Tansu 0.6 cannot authenticate anyone from a fresh memory store; until the
Kafka harness these tests ran against a hand-made SASL front before Tansu.) The last test
keeps Tansu with `--authentication`: its SCRAM failure (error code 0 and "e=unknown-user"
inside the server-final-message) is one the proxy must read too.
"""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
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

from sluice.codec import entities
from sluice.codec.headers import response_header_bytes
from sluice.codec.messages import ApiKey, encode_response
from sluice.proxy.paths.sasl import (
    SaslState,
    plain_user,
    response_error_code,
    sasl_step,
    scram_user,
)
from tests.e2e.clients import QUIET, unique
from tests.harness.broker import tansu_binary
from tests.harness.kafka_broker import KafkaCluster
from tests.harness.ports import free_port, wait_for_port
from tests.harness.proxy import SluiceProxy
from tests.proxy.proxy_output import wait_for_output

StartProxy = Callable[..., SluiceProxy]

# The users' passwords: random per Kafka run, filled in by the `sasl_broker` fixture. (A user
# name that needs SCRAM's =2C / =3D escaping is covered by the parsing tests above: the Kafka
# harness's users are plain names.)
USERS: dict[str, str] = {}


# ------------------------------------------------------------------ parsing (pure)


def test_plain_user_is_the_authcid() -> None:
    assert plain_user(b"\x00alice\x00secret") == "alice"
    assert plain_user(b"admin\x00alice\x00secret") == "alice"
    assert plain_user(b"alice\x00secret") is None
    assert plain_user(b"\x00\x00secret") is None


def test_scram_user_from_client_first_message() -> None:
    assert scram_user(b"n,,n=alice,r=fyko+d2lbbFgONRv9qkxdawL") == "alice"
    assert scram_user(b"n,,n=carol=2Cops=3Dx,r=abc") == "carol,ops=x"
    assert scram_user(b"y,,n=bob,r=abc") == "bob"
    assert scram_user(b"n,a=admin,n=bob,r=abc") == "bob"
    assert scram_user(b"p=tls-unique,,n=dave,r=abc") == "dave"
    assert scram_user(b"n,,n=bad=41,r=abc") is None  # "=" must be =2C or =3D
    assert scram_user(b"c=biws,r=abc,p=xyz") is None
    assert scram_user(b"\xff\xfe") is None
    assert scram_user(b"n,,r=abc") is None


def test_scram_principal_waits_for_the_final_step() -> None:
    state = SaslState(mechanism="SCRAM-SHA-256")
    first = sasl_step(state, b"n,,n=alice,r=abc")
    assert (first.user, first.final) == ("alice", False)
    final = sasl_step(state, b"c=biws,r=abcdef,p=cHJvb2Y=")
    assert (final.user, final.final) == ("alice", True)
    plain = sasl_step(SaslState(mechanism="PLAIN"), b"\x00bob\x00pw")
    assert (plain.user, plain.final) == ("bob", True)
    unknown = sasl_step(SaslState(mechanism="OAUTHBEARER"), b"n,,\x01auth=Bearer x\x01\x01")
    assert (unknown.user, unknown.final) == (None, False)


@pytest.mark.parametrize("version", [0, 1, 2])
def test_error_code_read_from_real_response_encodings(version: int) -> None:
    cls = entities.response_class(ApiKey.SASL_AUTHENTICATE, version)
    for code in (0, 58):
        body = encode_response(
            entities.build(cls, error_code=code, error_message=None, auth_bytes=b"v=x")
        )
        frame = response_header_bytes(5, ApiKey.SASL_AUTHENTICATE, version) + body
        assert response_error_code(frame, ApiKey.SASL_AUTHENTICATE, version) == code


# ------------------------------------------------------------------ through the proxy


@dataclass(frozen=True)
class SaslBroker:
    """Kafka's SASL_PLAINTEXT listener, which the proxy dials."""

    bootstrap: str


@pytest.fixture(scope="module")
def sasl_broker(kafka_broker: KafkaCluster) -> Iterator[SaslBroker]:
    USERS.update({user: kafka_broker.password(user) for user in ("alice", "bob", "app", "admin")})
    bootstrap = kafka_broker.bootstrap_for("SASL_PLAINTEXT")
    # Ordinary users may do nothing until an ACL says so: topics sasl-* and every group.
    admin = AdminClient({"bootstrap.servers": bootstrap, **QUIET, **sasl_conf("PLAIN", "admin")})
    bindings = [
        AclBinding(kind, name, pattern, f"User:{user}", "*", AclOperation.ALL,
                   AclPermissionType.ALLOW)
        for user in ("alice", "bob", "app")
        for kind, name, pattern in ((ResourceType.TOPIC, "sasl-", ResourcePatternType.PREFIXED),
                                    (ResourceType.GROUP, "*", ResourcePatternType.LITERAL))
    ]
    for future in admin.create_acls(bindings).values():
        future.result(20)
    yield SaslBroker(bootstrap)
    # The node is the session's: other modules (tests/e2e/test_kafka_tools.py) count on `bob`
    # having no ACL at all.
    filters = [AclBindingFilter(b.restype, b.name, b.resource_pattern_type, b.principal, b.host,
                                b.operation, b.permission_type) for b in bindings]
    for future in admin.delete_acls(filters).values():
        future.result(20)


def sasl_conf(mechanism: str, user: str, password: str | None = None) -> dict[str, Any]:
    return {
        "security.protocol": "SASL_PLAINTEXT",
        "sasl.mechanism": mechanism,
        "sasl.username": user,
        "sasl.password": USERS[user] if password is None else password,
    }


def write_config(tmp_path: Path, telemetry_dir: Path) -> Path:
    config = {
        "filters": [
            {
                "name": "mask",
                "module": "builtin:pii-mask",
                "topics": ["sasl-*"],
                "apply_to": ["produce"],
            },
            {
                # Only bob's records must be JSON: a filter bound to one principal.
                "name": "bob-json",
                "module": "builtin:json-validate",
                "topics": ["sasl-*"],
                "apply_to": ["produce"],
                "principals": ["User:bob"],
            },
        ],
        "telemetry": {"dir": str(telemetry_dir), "format": "jsonl"},
    }
    path = tmp_path / "sluice.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


@pytest.fixture
def telemetry_dir(tmp_path: Path) -> Path:
    d = tmp_path / "telemetry"
    d.mkdir()
    return d


@pytest.fixture
def sasl_proxy(
    sasl_broker: SaslBroker, start_proxy: StartProxy, tmp_path: Path, telemetry_dir: Path
) -> SluiceProxy:
    return start_proxy(
        config=write_config(tmp_path, telemetry_dir),
        upstream=sasl_broker.bootstrap,
        extra_args=["--log-level", "debug"],
    )


def create_topic(bootstrap: str, topic: str, conf: dict[str, Any]) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap, **QUIET, **conf})
    for fut in admin.create_topics([NewTopic(topic, 1, 1)]).values():
        fut.result(20)


def produce(bootstrap: str, topic: str, values: list[bytes], conf: dict[str, Any]) -> list[str]:
    """Errors per record ("" when delivered)."""
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, **QUIET, **conf})
    errors = [""] * len(values)

    def callback(i: int) -> Callable[[Any, Any], None]:
        def cb(err: Any, msg: Any) -> None:
            if err is not None:
                errors[i] = err.name()

        return cb

    for i, value in enumerate(values):
        producer.produce(topic, value=value, on_delivery=callback(i))
    assert producer.flush(30) == 0
    return errors


def consume(bootstrap: str, topic: str, count: int, conf: dict[str, Any]) -> list[bytes]:
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": unique("g"),
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
            **QUIET,
            **conf,
        }
    )
    try:
        consumer.assign([TopicPartition(topic, 0, 0)])
        out: list[bytes] = []
        deadline = time.monotonic() + 30
        while len(out) < count and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            value = msg.value() if msg is not None and msg.error() is None else None
            if value is not None:
                out.append(value)
        return out
    finally:
        consumer.close()


def batch_events(
    directory: Path, topic: str, want: int, timeout: float = 15
) -> list[dict[str, Any]]:
    deadline = time.monotonic() + timeout
    events: list[dict[str, Any]] = []
    while time.monotonic() < deadline:
        events = []
        for path in sorted(directory.glob("*.jsonl*")):
            for line in path.read_text().splitlines():
                try:
                    event = json.loads(line)
                except json.JSONDecodeError:
                    continue
                if event.get("type") == "record_batch" and event.get("topic") == topic:
                    events.append(event)
        if sum(e["records_in"] for e in events) >= want:
            break
        time.sleep(0.2)
    return events


@pytest.mark.kafka
@pytest.mark.parametrize(("mechanism", "user"), [("PLAIN", "alice"), ("SCRAM-SHA-512", "app")])
def test_principal_in_telemetry(
    mechanism: str,
    user: str,
    sasl_broker: SaslBroker,
    sasl_proxy: SluiceProxy,
    telemetry_dir: Path,
) -> None:
    conf = sasl_conf(mechanism, user)
    topic = unique("sasl-" + mechanism.lower())
    create_topic(sasl_proxy.bootstrap, topic, conf)
    values = [b'{"email": "ann@example.com"}', b"call +44 20 7946 0958"]
    assert produce(sasl_proxy.bootstrap, topic, values, conf) == ["", ""]
    stored = consume(sasl_proxy.bootstrap, topic, 2, conf)
    assert len(stored) == 2 and b"ann@example.com" not in stored[0]  # the filter ran
    events = batch_events(telemetry_dir, topic, 2)
    assert events and {e["principal"] for e in events} == {f"User:{user}"}
    # Kafka authenticated this user (the proxy only watched): with a wrong password it refuses.
    assert wait_for_output(sasl_proxy, "sasl_authenticated", mechanism)
    bad = AdminClient({"bootstrap.servers": sasl_broker.bootstrap, **QUIET,
                       **sasl_conf(mechanism, user, password="not-" + USERS[user])})
    with pytest.raises(KafkaException):
        bad.list_topics(timeout=3)


@pytest.mark.kafka
def test_filters_bind_per_principal(sasl_proxy: SluiceProxy) -> None:
    topic = unique("sasl-bind")
    alice, bob = sasl_conf("SCRAM-SHA-512", "alice"), sasl_conf("PLAIN", "bob")
    create_topic(sasl_proxy.bootstrap, topic, alice)
    assert produce(sasl_proxy.bootstrap, topic, [b"not json"], alice) == [""]
    # A rejected record fails its whole batch, so bob's records go one at a time.
    assert produce(sasl_proxy.bootstrap, topic, [b"not json"], bob) == ["INVALID_RECORD"]
    assert produce(sasl_proxy.bootstrap, topic, [b'{"ok": 1}'], bob) == [""]


@pytest.mark.kafka
def test_an_acl_denial_reaches_the_client_through_the_proxy(
    sasl_broker: SaslBroker, sasl_proxy: SluiceProxy
) -> None:
    """bob may use topics sasl-* only: Kafka's denial comes back as its own error code."""
    topic = unique("acl-denied")
    create_topic(sasl_broker.bootstrap, topic, sasl_conf("PLAIN", "admin"))
    bob = sasl_conf("SCRAM-SHA-512", "bob")
    producer = Producer({"bootstrap.servers": sasl_proxy.bootstrap, "message.timeout.ms": 10000,
                         **QUIET, **bob})
    errors: list[KafkaError] = []
    producer.produce(topic, value=b"x", on_delivery=lambda err, _msg: errors.append(err))
    producer.flush(20)
    assert errors and errors[0] is not None, errors
    assert errors[0].code() == KafkaError.TOPIC_AUTHORIZATION_FAILED, errors


@pytest.mark.kafka
def test_wrong_password_sets_no_principal(
    sasl_broker: SaslBroker, sasl_proxy: SluiceProxy
) -> None:
    for mechanism in ("PLAIN", "SCRAM-SHA-512"):
        errors: list[KafkaError] = []
        admin = AdminClient(
            {
                "bootstrap.servers": sasl_proxy.bootstrap,
                **QUIET,
                **sasl_conf(mechanism, "bob", password="wrong-password-123"),
                "error_cb": errors.append,
            }
        )
        with pytest.raises(KafkaException):
            admin.list_topics(timeout=3)
        deadline = time.monotonic() + 10
        while not errors and time.monotonic() < deadline:
            admin.poll(0.2)  # serves error_cb
        # Kafka's own authentication error reaches the client through the proxy.
        assert any(e.code() == KafkaError._AUTHENTICATION for e in errors), errors
        assert any("Authentication failed" in e.str() for e in errors), errors
    assert wait_for_output(sasl_proxy, "sasl_failed")
    failed = [line for line in sasl_proxy.output if "sasl_failed" in line]
    assert failed and not any("sasl_authenticated" in line for line in sasl_proxy.output)
    assert all('"principal"' not in line for line in failed)


@pytest.mark.kafka
def test_credentials_never_logged(sasl_proxy: SluiceProxy, telemetry_dir: Path) -> None:
    # The proxy runs with --log-level debug here.
    topic = unique("sasl-secret")
    create_topic(sasl_proxy.bootstrap, topic, sasl_conf("PLAIN", "alice"))
    for mechanism, user in (("PLAIN", "alice"), ("SCRAM-SHA-512", "bob")):
        conf = sasl_conf(mechanism, user)
        assert produce(sasl_proxy.bootstrap, topic, [b'{"n": 1}'], conf) == [""]
    typo = "typo-Pa55word-0000"
    admin = AdminClient(
        {"bootstrap.servers": sasl_proxy.bootstrap, **QUIET, **sasl_conf("PLAIN", "bob", typo)}
    )
    with pytest.raises(KafkaException):
        admin.list_topics(timeout=2)
    assert wait_for_output(sasl_proxy, "sasl_failed")
    output = "".join(sasl_proxy.output)
    assert "sasl_authenticated" in output
    assert '"event": "sasl_authenticate", "level": "debug"' in output
    telemetry = "".join(p.read_text() for p in telemetry_dir.glob("*.jsonl*"))
    for password in (*USERS.values(), typo):
        assert password not in output
        assert password not in telemetry


# ------------------------------------------------------------------ real Tansu SCRAM frames


@pytest.fixture
def tansu_with_authentication(tmp_path: Path) -> Iterator[str]:
    """Tansu with --authentication: it runs real SCRAM exchanges, but knows no user."""
    port = free_port()
    url = f"tcp://127.0.0.1:{port}"
    with (tmp_path / "tansu.log").open("wb") as log:
        proc = subprocess.Popen(
            [
                str(tansu_binary()),
                "broker",
                "--listener-url",
                url,
                "--advertised-listener-url",
                url,
                "--storage-engine",
                "memory://tansu/",
                "--authentication",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:
        wait_for_port(port, timeout=15)
        yield f"127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def test_real_tansu_scram_exchange_passes_through(
    tansu_with_authentication: str, start_proxy: StartProxy
) -> None:
    proxy = start_proxy(upstream=tansu_with_authentication, extra_args=["--log-level", "debug"])
    admin = AdminClient(
        {"bootstrap.servers": proxy.bootstrap, **QUIET,
         **sasl_conf("SCRAM-SHA-512", "alice", password="alice-Pa55word-7f3a")}
    )
    with pytest.raises(KafkaException):
        admin.list_topics(timeout=3)
    assert wait_for_output(proxy, '"sasl_failed"')
    steps = [json.loads(line) for line in proxy.output if '"sasl_authenticate"' in line]
    # Both SCRAM steps reached the broker through the proxy, who saw only the user name.
    assert [(s["user"], s["final"]) for s in steps[:2]] == [("alice", False), ("alice", True)]
    # Tansu answers the final step with error_code 0 and "e=unknown-user" inside the SCRAM
    # server-final-message: the proxy must read the message, not only the error code.
    failed = [json.loads(line) for line in proxy.output if '"sasl_failed"' in line]
    assert failed and all(f["mechanism"] == "SCRAM-SHA-512" for f in failed)
    assert not any('"sasl_authenticated"' in line for line in proxy.output)
    assert not any("protocol_violation" in line for line in proxy.output)
