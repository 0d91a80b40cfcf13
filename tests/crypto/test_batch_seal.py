"""The native batch sealer (crypto/batch_seal.py) against the per-record reference path of
``builtin:encrypt``: byte-identical output for the same nonces under hypothesis, opening what
either path sealed, tampering refused, and the produce/fetch pipeline taking the native path
(with the reserved-header screen) when the module is built."""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from sluice.codec.records import Record, encode_records
from sluice.crypto import batch_seal
from sluice.crypto.kms import KmsSettings
from sluice.crypto.kms_local import LocalKeyring
from sluice.crypto.record_filter import EncryptRunner
from sluice.filters.chain import FilterChain
from sluice.filters.config import FilterSpec
from sluice.filters.context import RecordContext
from sluice.filters.decisions import Action, Decision, PartitionError
from sluice.filters.pipeline import CORRUPT_MESSAGE, INVALID_RECORD, filter_fetch, filter_produce
from tests.crypto.test_record_filter import batch, records_of, values

pytestmark = pytest.mark.skipif(not batch_seal.AVAILABLE,
                                reason="native batch sealer not built (scripts/dev.sh install)")

TOPIC = "payments.eu"
PRODUCE = RecordContext(TOPIC, 0, "produce", principal="User:app")
FETCH = RecordContext(TOPIC, 0, "fetch", principal="User:billing-1")


def spec(kms: KmsSettings) -> FilterSpec:
    return FilterSpec(name="enc", module="builtin:encrypt", topics=("payments.*",),
                      apply_to=frozenset({"produce", "fetch"}),
                      config={"key": "payments", "decrypt_for": ["User:billing-*"]}, kms=kms)


def counting_nonces() -> Callable[[int], bytes]:
    """A deterministic nonce source: 12-byte big-endian counters (tests only)."""
    counter = itertools.count(1)

    def draw(n: int) -> bytes:
        return b"".join(next(counter).to_bytes(12, "big") for _ in range(n // 12))
    return draw


def applied(records: list[Record], decisions: list[Decision]) -> list[Record]:
    out = []
    for rec, d in zip(records, decisions, strict=True):
        assert d.action in (Action.KEEP, Action.REWRITE)
        if d.action is Action.KEEP:
            out.append(rec)
        else:
            out.append(Record(rec.offset_delta, rec.timestamp_delta, d.key, d.value,
                              list(d.headers or []), rec.attributes))
    return out


_names = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=12).filter(
    lambda n: not n.startswith("sluice.enc"))
_blob = st.binary(max_size=300)
_record = st.tuples(st.none() | _blob, st.none() | _blob,
                    st.lists(st.tuples(_names, st.none() | _blob), max_size=4))


@pytest.fixture(scope="module")
def runner(tmp_path_factory: pytest.TempPathFactory) -> EncryptRunner:
    path = tmp_path_factory.mktemp("kms") / "keys.json"
    return EncryptRunner(spec(KmsSettings("local", path=str(path))), "enc")


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(_record, min_size=1, max_size=20))
def test_native_and_reference_write_the_same_bytes(runner: EncryptRunner,
                                                   shapes: list[Any]) -> None:
    records = [Record(i, i, k, v, list(h), 0) for i, (k, v, h) in enumerate(shapes)]
    section = bytes(encode_records(records))
    runner.nonces = counting_nonces()
    decisions, counts = runner.run(PRODUCE, records, 0, 0)
    reference = bytes(encode_records(applied(records, decisions)))
    runner.nonces = counting_nonces()
    native = runner.run_native(PRODUCE, section, len(records), 0, 0)
    assert native is not None
    if native.records is None:  # nothing to seal: every value was null
        assert reference == section and not counts.get("encrypted")
    else:
        assert native.records == reference
    assert native.detector_counts == counts
    assert native.fates == bytes(int(d.action) for d in decisions)
    # Opening, both ways, gives back the produced section.
    sealed = native.records or section
    opened = runner.run_native(FETCH, sealed, len(records), 0, 0)
    assert opened is not None
    assert (opened.records or sealed) == section
    back, _ = runner.run(FETCH, records_of_section(sealed, len(records)), 0, 0)
    assert bytes(encode_records(applied(records_of_section(sealed, len(records)), back))
                 ) == section


