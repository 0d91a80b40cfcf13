"""Fixtures for the filter host tests: WAT test modules compiled on the fly, isolated caches."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import wasmtime

from sluice.filters.chain import FilterChain
from sluice.filters.config import FilterSpec
from sluice.filters.module_cache import ModuleCache
from sluice.filters.runtime import LoadedFilter, load_filter, shared_cache

MODULES = Path(__file__).resolve().parent / "modules"


@pytest.fixture(scope="session")
def wasm_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Every tests/filters/modules/*.wat compiled to NAME.wasm in one session directory."""
    out = tmp_path_factory.mktemp("wasm")
    for wat in MODULES.glob("*.wat"):
        (out / f"{wat.stem}.wasm").write_bytes(wasmtime.wat2wasm(wat.read_text()))
    return out


@pytest.fixture
def module_cache(tmp_path: Path) -> ModuleCache:
    """A ModuleCache on a fresh directory (never the user's ~/.cache)."""
    return shared_cache(None, tmp_path / "module-cache")


@pytest.fixture
def make_spec(wasm_dir: Path) -> Callable[..., FilterSpec]:
    def make(module: str, name: str | None = None, **kw: Any) -> FilterSpec:
        kw.setdefault("topics", ("*",))
        kw.setdefault("apply_to", frozenset({"produce", "fetch"}))
        path = module if module.startswith("builtin:") else str(wasm_dir / f"{module}.wasm")
        return FilterSpec(name=name or module, module=path, **kw)

    return make


@pytest.fixture
def load_wat(make_spec: Callable[..., FilterSpec],
             module_cache: ModuleCache) -> Iterator[Callable[..., LoadedFilter]]:
    """load_wat("sluice_upper", on_error="pass", ...) -> LoadedFilter (closed afterwards)."""
    loaded: list[LoadedFilter] = []

    def load(module: str, **kw: Any) -> LoadedFilter:
        f = load_filter(make_spec(module, **kw), cache=module_cache)
        loaded.append(f)
        return f

    yield load
    for f in loaded:
        f.close()


@pytest.fixture
def make_chain(make_spec: Callable[..., FilterSpec],
               module_cache: ModuleCache) -> Iterator[Callable[..., FilterChain]]:
    """make_chain(spec, spec, ...) or make_chain("module", **spec_kw) -> FilterChain."""
    made: list[FilterChain] = []

    def build(*specs: FilterSpec | str, **kw: Any) -> FilterChain:
        resolved = [make_spec(s, **kw) if isinstance(s, str) else s for s in specs]
        chain = FilterChain.from_specs(resolved, cache=module_cache)
        made.append(chain)
        return chain

    yield build
    for c in made:
        c.close()
