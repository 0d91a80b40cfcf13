"""JSON field-level encryption: replace chosen fields' values by ciphertext strings, keeping
every other byte of the document as the producer wrote it (sans-IO).

Paths name object members from the top: ``card`` or ``customer.iban`` (dots separate levels;
arrays are not entered). Every occurrence of a path is encrypted (JSON allows duplicate member
names). The plaintext of a field is the exact text of its value, so decryption puts the
producer's bytes back and the whole value is byte-identical to what was produced.

The scanner walks the document with the standard library's JSON decoder (`raw_decode` for
each member value), which also validates it: a value that is not one JSON object is refused.
"""

from __future__ import annotations

import base64
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from sluice.crypto.envelope import (
    FIELD_PREFIX,
    LEGACY_LAYOUT,
    Envelope,
    EnvelopeError,
    Header,
    aad_for,
    prefix_for,
    record_digest,
    seal,
    unseal,
)

_WS: Final = re.compile(r"[ \t\n\r]*")
_WS_CHARS: Final = frozenset(" \t\n\r")
_DECODER: Final = json.JSONDecoder()

Span = tuple[int, int, str]  # value start, value end, path


class NotJsonObject(ValueError):
    """The value is not a single JSON object (field-level encryption needs one)."""


def _ws(text: str, pos: int) -> int:
    if pos >= len(text) or text[pos] not in _WS_CHARS:
        return pos  # the common case (compact JSON) without a regex call
    m = _WS.match(text, pos)
    assert m is not None  # the pattern matches the empty string
    return m.end()


Member = tuple[str, int, int]  # name, value start, value end


@dataclass(frozen=True, slots=True)
class Document:
    """A value checked to be one JSON object: its text and its top-level members."""

    text: str
    members: list[Member]


def _members(text: str, pos: int) -> tuple[list[tuple[str, int, int]], int]:
    """Members ``(name, value start, value end)`` of the object at `pos` and its end."""
    if text[pos:pos + 1] != "{":
        raise NotJsonObject("not a JSON object")
    pos = _ws(text, pos + 1)
    members: list[tuple[str, int, int]] = []
    if text[pos:pos + 1] == "}":
        return members, pos + 1
    while True:
        if text[pos:pos + 1] != '"':
            raise NotJsonObject(f"expected a member name at character {pos}")
        name, pos = _DECODER.raw_decode(text, pos)  # a string: text[pos] is '"'
        pos = _ws(text, pos)
        if text[pos:pos + 1] != ":":
            raise NotJsonObject(f"expected ':' at character {pos}")
        start = _ws(text, pos + 1)
        _value, end = _DECODER.raw_decode(text, start)
        members.append((name, start, end))
        pos = _ws(text, end)
        sep = text[pos:pos + 1]
        if sep == ",":
            pos = _ws(text, pos + 1)
        elif sep == "}":
            return members, pos + 1
        else:
            raise NotJsonObject(f"expected ',' or '}}' at character {pos}")


def _spans(text: str, members: list[Member], parts: Sequence[str], path: str,
           out: list[Span]) -> None:
    head, rest = parts[0], parts[1:]
    for name, vstart, vend in members:
        if name != head:
            continue
        if not rest:
            out.append((vstart, vend, path))
        elif text[vstart:vstart + 1] == "{":
            _spans(text, _members(text, vstart)[0], rest, path, out)


def parse_document(value: bytes) -> Document:
    """`value` after checking that it is exactly one JSON object."""
    try:
        text = value.decode("utf-8")
        start = _ws(text, 0)
        members, end = _members(text, start)
    except (UnicodeDecodeError, ValueError, IndexError) as exc:
        raise NotJsonObject(str(exc) if isinstance(exc, NotJsonObject)
                            else "not valid UTF-8 JSON") from None
    if _ws(text, end) != len(text):
        raise NotJsonObject("extra data after the JSON object")
    return Document(text, members)


