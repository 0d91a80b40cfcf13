"""JSON field-level encryption (crypto/json_fields.py): the rest of the document stays
readable and valid, decryption restores the exact bytes, tampering is detected."""

from __future__ import annotations

import json
from typing import Any

import pytest
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from hypothesis import given, settings
from hypothesis import strategies as st

from sluice.crypto.envelope import FIELD_PREFIX, MODE_FIELDS, Envelope, EnvelopeError
from sluice.crypto.json_fields import (
    NotJsonObject,
    decrypt_fields,
    encrypt_fields,
    find_spans,
    parse_document,
)

AEAD = AESGCM(bytes(range(32)))


def encrypt(doc: bytes, paths: list[str], key: bytes | None = b"k") -> tuple[bytes, Envelope]:
    parsed = parse_document(doc)
    spans = find_spans(parsed, paths)
    env = Envelope(MODE_FIELDS, "cards", "1", b"wrapped",
                   tuple(dict.fromkeys(p for _s, _e, p in spans)))
    return encrypt_fields(AEAD, env, key, parsed.text, spans), env


def test_fields_are_replaced_and_the_rest_is_untouched() -> None:
    doc = (b'{ "card" : "4111 1111 1111 1111",\n  "name": "Ann", '
           b'"iban": {"cc": "DE89370400440532013000", "n": 1} }')
    stored, env = encrypt(doc, ["card", "iban", "missing"])
    assert env.fields == ("card", "iban")
    parsed = json.loads(stored)
    assert parsed["name"] == "Ann"
    assert parsed["card"].startswith(FIELD_PREFIX) and parsed["iban"].startswith(FIELD_PREFIX)
    # Whole plaintext values, not short ones: two letters can occur in random base64.
    assert b"4111 1111" not in stored and b"DE8937" not in stored and b'"cc"' not in stored
    assert stored.startswith(b'{ "card" : "sluice:enc:1:') and b',\n  "name": "Ann", ' in stored
    assert decrypt_fields(AEAD, env, b"k", stored) == doc


def test_nested_paths_and_duplicates() -> None:
    doc = b'{"a": {"b": "x", "c": 2}, "a": {"b": "y"}, "b": "top"}'
    stored, env = encrypt(doc, ["a.b"])
    parsed_pairs = json.loads(stored, object_pairs_hook=list)
    assert parsed_pairs[2] == ("b", "top")
    assert b'"x"' not in stored and b'"y"' not in stored
    assert decrypt_fields(AEAD, env, b"k", stored) == doc


def test_a_field_inside_an_encrypted_field_is_sealed_once() -> None:
    doc = b'{"a": {"b": 1}}'
    stored, env = encrypt(doc, ["a.b", "a"])
    assert env.fields == ("a",)
    assert decrypt_fields(AEAD, env, b"k", stored) == doc


@pytest.mark.parametrize("value", [b"not json", b"[1, 2]", b'"text"', b'{"a": 1} x',
                                   b'{"a": }', b"\xff\xfe{}", b"", b'{"a" 1}'])
def test_values_that_are_not_one_json_object_are_refused(value: bytes) -> None:
    with pytest.raises(NotJsonObject):
        parse_document(value)


def test_tampering_is_detected() -> None:
    doc = b'{"card": "4111", "n": 1}'
    stored, env = encrypt(doc, ["card"])
    with pytest.raises(EnvelopeError):  # the ciphertext moved to another record key
        decrypt_fields(AEAD, env, b"other", stored)
    renamed = stored.replace(b'"card"', b'"kard"')
    with pytest.raises(EnvelopeError, match="missing"):
        decrypt_fields(AEAD, env, b"k", renamed)
    replaced = json.dumps({"card": "4111", "n": 1}).encode()
    with pytest.raises(EnvelopeError, match="does not hold a ciphertext"):
        decrypt_fields(AEAD, env, b"k", replaced)
    swapped = Envelope(MODE_FIELDS, "cards", "1", b"wrapped", ("n",))
    stored_n, _ = encrypt(b'{"card": 5, "n": 1}', ["n"])
    moved = stored_n.replace(b'"n"', b'"card"').replace(b'"card": 5, ', b'"n": 5, ')
    with pytest.raises(EnvelopeError):  # a ciphertext moved to another field path
        decrypt_fields(AEAD, Envelope(MODE_FIELDS, "cards", "1", b"wrapped", ("card",)), b"k",
                       moved)
    assert decrypt_fields(AEAD, swapped, b"k", stored_n) == b'{"card": 5, "n": 1}'


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner,
                                                                max_size=3),
    max_leaves=10)
NAMES = ["card", "iban", "x"]


@settings(max_examples=300, deadline=None)
@given(doc=st.dictionaries(st.sampled_from([*NAMES, "other", "é"]), json_values, max_size=5),
       paths=st.lists(st.sampled_from(["card", "iban", "x.card", "other.x"]), min_size=1,
                      max_size=3),
       indent=st.sampled_from([None, 0, 2]), ascii_only=st.booleans(),
       key=st.none() | st.binary(max_size=8))
def test_round_trip_is_byte_exact(doc: dict[str, Any], paths: list[str], indent: int | None,
                                  ascii_only: bool, key: bytes | None) -> None:
    raw = json.dumps(doc, indent=indent, ensure_ascii=ascii_only).encode()
    stored, env = encrypt(raw, paths, key)
    parsed = json.loads(stored)  # still one valid JSON object
    for name, value in doc.items():
        if name in env.fields:
            assert isinstance(parsed[name], str) and parsed[name].startswith(FIELD_PREFIX)
        elif name not in {p.split(".")[0] for p in env.fields}:
            assert parsed[name] == value
    assert decrypt_fields(AEAD, env, key, stored) == raw
