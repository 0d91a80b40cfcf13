"""SASL pass-through: learn who the client authenticated as, without taking part in it.

SaslHandshake and SaslAuthenticate frames go to the broker unchanged; the broker decides.
The proxy reads the user name out of the client's own messages (PLAIN: the authcid; SCRAM:
the ``n=`` attribute of the client-first-message) and makes ``User:<name>`` (Kafka's principal
form) the session's principal only once the broker has answered the exchange's last step
with error code 0. Passwords, proofs
and nonces are never stored, logged or put in exception messages.

Only SaslHandshake v1+ is supported by this pass-through: after a v0 handshake the client sends
bare SASL tokens without Kafka request headers, which no client library has done since Kafka
1.0; the proxy refuses the v0 handshake itself and closes the connection as a protocol
violation.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import cast

from sluice.codec.errors import CodecError
from sluice.codec.headers import response_header_size
from sluice.codec.messages import ApiKey, decode_request, decode_response
from sluice.proxy.paths.base import (
    Exchange,
    Forward,
    Frame,
    PathContext,
    Refuse,
    RequestOutcome,
    Respond,
)
from sluice.proxy.telemetry.logs import log

_ERROR_CODE = struct.Struct(">h")
PRINCIPAL_PREFIX = "User:"
SCRAM_MECHANISMS = frozenset({"SCRAM-SHA-256", "SCRAM-SHA-512"})


@dataclass(slots=True)
class SaslState:
    """Per-connection SASL progress (the user name only, never credentials)."""

    mechanism: str | None = None
    user: str | None = None


@dataclass(frozen=True, slots=True)
class _Step:
    mechanism: str | None
    user: str | None
    final: bool  # the broker's success answer to this step completes authentication


# ------------------------------------------------------------------ message parsing (pure)


def plain_user(message: bytes) -> str | None:
    """The authentication identity of a PLAIN message ``authzid NUL authcid NUL passwd``."""
    parts = message.split(b"\x00")
    if len(parts) != 3 or not parts[1]:
        return None
    return parts[1].decode("utf-8", "replace")


def _unescape_saslname(value: str) -> str | None:
    # RFC 5802: "," and "=" in a name are sent as "=2C" and "=3D"; any other "=" is invalid.
    out = []
    i = 0
    while i < len(value):
        ch = value[i]
        if ch == "=":
            code = value[i + 1 : i + 3]
            if code == "2C":
                out.append(",")
            elif code == "3D":
                out.append("=")
            else:
                return None
            i += 3
            continue
        out.append(ch)
        i += 1
    return "".join(out)


def scram_user(message: bytes) -> str | None:
    """The user name of a SCRAM client-first-message ``n,,n=USER,r=NONCE``."""
    try:
        text = message.decode("utf-8")
    except UnicodeDecodeError:
        return None
    # gs2-header: cbind flag ("n", "y" or "p=..."), then an optional authzid, each ","-ended.
    flag, sep, rest = text.partition(",")
    if not sep or not (flag in ("n", "y") or flag.startswith("p=")):
        return None
    _authzid, sep, bare = rest.partition(",")
    if not sep:
        return None
    for attribute in bare.split(","):
        if attribute.startswith("n="):
            name = _unescape_saslname(attribute[2:])
            return name or None
    return None


def is_scram_first(message: bytes) -> bool:
    return message[:2] in (b"n,", b"y,") or message[:2] == b"p="


def is_scram_final(message: bytes) -> bool:
    return message[:2] == b"c="


def sasl_step(state: SaslState, auth_bytes: bytes) -> _Step:
    """What one SaslAuthenticate request tells about the user, given the handshake so far."""
    mechanism = state.mechanism
    if mechanism == "PLAIN":
        return _Step(mechanism, plain_user(auth_bytes), final=True)
    if mechanism in SCRAM_MECHANISMS:
        if is_scram_first(auth_bytes):
            state.user = scram_user(auth_bytes)
            return _Step(mechanism, state.user, final=False)
        if is_scram_final(auth_bytes):
            return _Step(mechanism, state.user, final=True)
    return _Step(mechanism, None, final=False)


def response_error_code(body: memoryview | bytes, api_key: int, api_version: int) -> int:
    """The error code that opens SaslHandshake and SaslAuthenticate response bodies."""
    size = response_header_size(body, api_key, api_version)
    return int(_ERROR_CODE.unpack_from(body, size)[0])


# ------------------------------------------------------------------ the path


def _state(exchange: Exchange) -> SaslState:
    state = exchange.client.sasl
    if state is None:
        state = exchange.client.sasl = SaslState()
    return cast(SaslState, state)


class SaslPath:
    name = "sasl"
    api_keys = frozenset({int(ApiKey.SASL_HANDSHAKE), int(ApiKey.SASL_AUTHENTICATE)})

    def wants_request(self, ctx: PathContext, api_key: int) -> bool:
        return True

    def wants_response(self, ctx: PathContext, api_key: int, version: int) -> bool:
        return False  # the authenticate answer is pinned by its request

    def on_request(self, ctx: PathContext, exchange: Exchange, frame: Frame) -> RequestOutcome:
        header = exchange.header
        if header.api_key == ApiKey.SASL_HANDSHAKE:
            return self._handshake(exchange, frame)
        return self._authenticate(exchange, frame)

    def _handshake(self, exchange: Exchange, frame: Frame) -> RequestOutcome:
        header = exchange.header
        state = _state(exchange)
        state.user = None
        try:
            request = decode_request(
                ApiKey.SASL_HANDSHAKE, header.api_version, frame[header.header_size :]
            )
            state.mechanism = str(request.mechanism).upper()
        except CodecError:
            state.mechanism = None
        log.debug("sasl_handshake", mechanism=state.mechanism, version=header.api_version)
        if header.api_version == 0:
            # After a v0 handshake the client sends bare SASL tokens without Kafka headers,
            # which the proxy cannot frame: refuse rather than misread them.
            return Refuse("SaslHandshake v0 (bare SASL tokens) is not supported; use v1+")
        return Forward()

    def _authenticate(self, exchange: Exchange, frame: Frame) -> RequestOutcome:
        header = exchange.header
        state = _state(exchange)
        try:
            request = decode_request(
                ApiKey.SASL_AUTHENTICATE, header.api_version, frame[header.header_size :]
            )
            step = sasl_step(state, bytes(request.auth_bytes))
        except CodecError:
            # Still the broker's call; we only lose the user name for telemetry.
            step = _Step(state.mechanism, None, final=False)
        # The user name and the step kind only: the message itself holds the password or proof.
        log.debug("sasl_authenticate", mechanism=step.mechanism, user=step.user, final=step.final)
        return Forward(state=step, pin=self)

    def on_response(self, ctx: PathContext, exchange: Exchange, frame: Frame) -> Respond:
        step: _Step = exchange.state
        hdr = exchange.header
        try:
            code = response_error_code(frame, hdr.api_key, hdr.api_version)
            if code == 0 and step.final and step.mechanism in SCRAM_MECHANISMS:
                code = _scram_final_code(frame, hdr.api_version)
        except (CodecError, struct.error):
            code = -1
        if code != 0:
            log.info("sasl_failed", mechanism=step.mechanism, error_code=code)
            ctx.metrics.sasl(step.mechanism, "failed")
        elif step.final:
            if step.user is not None:
                # Kafka's principal form, which filter `principals:` globs match (User:alice).
                exchange.client.principal = PRINCIPAL_PREFIX + step.user
            log.info(
                "sasl_authenticated", mechanism=step.mechanism, principal=exchange.client.principal
            )
            ctx.metrics.sasl(step.mechanism, "ok")
        return Respond(frame)

    def on_unanswered(self, ctx: PathContext, exchange: Exchange, reason: str) -> None:
        """Nothing to account for: the client sees the connection close."""


def _scram_final_code(body: memoryview | bytes, version: int) -> int:
    """0 if the server-final-message carries a verifier (``v=``), -1 for ``e=<error>``.

    RFC 5802 lets a server report failure inside the message; a broker should also set an
    error code, but one that does not must not get the user a principal.
    """
    size = response_header_size(body, ApiKey.SASL_AUTHENTICATE, version)
    response = decode_response(ApiKey.SASL_AUTHENTICATE, version, body[size:])
    return 0 if bytes(response.auth_bytes).startswith(b"v=") else -1
