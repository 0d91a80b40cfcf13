"""TLS on both sides of the proxy with real clients: clients -> proxy (server certificate,
client certificates) and proxy -> broker (CA bundle, client certificate, hostname check).

The broker side is Apache Kafka's own SSL listener (the session's Kafka node), which requires
a client certificate and takes its CN as the principal: the proxy presents `admin`'s
certificate from the harness's throwaway CA. Kafka's certificate names 127.0.0.1 and
localhost, so `server_hostname: broker.test` is the name it does not carry."""

from __future__ import annotations

import socket
import ssl
import struct
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient

from sluice.codec.headers import request_header_bytes
from tests.e2e.clients import QUIET, confluent_consume, confluent_produce, create_topic, unique
from tests.harness.kafka_broker import KafkaCluster
from tests.harness.proxy import SluiceProxy
from tests.proxy.proxy_output import wait_for_output
from tests.proxy.tls_certs import Pki, make_pki

StartProxy = Callable[..., SluiceProxy]


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


def write_config(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def ssl_conf(pki: Pki, client_cert: bool = False) -> dict[str, Any]:
    conf: dict[str, Any] = {"security.protocol": "SSL", "ssl.ca.location": str(pki.ca)}
    if client_cert:
        conf["ssl.certificate.location"] = str(pki.client_cert)
        conf["ssl.key.location"] = str(pki.client_key)
    return conf


def api_versions_over(sock: socket.socket) -> bytes:
    """Send ApiVersions v0 and return whatever comes back (b"" when the peer hangs up)."""
    body = request_header_bytes(18, 0, 7, "tls-test")
    sock.sendall(struct.pack(">i", len(body)) + body)
    return sock.recv(4)


def records(n: int) -> list[tuple[bytes | None, bytes | None]]:
    return [(f"k{i}".encode(), f"v{i}".encode()) for i in range(n)]


# ------------------------------------------------------------------ clients -> proxy


def test_confluent_over_tls_to_the_proxy(pki: Pki, start_proxy: StartProxy, tmp_path: Path) -> None:
    config = write_config(
        tmp_path / "sluice.yaml",
        f"tls:\n  cert: {pki.server_cert}\n  key: {pki.server_key}\n",
    )
    proxy = start_proxy(config=config)
    topic = unique("tls-in")
    create_topic_tls(proxy.bootstrap, topic, ssl_conf(pki))
    sent = records(50)
    offsets = confluent_produce(proxy.bootstrap, topic, sent, **ssl_conf(pki))
    assert [o for _, o in offsets] == list(range(50))
    got = confluent_consume(proxy.bootstrap, topic, 50, **ssl_conf(pki))
    assert got == sent


@pytest.fixture
def tls_proxy(pki: Pki, start_proxy: StartProxy, tmp_path: Path) -> SluiceProxy:
    config = write_config(
        tmp_path / "sluice.yaml",
        f"tls:\n  cert: {pki.server_cert}\n  key: {pki.server_key}\n",
    )
    return start_proxy(config=config)


def test_plaintext_client_gets_no_kafka_answer_from_a_tls_listener(
    tls_proxy: SluiceProxy,
) -> None:
    with socket.create_connection(("127.0.0.1", tls_proxy.port), timeout=5) as sock:
        answer = api_versions_over(sock)
    # A TLS server answers garbage with an alert record (0x15) or just hangs up.
    assert answer == b"" or answer[0] == 0x15


def test_proxy_certificate_verifies_against_the_ca(pki: Pki, tls_proxy: SluiceProxy) -> None:
    good = ssl.create_default_context(cafile=str(pki.ca))
    with socket.create_connection(("127.0.0.1", tls_proxy.port), timeout=5) as raw:
        with good.wrap_socket(raw, server_hostname="127.0.0.1") as sock:
            assert len(api_versions_over(sock)) == 4  # a Kafka size prefix came back
            cert = sock.getpeercert()
    assert cert is not None and ("IP Address", "127.0.0.1") in cert["subjectAltName"]
    untrusting = ssl.create_default_context(cafile=str(pki.other_ca))
    with socket.create_connection(("127.0.0.1", tls_proxy.port), timeout=5) as raw:
        with pytest.raises(ssl.SSLCertVerificationError):
            untrusting.wrap_socket(raw, server_hostname="127.0.0.1")


def test_client_certificates_required(pki: Pki, start_proxy: StartProxy, tmp_path: Path) -> None:
    config = write_config(
        tmp_path / "sluice.yaml",
        f"tls:\n  cert: {pki.server_cert}\n  key: {pki.server_key}\n  client_ca: {pki.ca}\n",
    )
    proxy = start_proxy(config=config)
    topic = unique("mtls")
    sent = records(20)
    create_topic_tls(proxy.bootstrap, topic, ssl_conf(pki, client_cert=True))
    confluent_produce(proxy.bootstrap, topic, sent, **ssl_conf(pki, client_cert=True))
    assert confluent_consume(proxy.bootstrap, topic, 20, **ssl_conf(pki, client_cert=True)) == sent

    def attempt(cert: Path | None, key: Path | None) -> bytes:
        ctx = ssl.create_default_context(cafile=str(pki.ca))
        if cert is not None:
            ctx.load_cert_chain(str(cert), str(key))
        with socket.create_connection(("127.0.0.1", proxy.port), timeout=5) as raw:
            try:
                with ctx.wrap_socket(raw, server_hostname="127.0.0.1") as sock:
                    return api_versions_over(sock)
            except (ssl.SSLError, ConnectionError):
                return b""

    assert len(attempt(pki.client_cert, pki.client_key)) == 4
    assert attempt(None, None) == b""  # no certificate: refused
    assert attempt(pki.other_client_cert, pki.other_client_key) == b""  # unknown CA: refused
    assert any("listening" in line for line in proxy.output)


def create_topic_tls(bootstrap: str, topic: str, conf: dict[str, Any]) -> None:
    from confluent_kafka.admin import NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap, **QUIET, **conf})
    for fut in admin.create_topics([NewTopic(topic, 1, 1)]).values():
        fut.result(15)


