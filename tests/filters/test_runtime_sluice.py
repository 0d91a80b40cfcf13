"""The Sluice ABI v1 through the real runtime: decisions, failure policies, sandbox limits."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import pytest

from sluice.filters.abi_base import FilterLoadError
from sluice.filters.context import FilterRecord, RecordContext
from sluice.filters.decisions import Action
from sluice.filters.runtime import LoadedFilter

CTX = RecordContext("orders", 3, "produce", "client-1", "User:alice")
Load = Callable[..., LoadedFilter]


def rec(value: bytes | None, key: bytes | None = b"k", headers=None,
        delta: int = 0) -> FilterRecord:
    return FilterRecord(delta, delta * 10, key, value, list(headers or []))


def test_keep_rewrite_drop_reject_in_one_call(load_wat: Load) -> None:
    f = load_wat("sluice_upper")
    assert f.abi == "sluice-v1" and len(f.sha256) == 64
    records = [rec(b"hello", headers=[("h", b"v"), ("n", None)]), rec(b"DROP this"),
               rec(b"REJECT this"), rec(None), rec(b"ALREADY UPPER"), rec(b"mixed", key=None)]
    result = f.run_batch(CTX, records)
    actions = [d.action for d in result.decisions]
    assert actions == [Action.REWRITE, Action.DROP, Action.REJECT, Action.KEEP, Action.KEEP,
                       Action.REWRITE]
    first = result.decisions[0]
    assert (first.key, first.value, first.headers) == (b"k", b"HELLO", [("h", b"v"), ("n", None)])
    assert result.decisions[5].key is None and result.decisions[5].value == b"MIXED"
    assert result.decisions[2].reason == "marker REJECT"
    assert result.detector_counts == {"upper": 2}
    assert result.failure is None and result.failed_records == 0 and result.time_ns > 0
    assert all(d.failure is None for d in result.decisions)


def test_empty_batch_does_not_call_the_guest(load_wat: Load) -> None:
    f = load_wat("sluice_upper")
    result = f.run_batch(CTX, [])
    assert result.decisions == [] and result.time_ns == 0


def test_config_reaches_sluice_init(load_wat: Load) -> None:
    f = load_wat("sluice_upper", config={"mask": "#", "keep_last": 4})
    result = f.run_batch(CTX, [rec(b"CFGLEN")])
    assert result.detector_counts["cfglen"] == len(b'{"mask":"#","keep_last":4}')


def test_init_failure_refuses_to_load_with_the_guest_message(load_wat: Load) -> None:
    with pytest.raises(FilterLoadError, match=r"sluice_init rejected the config \(code 3\): "
                                              "config says fail"):
        load_wat("sluice_upper", name="failing", config={"fail": True})


@pytest.mark.parametrize(("marker", "kind"), [
    (b"TRAP", "trap"), (b"LOOP", "timeout"), (b"GROW", "memory"), (b"BADOUT", "invalid-output"),
    (b"ERROR", "error"),
])
@pytest.mark.parametrize("policy", ["reject", "pass", "dead-letter"])
def test_failures_follow_the_policy(load_wat: Load, marker: bytes, kind: str,
                                    policy: str) -> None:
    f = load_wat("sluice_upper", on_error=policy, timeout_ms=20, max_memory_mb=4,
                 dead_letter_topic="dlq" if policy == "dead-letter" else None)
    result = f.run_batch(CTX, [rec(b"fine"), rec(marker)])
    assert result.failure is not None and result.failure.startswith(f"{kind}:")
    assert result.failed_records == 2
    assert result.detector_counts == {}
    assert f.failures[kind] == 1
    for d in result.decisions:
        assert d.failure is not None and d.failure.startswith(kind)
        if policy == "pass":
            assert d.action is Action.KEEP
        else:
            assert d.action is Action.REJECT
            assert d.reason is not None and d.reason.startswith(f"filter {f.name} failed: {kind}")
        assert d.dead_letter == (policy == "dead-letter")
    # The filter keeps working afterwards.
    ok = f.run_batch(CTX, [rec(b"again")])
    assert ok.failure is None and ok.decisions[0].value == b"AGAIN"


def test_policy_can_be_bypassed_for_tools(load_wat: Load) -> None:
    f = load_wat("sluice_upper", on_error="pass")
    result = f.run_batch(CTX, [rec(b"TRAP")], apply_policy=False)
    assert result.decisions[0].action is Action.REJECT
    assert result.decisions[0].failure == "trap: wasm `unreachable` instruction executed"


def test_trap_reinstantiates_the_instance(load_wat: Load) -> None:
    # The module refuses to run when a previous call did not finish (its "busy" global is still
    # set): only a fresh instance after the trap makes the next call succeed.
    f = load_wat("sluice_upper")
    assert f.instantiations == 1
    assert f.run_batch(CTX, [rec(b"TRAP")]).failure is not None
    assert f.run_batch(CTX, [rec(b"x")]).decisions[0].value == b"X"
    assert f.instantiations == 2
    # An error *return* keeps the instance.
    assert f.run_batch(CTX, [rec(b"ERROR")]).failure == "error: asked to fail"
    assert f.instantiations == 2


def test_reinstantiation_calls_init_again(load_wat: Load) -> None:
    f = load_wat("sluice_upper", config={"k": 1})
    f.run_batch(CTX, [rec(b"TRAP")])
    assert f.run_batch(CTX, [rec(b"CFGLEN")]).detector_counts["cfglen"] == len(b'{"k":1}')


@pytest.mark.serial  # measures time: run alone
def test_epoch_deadline_stops_an_infinite_loop_quickly(load_wat: Load) -> None:
    f = load_wat("sluice_upper", timeout_ms=20)
    f.run_batch(CTX, [rec(b"warm")])
    started = time.perf_counter()
    result = f.run_batch(CTX, [rec(b"LOOP")])
    elapsed_ms = (time.perf_counter() - started) * 1000
    assert result.failure == "timeout: exceeded the 20 ms deadline"
    assert 15 <= elapsed_ms < 200, elapsed_ms


@pytest.mark.serial  # measures time: run alone
def test_batch_deadline_grows_with_the_batch(load_wat: Load) -> None:
    # 20 ms per call plus 100 us per record: 3 000 records get about 320 ms before the stop.
    f = load_wat("sluice_upper", timeout_ms=20)
    f.run_batch(CTX, [rec(b"warm")])
    batch = [rec(b"LOOP")] + [rec(b"x") for _ in range(2_999)]
    started = time.perf_counter()
    result = f.run_batch(CTX, batch)
    elapsed_ms = (time.perf_counter() - started) * 1000
    assert result.failure is not None and result.failure.startswith("timeout:")
    assert elapsed_ms >= 300, elapsed_ms


def test_memory_cap_is_enforced_per_instance(load_wat: Load) -> None:
    f = load_wat("sluice_upper", max_memory_mb=2)
    result = f.run_batch(CTX, [rec(b"GROW")])
    assert result.failure is not None and result.failure.startswith("memory:")
    assert "2097152 bytes" in result.failure


def test_big_batch_beyond_the_memory_cap_fails_cleanly(load_wat: Load) -> None:
    f = load_wat("sluice_upper", max_memory_mb=1)
    result = f.run_batch(CTX, [rec(b"x" * 100_000) for _ in range(10)])
    assert result.failure is not None and result.failure.split(":")[0] in ("memory", "trap")
    assert f.run_batch(CTX, [rec(b"small")]).decisions[0].value == b"SMALL"


def test_output_outside_memory_is_invalid_output(load_wat: Load) -> None:
    f = load_wat("oob_output")
    result = f.run_batch(CTX, [rec(b"x")])
    assert result.failure == "invalid-output: guest buffer 60000+10000 is outside linear memory"


def test_forbidden_import_is_refused_at_load_naming_it(load_wat: Load) -> None:
    with pytest.raises(FilterLoadError, match=r"module imports env\.open_socket, which Sluice "
                                              "does not provide"):
        load_wat("forbidden_import")
    with pytest.raises(FilterLoadError, match=r"wasi_snapshot_preview1\.path_open"):
        load_wat("wasi_fs_import")


def test_wasi_stubs_let_libc_style_modules_run(load_wat: Load) -> None:
    f = load_wat("wasi_stub_user")
    result = f.run_batch(CTX, [rec(b"a"), rec(b"b")])
    assert result.failure is None
    assert [d.action for d in result.decisions] == [Action.KEEP, Action.KEEP]


def test_start_function_loop_hits_the_deadline_at_load(load_wat: Load) -> None:
    started = time.perf_counter()
    with pytest.raises(FilterLoadError, match="instantiation failed: timeout"):
        load_wat("start_loop", timeout_ms=20)
    assert time.perf_counter() - started < 2


def test_unknown_abi_version_is_refused(load_wat: Load) -> None:
    with pytest.raises(FilterLoadError, match="Sluice ABI version 2"):
        load_wat("abi_v2")


def test_not_a_module(tmp_path: Path, make_spec, module_cache) -> None:
    from sluice.filters.config import FilterSpec
    from sluice.filters.runtime import load_filter

    bad = tmp_path / "bad.wasm"
    bad.write_bytes(b"\0asm garbage")
    with pytest.raises(FilterLoadError, match="is not a valid Wasm module"):
        load_filter(FilterSpec(name="bad", module=str(bad)), cache=module_cache)
    with pytest.raises(FilterLoadError, match="cannot read module"):
        load_filter(FilterSpec(name="gone", module=str(tmp_path / "gone.wasm")),
                    cache=module_cache)


def test_admin_binding_needs_sluice_admin(load_wat: Load) -> None:
    with pytest.raises(FilterLoadError, match="does not export sluice_admin"):
        load_wat("sluice_upper", apply_to=frozenset({"admin"}))


def test_offsets_and_timestamps_reach_the_guest_as_documented(load_wat: Load) -> None:
    # The upper-casing module copies keys and headers verbatim and ignores offsets; the
    # input encoding itself is checked byte for byte in test_records_io.
    f = load_wat("sluice_upper")
    result = f.run_batch(RecordContext("t", 0, "fetch"), [rec(b"a", delta=5)],
                         offset_base=1000, timestamp_base=1_700_000_000_000)
    assert result.decisions[0].value == b"A"