def test_each_nonce_is_set_without_a_cipher_init_on_openssl_3() -> None:
    """OpenSSL 3's EVP_CipherInit_ex looks the IV length up by name on every message; the
    sealer hands each nonce to the GCM provider as its whole-IV parameter instead, once a
    known-answer check on the loaded libcrypto agreed with EVP_CipherInit_ex (the property
    tests of this file then hold what it writes to the reference's bytes)."""
    import ssl
    assert batch_seal.fast_iv() is (ssl.OPENSSL_VERSION_INFO[0] >= 3)


def test_the_value_sealer_never_reads_past_the_nonces_it_was_given() -> None:
    """Whole-value sealing takes 12 bytes of `nonces` per record with a value: given fewer
    (a caller's count gone wrong), it refuses instead of sealing the last records with
    whatever bytes follow in memory, which are no fresh nonce and may repeat."""
    records = [Record(i, i, b"k", b"value %d" % i, [], 0) for i in range(3)]
    section = bytes(encode_records(records))
    key, prefix = bytes(range(32)), b"prefix"
    nonces = counting_nonces()(12 * 3)
    sealed, fates, n = batch_seal.seal_section(section, 3, key, nonces, prefix)
    assert n == 3 and fates == b"\x01\x01\x01" and b"value" not in bytes(sealed)
    with pytest.raises(batch_seal.NativeSealError):
        batch_seal.seal_section(section, 3, key, nonces[:24], prefix)


def test_a_refused_section_is_not_left_exported_by_the_error() -> None:
    """Each native call gives the section's buffer back before its error leaves: the error's
    traceback keeps the call's frame, and a memoryview still exported from a kept frame, in a
    reference cycle, crashes CPython 3.11's collector (gh-77894). A view of a valid section
    with too few nonces, and one of a section that does not parse, fail every call."""
    records = [Record(i, i, b"k", b"value %d" % i, [], 0) for i in range(3)]
    good = bytes(encode_records(records))
    key, prefix = bytes(range(32)), b"prefix"
    nonces = counting_nonces()(12 * 3)
    calls: list[Callable[[memoryview], object]] = [
        lambda s: batch_seal.seal_section(s, 3, key, nonces[:24], prefix),
        lambda s: batch_seal.scan(s, 3),
        lambda s: batch_seal.first_group(s, 3),
        lambda s: batch_seal.open_section(s, 3, key, prefix, b"", 0),
        lambda s: batch_seal.plan_fields(s, 3, batch_seal.pack_paths(["a"]), 1, 8),
        lambda s: batch_seal.seal_fields(s, 3, key, nonces, prefix,
                                         batch_seal.pack_paths(["a"]), 1, [], 8),
        lambda s: batch_seal.open_fields(s, 3, key, prefix, b"", 0),
    ]
    for i, call in enumerate(calls):
        section = memoryview(bytearray(good if i == 0 else b"\x7f\x01\x02"))
        with pytest.raises(Exception) as caught:
            call(section)
        assert caught.value.__traceback__ is not None, i
        section.release()  # BufferError while the kept frame still exports it


def test_native_sealing_draws_each_batchs_nonces_from_openssl(runner: EncryptRunner) -> None:
    """Without an injected source the native sealer takes a batch's nonces from OpenSSL's
    CSPRNG in one call (`fresh_nonces`, RAND_bytes): 96 random bits per value, none repeated
    within a batch or across batches, and every record opens again."""
    first = batch_seal.fresh_nonces(12 * 64)
    assert len(first) == 12 * 64 and bytes(first) != bytes(batch_seal.fresh_nonces(12 * 64))
    saved, runner.nonces = runner.nonces, None
    try:
        records = [Record(i, i, None, b"same value", [], 0) for i in range(200)]
        section = bytes(encode_records(records))
        seen: set[bytes] = set()
        for _ in range(2):
            out = runner.run_native(PRODUCE, section, len(records), 0, 0)
            assert out is not None and out.records is not None
            sealed = records_of_section(bytes(out.records), len(records))
            # whole value: 0x01 | nonce (12) | ciphertext | tag
            seen.update(bytes(r.value or b"")[1:13] for r in sealed)
            opened = runner.run_native(FETCH, bytes(out.records), len(records), 0, 0)
            assert opened is not None and opened.records == section
        assert len(seen) == 2 * len(records)
    finally:
        runner.nonces = saved