# ------------------------------------------------------------------ proxy -> brokers


@dataclass(frozen=True)
class TlsBroker:
    """Kafka's SSL listener and what the proxy needs to reach it as `admin`."""

    bootstrap: str
    ca: Path
    client_cert: Path
    client_key: Path


@pytest.fixture(scope="module")
def tls_broker(kafka_broker: KafkaCluster) -> TlsBroker:
    conf = kafka_broker.client_config("SSL", "admin")
    return TlsBroker(kafka_broker.bootstrap_for("SSL"), Path(conf["ssl.ca.location"]),
                     Path(conf["ssl.certificate.location"]), Path(conf["ssl.key.location"]))


def upstream_config(path: Path, broker: TlsBroker, **overrides: object) -> Path:
    keys: dict[str, object] = {
        "ca": broker.ca,
        "cert": broker.client_cert,
        "key": broker.client_key,
    }
    keys.update(overrides)
    lines = ["upstream_tls:"]
    for key, value in keys.items():
        if value is not None:
            rendered = str(value).lower() if isinstance(value, bool) else str(value)
            lines.append(f"  {key}: {rendered}")
    return write_config(path, "\n".join(lines) + "\n")


def metadata_ok(bootstrap: str) -> bool:
    admin = AdminClient({"bootstrap.servers": bootstrap, **QUIET})
    try:
        admin.list_topics(timeout=4)
    except KafkaException:
        return False
    return True


