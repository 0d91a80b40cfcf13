"""crypto/batch_seal.c's whole-value sealer and opener against `cryptography`'s AESGCM as the
oracle, with each of the module's two GCM implementations (its own AES-NI code and OpenSSL's
EVP): random keys, nonces, AAD prefixes of any length (none a multiple of 16 by design) and
batches mixing records with a null or an empty key, with and without headers, and values whose
lengths cross 1, 16, 64 and 128 blocks. Records without key or headers of their own are sealed
and opened from one GHASH state of the call's shared associated data (`gcm_shared_aad`): every
message must still be exactly AESGCM's over aad_for(prefix, key, "", record_digest(headers)),
and any record whose associated data differs (an empty key, one header) must never take it."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sluice.codec.records import Record, decode_section, encode_records
from sluice.crypto import batch_seal
from sluice.crypto.envelope import Header, aad_for, record_digest

pytestmark = pytest.mark.skipif(not batch_seal.AVAILABLE,
                                reason="native batch sealer not built (scripts/dev.sh install)")

OURS: list[Header] = [("sluice.enc", b"3;value;enc")]
#: value lengths at the edges of one block and of og_message's and og_ctr's runs
_EDGES = (0, 1, 15, 16, 17, 127, 128, 129, 255, 256, 257, 1023, 1024, 1025, 2047, 2048, 2049)
_value = st.one_of(st.binary(max_size=40),
                   st.sampled_from(_EDGES).flatmap(lambda n: st.binary(min_size=n, max_size=n)))
_names = st.sampled_from(["h", "", "trace-id", "sluice.encX"])
_header = st.tuples(_names, st.none() | st.binary(max_size=20))
_record = st.tuples(st.sampled_from([None, b""]) | st.binary(min_size=1, max_size=20),
                    st.none() | _value, st.lists(_header, max_size=2))


@pytest.fixture(params=[True, False], ids=["own-gcm", "evp"])
def gcm(request: pytest.FixtureRequest) -> Iterator[bool]:
    """Runs the test with the module's own GCM allowed (skipped where its check fails or
    the CPU lacks AES-NI) and with EVP alone."""
    before = batch_seal.allow_own_gcm(request.param)
    try:
        if request.param and not batch_seal.own_gcm():
            pytest.skip("the module's own AES-GCM is not in use on this machine")
        assert batch_seal.own_gcm() is request.param
        yield request.param
    finally:
        batch_seal.allow_own_gcm(before)


def _oracle_value(key: bytes, prefix: bytes, nonce: bytes, rec: Record) -> bytes:
    """The stored value of `rec` sealed under `nonce` (layout 3, crypto/envelope.py)."""
    aad = aad_for(prefix, rec.key, "", record_digest(rec.headers))
    return b"\x01" + nonce + AESGCM(key).encrypt(nonce, bytes(rec.value or b""), aad)


def _oracle_sealed(key: bytes, prefix: bytes, nonces: bytes,
                   records: list[Record]) -> list[Record]:
    out, used = [], 0
    for rec in records:
        if rec.value is None:  # a tombstone stays as it is
            out.append(rec)
            continue
        nonce = nonces[12 * used:12 * used + 12]
        used += 1
        out.append(Record(rec.offset_delta, rec.timestamp_delta, rec.key,
                          _oracle_value(key, prefix, nonce, rec), [*rec.headers, *OURS],
                          rec.attributes))
    return out


def _check_batch(key: bytes, prefix: bytes, nonces: bytes, records: list[Record]) -> None:
    section = bytes(encode_records(records))
    count = len(records)
    want = bytes(encode_records(_oracle_sealed(key, prefix, nonces, records)))
    # sealing: AESGCM's bytes, record for record
    sealed, fates, n = batch_seal.seal_section(section, count, key, nonces, prefix, OURS)
    assert bytes(sealed) == want
    assert fates == bytes(int(r.value is not None) for r in records)
    assert n == sum(r.value is not None for r in records)
    # opening what AESGCM sealed gives back the section
    group = batch_seal.encode_headers(OURS)
    opened, fates = batch_seal.open_section(want, count, key, prefix, group, len(OURS))
    assert bytes(opened) == section
    # any one bit of a sealed value (nonce, ciphertext or tag) edited: refused, that record
    stored = decode_section(want, count)
    for i, rec in enumerate(stored):
        if rec.value is None:
            continue
        value = bytearray(rec.value)
        at = 1 + (i * 7919) % (len(value) - 1)
        value[at] ^= 1 << (i % 8)
        edited = [*stored[:i], Record(rec.offset_delta, rec.timestamp_delta, rec.key,
                                      bytes(value), rec.headers, rec.attributes), *stored[i + 1:]]
        edited_section = bytes(encode_records(edited))
        with pytest.raises(batch_seal.Tampered) as err:
            batch_seal.open_section(edited_section, count, key, prefix, group, len(OURS))
        assert err.value.index == i
        # nothing opened is left in the thread's output buffer: neither the records before
        # it nor what the refused one decrypted to (the call wipes all it may have written)
        out = batch_seal._local.out
        assert bytes(out[:len(edited_section)]) == bytes(len(edited_section))


@settings(max_examples=120, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(key=st.binary(min_size=32, max_size=32), prefix=st.binary(max_size=300),
       shapes=st.lists(_record, min_size=1, max_size=12), salt=st.binary(min_size=12,
                                                                          max_size=12))
def test_sealed_and_opened_messages_are_aesgcms(gcm: bool, key: bytes, prefix: bytes,
                                                shapes: list[tuple[bytes | None, bytes | None,
                                                                   list[Header]]],
                                                salt: bytes) -> None:
    records = [Record(i, i, k, v, list(h), 0) for i, (k, v, h) in enumerate(shapes)]
    # distinct nonces, from a random start
    base = int.from_bytes(salt, "big")
    nonces = b"".join(((base + i) % (1 << 96)).to_bytes(12, "big") for i in range(len(records)))
    _check_batch(key, prefix, nonces, records)


@pytest.mark.parametrize("prefix_len", [0, 1, 15, 16, 17, 83, 144, 211])
def test_only_a_null_key_and_no_headers_share_the_calls_associated_data(gcm: bool,
                                                                       prefix_len: int) -> None:
    """One value under one nonce (tests only: a repeated nonce) for each kind of record whose
    associated data is next to the shared one: a null key and no headers, an empty key, a
    header with an empty name and a null value, both. Each tag is AESGCM's over the record's
    own AAD, so the four differ; and the same records under another prefix (another topic,
    filter, key version) give four other tags."""
    key = bytes(range(32))
    nonce = bytes(12)
    kinds = [(None, []), (b"", []), (None, [("", None)]), (b"", [("", None)])]
    tags: set[bytes] = set()
    for prefix in (bytes(range(prefix_len)), bytes(range(1, prefix_len + 1)) + b"x"):
        records = [Record(i, i, k, b"same value" * 5, list(h), 0)
                   for i, (k, h) in enumerate(kinds)]
        _check_batch(key, prefix, nonce * len(records), records)
        sealed, _, _ = batch_seal.seal_section(bytes(encode_records(records)), len(records),
                                               key, nonce * len(records), prefix, OURS)
        tags.update(bytes(r.value or b"")[-16:]
                    for r in decode_section(bytes(sealed), len(records)))
    assert len(tags) == 2 * len(kinds)