def records_of_section(section: bytes, count: int) -> list[Record]:
    from sluice.codec.records import decode_section
    return decode_section(section, count)


def test_tampered_section_goes_to_the_reference_path(runner: EncryptRunner) -> None:
    records = [Record(i, i, b"k%d" % i, b"v" * 50, [("h", b"x")], 0) for i in range(5)]
    sealed = runner.run_native(PRODUCE, bytes(encode_records(records)), 5, 0, 0)
    assert sealed is not None and sealed.records is not None
    # Flip one byte of record 3's ciphertext: the native path declines, the reference names
    # the record's offset with CORRUPT_MESSAGE.
    recs = records_of_section(sealed.records, 5)
    value = bytearray(recs[3].value or b"")
    value[20] ^= 1
    recs[3] = Record(3, 3, recs[3].key, bytes(value), recs[3].headers, 0)
    broken = bytes(encode_records(recs))
    assert runner.run_native(FETCH, broken, 5, 100, 0) is None
    with pytest.raises(PartitionError) as err:
        runner.run(FETCH, recs, 100, 0)
    assert err.value.code == CORRUPT_MESSAGE and "offset 103" in err.value.message


@pytest.mark.parametrize("own", [True, False], ids=["own-gcm", "evp"])
def test_records_without_key_or_headers_open_and_refuse_tampering(runner: EncryptRunner,
                                                                   own: bool) -> None:
    """Records with neither a key nor headers of their own share one associated data, whose
    GHASH the opener takes once per call (crypto/batch_seal.c, `g0`): mixed with keyed and
    headered records they open to the produced section, and an edited ciphertext, nonce or
    tag among them is refused as anywhere else."""
    records = [Record(i, i, None if i % 3 else b"k%d" % i, b"v%d" % i * 40,
                      [] if i % 2 else [("h", b"x")], 0) for i in range(9)]
    section = bytes(encode_records(records))
    before = batch_seal.allow_own_gcm(own)
    try:
        sealed = runner.run_native(PRODUCE, section, 9, 0, 0)
        assert sealed is not None and sealed.records is not None
        opened = runner.run_native(FETCH, sealed.records, 9, 0, 0)
        assert opened is not None and opened.records == section
        assert opened.detector_counts == {"decrypted": 9}
        recs = records_of_section(sealed.records, 9)
        assert recs[5].key is None and not recs[5].headers[:-1]  # the shared-AAD kind
        for at in (3, 20, len(recs[5].value or b"") - 1):  # nonce, ciphertext, tag
            value = bytearray(recs[5].value or b"")
            value[at] ^= 1
            edited = [*recs[:5], Record(5, 5, None, bytes(value), recs[5].headers, 0), *recs[6:]]
            assert runner.run_native(FETCH, bytes(encode_records(edited)), 9, 0, 0) is None
    finally:
        batch_seal.allow_own_gcm(before)


def test_records_under_two_data_keys_go_to_the_reference_path(runner: EncryptRunner) -> None:
    one = runner.run_native(PRODUCE, bytes(encode_records(
        [Record(0, 0, b"a", b"x", [], 0)])), 1, 0, 0)
    runner.keys.forget()  # the next batch gets a fresh data key
    two = runner.run_native(PRODUCE, bytes(encode_records(
        [Record(0, 0, b"b", b"y", [], 0)])), 1, 0, 0)
    assert one is not None and two is not None and one.records and two.records
    mixed = one.records + two.records  # the two offset deltas are both 0: fine for the test
    assert runner.run_native(FETCH, mixed, 2, 0, 0) is None


