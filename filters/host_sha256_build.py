"""Builds `sluice.filters._host_sha256`, the host's SHA-256 pass for guests with the
`host_sha256` capability (filters/host_sha256.c), with cffi in API mode against OpenSSL's
libcrypto (Debian: libssl-dev). Run by ``scripts/dev.sh install``; by hand::

    .venv/bin/python -m sluice.filters.host_sha256_build

The compiled module lands next to this file (it is not committed). Without it the host does not
offer the capability, and such guests hash in their own code (same bytes, slower).
"""

from __future__ import annotations

import sys
from pathlib import Path

from cffi import FFI

from sluice.native_build import build_beside, libcrypto_ffi

HERE = Path(__file__).resolve().parent
CDEF = """
long hs_run(uintptr_t mem_addr, uint64_t mem_size, uint32_t slot, uint32_t out_ptr,
            uint32_t out_len, uint32_t records);
int hs_set_level(int cap);
int hs_reset_level(void);
"""


def builder() -> FFI:
    return libcrypto_ffi("sluice.filters._host_sha256", HERE / "host_sha256.c", CDEF)


def main() -> int:
    return build_beside(builder(), HERE)


if __name__ == "__main__":
    sys.exit(main())
