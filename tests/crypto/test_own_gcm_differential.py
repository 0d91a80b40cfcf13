"""builtin:encrypt's native AES-256-GCM (crypto/batch_seal.c: the module's own AES-NI and
PCLMULQDQ code where its known-answer check passed, else OpenSSL's EVP) against
`cryptography`'s AESGCM (OpenSSL) at the lengths the review of the own code asked for:
random keys and nonces, associated-data prefixes and values of 0..4 096 bytes, batches that
mix short and long values, both directions (what AESGCM sealed, the module opens)."""

from __future__ import annotations

import random
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sluice.codec.records import Record, decode_section, encode_records
from sluice.crypto import batch_seal
from sluice.crypto.envelope import NONCE_SIZE, aad_for, record_digest

pytestmark = pytest.mark.skipif(not batch_seal.AVAILABLE,
                                reason="native batch sealer not built (scripts/dev.sh install)")


@pytest.fixture(params=["own", "evp"])
def implementation(request: pytest.FixtureRequest) -> Iterator[str]:
    before = batch_seal.allow_own_gcm(request.param == "own")
    try:
        yield request.param
    finally:
        batch_seal.allow_own_gcm(before)


#: lengths: all of 0..4096, with the block edges and the 8- and 16-block run edges likelier
_edges = [n + d for n in (0, 16, 64, 112, 128, 256, 4096) for d in (-1, 0, 1) if 0 <= n + d <= 4096]
_length = st.one_of(st.integers(0, 4096), st.integers(0, 300), st.sampled_from(_edges))
_value = st.one_of(st.none(), _length.flatmap(lambda n: st.binary(min_size=n, max_size=n)))
_key = st.one_of(st.none(), st.binary(max_size=64))
_headers = st.lists(st.tuples(st.text(max_size=5), st.none() | st.binary(max_size=20)),
                    max_size=2)
_SETTINGS = settings(max_examples=150, deadline=None,
                     suppress_health_check=[HealthCheck.too_slow,
                                            HealthCheck.function_scoped_fixture,
                                            HealthCheck.data_too_large])
GROUP = batch_seal.encode_headers([("sluice.enc", b"\x03group")])


def _records(shapes: list[tuple[bytes | None, bytes | None, list]]) -> list[Record]:
    return [Record(i, i, k, v, list(h), 0) for i, (k, v, h) in enumerate(shapes)]


@_SETTINGS
@given(key=st.binary(min_size=32, max_size=32),
       prefix=_length.flatmap(lambda n: st.binary(min_size=n, max_size=n)),
       shapes=st.lists(st.tuples(_key, _value, _headers), min_size=1, max_size=8),
       rnd=st.randoms(use_true_random=False))
def test_sealed_batches_equal_aesgcm_and_open_again(
        implementation: str, key: bytes, prefix: bytes,
        shapes: list[tuple[bytes | None, bytes | None, list]], rnd: object) -> None:
    records = _records(shapes)
    section = bytes(encode_records(records))
    values = sum(1 for r in records if r.value is not None)
    nonces = rnd.randbytes(NONCE_SIZE * values)  # type: ignore[attr-defined]
    sealed, _fates, n = batch_seal.seal_section(section, len(records), key, nonces, prefix,
                                                group=GROUP, group_count=1)
    sealed = bytes(sealed)
    assert n == values
    aead = AESGCM(key)
    used = 0
    for rec, out in zip(records, decode_section(sealed, len(records)), strict=True):
        if rec.value is None:
            assert out.value is None
            continue
        nonce = nonces[used * NONCE_SIZE:(used + 1) * NONCE_SIZE]
        used += 1
        aad = aad_for(prefix, rec.key, "", record_digest(rec.headers))
        assert out.value == b"\x01" + nonce + aead.encrypt(nonce, rec.value, aad)
    assert bytes(batch_seal.open_section(sealed, len(records), key, prefix, GROUP, 1)[0]) \
        == section


@_SETTINGS
@given(key=st.binary(min_size=32, max_size=32),
       prefix=_length.flatmap(lambda n: st.binary(min_size=n, max_size=n)),
       shapes=st.lists(st.tuples(_key, _value, _headers), min_size=1, max_size=8),
       rnd=st.randoms(use_true_random=False), data=st.data())
