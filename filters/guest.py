"""One sandboxed instance of a filter module, and the fast way to call into it.

`GuestInstance` owns a wasmtime Store (memory cap via the store limiter, deadline via the
engine's epoch), the instance, and its exported linear memory. Buffers cross the boundary with
``ctypes.memmove`` / ``ctypes.string_at`` on the memory's data pointer, bounds-checked against
its current size on every access (the memory can move when it grows).

`RawFunc` calls an export through wasmtime's unchecked C entry point
(``wasmtime_func_call_unchecked``) bound with plain ``c_void_p`` argument types: wasmtime-py's
``Func.__call__`` re-reads the function type and boxes every argument on each call (~30k calls/s
here) while this path reaches several hundred thousand calls/s. "Unchecked" means wasmtime
trusts the argument array: RawFunc therefore verifies the export's signature once, at bind time,
and only accepts i32/i64 parameters and at most one i32/i64 result.

Every guest failure surfaces as `GuestFailure` with a `kind`: ``trap``, ``timeout`` (epoch
deadline), ``memory`` (trap while the memory cap was reached), ``host`` (a host function raised)
or ``invalid-output``/``error`` (raised by the ABI layers). After any trap the instance must be
discarded: its memory and globals may be half-updated.
"""

from __future__ import annotations

import ctypes
from typing import Any, Final

import wasmtime
import wasmtime._func as _wt_func
from wasmtime import _bindings as _b

from sluice.codec.raw_memory import view_at
from sluice.filters.engine import FilterEngine

WASM_PAGE: Final = 65536

_vp = ctypes.c_void_p
# Same C symbols wasmtime-py binds, re-bound with untyped pointers: ctypes then skips the
# per-argument type conversion that dominates the cost of a tiny call.
_call_unchecked = ctypes.CFUNCTYPE(_vp, _vp, _vp, _vp, ctypes.c_size_t, _vp)(
    ("wasmtime_func_call_unchecked", _b.dll))
_set_deadline = ctypes.CFUNCTYPE(None, _vp, ctypes.c_uint64)(
    ("wasmtime_context_set_epoch_deadline", _b.dll))
_memory_data = ctypes.CFUNCTYPE(_vp, _vp, _vp)(("wasmtime_memory_data", _b.dll))
_memory_size = ctypes.CFUNCTYPE(ctypes.c_size_t, _vp, _vp)(("wasmtime_memory_data_size", _b.dll))
#: The addresses of wasmtime_memory_data and wasmtime_memory_data_size, for native code that
#: reads a guest's memory without a trip through Python (filters/host_sha256.c).
MEMORY_DATA_FN: Final = int(ctypes.cast(_memory_data, _vp).value or 0)
MEMORY_SIZE_FN: Final = int(ctypes.cast(_memory_size, _vp).value or 0)
#: The addresses of wasmtime_func_call_unchecked and wasmtime_context_set_epoch_deadline, for
#: native code that calls an export itself (`RawFunc.native_parts`, native_call.NativeCall).
CALL_UNCHECKED_FN: Final = int(ctypes.cast(_call_unchecked, _vp).value or 0)
SET_DEADLINE_FN: Final = int(ctypes.cast(_set_deadline, _vp).value or 0)

_I32 = "i32"
_I64 = "i64"


class GuestFailure(Exception):
    """A guest call or its output failed. `kind`: trap, timeout, memory, host, error,
    invalid-output. The message never contains record data."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(f"{kind}: {message}")
        self.kind = kind
        self.message = message


def valtype_name(t: wasmtime.ValType) -> str:
    return str(t)


def signature(func_type: wasmtime.FuncType) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(param type names, result type names) of a function type, e.g. (("i32",), ("i64",))."""
    return (tuple(valtype_name(p) for p in func_type.params),
            tuple(valtype_name(r) for r in func_type.results))


def format_signature(sig: tuple[tuple[str, ...], tuple[str, ...]]) -> str:
    params, results = sig
    res = results[0] if len(results) == 1 else "(" + ", ".join(results) + ")"
    return f"({', '.join(params)}) -> {res}"