def chain(tmp_path: Path) -> FilterChain:
    return FilterChain.from_specs([spec(KmsSettings("local", path=str(tmp_path / "k.json")))])


def test_pipeline_takes_the_native_path_both_ways(tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    c = chain(tmp_path)
    runner = c.filters[0]._runner
    assert isinstance(runner, EncryptRunner)

    def no_reference(*_args: Any) -> Any:
        raise AssertionError("the per-record path ran")
    monkeypatch.setattr(runner, "run", no_reference)
    assert c.native_for(TOPIC, "produce", "User:app") and c.native_for(TOPIC, "fetch")
    data = batch([*values(20), None])
    stored = filter_produce(c, PRODUCE, data)
    assert stored.error_code == 0 and stored.records is not None
    assert b"4111-0007" not in bytes(stored.records)
    back = filter_fetch(c, FETCH, stored.records)
    assert back.error_code == 0
    assert [(r.key, r.value, r.headers) for r in records_of(bytes(back.records))] == [
        (r.key, r.value, r.headers) for r in records_of(data)]
    assert c.filters[0].native_fallbacks == 0


def test_native_produce_screens_reserved_headers(tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    c = chain(tmp_path)
    monkeypatch.setattr(c, "screen_produce", lambda *_a: None)  # only the native screen runs
    from sluice.codec.records import BatchHeader, build_batch
    recs = [Record(0, 0, b"k", b"v", [], 0), Record(1, 1, b"k", b"v", [("sluice.enc.x", b"1")], 0)]
    header = BatchHeader(0, 0, 0, 2, 0, 0, 1, 1_700_000_000_000, 1_700_000_000_001, -1, -1, -1, 2)
    out = filter_produce(c, PRODUCE, build_batch(header, recs))
    assert out.error_code == INVALID_RECORD
    assert "record 1 carries the header 'sluice.enc.x'" in out.error_message


# ------------------------------------------------------------------ fields mode (produce)
FIELDS = ["card", "a.b", "a", "x.y.z"]
_key_names = st.sampled_from(["card", "a", "b", "x", "y", "z", "name", "kärt"])
_scalars = (st.none() | st.booleans() | st.integers() | st.text(max_size=8)
            | st.floats(allow_nan=False, allow_infinity=False))
_json = st.recursive(_scalars, lambda inner: st.lists(inner, max_size=3)
                     | st.dictionaries(_key_names, inner, max_size=4), max_leaves=12)
_docs = st.tuples(st.dictionaries(_key_names, _json, max_size=5),
                  st.sampled_from([(",", ":"), (", ", ": ")]), st.just(False),
                  st.sampled_from([None, 2]))


def _dumps(doc: Any) -> bytes:
    import json
    value, separators, ascii_only, indent = doc
    return json.dumps(value, separators=separators, ensure_ascii=ascii_only,
                      indent=indent).encode()


@pytest.fixture(scope="module")
def fields_runner(tmp_path_factory: pytest.TempPathFactory) -> EncryptRunner:
    path = tmp_path_factory.mktemp("kmsf") / "keys.json"
    s = spec(KmsSettings("local", path=str(path)))
    s = FilterSpec(name=s.name, module=s.module, topics=s.topics, apply_to=s.apply_to,
                   config={**s.config, "fields": FIELDS}, kms=s.kms)
    return EncryptRunner(s, "enc")


def _compare_fields(runner: EncryptRunner, records: list[Record]) -> Any:
    section = bytes(encode_records(records))
    runner.nonces = counting_nonces()
    decisions, counts = runner.run(PRODUCE, records, 0, 0)
    runner.nonces = counting_nonces()
    native = runner.run_native(PRODUCE, section, len(records), 0, 0)
    if native is None:
        return None
    reference = bytes(encode_records(applied(records, decisions)))
    assert (native.records or section) == reference
    assert native.detector_counts == counts
    assert native.fates == bytes(int(d.action) for d in decisions)
    return native


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(st.none() | st.binary(max_size=4), st.none() | _docs,
                          st.lists(st.tuples(_names, st.none() | _blob), max_size=2)),
                min_size=1, max_size=10))
