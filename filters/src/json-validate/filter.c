/*
 * builtin:json-validate: record values must be valid JSON (RFC 8259, UTF-8), optionally an
 * object carrying required fields, and not larger than a limit.
 *
 * Configuration (all optional):
 *   required_fields: [user_id, "user.address.city", "items.0.sku"]   dotted paths; an array
 *                    element by its index. Implies the value is an object.
 *   require_object: false      the top-level value must be an object
 *   max_bytes: 1048576         values longer than this are violations
 *   action: reject | drop      what a violation does (default reject: the producer gets
 *                              INVALID_RECORD with the reason)
 *   allow_tombstones: true     a null value (compaction delete marker) is not a violation
 *
 * Per batch it counts violations as invalid_json, not_object, missing_field, too_large and
 * tombstone.
 */
#include "sluice_filter.h"

static const sluice_json *required;
static int require_object;
static int64_t max_bytes = -1;
static int drop_on_violation;
static int allow_tombstones = 1;

static int cfg_error(const char *msg) {
    sluice_set_error(msg);
    return 1;
}

int sluice_on_config(const sluice_json *cfg) {
    if (cfg == NULL || cfg->type == SLUICE_JSON_NULL) return 0;
    if (cfg->type != SLUICE_JSON_OBJECT) return cfg_error("json-validate: config must be a mapping");
    for (const sluice_json *c = cfg->child; c; c = c->next) {
        if (sluice_eq_str(c->key, "required_fields")) {
            if (c->type != SLUICE_JSON_ARRAY) return cfg_error("json-validate: required_fields must be a list of field paths");
            for (const sluice_json *f = c->child; f; f = f->next) {
                if (f->type != SLUICE_JSON_STRING || f->str.len == 0)
                    return cfg_error("json-validate: required_fields must be a list of field paths");
            }
            required = c;
        } else if (sluice_eq_str(c->key, "require_object")) {
            require_object = sluice_json_bool(c, 0);
        } else if (sluice_eq_str(c->key, "max_bytes")) {
            if (!sluice_json_int(c, -1, &max_bytes) || max_bytes < 0) return cfg_error("json-validate: max_bytes must be a non-negative integer");
        } else if (sluice_eq_str(c->key, "action")) {
            if (sluice_eq_str(sluice_json_string(c), "drop")) drop_on_violation = 1;
            else if (sluice_eq_str(sluice_json_string(c), "reject")) drop_on_violation = 0;
            else return cfg_error("json-validate: action must be reject or drop");
        } else if (sluice_eq_str(c->key, "allow_tombstones")) {
            allow_tombstones = sluice_json_bool(c, 1);
        } else {
            return cfg_error("json-validate: unknown config key (known: required_fields, require_object, max_bytes, action, allow_tombstones)");
        }
    }
    return 0;
}

static sluice_decision violation(const char *counter, sluice_buf *reason) {
    sluice_count(counter, 1);
    if (drop_on_violation) return sluice_drop();
    return sluice_reject_bytes(sluice_buf_bytes(reason));
}

sluice_decision sluice_on_record(const sluice_record *rec) {
    sluice_buf reason;
    sluice_buf_init(&reason, 128);
    sluice_buf_puts(&reason, "json-validate: ");
    if (rec->value.len < 0) {
        if (allow_tombstones) return sluice_keep();
        sluice_buf_puts(&reason, "value is null");
        return violation("tombstone", &reason);
    }
    if (max_bytes >= 0 && rec->value.len > max_bytes) {
        sluice_buf_puts(&reason, "value is ");
        sluice_buf_put_int(&reason, rec->value.len);
        sluice_buf_puts(&reason, " bytes, max_bytes is ");
        sluice_buf_put_int(&reason, max_bytes);
        return violation("too_large", &reason);
    }
    const char *err = NULL;
    if (required == NULL && !require_object) {
        if (sluice_json_valid(rec->value, &err)) return sluice_keep();
    } else {
        const sluice_json *doc = sluice_json_parse(rec->value, &err);
        if (doc != NULL) {
            if (doc->type != SLUICE_JSON_OBJECT) {
                sluice_buf_puts(&reason, "value is not a JSON object");
                return violation("not_object", &reason);
            }
            for (const sluice_json *f = required ? required->child : NULL; f; f = f->next) {
                if (sluice_json_path(doc, f->str) == NULL) {
                    sluice_buf_puts(&reason, "required field '");
                    sluice_buf_put_bytes(&reason, f->str);
                    sluice_buf_puts(&reason, "' is missing");
                    return violation("missing_field", &reason);
                }
            }
            return sluice_keep();
        }
    }
    sluice_buf_puts(&reason, "value is not valid JSON: ");
    sluice_buf_puts(&reason, err ? err : "invalid");
    sluice_buf_puts(&reason, " at byte ");
    sluice_buf_put_int(&reason, sluice_json_error_offset);
    return violation("invalid_json", &reason);
}
