"""The proxy's own connections to the brokers: SASL (PLAIN, SCRAM-SHA-256/512) and TLS as
configured, used by the dead-letter writer; and the `upstream_sasl:` / `dead_letters:` sections.

The broker is Apache Kafka (a node of this folder's own, `relayed_kafka`): its SASL_PLAINTEXT
listener checks PLAIN passwords and SCRAM proofs, its SSL listener wants a client certificate,
and its ACLs say who the dialer authenticated as (a user may describe a topic only if an ACL
names it). Each client listener is announced at a counting TCP relay, which counts the
connections the writer opens and understands nothing of TLS or SASL.
"""

from __future__ import annotations

import asyncio
import base64
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka.admin import AclOperation, ScramMechanism
from structlog.testing import capture_logs

from sluice.codec import entities, schemas
from sluice.codec.error_codes import ErrorCode
from sluice.codec.messages import ApiKey
from sluice.proxy.contract import UpstreamError
from sluice.proxy.net.tls import UpstreamTLS
from sluice.proxy.net.upstream_client import UpstreamAuthError, UpstreamDialer
from sluice.proxy.net.upstream_sasl import SaslClientError, ScramClient, UpstreamSasl
from sluice.proxy.ops.config import ConfigFileError, DeadLetterSettings, ProxyConfig
from sluice.proxy.ops.config_load import build_config
from sluice.proxy.telemetry.dead_letters import DeadLetterWriter
from tests.e2e.clients import unique
from tests.harness.kafka_relay import REAUTH_MS, RelayedKafka, wait_until
from tests.proxy.dead_letter_helpers import (
    config_for,
    consume_with_partitions,
    create_topic_with,
    letters,
)

# A SCRAM user whose name needs SCRAM's =2C / =3D escaping on the way; made at run time.
CAROL = "carol,ops=x"
CAROL_PASSWORD = "carol-Pa55word-5d0e"
SCRAM = (ScramMechanism.SCRAM_SHA_256, ScramMechanism.SCRAM_SHA_512)


@pytest.fixture(scope="module")
def kafka(relayed_kafka: RelayedKafka) -> Iterator[RelayedKafka]:
    relayed_kafka.add_scram_user(CAROL, CAROL_PASSWORD, SCRAM)
    alice = relayed_kafka.cluster.password("alice")
    relayed_kafka.add_scram_user("alice", alice, SCRAM[:1])  # SHA-512 exists from the format
    # alice may use topics dlq-* (the dead-letter tests write them as alice).
    grants = relayed_kafka.grant("User:alice", "dlq-", AclOperation.ALL, prefixed=True)
    try:
        yield relayed_kafka
    finally:
        relayed_kafka.revoke(grants)
        relayed_kafka.remove_scram_user(CAROL, SCRAM)
        relayed_kafka.remove_scram_user("alice", SCRAM[:1])


def password(kafka: RelayedKafka, user: str) -> str:
    return CAROL_PASSWORD if user == CAROL else kafka.cluster.password(user)


def sasl_conf(kafka: RelayedKafka, user: str) -> dict[str, str]:
    """librdkafka settings (SCRAM-SHA-512: no session lifetime on this listener)."""
    return {
        "security.protocol": "SASL_PLAINTEXT",
        "sasl.mechanism": "SCRAM-SHA-512",
        "sasl.username": user,
        "sasl.password": password(kafka, user),
    }


def ssl_conf(kafka: RelayedKafka, user: str) -> dict[str, str]:
    cert = kafka.cluster.credentials.client_certs[user]  # type: ignore[union-attr]
    return {
        "security.protocol": "SSL",
        "ssl.ca.location": str(kafka.cluster.ca_cert),
        "ssl.certificate.location": str(cert.cert),
        "ssl.key.location": str(cert.key),
    }


# ------------------------------------------------------------------ SCRAM client (pure)


def test_scram_sha256_matches_rfc7677() -> None:
    client = ScramClient("SCRAM-SHA-256", "user", "pencil", nonce="rOprNGfwEbeRWgbNEkqO")
    assert client.first() == b"n,,n=user,r=rOprNGfwEbeRWgbNEkqO"
    final = client.step(
        b"r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096"
    )
    assert final == (
        b"c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,"
        b"p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ="
    )
    assert client.step(b"v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4=") is None
    assert client.done


