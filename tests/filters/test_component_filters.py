"""Filter components (world sluice:filter/sluice-filter@1.0.0, the Python SDK's route):
loading, the sandbox (no imports, memory cap, call deadline), errors, both entry points.

Small components are written in the component text format here; the Python SDK's own
modules are the committed examples (filters/examples/*-py).
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import wasmtime
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sluice.codec.records import Record, encode_records
from sluice.filters.abi_base import FilterLoadError
from sluice.filters.chain import FilterChain
from sluice.filters.config import FilterSpec
from sluice.filters.context import FilterRecord, RecordContext
from sluice.filters.decisions import Action
from sluice.filters.pipeline import filter_fetch, filter_produce
from sluice.filters.runtime import load_filter
from tests.filters.test_native_path import (
    FETCH,
    PRODUCE,
    both_paths,
    make_batch,
    native_answers,
    summary,
)

EXAMPLES = Path(__file__).resolve().parents[2] / "filters" / "examples"
CTX = RecordContext(topic="t", partition=0, direction="produce", client_id="c")

_LIFT = '(memory (core memory $i "memory")) (realloc (core func $i "realloc"))'


def component(filter_body: str, *, init_body: str = "(i32.store8 (i32.const 0) (i32.const 0))",
              pages: int = 1, extra: str = "") -> str:
    """A component exporting the world's four functions around a core module: `filter_body`
    is the core `filter` function's code (it returns a pointer to a result<string,string>)."""
    return f'''
(component
  {extra}
  (core module $m
    (memory (export "memory") {pages})
    (data (i32.const 100) "bad config")
    (func (export "realloc") (param i32 i32 i32 i32) (result i32) i32.const 1024)
    (func (export "version") (result i32) i32.const 1)
    (func (export "init") (param i32 i32) (result i32) {init_body} i32.const 0)
    (func (export "filter") (param i32 i32) (result i32) {filter_body} i32.const 0))
  (core instance $i (instantiate $m))
  (func (export "abi-version") (result u32) (canon lift (core func $i "version")))
  (func (export "init") (param "config" string) (result (result (error string)))
    (canon lift (core func $i "init") {_LIFT}))
  (func (export "filter") (param "batch" string) (result (result string (error string)))
    (canon lift (core func $i "filter") {_LIFT}))
  (func (export "filter-records") (param "batch" string) (result (result string (error string)))
    (canon lift (core func $i "filter") {_LIFT})))
'''


def load(tmp_path: Path, wat: str, **kw: object):  # type: ignore[no-untyped-def]
    path = tmp_path / "c.wasm"
    path.write_bytes(bytes(wasmtime.wat2wasm(wat)))
    return load_filter(FilterSpec(name="c", module=str(path), **kw),  # type: ignore[arg-type]
                       cache_dir=tmp_path / "cache")


def recs(n: int = 3) -> list[FilterRecord]:
    return [FilterRecord(i, 0, None, b"v%d" % i, []) for i in range(n)]


def test_a_component_that_imports_anything_is_refused(tmp_path: Path) -> None:
    wat = component("", extra='(import "wasi:filesystem/preopens@0.2.0" (instance))')
    with pytest.raises(FilterLoadError, match=r"imports wasi:filesystem/preopens@0\.2\.0, "
                                              r"which Sluice does not provide"):
        load(tmp_path, wat)


def test_a_looping_component_is_stopped_at_its_deadline_and_replaced(tmp_path: Path) -> None:
    f = load(tmp_path, component("(loop $l (br $l))"), timeout_ms=20, on_error="reject")
    assert f.abi == "sluice-v1-component"
    started = time.monotonic()
    res = f.run_batch(CTX, recs())
    assert time.monotonic() - started < 5
    assert res.failure is not None and res.failure.startswith("timeout: exceeded the 20 ms")
    assert [d.action for d in res.decisions] == [Action.REJECT] * 3
    assert f.failures["timeout"] == 1
    f.run_batch(CTX, recs())
    assert f.instantiations == 2  # the second call ran in a fresh instance


