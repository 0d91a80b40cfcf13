"""``builtin:encrypt`` through the real pipeline (filters.pipeline): batches keep their
producer fields, counts and codec; allowed principals get the produced bytes back; others get
the stored records; every failure is closed and carries the documented Kafka error."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from sluice.codec.records import BatchHeader, Record, build_batch, decode_records, split_batches
from sluice.crypto.kms import KmsSettings
from sluice.crypto.kms_local import LocalKeyring, version_number
from sluice.filters.abi_base import FilterLoadError
from sluice.filters.chain import FilterChain
from sluice.filters.config import FilterSpec, load_filter_specs
from sluice.filters.context import RecordContext
from sluice.filters.pipeline import (
    CORRUPT_MESSAGE,
    INVALID_RECORD,
    filter_fetch,
    filter_produce,
)
from sluice.filters.yaml_lines import ConfigError
from tests.crypto.layout_edit import edit_envelope, wrapped_dek

KAFKA_STORAGE_ERROR = 56
TOPIC = "payments.eu"
BILLING = "User:billing-7"


def values(n: int) -> list[bytes]:
    return [json.dumps({"card": f"4111-{i:04d}", "name": "Ann", "i": i}).encode()
            for i in range(n)]


def batch(vals: list[bytes | None], *, codec: int = 0, producer_id: int = -1,
          base_sequence: int = -1, transactional: bool = False) -> bytes:
    recs = [Record(i, i, f"key-{i}".encode(), v, [("trace", b"t%d" % i)], 0)
            for i, v in enumerate(vals)]
    attributes = codec | (0x10 if transactional else 0)
    header = BatchHeader(0, 0, 0, 2, 0, attributes, len(recs) - 1, 1_700_000_000_000,
                         1_700_000_000_000 + len(recs) - 1, producer_id,
                         0 if producer_id >= 0 else -1, base_sequence, len(recs))
    return build_batch(header, recs)


def records_of(data: bytes) -> list[Record]:
    batches, _tail = split_batches(data)
    return [r for b in batches for r in decode_records(b)]


def kek_counts(counts: dict[str, int]) -> dict[int, int]:
    """``kek:payments:<version>`` counters by the version's number (versions are N-RANDOM)."""
    return {version_number(k.rsplit(":", 1)[1]): v for k, v in counts.items()
            if k.startswith("kek:payments:")}


@pytest.fixture
def kms(tmp_path: Path) -> KmsSettings:
    return KmsSettings("local", path=str(tmp_path / "keys.json"))


def chain_for(kms: KmsSettings, **config: Any) -> FilterChain:
    cfg = {"key": "payments", "decrypt_for": ["User:billing-*"], **config}
    spec = FilterSpec(name="enc", module="builtin:encrypt", topics=("payments.*",),
                      apply_to=frozenset({"produce", "fetch"}), config=cfg, kms=kms)
    return FilterChain.from_specs([spec])


def produce(chain: FilterChain, data: bytes) -> Any:
    return filter_produce(chain, RecordContext(TOPIC, 0, "produce", principal="User:app"), data)


def fetch(chain: FilterChain, data: bytes, principal: str | None) -> Any:
    return filter_fetch(chain, RecordContext(TOPIC, 0, "fetch", principal=principal), data)


