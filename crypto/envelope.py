"""The stored layout of an encrypted record (layout version 1), sans-IO.

A record encrypted by the proxy keeps its key and its own headers; the proxy appends its
headers after the producer's, in this order:

    sluice.enc         ASCII "1;value" or "1;fields": layout version and mode
    sluice.enc.key     ASCII "<kek name>;<kek version>": the key-encryption key used
    sluice.enc.dek     binary: the data key wrapped by that KEK (opaque bytes from the KMS)
    sluice.enc.fields  (fields mode only) JSON array of the encrypted field paths

Whole-value mode stores ``0x01 | nonce (12) | AES-256-GCM ciphertext and tag (16)``.
Fields mode keeps the JSON document and replaces each encrypted field's value text with the
JSON string ``"sluice:enc:1:" + base64url(nonce | ciphertext and tag)`` (no padding); the
plaintext of a field is the exact text of its original JSON value, so decryption restores the
producer's bytes exactly.

The additional authenticated data binds each ciphertext to its place: the layout version,
the mode, the KEK name and version, the wrapped data key, the record key, and (fields mode)
the field path. Moving a value to another record key, editing a header or flipping a byte makes
decryption fail.

Reading is forward-compatible: a later layout version gets a new number in ``sluice.enc``;
readers keep every older version.
"""

from __future__ import annotations

import json
import os
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

LAYOUT_VERSION: Final = 1
H_ENC: Final = "sluice.enc"
H_KEY: Final = "sluice.enc.key"
H_DEK: Final = "sluice.enc.dek"
H_FIELDS: Final = "sluice.enc.fields"
OUR_HEADERS: Final = (H_ENC, H_KEY, H_DEK, H_FIELDS)
MODE_VALUE: Final = "value"
MODE_FIELDS: Final = "fields"
NONCE_SIZE: Final = 12
TAG_SIZE: Final = 16
KEY_SIZE: Final = 32
VALUE_PREFIX: Final = b"\x01"
FIELD_PREFIX: Final = "sluice:enc:1:"

Header = tuple[str, bytes | None]
_LEN: Final = struct.Struct(">I")


class EnvelopeError(ValueError):
    """Stored bytes that do not form a valid envelope, or fail authentication (tampering,
    a wrong key). Never carries plaintext."""


@dataclass(frozen=True, slots=True)
class Envelope:
    """The proxy's headers of one encrypted record, parsed."""

    mode: str
    key_name: str
    key_version: str
    wrapped_dek: bytes
    fields: tuple[str, ...] = ()
    #: Index of the first of the proxy's headers in the record's header list.
    start: int = 0


def aad_prefix(mode: str, key_name: str, key_version: str, wrapped_dek: bytes) -> bytes:
    """The part of the associated data shared by every ciphertext under one data key."""
    parts = (b"sluice.enc", str(LAYOUT_VERSION).encode(), mode.encode(), key_name.encode(),
             key_version.encode(), wrapped_dek)
    return b"".join(_LEN.pack(len(p)) + p for p in parts)


def aad_for(prefix: bytes, record_key: bytes | None, field: str = "") -> bytes:
    """`prefix` completed with the record key (absent and empty differ) and the field path:
    the additional authenticated data of one ciphertext (all parts length-prefixed)."""
    rk = b"\x00" if record_key is None else b"\x01" + record_key
    fb = field.encode()
    return b"".join((prefix, _LEN.pack(len(rk)), rk, _LEN.pack(len(fb)), fb))


def aad(mode: str, key_name: str, key_version: str, wrapped_dek: bytes,
        record_key: bytes | None, field: str = "") -> bytes:
    """The additional authenticated data of one ciphertext."""
    return aad_for(aad_prefix(mode, key_name, key_version, wrapped_dek), record_key, field)


def headers_for(env: Envelope) -> list[Header]:
    """The proxy's headers for `env`, in stored order."""
    out: list[Header] = [
        (H_ENC, f"{LAYOUT_VERSION};{env.mode}".encode()),
        (H_KEY, f"{env.key_name};{env.key_version}".encode()),
        (H_DEK, env.wrapped_dek),
    ]
    if env.mode == MODE_FIELDS:
        out.append((H_FIELDS, _json_list(env.fields)))
    return out


def _json_list(items: Sequence[str]) -> bytes:
    return json.dumps(list(items), separators=(",", ":"), ensure_ascii=False).encode()


