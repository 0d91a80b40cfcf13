/* SDK probe for tests/filters/sdk/test_sdk_abi.py: each record value is a command. */
#include "sluice_filter.h"
static int64_t limit = 1000;
int sluice_on_config(const sluice_json *cfg) {
    const sluice_json *l = sluice_json_get(cfg, "limit");
    if (l && !sluice_json_int(l, 0, &limit)) { sluice_set_error("limit must be an integer"); return 1; }
    if (sluice_json_bool(sluice_json_get(cfg, "refuse"), 0)) { sluice_set_error("refused on purpose"); return 7; }
    return 0;
}
sluice_decision sluice_on_record(const sluice_record *rec) {
    sluice_bytes cmd = rec->value;
    if (sluice_eq_str(cmd, "keep")) return sluice_keep();
    if (sluice_eq_str(cmd, "drop")) return sluice_drop();
    if (sluice_eq_str(cmd, "fail")) return sluice_error("asked to fail");
    if (sluice_eq_str(cmd, "count")) { sluice_count("a", 2); sluice_count("b", 1); return sluice_keep(); }
    if (sluice_eq_str(cmd, "ctx")) {
        sluice_buf b; sluice_buf_init(&b, 64);
        sluice_buf_put_bytes(&b, rec->topic); sluice_buf_putc(&b, '|');
        sluice_buf_put_int(&b, rec->partition); sluice_buf_putc(&b, '|');
        sluice_buf_put_bytes(&b, rec->client_id); sluice_buf_putc(&b, '|');
        sluice_buf_put_bytes(&b, rec->principal); sluice_buf_putc(&b, '|');
        sluice_buf_put_int(&b, rec->direction); sluice_buf_putc(&b, '|');
        sluice_buf_put_int(&b, rec->offset); sluice_buf_putc(&b, '|');
        sluice_buf_put_int(&b, rec->timestamp_ms); sluice_buf_putc(&b, '|');
        sluice_buf_put_int(&b, limit);
        return sluice_rewrite_value(rec, sluice_buf_bytes(&b));
    }
    if (sluice_eq_str(cmd, "headers")) {
        sluice_header *hs = sluice_malloc(sizeof(sluice_header) * 2);
        hs[0].key = sluice_str("only"); hs[0].value = sluice_header_get(rec, "in");
        hs[1].key = sluice_str("nul"); hs[1].value = sluice_null();
        return sluice_rewrite(sluice_null(), sluice_null(), hs, 2);
    }
    if (sluice_eq_str(cmd, "json")) {
        const char *err = 0;
        const sluice_json *doc = sluice_json_parse(sluice_header_get(rec, "doc"), &err);
        if (!doc) return sluice_reject(err);
        return sluice_rewrite_value(rec, sluice_json_string(sluice_json_path(doc, sluice_str("a.1.b"))));
    }
    return sluice_reject("unknown command");
}
