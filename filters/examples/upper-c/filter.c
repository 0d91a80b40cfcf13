/*
 * Example (seeds 001/002): upper-case every record value, written with the C SDK.
 *
 * ASCII letters a-z become A-Z; other bytes (UTF-8 included) pass unchanged. Null values
 * (tombstones) are kept as they are. Counts upper-cased records as "upper_cased". The same
 * filter as filters/examples/upper (Zig), upper-rust and upper-as: the four are benchmarked
 * side by side by `python -m sluice.filters.bench --only languages`.
 */
#include "sluice_filter.h"

sluice_decision sluice_on_record(const sluice_record *rec) {
    int32_t n = rec->value.len;
    int32_t first = 0;
    while (first < n && !(rec->value.ptr[first] >= 'a' && rec->value.ptr[first] <= 'z')) first++;
    if (first >= n) return sluice_keep(); /* null, empty or nothing to change */
    uint8_t *out = (uint8_t *)sluice_malloc((size_t)n);
    if (out == NULL) return sluice_error("upper: out of memory");
    for (int32_t i = 0; i < n; i++) {
        uint8_t c = rec->value.ptr[i];
        out[i] = (c >= 'a' && c <= 'z') ? (uint8_t)(c - 32) : c;
    }
    sluice_count("upper_cased", 1);
    return sluice_rewrite_value(rec, sluice_bytes_of(out, (size_t)n));
}
