"""Signed fleet records: keys, the envelope, and what a proxy's view applies (no broker)."""

from __future__ import annotations

import base64
import hashlib
import json
import stat
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sluice.filters.config import BUILTIN_DIR
from sluice.proxy.ops.fleet import (
    FleetCatalog,
    FleetFollower,
    FleetTrust,
    FleetView,
    filter_record_value,
    load_state,
    parse_fleet_section,
    removal_payload,
    save_state,
    signed_filter_value,
)
from sluice.proxy.ops.fleet_signing import (
    KeyFileError,
    SignatureError,
    SigningKey,
    generate_key_files,
    load_signing_key,
    load_trusted_keys,
    new_signing_key,
    next_seq,
    sign,
    verify,
)
from sluice.proxy.ops.policies import policy_payload, policy_record_value
from sluice.proxy.ops.reload import check_loads

PII = (BUILTIN_DIR / "pii-mask.wasm").read_bytes()
PII_SHA = hashlib.sha256(PII).hexdigest()
OPS = new_signing_key()
OTHER = new_signing_key()
POLICY = json.dumps({"filters": [{"name": "pii", "apply_to": "produce"}]})


def trust(*keys: SigningKey) -> FleetTrust:
    return FleetTrust({k.key_id: k.trusted() for k in keys})


def deploy(mask: str = "#", key: SigningKey = OPS, seq: int = 1, name: str = "pii",
           module: bytes = PII) -> bytes:
    fields = {"name": name, "topics": ("users",), "apply_to": frozenset({"produce"}),
              "config": {"mask": mask}}
    return signed_filter_value(key, fields, "builtin:pii-mask", module, "ops@host", seq)


def removal(name: str = "pii", key: SigningKey = OPS, seq: int = 2) -> bytes:
    return sign(key, name.encode(), dict(removal_payload(name, "ops@host"), seq=seq))


def policy(topic: str, value: str | None = POLICY, key: SigningKey = OPS, seq: int = 1) -> bytes:
    payload = dict(policy_payload(topic, value, "User:admin", "proxy-1"), seq=seq)
    return sign(key, f"policy:{topic}".encode(), payload)


def test_key_files_are_private_and_round_trip(tmp_path: Path) -> None:
    path = tmp_path / "ops.key"
    key = generate_key_files(path, "ops team")
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    pub = (tmp_path / "ops.key.pub").read_text()
    assert pub.startswith("ed25519:") and key.key_id in pub and "ops team" in pub
    assert load_signing_key(path).key_id == key.key_id
    assert set(load_trusted_keys([str(tmp_path / "ops.key.pub"), key.public])) == {key.key_id}
    with pytest.raises(KeyFileError, match="exists"):
        generate_key_files(path)
    path.chmod(0o644)
    with pytest.raises(KeyFileError, match="readable by others"):
        load_signing_key(path)


def test_config_reads_keys_relative_to_the_config_file(tmp_path: Path) -> None:
    operator = generate_key_files(tmp_path / "ops.key")
    proxy = generate_key_files(tmp_path / "proxy.key")
    settings_ = parse_fleet_section({"trusted_keys": ["ops.key.pub"], "signing_key": "proxy.key"},
                                    None, tmp_path)
    assert settings_ is not None
    assert set(settings_.trust().keys) == {operator.key_id, proxy.key_id}
    assert not settings_.trust().allow_unsigned