@pytest.mark.kafka
def test_proxy_to_broker_over_tls_with_client_certificate(
    tls_broker: TlsBroker, start_proxy: StartProxy, tmp_path: Path
) -> None:
    proxy = start_proxy(
        config=upstream_config(tmp_path / "up.yaml", tls_broker), upstream=tls_broker.bootstrap
    )
    topic = unique("tls-up")
    create_topic(proxy.bootstrap, topic)
    sent = records(40)
    confluent_produce(proxy.bootstrap, topic, sent)
    # Kafka's SSL listener speaks nothing but TLS with a client certificate: this went through.
    assert confluent_consume(proxy.bootstrap, topic, 40) == sent


@pytest.mark.kafka
def test_upstream_hostname_check_can_be_switched_off(
    tls_broker: TlsBroker, start_proxy: StartProxy, tmp_path: Path
) -> None:
    proxy = start_proxy(
        config=upstream_config(
            tmp_path / "up.yaml", tls_broker, server_hostname="broker.test", check_hostname=False
        ),
        upstream=tls_broker.bootstrap,
    )
    topic = unique("tls-nohost")
    create_topic(proxy.bootstrap, topic)
    confluent_produce(proxy.bootstrap, topic, records(5))
    assert confluent_consume(proxy.bootstrap, topic, 5) == records(5)


@pytest.mark.kafka
@pytest.mark.parametrize(
    "case",
    ["hostname-mismatch", "untrusted-ca", "no-client-certificate"],
)
def test_upstream_tls_failures_refuse_the_broker(
    case: str,
    pki: Pki,
    tls_broker: TlsBroker,
    start_proxy: StartProxy,
    tmp_path: Path,
) -> None:
    table: dict[str, dict[str, object]] = {
        "hostname-mismatch": {"server_hostname": "broker.test"},  # not in Kafka's certificate
        "untrusted-ca": {"ca": pki.other_ca},
        "no-client-certificate": {"cert": None, "key": None},
    }
    overrides = table[case]
    proxy = start_proxy(
        config=upstream_config(tmp_path / "up.yaml", tls_broker, **overrides),
        upstream=tls_broker.bootstrap,
    )
    assert not metadata_ok(proxy.bootstrap)
    if case != "no-client-certificate":
        # Refused during the handshake, before any Kafka byte went to the broker.
        assert wait_for_output(proxy, "upstream_connect_failed", "CERTIFICATE_VERIFY_FAILED")


# ------------------------------------------------------------------ config errors


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("tls:\n  cert: {server_cert}\n", "sluice.yaml:1: tls.key: is required"),
        (
            "tls:\n  cert: missing.pem\n  key: {server_key}\n",
            "sluice.yaml:2: tls.cert: file not found",
        ),
        (
            "tls:\n  cert: {server_cert}\n  key: {other_client_key}\n",
            "sluice.yaml:2: tls.cert: TLS set-up failed: KEY_VALUES_MISMATCH",
        ),
        (
            "tls:\n  cert: {server_cert}\n  key: {server_key}\n  client_auth: required\n",
            "sluice.yaml:4: tls.client_auth: client certificates need client_ca",
        ),
        (
            "tls:\n  cert: {server_cert}\n  key: {server_key}\n  client_ca: {server_key}\n",
            "sluice.yaml:4: tls.client_ca: TLS set-up failed",
        ),
        ("tls:\n  certificate: x\n", "sluice.yaml:2: tls.certificate: unknown key"),
        (
            "upstream_tls:\n  ca: {client_key}\n",
            "sluice.yaml:2: upstream_tls.ca: TLS set-up failed",
        ),
        ("upstream_tls:\n  verify: false\n", "sluice.yaml:2: upstream_tls.verify: unknown key"),
        ("upstream_tls:\n  key: {client_key}\n", "sluice.yaml:1: upstream_tls.cert: a client key"),
        ("upstream_tls:\n  min_version: SSLv3\n", "sluice.yaml:2: upstream_tls.min_version:"),
        ("upstream_tls:\n  check_hostname: 'no'\n", "sluice.yaml:2: upstream_tls.check_hostname"),
        ("upstream_tls: [ca]\n", "sluice.yaml:1: upstream_tls: must be a mapping"),
    ],
)
def test_tls_config_errors_name_file_line_field(
    pki: Pki, tmp_path: Path, text: str, message: str
) -> None:
    from sluice.proxy.ops.config_load import ConfigFileError, build_config

    fields = {k: str(getattr(pki, k)) for k in pki.__dataclass_fields__}
    path = write_config(tmp_path / "sluice.yaml", text.format(**fields))
    with pytest.raises(ConfigFileError) as err:
        build_config(("127.0.0.1", 9092), [("127.0.0.1", 9093)], path)
    assert message in str(err.value)


