"""SASL for the proxy's own connections to the brokers (section `upstream_sasl:`).

The proxy's side connections (dead letters, admin look-ups) authenticate as one configured
user, unlike client connections, whose SASL passes through untouched (paths/sasl.py). This
module holds the parsed credentials and the client side of the mechanisms, sans-IO: PLAIN
(RFC 4616) and SCRAM-SHA-256/512 (RFC 5802, with Kafka's rule of at least 4096 iterations).
The dialer (upstream_client.py) carries the messages in SaslAuthenticate requests.

The password is held with ``repr=False`` and never put into a log line or an exception
message; errors name the user and the mechanism only.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sluice.filters.yaml_lines import LineMap

MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")
_HASHES = {"SCRAM-SHA-256": "sha256", "SCRAM-SHA-512": "sha512"}
_KEYS = ("mechanism", "username", "password", "password_file")
#: Kafka's brokers refuse fewer iterations (ScramMechanism.minIterations); a server asking for
#: fewer is not a Kafka broker we should hand a proof to.
MIN_SCRAM_ITERATIONS = 4096


class SaslClientError(Exception):
    """The broker's SASL answers do not follow the mechanism (never holds a secret)."""


@dataclass(frozen=True)
class UpstreamSasl:
    """Credentials of the proxy's own connections to the brokers."""

    mechanism: str
    username: str
    password: str = field(repr=False)

    def client(self) -> SaslClient:
        if self.mechanism == "PLAIN":
            return PlainClient(self.username, self.password)
        return ScramClient(self.mechanism, self.username, self.password)


class SaslClient:
    """One authentication exchange: `first()`, then `step(server bytes)` until `done`."""

    done: bool = False

    def first(self) -> bytes:
        raise NotImplementedError

    def step(self, challenge: bytes) -> bytes | None:
        """The next client message for the server's answer, or None when the exchange is over."""
        raise NotImplementedError


class PlainClient(SaslClient):
    def __init__(self, username: str, password: str) -> None:
        self._message = b"\x00" + username.encode() + b"\x00" + password.encode()

    def first(self) -> bytes:
        return self._message

    def step(self, challenge: bytes) -> bytes | None:
        self.done = True  # PLAIN has one message; the broker's error code decides
        return None


def _saslname(username: str) -> str:
    # RFC 5802 5.1: "," and "=" in a user name are sent as =2C and =3D.
    return username.replace("=", "=3D").replace(",", "=2C")


def _attributes(message: bytes) -> dict[str, str]:
    try:
        text = message.decode()
    except UnicodeDecodeError:
        raise SaslClientError("SCRAM server message is not UTF-8") from None
    attrs: dict[str, str] = {}
    for part in text.split(","):
        name, sep, value = part.partition("=")
        if not sep or len(name) != 1:
            raise SaslClientError("malformed SCRAM server message")
        attrs.setdefault(name, value)
    return attrs


