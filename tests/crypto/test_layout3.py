"""Layout 3 (crypto/envelope.py): one binary ``sluice.enc`` header instead of layout 2's
three. A golden layout-3 record; layout-2 records (and layout 1, tests/crypto/test_envelope.py)
still read, through the native and the reference path; malformed layout-3 groups refused as
tampering; and the bytes a sealed record takes over the produced one."""

from __future__ import annotations

from pathlib import Path

import pytest
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from sluice.crypto import batch_seal
from sluice.crypto.envelope import (
    H_ENC,
    H_FIELDS,
    MODE_FIELDS,
    MODE_VALUE,
    TEXT_LAYOUT,
    Envelope,
    EnvelopeError,
    find_envelope,
    headers_for,
    open_value,
    prefix_for,
    record_digest,
    seal_value,
)
from sluice.crypto.json_fields import encrypt_fields, find_spans, parse_document
from sluice.crypto.kms import KmsSettings
from sluice.crypto.kms_local import LocalKeyring
from sluice.crypto.record_filter import EncryptRunner
from sluice.filters.chain import FilterChain
from sluice.filters.config import FilterSpec
from sluice.filters.context import RecordContext
from sluice.filters.pipeline import filter_fetch, filter_produce
from tests.crypto.test_design_review import batch, records_of

DEK = bytes(range(32))
AEAD = AESGCM(DEK)
TOPIC = "payments.eu"
OWN = [("trace", b"t-1")]

# A record as layout 3 stores it (filter enc-payments, topic payments.eu, KEK payments
# version 3-0a1b2c3d), sealed with DEK and the nonce 00..0b: what every later version must
# still read.
GOLDEN3_HEADERS = [("trace", b"t-1"), ("sluice.enc", bytes.fromhex(
    "03" "01" "0c" "656e632d7061796d656e7473" "08" "7061796d656e7473" "0a" "332d3061316232633364"
    "777261707065642d64656b2d6279746573"))]
GOLDEN3_VALUE = bytes.fromhex(
    "01" "000102030405060708090a0b"
    "3c20b776aa90ac6faf7bb7ba83c74d10" "62e31389f02f64881f88557063022363")


def test_golden_layout_3_record_reads_and_is_bound() -> None:
    env = find_envelope(GOLDEN3_HEADERS)
    assert env == Envelope(MODE_VALUE, "payments", "3-0a1b2c3d", b"wrapped-dek-bytes", (), 1,
                           3, "enc-payments")
    prefix = prefix_for(env, TOPIC)
    assert open_value(AEAD, env, b"order-17", GOLDEN3_VALUE, prefix, record_digest(OWN)) == (
        b'{"amount": 12.5}')
    assert headers_for(env) == GOLDEN3_HEADERS[1:]
    for topic, headers in (("payments.us", OWN), (TOPIC, [("trace", b"t-2")]), (TOPIC, [])):
        with pytest.raises(EnvelopeError):
            open_value(AEAD, env, b"order-17", GOLDEN3_VALUE, prefix_for(env, topic),
                       record_digest(headers))
    # The same facts under layout 2's number do not open it: the layout is authenticated.
    as_two = Envelope(MODE_VALUE, "payments", "3-0a1b2c3d", b"wrapped-dek-bytes", (), 1, 2,
                      "enc-payments")
    with pytest.raises(EnvelopeError):
        open_value(AEAD, as_two, b"order-17", GOLDEN3_VALUE, prefix_for(as_two, TOPIC),
                   record_digest(OWN))


def test_fields_group_round_trip() -> None:
    env = Envelope(MODE_FIELDS, "k", "1-00000001", b"w" * 60, ("card", "a.b"), 0, 3, "f")
    headers = headers_for(env)
    assert [n for n, _v in headers] == [H_ENC, H_FIELDS]
    assert find_envelope(headers) == env


_GOOD = bytes.fromhex("0301") + b"\x01f\x01k\x011" + b"dek"


@pytest.mark.parametrize("headers", [
    [(H_ENC, _GOOD[:1])],                                        # no mode
    [(H_ENC, b"\x03\x07" + _GOOD[2:])],                          # unknown mode
    [(H_ENC, _GOOD[:-3])],                                       # no wrapped data key
    [(H_ENC, b"\x03\x01\x00\x01k\x011dek")],                     # empty filter name
    [(H_ENC, b"\x03\x01\x01f\x01k\x05" + b"1")],                 # a length past the end
    [(H_ENC, b"\x03\x01\x80\x80\x80\x80\x80\x01")],              # a varint that never ends
    [(H_ENC, b"\x03\x01\x01\xff\x01k\x011dek")],                 # not UTF-8
    [(H_ENC, _GOOD), ("x", b"")],                                # a header after ours
    [(H_ENC, b"\x03\x02" + _GOOD[2:])],                          # fields without its list
    [(H_ENC, b"\x03\x02" + _GOOD[2:]), (H_FIELDS, b"{")],        # a broken list
    [(H_ENC, _GOOD), (H_FIELDS, b'["a"]')],                      # value mode with a list
])
def test_malformed_layout_3_groups_are_refused(headers: list[tuple[str, bytes | None]]) -> None:
    with pytest.raises(EnvelopeError):
        find_envelope(headers)


