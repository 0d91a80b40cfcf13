/*
 * Example (seed 000, Sluice ABI): enrich JSON events with a timestamp and drop events without
 * a user_id.
 *
 * - value not a JSON object          -> reject ("value is not a JSON object: <parser error>")
 * - no top-level "user_id"           -> drop
 * - no top-level "timestamp"         -> add "timestamp": the record's own timestamp as
 *                                       RFC 3339 UTC with milliseconds (a Wasm filter has no
 *                                       clock; the record timestamp is what the producer set)
 * - otherwise                        -> keep, byte for byte
 * The original text is kept as it is; the new member is appended before the closing brace.
 */
#include "sluice_filter.h"

/* Days since 1970-01-01 to a civil date (proleptic Gregorian). */
static void civil_from_days(int64_t z, int64_t *y, uint32_t *m, uint32_t *d) {
    z += 719468;
    int64_t era = (z >= 0 ? z : z - 146096) / 146097;
    uint32_t doe = (uint32_t)(z - era * 146097);
    uint32_t yoe = (doe - doe / 1460 + doe / 36524 - doe / 146096) / 365;
    uint32_t doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    uint32_t mp = (5 * doy + 2) / 153;
    *d = doy - (153 * mp + 2) / 5 + 1;
    *m = mp < 10 ? mp + 3 : mp - 9;
    *y = (int64_t)yoe + era * 400 + (*m <= 2);
}

static void put_digits(sluice_buf *b, int64_t v, int width) {
    char tmp[8];
    for (int i = width - 1; i >= 0; i--) {
        tmp[i] = (char)('0' + v % 10);
        v /= 10;
    }
    sluice_buf_put(b, tmp, (uint32_t)width);
}

static void put_rfc3339(sluice_buf *b, int64_t ms) {
    int64_t secs = ms >= 0 ? ms / 1000 : -((-ms + 999) / 1000);
    int64_t milli = ms - secs * 1000;
    int64_t days = secs >= 0 ? secs / 86400 : -((-secs + 86399) / 86400);
    int64_t sod = secs - days * 86400;
    int64_t y;
    uint32_t m, d;
    civil_from_days(days, &y, &m, &d);
    put_digits(b, y, 4);
    sluice_buf_putc(b, '-');
    put_digits(b, m, 2);
    sluice_buf_putc(b, '-');
    put_digits(b, d, 2);
    sluice_buf_putc(b, 'T');
    put_digits(b, sod / 3600, 2);
    sluice_buf_putc(b, ':');
    put_digits(b, (sod / 60) % 60, 2);
    sluice_buf_putc(b, ':');
    put_digits(b, sod % 60, 2);
    sluice_buf_putc(b, '.');
    put_digits(b, milli, 3);
    sluice_buf_putc(b, 'Z');
}

sluice_decision sluice_on_record(const sluice_record *rec) {
    const char *err = "null value";
    const sluice_json *doc = rec->value.len >= 0 ? sluice_json_parse(rec->value, &err) : NULL;
    if (doc == NULL || doc->type != SLUICE_JSON_OBJECT) {
        sluice_buf msg;
        sluice_buf_init(&msg, 64);
        sluice_buf_puts(&msg, "value is not a JSON object");
        if (doc == NULL) {
            sluice_buf_puts(&msg, ": ");
            sluice_buf_puts(&msg, err);
        }
        return sluice_reject_bytes(sluice_buf_bytes(&msg));
    }
    if (sluice_json_get(doc, "user_id") == NULL) {
        sluice_count("dropped_no_user_id", 1);
        return sluice_drop();
    }
    if (sluice_json_get(doc, "timestamp") != NULL) return sluice_keep();
    /* the object has a member (user_id), so a comma goes before the new one */
    int32_t close = rec->value.len - 1;
    while (close > 0 && rec->value.ptr[close] != '}') close--;
    sluice_buf out;
    sluice_buf_init(&out, (uint32_t)rec->value.len + 48);
    sluice_buf_put(&out, rec->value.ptr, (uint32_t)close);
    sluice_buf_puts(&out, ",\"timestamp\":\"");
    put_rfc3339(&out, rec->timestamp_ms);
    sluice_buf_putc(&out, '"');
    sluice_buf_put(&out, rec->value.ptr + close, (uint32_t)(rec->value.len - close));
    if (out.failed) return sluice_error("enrich: out of memory");
    sluice_count("timestamp_added", 1);
    return sluice_rewrite_value(rec, sluice_buf_bytes(&out));
}
