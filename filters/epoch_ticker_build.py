"""Builds `sluice.filters._epoch_ticker`, the native epoch ticker (filters/epoch_ticker.c), with
cffi in API mode (plain C and pthreads; wasmtime is reached through a function address handed
in at start, so nothing links against it). Run by ``scripts/dev.sh install``; by hand::

    .venv/bin/python -m sluice.filters.epoch_ticker_build

The compiled module lands next to this file (it is not committed). Without it
`filters.engine.FilterEngine` runs its Python ticker, which takes the GIL 500 times a second
while guests are busy.
"""

from __future__ import annotations

import sys
from pathlib import Path

from cffi import FFI

from sluice.native_build import build_beside

HERE = Path(__file__).resolve().parent
CDEF = """
typedef struct et_ticker et_ticker;
et_ticker *et_start(uintptr_t increment, uintptr_t engine, int64_t interval_ns,
                    int64_t max_catch_up, int parked);
void et_park(et_ticker *t);
void et_resume(et_ticker *t);
uint64_t et_ticks(et_ticker *t);
void et_stop(et_ticker *t);
"""


def builder() -> FFI:
    ffi = FFI()
    ffi.cdef(CDEF)
    ffi.set_source("sluice.filters._epoch_ticker", (HERE / "epoch_ticker.c").read_text(),
                   extra_compile_args=["-O2", "-pthread"], extra_link_args=["-pthread"])
    return ffi


def main() -> int:
    return build_beside(builder(), HERE)


if __name__ == "__main__":
    sys.exit(main())
