"""Compiled-module cache: one wasmtime Module per filter module, kept in memory and on disk.

A filter's identity is the sha256 of its module bytes. Compiling costs milliseconds per module;
deserializing a precompiled artifact costs tens of microseconds, so artifacts are written to
``cache_dir`` (default ``~/.cache/sluice/modules``, or ``$SLUICE_MODULE_CACHE``) as
``<sha256>-<engine fingerprint>.cwasm``. The fingerprint covers the wasmtime version, the
machine and every engine setting that changes code, so an upgrade never loads a stale artifact.

Deserializing trusts its input (it is native code), so each file starts with the sha256 of the
artifact that follows; a truncated or altered file is recompiled, never loaded. Files are
written to a temporary name and renamed, so a crash never leaves half an artifact. Processes
sharing a directory (``sluice serve --workers N``, several proxies on one host) compile a
module once between them: a compile holds an advisory lock on ``<artifact>.lock`` and the
others, waiting on it, then load the artifact it wrote.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import structlog
import wasmtime
from wasmtime import component as wc

from sluice.filters.engine import FilterEngine, wasmtime_version

log = structlog.get_logger("sluice.filters.cache")

_MAGIC = b"SLUICEM1"


_COMPONENT_MAGIC = b"SLUICEC1"


def _is_component(wasm: bytes) -> bool:
    """Layer 1 of the binary format (a component), not layer 0 (a core module)."""
    return len(wasm) >= 8 and wasm[:4] == b"\0asm" and wasm[6:8] == b"\x01\x00"


def _compile(engine: FilterEngine, wasm: bytes) -> wasmtime.Module | wc.Component:
    if _is_component(wasm):
        return wc.Component(engine.engine, wasm)
    return wasmtime.Module(engine.engine, wasm)


def _deserialize(engine: FilterEngine, body: bytes) -> wasmtime.Module | wc.Component:
    # A component's artifact is tagged in front: the two deserializers refuse each other's.
    if body.startswith(_COMPONENT_MAGIC):
        return wc.Component.deserialize(engine.engine, body[len(_COMPONENT_MAGIC):])
    return wasmtime.Module.deserialize(engine.engine, body)


def default_cache_dir() -> Path:
    """``$SLUICE_MODULE_CACHE`` or ``~/.cache/sluice/modules``."""
    env = os.environ.get("SLUICE_MODULE_CACHE")
    if env:
        return Path(env).expanduser()
    base = os.environ.get("XDG_CACHE_HOME")
    root = Path(base).expanduser() if base else Path.home() / ".cache"
    return root / "sluice" / "modules"


@dataclass(frozen=True, slots=True)
class CompiledModule:
    """A compiled module and where it came from (``compiled``, ``disk`` or ``memory``).
    `module` is a `wasmtime.component.Component` when the bytes are a component (Python
    filters: filters/abi_component.py)."""

    module: wasmtime.Module | wc.Component
    sha256: str
    origin: str
    load_seconds: float


class ModuleCache:
    """Compile-once cache keyed by sha256(module) + wasmtime version + engine fingerprint.

    `cache_dir=None` uses the default directory; `persist=False` keeps artifacts in memory
    only. Failing to write the disk cache (read-only home, full disk) is logged, not fatal.
    """

    def __init__(self, engine: FilterEngine, cache_dir: str | Path | None = None,
                 persist: bool = True) -> None:
        self.engine = engine
        self.cache_dir = Path(cache_dir) if cache_dir is not None else default_cache_dir()
        self.persist = persist
        self._memory: dict[str, CompiledModule] = {}
        self._lock = threading.Lock()

    def artifact_path(self, sha256: str) -> Path:
        return self.cache_dir / f"{sha256}-{self.engine.fingerprint}.cwasm"

    def load(self, wasm: bytes) -> CompiledModule:
        """The compiled Module for `wasm` (raises wasmtime.WasmtimeError if it does not compile)."""
        sha = hashlib.sha256(wasm).hexdigest()
        with self._lock:
            hit = self._memory.get(sha)
            if hit is not None:
                return CompiledModule(hit.module, sha, "memory", 0.0)
            compiled = self._from_disk(sha)
            if compiled is None:
                with self._compile_lock(sha):
                    # Another process may have compiled it while this one waited.
                    compiled = self._from_disk(sha)
                    if compiled is None:
                        started = time.perf_counter()
                        module = _compile(self.engine, wasm)
                        compiled = CompiledModule(module, sha, "compiled",
                                                  time.perf_counter() - started)
                        self._to_disk(sha, module)
            self._memory[sha] = compiled
            return compiled

    @contextlib.contextmanager
    def _compile_lock(self, sha: str) -> Iterator[None]:
        """Holds the artifact's lock file (flock: released if the holder dies) while the
        module is compiled and written. Without a writable directory, no lock: each process
        compiles, as it would anyway."""
        if not self.persist:
            yield
            return
        path = self.artifact_path(sha).with_suffix(".lock")
        try:
            self.cache_dir.mkdir(parents=True, exist_ok=True)
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError:
            yield
            return
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # releases the lock

    def _from_disk(self, sha: str) -> CompiledModule | None:
        if not self.persist:
            return None
        path = self.artifact_path(sha)
        try:
            blob = path.read_bytes()
        except FileNotFoundError:
            return None
        except OSError as exc:
            log.warning("module_cache_unreadable", path=str(path), error=str(exc))
            return None
        header_len = len(_MAGIC) + 32
        body = blob[header_len:]
        if (len(blob) <= header_len or blob[:len(_MAGIC)] != _MAGIC
                or hashlib.sha256(body).digest() != blob[len(_MAGIC):header_len]):
            log.warning("module_cache_corrupt", path=str(path), sha256=sha)
            return None
        started = time.perf_counter()
        try:
            module = _deserialize(self.engine, body)
        except wasmtime.WasmtimeError as exc:
            # Another wasmtime build or setting produced it: recompile and overwrite.
            log.info("module_cache_incompatible", path=str(path), error=str(exc))
            return None
        return CompiledModule(module, sha, "disk", time.perf_counter() - started)

    def _to_disk(self, sha: str, module: wasmtime.Module | wc.Component) -> None:
        if not self.persist:
            return
        path = self.artifact_path(sha)
        try:
            body = bytes(module.serialize())
            if isinstance(module, wc.Component):
                body = _COMPONENT_MAGIC + body
            self.cache_dir.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=self.cache_dir, prefix=".tmp-", suffix=".cwasm")
            try:
                with os.fdopen(fd, "wb") as fh:
                    fh.write(_MAGIC + hashlib.sha256(body).digest() + body)
                os.replace(tmp, path)
            except BaseException:
                Path(tmp).unlink(missing_ok=True)
                raise
        except (OSError, wasmtime.WasmtimeError) as exc:
            log.warning("module_cache_write_failed", path=str(path), error=str(exc))

    def describe(self) -> dict[str, str]:
        """What the cache key is made of (for docs, logs and `sluice filter` output)."""
        return {
            "cache_dir": str(self.cache_dir),
            "wasmtime": wasmtime_version(),
            "engine_fingerprint": self.engine.fingerprint,
            "engine_settings": self.engine.fingerprint_text,
        }