def test_signed_deploy_and_signed_removal_apply() -> None:
    view = FleetView(trust=trust(OPS))
    assert view.apply(b"pii", deploy(seq=10), 0, 0)
    record = view.filters["pii"]
    assert record.signer == OPS.key_id and record.seq == 10 and record.sha256 == PII_SHA
    assert record.module_bytes() == PII and record.deployed_by == "ops@host"
    assert view.apply(b"pii", removal(seq=11), 0, 1)
    assert view.filters == {} and view.refused == []


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        (None, "unsigned"),
        (b"", "unsigned"),
        (filter_record_value({"name": "pii", "topics": ["*"], "apply_to": ["produce"]},
                             "builtin:pii-mask", PII, "forged"), "unsigned"),
        (deploy(key=OTHER, seq=99), "untrusted_key"),
        (removal(key=OTHER, seq=99), "untrusted_key"),
        (b"\xff\x00junk", "unreadable"),
        (b'{"format":2,"signed":"{}","key_id":1,"signature":"x"}', "unreadable"),
    ],
)
def test_what_does_not_verify_changes_nothing_and_is_reported(value: bytes | None,
                                                             reason: str) -> None:
    view = FleetView(trust=trust(OPS))
    view.apply(b"pii", deploy(seq=10), 0, 0)
    assert not view.apply(b"pii", value, 0, 1)
    assert view.filters["pii"].seq == 10
    [(key, why, _message)] = view.refused
    assert (key, why) == ("pii", reason)


def test_tampered_payload_or_moved_record_fails_the_signature() -> None:
    view = FleetView(trust=trust(OPS))
    envelope = json.loads(deploy(seq=5))
    envelope["signed"] = envelope["signed"].replace('"users"', '"*"')
    assert not view.apply(b"pii", json.dumps(envelope).encode())
    # The record key is signed too: a valid record copied under another name does not verify.
    assert not view.apply(b"other", deploy(seq=5))
    assert [r[1] for r in view.refused] == ["bad_signature", "bad_signature"]
    assert view.filters == {}


def test_module_bytes_are_checked_against_the_signed_sha256() -> None:
    envelope = json.loads(deploy(seq=5))
    tampered = PII[:-1] + bytes([PII[-1] ^ 0xFF])
    envelope["module_b64"] = base64.b64encode(tampered).decode()
    view = FleetView(trust=trust(OPS))
    assert view.apply(b"pii", json.dumps(envelope).encode())  # the signature holds...
    with pytest.raises(ValueError, match="module sha256 is"):
        view.filters["pii"].module_bytes()  # ...but the module is refused before storage


def test_replay_of_an_older_signed_record_changes_nothing() -> None:
    view = FleetView(trust=trust(OPS))
    old = deploy("#", seq=10)
    view.apply(b"pii", old, 0, 0)
    view.apply(b"pii", removal(seq=11), 0, 1)
    view.live = True
    assert not view.apply(b"pii", old, 0, 2)
    assert view.filters == {} and [r[1] for r in view.refused] == ["replay"]


def test_permissive_mode_is_the_old_behaviour() -> None:
    view = FleetView(trust=FleetTrust({}, allow_unsigned=True))
    unsigned = filter_record_value({"name": "pii", "topics": ["users"], "apply_to": ["produce"]},
                                   "builtin:pii-mask", PII, "who")
    assert view.apply(b"pii", unsigned)
    assert view.apply(b"pii", None)
    assert view.filters == {}


def test_policy_records_are_signed_and_name_one_topic() -> None:
    view = FleetView(trust=trust(OPS))
    assert view.apply(b"policy:orders", policy("orders", seq=3))
    assert view.policies["orders"].signer == OPS.key_id
    # Unsigned or forged: ignored.
    assert not view.apply(b"policy:orders", policy_record_value("orders", POLICY, "forged"))
    assert not view.apply(b"policy:orders", None)
    assert not view.apply(b"policy:orders", policy("orders", None, key=OTHER, seq=9))
    # Keys that are not one topic name: refused whatever the value, even signed.
    for topic in ("*", "c*", "a?", "[ab]", ".", "..", "", "x" * 250, "a b"):
        assert not view.apply(f"policy:{topic}".encode(), b"junk")
        assert not view.apply(f"policy:{topic}".encode(), policy(topic, seq=4))
    assert set(view.policies) == {"orders"}
    reasons = {r[1] for r in view.refused}
    assert reasons == {"unsigned", "untrusted_key", "invalid_name"}
    # A signed removal removes it.
    assert view.apply(b"policy:orders", policy("orders", None, seq=5))
    assert view.policies == {}


