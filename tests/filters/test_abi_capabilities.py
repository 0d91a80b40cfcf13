"""Sluice ABI v1 is a core and optional capabilities: what the host reads from a module's
exports, and that docs/FILTER_ABI.md lists the same capabilities as the host."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import pytest
import wasmtime

from sluice.filters.abi_base import FilterLoadError
from sluice.filters.abi_sluice import _OPTIONAL, CAPABILITIES
from sluice.filters.config import FilterSpec
from sluice.filters.context import FilterRecord, RecordContext
from sluice.filters.decisions import Action
from sluice.filters.module_cache import ModuleCache
from sluice.filters.runtime import LoadedFilter, load_filter

DOC = Path(__file__).resolve().parents[2] / "docs" / "FILTER_ABI.md"
CTX = RecordContext("orders", 0, "produce", "client-1", None)

# Only the core: every record kept (an empty output: version 1, no decisions, no detectors).
CORE_ONLY = """
(module
  (memory (export "memory") 1)
  (data (i32.const 2048) "\\01\\00\\00\\00\\00\\00\\00\\00\\00\\00\\00\\00")
  (func (export "sluice_abi_version") (result i32) (i32.const 1))
  (func (export "sluice_alloc") (param i32) (result i32) (i32.const 1024))
  (func (export "sluice_filter") (param i32 i32) (result i64)
    (i64.or (i64.shl (i64.const 2048) (i64.const 32)) (i64.const 12)))
)
"""


def _load(tmp_path: Path, cache: ModuleCache, wat: str, **kw: object) -> LoadedFilter:
    path = tmp_path / "m.wasm"
    path.write_bytes(wasmtime.wat2wasm(wat))
    spec = FilterSpec(name="m", module=str(path), topics=("*",),
                      apply_to=frozenset({"produce"}), **kw)  # type: ignore[arg-type]
    return load_filter(spec, cache=cache)


def test_a_core_only_module_loads_with_no_capability(tmp_path: Path,
                                                     module_cache: ModuleCache) -> None:
    f = _load(tmp_path, module_cache, CORE_ONLY)
    try:
        assert f.abi == "sluice-v1" and f.capabilities == frozenset()
        assert not f.native and not f.supports_admin
    finally:
        f.close()


def test_capabilities_are_the_optional_exports(load_wat: Callable[..., LoadedFilter]) -> None:
    upper = load_wat("sluice_upper")
    assert upper.capabilities == {"init", "last_error"}
    result = upper.run_batch(CTX, [FilterRecord(0, 0, b"k", b"hi", [])])
    assert [d.action for d in result.decisions] == [Action.REWRITE]
    assert load_wat("admin_policy", apply_to=frozenset({"admin"})).capabilities >= {"admin"}
    assert "records" in load_wat("native_bad").capabilities


def test_shipped_filters_have_every_batch_capability(make_spec: Callable[..., FilterSpec],
                                               module_cache: ModuleCache) -> None:
    f = load_filter(make_spec("builtin:pii-mask"), cache=module_cache)
    try:
        assert f.capabilities == {"init", "last_error", "records"}  # no admin requests
    finally:
        f.close()


def test_a_capability_with_the_wrong_signature_refuses_the_load(
        tmp_path: Path, module_cache: ModuleCache) -> None:
    wrong = CORE_ONLY.rstrip().removesuffix(")") + (
        '  (func (export "sluice_filter_records") (param i32) (result i32) (i32.const 0))\n)')
    with pytest.raises(FilterLoadError, match="export sluice_filter_records has signature"):
        _load(tmp_path, module_cache, wrong)


def test_the_doc_lists_the_hosts_capabilities() -> None:
    text = DOC.read_text(encoding="utf-8")
    table = text.split("Capabilities (each optional):\n\n", 1)[1].split("\n\n", 1)[0]
    rows = re.findall(r"^\| `([a-z0-9_]+)` \| `([a-z0-9_]+)` \|", table, flags=re.M)
    assert dict(rows) == CAPABILITIES
    assert set(CAPABILITIES.values()) == set(_OPTIONAL)
