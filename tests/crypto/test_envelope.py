"""The stored layout (crypto/envelope.py): round trips, authentication of every part, header
parsing, and a golden record that every later version must still read."""

from __future__ import annotations

import pytest
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from hypothesis import given, settings
from hypothesis import strategies as st

from sluice.crypto.envelope import (
    H_DEK,
    H_ENC,
    H_KEY,
    MODE_VALUE,
    Envelope,
    EnvelopeError,
    aad_prefix,
    find_envelope,
    headers_for,
    open_value,
    prefix_for,
    record_digest,
    seal_value,
)

DEK = bytes(range(32))
AEAD = AESGCM(DEK)
ENV = Envelope(MODE_VALUE, "payments", "3", b"wrapped-dek-bytes")
PREFIX = aad_prefix(MODE_VALUE, ENV.key_name, ENV.key_version, ENV.wrapped_dek)

# A record as layout 1 stores it, sealed once with DEK and a fixed nonce (00..0b). If this
# test fails, records already stored by a released version would become unreadable.
GOLDEN_HEADERS = [("trace", b"t-1"), ("sluice.enc", b"1;value"),
                  ("sluice.enc.key", b"payments;3"), ("sluice.enc.dek", b"wrapped-dek-bytes")]
GOLDEN_KEY = b"order-17"
GOLDEN_VALUE = bytes.fromhex(
    "01" "000102030405060708090a0b"
    "3c20b776aa90ac6faf7bb7ba83c74d10" "ca3343c87710212023b84cb4089257fa")


def test_golden_record_reads() -> None:
    env = find_envelope(GOLDEN_HEADERS)
    assert env == Envelope(MODE_VALUE, "payments", "3", b"wrapped-dek-bytes", (), 1)
    assert open_value(AEAD, env, GOLDEN_KEY, GOLDEN_VALUE) == b'{"amount": 12.5}'


# The same value as layout 2 stores it (filter enc-payments, topic payments.eu), sealed with
# DEK and the nonce 00..0b: what every later version must still read.
GOLDEN2_HEADERS = [("trace", b"t-1"), ("sluice.enc", b"2;value;enc-payments"),
                   ("sluice.enc.key", b"payments;3-0a1b2c3d"),
                   ("sluice.enc.dek", b"wrapped-dek-bytes")]
GOLDEN2_VALUE = bytes.fromhex(
    "01" "000102030405060708090a0b"
    "3c20b776aa90ac6faf7bb7ba83c74d10" "7700e6f8213c678abc5fb762ac82608f")


def test_golden_layout_2_record_reads_and_is_bound() -> None:
    env = find_envelope(GOLDEN2_HEADERS)
    assert env == Envelope(MODE_VALUE, "payments", "3-0a1b2c3d", b"wrapped-dek-bytes", (), 1,
                           2, "enc-payments")
    own = GOLDEN2_HEADERS[:1]
    prefix = prefix_for(env, "payments.eu")
    assert open_value(AEAD, env, GOLDEN_KEY, GOLDEN2_VALUE, prefix, record_digest(own)) == (
        b'{"amount": 12.5}')
    assert headers_for(env) == GOLDEN2_HEADERS[1:]
    for topic, headers in (("payments.us", own), ("payments.eu", [("trace", b"t-2")]),
                           ("payments.eu", [])):
        with pytest.raises(EnvelopeError):
            open_value(AEAD, env, GOLDEN_KEY, GOLDEN2_VALUE, prefix_for(env, topic),
                       record_digest(headers))


@settings(max_examples=200)
@given(value=st.binary(max_size=2000), key=st.none() | st.binary(max_size=50))
def test_value_round_trip(value: bytes, key: bytes | None) -> None:
    stored = seal_value(AEAD, PREFIX, key, value)
    assert len(stored) == 1 + 12 + len(value) + 16
    if len(value) >= 8:
        assert value not in stored
    assert open_value(AEAD, ENV, key, stored) == value