def group_start(headers: Sequence[Header]) -> int:
    """Index of the last ``sluice.enc`` header (-1: none). Checks the usual places first:
    the proxy's group is the last 3 (value mode) or 4 (fields mode) headers."""
    n = len(headers)
    if n >= 3 and headers[n - 3][0] == H_ENC:
        return n - 3
    if n >= 4 and headers[n - 4][0] == H_ENC:
        return n - 4
    for i in range(n - 1, -1, -1):
        if headers[i][0] == H_ENC:
            return i
    return -1


def find_envelope(headers: Sequence[Header]) -> Envelope | None:
    """The proxy's headers at the end of `headers`, or None when the record is not encrypted.

    Raises EnvelopeError when a ``sluice.enc`` header is present but the group is malformed
    (edited in the broker, or written by an unknown future layout).
    """
    start = group_start(headers)
    if start < 0:
        return None
    group = headers[start:]
    names = [h[0] for h in group]
    values = [h[1] for h in group]
    if any(v is None for v in values):
        raise EnvelopeError("encryption header without a value")
    enc = bytes(values[0] or b"")
    version, _, mode = enc.partition(b";")
    if version != str(LAYOUT_VERSION).encode():
        raise EnvelopeError(f"unknown encryption layout {version[:8]!r}")
    want = [H_ENC, H_KEY, H_DEK] + ([H_FIELDS] if mode == MODE_FIELDS.encode() else [])
    if mode not in (MODE_VALUE.encode(), MODE_FIELDS.encode()) or names != want:
        raise EnvelopeError("malformed encryption headers")
    try:
        key_text = bytes(values[1] or b"").decode()
    except UnicodeDecodeError:
        raise EnvelopeError("malformed sluice.enc.key header") from None
    key_name, sep, key_version = key_text.rpartition(";")
    if not sep or not key_name or not key_version:
        raise EnvelopeError("malformed sluice.enc.key header")
    fields: tuple[str, ...] = ()
    if mode == MODE_FIELDS.encode():
        fields = _parse_fields(bytes(values[3] or b""))
    return Envelope(mode.decode(), key_name, key_version, bytes(values[2] or b""), fields,
                    start)


def _parse_fields(raw: bytes) -> tuple[str, ...]:
    try:
        items = json.loads(raw)
    except ValueError:
        raise EnvelopeError("malformed sluice.enc.fields header") from None
    if not isinstance(items, list) or not all(isinstance(i, str) and i for i in items):
        raise EnvelopeError("malformed sluice.enc.fields header")
    return tuple(items)


def seal(aead: AESGCM, plaintext: bytes, associated: bytes, nonce: bytes | None = None
         ) -> bytes:
    """``nonce | ciphertext and tag``; `nonce` must be 12 fresh random bytes (drawn here when
    not given; callers sealing many values draw them in one `os.urandom` call)."""
    if nonce is None:
        nonce = os.urandom(NONCE_SIZE)
    return nonce + aead.encrypt(nonce, plaintext, associated)


def unseal(aead: AESGCM, sealed: bytes, associated: bytes) -> bytes:
    """The plaintext of `seal`'s output; EnvelopeError when it fails authentication."""
    if len(sealed) < NONCE_SIZE + TAG_SIZE:
        raise EnvelopeError("ciphertext too short")
    try:
        return aead.decrypt(sealed[:NONCE_SIZE], sealed[NONCE_SIZE:], associated)
    except InvalidTag:
        raise EnvelopeError("ciphertext failed authentication") from None


def seal_value(aead: AESGCM, prefix: bytes, record_key: bytes | None, value: bytes,
               nonce: bytes | None = None) -> bytes:
    """The stored value of a whole-value encrypted record (`prefix`: `aad_prefix` of its
    envelope; `nonce` as for `seal`)."""
    return VALUE_PREFIX + seal(aead, value, aad_for(prefix, record_key), nonce)


def open_value(aead: AESGCM, env: Envelope, record_key: bytes | None, stored: bytes,
               prefix: bytes | None = None) -> bytes:
    """The producer's value from a whole-value encrypted record (EnvelopeError if not);
    `prefix` is `aad_prefix` of `env` when the caller has it already."""
    if stored[:1] != VALUE_PREFIX:
        raise EnvelopeError("stored value does not start with the layout marker")
    if prefix is None:
        prefix = aad_prefix(MODE_VALUE, env.key_name, env.key_version, env.wrapped_dek)
    return unseal(aead, stored[1:], aad_for(prefix, record_key))
