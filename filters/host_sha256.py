"""The host side of the `host_sha256` capability (docs/FILTER_ABI.md): after a guest's
``sluice_filter_records`` call, one native call (filters/host_sha256.c) hashes every request
the guest listed and writes the hex digests into the output's records section in guest memory.

`AVAILABLE` is False when the native module was not built (``scripts/dev.sh install`` builds
it): the host then never offers the capability, and guests hash in their own code.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final

from sluice.codec.records import Buffer
from sluice.filters.guest import (
    CALL_UNCHECKED_FN,
    MEMORY_DATA_FN,
    MEMORY_SIZE_FN,
    SET_DEADLINE_FN,
    GuestFailure,
    GuestInstance,
    RawFunc,
    view_in,
)

try:
    from sluice.filters._host_sha256 import (  # type: ignore[import-not-found, unused-ignore]
        ffi as _ffi,
    )
    from sluice.filters._host_sha256 import (  # type: ignore[import-not-found, unused-ignore]
        lib as _lib,
    )
    AVAILABLE: Final = True
except ImportError:  # not built: the capability is not offered
    _ffi = _lib = None
    AVAILABLE = False  # type: ignore[misc]

#: Limits the host enforces on one call's table (see host_sha256.c).
MAX_ENTRIES: Final = 1 << 20
MAX_BYTES: Final = 4 << 20
#: Entries per record of the batch (the guest's deadline grows per record, the pass does not).
MAX_PER_RECORD: Final = 64
#: Bytes of one table entry: u32 prefix_ptr, prefix_len, data_ptr, data_len, out_ptr.
ENTRY_SIZE: Final = 20

_ERRORS: Final = {
    -1: "its hash request slot lies outside linear memory",
    -2: "its hash request table lies outside linear memory",
    -3: f"more than {MAX_ENTRIES} hash requests, or {MAX_PER_RECORD} per record",
    -4: "hash requests for an output without a records section",
    -5: "its hash request table overlaps the output's records section",
    -6: "a hash request's span lies outside linear memory or inside the records section",
    -7: "a hash request's digest lies outside the records section or out of order",
    -8: "a hash request's digest does not replace 64 '0' bytes",
    -9: f"hash requests over {MAX_BYTES} bytes",
}


#: ``hs_run(mem_addr, mem_size, slot, out_ptr, out_len, records)``: the number of digests
#: written, or a negative code (`error_text`) with nothing written. None when not built.
hs_run: Callable[[int, int, int, int, int, int], int] | None = (
    _lib.hs_run if AVAILABLE else None)
#: ``hs_run_wasm(memory_data_fn, memory_size_fn, store_context, memory, slot, out_ptr,
#: out_len, records)``: `hs_run` on a wasmtime memory, whose address and size the C code asks
#: wasmtime for (`GuestInstance.hash_requests`). None when not built.
hs_run_wasm: Callable[[int, int, int, int, int, int, int, int], int] | None = (
    _lib.hs_run_wasm if AVAILABLE else None)

#: ``hs_call_run(call, ticks, ptr, len, head, head_len, rest, rest_len, records)``:
#: `HashedCall`'s native half (the input written, the export called, then `hs_run`): the number
#: of digests written, 0 when the export returned an error, CALL_FAILED, CALL_INPUT or a
#: negative code (`error_text`). None when not built.
hs_call_run: Callable[[Any, int, int, int, Any, int, Any, int, int], int] | None = (
    _lib.hs_call_run if AVAILABLE else None)

#: ``hs_set_level(cap)``: caps the code path (0 OpenSSL, 1 SHA-NI, 2 SHA-NI with AVX-512,
#: the default 2) and returns the path then in use, for tests. None when not built.
hs_set_level: Callable[[int], int] | None = _lib.hs_set_level if AVAILABLE else None


#: hs_call_run's answer when the guest call failed (an error or a trap; the pass not run).
CALL_FAILED: Final = -100
#: hs_call_run's answer when the input did not fit in guest memory (nothing written or run).
CALL_INPUT: Final = -101
#: hs_call_run's answer when sluice_alloc returned 0 (nothing written or run).
CALL_ALLOC: Final = -102


class HashedCall:
    """A guest's ``sluice_filter_records`` export and the pass after it in one native call
    (`hs_call_run`), which also asks sluice_alloc for the input's place and writes it there:
    before, the alloc, the input's writes, the records call through RawFunc, `hs_run_wasm`
    and the output's view were ten crossings and the Python between them. The calls are
    armed as `RawFunc.__call__` arms them (the instance's depth raised, the ticker woken,
    each deadline set by an outermost call) and fail as they did (GuestFailure from
    `GuestInstance.fail_from`); an alloc that returns 0 and an input outside memory fail as
    in `SluiceAbi.run_native` and `GuestInstance.write`, a refused table is
    GuestFailure("invalid-output") as after `hs_run_wasm`. Only where `AVAILABLE`."""

    __slots__ = ("_c", "_guest", "_run", "_trap")

    def __init__(self, func: RawFunc, alloc: RawFunc, guest: GuestInstance, slot: int) -> None:
        assert _ffi is not None and hs_call_run is not None
        if func.sig != (("i32", "i32"), ("i64",)) or alloc.sig != (("i32",), ("i32",)):
            raise TypeError(f"{func.name} and {alloc.name}: not a records export and an alloc")
        c: Any = _ffi.new("hs_call *")
        c.func, c.args, c.nargs, c.trap = func.native_parts()
        c.call_fn, c.deadline_fn = CALL_UNCHECKED_FN, SET_DEADLINE_FN
        c.data_fn, c.size_fn = MEMORY_DATA_FN, MEMORY_SIZE_FN
        c.store, c.memory, c.slot = guest.store_context, guest.memory_handle, slot
        c.alloc, c.alloc_args, c.alloc_nargs, _ = alloc.native_parts()
        c.alloc_ticks = guest.ticks  # as RawFunc arms sluice_alloc: no extra ticks
        self._c = c
        self._guest = guest
        self._trap = func.trap_cell
        self._run = hs_call_run

    def __call__(self, ptr: int, size: int, records: int, extra_ticks: int,
                 head: bytes = b"", rest: Buffer = b"") -> int:
        """The export's result for the `size` bytes of input at `ptr` (`records` records),
        its hash requests done when it is >= 0; `ptr` 0: sluice_alloc(`size`) first, as a
        call of its own (its deadline without `extra_ticks`). `head` and then `rest` are
        written at `ptr` first (the caller wrote the input itself when they are empty);
        `extra_ticks` on top of the instance's deadline."""
        guest = self._guest
        if guest.dead:
            raise GuestFailure("trap", "instance is dead after an earlier failure")
        assert _ffi is not None
        # cffi passes bytes as they are; other buffers (views of a request) by address.
        data = rest if isinstance(rest, bytes) else _ffi.from_buffer(rest)
        if not guest.depth:
            ticks = guest.ticks + extra_ticks
            guest.depth = 1
            engine = guest.engine  # `engine.wake()` written out, as in RawFunc.__call__
            engine.calls += 1
            if engine.idle:
                engine._wake.set()
        else:
            ticks = 0  # a nested call keeps the outermost call's deadline
            guest.depth += 1
        c = self._c
        try:
            done = self._run(c, ticks, ptr, size, head, len(head), data, len(rest), records)
        finally:
            guest.depth -= 1
        if done < 0:
            if done == CALL_FAILED:
                raise guest.fail_from(c.error, self._trap)
            if done == CALL_ALLOC:
                raise GuestFailure("memory", f"sluice_alloc({size}) returned 0")
            if done == CALL_INPUT:
                raise GuestFailure("invalid-output", f"guest buffer {ptr or c.ptr}+"
                                   f"{len(head) + len(rest)} is outside linear memory")
            raise GuestFailure("invalid-output", error_text(done))
        return int(c.result)

    def view(self, ptr: int, n: int) -> memoryview:
        """`GuestInstance.view` right after a call, from the memory's place and size then."""
        c = self._c
        return view_in(c.base, c.size, ptr, n)


def error_text(code: int) -> str:
    """What a negative result of `hs_run` means (for the filter error)."""
    return _ERRORS.get(code, f"hash requests refused ({code})")
