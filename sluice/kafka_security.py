"""Throwaway credentials for a local Apache Kafka: a CA, certificates, users and passwords.

`sluice/kafka_broker.py` writes them into the broker's config; tests and `sluice demo
--broker kafka` read them back to configure clients. Everything here is made fresh for one
broker run, in its temporary folder, and is worth nothing outside it.
"""

from __future__ import annotations

import datetime
import ipaddress
import secrets
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.serialization import pkcs12
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

# The principal the brokers and controllers authenticate as among themselves (a super user).
BROKER_USER = "broker"
# A super user for tests and tools that administer the cluster (ACLs, topics).
ADMIN_USER = "admin"
# Ordinary users: nothing allowed until an ACL says so.
ORDINARY_USERS = ("alice", "bob")
# The user Sluice's own connections authenticate as (`upstream_sasl:`); an ordinary user,
# granted only what docs/SECURITY.md ("The proxy's own connections") lists.
PROXY_USER = "sluice-proxy"


@dataclass(frozen=True)
class ClientCert:
    """A client certificate (CN = the user's name) and its key, as PEM files."""

    user: str
    cert: Path
    key: Path


@dataclass(frozen=True)
class KafkaCredentials:
    """Passwords (the same for PLAIN and SCRAM-SHA-512) and the TLS material of one run."""

    passwords: dict[str, str]
    ca_cert: Path
    broker_keystore: Path
    keystore_password: str
    client_certs: dict[str, ClientCert]

    @property
    def users(self) -> tuple[str, ...]:
        return tuple(self.passwords)


def _name(common_name: str) -> x509.Name:
    return x509.Name(
        [
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, "Sluice test CA"),
            x509.NameAttribute(NameOID.COMMON_NAME, common_name),
        ]
    )


def _write_pem_key(path: Path, key: ec.EllipticCurvePrivateKey) -> None:
    path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    path.chmod(0o600)


def _issue(
    ca_key: ec.EllipticCurvePrivateKey,
    ca_name: x509.Name,
    common_name: str,
    usages: list[x509.ObjectIdentifier],
    alt_names: list[x509.GeneralName] | None = None,
) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(common_name))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=2))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
    )
    if alt_names:
        builder = builder.add_extension(x509.SubjectAlternativeName(alt_names), critical=False)
    return key, builder.sign(ca_key, hashes.SHA256())


def make_credentials(folder: Path, users: tuple[str, ...] = ORDINARY_USERS) -> KafkaCredentials:
    """A fresh CA, a broker certificate for 127.0.0.1/localhost (PKCS12 keystore), a client
    certificate per user with the user's name as CN (PEM), and a random password per user."""
    folder.mkdir(parents=True, exist_ok=True)
    names = (BROKER_USER, ADMIN_USER, *users)
    passwords = {name: secrets.token_urlsafe(18) for name in names}

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = _name("Sluice throwaway CA")
    now = datetime.datetime.now(datetime.UTC)
    ca_cert = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=2))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=False,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .sign(ca_key, hashes.SHA256())
    )
    ca_path = folder / "ca.pem"
    ca_path.write_bytes(ca_cert.public_bytes(serialization.Encoding.PEM))

    broker_key, broker_cert = _issue(
        ca_key,
        ca_name,
        "localhost",
        [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH],
        [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))],
    )
    keystore_password = secrets.token_urlsafe(18)
    keystore = folder / "broker.p12"
    keystore.write_bytes(
        pkcs12.serialize_key_and_certificates(
            b"broker",
            broker_key,
            broker_cert,
            [ca_cert],
            serialization.BestAvailableEncryption(keystore_password.encode()),
        )
    )
    keystore.chmod(0o600)
    # The same certificate as PEM too, for tools that want the server's chain in a file.
    (folder / "broker.pem").write_bytes(broker_cert.public_bytes(serialization.Encoding.PEM))

    client_certs: dict[str, ClientCert] = {}
    for name in (ADMIN_USER, *users):
        key, cert = _issue(ca_key, ca_name, name, [ExtendedKeyUsageOID.CLIENT_AUTH])
        cert_path = folder / f"{name}.pem"
        key_path = folder / f"{name}.key"
        cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        _write_pem_key(key_path, key)
        client_certs[name] = ClientCert(name, cert_path, key_path)

    return KafkaCredentials(
        passwords=passwords,
        ca_cert=ca_path,
        broker_keystore=keystore,
        keystore_password=keystore_password,
        client_certs=client_certs,
    )
