"""Builds `sluice.filters._native_call`, a Sluice-ABI guest's records call in one native
crossing (filters/native_call.c), with cffi in API mode (plain C). Run by
``scripts/dev.sh install``; by hand::

    .venv/bin/python -m sluice.filters.native_call_build

The compiled module lands next to this file (it is not committed). Without it the host makes
the records call step by step through ctypes (same results, more crossings).
"""

from __future__ import annotations

import sys
from pathlib import Path

from cffi import FFI

from sluice.native_build import build_beside

HERE = Path(__file__).resolve().parent
CDEF = """
typedef struct {
    uintptr_t call_fn, deadline_fn, data_fn, size_fn, store, func, args;
    uint64_t nargs;
    uintptr_t trap, memory;
    uint32_t slot;
    uintptr_t pass_fn, error;
    int64_t result;
    uintptr_t base;
    uint64_t size;
    uintptr_t alloc, alloc_args;
    uint64_t alloc_nargs, alloc_ticks;
    uint32_t ptr;
} nc_call;
long nc_call_run(nc_call *c, uint64_t ticks, uint32_t ptr, uint32_t len, const char *head,
                 size_t head_len, const char *rest, size_t rest_len, uint32_t records);
"""


def builder() -> FFI:
    ffi = FFI()
    ffi.cdef(CDEF)
    ffi.set_source("sluice.filters._native_call", (HERE / "native_call.c").read_text(),
                   extra_compile_args=["-O2"])
    return ffi


def main() -> int:
    return build_beside(builder(), HERE)


if __name__ == "__main__":
    sys.exit(main())
