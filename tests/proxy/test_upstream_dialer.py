"""The proxy's own connections to the brokers: SASL (PLAIN, SCRAM-SHA-256/512) and TLS as
configured, used by the dead-letter writer; and the `upstream_sasl:` / `dead_letters:` sections.

Tansu 0.6 cannot authenticate anyone (see test_sasl.py), and its TLS flags cannot be combined,
so the broker's SASL and TLS listeners are played by `BrokerFront` (tests/proxy/broker_front.py),
which checks SCRAM proofs and PLAIN passwords against a user table as Kafka does and relays
everything else to a real Tansu.
"""

from __future__ import annotations

import asyncio
import base64
from collections.abc import Iterator
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from sluice.proxy.contract import UpstreamError
from sluice.proxy.net.tls import UpstreamTLS
from sluice.proxy.net.upstream_client import UpstreamAuthError, UpstreamDialer
from sluice.proxy.net.upstream_sasl import SaslClientError, ScramClient, UpstreamSasl
from sluice.proxy.ops.config import ConfigFileError, DeadLetterSettings, ProxyConfig
from sluice.proxy.ops.config_load import build_config
from sluice.proxy.telemetry.dead_letters import DeadLetterWriter
from tests.e2e.clients import unique
from tests.proxy.broker_front import FrontedTansu
from tests.proxy.dead_letter_helpers import (
    config_for,
    consume_with_partitions,
    create_topic_with,
    letters,
)
from tests.proxy.tls_certs import Pki

USERS = {"alice": "alice-Pa55word-7f3a", "carol,ops=x": "carol-Pa55word-5d0e"}


@pytest.fixture(scope="module")
def sasl_broker() -> Iterator[FrontedTansu]:
    with FrontedTansu(front_kwargs={"sasl_users": USERS}) as b:
        yield b


def sasl_conf(user: str) -> dict[str, str]:
    return {
        "security.protocol": "SASL_PLAINTEXT",
        "sasl.mechanism": "SCRAM-SHA-256",
        "sasl.username": user,
        "sasl.password": USERS[user],
    }