def test_what_aesgcm_sealed_opens_and_any_flipped_bit_is_refused(
        implementation: str, key: bytes, prefix: bytes,
        shapes: list[tuple[bytes | None, bytes | None, list]], rnd: object,
        data: st.DataObject) -> None:
    """The stored records are built from AESGCM's output alone (not the module's sealer):
    the module opens them to the original section; one flipped bit in one record's nonce,
    ciphertext or tag makes the whole call decline, naming that record."""
    records = _records(shapes)
    section = bytes(encode_records(records))
    aead = AESGCM(key)
    stored = []
    for rec in records:
        value = rec.value
        if value is not None:
            nonce = rnd.randbytes(NONCE_SIZE)  # type: ignore[attr-defined]
            aad = aad_for(prefix, rec.key, "", record_digest(rec.headers))
            value = b"\x01" + nonce + aead.encrypt(nonce, value, aad)
            stored.append(Record(rec.offset_delta, rec.timestamp_delta, rec.key, value,
                                 [*rec.headers, *batch_seal.decode_headers(GROUP, 1)], 0))
        else:
            stored.append(rec)
    opened, fates = batch_seal.open_section(bytes(encode_records(stored)), len(records), key,
                                            prefix, GROUP, 1)
    assert bytes(opened) == section
    assert list(fates) == [int(r.value is not None) for r in records]
    sealed_at = [i for i, r in enumerate(records) if r.value is not None]
    if not sealed_at:
        return
    victim = data.draw(st.sampled_from(sealed_at))
    value = stored[victim].value or b""
    at = data.draw(st.integers(1, len(value) - 1))
    bit = data.draw(st.integers(0, 7))
    edited = list(stored)
    edited[victim] = Record(value=value[:at] + bytes([value[at] ^ (1 << bit)]) + value[at + 1:],
                            offset_delta=stored[victim].offset_delta,
                            timestamp_delta=stored[victim].timestamp_delta,
                            key=stored[victim].key, headers=stored[victim].headers,
                            attributes=0)
    with pytest.raises(batch_seal.Tampered) as refused:
        batch_seal.open_section(bytes(encode_records(edited)), len(records), key, prefix,
                                GROUP, 1)
    assert refused.value.index == victim


def test_threads_sealing_and_opening_at_once_each_get_their_own_keys(
        implementation: str) -> None:
    """Filter threads call the module in parallel (cffi releases the GIL): each thread's
    batches under its own key equal AESGCM's and open again, so no key schedule, H power or
    GHASH state is shared between calls on different threads."""
    def work(seed: int) -> int:
        rnd = random.Random(seed)
        key = rnd.randbytes(32)
        aead = AESGCM(key)
        checked = 0
        for _ in range(60):
            prefix = rnd.randbytes(rnd.choice([0, 17, 144, rnd.randrange(4097)]))
            values = [rnd.randbytes(rnd.choice([0, 5, 200, rnd.randrange(4097)]))
                      for _ in range(rnd.randrange(1, 6))]
            records = [Record(i, i, None, v, [], 0) for i, v in enumerate(values)]
            section = bytes(encode_records(records))
            nonces = rnd.randbytes(NONCE_SIZE * len(values))
            sealed = bytes(batch_seal.seal_section(section, len(records), key, nonces, prefix,
                                                   group=GROUP, group_count=1)[0])
            for i, out in enumerate(decode_section(sealed, len(records))):
                nonce = nonces[i * NONCE_SIZE:(i + 1) * NONCE_SIZE]
                aad = aad_for(prefix, None, "", record_digest([]))
                assert out.value == b"\x01" + nonce + aead.encrypt(nonce, values[i], aad)
            opened = batch_seal.open_section(sealed, len(records), key, prefix, GROUP, 1)[0]
            assert bytes(opened) == section
            checked += len(values)
        return checked

    with ThreadPoolExecutor(max_workers=4) as pool:
        assert all(n > 0 for n in pool.map(work, range(8)))