@pytest.mark.parametrize("codec", [0, 1, 2, 3, 4], ids=["none", "gzip", "snappy", "lz4", "zstd"])
@pytest.mark.parametrize("fields", [None, ["card"]], ids=["value", "fields"])
def test_round_trip_keeps_the_batch(kms: KmsSettings, codec: int, fields: list[str] | None
                                    ) -> None:
    chain = chain_for(kms, **({"fields": fields} if fields else {}))
    vals: list[bytes | None] = [*values(5), None]  # a tombstone stays a tombstone
    produced = batch(vals, codec=codec, producer_id=4242, base_sequence=17, transactional=True)
    out = produce(chain, produced)
    assert out.error_code == 0 and out.records is not None
    stored = bytes(out.records)
    [sb], _ = split_batches(stored)
    [pb], _ = split_batches(produced)
    h, p = sb.header, pb.header
    assert (h.producer_id, h.producer_epoch, h.base_sequence, h.is_transactional,
            h.compression, h.record_count, h.last_offset_delta, h.base_timestamp,
            h.max_timestamp) == (p.producer_id, p.producer_epoch, p.base_sequence,
                                 p.is_transactional, p.compression, p.record_count,
                                 p.last_offset_delta, p.base_timestamp, p.max_timestamp)
    recs = records_of(stored)
    assert all(b"4111-" not in (r.value or b"") for r in recs)
    assert recs[-1].value is None and recs[-1].headers == [("trace", b"t5")]
    assert [r.key for r in recs] == [f"key-{i}".encode() for i in range(6)]
    if fields:
        assert all(json.loads(r.value)["name"] == "Ann" for r in recs[:-1] if r.value)
    stats = {k: v for s in out.stats for k, v in s.detector_counts.items()}
    assert stats["encrypted"] == 5 and kek_counts(stats) == {1: 5}
    # An allowed principal gets exactly the produced batch back.
    allowed = fetch(chain, stored, BILLING)
    assert allowed.error_code == 0 and bytes(allowed.records) == produced
    # Anyone else gets the stored bytes untouched (no rebuild, same object).
    for who in ("User:bob", None):
        refused = fetch(chain, stored, who)
        assert refused.error_code == 0 and bytes(refused.records) == stored
        assert {k: v for s in refused.stats for k, v in s.detector_counts.items()} == {
            "withheld": 5}


def test_plain_records_pass_fetch_unchanged(kms: KmsSettings) -> None:
    chain = chain_for(kms)
    plain = batch(values(3))
    out = fetch(chain, plain, BILLING)
    assert out.error_code == 0 and bytes(out.records) == plain


def test_kms_down_refuses_produce_with_a_retriable_error(tmp_path: Path) -> None:
    path = tmp_path / "keys.json"
    chain = chain_for(KmsSettings("local", path=str(path)))
    path.write_text("{corrupt")  # the keyring cannot be read: the KMS is "down"
    path.chmod(0o600)
    out = produce(chain, batch(values(3), producer_id=9, base_sequence=0))
    assert out.records is None and out.error_code == KAFKA_STORAGE_ERROR
    assert "nothing was stored" in out.error_message
    assert [s.errors for s in out.stats] == [1]


def test_kms_down_fails_the_allowed_fetch(tmp_path: Path) -> None:
    path = tmp_path / "keys.json"
    settings = KmsSettings("local", path=str(path))
    stored = bytes(produce(chain_for(settings), batch(values(3))).records)
    reader = chain_for(settings)  # a fresh filter: nothing cached
    saved = path.read_bytes()
    path.write_bytes(b"{corrupt")
    out = fetch(reader, stored, BILLING)
    assert out.error_code == KAFKA_STORAGE_ERROR and out.records == b""
    assert fetch(reader, stored, "User:bob").records is stored  # others are unaffected
    path.write_bytes(saved)
    assert fetch(reader, stored, BILLING).error_code == 0


@pytest.mark.parametrize("where", ["value", "header", "key", "dek"])
def test_tampered_record_fails_the_partition(kms: KmsSettings, where: str) -> None:
    chain = chain_for(kms)
    recs = records_of(bytes(produce(chain, batch(values(3))).records))
    victim = recs[1]
    if where == "value":
        victim.value = victim.value[:-1] + bytes([victim.value[-1] ^ 1])
    elif where == "header":
        victim.headers = edit_envelope(victim.headers, key_version="2")
    elif where == "key":
        victim.key = b"key-0"
    else:
        dek = wrapped_dek(victim.headers)
        victim.headers = edit_envelope(victim.headers, wrapped_dek=dek[:-1] + bytes([dek[-1] ^ 1]))
    header = BatchHeader(100, 0, 0, 2, 0, 0, 2, 0, 2, -1, -1, -1, 3)
    edited = build_batch(header, recs)
    out = fetch(chain, edited, BILLING)
    assert out.error_code == CORRUPT_MESSAGE and out.records == b""
    assert "offset 101" in out.error_message and "failed authentication" in out.error_message
    assert [s.errors for s in out.stats] == [1]
    assert chain.filters[0].failures["partition"] == 1


