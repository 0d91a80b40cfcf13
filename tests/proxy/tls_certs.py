"""Throwaway PKI for TLS tests: a CA, a server certificate for 127.0.0.1/localhost, a client
certificate, and a second CA nobody trusts. Built with the `cryptography` package."""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID


@dataclass(frozen=True)
class Pki:
    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path
    other_ca: Path  # signs nothing the tests trust
    other_client_cert: Path
    other_client_key: Path


def _name(cn: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _write_key(path: Path, key: ec.EllipticCurvePrivateKey) -> Path:
    path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return path


def _write_cert(path: Path, cert: x509.Certificate) -> Path:
    path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return path


def _ca(cn: str) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    key = _key()
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name(cn))
        .issuer_name(_name(cn))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(hours=1))
        .not_valid_after(now + datetime.timedelta(days=2))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
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
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    return cert, key


def _leaf(
    cn: str,
    ca: tuple[x509.Certificate, ec.EllipticCurvePrivateKey],
    server: bool,
    names: list[str] | None = None,
) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    key = _key()
    ca_cert, ca_key = ca
    now = datetime.datetime.now(datetime.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(cn))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(hours=1))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.ExtendedKeyUsage(
                [ExtendedKeyUsageOID.SERVER_AUTH if server else ExtendedKeyUsageOID.CLIENT_AUTH]
            ),
            critical=False,
        )
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
            critical=False,
        )
    )
    if names:
        alt: list[x509.GeneralName] = []
        for n in names:
            try:
                alt.append(x509.IPAddress(ipaddress.ip_address(n)))
            except ValueError:
                alt.append(x509.DNSName(n))
        builder = builder.add_extension(x509.SubjectAlternativeName(alt), critical=False)
    return builder.sign(ca_key, hashes.SHA256()), key


def make_pki(directory: Path, server_names: list[str] | None = None) -> Pki:
    directory.mkdir(parents=True, exist_ok=True)
    ca = _ca("sluice test CA")
    other = _ca("untrusted test CA")
    server = _leaf("sluice-proxy", ca, True, server_names or ["localhost", "127.0.0.1"])
    client = _leaf("test-client", ca, False)
    other_client = _leaf("intruder", other, False)
    return Pki(
        ca=_write_cert(directory / "ca.pem", ca[0]),
        server_cert=_write_cert(directory / "server.pem", server[0]),
        server_key=_write_key(directory / "server.key", server[1]),
        client_cert=_write_cert(directory / "client.pem", client[0]),
        client_key=_write_key(directory / "client.key", client[1]),
        other_ca=_write_cert(directory / "other-ca.pem", other[0]),
        other_client_cert=_write_cert(directory / "intruder.pem", other_client[0]),
        other_client_key=_write_key(directory / "intruder.key", other_client[1]),
    )
