"""crypto/batch_seal.c's own AES-256-GCM (AES-NI and PCLMULQDQ, the GHASH state after each
call's associated-data prefix kept) against `cryptography`'s AESGCM (OpenSSL) and against
the module's EVP path: the same ciphertexts and tags for every split of the associated data
into prefix and rest, what it sealed opens, tampering refused."""

from __future__ import annotations

import base64
import platform
from collections.abc import Iterator
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sluice.codec.records import Record, decode_section, encode_records
from sluice.crypto import batch_seal
from sluice.crypto.envelope import NONCE_SIZE, aad_for, record_digest

pytestmark = pytest.mark.skipif(not batch_seal.AVAILABLE,
                                reason="native batch sealer not built (scripts/dev.sh install)")


def _cpu_flags() -> set[str]:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return set()
    for line in text.splitlines():
        if line.startswith("flags"):
            return set(line.split(":", 1)[1].split())
    return set()


def test_aes_gcm_runs_in_the_modules_own_code_on_aes_ni_cpus() -> None:
    """On x86-64 with AES-NI and PCLMULQDQ the known-answer check against EVP passes and the
    native calls run AES-GCM themselves (the property tests below hold the bytes)."""
    flags = _cpu_flags()
    expected = (platform.machine() in ("x86_64", "AMD64")
                and {"aes", "pclmulqdq", "ssse3", "sse4_1"} <= flags)
    assert batch_seal.own_gcm() is expected


@pytest.fixture(params=["own", "evp"])
def implementation(request: pytest.FixtureRequest) -> Iterator[str]:
    before = batch_seal.allow_own_gcm(request.param == "own")
    try:
        if request.param == "evp":
            assert not batch_seal.own_gcm()
        yield request.param
    finally:
        batch_seal.allow_own_gcm(before)


_headers = st.lists(st.tuples(st.text(max_size=6), st.none() | st.binary(max_size=40)),
                    max_size=3)
_shape = st.tuples(st.none() | st.binary(max_size=40), st.none() | st.binary(max_size=400),
                   _headers)


