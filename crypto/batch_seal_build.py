"""Builds `sluice.crypto._batch_seal`, the native batch sealer (crypto/batch_seal.c), with cffi
in API mode against OpenSSL's libcrypto (Debian: libssl-dev). Run by ``scripts/dev.sh
install``; by hand::

    .venv/bin/python -m sluice.crypto.batch_seal_build

The compiled module lands next to this file (it is not committed). Without it builtin:encrypt
runs its per-record Python path (crypto/record_filter.py), which gives the same bytes.
"""

from __future__ import annotations

import sys
from pathlib import Path

from cffi import FFI

from sluice.native_build import build_beside, libcrypto_ffi

HERE = Path(__file__).resolve().parent
CDEF = """
int sb_fast_iv(void);
int sb_own_gcm(void);
int sb_allow_own_gcm(int allow);
long sb_nonces(uint8_t *out, size_t n);
long sb_seal_values(const uint8_t *in, size_t in_len, uint32_t count, const uint8_t *key,
                    const uint8_t *nonces, size_t nonces_len, const uint8_t *prefix,
                    size_t prefix_len,
                    const uint8_t *ours, size_t ours_len, uint32_t ours_count,
                    uint8_t *scratch, size_t scratch_len, uint8_t *out, size_t out_cap,
                    uint8_t *fates, uint32_t *sealed);
long sb_open_values(const uint8_t *in, size_t in_len, uint32_t count, const uint8_t *key,
                    const uint8_t *prefix, size_t prefix_len, const uint8_t *group,
                    size_t group_len, uint32_t group_count, uint8_t *scratch,
                    size_t scratch_len, uint8_t *out, size_t out_cap, uint8_t *fates,
                    uint32_t *where);
long sb_first_group(const uint8_t *in, size_t in_len, uint32_t count, uint32_t *first,
                    size_t *group_off, size_t *group_len, uint32_t *group_count);
long sb_scan(const uint8_t *in, size_t in_len, uint32_t count, const uint8_t *reserved,
             size_t reserved_len, uint32_t *first, size_t *group_off, size_t *group_len,
             uint32_t *group_count, uint32_t *encrypted, uint32_t *values,
             int64_t *reserved_at, size_t *name_off, size_t *name_len);
long sb_seal_fields(const uint8_t *in, size_t in_len, uint32_t count, const uint8_t *key,
                    const uint8_t *nonces, size_t nonces_len, const uint8_t *prefix,
                    size_t prefix_len, const uint8_t *packed_paths, size_t packed_len,
                    uint32_t npaths, const uint8_t *ours, size_t ours_len, uint32_t ours_count,
                    uint32_t max_seals, uint8_t *scratch, size_t scratch_len, uint8_t *out,
                    size_t out_cap, uint8_t *fates, uint32_t *records, uint32_t *seals,
                    uint32_t *plan, size_t plan_cap);
long sb_open_fields(const uint8_t *in, size_t in_len, uint32_t count, const uint8_t *key,
                    const uint8_t *prefix, size_t prefix_len, const uint8_t *group3,
                    size_t group3_len, uint32_t group3_count, uint8_t *scratch,
                    size_t scratch_len, uint8_t *out, size_t out_cap, uint8_t *fates,
                    uint32_t *where, uint32_t *opened);
"""


def builder() -> FFI:
    return libcrypto_ffi("sluice.crypto._batch_seal", HERE / "batch_seal.c", CDEF)


def main() -> int:
    return build_beside(builder(), HERE)


if __name__ == "__main__":
    sys.exit(main())