def test_fields_native_and_reference_write_the_same_bytes(
        fields_runner: EncryptRunner, shapes: list[Any]) -> None:
    records = [Record(i, i, k, None if d is None else _dumps(d), list(h), 0)
               for i, (k, d, h) in enumerate(shapes)]
    native = _compare_fields(fields_runner, records)
    # Compact or indented JSON with member names written without escapes (ensure_ascii would
    # write "k\u00e4rt", which the native scanner leaves to the reference): always served.
    assert native is not None
    sealed = native.records
    if sealed is not None:
        stored = records_of_section(sealed, len(records))
        back, counts = fields_runner.run(FETCH, stored, 0, 0)
        section = bytes(encode_records(records))
        assert bytes(encode_records(applied(stored, back))) == section
        opened = fields_runner.run_native(FETCH, sealed, len(records), 0, 0)
        assert opened is not None and opened.records == section
        assert opened.detector_counts == counts


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.binary(max_size=40).map(lambda b: b'{"card":' + b) | st.binary(max_size=40)
                | st.text(max_size=30).map(lambda t: ('{"card": "' + t + '", "a": {"b": 1}}')
                                           .encode()), min_size=1, max_size=6))
def test_fields_native_declines_what_it_does_not_read_like_the_reference(
        fields_runner: EncryptRunner, values: list[bytes]) -> None:
    records = [Record(i, i, b"k", v, [], 0) for i, v in enumerate(values)]
    _compare_fields(fields_runner, records)  # equal bytes whenever the native path answers


# String bytes of every kind the scanner's 16- and 8-byte steps tell apart (plain, control,
# quote, backslash and escapes, multi-byte and broken UTF-8), in strings long enough for
# several steps, at every alignment.
_string_bytes = st.lists(st.sampled_from([b"a", b"7", b" ", b"~", b"\x7f", b"\x1f", b"\x00",
                                          b'"', b"\\", b'\\"', b"\\n", b"\\u00e9",
                                          "\u00e9".encode(), "\u20ac".encode(), b"\xc3",
                                          b"\xff", b"\x80"]), max_size=60).map(b"".join)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(st.integers(min_value=0, max_value=17), _string_bytes, _string_bytes),
                min_size=1, max_size=4))
def test_fields_native_reads_long_strings_like_the_reference(
        fields_runner: EncryptRunner, shapes: list[tuple[int, bytes, bytes]]) -> None:
    records = [Record(i, i, b"k", b'{"pad": "%s", "card": "%s", "note": "%s", "a": {"b": 1}}'
                      % (b"p" * pad, card, note), [], 0)
               for i, (pad, card, note) in enumerate(shapes)]
    native = _compare_fields(fields_runner, records)  # equal bytes whenever it answers
    if native is not None and native.records is not None:
        section = bytes(encode_records(records))
        opened = fields_runner.run_native(FETCH, bytes(native.records), len(records), 0, 0)
        assert opened is not None and opened.records == section


@pytest.mark.parametrize("doc", [
    b'{"card": NaN}', b'{"ca\\u0072d": 1}', b'{"card": 1} x', b'[1]', b'{"card": "\x01"}',
    b'{"card": ' + b"1" * 4400 + b"}", b'{"card":' + b"[" * 200 + b"]" * 200 + b"}",
    # UTF-8 is checked inside the strings as the one pass reads them: a bad sequence in a
    # sealed value, a clear one, a member name, or cut short by the closing quote.
    b'{"card": "\xff"}', b'{"n": "\xc0\xaf", "card": 1}', b'{"\xed\xa0\x80": 1, "card": 2}',
    b'{"card": 1, "n": "\xf4\x90\x80\x80"}', b'{"card": "\xe2\x82"}',
    # nesting over the limit inside an object on a path (walked by the path's own scan)
    b'{"x": {"y": {"z": 1, "w": ' + b"[" * 70 + b"]" * 70 + b"}}}",
])
def test_fields_native_leaves_odd_json_to_the_reference(fields_runner: EncryptRunner,
                                                        doc: bytes) -> None:
    records = [Record(0, 0, b"k", doc, [], 0)]
    assert fields_runner.run_native(PRODUCE, bytes(encode_records(records)), 1, 0, 0) is None