@settings(max_examples=120, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(key=st.binary(min_size=32, max_size=32),
       prefix=st.binary(max_size=200),
       shapes=st.lists(_shape, min_size=1, max_size=12),
       seed=st.binary(min_size=12, max_size=12))
def test_sealed_values_are_aesgcm_of_prefix_and_record_part(
        implementation: str, key: bytes, prefix: bytes, shapes: list[tuple[bytes | None,
                                                                           bytes | None,
                                                                           list]],
        seed: bytes) -> None:
    """Each sealed value is `0x01 | nonce | AESGCM(key).encrypt(nonce, value, prefix +
    record part)` for any prefix length (whole blocks or not, empty) and value length, and
    opening gives the section back; a flipped bit anywhere in a ciphertext or tag, or
    another prefix, is refused."""
    records = [Record(i, i, k, v, list(h), 0) for i, (k, v, h) in enumerate(shapes)]
    section = bytes(encode_records(records))
    values = sum(1 for r in records if r.value is not None)
    nonces = b"".join(bytes(b ^ i for b in seed[:8]) + i.to_bytes(4, "big")
                      for i in range(values))
    group = batch_seal.encode_headers([("sluice.enc", b"\x03group")])
    sealed, _fates, n = batch_seal.seal_section(section, len(records), key, nonces, prefix,
                                                group=group, group_count=1)
    sealed = bytes(sealed)
    assert n == values
    aead = AESGCM(key)
    stored = decode_section(sealed, len(records))
    used = 0
    for rec, out in zip(records, stored, strict=True):
        if rec.value is None:
            assert out.value is None
            continue
        nonce = nonces[used * NONCE_SIZE:(used + 1) * NONCE_SIZE]
        used += 1
        aad = aad_for(prefix, rec.key, "", record_digest(rec.headers))
        assert out.value == b"\x01" + nonce + aead.encrypt(nonce, rec.value, aad)
    opened, _ = batch_seal.open_section(sealed, len(records), key, prefix, group, 1)
    assert bytes(opened) == section
    if values:
        with pytest.raises(batch_seal.Tampered):
            batch_seal.open_section(sealed, len(records), key, prefix + b"x", group, 1)
        first = next(i for i, r in enumerate(stored) if r.value is not None)
        value = stored[first].value or b""
        for at in (1 + NONCE_SIZE, len(value) // 2 + 7, len(value) - 1):
            at = min(at, len(value) - 1)
            edited = list(stored)
            edited[first] = Record(edited[first].offset_delta, edited[first].timestamp_delta,
                                   edited[first].key,
                                   value[:at] + bytes([value[at] ^ 0x10]) + value[at + 1:],
                                   edited[first].headers, 0)
            with pytest.raises(batch_seal.Tampered):
                batch_seal.open_section(bytes(encode_records(edited)), len(records), key,
                                        prefix, group, 1)


def test_the_two_implementations_write_the_same_section() -> None:
    """The module's own AES-GCM and its EVP path seal a batch to the same bytes, and each
    opens what the other sealed."""
    records = [Record(i, i, b"key-%d" % i, bytes(range(i % 7, 200 + i)), [("t", b"%d" % i)], 0)
               for i in range(50)]
    section = bytes(encode_records(records))
    key, prefix = bytes(range(1, 33)), bytes(range(144))
    nonces = b"".join(i.to_bytes(12, "big") for i in range(50))
    group = batch_seal.encode_headers([("sluice.enc", b"\x03g")])
    before = batch_seal.allow_own_gcm(True)
    try:
        own = bytes(batch_seal.seal_section(section, 50, key, nonces, prefix, group=group,
                                            group_count=1)[0])
        batch_seal.allow_own_gcm(False)
        evp = bytes(batch_seal.seal_section(section, 50, key, nonces, prefix, group=group,
                                            group_count=1)[0])
        assert own == evp
        assert bytes(batch_seal.open_section(own, 50, key, prefix, group, 1)[0]) == section
        batch_seal.allow_own_gcm(True)
        assert bytes(batch_seal.open_section(evp, 50, key, prefix, group, 1)[0]) == section
    finally:
        batch_seal.allow_own_gcm(before)


def _thread_buffers() -> bytes:
    """Every buffer the native calls of this thread write into and keep (batch_seal._space)."""
    return b"".join(bytes(getattr(batch_seal._local, slot, b"") or b"")
                    for slot in ("out", "out2", "scratch"))


_SECRETS = [b"SECRET-%d-" % i + bytes([65 + i]) * (37 + 50 * i) for i in range(4)]


def test_a_refused_batch_leaves_no_plaintext_in_the_output_buffer(implementation: str) -> None:
    """Records 0 and 1 open, record 2's tag is wrong (its ciphertext intact, so it decrypts
    to the real plaintext before the tag is checked): the call declines (`Tampered`) and
    neither the refused record's plaintext nor that of the records opened before it stays
    in the thread's kept buffers, which later calls lend out."""
    records = [Record(i, i, b"k%d" % i, v, [], 0) for i, v in enumerate(_SECRETS)]
    section = bytes(encode_records(records))
    key, prefix = bytes(range(7, 39)), bytes(range(150))
    nonces = bytes(range(12 * len(records)))
    group = batch_seal.encode_headers([("sluice.enc", b"\x03g")])
    sealed = bytes(batch_seal.seal_section(section, len(records), key, nonces, prefix,
                                           group=group, group_count=1)[0])
    stored = decode_section(sealed, len(records))
    value = stored[2].value or b""
    stored[2] = Record(stored[2].offset_delta, stored[2].timestamp_delta, stored[2].key,
                       value[:-1] + bytes([value[-1] ^ 1]), stored[2].headers, 0)
    with pytest.raises(batch_seal.Tampered) as refused:
        batch_seal.open_section(bytes(encode_records(stored)), len(records), key, prefix,
                                group, 1)
    assert refused.value.index == 2
    kept = _thread_buffers()
    for secret in _SECRETS[:3]:
        assert secret not in kept


def test_a_refused_fields_batch_leaves_no_plaintext_behind(implementation: str) -> None:
    """Fields mode: the opened values are built in the scratch buffer, then copied out; a
    record whose field fails authentication leaves neither its field nor the fields of
    the records opened before it in either buffer."""
    docs = [b'{"card":"%s","n":%d}' % (s, i) for i, s in enumerate(_SECRETS)]
    records = [Record(i, i, None, d, [], 0) for i, d in enumerate(docs)]
    section = bytes(encode_records(records))
    key, prefix = bytes(range(3, 35)), bytes(range(90))
    ours = [("sluice.enc", b"\x03g")]
    packed = batch_seal.pack_paths(["card"])
    nonces = bytes(range(12 * len(records)))
    sealed, _fates, n, fields = batch_seal.seal_fields(section, len(records), key, nonces,
                                                       prefix, packed, 1, ours, 100)
    assert (n, fields) == (len(records), len(records))
    stored = decode_section(bytes(sealed), len(records))
    value = stored[2].value or b""
    start = value.index(b"sluice:enc:1:") + 13
    end = value.index(b'"', start)
    raw = base64.urlsafe_b64decode(value[start:end] + b"=" * (-(end - start) % 4))
    forged = base64.urlsafe_b64encode(raw[:-1] + bytes([raw[-1] ^ 1])).rstrip(b"=")
    stored[2] = Record(stored[2].offset_delta, stored[2].timestamp_delta, None,
                       value[:start] + forged + value[end:], stored[2].headers, 0)
    group3 = batch_seal.encode_headers(ours)
    with pytest.raises(batch_seal.Tampered):
        batch_seal.open_fields(bytes(encode_records(stored)), len(records), key, prefix,
                               group3, len(ours))
    kept = _thread_buffers()
    for secret in _SECRETS[:3]:
        assert secret not in kept
