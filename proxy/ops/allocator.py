"""Tuning of glibc's allocator for the proxy's data path.

A filtered batch goes through several buffers the size of the batch (the decompressed
section, a filter's output section, the rebuilt batch). glibc serves an allocation above its
mmap threshold (128 KiB at start, raised only as such blocks are freed, per process) with a
fresh `mmap`, and returns it with `munmap` when freed: every 4 KiB page of such a buffer then
costs a page fault when first written. For builtin:encrypt on batches of 1 000 records of 200
bytes that was a third of the proxy's CPU per record (bench/bench_encryption.py: about 1.05 µs
per record on produce with glibc's defaults, 0.7 µs with the thresholds below).

`tune()` raises the mmap threshold to 32 MiB (glibc's own ceiling for its dynamic threshold
on 64-bit), so batch-sized buffers are carved from the heap and reused, and the trim threshold
to 64 MiB (free memory at the top of a heap that is kept rather than given back), bounding
what the process holds beyond its live data. Only with glibc (``mallopt``); elsewhere
nothing changes. The environment variables ``MALLOC_MMAP_THRESHOLD_`` and
``MALLOC_TRIM_THRESHOLD_``, when set, win (the operator chose).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import platform
from typing import Final

M_TRIM_THRESHOLD: Final = -1
M_MMAP_THRESHOLD: Final = -3
MMAP_THRESHOLD: Final = 32 << 20
TRIM_THRESHOLD: Final = 64 << 20


def tune() -> bool:
    """Set the thresholds (see the module docstring); whether glibc accepted them."""
    if platform.libc_ver()[0] != "glibc":
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt.restype = ctypes.c_int
    ok = True
    if "MALLOC_MMAP_THRESHOLD_" not in os.environ:
        ok = mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD) == 1 and ok
    if "MALLOC_TRIM_THRESHOLD_" not in os.environ:
        ok = mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD) == 1 and ok
    return ok