def spec(kms: KmsSettings, **config: object) -> FilterSpec:
    return FilterSpec(name="enc", module="builtin:encrypt", topics=("payments.*",),
                      apply_to=frozenset({"produce", "fetch"}), kms=kms,
                      config={"key": "payments", "decrypt_for": ["User:r"], **config})


def layout_2_batch(kms: KmsSettings, mode: str) -> tuple[bytes, bytes]:
    """(a batch as layout 2 stores it, under a real keyring key of filter enc on TOPIC, the
    batch as produced)."""
    assert kms.path is not None
    dk = LocalKeyring(Path(kms.path)).generate_data_key("payments")
    aead = AESGCM(dk.plaintext)
    produced, stored = [], []
    for i in range(5):
        key, own = b"k%d" % i, [("trace", b"t%d" % i)]
        if mode == MODE_VALUE:
            value = b"secret value %d" % i
            env = Envelope(MODE_VALUE, "payments", dk.key_version, dk.wrapped, (), 0,
                           TEXT_LAYOUT, "enc")
            sealed = seal_value(aead, prefix_for(env, TOPIC), key, value, None,
                                record_digest(own))
        else:
            value = b'{"card": "4111-%04d", "n": %d}' % (i, i)
            doc = parse_document(value)
            spans = find_spans(doc, ("card",))
            env = Envelope(MODE_FIELDS, "payments", dk.key_version, dk.wrapped, ("card",), 0,
                           TEXT_LAYOUT, "enc")
            sealed = encrypt_fields(aead, env, key, doc.text, spans, topic=TOPIC, headers=own)
        produced.append((key, value, own))
        stored.append((key, sealed, [*own, *headers_for(env)]))
    return batch(stored), batch(produced)


@pytest.mark.parametrize("native", [True, False])
@pytest.mark.parametrize("mode", [MODE_VALUE, MODE_FIELDS])
def test_layout_2_records_stay_readable(tmp_path: Path, mode: str, native: bool) -> None:
    if native and not batch_seal.AVAILABLE:
        pytest.skip("native batch sealer not built")
    kms = KmsSettings("local", path=str(tmp_path / "keys.json"))
    extra = {"fields": ["card"]} if mode == MODE_FIELDS else {}
    chain = FilterChain.from_specs([spec(kms, **extra)])
    runner = chain.filters[0]._runner
    assert isinstance(runner, EncryptRunner)
    runner.use_native = native
    old, produced = layout_2_batch(kms, mode)
    assert b"sluice.enc.dek" in old
    out = filter_fetch(chain, RecordContext(TOPIC, 0, "fetch", principal="User:r"), old)
    assert out.error_code == 0
    assert [(r.key, r.value, r.headers) for r in records_of(bytes(out.records))] == [
        (r.key, r.value, r.headers) for r in records_of(produced)]
    # The native path opened it itself (no fallback to the per-record path).
    assert chain.filters[0].native_fallbacks == 0


@pytest.mark.parametrize("mode", [MODE_VALUE, MODE_FIELDS])
def test_sealed_records_take_one_header_and_fewer_bytes(tmp_path: Path, mode: str) -> None:
    """Layout 2 took 163 bytes more than the produced record in whole-value mode (filter
    `enc`, local KMS, no producer headers); layout 3 keeps one header of the proxy's, about 35
    bytes less."""
    kms = KmsSettings("local", path=str(tmp_path / "keys.json"))
    extra = {"fields": ["card"]} if mode == MODE_FIELDS else {}
    chain = FilterChain.from_specs([spec(kms, **extra)])
    values = [b'{"card": "4111-%04d", "mail": "a%d@example.com"}' % (i, i) for i in range(100)]
    produced = batch([(b"key-%d" % i, v, []) for i, v in enumerate(values)])
    stored = bytes(filter_produce(chain, RecordContext(TOPIC, 0, "produce"), produced).records)
    recs = records_of(stored)
    names = [n for n, _v in recs[0].headers]
    assert names == ([H_ENC] if mode == MODE_VALUE else [H_ENC, H_FIELDS])
    per_record = (len(stored) - len(produced)) / len(recs)
    # value: 29 in the value, the header's 11-byte name and its value (2 + filter + KEK
    # name and version + 60-byte wrapped key), a longer length or two: 130; fields: base64
    # and the fields list on top.
    assert per_record <= (130 if mode == MODE_VALUE else 190), per_record
