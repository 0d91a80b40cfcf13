"""A Sluice-ABI guest's ``sluice_filter_records`` call in one native crossing
(filters/native_call.c, `NativeCall`): sluice_alloc, the input's write into guest memory, the
deadline, the export's call and, for a guest that took the ``host_sha256`` capability, the
host's SHA-256 pass (host_sha256.HS_RUN_FN) after it; the memory's place afterwards for the
output's view.

`AVAILABLE` is False when the native module was not built (``scripts/dev.sh install`` builds
it): abi_sluice.py then makes the call step by step through ctypes (same results), and does
not offer host_sha256 (its pass runs only inside this call).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final

from sluice.codec.raw_memory import view_at
from sluice.codec.records import Buffer
from sluice.filters import host_sha256
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
    from sluice.filters._native_call import (  # type: ignore[import-not-found, unused-ignore]
        ffi as _ffi,
    )
    from sluice.filters._native_call import (  # type: ignore[import-not-found, unused-ignore]
        lib as _lib,
    )
    AVAILABLE: Final = True
except ImportError:  # not built: the records call goes step by step
    _ffi = _lib = None
    AVAILABLE = False  # type: ignore[misc]

#: ``nc_call_run(call, ticks, ptr, len, head, head_len, rest, rest_len, records)``:
#: `NativeCall`'s native half: 0 (no pass, or the export returned an error), the pass's number
#: of digests or its negative code (`host_sha256.error_text`), CALL_FAILED, CALL_INPUT or
#: CALL_ALLOC. None when not built.
nc_call_run: Callable[[Any, int, int, int, Any, int, Any, int, int], int] | None = (
    _lib.nc_call_run if AVAILABLE else None)

#: nc_call_run's answer when a guest call failed (an error or a trap; the pass not run).
CALL_FAILED: Final = -100
#: nc_call_run's answer when the input did not fit in guest memory (nothing written or run).
CALL_INPUT: Final = -101
#: nc_call_run's answer when sluice_alloc returned 0 (nothing written or run).
CALL_ALLOC: Final = -102


class NativeCall:
    """A guest's ``sluice_filter_records`` export in one native call (`nc_call_run`), which
    also asks sluice_alloc for the input's place, writes the input there and, with a hash
    request `slot` (not 0), runs the host's SHA-256 pass after a successful call: step by
    step these were up to ten crossings and the Python between them. The calls are armed as
    `RawFunc.__call__` arms them (the instance's depth raised, the ticker woken, each
    deadline set by an outermost call) and fail as they did (GuestFailure from
    `GuestInstance.fail_from`); an alloc that returns 0 and an input outside memory fail as
    in `SluiceAbi.run_native` and `GuestInstance.write`, a refused hash table is
    GuestFailure("invalid-output") as after `host_sha256.hs_run`. Only where `AVAILABLE`."""

    __slots__ = ("_at", "_c", "_guest", "_run", "_trap", "_whole")

    def __init__(self, func: RawFunc, alloc: RawFunc, guest: GuestInstance,
                 slot: int = 0) -> None:
        assert _ffi is not None and nc_call_run is not None
        if func.sig != (("i32", "i32"), ("i64",)) or alloc.sig != (("i32",), ("i32",)):
            raise TypeError(f"{func.name} and {alloc.name}: not a records export and an alloc")
        if slot and not host_sha256.HS_RUN_FN:
            raise ValueError("a hash request slot without the host's SHA-256 pass built")
        c: Any = _ffi.new("nc_call *")
        c.func, c.args, c.nargs, c.trap = func.native_parts()
        c.call_fn, c.deadline_fn = CALL_UNCHECKED_FN, SET_DEADLINE_FN
        c.data_fn, c.size_fn = MEMORY_DATA_FN, MEMORY_SIZE_FN
        c.store, c.memory = guest.store_context, guest.memory_handle
        c.slot, c.pass_fn = slot, host_sha256.HS_RUN_FN if slot else 0
        c.alloc, c.alloc_args, c.alloc_nargs, _ = alloc.native_parts()
        c.alloc_ticks = guest.ticks  # as RawFunc arms sluice_alloc: no extra ticks
        self._c = c
        self._guest = guest
        # A view of the whole memory where the last call left it (`view`), and that place.
        self._whole: memoryview | None = None
        self._at: tuple[int, int] = (0, 0)
        self._trap = func.trap_cell
        self._run = nc_call_run

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
            if data is not rest:
                # The export of `rest` ends here, not when this frame goes: a failure's
                # traceback keeps the frame, and an exported memoryview left in a reference
                # cycle crashes CPython 3.11's collector (gh-77894).
                _ffi.release(data)
        if done < 0:
            if done == CALL_FAILED:
                raise guest.fail_from(c.error, self._trap)
            if done == CALL_ALLOC:
                raise GuestFailure("memory", f"sluice_alloc({size}) returned 0")
            if done == CALL_INPUT:
                raise GuestFailure("invalid-output", f"guest buffer {ptr or c.ptr}+"
                                   f"{len(head) + len(rest)} is outside linear memory")
            raise GuestFailure("invalid-output", host_sha256.error_text(done))
        return int(c.result)

    def view(self, ptr: int, n: int) -> memoryview:
        """`GuestInstance.view` right after a call, from the memory's place and size then.

        A slice of one view of the whole memory, made again only when a call left the
        memory elsewhere or of another size (it grew): a view made at an address is a
        ctypes call, ~1 µs a batch, where a slice is ~0.1 µs. Checked as `view_in` checks."""
        c = self._c
        at = (c.base, c.size)
        base, size = at
        if ptr < 0 or n < 0 or ptr + n > size or not n:
            return view_in(base, size, ptr, n)  # its failure, or its empty view
        whole = self._whole
        if whole is None or at != self._at:
            whole = self._whole = view_at(base, size)
            self._at = at
        return whole[ptr:ptr + n]
