"""The stored layout of an encrypted record (layout 3, and layouts 2 and 1 still read), sans-IO.

A record encrypted by the proxy keeps its key and its own headers; the proxy appends its
headers after the producer's (layout 3, written today):

    sluice.enc         binary: 0x03 | mode (0x01 value, 0x02 fields) | the filter's name |
                       the KEK's name | the KEK's version | the wrapped data key; the three
                       texts are UTF-8, each after its length as an unsigned LEB128 varint,
                       and the wrapped data key (opaque bytes from the KMS) is the rest
    sluice.enc.fields  (fields mode only) JSON array of the encrypted field paths

Layout 2 stored the same facts in three headers: ``sluice.enc`` ("2;value;<filter>" or
"2;fields;<filter>"), ``sluice.enc.key`` ("<kek name>;<kek version>") and ``sluice.enc.dek``
(the wrapped data key), then ``sluice.enc.fields``; layout 1 the same with ``sluice.enc``
holding only "1;value" or "1;fields". Layout 3 is layout 2 in one header (about 35 bytes
less per record); what is authenticated is the same. A layout-3 value starts with the byte
0x03, never with an ASCII digit, so the two cannot be confused.

Whole-value mode stores ``0x01 | nonce (12) | AES-256-GCM ciphertext and tag (16)``.
Fields mode keeps the JSON document and replaces each encrypted field's value text with the
JSON string ``"sluice:enc:1:" + base64url(nonce | ciphertext and tag)`` (no padding); the
plaintext of a field is the exact text of its original JSON value, so decryption restores the
producer's bytes exactly.

The additional authenticated data (AAD) binds each ciphertext to its place. Layouts 2 and 3:
the layout version, the mode, the KEK name and version, the wrapped data key, the filter's
name, the topic, the record key, a SHA-256 digest of the rest of the record (the producer's
headers; in fields mode also the list of sealed fields and every byte of the document outside
the sealed values), and (fields mode) the field path. Layout 1 covered neither the filter,
the topic nor the rest of the record, which is why a filter reads it only when told to
(``accept_legacy``).

Reading is forward-compatible: a later layout version gets a new number in ``sluice.enc``;
readers keep every older version.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

#: The layout written today; TEXT_LAYOUT and LEGACY_LAYOUT are still read (see the module
#: docstring).
LAYOUT_VERSION: Final = 3
TEXT_LAYOUT: Final = 2
LEGACY_LAYOUT: Final = 1
#: Layout 3's mode bytes.
_MODE_BYTES: Final = {"value": 1, "fields": 2}
_MODE_NAMES: Final = {1: "value", 2: "fields"}
H_ENC: Final = "sluice.enc"
H_KEY: Final = "sluice.enc.key"
H_DEK: Final = "sluice.enc.dek"
H_FIELDS: Final = "sluice.enc.fields"
OUR_HEADERS: Final = (H_ENC, H_KEY, H_DEK, H_FIELDS)
#: Every header whose name starts with this belongs to the proxy: producers may not send one.
RESERVED_PREFIX: Final = "sluice.enc"
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
    #: The layout the group was written in (1 unless stated: the fields above are layout
    #: 1's; layouts 2 and 3 add `filter_name`).
    layout: int = LEGACY_LAYOUT
    #: Layouts 2 and 3: the name of the filter that sealed the record.
    filter_name: str = ""


def aad_prefix(mode: str, key_name: str, key_version: str, wrapped_dek: bytes) -> bytes:
    """Layout 1: the part of the associated data shared by every ciphertext under one data
    key (kept to read records of older Sluice versions)."""
    parts = (b"sluice.enc", str(LEGACY_LAYOUT).encode(), mode.encode(), key_name.encode(),
             key_version.encode(), wrapped_dek)
    return b"".join(_LEN.pack(len(p)) + p for p in parts)


def aad_prefix_v2(mode: str, key_name: str, key_version: str, wrapped_dek: bytes,
                  filter_name: str, topic: str, layout: int = LAYOUT_VERSION) -> bytes:
    """Layouts 2 and 3 (`layout`, today's unless given): the part of the associated data
    shared by every ciphertext one filter seals under one data key on one topic."""
    parts = (b"sluice.enc", str(layout).encode(), mode.encode(), key_name.encode(),
             key_version.encode(), wrapped_dek, filter_name.encode(), topic.encode())
    return b"".join(_LEN.pack(len(p)) + p for p in parts)


def prefix_for(env: Envelope, topic: str) -> bytes:
    """The AAD prefix of `env` (its own layout) on `topic`."""
    if env.layout == LEGACY_LAYOUT:
        return aad_prefix(env.mode, env.key_name, env.key_version, env.wrapped_dek)
    return aad_prefix_v2(env.mode, env.key_name, env.key_version, env.wrapped_dek,
                         env.filter_name, topic, env.layout)


def record_digest(headers: Sequence[Header], fields: Sequence[str] = (),
                  clear: Sequence[str] | None = None) -> bytes:
    """Layouts 2 and 3: SHA-256 of what a record holds besides its sealed values and its key: the
    producer's `headers` (every header before the proxy's group, in order), and in fields
    mode the sealed paths and the document's text outside the sealed values (`clear`: the
    pieces between them, in order). Unambiguous: every part is counted or length-prefixed."""
    h = hashlib.sha256()
    h.update(_LEN.pack(len(headers)))
    for name, value in headers:
        nb = name.encode("utf-8", "surrogatepass")
        h.update(_LEN.pack(len(nb)) + nb)
        if value is None:
            h.update(b"\x00")
        else:
            h.update(b"\x01" + _LEN.pack(len(value)))
            h.update(value)
    if clear is not None:
        h.update(b"F" + _LEN.pack(len(fields)))
        for f in fields:
            fb = f.encode()
            h.update(_LEN.pack(len(fb)) + fb)
        h.update(_LEN.pack(len(clear)))
        for piece in clear:
            pb = piece.encode("utf-8")
            h.update(_LEN.pack(len(pb)) + pb)
    return h.digest()


def aad_for(prefix: bytes, record_key: bytes | None, field: str = "",
            digest: bytes | None = None) -> bytes:
    """`prefix` completed with the record key (absent and empty differ), (layouts 2, 3) the
    record's `record_digest` and the field path: the additional authenticated data of one
    ciphertext (all parts length-prefixed; layout 1 has no digest)."""
    rk = b"\x00" if record_key is None else b"\x01" + record_key
    fb = field.encode()
    if digest is None:
        return b"".join((prefix, _LEN.pack(len(rk)), rk, _LEN.pack(len(fb)), fb))
    return b"".join((prefix, _LEN.pack(len(rk)), rk, _LEN.pack(len(digest)), digest,
                     _LEN.pack(len(fb)), fb))


def headers_for(env: Envelope) -> list[Header]:
    """The proxy's headers for `env`, in stored order (in `env.layout`)."""
    if env.layout == LAYOUT_VERSION:
        out: list[Header] = [(H_ENC, compact_value(env))]
        if env.mode == MODE_FIELDS:
            out.append((H_FIELDS, _json_list(env.fields)))
        return out
    enc = (f"{env.layout};{env.mode}" if env.layout == LEGACY_LAYOUT
           else f"{env.layout};{env.mode};{env.filter_name}")
    out = [
        (H_ENC, enc.encode()),
        (H_KEY, f"{env.key_name};{env.key_version}".encode()),
        (H_DEK, env.wrapped_dek),
    ]
    if env.mode == MODE_FIELDS:
        out.append((H_FIELDS, _json_list(env.fields)))
    return out