def test_fields_native_open_declines_tampering(fields_runner: EncryptRunner) -> None:
    records = [Record(i, i, b"k", b'{"card": "4111", "n": %d}' % i, [], 0) for i in range(3)]
    sealed = fields_runner.run_native(PRODUCE, bytes(encode_records(records)), 3, 0, 0)
    assert sealed is not None and sealed.records is not None
    stored = records_of_section(sealed.records, 3)
    # Edit a clear member of record 1 (authenticated through the record digest).
    value = (stored[1].value or b"").replace(b'"n": 1', b'"n": 7')
    stored[1] = Record(1, 1, stored[1].key, value, stored[1].headers, 0)
    assert fields_runner.run_native(FETCH, bytes(encode_records(stored)), 3, 50, 0) is None
    with pytest.raises(PartitionError) as err:
        fields_runner.run(FETCH, stored, 50, 0)
    assert err.value.code == CORRUPT_MESSAGE and "offset 51" in err.value.message


_B64URL = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
_edit = st.tuples(st.sampled_from(["replace", "delete", "insert", "cut"]),
                  # from the start, or from the end (the last group of the base64 text)
                  st.integers(min_value=0, max_value=80) | st.integers(min_value=-4,
                                                                       max_value=-1),
                  st.sampled_from([*_B64URL, "=", "+", "/", "!", " ", "\u00e9"]))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(_edit, min_size=1, max_size=3),
       st.sampled_from([b"4", b"41", b"4111", b"4111 1111", b"4111 1111 1111 0007"]))
# A character added after a text of 4n (4n+1 is never base64), the last character of a text
# of 4n+2 / 4n+3 changed (bits that make no byte), characters Python's decoder skips.
@example([("insert", -1, "A")], b"4111 1111")
@example([("replace", -2, "A")], b"4")
@example([("replace", -2, "B")], b"41")
@example([("insert", 10, "=")], b"4111")
@example([("insert", 10, "!")], b"4111")
def test_fields_native_open_agrees_with_the_reference_on_edited_ciphertexts(
        fields_runner: EncryptRunner, edits: list[tuple[str, int, str]], card: bytes) -> None:
    """The opener's base64url decoder and string scan against the reference's on stored
    ciphertext literals edited in the broker (characters replaced, removed, added, the end
    cut, in and out of the alphabet): the native path either declines (the reference then
    answers, a tampered record with CORRUPT_MESSAGE) or gives the reference's bytes, and it
    never opens what the reference refuses."""
    records = [Record(0, 0, b"k", b'{"card": "%s", "n": 1}' % card, [], 0)]
    sealed = fields_runner.run_native(PRODUCE, bytes(encode_records(records)), 1, 0, 0)
    assert sealed is not None and sealed.records is not None
    stored = records_of_section(sealed.records, 1)[0]
    value = (stored.value or b"").decode()
    start = value.index('"sluice:enc:1:') + len('"sluice:enc:1:')
    end = value.index('"', start)
    text = value[start:end]
    for op, at, char in edits:
        at = at % (len(text) + 1) if at >= 0 else max(0, len(text) + 1 + at)
        if op == "replace" and at < len(text):
            text = text[:at] + char + text[at + 1:]
        elif op == "delete" and at < len(text):
            text = text[:at] + text[at + 1:]
        elif op == "insert":
            text = text[:at] + char + text[at:]
        elif op == "cut":
            text = text[:at]
    edited = Record(0, 0, stored.key, (value[:start] + text + value[end:]).encode(),
                    stored.headers, 0)
    try:
        decisions, _ = fields_runner.run(FETCH, [edited], 0, 0)
        reference: bytes | None = bytes(encode_records(applied([edited], decisions)))
    except PartitionError as exc:
        assert exc.code == CORRUPT_MESSAGE
        reference = None
    native = fields_runner.run_native(FETCH, bytes(encode_records([edited])), 1, 0, 0)
    if native is not None:
        assert reference is not None and native.records == reference


