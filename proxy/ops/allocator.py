"""glibc's malloc in the proxy: batch-sized buffers come from the heap, not fresh mappings.

Every filtered batch makes new buffers of its own size (the rebuilt batch, the spliced
frame), typically 0.1-1 MB. glibc serves an allocation that large with a fresh `mmap` (its
threshold starts at 128 KiB and follows only the largest block freed), and gives it back to
the kernel when it is freed: each buffer's pages are faulted in and zeroed again, batch after
batch. Measured in one process over the encrypt pipeline (1 MB batches of 2 400 records),
that was about a third of the CPU per record: building the sealed batch took ~1.3 ms of page
faults for a ~0.1 ms copy. `keep_batch_buffers` raises the mmap threshold so such buffers
are carved from the heap and reused, and the trim threshold so the heap keeps that much free
memory instead of returning it after every batch. The price is resident memory: up to
`trim_bytes` of free heap per malloc arena (one per thread that allocates: the loop and the
filter threads), on top of what the proxy holds. Blocks over `mmap_bytes` are still mapped
and unmapped as before.

`mmap_bytes` is 32 MiB, the most glibc accepts (half its per-thread heap) and its own ceiling
for the threshold it adjusts: a filtered Fetch response is one buffer as large as the whole
response, received and then spliced, typically just over a consumer's
`max.partition.fetch.bytes` per partition (8 MiB in bench_proxy). With a threshold of 8 MiB
both were fresh mappings on every response, and the pages faulted in per response cost about
as much as the rest of the host's work on the records (bench/bench_fetch_host.py, 9 MB
responses of one partition: the host's share 0.21 against 0.11 µs per record).

A no-op where the C library is not glibc.
"""

from __future__ import annotations

import ctypes
import ctypes.util
from typing import Final

# mallopt parameters (glibc malloc.h).
_M_TRIM_THRESHOLD: Final = -1
_M_MMAP_THRESHOLD: Final = -3
MMAP_BYTES: Final = 32 << 20
TRIM_BYTES: Final = 32 << 20


def keep_batch_buffers(mmap_bytes: int = MMAP_BYTES, trim_bytes: int = TRIM_BYTES) -> bool:
    """Set glibc's thresholds (see the module docstring); False where that is not possible."""
    name = ctypes.util.find_library("c")
    if name is None:
        return False
    try:
        libc = ctypes.CDLL(name)
        mallopt = libc.mallopt
        libc.gnu_get_libc_version  # noqa: B018 (only glibc has it: the parameters are its own)
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt.restype = ctypes.c_int
    return bool(mallopt(_M_MMAP_THRESHOLD, mmap_bytes)) and bool(
        mallopt(_M_TRIM_THRESHOLD, trim_bytes))
