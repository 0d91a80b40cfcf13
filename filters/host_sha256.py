"""The host side of the `host_sha256` capability (docs/FILTER_ABI.md): after a guest's
``sluice_filter_records`` call, one native call (filters/host_sha256.c) hashes every request
the guest listed and writes the hex digests into the output's records section in guest memory.
The records call itself and this pass after it are one crossing (native_call.NativeCall, which
calls `hs_run` through `HS_RUN_FN`).

`AVAILABLE` is False when the native module was not built (``scripts/dev.sh install`` builds
it): the host then never offers the capability, and guests hash in their own code.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Final

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

#: ``hs_set_level(cap)``: caps the code path (0 OpenSSL, 1 SHA-NI, 2 SHA-NI with AVX-512;
#: uncapped, the CPU's own: 2 on AMD, 1 elsewhere) and returns the path then in use, for tests.
#: None when not built.
hs_set_level: Callable[[int], int] | None = _lib.hs_set_level if AVAILABLE else None

#: ``hs_reset_level()``: back to the CPU's own path, which it returns (after `hs_set_level`).
hs_reset_level: Callable[[], int] | None = _lib.hs_reset_level if AVAILABLE else None


#: `hs_run`'s address, for native code that runs the pass itself (filters/native_call.c,
#: for a guest that took the capability). 0 when not built.
HS_RUN_FN: Final = int(_ffi.cast("uintptr_t", _ffi.addressof(_lib, "hs_run"))) if AVAILABLE else 0


def error_text(code: int) -> str:
    """What a negative result of `hs_run` means (for the filter error)."""
    return _ERRORS.get(code, f"hash requests refused ({code})")
