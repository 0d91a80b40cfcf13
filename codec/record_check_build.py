"""Builds `sluice.codec._record_check`, the native record check (codec/record_check.c) and the
LZ4 writer for sealed sections (codec/lz4_sealed.c), with cffi in API mode (plain C, no
library). Run by ``scripts/dev.sh install``; by hand::

    .venv/bin/python -m sluice.codec.record_check_build

The compiled module lands next to this file (it is not committed). Without it
`codec.records.check_batch` and `check_section` use aiokafka's record reader, with the same
verdicts (tests/codec/test_record_check_native.py holds the two to that).
"""

from __future__ import annotations

import sys
from pathlib import Path

from cffi import FFI

from sluice.native_build import build_beside

HERE = Path(__file__).resolve().parent
CDEF = """
long rc_check_section(const uint8_t *buf, size_t len, int64_t count, int64_t max_headers,
                      int64_t *where);
size_t lz4_sealed_bound(size_t len);
long lz4_sealed_frame(const uint8_t *src, size_t len, const uint8_t *pat, size_t m,
                      uint8_t *out, size_t cap);
"""


def builder() -> FFI:
    ffi = FFI()
    ffi.cdef(CDEF)
    source = "\n".join((HERE / name).read_text() for name in ("record_check.c", "lz4_sealed.c"))
    ffi.set_source("sluice.codec._record_check", source, extra_compile_args=["-O2"])
    return ffi


def main() -> int:
    return build_beside(builder(), HERE)


if __name__ == "__main__":
    sys.exit(main())
