"""Ed25519 signatures on fleet records: operator and proxy keys, the signed envelope, checks.

Every record that changes what proxies run (a filter deploy or removal, a data policy set or
removed) is a signed envelope, the record value::

    {"format": 2, "signed": "<payload: a JSON object, as text>", "key_id": "<16 hex>",
     "signature": "<base64 Ed25519 signature>", "module_b64": "<filter records only>"}

The signature covers a fixed context string, the record key and the payload text byte for byte
(no canonical JSON to get wrong). The payload names the record's ``type`` (``filter``,
``filter-removed``, ``policy``, ``policy-removed``), what it binds (for a filter: the module's
sha256 and size, name, topics, directions, config...; for a policy: topic and value), who and
when, and ``seq`` (nanoseconds since the epoch, strictly above every earlier record of that key)
with a random ``nonce``: a proxy applies a record of a key only if its ``seq`` is above the one
it holds, so an old signed record written again (a replay) changes nothing. The module bytes
travel outside the payload; the signed sha256 checks them. A tombstone cannot carry a
signature: removals are signed ``*-removed`` records, and a bare tombstone changes nothing.

Keys: a private key is a PKCS#8 PEM file (mode 0600, `generate_key_files`); its public key is
one line ``ed25519:<base64 of the 32 raw bytes>`` (the ``.pub`` file beside it, or inline in
the config). A key's id is the first 16 hex digits of the sha256 of its raw public bytes.

Pure: no IO besides reading and writing key files.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import os
import secrets
import struct
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

SIGNED_FORMAT: Final = 2
PUBLIC_PREFIX: Final = "ed25519:"
CONTEXT: Final = b"sluice fleet record v1\x00"
#: Record types a signed payload may name.
FILTER, FILTER_REMOVED, POLICY, POLICY_REMOVED = "filter", "filter-removed", "policy", \
    "policy-removed"
TYPES: Final = (FILTER, FILTER_REMOVED, POLICY, POLICY_REMOVED)
#: Largest payload text accepted (the module travels outside it).
MAX_PAYLOAD_BYTES: Final = 1024 * 1024


class KeyFileError(ValueError):
    """A key file or public key that cannot be used; the message names it."""


class SignatureError(ValueError):
    """A record that does not verify. `reason` is a short label for metrics:
    ``unsigned``, ``untrusted_key``, ``bad_signature`` or ``unreadable``."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


def key_id_of(public: Ed25519PublicKey) -> str:
    """The first 16 hex digits of the sha256 of the raw public key."""
    raw = public.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return hashlib.sha256(raw).hexdigest()[:16]


def public_text(public: Ed25519PublicKey) -> str:
    """``ed25519:<base64>``: how a public key is written in ``.pub`` files and configs."""
    raw = public.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return PUBLIC_PREFIX + base64.b64encode(raw).decode("ascii")


@dataclass(frozen=True, slots=True)
class SigningKey:
    """A private key that signs fleet records."""

    private: Ed25519PrivateKey
    key_id: str
    public: str
    path: str

    def trusted(self) -> TrustedKey:
        return TrustedKey(self.key_id, self.private.public_key(), self.path)


@dataclass(frozen=True, slots=True)
class TrustedKey:
    key_id: str
    public: Ed25519PublicKey
    source: str


def parse_public_key(text: str, source: str) -> TrustedKey:
    """Read ``ed25519:<base64>`` (anything after the first word, e.g. a comment, is ignored)."""
    words = text.strip().split()
    if not words or not words[0].startswith(PUBLIC_PREFIX):
        raise KeyFileError(f"{source}: not an Ed25519 public key (expected "
                           f"'{PUBLIC_PREFIX}<base64>', as `sluice filter keygen` writes)")
    try:
        raw = base64.b64decode(words[0][len(PUBLIC_PREFIX):], validate=True)
        public = Ed25519PublicKey.from_public_bytes(raw)
    except (binascii.Error, ValueError):
        raise KeyFileError(f"{source}: the Ed25519 public key is not 32 bytes of base64") \
            from None
    return TrustedKey(key_id_of(public), public, source)


