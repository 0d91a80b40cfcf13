"""The fleet's record format, state folding, config section and catalog (no broker)."""

from __future__ import annotations

import base64
import hashlib
import json
from pathlib import Path

import pytest

from sluice.filters.abi_base import FilterLoadError
from sluice.filters.config import BUILTIN_DIR, FilterSpec
from sluice.filters.yaml_lines import ConfigError, load_yaml_text_with_lines
from sluice.proxy.ops.fleet import (
    DEFAULT_TOPIC,
    FleetCatalog,
    FleetView,
    filter_record_value,
    parse_fleet_section,
    store_module,
)
from sluice.proxy.ops.reload import check_loads

PII = (BUILTIN_DIR / "pii-mask.wasm").read_bytes()
PII_SHA = hashlib.sha256(PII).hexdigest()


def value(mask: str = "#", module: bytes = PII, **extra: object) -> bytes:
    fields = {"name": "pii", "topics": ("users",), "apply_to": frozenset({"produce"}),
              "config": {"mask": mask}, **extra}
    return filter_record_value(fields, "builtin:pii-mask", module, "tester@host")


def test_record_round_trip_and_last_writer_wins() -> None:
    view = FleetView()
    assert view.apply(b"pii", value("#"), 0, 0)
    assert view.apply(b"pii", value("+"), 0, 1)
    record = view.filters["pii"]
    assert (record.sha256, record.size, record.offset) == (PII_SHA, len(PII), 1)
    assert record.fields["config"] == {"mask": "+"}
    assert record.fields["apply_to"] == ["produce"] and record.fields["topics"] == ["users"]
    assert record.module_bytes() == PII
    assert record.deployed_by == "tester@host" and record.module == "builtin:pii-mask"
    # Tombstones: None and empty values both delete.
    assert view.apply(b"pii", None, 0, 2)
    assert "pii" not in view.filters
    assert not view.apply(b"pii", b"", 0, 3)


def test_invalid_newest_record_keeps_previous_and_is_reported() -> None:
    view = FleetView()
    view.apply(b"pii", value("#"), 0, 0)
    assert not view.apply(b"pii", b"{not json", 0, 1)
    assert view.filters["pii"].offset == 0
    assert "not JSON" in view.invalid["pii"]
    body = json.loads(value())
    body["format"] = 99
    assert not view.apply(b"pii", json.dumps(body).encode(), 0, 2)
    assert "unsupported format 99" in view.invalid["pii"]
    body["format"], body["name"] = 1, "other"
    view.apply(b"pii", json.dumps(body).encode(), 0, 3)
    assert "names 'other'" in view.invalid["pii"]
    view.apply(b"pii", value("+"), 0, 4)
    assert "pii" not in view.invalid and view.filters["pii"].offset == 4


def test_sha256_is_checked_against_the_module_bytes() -> None:
    body = json.loads(value())
    tampered = PII[:-1] + bytes([PII[-1] ^ 0xFF])  # whatever the last byte is, it changes
    body["module_b64"] = base64.b64encode(tampered).decode()
    view = FleetView()
    view.apply(b"pii", json.dumps(body).encode())
    with pytest.raises(ValueError, match="module sha256 is"):
        view.filters["pii"].module_bytes()


def test_heartbeats_are_instances_not_filters() -> None:
    view = FleetView()
    hb = {"time": 10_000, "heartbeat_seconds": 1, "filters": [{"name": "pii", "sha256": "x"}]}
    assert not view.apply(b"instance:abc", json.dumps(hb).encode())
    inst = view.instances["abc"]
    assert inst.filters() == [{"name": "pii", "sha256": "x"}]
    assert inst.live(now_ms=12_000) and not inst.live(now_ms=20_000)
    assert not view.apply(b"instance:abc", None)
    assert view.instances == {} and view.filters == {}