def compact_value(env: Envelope) -> bytes:
    """Layout 3's ``sluice.enc`` value for `env` (see the module docstring)."""
    out = bytearray((LAYOUT_VERSION, _MODE_BYTES[env.mode]))
    for text in (env.filter_name, env.key_name, env.key_version):
        raw = text.encode()
        _uvarint(len(raw), out)
        out += raw
    out += env.wrapped_dek
    return bytes(out)


def _uvarint(value: int, out: bytearray) -> None:
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)


def _parse_compact(raw: bytes, names: Sequence[str], fields_value: bytes | None,
                   start: int) -> Envelope:
    """Layout 3's group: ``sluice.enc`` (`raw`), and in fields mode ``sluice.enc.fields``."""
    if len(raw) < 2 or raw[1] not in _MODE_NAMES:
        raise EnvelopeError("malformed sluice.enc header (layout 3)")
    mode = _MODE_NAMES[raw[1]]
    want = [H_ENC] + ([H_FIELDS] if mode == MODE_FIELDS else [])
    if list(names) != want:
        raise EnvelopeError("malformed encryption headers")
    pos, texts = 2, []
    for _ in range(3):
        n = shift = 0
        while True:
            if pos >= len(raw) or shift > 28:
                raise EnvelopeError("malformed sluice.enc header (layout 3)")
            b = raw[pos]
            pos += 1
            n |= (b & 0x7F) << shift
            shift += 7
            if not b & 0x80:
                break
        if n == 0 or pos + n > len(raw):
            raise EnvelopeError("malformed sluice.enc header (layout 3)")
        try:
            texts.append(raw[pos:pos + n].decode())
        except UnicodeDecodeError:
            raise EnvelopeError("malformed sluice.enc header (layout 3)") from None
        pos += n
    if pos >= len(raw):
        raise EnvelopeError("malformed sluice.enc header (layout 3): no wrapped data key")
    fields = _parse_fields(fields_value or b"") if mode == MODE_FIELDS else ()
    return Envelope(mode, texts[1], texts[2], raw[pos:], fields, start, LAYOUT_VERSION,
                    texts[0])