def test_tls_config_relative_paths_and_defaults(pki: Pki, tmp_path: Path) -> None:
    import shutil

    from sluice.proxy.ops.config_load import build_config

    for src in (pki.server_cert, pki.server_key, pki.ca):
        shutil.copy(src, tmp_path / src.name)
    path = write_config(
        tmp_path / "sluice.yaml",
        "tls:\n  cert: server.pem\n  key: server.key\n  client_ca: ca.pem\nupstream_tls: {}\n",
    )
    config = build_config(("127.0.0.1", 9092), [("127.0.0.1", 9093)], path)
    assert config.tls is not None and config.tls.cert == tmp_path / "server.pem"
    assert config.tls.client_auth == "required"  # client_ca alone turns verification on
    assert config.tls.context().verify_mode == ssl.CERT_REQUIRED
    up = config.upstream_tls
    assert up is not None and up.ca is None and up.check_hostname  # system CAs, names checked
    assert up.context().verify_mode == ssl.CERT_REQUIRED
    off = write_config(tmp_path / "off.yaml", "upstream_tls:\n  enabled: false\n")
    assert build_config(("127.0.0.1", 9092), [("127.0.0.1", 9093)], off).upstream_tls is None


def test_client_certificate_names_the_principal(
    pki: Pki, start_proxy: StartProxy, tmp_path: Path
) -> None:
    import json
    import time

    import yaml

    from tests.proxy.test_sasl import produce

    telemetry_dir = tmp_path / "telemetry"
    config = {
        "tls": {"cert": str(pki.server_cert), "key": str(pki.server_key), "client_ca": str(pki.ca)},
        "filters": [
            {
                "name": "cert-json",
                "module": "builtin:json-validate",
                "topics": ["mtls-*"],
                "apply_to": ["produce"],
                "principals": ["User:CN=test-client"],
            }
        ],
        "telemetry": {"dir": str(telemetry_dir), "format": "jsonl"},
    }
    path = write_config(tmp_path / "sluice.yaml", yaml.safe_dump(config))
    proxy = start_proxy(config=path)
    conf = ssl_conf(pki, client_cert=True)
    topic = unique("mtls")
    create_topic_tls(proxy.bootstrap, topic, conf)
    assert produce(proxy.bootstrap, topic, [b"not json"], conf) == ["INVALID_RECORD"]
    assert produce(proxy.bootstrap, topic, [b'{"ok": true}'], conf) == [""]
    deadline = time.monotonic() + 15
    principals: set[str] = set()
    while not principals and time.monotonic() < deadline:
        for f in telemetry_dir.glob("*.jsonl*"):
            for line in f.read_text().splitlines():
                try:
                    event = json.loads(line)
                except json.JSONDecodeError:
                    continue
                if event.get("type") == "record_batch" and event.get("topic") == topic:
                    principals.add(event["principal"])
        time.sleep(0.2)
    assert principals == {"User:CN=test-client"}


def test_peer_principal_is_the_rfc2253_subject() -> None:
    from sluice.proxy.net.tls import peer_principal

    cert = {
        "subject": (
            (("countryName", "GB"),),
            (("organizationName", "Example, Ltd"),),
            (("organizationalUnitName", "payments"),),
            (("commonName", "app=1"),),
        )
    }
    assert peer_principal(cert) == r"User:CN=app\=1,OU=payments,O=Example\, Ltd,C=GB"
    assert peer_principal({}) is None and peer_principal(None) is None