class ScramClient(SaslClient):
    """Client side of SCRAM-SHA-256/512 without channel binding (``n,,``)."""

    def __init__(self, mechanism: str, username: str, password: str, nonce: str = "") -> None:
        self._hash = _HASHES[mechanism]
        self._password = password.encode()
        self._nonce = nonce or base64.b64encode(secrets.token_bytes(24)).decode()
        self._first_bare = f"n={_saslname(username)},r={self._nonce}"
        self._server_signature: bytes | None = None

    def first(self) -> bytes:
        return ("n,," + self._first_bare).encode()

    def step(self, challenge: bytes) -> bytes | None:
        if self._server_signature is None:
            return self._final(challenge)
        attrs = _attributes(challenge)
        if "e" in attrs:
            raise SaslClientError(f"SCRAM server error: {attrs['e']}")
        try:
            verifier = base64.b64decode(attrs["v"], validate=True)
        except (KeyError, ValueError):
            raise SaslClientError("SCRAM server-final-message has no valid v=") from None
        if not hmac.compare_digest(verifier, self._server_signature):
            raise SaslClientError("SCRAM server signature does not match (not the real broker?)")
        self.done = True
        return None

    def _final(self, server_first: bytes) -> bytes:
        attrs = _attributes(server_first)
        nonce, salt_b64, iterations = attrs.get("r"), attrs.get("s"), attrs.get("i")
        if nonce is None or salt_b64 is None or iterations is None:
            raise SaslClientError("SCRAM server-first-message lacks r=, s= or i=")
        if not nonce.startswith(self._nonce) or nonce == self._nonce:
            raise SaslClientError("SCRAM server nonce does not extend the client nonce")
        try:
            salt = base64.b64decode(salt_b64, validate=True)
            rounds = int(iterations)
        except ValueError:
            raise SaslClientError("SCRAM server-first-message has a bad salt or count") from None
        if rounds < MIN_SCRAM_ITERATIONS:
            raise SaslClientError(f"SCRAM iteration count {rounds} is below {MIN_SCRAM_ITERATIONS}")
        salted = hashlib.pbkdf2_hmac(self._hash, self._password, salt, rounds)
        client_key = hmac.new(salted, b"Client Key", self._hash).digest()
        stored_key = hashlib.new(self._hash, client_key).digest()
        without_proof = f"c=biws,r={nonce}"
        auth_message = f"{self._first_bare},{server_first.decode()},{without_proof}".encode()
        signature = hmac.new(stored_key, auth_message, self._hash).digest()
        proof = bytes(a ^ b for a, b in zip(client_key, signature, strict=True))
        server_key = hmac.new(salted, b"Server Key", self._hash).digest()
        self._server_signature = hmac.new(server_key, auth_message, self._hash).digest()
        return f"{without_proof},p={base64.b64encode(proof).decode()}".encode()


# ------------------------------------------------------------------ parsing


def parse_upstream_sasl(raw: Any, lines: LineMap, base: Path | None) -> UpstreamSasl | None:
    """The `upstream_sasl:` section (None when absent); errors name file, line and field.

    A relative `password_file` is read relative to the config file, at start-up; one trailing
    newline is dropped (files written with `echo`)."""
    section = "upstream_sasl"
    if raw is None:
        return None
    if not isinstance(raw, dict):
        raise lines.error((section,), "must be a mapping")
    for key in raw:
        if key not in _KEYS:
            raise lines.error((section, key), f"unknown key (expected one of {', '.join(_KEYS)})")
    mechanism = raw.get("mechanism")
    if mechanism not in MECHANISMS:
        raise lines.error(
            (section, "mechanism"), f"must be one of {', '.join(MECHANISMS)}, got {mechanism!r}"
        )
    username = raw.get("username")
    if not isinstance(username, str) or not username:
        raise lines.error((section, "username"), "is required (a non-empty string)")
    has_password, has_file = "password" in raw, "password_file" in raw
    if has_password == has_file:
        raise lines.error((section,), "give exactly one of password and password_file")
    if has_password:
        password = raw["password"]
        if not isinstance(password, str) or not password:
            raise lines.error((section, "password"), "must be a non-empty string")
    else:
        password = _read_password(raw["password_file"], lines, section, base)
    return UpstreamSasl(mechanism=str(mechanism), username=username, password=password)


def _read_password(value: Any, lines: LineMap, section: str, base: Path | None) -> str:
    where = (section, "password_file")
    if not isinstance(value, str) or not value:
        raise lines.error(where, "must be a file path")
    path = Path(value).expanduser()
    if not path.is_absolute() and base is not None:
        path = base / path
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise lines.error(where, f"file not found: {path}") from None
    except OSError as exc:
        raise lines.error(where, f"cannot read {path}: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise lines.error(where, f"{path} is not UTF-8 text") from None
    password = text[:-1] if text.endswith("\n") else text
    password = password[:-1] if password.endswith("\r") else password
    if not password:
        raise lines.error(where, f"{path} is empty")
    return password