def test_scram_client_refuses_a_server_that_cannot_prove_itself() -> None:
    first = b"r=abcdefXYZ,s=" + base64.b64encode(b"salt") + b",i=4096"
    client = ScramClient("SCRAM-SHA-512", "alice", "secret", nonce="abcdef")
    client.step(first)
    with pytest.raises(SaslClientError, match="signature"):
        client.step(b"v=" + base64.b64encode(b"\x00" * 64))
    for bad in (
        b"r=other,s=c2FsdA==,i=4096",  # nonce not extending ours
        b"r=abcdefXYZ,s=c2FsdA==,i=1000",  # too few iterations for Kafka
        b"r=abcdefXYZ,i=4096",  # no salt
    ):
        with pytest.raises(SaslClientError):
            ScramClient("SCRAM-SHA-256", "alice", "secret", nonce="abcdef").step(bad)


def test_credentials_stay_out_of_repr() -> None:
    sasl = UpstreamSasl("PLAIN", "alice", "hunter2-secret")
    assert "hunter2-secret" not in repr(sasl)


# ------------------------------------------------------------------ against the broker


async def metadata_error(dialer: UpstreamDialer, topic: str) -> int:
    """Kafka's error code for `topic` in a Metadata answer over a fresh dialled connection:
    0 if the authenticated user may describe it, TOPIC_AUTHORIZATION_FAILED if not."""
    conn = await dialer.connect()
    try:
        # Kafka closes a connection that sends anything but ApiVersions before SASL.
        version = conn.pick_version(ApiKey.METADATA, ceiling=12)
        tcls = entities.element_class(schemas.request_schema(ApiKey.METADATA, version), "topics")
        response = await conn.request(
            ApiKey.METADATA, version, 10, topics=(entities.build(tcls, name=topic),),
            allow_auto_topic_creation=False,
        )
        [found] = response.topics
        return int(found.error_code)
    finally:
        await conn.close()


def dialer_for(kafka: RelayedKafka, sasl: UpstreamSasl | None = None,
               tls: UpstreamTLS | None = None, listener: str = "SASL_PLAINTEXT") -> UpstreamDialer:
    return UpstreamDialer(config_for(kafka.bootstrap(listener), sasl=sasl, tls=tls))


@pytest.mark.kafka
@pytest.mark.parametrize(
    ("mechanism", "user"),
    [("PLAIN", "alice"), ("SCRAM-SHA-256", CAROL), ("SCRAM-SHA-512", CAROL)],
)
def test_dialer_authenticates(kafka: RelayedKafka, mechanism: str, user: str) -> None:
    topic = unique("who")
    create_topic_with(kafka.bootstrap(), topic, 1)
    grant = kafka.grant(f"User:{user}", topic, AclOperation.DESCRIBE)
    try:
        dialer = dialer_for(kafka, UpstreamSasl(mechanism, user, password(kafka, user)))
        # Kafka says who logged in: only the ACL's user may describe the topic (the broker
        # applies a new ACL through its metadata log: ask until it shows).
        wait_until(lambda: asyncio.run(metadata_error(dialer, topic)) == 0, what="describe")
        bob = dialer_for(kafka, UpstreamSasl(mechanism, "bob", password(kafka, "bob")))
        if mechanism == "PLAIN":
            assert asyncio.run(metadata_error(bob, topic)) == ErrorCode.TOPIC_AUTHORIZATION_FAILED
    finally:
        kafka.revoke(grant)


@pytest.mark.kafka
def test_wrong_password_is_refused_without_leaking_it(kafka: RelayedKafka) -> None:
    wrong = "not-alices-password-1234"
    dialer = dialer_for(kafka, UpstreamSasl("SCRAM-SHA-512", "alice", wrong))
    with pytest.raises(UpstreamAuthError) as caught:
        asyncio.run(dialer.connect())
    message = str(caught.value)
    # Kafka's own SASL_AUTHENTICATION_FAILED (58) and its message, naming the mechanism.
    assert "'alice'" in message and "SCRAM-SHA-512" in message and "error 58" in message
    assert "invalid credentials" in message
    assert wrong not in message and kafka.cluster.password("alice") not in message