def test_signed_but_unusable_policy_blocks_only_its_topic() -> None:
    view = FleetView(trust=trust(OPS))
    assert view.apply(b"policy:orders", policy("orders", "{not json", seq=3))
    record = view.policies["orders"]
    assert record.policy is None and record.error


def test_state_file_round_trip_is_verified_again(tmp_path: Path) -> None:
    view = FleetView(trust=trust(OPS))
    view.apply(b"pii", deploy(seq=10), 0, 4)
    view.apply(b"policy:orders", policy("orders", seq=3), 0, 5)
    path = tmp_path / "state.json"
    save_state(path, view, {0: 6})
    records, read_to = load_state(path)
    assert read_to == {0: 6} and set(records) == {"pii", "policy:orders"}
    assert "module_b64" not in json.dumps(records)
    restored = FleetView(trust=trust(OPS))
    for name, entry in records.items():
        restored.restore(name, entry["envelope"], entry["partition"], entry["offset"])
    assert restored.filters["pii"].version == (0, 4) and restored.filters["pii"].module_b64 is None
    assert restored.policies["orders"].value == POLICY
    # A key no longer trusted (rotated out): its state entries are refused.
    other = FleetView(trust=trust(OTHER))
    for name, entry in records.items():
        other.restore(name, entry["envelope"], entry["partition"], entry["offset"])
    assert other.filters == {} and {r[1] for r in other.refused} == {"untrusted_key"}


def test_catalog_uses_cached_module_for_restored_records_and_prunes(tmp_path: Path) -> None:
    catalog = FleetCatalog("t", tmp_path, lambda spec: check_loads(spec, tmp_path))
    view = FleetView(trust=trust(OPS))
    view.apply(b"pii", deploy(seq=1), 0, 0)
    plan = catalog.plan(dict(view.filters))
    catalog.commit(plan)
    restored = FleetView(trust=trust(OPS))
    restored.restore("pii", view.signed["pii"]["envelope"], 0, 0)
    fresh = FleetCatalog("t", tmp_path, lambda spec: check_loads(spec, tmp_path))
    plan = fresh.plan(dict(restored.filters))
    assert not plan.newly_refused and [s.name for s in plan.specs] == ["pii"]
    fresh.commit(plan)
    # Old modules nobody uses go once the cache is over its bound; the one in use stays.
    for i in range(3):
        (catalog.module_dir / f"{i:064x}.wasm").write_bytes(b"\0" * 1000)
    removed = fresh.prune(max_bytes=len(PII) + 1500)
    assert len(removed) == 2
    assert (catalog.module_dir / f"{PII_SHA}.wasm").exists()


def test_a_module_that_does_not_load_is_not_left_in_the_cache(tmp_path: Path) -> None:
    catalog = FleetCatalog("t", tmp_path, lambda spec: check_loads(spec, tmp_path))
    junk = b"\0asm junk that is no module"
    view = FleetView(trust=trust(OPS))
    view.apply(b"junk", deploy(seq=1, name="junk", module=junk), 0, 0)
    plan = catalog.plan(dict(view.filters))
    assert [r.name for r in plan.newly_refused] == ["junk"]
    assert not (catalog.module_dir / f"{hashlib.sha256(junk).hexdigest()}.wasm").exists()