def test_deleted_key_makes_records_unreadable(kms: KmsSettings) -> None:
    writer = chain_for(kms)
    stored = bytes(produce(writer, batch(values(2))).records)
    assert kms.path is not None
    LocalKeyring(Path(kms.path)).delete_key("payments")
    reader = chain_for(kms)
    out = fetch(reader, stored, BILLING)
    assert out.error_code == 0 and bytes(out.records) == stored  # the stored form, as is
    assert {k: v for s in out.stats for k, v in s.detector_counts.items()} == {"unreadable": 2}


def test_rotation_keeps_old_records_readable(kms: KmsSettings) -> None:
    assert kms.path is not None
    old = bytes(produce(chain_for(kms), batch(values(2))).records)
    LocalKeyring(Path(kms.path)).rotate_key("payments")
    new_out = produce(chain_for(kms), batch(values(2)))
    assert kek_counts(new_out.stats[0].detector_counts) == {2: 2}
    reader = chain_for(kms)
    for stored in (old, bytes(new_out.records)):
        assert bytes(fetch(reader, stored, BILLING).records) == batch(values(2))


def test_field_mode_refuses_values_that_are_not_json(kms: KmsSettings) -> None:
    chain = chain_for(kms, fields=["card"])
    out = produce(chain, batch([values(1)[0], b"card=4111"], producer_id=3, base_sequence=0))
    assert out.records is None and out.error_code == INVALID_RECORD
    assert out.record_errors[0][0] == 1 and "not a JSON object" in out.record_errors[0][1]
    unmarked = produce(chain, batch([b'{"name": "no card here"}']))
    assert unmarked.error_code == 0 and not unmarked.changed  # nothing to hide: as produced


@pytest.mark.parametrize("value", [b"v", None, b'{"name": "no card"}'],
                         ids=["value", "tombstone", "json-without-fields"])
@pytest.mark.parametrize("fields", [None, ["card"]], ids=["value-mode", "fields-mode"])
def test_producer_headers_named_like_ours_are_refused(kms: KmsSettings, value: bytes | None,
                                                       fields: list[str] | None) -> None:
    """Only the proxy writes sluice.enc* headers: a produced record carrying one (whatever the
    record: a tombstone, a document without the listed fields) fails its partition, so no
    producer can store a group that blocks or misleads the allowed readers."""
    chain = chain_for(kms, **({"fields": fields} if fields else {}))
    for name in ("sluice.enc", "sluice.enc.dek", "sluice.encx"):
        recs = [Record(0, 0, b"k", b"ok", [], 0),
                Record(1, 1, b"k", value, [(name, b"1;value")], 0)]
        produced = build_batch(BatchHeader(0, 0, 0, 2, 0, 0, 1, 0, 1, -1, -1, -1, 2), recs)
        out = produce(chain, produced)
        assert out.records is None and out.error_code == INVALID_RECORD
        assert "record 1 carries the header" in out.error_message and name in out.error_message
        assert [s.errors for s in out.stats] == [1]