@pytest.mark.parametrize(
    ("text", "where"),
    [
        ("fleet: [1]\n", "fleet"),
        ("fleet:\n  topic: ''\n", "fleet.topic"),
        ("fleet:\n  poll_seconds: fast\n", "fleet.poll_seconds"),
        ("fleet:\n  heartbeat_seconds: 0\n", "fleet.heartbeat_seconds"),
        ("fleet:\n  bootstrap: nohost\n", "fleet.bootstrap"),
        ("fleet:\n  create_topic: 'yes'\n", "fleet.create_topic"),
        ("fleet:\n  x: 1\n", "fleet.x"),
        ("fleet: {}\n", "fleet.trusted_keys"),
        ("fleet:\n  trusted_keys: [ssh-rsa AAAA]\n", "fleet.trusted_keys[0]"),
        ("fleet:\n  trusted_keys: ['ed25519:AAAA']\n", "fleet.trusted_keys[0]"),
        ("fleet:\n  signing_key: /nonexistent/key\n", "fleet.signing_key"),
        ("fleet:\n  allow_unsigned: 1\n", "fleet.allow_unsigned"),
        ("fleet:\n  allow_unsigned: true\n  cache_max_mb: 0\n", "fleet.cache_max_mb"),
    ],
)
def test_fleet_section_errors(text: str, where: str) -> None:
    data, lines = load_yaml_text_with_lines(text, "s.yaml")
    with pytest.raises(ConfigError) as info:
        parse_fleet_section(data["fleet"], lines)
    assert info.value.field == where and info.value.line is not None


def test_fleet_section_defaults() -> None:
    assert parse_fleet_section(None) is None
    s = parse_fleet_section({"allow_unsigned": True})
    assert s is not None
    assert (s.topic, s.poll_seconds, s.heartbeat_seconds, s.create_topic, s.bootstrap) == (
        DEFAULT_TOPIC, 2.0, 5.0, True, None)
    assert s.allow_unsigned and s.trusted_keys == () and s.cache_max_bytes == 256 * 1024 * 1024


def test_store_module_is_keyed_by_sha256_and_idempotent(tmp_path: Path) -> None:
    path = store_module(tmp_path, PII_SHA, PII)
    assert path == tmp_path / f"{PII_SHA}.wasm" and path.read_bytes() == PII
    mtime = path.stat().st_mtime_ns
    assert store_module(tmp_path, PII_SHA, PII) == path
    assert path.stat().st_mtime_ns == mtime
    path.write_bytes(b"corrupt")
    assert store_module(tmp_path, PII_SHA, PII).read_bytes() == PII
    assert [p.name for p in tmp_path.iterdir()] == [path.name]


def test_catalog_accepts_refuses_keeps_previous_and_removes(tmp_path: Path) -> None:
    checked: list[FilterSpec] = []

    def check(spec: FilterSpec) -> None:
        checked.append(spec)
        check_loads(spec, tmp_path)

    catalog = FleetCatalog("t", tmp_path, check)
    view = FleetView()
    view.apply(b"pii", value("#"), 0, 0)
    plan = catalog.plan(dict(view.filters))
    assert plan.changed and not plan.newly_refused
    [spec] = plan.specs
    assert spec.module == str(tmp_path / "fleet" / f"{PII_SHA}.wasm")
    assert spec.source == "fleet:t" and dict(spec.config) == {"mask": "#"}
    catalog.commit(plan)

    # Same record again: nothing to do, nothing loaded.
    checked.clear()
    plan = catalog.plan(dict(view.filters))
    assert not plan.changed and checked == []

    # A config the module refuses: refused once, the previous version stays.
    view.apply(b"pii", value(""), 0, 1)
    plan = catalog.plan(dict(view.filters))
    assert not plan.changed
    [bad] = plan.newly_refused
    assert bad.version == (0, 1) and "mask must be a non-empty string" in bad.reason
    assert plan.accepted["pii"].record.offset == 0
    catalog.commit(plan)
    checked.clear()
    plan = catalog.plan(dict(view.filters))
    assert not plan.newly_refused and checked == []  # not retried on every update

    # Another filter joins; order is by name.
    view.apply(b"aaa", value("+").replace(b'"name":"pii"', b'"name":"aaa"'), 0, 2)
    plan = catalog.plan(dict(view.filters))
    assert plan.changed and [s.name for s in plan.specs] == ["aaa", "pii"]
    catalog.commit(plan)

    # Removal.
    view.apply(b"pii", None, 0, 3)
    plan = catalog.plan(dict(view.filters))
    assert plan.changed and [s.name for s in plan.specs] == ["aaa"]


def test_check_loads_refuses_a_module_that_is_not_wasm(tmp_path: Path) -> None:
    junk = tmp_path / "junk.wasm"
    junk.write_bytes(b"junk")
    spec = FilterSpec(name="j", module=str(junk), topics=("t",))
    with pytest.raises(FilterLoadError, match="not a valid Wasm module"):
        check_loads(spec, tmp_path)
