"""Compiled-module cache: serialized artifacts on disk, keyed by module and engine."""

from __future__ import annotations

import hashlib
import subprocess
import sys
import time
from pathlib import Path

import wasmtime

from sluice.filters.build import BUILTIN_DIR
from sluice.filters.config import FilterSpec
from sluice.filters.engine import default_engine, wasmtime_version
from sluice.filters.module_cache import _MAGIC, ModuleCache
from sluice.filters.runtime import load_filter

WAT = Path(__file__).resolve().parent / "modules" / "sluice_upper.wat"


def wasm() -> bytes:
    return bytes(wasmtime.wat2wasm(WAT.read_text()))


def test_second_process_load_uses_the_serialized_artifact(tmp_path: Path) -> None:
    data = wasm()
    sha = hashlib.sha256(data).hexdigest()
    first = ModuleCache(default_engine(), tmp_path).load(data)
    assert first.origin == "compiled" and first.sha256 == sha
    artifact = tmp_path / f"{sha}-{default_engine().fingerprint}.cwasm"
    assert artifact.is_file()
    # A fresh cache object stands for a restarted proxy: nothing in memory, artifact on disk.
    again = ModuleCache(default_engine(), tmp_path)
    second = again.load(data)
    assert second.origin == "disk"
    assert again.load(data).origin == "memory"
    # The deserialized module really works.
    store = wasmtime.Store(default_engine().engine)
    store.set_epoch_deadline(1000)
    inst = wasmtime.Instance(store, second.module, [])
    assert inst.exports(store)["sluice_abi_version"](store) == 1  # type: ignore[operator]


def test_corrupt_artifact_is_recompiled_not_loaded(tmp_path: Path) -> None:
    data = wasm()
    cache = ModuleCache(default_engine(), tmp_path)
    cache.load(data)
    path = cache.artifact_path(hashlib.sha256(data).hexdigest())
    blob = bytearray(path.read_bytes())
    blob[len(blob) // 2] ^= 0xFF
    path.write_bytes(bytes(blob))
    assert ModuleCache(default_engine(), tmp_path).load(data).origin == "compiled"
    # ... and the rewritten artifact is good again.
    assert ModuleCache(default_engine(), tmp_path).load(data).origin == "disk"
    path.write_bytes(b"short")
    assert ModuleCache(default_engine(), tmp_path).load(data).origin == "compiled"


def test_key_names_wasmtime_version_and_engine(tmp_path: Path) -> None:
    cache = ModuleCache(default_engine(), tmp_path)
    info = cache.describe()
    assert info["wasmtime"] == wasmtime_version() != "unknown"
    assert f"wasmtime={wasmtime_version()}" in info["engine_settings"]
    assert "epoch_interruption=True" in info["engine_settings"]
    assert cache.artifact_path("ab" * 32).name == f"{'ab' * 32}-{info['engine_fingerprint']}.cwasm"


def test_artifact_from_another_engine_config_is_not_used(tmp_path: Path) -> None:
    data = wasm()
    sha = hashlib.sha256(data).hexdigest()
    cache = ModuleCache(default_engine(), tmp_path)
    # Plant an artifact compiled by an engine without epoch interruption under our key.
    body = bytes(wasmtime.Module(wasmtime.Engine(), data).serialize())
    cache.artifact_path(sha).parent.mkdir(parents=True, exist_ok=True)
    cache.artifact_path(sha).write_bytes(_MAGIC + hashlib.sha256(body).digest() + body)
    assert cache.load(data).origin == "compiled"


def test_unwritable_cache_dir_is_not_fatal(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    cache = ModuleCache(default_engine(), blocker / "sub")
    assert cache.load(wasm()).origin == "compiled"


def test_identity_is_the_module_sha256(tmp_path: Path, wasm_dir: Path) -> None:
    path = wasm_dir / "sluice_upper.wasm"
    f = load_filter(FilterSpec(name="x", module=str(path)), cache_dir=tmp_path)
    assert f.sha256 == hashlib.sha256(path.read_bytes()).hexdigest()
    g = load_filter(FilterSpec(name="y", module=str(path)), cache_dir=tmp_path)
    assert g.origin == "memory"  # same module, compiled once


_LOAD_AT = """\
import sys, time
from pathlib import Path
from sluice.filters.engine import default_engine
from sluice.filters.module_cache import ModuleCache
wasm = Path(sys.argv[2]).read_bytes()
time.sleep(max(0.0, float(sys.argv[3]) - time.time()))
print(ModuleCache(default_engine(), sys.argv[1]).load(wasm).origin)
"""


def test_processes_sharing_a_directory_compile_a_module_once(tmp_path: Path) -> None:
    """Workers of one proxy (or proxies on one host) starting together: one compiles, the
    others wait for its artifact and load it. pii-mask takes ~0.1 s to compile, and the
    processes start it within milliseconds of each other, so without the lock all compile."""
    module = BUILTIN_DIR / "pii-mask.wasm"
    start = time.time() + 3  # after each process has imported wasmtime
    procs = [subprocess.Popen([sys.executable, "-c", _LOAD_AT, str(tmp_path / "cache"),
                               str(module), str(start)], stdout=subprocess.PIPE, text=True)
             for _ in range(3)]
    origins = sorted(p.communicate(timeout=120)[0].strip() for p in procs)
    assert [p.returncode for p in procs] == [0, 0, 0]
    assert origins == ["compiled", "disk", "disk"]