@settings(max_examples=200)
@given(value=st.binary(min_size=1, max_size=300), data=st.data())
def test_any_flipped_byte_fails_authentication(value: bytes, data: st.DataObject) -> None:
    stored = bytearray(seal_value(AEAD, PREFIX, b"k", value))
    i = data.draw(st.integers(0, len(stored) - 1))
    stored[i] ^= data.draw(st.integers(1, 255))
    with pytest.raises(EnvelopeError):
        open_value(AEAD, ENV, b"k", bytes(stored))


@pytest.mark.parametrize("change", ["record key", "null key", "key name", "key version", "dek"])
def test_ciphertext_is_bound_to_its_place(change: str) -> None:
    stored = seal_value(AEAD, PREFIX, b"k", b"secret value")
    env, key = ENV, b"k"
    if change == "record key":
        key = b"other"
    elif change == "null key":
        key = None
    elif change == "key name":
        env = Envelope(MODE_VALUE, "payroll", "3", ENV.wrapped_dek)
    elif change == "key version":
        env = Envelope(MODE_VALUE, "payments", "4", ENV.wrapped_dek)
    else:
        env = Envelope(MODE_VALUE, "payments", "3", b"wrapped-dek-bytez")
    with pytest.raises(EnvelopeError):
        open_value(AEAD, env, key, stored)


def test_wrong_data_key_fails() -> None:
    stored = seal_value(AEAD, PREFIX, None, b"x" * 40)
    with pytest.raises(EnvelopeError):
        open_value(AESGCM(bytes(32)), ENV, None, stored)


@settings(max_examples=100)
@given(own=st.lists(st.tuples(st.text(max_size=20).filter(lambda n: not n.startswith("sluice")),
                              st.none() | st.binary(max_size=20)), max_size=5))
def test_headers_are_found_after_the_producers_own(own: list[tuple[str, bytes | None]]) -> None:
    headers = [*own, *headers_for(ENV)]
    found = find_envelope(headers)
    assert found is not None and found.start == len(own)
    assert (found.key_name, found.key_version, found.wrapped_dek) == ("payments", "3",
                                                                       b"wrapped-dek-bytes")
    assert find_envelope(own) is None


def test_fields_header_round_trip() -> None:
    env = Envelope("fields", "k", "1", b"w", ("card", "a.b"))
    assert find_envelope(headers_for(env)) == env


@pytest.mark.parametrize("headers", [
    [(H_ENC, b"2;value"), (H_KEY, b"k;1"), (H_DEK, b"w")],          # layout 2 without a filter
    [(H_ENC, b"3;value;f"), (H_KEY, b"k;1"), (H_DEK, b"w")],        # unknown layout version
    [(H_ENC, b"1;zip"), (H_KEY, b"k;1"), (H_DEK, b"w")],            # unknown mode
    [(H_ENC, b"1;value"), (H_KEY, b"k;1")],                         # a header missing
    [(H_ENC, b"1;value"), (H_DEK, b"w"), (H_KEY, b"k;1")],          # out of order
    [(H_ENC, b"1;value"), (H_KEY, b"k"), (H_DEK, b"w")],            # no version
    [(H_ENC, b"1;value"), (H_KEY, b"k;1"), (H_DEK, None)],          # null header value
    [(H_ENC, b"1;value"), (H_KEY, b"k;1"), (H_DEK, b"w"), ("x", b"")],  # a header after ours
    [(H_ENC, b"1;fields"), (H_KEY, b"k;1"), (H_DEK, b"w"), ("sluice.enc.fields", b"{")],
])
def test_malformed_headers_are_refused(headers: list[tuple[str, bytes | None]]) -> None:
    with pytest.raises(EnvelopeError):
        find_envelope(headers)


def test_stored_value_without_marker_is_refused() -> None:
    stored = seal_value(AEAD, PREFIX, None, b"abc")
    with pytest.raises(EnvelopeError, match="marker"):
        open_value(AEAD, ENV, None, b"\x02" + stored[1:])
    with pytest.raises(EnvelopeError, match="too short"):
        open_value(AEAD, ENV, None, b"\x01" + b"\x00" * 20)