def ssl_conf(pki: Pki) -> dict[str, str]:
    return {
        "security.protocol": "SSL",
        "ssl.ca.location": str(pki.ca),
        "ssl.certificate.location": str(pki.client_cert),
        "ssl.key.location": str(pki.client_key),
        "ssl.endpoint.identification.algorithm": "none",
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


@pytest.mark.parametrize("mechanism", ["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"])
def test_dialer_authenticates(sasl_broker: FrontedTansu, mechanism: str) -> None:
    user = "carol,ops=x"  # SCRAM's =2C / =3D escaping on the way
    dialer = UpstreamDialer(
        config_for(sasl_broker.bootstrap, sasl=UpstreamSasl(mechanism, user, USERS[user]))
    )

    async def run() -> int:
        conn = await dialer.connect()
        try:
            # Kafka closes a connection that sends anything but ApiVersions before SASL.
            version = conn.pick_version(3, ceiling=12)
            response = await conn.request(
                3, version, 10, topics=(), allow_auto_topic_creation=False
            )
            return len(response.brokers)
        finally:
            await conn.close()

    assert asyncio.run(run()) == 1
    assert sasl_broker.front is not None and user in sasl_broker.front.authenticated


def test_wrong_password_is_refused_without_leaking_it(sasl_broker: FrontedTansu) -> None:
    wrong = "not-alices-password-1234"
    dialer = UpstreamDialer(
        config_for(sasl_broker.bootstrap, sasl=UpstreamSasl("SCRAM-SHA-512", "alice", wrong))
    )
    with pytest.raises(UpstreamAuthError) as caught:
        asyncio.run(dialer.connect())
    message = str(caught.value)
    assert "'alice'" in message and "SCRAM-SHA-512" in message and "error 58" in message
    assert wrong not in message


def test_dead_letters_over_sasl_use_one_connection(sasl_broker: FrontedTansu) -> None:
    assert sasl_broker.front is not None
    topic = unique("dlq-sasl")
    create_topic_with(sasl_broker.bootstrap, topic, 3, **sasl_conf("alice"))
    before = sasl_broker.front.connections
    sasl = UpstreamSasl("SCRAM-SHA-512", "alice", USERS["alice"])

    async def run() -> DeadLetterWriter:
        writer = DeadLetterWriter(UpstreamDialer(config_for(sasl_broker.bootstrap, sasl=sasl)))
        for _ in range(3):
            writer.submit(letters(topic, 10))
            await writer_settled(writer)
        await writer.close()
        return writer

    writer = asyncio.run(run())
    assert (writer.produced, writer.failed, writer.connections_opened) == (30, 0, 1)
    assert sasl_broker.front.connections - before == 1
    landed = consume_with_partitions(sasl_broker.bootstrap, topic, 30, **sasl_conf("alice"))
    assert len(landed) == 30


def test_a_connection_is_replaced_before_the_brokers_session_lifetime_ends() -> None:
    with FrontedTansu(front_kwargs={"sasl_users": USERS, "session_lifetime_ms": 400}) as b:
        assert b.front is not None
        topic = unique("dlq-reauth")
        create_topic_with(b.bootstrap, topic, 1, **sasl_conf("alice"))
        sasl = UpstreamSasl("SCRAM-SHA-256", "alice", USERS["alice"])

        async def run() -> DeadLetterWriter:
            writer = DeadLetterWriter(UpstreamDialer(config_for(b.bootstrap, sasl=sasl)))
            writer.submit(letters(topic, 3))
            await writer_settled(writer)
            writer.submit(letters(topic, 3))  # still within the session: same connection
            await writer_settled(writer)
            assert writer.connections_opened == 1
            await asyncio.sleep(0.5)  # past 90 % of the lifetime the broker announced
            writer.submit(letters(topic, 3))
            await writer_settled(writer)
            await writer.close()
            return writer

        writer = asyncio.run(run())
        assert (writer.produced, writer.failed, writer.connections_opened) == (9, 0, 2)


def test_dead_letters_with_a_wrong_password_fail_quietly(sasl_broker: FrontedTansu) -> None:
    wrong = "not-alices-password-5678"
    sasl = UpstreamSasl("PLAIN", "alice", wrong)

    async def run() -> DeadLetterWriter:
        writer = DeadLetterWriter(
            UpstreamDialer(config_for(sasl_broker.bootstrap, sasl=sasl)), delivery_timeout=0.5
        )
        writer.submit(letters(unique("dlq-nope"), 4))
        await writer_settled(writer, timeout=10)
        await writer.close(timeout=0.1)
        return writer

    with capture_logs() as logs:
        writer = asyncio.run(run())
    assert (writer.produced, writer.failed) == (0, 4)
    assert logs and not any(wrong in repr(e) for e in logs)


def test_dead_letters_over_mutual_tls(tls_broker: FrontedTansu, broker_pki: Pki) -> None:
    assert tls_broker.front is not None
    topic = unique("dlq-tls")
    create_topic_with(tls_broker.bootstrap, topic, 2, **ssl_conf(broker_pki))
    tls = UpstreamTLS(
        ca=broker_pki.ca,
        cert=broker_pki.client_cert,
        key=broker_pki.client_key,
        server_hostname="broker.test",
    )
    before = tls_broker.front.connections

    async def run() -> DeadLetterWriter:
        writer = DeadLetterWriter(UpstreamDialer(config_for(tls_broker.bootstrap, tls=tls)))
        writer.submit(letters(topic, 20))
        await writer_settled(writer)
        writer.submit(letters(topic, 20))
        await writer.close(timeout=10)
        return writer

    writer = asyncio.run(run())
    assert (writer.produced, writer.failed, writer.connections_opened) == (40, 0, 1)
    assert tls_broker.front.connections - before == 1
    assert tls_broker.front.handshake_failures == 0
    landed = consume_with_partitions(tls_broker.bootstrap, topic, 40, **ssl_conf(broker_pki))
    assert len(landed) == 40


def test_tls_checks_the_broker_name(tls_broker: FrontedTansu, broker_pki: Pki) -> None:
    # Without server_hostname the dialer checks 127.0.0.1, which the certificate does not name.
    tls = UpstreamTLS(ca=broker_pki.ca, cert=broker_pki.client_cert, key=broker_pki.client_key)
    dialer = UpstreamDialer(config_for(tls_broker.bootstrap, tls=tls))
    with pytest.raises(UpstreamError, match="certificate verify failed"):
        asyncio.run(dialer.connect())


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