def trap_text(trap: wasmtime.Trap) -> str:
    """The cause line of a trap ("wasm `unreachable` instruction executed"), without the
    backtrace."""
    lines = [ln.strip() for ln in (trap.message or "").splitlines() if ln.strip()]
    for ln in reversed(lines):
        if "wasm trap:" in ln:
            return ln.split("wasm trap:", 1)[1].strip()
    code = trap.trap_code
    if lines:
        return lines[-1]
    return code.name.lower() if code is not None else "trap"


def view_in(base: int, size: int, ptr: int, n: int) -> memoryview:
    """`GuestInstance.view` on a memory of `size` bytes at `base` in this process."""
    if ptr < 0 or n < 0 or ptr + n > size:
        raise GuestFailure("invalid-output", f"guest buffer {ptr}+{n} is outside linear memory")
    return view_at(base + ptr, n) if n else memoryview(b"")


class GuestInstance:
    """A Store + Instance of one module with the limits of one filter."""

    def __init__(self, engine: FilterEngine, module: wasmtime.Module, linker: wasmtime.Linker,
                 *, memory_bytes: int, timeout_ms: int) -> None:
        self.engine = engine
        self.memory_bytes = memory_bytes
        self.timeout_ms = timeout_ms
        self.ticks = engine.ticks_for(timeout_ms)
        # Added to `ticks` for the next outermost call: a batch call gets time in proportion to
        # its records (set by the batch ABI before each call, 0 otherwise).
        self.extra_ticks = 0
        self.store = wasmtime.Store(engine.engine)
        # memories=1 so that multi-memory cannot multiply the cap.
        self.store.set_limits(memory_size=memory_bytes, table_elements=1_000_000,
                              instances=4, tables=4, memories=1)
        self._ctx = ctypes.cast(self.store._context(), _vp).value
        self.dead = False
        self.depth = 0
        engine.register(self)
        # Instantiation runs the module's start function: same deadline as any call.
        _set_deadline(self._ctx, self.ticks)
        self.depth = 1
        engine.wake()
        try:
            self.instance = linker.instantiate(self.store, module)
            self._initialize_reactor()
        except wasmtime.Trap as exc:
            raise self._trap_failure(exc) from None
        except wasmtime.WasmtimeError as exc:
            raise GuestFailure("trap", f"instantiation failed: {exc}") from None
        finally:
            self.depth = 0
        self.exports = self.instance.exports(self.store)
        mem = self.exports.get("memory")
        self.memory: wasmtime.Memory | None = mem if isinstance(mem, wasmtime.Memory) else None
        self._mem_addr = ctypes.addressof(self.memory._memory) if self.memory is not None else 0
        #: The two handles wasmtime's C API takes for this memory (MEMORY_DATA_FN's arguments).
        self.store_context: int = self._ctx or 0
        self.memory_handle: int = self._mem_addr

    def _initialize_reactor(self) -> None:
        """Run a WASI reactor's `_initialize` (Go's runtime and package initialisers, wasi-libc's
        constructors) once, before any other export: the WASI convention for modules without a
        `_start`. It runs under the instantiation deadline."""
        init = self.instance.exports(self.store).get("_initialize")
        if isinstance(init, wasmtime.Func):
            if signature(init.type(self.store)) != ((), ()):
                raise GuestFailure("trap", "export _initialize must take and return nothing")
            init(self.store)

    # -- memory -------------------------------------------------------------------------

    def memory_size(self) -> int:
        if self.memory is None:
            return 0
        return int(_memory_size(self._ctx, self._mem_addr))

    def _base(self) -> int:
        return int(_memory_data(self._ctx, self._mem_addr) or 0)

    # write, read and view call wasmtime's two memory functions themselves rather than
    # `memory_size` and `_base`: two Python calls fewer each, twice per filtered batch.
    def write(self, ptr: int, data: bytes | bytearray | memoryview) -> None:
        """Copy `data` into guest memory at `ptr` (GuestFailure if out of bounds)."""
        n = len(data)
        size = _memory_size(self._ctx, self._mem_addr) if self.memory is not None else 0
        if ptr < 0 or ptr + n > size:
            raise GuestFailure("invalid-output",
                               f"guest buffer {ptr}+{n} is outside linear memory")
        if not n:
            return
        base = _memory_data(self._ctx, self._mem_addr) or 0
        if isinstance(data, bytes):
            ctypes.memmove(base + ptr, data, n)
        else:
            # Views (a decompressed records section) go in without an intermediate copy.
            view_at(base + ptr, n)[:] = memoryview(data).cast("B")

    def read(self, ptr: int, n: int) -> bytes:
        """Copy `n` bytes out of guest memory at `ptr` (GuestFailure if out of bounds)."""
        if ptr < 0 or n < 0 or ptr + n > self.memory_size():
            raise GuestFailure("invalid-output",
                               f"guest buffer {ptr}+{n} is outside linear memory")
        return ctypes.string_at(self._base() + ptr, n) if n else b""

    def view(self, ptr: int, n: int) -> memoryview:
        """A view of `n` bytes of guest memory at `ptr`, without a copy (GuestFailure if out
        of bounds). Valid only until the next call into the guest or the next growth of its
        memory: the caller reads it under the filter's lock, at once, and keeps nothing of it
        (`native_io.decode_native_output` copies what it keeps)."""
        if self.memory is None:
            return view_in(0, 0, ptr, n)
        return view_in(_memory_data(self._ctx, self._mem_addr) or 0,
                       _memory_size(self._ctx, self._mem_addr), ptr, n)

    def address(self, ptr: int, n: int) -> int:
        """Where the `n` bytes of guest memory at `ptr` lie in this process (GuestFailure if
        out of bounds), for native code that writes them in place (`lz4_section`). Valid
        only until the next call into the guest or the next growth of its memory."""
        if ptr < 0 or n < 0 or ptr + n > self.memory_size():
            raise GuestFailure("invalid-output",
                               f"guest buffer {ptr}+{n} is outside linear memory")
        return self._base() + ptr

    def grow(self, pages: int) -> int:
        """Grow the memory by `pages`; return the old size in bytes (GuestFailure on cap)."""
        if self.memory is None:
            raise GuestFailure("error", "module exports no memory")
        old = self.memory_size()
        try:
            self.memory.grow(self.store, pages)
        except wasmtime.WasmtimeError:
            raise GuestFailure("memory", f"cannot grow memory by {pages} pages "
                                         f"(cap {self.memory_bytes} bytes)") from None
        return old

    # -- calls --------------------------------------------------------------------------

    def func(self, name: str) -> RawFunc | None:
        """A RawFunc for export `name`, or None when there is no such function export."""
        item = self.exports.get(name)
        if not isinstance(item, wasmtime.Func):
            return None
        return RawFunc(self, item, name)

    def _trap_failure(self, trap: wasmtime.Trap) -> GuestFailure:
        code = trap.trap_code
        if code == wasmtime.TrapCode.INTERRUPT:
            return GuestFailure("timeout", f"exceeded the {self.timeout_ms} ms deadline")
        host_exc = _wt_func.LAST_EXCEPTION
        if host_exc is not None:
            # A Python host function raised: wasmtime-py parks the exception in a global that
            # its checked call path would re-raise later; take it (and clear it) here.
            _wt_func.LAST_EXCEPTION = None
            if isinstance(host_exc, GuestFailure):
                return host_exc
            return GuestFailure("host", f"host function failed: {type(host_exc).__name__}: "
                                        f"{host_exc}")
        text = trap_text(trap)
        near = min(16 * WASM_PAGE, self.memory_bytes // 4)
        if self.memory is not None and self.memory_size() > self.memory_bytes - near:
            # wasmtime does not say that a memory.grow was refused; a trap with memory within
            # one allocator step (<= 1 MiB, <= a quarter of the cap) of the cap is the
            # out-of-memory signature.
            return GuestFailure("memory", f"{text} (memory cap of {self.memory_bytes} "
                                          "bytes reached)")
        return GuestFailure("trap", text)

    def fail_from(self, err_addr: int | None, trap_cell: ctypes.c_void_p) -> GuestFailure:
        """Turn the error/trap out-values of an unchecked call into a GuestFailure."""
        self.dead = True
        if trap_cell.value:
            trap = wasmtime.Trap._from_ptr(
                ctypes.cast(trap_cell.value, ctypes.POINTER(_b.wasm_trap_t)))
            trap_cell.value = None
            return self._trap_failure(trap)
        err = wasmtime.WasmtimeError._from_ptr(
            ctypes.cast(err_addr or 0, ctypes.POINTER(_b.wasmtime_error_t)))
        if _wt_func.LAST_EXCEPTION is not None:
            exc = _wt_func.LAST_EXCEPTION
            _wt_func.LAST_EXCEPTION = None
            if isinstance(exc, GuestFailure):
                return exc
            return GuestFailure("host", f"host function failed: {type(exc).__name__}: {exc}")
        return GuestFailure("trap", str(err).splitlines()[0])


class RawFunc:
    """An export bound for fast calls: ``f(*int_args) -> int | None``.

    Raises GuestFailure on trap, timeout or host error (and marks the instance dead).
    """

    __slots__ = ("_args", "_buf", "_fn", "_fn_addr", "_guest", "_i32_result", "_n",
                 "_params", "_res_i32", "_trap", "_trap_addr", "has_result", "name", "sig")

    def __init__(self, guest: GuestInstance, func: wasmtime.Func, name: str) -> None:
        self.sig = signature(func.type(guest.store))
        params, results = self.sig
        if any(p not in (_I32, _I64) for p in params) or len(results) > 1 or any(
                r not in (_I32, _I64) for r in results):
            raise GuestFailure("error", f"export {name!r} has unsupported signature "
                                        f"{format_signature(self.sig)}")
        self.name = name
        self._guest = guest
        self._fn = func._func  # keep the struct alive: its address is passed to C
        self._fn_addr = ctypes.addressof(func._func)
        self._params = params
        self._n = max(len(params), len(results), 1)
        # wasmtime_val_raw_t is a 16-byte union; view the array as int64 pairs, arg i at [2i].
        self._buf = (ctypes.c_int64 * (2 * self._n))()
        self._args = ctypes.addressof(self._buf)
        self._res_i32 = ctypes.c_int32.from_address(self._args)
        self.has_result = bool(results)
        self._i32_result = bool(results) and results[0] == _I32
        self._trap = ctypes.c_void_p()
        self._trap_addr = ctypes.addressof(self._trap)

    def native_parts(self) -> tuple[int, int, int, int]:
        """(func, args, nargs, trap): the addresses `wasmtime_func_call_unchecked` takes for
        this export, for native code that makes the call itself; a trap it reports through
        `trap` is turned into a GuestFailure by ``guest.fail_from(error, self.trap_cell)``."""
        return self._fn_addr, self._args, self._n, self._trap_addr

    @property
    def trap_cell(self) -> ctypes.c_void_p:
        return self._trap

    def __call__(self, *args: int) -> int:
        guest = self._guest
        if guest.dead:
            raise GuestFailure("trap", "instance is dead after an earlier failure")
        buf = self._buf
        if len(args) != len(self._params):
            raise TypeError(f"{self.name} takes {len(self._params)} arguments")
        for i, value in enumerate(args):
            # i32 arguments: wasmtime reads the low 32 bits (little-endian union).
            buf[2 * i] = value
        # Only the outermost call arms the deadline: a host function calling back into the
        # guest (Connect ABI getters call alloc) must not extend it.
        if not guest.depth:
            _set_deadline(guest._ctx, guest.ticks + guest.extra_ticks)
            guest.depth = 1
            # `guest.engine.wake()` written out (a call fewer per guest call), after raising
            # depth: see engine's docstring.
            engine = guest.engine
            engine.calls += 1
            if engine.idle:
                engine._wake.set()
        else:
            guest.depth += 1
        try:
            err = _call_unchecked(guest._ctx, self._fn_addr, self._args, self._n,
                                  self._trap_addr)
        finally:
            guest.depth -= 1
        if err or self._trap.value:
            raise guest.fail_from(err, self._trap)
        if not self.has_result:
            return 0
        return self._res_i32.value if self._i32_result else buf[0]


Signature = tuple[tuple[str, ...], tuple[str, ...]]


def export_signatures(module: wasmtime.Module) -> dict[str, Signature]:
    """Function exports of a compiled module and their signatures."""
    out: dict[str, Signature] = {}
    for exp in module.exports:
        ty: Any = exp.type
        if isinstance(ty, wasmtime.FuncType):
            out[exp.name] = signature(ty)
    return out


def exports_memory(module: wasmtime.Module) -> bool:
    return any(exp.name == "memory" and isinstance(exp.type, wasmtime.MemoryType)
               for exp in module.exports)
