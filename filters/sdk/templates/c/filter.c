/*
 * {{NAME}}: a Sluice Wasm filter (Sluice ABI v1, C SDK).
 *
 * sluice_on_record() runs once per record and returns what becomes of it:
 *   sluice_keep()                          pass it on unchanged
 *   sluice_rewrite_value(rec, bytes)       pass it on with a new value
 *   sluice_rewrite(key, value, headers, n) ... or a new key, value and headers
 *   sluice_drop()                          silently remove it
 *   sluice_reject("why")                   refuse it (the producer gets INVALID_RECORD)
 * Memory from sluice_malloc() / sluice_buf lives until the end of the batch; no free needed.
 *
 * This starter rejects records without a value, drops records whose "x-drop" header is "yes",
 * tags the rest by appending the configured suffix to the value, and counts what it did.
 */
#include "sluice_filter.h"

static sluice_bytes suffix; /* from the config: {"suffix": "..."} */

int sluice_on_config(const sluice_json *config) {
    suffix = sluice_json_string(sluice_json_get(config, "suffix"));
    if (sluice_is_null(suffix)) suffix = sluice_str(" [checked]");
    return 0; /* non-zero refuses the configuration (set a message with sluice_set_error) */
}

sluice_decision sluice_on_record(const sluice_record *rec) {
    if (sluice_is_null(rec->value) || rec->value.len == 0) {
        sluice_count("rejected_empty", 1);
        return sluice_reject("{{NAME}}: a record needs a value");
    }
    if (sluice_eq_str(sluice_header_get(rec, "x-drop"), "yes")) {
        sluice_count("dropped", 1);
        return sluice_drop();
    }
    sluice_buf out;
    sluice_buf_init(&out, (uint32_t)rec->value.len + (uint32_t)suffix.len);
    sluice_buf_put_bytes(&out, rec->value);
    sluice_buf_put_bytes(&out, suffix);
    sluice_count("tagged", 1);
    return sluice_rewrite_value(rec, sluice_buf_bytes(&out));
}