def test_a_lent_section_read_by_a_second_sealer_is_not_overwritten(
        tmp_path_factory: pytest.TempPathFactory) -> None:
    """Under native_io.lending the sealer hands back a view of its per-thread output buffer;
    a second encrypt filter of the chain reads that view while it writes its own output, so
    it must write elsewhere: two filters nested under lending give the bytes they give with
    copies (the same nonces), and opening both layers gives the input back."""
    from sluice.filters.native_io import lending

    path = tmp_path_factory.mktemp("kms2") / "keys.json"
    kms = KmsSettings("local", path=str(path))
    first = EncryptRunner(spec(kms), "enc")
    second = EncryptRunner(FilterSpec(
        name="outer", module="builtin:encrypt", topics=("payments.*",),
        apply_to=frozenset({"produce", "fetch"}),
        config={"key": "outer", "decrypt_for": ["User:billing-*"]}, kms=kms), "outer")
    records = [Record(i, i, b"k%d" % i, b"value %d " % i * 20, [("h", b"x")], 0)
               for i in range(50)]
    section = bytes(encode_records(records))

    big = [Record(i, i, None, b"w" * 1000, [], 0) for i in range(200)]

    def both(lend: bool) -> tuple[bytes, bytes]:
        # A larger batch first: the thread's output buffer is then large enough for both
        # calls below, so only the alternation keeps them apart.
        assert first.run_native(PRODUCE, bytes(encode_records(big)), 200, 0, 0) is not None
        first.nonces, second.nonces = counting_nonces(), counting_nonces()
        with lending() if lend else contextlib.nullcontext():
            inner = first.run_native(PRODUCE, section, 50, 0, 0)
            assert inner is not None and inner.records is not None
            assert isinstance(inner.records, memoryview) == lend
            outer = second.run_native(PRODUCE, inner.records, 50, 0, 0)
            assert outer is not None and outer.records is not None
            return bytes(inner.records), bytes(outer.records)

    assert both(lend=True) == both(lend=False)
    _inner, outer = both(lend=False)
    with lending():
        peeled = second.run_native(FETCH, outer, 50, 0, 0)
        assert peeled is not None and peeled.records is not None
        opened = first.run_native(FETCH, peeled.records, 50, 0, 0)
        assert opened is not None and opened.records is not None
        assert bytes(opened.records) == section