def load_trusted_keys(entries: Iterable[str], base: Path | None = None) -> dict[str, TrustedKey]:
    """Trusted keys by id; each entry is an inline ``ed25519:...`` key or a ``.pub`` file."""
    out: dict[str, TrustedKey] = {}
    for entry in entries:
        if entry.strip().startswith(PUBLIC_PREFIX):
            key = parse_public_key(entry, "inline key")
        else:
            path = Path(entry).expanduser()
            if base is not None and not path.is_absolute():
                path = base / path
            try:
                text = path.read_text(encoding="utf-8")
            except (OSError, UnicodeDecodeError) as exc:
                raise KeyFileError(f"{path}: cannot read public key: "
                                   f"{getattr(exc, 'strerror', None) or exc}") from None
            key = parse_public_key(text, str(path))
        out[key.key_id] = key
    return out


def load_signing_key(path: Path) -> SigningKey:
    """Read a private key file; refused when others may read it."""
    try:
        mode = path.stat().st_mode
        data = path.read_bytes()
    except OSError as exc:
        raise KeyFileError(f"{path}: cannot read signing key: {exc.strerror or exc}") from None
    if mode & 0o077:
        raise KeyFileError(f"{path}: signing key is readable by others (mode "
                           f"{mode & 0o777:o}); run chmod 600 on it")
    try:
        private = serialization.load_pem_private_key(data, password=None)
    except (ValueError, TypeError) as exc:
        raise KeyFileError(f"{path}: not a PEM private key ({exc})") from None
    if not isinstance(private, Ed25519PrivateKey):
        raise KeyFileError(f"{path}: not an Ed25519 private key")
    public = private.public_key()
    return SigningKey(private, key_id_of(public), public_text(public), str(path))


def generate_key_files(path: Path, comment: str = "", *, force: bool = False) -> SigningKey:
    """Write a new private key to `path` (mode 0600) and its public key to `path` + ``.pub``."""
    private = Ed25519PrivateKey.generate()
    pem = private.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption())
    flags = os.O_WRONLY | os.O_CREAT | (os.O_TRUNC if force else os.O_EXCL)
    try:
        fd = os.open(path, flags, 0o600)
    except FileExistsError:
        raise KeyFileError(f"{path}: exists (a key is never overwritten without --force)") \
            from None
    except OSError as exc:
        raise KeyFileError(f"{path}: cannot write: {exc.strerror or exc}") from None
    with os.fdopen(fd, "wb") as fh:
        os.fchmod(fh.fileno(), 0o600)
        fh.write(pem)
    public = private.public_key()
    key_id = key_id_of(public)
    text = public_text(public)
    pub = Path(f"{path}.pub")
    pub.write_text(f"{text} {key_id}{' ' + comment if comment else ''}\n", encoding="utf-8")
    return SigningKey(private, key_id, text, str(path))


# ------------------------------------------------------------------------------------------
# the envelope
# ------------------------------------------------------------------------------------------

def _message(record_key: bytes, payload: bytes) -> bytes:
    return CONTEXT + struct.pack(">I", len(record_key)) + record_key + payload


def next_seq(after: int | None = None) -> int:
    """A sequence number above `after` (the key's current one) and at least the clock's."""
    now = time.time_ns()
    return max(now, (after or 0) + 1)