def test_a_component_error_result_is_a_filter_error(tmp_path: Path) -> None:
    # err("bad config"): tag 1 at 0, then the string's pointer and length.
    err = ("(i32.store8 (i32.const 0) (i32.const 1)) (i32.store (i32.const 4) (i32.const 100))"
           " (i32.store (i32.const 8) (i32.const 10))")
    f = load(tmp_path, component(err), on_error="pass")
    res = f.run_batch(CTX, recs())
    assert res.failure == "error: bad config"
    assert [d.action for d in res.decisions] == [Action.KEEP] * 3  # on_error: pass
    with pytest.raises(FilterLoadError, match="init rejected the config: bad config"):
        load(tmp_path, component("", init_body=err))


def test_memory_above_the_cap_fails_the_load(tmp_path: Path) -> None:
    with pytest.raises(FilterLoadError, match="instantiation failed"):
        load(tmp_path, component("", pages=40), max_memory_mb=1)


def test_garbage_output_is_invalid_output(tmp_path: Path) -> None:
    # ok("") for a 3-record batch: not a valid output layout.
    ok_empty = ("(i32.store8 (i32.const 0) (i32.const 0)) (i32.store (i32.const 4) "
                "(i32.const 100)) (i32.store (i32.const 8) (i32.const 0))")
    f = load(tmp_path, component(ok_empty))
    res = f.run_batch(CTX, recs())
    assert res.failure is not None and res.failure.startswith("invalid-output")


def test_python_upper_on_both_entry_points() -> None:
    f = load_filter(FilterSpec(name="u", module=str(EXAMPLES / "upper-py" / "upper-py.wasm")))
    assert f.abi == "sluice-v1-component" and f.native
    values = [b"hello w\xc3\xb6rld", b"ABC", None, b""]
    records = [Record(offset_delta=i, timestamp_delta=i, key=b"k", value=v,
                      headers=[("h", b"1")]) for i, v in enumerate(values)]
    decoded = f.run_batch(CTX, records)
    assert [d.action for d in decoded.decisions] == [Action.REWRITE, Action.KEEP, Action.KEEP,
                                                     Action.KEEP]
    assert decoded.decisions[0].value == b"HELLO W\xc3\xb6RLD"
    assert decoded.detector_counts == {"upper_cased": 1}
    native = f.run_native(CTX, encode_records(records), len(records))
    assert native is not None
    assert bytes(native.fates) == bytes([1, 0, 0, 0])
    assert native.detector_counts == {"upper_cased": 1}


@pytest.fixture(scope="module")
def py_chains() -> dict[str, FilterChain]:
    both = frozenset({"produce", "fetch"})
    return {name: FilterChain.from_specs([FilterSpec(
        name=name, module=str(EXAMPLES / name / f"{name}.wasm"), topics=("*",),
        apply_to=both)]) for name in ("upper-py", "enrich-py")}


JSONISH = st.sampled_from([b'{"user_id": 7}', b'{"user_id": 1, "timestamp": 2}', b"{}",
                           b"not json", b'{"a": "\\x"}', b"[1]", b"hello", b"ABC", b""])


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                 HealthCheck.function_scoped_fixture])
@given(values=st.lists(st.one_of(JSONISH, st.binary(max_size=40), st.none()), min_size=1,
                       max_size=12),
       codec=st.integers(0, 4), idempotent=st.booleans(), fetch=st.booleans(),
       name=st.sampled_from(["upper-py", "enrich-py"]), base_offset=st.integers(0, 2**40))
def test_python_ports_native_and_decoding_paths_agree(
        py_chains: dict[str, FilterChain], values: list[bytes | None], codec: int,
        idempotent: bool, fetch: bool, name: str, base_offset: int) -> None:
    """The Python module's filter-records answer equals the decoding path's (filter)."""
    chain = py_chains[name]
    data = make_batch(values, codec=codec, producer_id=5 if idempotent else -1,
                      base_offset=base_offset if fetch else 0)
    with native_answers() as answers:
        if fetch:
            native, slow = both_paths(chain, filter_fetch, FETCH, data)
        else:
            native, slow = both_paths(chain, filter_produce, PRODUCE, data)
    assert summary(native) == summary(slow)
    assert len(answers) == 1 and answers[0] is not None  # the native answer itself was used


def test_a_component_with_a_second_memory_is_refused(tmp_path: Path) -> None:
    """One memory per store: a second one cannot double the cap."""
    second = '(core module $two (memory 1)) (core instance $t (instantiate $two))'
    with pytest.raises(FilterLoadError, match="instantiation failed"):
        load(tmp_path, component("", extra=second))