def test_a_produced_section_is_parsed_once_for_the_screen_and_the_seal(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The chain screens a produced section for forged sluice.enc headers just before the
    sealer counts its values: one pass over the records serves both."""
    c = chain(tmp_path)
    calls: list[int] = []
    real = batch_seal.scan

    def counted(section: Any, count: int, reserved: str = "") -> batch_seal.Scan:
        calls.append(count)
        return real(section, count, reserved)
    monkeypatch.setattr(batch_seal, "scan", counted)
    data = batch([*values(20), None])
    stored = filter_produce(c, PRODUCE, data)
    assert stored.error_code == 0 and stored.changed
    assert calls == [21]
    assert c.filters[0].native_fallbacks == 0
    # And the seal is what it was: the records open back to the produced ones.
    back = filter_fetch(c, FETCH, stored.records or b"")
    assert [(r.key, r.value, r.headers) for r in records_of(bytes(back.records))] == [
        (r.key, r.value, r.headers) for r in records_of(data)]


@pytest.mark.parametrize("header_size,note_size", [(0, 5000), (700, 300), (3000, 0),
                                                   (1020, 1020)])
def test_digests_of_long_headers_and_documents_match_the_reference(
        runner: EncryptRunner, fields_runner: EncryptRunner, header_size: int,
        note_size: int) -> None:
    """The native record digest gathers its input in a 1 KiB buffer and hashes longer pieces
    directly: headers and clear pieces around and above that size (in both modes) give the
    reference's bytes, and open back."""
    headers: list[tuple[str, bytes | None]] = [
        (f"h{i}", bytes([i]) * header_size) for i in range(3)] + [("n", None)]
    note = "x" * note_size
    records = [Record(i, i, b"k%d" % i,
                      b'{"a": {"b": "%s"}, "note": "%s", "card": "4111", "z": 1}'
                      % (note.encode(), note.encode()), list(headers), 0)
               for i in range(3)]
    section = bytes(encode_records(records))
    _compare_fields(fields_runner, records)
    sealed = fields_runner.run_native(PRODUCE, section, 3, 0, 0)
    assert sealed is not None and sealed.records is not None
    opened = fields_runner.run_native(FETCH, bytes(sealed.records), 3, 0, 0)
    assert opened is not None and opened.records == section
    runner.nonces = counting_nonces()
    decisions, _counts = runner.run(PRODUCE, records, 0, 0)
    runner.nonces = counting_nonces()
    whole = runner.run_native(PRODUCE, section, 3, 0, 0)
    assert whole is not None
    assert whole.records == bytes(encode_records(applied(records, decisions)))


_maybe_enc = st.sampled_from(["sluice.enc", "sluice.enc.fields", "sluice.encx", "h"])


@settings(max_examples=200, deadline=None)
@given(st.lists(st.lists(st.tuples(_maybe_enc, st.none() | st.binary(max_size=8)), max_size=3),
                min_size=1, max_size=8), st.integers(min_value=0, max_value=3))
def test_first_group_agrees_with_the_full_scan(headers: list[list[tuple[str, bytes | None]]],
                                               cut: int) -> None:
    """The allowed reader's scan stops at the first encrypted record: same record, group and
    header count as the full scan, and a section that ends early is still refused."""
    records = [Record(i, i, b"k", b"v", list(h), 0) for i, h in enumerate(headers)]
    section = bytes(encode_records(records))
    if cut:
        section = section[:-cut]
        with pytest.raises(batch_seal.Malformed):
            batch_seal.scan(section, len(records))
        if not any(name == "sluice.enc" for h in headers[:-1] for name, _v in h):
            with pytest.raises(batch_seal.Malformed):
                batch_seal.first_group(section, len(records))
        return
    full, first = batch_seal.scan(section, len(records)), batch_seal.first_group(section,
                                                                                 len(records))
    assert first.encrypted == min(1, full.encrypted)
    assert (first.first, first.group, first.group_count) == (
        full.first, full.group, full.group_count)


@pytest.mark.parametrize("fields", [None, ["card"]], ids=["value", "fields"])
def test_a_reader_that_parsed_a_group_still_asks_for_its_key_every_batch(
        tmp_path: Path, fields: list[str] | None) -> None:
    """The native opener keeps a header group's parse for the next batch carrying it, never
    its data key: a KEK deleted after a first read (data keys cached 0 s) makes the next
    batch under the same group read as shredded, and the group read on another topic fails
    authentication there."""
    kms = KmsSettings("local", path=str(tmp_path / "keys.json"))
    config = {"key": "payments", "decrypt_for": ["User:billing-*"], "data_key_cache_seconds": 0,
              **({"fields": fields} if fields else {})}
    chain = FilterChain.from_specs([FilterSpec(
        name="enc", module="builtin:encrypt", topics=("payments.*",),
        apply_to=frozenset({"produce", "fetch"}), config=config, kms=kms)])
    plain = batch(values(3))
    stored = bytes(filter_produce(chain, PRODUCE, plain).records or b"")
    assert bytes(filter_fetch(chain, FETCH, stored).records) == plain
    assert bytes(filter_fetch(chain, FETCH, stored).records) == plain  # the kept parse
    elsewhere = filter_fetch(chain, RecordContext("payments.us", 0, "fetch",
                                                  principal="User:billing-1"), stored)
    assert elsewhere.error_code == CORRUPT_MESSAGE
    LocalKeyring(tmp_path / "keys.json").delete_key("payments")
    out = filter_fetch(chain, FETCH, stored)
    assert out.error_code == 0 and bytes(out.records) == stored
    assert {k: v for s in out.stats for k, v in s.detector_counts.items()} == {"unreadable": 3}