def find_spans(doc: Document, paths: Sequence[str]) -> list[Span]:
    """Value spans of `paths` in the document, outermost only, in text order."""
    found: list[Span] = []
    for path in paths:
        _spans(doc.text, doc.members, path.split("."), path, found)
    found.sort()
    outer: list[Span] = []
    for span in found:
        if outer and span[0] < outer[-1][1]:
            continue  # inside a field already encrypted as a whole
        outer.append(span)
    return outer


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def _unb64(text: str) -> bytes:
    try:
        return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    except ValueError:
        raise EnvelopeError("field ciphertext is not base64url") from None


def _clear_pieces(text: str, spans: Sequence[Span]) -> list[str]:
    """The document's text outside `spans`, in order (what layout 2 authenticates)."""
    pieces: list[str] = []
    pos = 0
    for start, end, _path in spans:
        pieces.append(text[pos:start])
        pos = end
    pieces.append(text[pos:])
    return pieces


def _digest(env: Envelope, text: str, spans: Sequence[Span],
            headers: Sequence[Header]) -> bytes | None:
    if env.layout == LEGACY_LAYOUT:
        return None
    return record_digest(headers, env.fields, _clear_pieces(text, spans))


def encrypt_fields(aead: AESGCM, env: Envelope, record_key: bytes | None, text: str,
                   spans: Sequence[Span], *, topic: str = "",
                   headers: Sequence[Header] = (), nonces: bytes | None = None) -> bytes:
    """The stored document: every span's value text replaced by its ciphertext string.
    `env.fields` must list the paths of `spans`; `topic` and the producer's `headers` are
    authenticated with it (layout 2). `nonces`: 12 fresh random bytes per span, in order
    (drawn per span when not given)."""
    prefix = prefix_for(env, topic)
    digest = _digest(env, text, spans, headers)
    pieces: list[str] = []
    pos = 0
    for n, (start, end, path) in enumerate(spans):
        associated = aad_for(prefix, record_key, path, digest)
        nonce = None if nonces is None else nonces[n * 12:n * 12 + 12]
        sealed = seal(aead, text[start:end].encode("utf-8"), associated, nonce)
        pieces += [text[pos:start], '"', FIELD_PREFIX, _b64(sealed), '"']
        pos = end
    pieces.append(text[pos:])
    return "".join(pieces).encode("utf-8")


def decrypt_fields(aead: AESGCM, env: Envelope, record_key: bytes | None,
                   stored: bytes, *, topic: str = "", headers: Sequence[Header] = ()) -> bytes:
    """The producer's document from a fields-mode record (EnvelopeError if tampered).
    `topic` and `headers` (the producer's, before the proxy's group) as for
    `encrypt_fields`."""
    try:
        doc = parse_document(stored)
        spans = find_spans(doc, env.fields)
    except NotJsonObject as exc:
        raise EnvelopeError(f"stored document is not a JSON object: {exc}") from None
    if {p for _s, _e, p in spans} != set(env.fields):
        raise EnvelopeError("an encrypted field named in sluice.enc.fields is missing")
    text = doc.text
    prefix = prefix_for(env, topic)
    digest = _digest(env, text, spans, headers)
    pieces: list[str] = []
    pos = 0
    for start, end, path in spans:
        literal = json.loads(text[start:end])
        if not isinstance(literal, str) or not literal.startswith(FIELD_PREFIX):
            raise EnvelopeError(f"field {path!r} does not hold a ciphertext")
        associated = aad_for(prefix, record_key, path, digest)
        plain = unseal(aead, _unb64(literal[len(FIELD_PREFIX):]), associated)
        try:
            pieces += [text[pos:start], plain.decode("utf-8")]
        except UnicodeDecodeError:
            raise EnvelopeError(f"field {path!r} decrypted to invalid UTF-8") from None
        pos = end
    pieces.append(text[pos:])
    return "".join(pieces).encode("utf-8")