@pytest.mark.parametrize(("config", "extra", "message"), [
    ({}, {}, "config.key: required"),
    ({"key": "a;b"}, {}, "config.key"),
    ({"key": "k", "decrypt_for": "User:x", "typo": 1}, {}, "config.typo: unknown key"),
    ({"key": "k", "fields": []}, {}, "config.fields: must be a non-empty list"),
    ({"key": "k", "fields": ["a..b"]}, {}, "paths are member names"),
    ({"key": "k", "data_key_max_records": 0}, {}, "data_key_max_records: must be an integer"),
    ({"key": "k"}, {"principals": ("User:a",)}, "must apply to every principal"),
    ({"key": "k"}, {"on_error": "pass"}, "cannot use on_error: pass"),
    ({"key": "k"}, {"kms": None}, "needs the top-level kms: section"),
    ({"key": "k"}, {"apply_to": frozenset({"admin"})}, "cannot act on admin"),
])
def test_config_errors(kms: KmsSettings, config: dict[str, Any], extra: dict[str, Any],
                       message: str) -> None:
    fields: dict[str, Any] = {"name": "enc", "module": "builtin:encrypt", "config": config,
                              "kms": kms, **extra}
    with pytest.raises(FilterLoadError, match="filter 'enc'") as err:
        FilterChain.from_specs([FilterSpec(**fields)])
    assert message in str(err.value)


def test_config_file_wires_kms_into_the_filter(tmp_path: Path) -> None:
    path = tmp_path / "sluice.yaml"
    path.write_text("filters:\n  - name: enc\n    module: builtin:encrypt\n"
                    "    topics: [payments.*]\n    apply_to: [produce, fetch]\n"
                    "    config: {key: payments}\n"
                    "kms:\n  type: local\n  path: keys/ring.json\n")
    (tmp_path / "keys").mkdir()
    [spec] = load_filter_specs(path)
    assert spec.kms == KmsSettings("local", path=str(tmp_path / "keys" / "ring.json"))
    chain = FilterChain.from_specs([spec])
    assert chain.filters[0].abi == "host" and chain.filters[0].origin == "host"
    produce(chain, batch(values(1)))
    assert (tmp_path / "keys" / "ring.json").is_file()
    path.write_text("filters:\n  - name: enc\n    module: builtin:encrypt\n    topics: [t]\n"
                    "    apply_to: [produce]\nkms:\n  type: local\n")
    with pytest.raises(ConfigError, match=r"sluice.yaml:6: kms.path: required"):
        load_filter_specs(path)


def test_data_key_rotates_between_batches(kms: KmsSettings) -> None:
    chain = chain_for(kms, data_key_max_records=300)
    deks = set()
    for _ in range(3):
        stored = bytes(produce(chain, batch(list(values(250)))).records)
        recs = records_of(stored)
        batch_deks = {wrapped_dek(r.headers) for r in recs}
        assert len(batch_deks) == 1  # one data key per batch
        deks |= batch_deks
    assert len(deks) == 3  # 250 + 250 > 300: every batch needed a fresh key


@pytest.mark.parametrize("codec", [0, 1], ids=["none", "gzip"])
@pytest.mark.parametrize("fields", [None, ["card"]], ids=["value", "fields"])
def test_sealed_sections_are_not_checked_a_second_time(
        kms: KmsSettings, monkeypatch: pytest.MonkeyPatch, codec: int,
        fields: list[str] | None) -> None:
    """The pipeline checks the client's (and the broker's) section once; what the native
    sealer and opener write from it is the proxy's own output and is not checked again."""
    from sluice.filters import pipeline

    checked: list[bytes] = []
    for name in ("check_batch", "check_section"):
        real = getattr(pipeline, name)

        def spy(data: Any, *rest: Any, _real: Any = real) -> Any:
            checked.append(bytes(data))
            return _real(data, *rest)

        monkeypatch.setattr(pipeline, name, spy)
    chain = chain_for(kms, **({"fields": fields} if fields else {}))
    produced = batch(values(4), codec=codec)
    out = produce(chain, produced)
    assert out.error_code == 0 and out.records is not None
    stored = bytes(out.records)
    assert all(b"4111-" not in (r.value or b"") for r in records_of(stored))
    assert len(checked) == 1  # the producer's section only
    allowed = fetch(chain, stored, BILLING)
    assert allowed.error_code == 0 and bytes(allowed.records) == produced
    assert len(checked) == 2  # and the stored one, as the broker returned it
