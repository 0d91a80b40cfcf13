"""Filters built as WebAssembly *components* (world ``sluice:filter/sluice-filter@1.0.0``):
the route Python filters take (componentize-py bundles CPython into a component).

The world (``filters/sdk/python/wit/sluice-filter.wit``) carries the Sluice ABI v1 byte
layouts unchanged, so the host reuses records_io and native_io as they are:

    abi-version: func() -> u32                                  (= 1)
    init: func(config: string) -> result<_, string>             (the filter's config as JSON)
    filter: func(batch: string) -> result<string, string>       (sluice_filter's layouts)
    filter-records: func(batch: string) -> result<string, string>  (sluice_filter_records')

Byte buffers travel as ``string``s in which every character is one byte (Latin-1: code point
n is byte n). The reason is the host binding: wasmtime-py converts a ``list<u8>`` one element
at a time through ctypes, a ``string`` with one C copy.

Sandbox, as for core modules: a component may import **nothing** (componentize-py's
``--stub-wasi`` replaces every WASI import by a trapping stub, and the loader refuses any
import by name), linear memory is capped by the store limiter (one memory per store, so
the cap is the component's whole heap), and every call, instantiation included, has the
filter's epoch deadline plus the per-record budget. After a trap the instance is thrown
away and the next call instantiates afresh (and calls ``init`` again), as for every ABI.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable, Sequence
from typing import Any, Final

import wasmtime
from wasmtime import _bindings as _b
from wasmtime import component as wc

from sluice.codec.records import Buffer
from sluice.filters.abi_base import FilterLoadError
from sluice.filters.config import FilterSpec
from sluice.filters.context import RecordContext, RecordLike
from sluice.filters.decisions import Decision
from sluice.filters.engine import FilterEngine
from sluice.filters.guest import GuestFailure
from sluice.filters.native_io import NativeOutput, decode_native_output, native_input_head
from sluice.filters.records_io import AbiError, decode_filter_output, encode_filter_input

#: The world's version: the package version in its WIT file.
WORLD: Final = "sluice:filter/sluice-filter@1.0.0"
ABI_VERSION: Final = 1
MAX_ERROR_CHARS: Final = 500
RECORD_BUDGET_US: Final = 100
#: Core instances a componentize-py component creates (CPython, libc, its shims): the store
#: limit is generous but finite, like the core ABI's.
MAX_CORE_INSTANCES: Final = 64

_REQUIRED: Final = ("abi-version", "init", "filter", "filter-records")
#: The world sluice-filter-admin's extra export: a component with it can be bound to admin.
_ADMIN: Final = "admin"

_vp = ctypes.c_void_p
_set_deadline = ctypes.CFUNCTYPE(None, _vp, ctypes.c_uint64)(
    ("wasmtime_context_set_epoch_deadline", _b.dll))


def _check_component(component: wc.Component, engine: FilterEngine, who: str) -> bool:
    """Refuses a component Sluice cannot run; whether it exports admin."""
    ty = component.type
    imports = ty.imports(engine.engine)
    if imports:
        names = ", ".join(sorted(imports))
        raise FilterLoadError(
            f"{who}: component imports {names}, which Sluice does not provide (a filter "
            "component may import nothing: build it with componentize-py --stub-wasi, as "
            "`sluice filter build` does)")
    exports = ty.exports(engine.engine)
    for name in _REQUIRED:
        if name not in exports:
            raise FilterLoadError(f"{who}: component lacks export {name!r} (world {WORLD})")
    return _ADMIN in exports


def _bytes_arg(data: Buffer) -> str:
    return bytes(data).decode("latin-1")


class ComponentInstance:
    """A Store + component Instance with one filter's limits (the `depth` the engine's ticker
    watches, like GuestInstance)."""

    def __init__(self, engine: FilterEngine, component: wc.Component, linker: wc.Linker,
                 *, memory_bytes: int, timeout_ms: int) -> None:
        self.engine = engine
        self.memory_bytes = memory_bytes
        self.timeout_ms = timeout_ms
        self.ticks = engine.ticks_for(timeout_ms)
        self.store = wasmtime.Store(engine.engine)
        # memories=1: a componentize-py component links CPython, libc and its shims into one
        # shared memory, so the cap is the component's whole heap (as for core modules).
        self.store.set_limits(memory_size=memory_bytes, table_elements=1_000_000,
                              instances=MAX_CORE_INSTANCES, tables=MAX_CORE_INSTANCES,
                              memories=1)
        self._ctx = ctypes.cast(self.store._context(), _vp).value
        self.dead = False
        self.depth = 0
        engine.register(self)
        self.instance = self._enter(lambda: linker.instantiate(self.store, component), 0,
                                    "instantiation")
        self.funcs: dict[str, wc.Func] = {}
        for name in _REQUIRED:
            func = self.instance.get_func(self.store, name)
            if func is None:
                raise GuestFailure("trap", f"instance lacks export {name!r}")
            self.funcs[name] = func
        admin = self.instance.get_func(self.store, _ADMIN)
        if admin is not None:
            self.funcs[_ADMIN] = admin

    def _enter(self, run: Callable[[], Any], extra_ticks: int, what: str) -> Any:
        if self.dead:
            raise GuestFailure("trap", "instance is dead after an earlier failure")
        _set_deadline(self._ctx, self.ticks + extra_ticks)
        self.depth = 1
        self.engine.wake()  # after raising depth: see engine's docstring
        try:
            return run()
        except (wasmtime.Trap, wasmtime.WasmtimeError) as exc:
            self.dead = True
            raise self._failure(exc, what) from None
        finally:
            self.depth = 0

    def _failure(self, exc: Exception, what: str) -> GuestFailure:
        text = str(exc)
        lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
        cause = next((ln.split("wasm trap:", 1)[1].strip() for ln in reversed(lines)
                      if "wasm trap:" in ln), lines[-1] if lines else "trap")
        if cause == "interrupt":
            return GuestFailure("timeout", f"exceeded the {self.timeout_ms} ms deadline")
        if "memory" in cause and ("limit" in cause or "grow" in cause):
            return GuestFailure("memory", f"{cause} (memory cap of {self.memory_bytes} bytes)")
        return GuestFailure("trap", f"{what}: {cause}" if what == "instantiation" else cause)

    def call(self, name: str, arg: str, records: int = 0) -> Any:
        """Call export `name` with one string argument; the lifted result."""
        func = self.funcs[name]
        extra = int(records * RECORD_BUDGET_US / 1000 / self.engine.tick_ms)
        return self._enter(lambda: func(self.store, arg), extra, name)

    def call0(self, name: str) -> Any:
        func = self.funcs[name]
        return self._enter(lambda: func(self.store), 0, name)


def _unwrap(result: Any, what: str) -> str | None:
    """A lifted ``result<string, string>`` / ``result<_, string>``: the ok payload, or a
    GuestFailure("error") with the guest's message."""
    if isinstance(result, wc.Variant):
        if result.tag == "ok":
            payload = result.payload
            if payload is not None and not isinstance(payload, str):
                raise GuestFailure("invalid-output", f"{what} returned a non-string")
            return payload
        message = result.payload if isinstance(result.payload, str) else "error"
        raise GuestFailure("error", message[:MAX_ERROR_CHARS] or "error")
    if result is None:
        return None
    if isinstance(result, str):
        # result<_, string>: wasmtime-py lifts ok to None and err to its string.
        raise GuestFailure("error", result[:MAX_ERROR_CHARS] or "error")
    raise GuestFailure("invalid-output", f"{what} returned {type(result).__name__}")