def _json_list(items: Sequence[str]) -> bytes:
    return json.dumps(list(items), separators=(",", ":"), ensure_ascii=False).encode()


def group_start(headers: Sequence[Header]) -> int:
    """Index of the last ``sluice.enc`` header (-1: none). Scanning from the end finds it
    within the last 1 to 4 headers (the proxy's group) when the record is encrypted."""
    for i in range(len(headers) - 1, -1, -1):
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
    if enc[:1] == bytes((LAYOUT_VERSION,)):
        return _parse_compact(enc, names, bytes(values[1] or b"") if len(values) > 1 else None,
                              start)
    version, _, mode = enc.partition(b";")
    filter_name = ""
    if version == str(TEXT_LAYOUT).encode():
        layout = TEXT_LAYOUT
        mode, fsep, name = mode.partition(b";")
        try:
            filter_name = name.decode()
        except UnicodeDecodeError:
            raise EnvelopeError("malformed sluice.enc header") from None
        if not fsep or not filter_name:
            raise EnvelopeError("malformed sluice.enc header (no filter name)")
    elif version == str(LEGACY_LAYOUT).encode():
        layout = LEGACY_LAYOUT
    else:
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
                    start, layout, filter_name)


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
               nonce: bytes | None = None, digest: bytes | None = None) -> bytes:
    """The stored value of a whole-value encrypted record (`prefix`: the AAD prefix of its
    envelope; `digest`: its `record_digest`, layouts 2 and 3; `nonce` as for `seal`)."""
    return VALUE_PREFIX + seal(aead, value, aad_for(prefix, record_key, "", digest), nonce)


def open_value(aead: AESGCM, env: Envelope, record_key: bytes | None, stored: bytes,
               prefix: bytes | None = None, digest: bytes | None = None) -> bytes:
    """The producer's value from a whole-value encrypted record (EnvelopeError if not);
    `prefix` is the AAD prefix of `env` (layout 1's is computed when not given), `digest`
    the record's `record_digest` (layouts 2 and 3)."""
    if stored[:1] != VALUE_PREFIX:
        raise EnvelopeError("stored value does not start with the layout marker")
    if prefix is None:
        prefix = aad_prefix(MODE_VALUE, env.key_name, env.key_version, env.wrapped_dek)
    return unseal(aead, stored[1:], aad_for(prefix, record_key, "", digest))