def sign(key: SigningKey, record_key: bytes, payload: Mapping[str, Any],
         module_b64: str | None = None) -> bytes:
    """The record value: `payload` (which must hold ``type`` and ``seq``) signed by `key`."""
    body = dict(payload)
    body.setdefault("nonce", secrets.token_hex(8))
    text = json.dumps(body, separators=(",", ":"), ensure_ascii=False)
    signature = key.private.sign(_message(record_key, text.encode("utf-8")))
    envelope: dict[str, Any] = {"format": SIGNED_FORMAT, "signed": text, "key_id": key.key_id,
                                "signature": base64.b64encode(signature).decode("ascii")}
    if module_b64 is not None:
        envelope["module_b64"] = module_b64
    return json.dumps(envelope, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


@dataclass(frozen=True, slots=True)
class Verified:
    """A record whose signature checked out."""

    key_id: str
    type: str
    seq: int
    payload: Mapping[str, Any]
    #: The envelope without the module bytes (what the proxy's state file keeps).
    envelope: Mapping[str, Any]
    module_b64: str | None


def is_signed(value: bytes) -> bool:
    """Cheap test: does `value` look like a signed envelope (not a format-1 record)?"""
    return value.startswith(b'{"format":2,') or b'"signature"' in value[:4096]


def verify(record_key: bytes, value: bytes | Mapping[str, Any],
           trusted: Mapping[str, TrustedKey]) -> Verified:
    """Check one record value against the trusted keys (SignatureError says why not)."""
    if isinstance(value, Mapping):
        envelope: Any = value
    else:
        if not value:
            raise SignatureError("unsigned", "a bare tombstone (removals must be signed)")
        try:
            envelope = json.loads(value)
        except (ValueError, UnicodeDecodeError):
            raise SignatureError("unreadable", "the value is not JSON") from None
    if not isinstance(envelope, dict):
        raise SignatureError("unreadable", "the value is not a JSON object")
    if envelope.get("format") != SIGNED_FORMAT or "signature" not in envelope:
        raise SignatureError("unsigned", "the record is not signed")
    text, key_id, sig = envelope.get("signed"), envelope.get("key_id"), envelope.get("signature")
    if not isinstance(text, str) or not isinstance(key_id, str) or not isinstance(sig, str):
        raise SignatureError("unreadable", "signed, key_id and signature must be strings")
    payload_bytes = text.encode("utf-8")
    if len(payload_bytes) > MAX_PAYLOAD_BYTES:
        raise SignatureError("unreadable", "the signed payload is too large")
    key = trusted.get(key_id)
    if key is None:
        raise SignatureError("untrusted_key", f"signed by key {key_id[:16]!r}, not a trusted key")
    try:
        raw_sig = base64.b64decode(sig, validate=True)
        key.public.verify(raw_sig, _message(record_key, payload_bytes))
    except (binascii.Error, ValueError, InvalidSignature):
        raise SignatureError("bad_signature", f"the signature does not verify with key "
                                              f"{key_id}") from None
    try:
        payload = json.loads(text)
    except ValueError:
        raise SignatureError("unreadable", "the signed payload is not JSON") from None
    if not isinstance(payload, dict):
        raise SignatureError("unreadable", "the signed payload is not a JSON object")
    kind, seq = payload.get("type"), payload.get("seq")
    if kind not in TYPES:
        raise SignatureError("unreadable", f"unknown record type {kind!r}")
    if isinstance(seq, bool) or not isinstance(seq, int) or seq <= 0:
        raise SignatureError("unreadable", "seq must be a positive integer")
    module = envelope.get("module_b64")
    if module is not None and not isinstance(module, str):
        raise SignatureError("unreadable", "module_b64 must be a string")
    kept = {k: v for k, v in envelope.items() if k != "module_b64"}
    return Verified(key_id, str(kind), int(seq), payload, kept, module)


def read_unverified(value: bytes) -> Verified:
    """The payload of a signed record WITHOUT checking the signature (``sluice filter list``
    without trusted keys shows what records claim; a proxy never calls this)."""
    try:
        envelope = json.loads(value)
        payload = json.loads(envelope["signed"])
        kind, seq = payload.get("type"), payload.get("seq")
        key_id = str(envelope.get("key_id"))
    except (ValueError, TypeError, KeyError, AttributeError, UnicodeDecodeError):
        raise SignatureError("unreadable", "not a readable signed record") from None
    if kind not in TYPES or isinstance(seq, bool) or not isinstance(seq, int):
        raise SignatureError("unreadable", "not a readable signed record")
    module = envelope.get("module_b64")
    kept = {k: v for k, v in envelope.items() if k != "module_b64"}
    return Verified(key_id, str(kind), seq, payload, kept,
                    module if isinstance(module, str) else None)


def new_signing_key(path: str = "<memory>") -> SigningKey:
    """A fresh key held in memory only (tests, and `generate_key_files`' sibling)."""
    private = Ed25519PrivateKey.generate()
    public = private.public_key()
    return SigningKey(private, key_id_of(public), public_text(public), path)