def _out_bytes(text: str | None, what: str) -> bytes:
    if text is None:
        raise GuestFailure("invalid-output", f"{what} returned nothing")
    try:
        return text.encode("latin-1")
    except UnicodeEncodeError:
        raise GuestFailure("invalid-output",
                           f"{what} returned a character above U+00FF (buffers are Latin-1 "
                           "strings: one character per byte)") from None


class ComponentAbi:
    """The AbiRunner surface LoadedFilter uses, for a Sluice filter component."""

    abi: Final = "sluice-v1-component"
    has_native: Final = True

    def __init__(self, engine: FilterEngine, component: wc.Component, spec: FilterSpec,
                 who: str) -> None:
        self.engine = engine
        self.component = component
        self.spec = spec
        self.who = who
        self.supports_admin = _check_component(component, engine, who)
        self.capabilities = frozenset({"init", "last_error", "records"}
                                      | ({"admin"} if self.supports_admin else set()))
        self.linker = wc.Linker(engine.engine)
        self.config_json = spec.config_json
        self._guest: ComponentInstance | None = None
        self.instantiations = 0

    def guest(self) -> ComponentInstance:
        """The live instance, instantiating (and initialising) it when needed."""
        guest = self._guest
        if guest is None or guest.dead:
            self._guest = None
            guest = ComponentInstance(self.engine, self.component, self.linker,
                                      memory_bytes=self.spec.max_memory_mb * 1024 * 1024,
                                      timeout_ms=self.spec.timeout_ms)
            self.instantiations += 1
            version = guest.call0("abi-version")
            if version != ABI_VERSION:
                raise FilterLoadError(f"{self.who}: component speaks Sluice ABI version "
                                      f"{version}, this host supports {ABI_VERSION}")
            try:
                _unwrap(guest.call("init", self.config_json.decode("utf-8")), "init")
            except GuestFailure as exc:
                if exc.kind != "error":
                    raise
                raise FilterLoadError(f"{self.who}: init rejected the config: "
                                      f"{exc.message}") from None
            self._guest = guest
        return guest

    def run(self, ctx: RecordContext, records: Sequence[RecordLike], offset_base: int,
            timestamp_base: int) -> tuple[list[Decision], dict[str, int]]:
        data = encode_filter_input(ctx, records, offset_base, timestamp_base)
        out = _out_bytes(_unwrap(self.guest().call("filter", _bytes_arg(data), len(records)),
                                 "filter"), "filter")
        try:
            return decode_filter_output(out, len(records))
        except AbiError as exc:
            raise GuestFailure("invalid-output", str(exc)) from None

    def run_native(self, ctx: RecordContext, records: Buffer, count: int, offset_base: int,
                   timestamp_base: int) -> NativeOutput:
        """``filter-records`` over one records section (GuestFailure on any failure)."""
        head = native_input_head(ctx, count, offset_base, timestamp_base)
        arg = head.decode("latin-1") + _bytes_arg(records)
        out = _out_bytes(_unwrap(self.guest().call("filter-records", arg, count),
                                 "filter-records"), "filter-records")
        try:
            return decode_native_output(out, count)
        except AbiError as exc:
            raise GuestFailure("invalid-output", str(exc)) from None

    def admin(self, request: bytes) -> bytes:
        """One admin resource: JSON (UTF-8) in and out, through the world's ``admin``."""
        if not self.supports_admin:
            raise GuestFailure("error", f"world {WORLD} has no admin entry point")
        text = _unwrap(self.guest().call(_ADMIN, request.decode("utf-8")), _ADMIN)
        if text is None:
            raise GuestFailure("invalid-output", "admin returned nothing")
        return text.encode("utf-8")

    def discard(self) -> None:
        self._guest = None

    def close(self) -> None:
        self._guest = None