@pytest.mark.kafka
def test_dead_letters_over_sasl_use_one_connection(kafka: RelayedKafka) -> None:
    topic = unique("dlq-sasl")
    create_topic_with(kafka.bootstrap("SASL_PLAINTEXT"), topic, 3, **sasl_conf(kafka, "alice"))
    relay = kafka.relays["SASL_PLAINTEXT"]
    before = relay.connections
    sasl = UpstreamSasl("SCRAM-SHA-512", "alice", password(kafka, "alice"))

    async def run() -> DeadLetterWriter:
        writer = DeadLetterWriter(dialer_for(kafka, sasl))
        for _ in range(3):
            writer.submit(letters(topic, 10))
            await writer_settled(writer)
        await writer.close()
        return writer

    writer = asyncio.run(run())
    assert (writer.produced, writer.failed, writer.connections_opened) == (30, 0, 1)
    assert relay.connections - before == 1
    landed = consume_with_partitions(kafka.bootstrap(), topic, 30)
    assert len(landed) == 30


@pytest.mark.kafka
@pytest.mark.serial  # two flushes must fit in the session's first 90 %
def test_a_connection_is_replaced_before_the_brokers_session_lifetime_ends(
    kafka: RelayedKafka,
) -> None:
    """SCRAM-SHA-256 sessions on this listener last REAUTH_MS (Kafka's
    connections.max.reauth.ms, announced in SaslAuthenticate): Kafka closes a connection used
    after that, so the writer must dial a new one before, not find out by a failed Produce."""
    topic = unique("dlq-reauth")
    create_topic_with(kafka.bootstrap(), topic, 1)
    sasl = UpstreamSasl("SCRAM-SHA-256", "alice", password(kafka, "alice"))

    async def run() -> DeadLetterWriter:
        writer = DeadLetterWriter(dialer_for(kafka, sasl))
        writer.submit(letters(topic, 3))
        await writer_settled(writer)
        writer.submit(letters(topic, 3))  # still within the session: same connection
        await writer_settled(writer)
        assert writer.connections_opened == 1
        await asyncio.sleep(REAUTH_MS / 1000)  # past the session Kafka announced
        writer.submit(letters(topic, 3))
        await writer_settled(writer)
        await writer.close()
        return writer

    writer = asyncio.run(run())
    assert (writer.produced, writer.failed, writer.connections_opened) == (9, 0, 2)
    # One Produce per flush: none was lost to a connection Kafka had closed.
    assert writer.produce_requests == 3


@pytest.mark.kafka
def test_dead_letters_with_a_wrong_password_fail_quietly(kafka: RelayedKafka) -> None:
    wrong = "not-alices-password-5678"
    sasl = UpstreamSasl("PLAIN", "alice", wrong)

    async def run() -> DeadLetterWriter:
        writer = DeadLetterWriter(dialer_for(kafka, sasl), delivery_timeout=0.5)
        writer.submit(letters(unique("dlq-nope"), 4))
        await writer_settled(writer, timeout=10)
        await writer.close(timeout=0.1)
        return writer

    with capture_logs() as logs:
        writer = asyncio.run(run())
    assert (writer.produced, writer.failed) == (0, 4)
    assert logs and not any(wrong in repr(e) for e in logs)


@pytest.mark.kafka
def test_dead_letters_over_mutual_tls(kafka: RelayedKafka) -> None:
    """Kafka's SSL listener wants a client certificate; its CN (alice) is the principal, who
    may write dlq-* topics only by ACL."""
    topic = unique("dlq-tls")
    create_topic_with(kafka.bootstrap("SSL"), topic, 2, **ssl_conf(kafka, "alice"))
    cert = kafka.cluster.credentials.client_certs["alice"]  # type: ignore[union-attr]
    tls = UpstreamTLS(ca=kafka.cluster.ca_cert, cert=cert.cert, key=cert.key)
    relay = kafka.relays["SSL"]
    before = relay.connections

    async def run() -> DeadLetterWriter:
        writer = DeadLetterWriter(dialer_for(kafka, tls=tls, listener="SSL"))
        writer.submit(letters(topic, 20))
        await writer_settled(writer)
        writer.submit(letters(topic, 20))
        await writer.close(timeout=10)
        return writer

    writer = asyncio.run(run())
    assert (writer.produced, writer.failed, writer.connections_opened) == (40, 0, 1)
    assert relay.connections - before == 1
    landed = consume_with_partitions(kafka.bootstrap("SSL"), topic, 40, **ssl_conf(kafka, "alice"))
    assert len(landed) == 40


