"""The C, Zig, Rust and AssemblyScript SDKs at the ABI boundary: decisions, headers, nulls,
counters, config and admin hooks, refusal of malformed batches (with a message through
sluice_last_error), and memory reclaimed between batches."""

from __future__ import annotations

import struct
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.filters.sdk.guest_abi import (
    DROP,
    KEEP,
    REJECT,
    REWRITE,
    Guest,
    GuestError,
    Rec,
    encode_batch,
)
from tests.harness.session_builds import built_once

PROBES = Path(__file__).resolve().parent


@pytest.fixture(scope="module")
def c_module(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return built_once(tmp_path_factory, PROBES / "probe_c")


def test_c_decisions_context_and_counters(c_module: Path) -> None:
    g = Guest(c_module, {"limit": 5})
    ds, counts = g.run([Rec(b"keep"), Rec(b"drop"), Rec(b"nope"),
                        Rec(b"ctx", offset=3, timestamp_ms=-7), Rec(b"count"), Rec(b"count")],
                       topic="t.x", partition=9, direction=1, client_id="cid", principal="User:p")
    assert [d.kind for d in ds] == [KEEP, DROP, REJECT, REWRITE, KEEP, KEEP]
    assert ds[2].reason == "unknown command"
    assert ds[3].value == b"t.x|9|cid|User:p|1|3|-7|5"
    assert counts == {"a": 4, "b": 2}


def test_c_headers_nulls_and_json(c_module: Path) -> None:
    g = Guest(c_module, {})
    doc = b'{"a": [0, {"b": "found \\u00e9"}]}'
    ds, _ = g.run([Rec(b"headers", key=b"k", headers=[("in", b"v"), ("x", None)]),
                   Rec(b"json", headers=[("doc", doc)]),
                   Rec(b"json", headers=[("doc", b"{bad")])])
    assert (ds[0].kind, ds[0].key, ds[0].value) == (REWRITE, None, None)
    assert ds[0].headers == [("only", b"v"), ("nul", None)]
    assert ds[1].value == "found \u00e9".encode()
    assert (ds[2].kind, ds[2].reason) == (REJECT, "expected member name")


def test_c_config_errors_and_batch_error(c_module: Path) -> None:
    with pytest.raises(GuestError, match="refused on purpose"):
        Guest(c_module, {"refuse": True})
    with pytest.raises(GuestError, match="limit must be an integer"):
        Guest(c_module, {"limit": "many"})
    g = Guest(c_module, {})
    with pytest.raises(GuestError, match="asked to fail"):
        g.run([Rec(b"keep"), Rec(b"fail")])
    assert g.run([Rec(b"keep")])[0][0].kind == KEEP  # the instance stays usable


@pytest.mark.parametrize(("mutate", "message"), [
    (lambda b: b[:-3], "malformed"),
    (lambda b: struct.pack("<I", 2) + b[4:], "unsupported input version"),
    (lambda b: b[:5], "malformed batch header"),
    (lambda b: b[:-8] + struct.pack("<I", 0xFFFFFF00) + b[-4:], "malformed"),
])
def test_c_malformed_batches_are_refused(c_module: Path, mutate: Callable[[bytes], bytes],
                                         message: str) -> None:
    g = Guest(c_module, {})
    good = encode_batch([Rec(b"keep", headers=[("h", b"v")])])
    with pytest.raises(GuestError, match=message):
        g.call_raw(mutate(good))
    assert g.run([Rec(b"keep")])[0][0].kind == KEEP


def test_c_arena_survives_many_large_batches(c_module: Path) -> None:
    g = Guest(c_module, {"limit": 1})
    for _ in range(30):
        ds, _ = g.run([Rec(b"ctx")] * 50 + [Rec(b"x" * 200_000)])
        assert ds[0].value is not None and ds[0].value.endswith(b"|1")
    pages = g.memory.size(g.store)
    assert pages < 200  # ~10 MB per batch would have grown to 300+ MB without the reset


@pytest.fixture(scope="module", params=["probe_zig", "probe_rust", "probe_as", "probe_go"])
def hook_module(request: pytest.FixtureRequest,
                tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The probes that mirror each other command for command (Zig, Rust, AssemblyScript, Go)."""
    name = request.param
    return built_once(tmp_path_factory, PROBES / name)


def test_sdk_hooks(hook_module: Path) -> None:
    g = Guest(hook_module, {"prefix": "> "})
    ds, counts = g.run([Rec(b"v", key=b"k"), Rec(None), Rec(b"reject"), Rec(b"key", key=b"k")],
                       topic="tt")
    assert (ds[0].kind, ds[0].key, ds[0].value) == (REWRITE, b"k", b"> v@tt")
    assert ds[0].headers == [("h", None)]
    assert ds[1].kind == DROP
    assert (ds[2].kind, ds[2].reason) == (REJECT, "no")
    assert (ds[3].kind, ds[3].key, ds[3].value) == (REWRITE, None, b"key")
    assert counts == {"seen": 1}
    with pytest.raises(GuestError, match="AskedToFail"):
        g.run([Rec(b"fail")])
    assert g.admin({"op": "create_topics", "name": "tmp.x"}) == {"decision": "deny",
                                                                 "message": "no tmp topics"}
    assert g.admin({"op": "create_topics", "name": "ok"})["decision"] == "allow"
    with pytest.raises(GuestError, match="RefusedOnPurpose"):
        Guest(hook_module, {"refuse": True})
    with pytest.raises(GuestError, match=r"malformed|Truncated"):
        g.call_raw(encode_batch([Rec(b"v")])[:-2])


def test_sdk_memory_is_reclaimed_between_batches(hook_module: Path) -> None:
    g = Guest(hook_module, {"prefix": "p"})
    for _ in range(30):
        ds, _ = g.run([Rec(b"ctx")] * 50 + [Rec(b"x" * 200_000)])
        assert ds[-1].value is not None and ds[-1].value.endswith(b"@t")
    pages = g.memory.size(g.store)
    assert pages < 200  # ~12 MB per batch would have grown to 350+ MB without reclaiming
