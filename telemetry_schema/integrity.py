"""Telemetry that cannot be forged: the telemetry key, event ids nobody can predict, and the
authentication tags the sinks put on every unit they write and the audit job checks.

- **The key** is 32 random bytes, kept as 64 hex digits in a file (``sluice telemetry keygen
  FILE``) that the proxies (``telemetry: {key_file: FILE}``) and the audit job
  (``sluice audit --telemetry-key FILE``) read. Its id (``key_id``, 16 hex digits of a hash of
  the key) travels with every tag, so that an audit trusting several keys (a rotation) knows
  which one to check with; the id says nothing about the key.
- **Tags** are HMAC-SHA256 over one unit as it is stored, never per row: an Arrow IPC (or JSON)
  message on the Kafka topic, with its key and headers (carried in the ``sluice-tag`` header),
  and a published Parquet or JSON Lines file with its name in the layout (carried in a
  sidecar file, the file's name plus ``.tag``). Binding the name and the message id means a
  copy of a genuine unit under another name or id does not verify, and a copy under the same
  one is a duplicate the audit drops.
- **Event ids** are 128 random bits (``EventIds``): seeing any number of them tells nothing
  about the next.

The audit's side is ``Verifier``: a unit verifies, or is refused for one of ``REASONS``.
Nothing here logs or prints key material.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

KEY_BYTES = 32
# The Kafka header that carries a message's tag: ``<key id>:<hex HMAC>``.
TAG_HEADER = "sluice-tag"
# A published file's tag is in ``<file>.tag`` beside it (same text as the header).
TAG_SUFFIX = ".tag"
ALGORITHM = "hmac-sha256"
# Why a unit is refused: no tag at all, a key id the audit does not trust, or a tag that does
# not match (changed bytes, another name or id, a forger's guess).
NO_TAG = "no_tag"
UNKNOWN_KEY = "unknown_key"
BAD_TAG = "bad_tag"
REASONS = (BAD_TAG, NO_TAG, UNKNOWN_KEY)
# What a tag covers, per kind of unit (domain separation: a file's tag never verifies a
# message).
KAFKA_ARROW = b"kafka-arrow"
KAFKA_JSON = b"kafka-json"
FILE = b"file"
_DOMAIN = b"sluice-telemetry-tag-1\0"


class TelemetryKeyError(ValueError):
    """A telemetry key file is missing, unreadable or not a key; the message names the file."""


@dataclass(frozen=True)
class TelemetryKey:
    """One telemetry key: its id (public) and its secret (never printed: ``repr`` hides it)."""

    key_id: str
    secret: bytes = field(repr=False)


def key_id(secret: bytes) -> str:
    return hashlib.sha256(b"sluice-telemetry-key-id\0" + secret).hexdigest()[:16]


def new_key() -> TelemetryKey:
    secret = secrets.token_bytes(KEY_BYTES)
    return TelemetryKey(key_id(secret), secret)


def key_text(key: TelemetryKey) -> str:
    """The key file's content: the secret as hex, one line."""
    return key.secret.hex() + "\n"


def parse_key(text: str, where: str) -> TelemetryKey:
    value = text.strip()
    try:
        secret = bytes.fromhex(value)
    except ValueError:
        raise TelemetryKeyError(f"{where}: not a telemetry key (expected {2 * KEY_BYTES} hex "
                                "digits, as `sluice telemetry keygen` writes)") from None
    if len(secret) != KEY_BYTES:
        raise TelemetryKeyError(f"{where}: not a telemetry key (expected {2 * KEY_BYTES} hex "
                                f"digits, found {len(value)} characters)")
    return TelemetryKey(key_id(secret), secret)


def load_key(path: str | os.PathLike[str]) -> TelemetryKey:
    """The key in ``path``; ``TelemetryKeyError`` naming the file otherwise."""
    try:
        text = Path(path).read_text(encoding="ascii", errors="replace")
    except OSError as exc:
        raise TelemetryKeyError(f"{path}: cannot read telemetry key: "
                                f"{exc.strerror or exc}") from None
    return parse_key(text, str(path))


def write_key(path: str | os.PathLike[str], key: TelemetryKey, *, force: bool = False) -> None:
    """Write ``key`` to a new file readable by its owner only (``force``: replace a file)."""
    flags = os.O_WRONLY | os.O_CREAT | (os.O_TRUNC if force else os.O_EXCL)
    fd = os.open(path, flags, 0o600)
    with os.fdopen(fd, "w", encoding="ascii") as f:
        f.write(key_text(key))