def test_follower_restores_state_and_reports_refusals(tmp_path: Path) -> None:
    settings_ = parse_fleet_section({"trusted_keys": [OPS.public]})
    assert settings_ is not None
    view = FleetView(trust=settings_.trust())
    view.apply(b"pii", deploy(seq=10), 0, 0)
    state = tmp_path / "state.json"
    save_state(state, view, {0: 1})
    refused: list[str] = []

    async def on_change(*_args: object) -> None:
        return None

    follower = FleetFollower(settings_, "127.0.0.1:1", "i", on_change, dict,
                             state_file=state, on_refused=refused.append)
    assert follower.restored() and follower.view.filters["pii"].seq == 10
    follower.view.apply(b"pii", None)
    follower.view.apply(b"pii", deploy(key=OTHER, seq=50))
    follower._drain_refusals()
    assert refused == ["unsigned", "untrusted_key"]


@settings(max_examples=60, deadline=None)
@given(payload=st.dictionaries(st.text(min_size=1, max_size=8),
                               st.one_of(st.integers(), st.text(max_size=20), st.booleans(),
                                         st.none()), max_size=6),
       key=st.binary(min_size=1, max_size=40), flip=st.integers(min_value=0))
def test_envelope_round_trip_and_any_change_to_the_signed_text_fails(
        payload: dict[str, object], key: bytes, flip: int) -> None:
    body = {**payload, "type": "filter", "seq": next_seq()}
    keys = {OPS.key_id: OPS.trusted()}
    value = sign(OPS, key, body)
    got = verify(key, value, keys)
    assert got.key_id == OPS.key_id and dict(got.payload) == {**body, "nonce": got.payload["nonce"]}
    envelope = json.loads(value)
    text = envelope["signed"]
    i = flip % len(text)
    envelope["signed"] = text[:i] + ("a" if text[i] != "a" else "b") + text[i + 1:]
    with pytest.raises(SignatureError):
        verify(key, json.dumps(envelope).encode(), keys)


def test_cli_keygen_and_deploy_without_a_key(tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str],
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    from sluice.cli import main

    monkeypatch.delenv("SLUICE_SIGNING_KEY", raising=False)
    key = tmp_path / "k.key"
    assert main(["filter", "keygen", str(key)]) == 0
    out = capsys.readouterr().out
    assert load_signing_key(key).key_id in out
    assert main(["filter", "keygen", str(key)]) == 2
    assert "exists" in capsys.readouterr().err
    code = main(["filter", "deploy", "pii", "builtin:pii-mask", "--topics", "t", "--on",
                 "produce", "--bootstrap", "127.0.0.1:1"])
    assert code == 2 and "--signing-key KEYFILE is required" in capsys.readouterr().err
    key.chmod(0o640)
    code = main(["filter", "remove", "pii", "--signing-key", str(key),
                 "--bootstrap", "127.0.0.1:1"])
    assert code == 2 and "readable by others" in capsys.readouterr().err


def test_truncated_or_recreated_topic_is_reported_once_and_changes_nothing() -> None:
    settings_ = parse_fleet_section({"trusted_keys": [OPS.public], "topic": "f"})
    assert settings_ is not None
    lost: list[int] = []

    async def on_change(*_args: object) -> None:
        return None

    follower = FleetFollower(settings_, "127.0.0.1:1", "i", on_change, dict,
                             on_lost=lambda: lost.append(1))
    follower.view.apply(b"pii", deploy(seq=10), 0, 3)
    follower._read_to = {0: 4}
    tp = 0  # partitions by id (offsets from fleet_kafka.FleetReader.offsets)
    follower._check_positions([tp], {tp: 0}, {tp: 4})  # as it was: nothing to report
    assert lost == []
    follower._check_positions([tp], {tp: 4}, {tp: 4})  # DeleteRecords up to the end
    assert lost == [1] and follower.view.filters["pii"].seq == 10
    follower._check_positions([tp], {tp: 4}, {tp: 4})  # reported once, not every poll
    assert lost == [1]
    follower.view.apply(b"pii", deploy(seq=11), 0, 5)
    follower._read_to = {0: 6}
    follower._check_positions([tp], {tp: 0}, {tp: 1})  # recreated: ends below what was read
    assert lost == [1, 1] and follower.view.filters["pii"].seq == 11