@pytest.mark.kafka
def test_tls_checks_the_broker_name(kafka: RelayedKafka) -> None:
    # Kafka's certificate names 127.0.0.1 and localhost: a dialer told to expect another name
    # refuses it.
    cert = kafka.cluster.credentials.client_certs["alice"]  # type: ignore[union-attr]
    tls = UpstreamTLS(ca=kafka.cluster.ca_cert, cert=cert.cert, key=cert.key,
                      server_hostname="broker.test")
    with pytest.raises(UpstreamError, match="certificate verify failed"):
        asyncio.run(dialer_for(kafka, tls=tls, listener="SSL").connect())


async def writer_settled(writer: DeadLetterWriter, timeout: float = 20) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while writer.queued and loop.time() < deadline:
        await asyncio.sleep(0.02)


# ------------------------------------------------------------------ the config sections


def load(tmp_path: Path, text: str) -> ProxyConfig:
    path = tmp_path / "sluice.yaml"
    path.write_text(text)
    return build_config(("127.0.0.1", 0), [("127.0.0.1", 9092)], path)


def test_upstream_sasl_section(tmp_path: Path) -> None:
    (tmp_path / "secret").write_text("s3cret-pw\n")
    config = load(
        tmp_path,
        "upstream_sasl:\n  mechanism: SCRAM-SHA-256\n  username: sluice\n"
        "  password_file: secret\ndead_letters:\n  max_queued_bytes: 1048576\n"
        "  shutdown_timeout_seconds: 2.5\n",
    )
    assert config.upstream_sasl == UpstreamSasl("SCRAM-SHA-256", "sluice", "s3cret-pw")
    assert config.dead_letters == DeadLetterSettings(1048576, 2.5)
    defaults = load(tmp_path, "upstream_sasl:\n  mechanism: PLAIN\n  username: u\n  password: p\n")
    assert defaults.dead_letters == DeadLetterSettings()


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("upstream_sasl:\n  mechanism: GSSAPI\n  username: u\n  password: p\n",
         "sluice.yaml:2: upstream_sasl.mechanism: must be one of PLAIN, SCRAM-SHA-256"),
        ("upstream_sasl:\n  mechanism: PLAIN\n  username: u\n  passwrd: p\n",
         "sluice.yaml:4: upstream_sasl.passwrd: unknown key"),
        ("upstream_sasl:\n  mechanism: PLAIN\n  password: p\n",
         "upstream_sasl.username: is required"),
        ("upstream_sasl:\n  mechanism: PLAIN\n  username: u\n  password: p\n"
         "  password_file: f\n", "upstream_sasl: give exactly one of password and password_file"),
        ("upstream_sasl:\n  mechanism: PLAIN\n  username: u\n  password_file: missing.txt\n",
         "sluice.yaml:4: upstream_sasl.password_file: file not found"),
        ("upstream_sasl: PLAIN\n", "sluice.yaml:1: upstream_sasl: must be a mapping"),
        ("dead_letters:\n  max_queued_bytes: -1\n",
         "sluice.yaml:2: dead_letters.max_queued_bytes: must be a positive integer, got -1"),
        ("dead_letters:\n  shutdown_timeout_seconds: soon\n",
         "sluice.yaml:2: dead_letters.shutdown_timeout_seconds: must be a number >= 0"),
        ("dead_letters:\n  max_bytes: 5\n", "sluice.yaml:2: dead_letters.max_bytes: unknown key"),
    ],
)
def test_config_errors_name_file_line_and_field(
    tmp_path: Path, text: str, expected: str
) -> None:
    with pytest.raises(ConfigFileError) as caught:
        load(tmp_path, text)
    assert expected in str(caught.value)
    assert "p\n" not in str(caught.value)