def _mac(secret: bytes, kind: bytes, fields: Sequence[bytes]) -> hmac.HMAC:
    """An HMAC over ``kind`` and ``fields`` (each length-prefixed), ready for the unit's bytes
    to be added (last, so that a file's MAC can be updated as it is written)."""
    mac = hmac.new(secret, digestmod="sha256")
    mac.update(_DOMAIN + kind + b"\0")
    for value in fields:
        mac.update(len(value).to_bytes(8, "big"))
        mac.update(value)
    return mac


def _tag_text(key: TelemetryKey, digest: bytes) -> bytes:
    return f"{key.key_id}:{digest.hex()}".encode("ascii")


class Tagger:
    """The writing side: tags with one key."""

    def __init__(self, key: TelemetryKey) -> None:
        self.key = key

    def tag(self, kind: bytes, fields: Sequence[bytes], data: bytes) -> bytes:
        """The tag (header value or sidecar content) of one unit."""
        mac = _mac(self.key.secret, kind, fields)
        mac.update(data)
        return _tag_text(self.key, mac.digest())

    def file_mac(self, name: str) -> FileMac:
        """A tag computed as a file is written: ``update`` with its bytes, then ``tag``."""
        return FileMac(self.key, _mac(self.key.secret, FILE, [name.encode("utf-8")]))


class FileMac:
    def __init__(self, key: TelemetryKey, mac: hmac.HMAC) -> None:
        self._key = key
        self._mac = mac

    def update(self, data: bytes) -> None:
        self._mac.update(data)

    def tag(self) -> bytes:
        return _tag_text(self._key, self._mac.digest())


def write_sidecar(path: str | os.PathLike[str], tag: bytes, *, fsync: bool = True) -> None:
    """``path + TAG_SUFFIX`` holds ``tag``, written under a hidden name and renamed into place
    (before the file it tags is: a reader never sees a published file without its tag)."""
    target = Path(str(path) + TAG_SUFFIX)
    tmp = target.with_name(f".{target.name}.tmp")
    with open(tmp, "wb") as f:
        f.write(tag + b"\n")
        f.flush()
        if fsync:
            os.fsync(f.fileno())
    os.replace(tmp, target)


class Verifier:
    """The audit's side: the trusted keys, and the check of one unit."""

    def __init__(self, keys: Iterable[TelemetryKey]) -> None:
        self._keys = {k.key_id: k for k in keys}
        if not self._keys:
            raise ValueError("a verifier needs at least one key")

    @property
    def key_ids(self) -> list[str]:
        return sorted(self._keys)

    def check(self, tag: bytes | None, kind: bytes, fields: Sequence[bytes],
              data: bytes) -> str | None:
        """None when ``tag`` authenticates the unit, else the reason (one of ``REASONS``)."""
        if not tag:
            return NO_TAG
        key_part, sep, digest_hex = tag.strip().partition(b":")
        if not sep:
            return BAD_TAG
        key = self._keys.get(key_part.decode("ascii", "replace"))
        if key is None:
            return UNKNOWN_KEY
        mac = _mac(key.secret, kind, fields)
        mac.update(data)
        expected = mac.hexdigest().encode("ascii")
        return None if hmac.compare_digest(expected, digest_hex) else BAD_TAG

    def check_file(self, name: str, data: bytes, sidecar: bytes | None) -> str | None:
        """A published file's bytes against its sidecar's content (None: no sidecar)."""
        return self.check(sidecar, FILE, [name.encode("utf-8")], data)


def read_sidecar(path: str) -> bytes | None:
    """The tag beside a local file, None when it has none."""
    try:
        with open(path + TAG_SUFFIX, "rb") as f:
            return f.read(256)
    except FileNotFoundError:
        return None


def kafka_arrow_fields(key: bytes | None, dataset: bytes, layout: bytes,
                       message_id: bytes) -> list[bytes]:
    """What an Arrow message's tag covers besides its value: its key and headers."""
    return [key or b"", dataset, layout, message_id]


class EventIds:
    """Event ids: 128 bits from the operating system's random source each, 32 hex digits.

    Drawn 1,024 at a time (one ``os.urandom`` call): an id costs about as much as formatting
    the old ``<instance>-<counter>`` did, on the event loop, and no id tells anything about
    another."""

    _BLOCK = 1024

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pool = b""
        self._at = 0
        # A forked child (``--workers``) must not hand out its parent's ids again.
        os.register_at_fork(after_in_child=self._forget)

    def _forget(self) -> None:
        self._lock = threading.Lock()
        self._pool = b""
        self._at = 0

    def next(self) -> str:
        with self._lock:
            at = self._at
            if at >= len(self._pool):
                self._pool = os.urandom(16 * self._BLOCK)
                at = 0
            self._at = at + 16
            return self._pool[at:at + 16].hex()
