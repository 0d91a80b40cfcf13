"""builtin:rules with the host_sha256 capability: its `hash` digests computed by the host once
per batch (docs/FILTER_ABI.md), byte for byte what the module before the capability wrote.

`data/rules-wasm-sha-reference.wasm` is filters/builtin/rules.wasm as committed at 0b27f5d,
the last build that hashed every field in Wasm (four SIMD lanes at a time). The shipped module
must answer every generated batch exactly as it does, on both entry points, with the host's
pass in use (checked, not assumed), on a host that does not offer the capability, and past the
host's byte budget (the module then hashes in Wasm).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sluice.filters import host_sha256, native_call
from sluice.filters.config import FilterSpec
from sluice.filters.runtime import LoadedFilter, load_filter
from tests.filters.builtin.test_rules_differential import (
    _answer,
    _native_answer,
    record_values,
    rule,
)

REFERENCE = Path(__file__).resolve().parent / "data" / "rules-wasm-sha-reference.wasm"

pytestmark = [
    pytest.mark.skipif(not host_sha256.AVAILABLE,
                       reason="filters/_host_sha256 not built (scripts/dev.sh install)"),
    pytest.mark.skipif(not REFERENCE.is_file(), reason="reference module missing"),
]

SALTS = ["", "pepper", "p" * 55, "q" * 63, "r" * 64, "s" * 130]
LONG = ["x" * 56, "y" * 120, "\u00e9" * 40, "a\"b\\c\n" * 9, "u@example.com"]


@st.composite
def hash_rules(draw: st.DrawFn) -> list[dict[str, Any]]:
    """Rule sets where hashes dominate: one to three hash rules (some on the same field, some
    read again by a later rule), mixed with the differential test's other rules."""
    rules = draw(st.lists(rule(), max_size=3))
    for _ in range(draw(st.integers(1, 3))):
        r: dict[str, Any] = {"field": draw(st.sampled_from(["a", "b", "a.b", "x"])),
                             "action": "hash"}
        if draw(st.booleans()):
            r["salt"] = draw(st.sampled_from(SALTS))
        rules.insert(draw(st.integers(0, len(rules))), r)
    return rules


@st.composite
def hashable_values(draw: st.DrawFn) -> bytes | None:
    if draw(st.integers(0, 2)) == 0:
        return draw(record_values())
    members = {name: draw(st.one_of(st.sampled_from(LONG), st.text(max_size=70),
                                    st.integers(), st.none(), st.just({"b": "inner"})))
               for name in draw(st.lists(st.sampled_from(["a", "b", "x", "c"]), max_size=4))}
    return json.dumps(members, ensure_ascii=draw(st.booleans())).encode()


@pytest.fixture
def host_passes(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[int]]:
    """The digests each host pass wrote, in order."""
    passes: list[int] = []
    real = native_call.nc_call_run
    assert real is not None

    def counted(call: Any, *args: Any) -> int:
        done = real(call, *args)
        if call.slot:  # a call with the pass (other guests take the same native call)
            passes.append(done)
        return done

    # Taken by each instance as it is made (native_call.NativeCall): patched before _pair.
    monkeypatch.setattr(native_call, "nc_call_run", counted)
    yield passes


def _pair(config: dict[str, Any], timeout_ms: int = 100) -> tuple[LoadedFilter, LoadedFilter]:
    return (load_filter(FilterSpec(name="rules", module="builtin:rules", config=config,
                                   timeout_ms=timeout_ms)),
            load_filter(FilterSpec(name="old", module=str(REFERENCE), config=config,
                                   timeout_ms=timeout_ms)))


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(rules=hash_rules(), values=st.lists(hashable_values(), min_size=1, max_size=9))
def test_host_hashed_rules_answer_as_the_wasm_hashing_module_did(
        rules: list[dict[str, Any]], values: list[bytes | None]) -> None:
    new, old = _pair({"rules": rules})
    try:
        assert "host_sha256" in new.capabilities
        assert _native_answer(new, values) == _native_answer(old, values)
        assert _answer(new, values) == _answer(old, values)
        assert new.native_fallbacks == 0
    finally:
        new.close()
        old.close()


def _emails(n: int, salt: str = "pepper") -> tuple[dict[str, Any], list[bytes | None]]:
    config = {"rules": [{"field": "email", "action": "hash", "salt": salt},
                        {"field": "note", "action": "truncate", "length": 4}]}
    values: list[bytes | None] = [
        json.dumps({"id": i, "email": f"user{i}@example.com", "note": "x" * 9}).encode()
        for i in range(n)]
    return config, values


def test_the_host_computes_the_digests(host_passes: list[int]) -> None:
    config, values = _emails(11)
    new, old = _pair(config)
    try:
        answer = _native_answer(new, values)
        assert host_passes == [11]  # one pass for the batch, a digest per record
        assert answer == _native_answer(old, values)
        records = answer[1]
        assert records is not None
        for i in range(11):
            digest = hashlib.sha256(f"pepperuser{i}@example.com".encode()).hexdigest()
            assert f'"email":"{digest}"'.encode() in records
    finally:
        new.close()
        old.close()


def test_a_host_without_the_capability_gets_the_same_bytes(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """An old host (or one without the native pass) never offers it: the module hashes in
    Wasm, as before."""
    config, values = _emails(9)
    monkeypatch.setattr(host_sha256, "AVAILABLE", False)
    new, old = _pair(config)
    try:
        assert "host_sha256" in new.capabilities  # the module declares it; the host declines
        assert _native_answer(new, values) == _native_answer(old, values)
        assert new.native_fallbacks == 0
    finally:
        new.close()
        old.close()


def test_past_the_hosts_byte_budget_the_module_hashes_itself(host_passes: list[int]) -> None:
    """Fields adding up to more than the host's limit per batch are hashed in Wasm."""
    big = "z" * (100 * 1024)
    values: list[bytes | None] = [json.dumps({"a": big + str(i)}).encode() for i in range(45)]
    config = {"rules": [{"field": "a", "action": "hash", "salt": "s"}]}
    assert 45 * len(big) > host_sha256.MAX_BYTES
    # 4.5 MB hashed in Wasm by each module: the deadline (wall time) is not under test here,
    # and on two cores shared by parallel test workers 100 ms of wall time can run out.
    new, old = _pair(config, timeout_ms=10_000)
    try:
        answer = _native_answer(new, values)
        assert host_passes == [0]  # the slot named no requests
        assert answer == _native_answer(old, values)
        assert answer[1] is not None
        assert hashlib.sha256(f"s{big}3".encode()).hexdigest().encode() in answer[1]
    finally:
        new.close()
        old.close()
