/*
 * builtin:pii-mask: finds personal data and secrets in record values, keys and header values
 * and masks them (keys and headers can be switched off).
 *
 * Detectors: email, card (13-19 digits, Luhn), phone (E.164 and common national formats),
 * ssn (US), iban (mod-97), ipv4, aws_access_key (AKIA...), aws_secret_key (KEY=value form),
 * bearer (Authorization bearer tokens), jwt. Each can be switched off or given its own masking.
 * JSON values are edited structurally: strings (and numbers) are scanned, whole fields can be
 * masked by path, and the output stays valid JSON. Anything else is treated as text.
 * Per batch the filter reports how many matches each detector made (plus "field" for
 * path-masked values).
 *
 * Configuration (all optional), see docs/WRITING_FILTERS.md "builtin:pii-mask":
 *   mode: auto | json | text        mask: "*"        keep_last: 0      replacement: "[x]"
 *   preserve_format: true           fields: ["user.email", "cards[*].number"]
 *   detectors: {card: {keep_last: 4}, ipv4: false}   (or a list naming the enabled ones)
 *   keys: true      headers: true | false | ["name", ...]   (defaults: both masked)
 *   secret_keys: ["AWS_SECRET_ACCESS_KEY", ...]  (names whose KEY=value values are masked;
 *                case and _ . - ignored, matching the end of a longer name at a word)
 */
/* literals masked where they lie in the input are returned as the record's own (jreplace_masked) */
#define SLUICE_REWRITE_IN_PLACE 1
/* matches are counted per batch and reported once at its end (det_counts) */
#define SLUICE_BATCH_BEGIN pii_batch_begin
#define SLUICE_BATCH_END pii_batch_end
/* sluice_on_record is below: the records entry point calls it in line */
#define SLUICE_ON_RECORD_DEFINED 1
#include "sluice_filter.h"
#include <wasm_simd128.h>

/* The scans over every byte of a record (classifying strings, finding where a JSON string
 * ends, skipping to where a detector can start, masking a match) use Wasm SIMD, 16 bytes per
 * step: a compiled byte loop costs several instructions per byte, and these loops were most of
 * the filter's time. SIMD is enabled for every function of this file (not for the SDK's or
 * other filters'): a function may only be inlined into one with the same target features, and
 * a call costs the guest about 5 ns (wasmtime's prologue: stack limit check, callee-saved
 * registers), a tenth of a record's time when the small steps of a match (classify, check,
 * mask, splice) were each a call. The hot ones are always_inline. Relaxed SIMD (on by default in
 * wasmtime) only for tacc_add's swizzles, whose indices are below 16, where it is exact. */
#pragma clang attribute push(__attribute__((target("simd128,relaxed-simd"))), apply_to = function)
#define SIMD

/* ------------------------------------------------------------------------------------------ */
/* Configuration                                                                              */
/* ------------------------------------------------------------------------------------------ */

enum {
    D_EMAIL,
    D_CARD,
    D_PHONE,
    D_SSN,
    D_IBAN,
    D_IPV4,
    D_AWS_KEY,
    D_AWS_SECRET,
    D_JWT,
    D_BEARER,
    D_FIELD, /* not a detector: masking by JSON path */
    D_COUNT
};

/* Order = priority when two detectors claim exactly the same span. */
static const char *const det_names[D_COUNT] = {
    "email", "card", "phone", "ssn", "iban", "ipv4", "aws_access_key", "aws_secret_key", "jwt", "bearer", "field",
};

typedef struct {
    int enabled;
    sluice_bytes mask;        /* unit written per masked character */
    int64_t keep_last;        /* characters left visible at the end */
    sluice_bytes replacement; /* when not null: the whole match becomes this */
    int preserve_format;      /* keep separators and punctuation */
} mask_rule;

/* Matches per detector, in the order each detector first matched (the order sluice_count
 * would have seen them). A JSON walk counts into its own (jctx), added to the batch's when the
 * value turns out to be JSON; the batch's go to sluice_count once, at the batch's end. Calling
 * sluice_count per match, and saving the SDK's counters before each walk to put them back when
 * it fails, cost ~7 % of a masked record's guest time. */
typedef struct {
    uint32_t seen; /* bit d: count[d] is set */
    uint32_t n;
    uint8_t order[D_COUNT];
    uint32_t count[D_COUNT];
} det_counts;

static inline __attribute__((always_inline)) void count_match(det_counts *k, uint32_t d, uint32_t n) {
    if (k->seen >> d & 1u) {
        k->count[d] += n;
        return;
    }
    k->seen |= 1u << d;
    k->order[k->n++] = (uint8_t)d;
    k->count[d] = n;
}

static det_counts batch_counts;

static void pii_batch_begin(void) {
    batch_counts.seen = 0;
    batch_counts.n = 0;
}

static void pii_batch_end(void) {
    for (uint32_t i = 0; i < batch_counts.n; i++) sluice_count(det_names[batch_counts.order[i]], batch_counts.count[batch_counts.order[i]]);
    batch_counts.seen = 0;
    batch_counts.n = 0;
}

static mask_rule rules[D_COUNT];
static uint32_t enabled_detectors; /* bit d set: rules[d].enabled (d < D_FIELD) */
static int masks_plain; /* no rule's mask or replacement holds a byte a JSON string escapes */
/* bit d set: rules[d] masks byte for byte (a one-byte mask, no replacement, no keep_last), so an
 * ASCII match is masked in place (spans_mask_in_place) */
static uint32_t in_place_rules;

enum { MODE_AUTO, MODE_JSON, MODE_TEXT };
static int mode = MODE_AUTO;
/* Keys and header values are masked by default, like values: "stored records are masked" must
 * hold for every part of a record that can carry personal data. */
static int do_keys = 1;
static int headers_all = 1;
static const sluice_json *header_names; /* array of strings, or NULL (headers_all decides) */

#define MAX_SECRET_KEYS 32
static sluice_bytes secret_keys[MAX_SECRET_KEYS];
static uint32_t secret_key_n;
/* The names lower-cased without separators ("AWS_SECRET_ACCESS_KEY": awssecretaccesskey), so
 * that one name matches as the CLI, Terraform, Java properties and JSON spell it
 * (aws_secret_access_key, aws.secretAccessKey, SecretAccessKey, cloud.aws...secret-key). */
static uint8_t secret_norm[MAX_SECRET_KEYS][64];
static uint32_t secret_norm_len[MAX_SECRET_KEYS];
static uint32_t secret_key_min;     /* the shortest normalised name */
static uint32_t secret_key_last[8]; /* bit set: a normalised name ends with this byte */
static int secret_name_sep(uint8_t c) { return c == '_' || c == '.' || c == '-' || c == ' '; }

/* Field paths, parsed into segments. */
enum { SEG_KEY, SEG_ANY, SEG_INDEX, SEG_ANY_INDEX };
typedef struct {
    uint8_t type;
    sluice_bytes key;
    uint32_t index;
} seg;
typedef struct {
    seg *segs;
    uint32_t n;
} path;
#define MAX_PATHS 64
static path paths[MAX_PATHS];
static uint32_t path_n;

static int config_error(const char *msg) {
    sluice_set_error(msg);
    return 1;
}

static int parse_rule(const sluice_json *n, mask_rule *r) {
    int64_t v;
    if (n == NULL) return 0;
    if (n->type == SLUICE_JSON_TRUE || n->type == SLUICE_JSON_FALSE) {
        r->enabled = n->type == SLUICE_JSON_TRUE;
        return 0;
    }
    if (n->type != SLUICE_JSON_OBJECT) return config_error("pii-mask: a detector setting must be true, false or a mapping");
    for (const sluice_json *c = n->child; c; c = c->next) {
        if (sluice_eq_str(c->key, "enabled")) {
            r->enabled = sluice_json_bool(c, r->enabled);
        } else if (sluice_eq_str(c->key, "mask")) {
            if (c->type != SLUICE_JSON_STRING || c->str.len == 0) return config_error("pii-mask: mask must be a non-empty string");
            r->mask = c->str;
        } else if (sluice_eq_str(c->key, "keep_last")) {
            if (!sluice_json_int(c, 0, &v) || v < 0 || v > 64) return config_error("pii-mask: keep_last must be an integer 0..64");
            r->keep_last = v;
        } else if (sluice_eq_str(c->key, "replacement")) {
            if (c->type == SLUICE_JSON_NULL) r->replacement = sluice_null();
            else if (c->type == SLUICE_JSON_STRING) r->replacement = c->str;
            else return config_error("pii-mask: replacement must be a string or null");
        } else if (sluice_eq_str(c->key, "preserve_format")) {
            r->preserve_format = sluice_json_bool(c, r->preserve_format);
        } else {
            return config_error("pii-mask: unknown detector setting (use enabled, mask, keep_last, replacement, preserve_format)");
        }
    }
    return 0;
}

static int parse_path(sluice_bytes text, path *out) {
    /* at most one segment per '.' and per '[' */
    uint32_t max = 1;
    for (int32_t i = 0; i < text.len; i++) {
        if (text.ptr[i] == '.' || text.ptr[i] == '[') max++;
    }
    out->segs = (seg *)sluice_malloc(sizeof(seg) * max);
    out->n = 0;
    if (out->segs == NULL) return config_error("pii-mask: out of memory");
    int32_t i = 0;
    if (text.len == 0) return config_error("pii-mask: empty field path");
    while (i < text.len) {
        if (text.ptr[i] == '[') {
            int32_t j = i + 1;
            seg s;
            s.key = sluice_null();
            s.index = 0;
            if (j < text.len && text.ptr[j] == '*') {
                s.type = SEG_ANY_INDEX;
                j++;
            } else {
                s.type = SEG_INDEX;
                int32_t start = j;
                while (j < text.len && text.ptr[j] >= '0' && text.ptr[j] <= '9') s.index = s.index * 10u + (uint32_t)(text.ptr[j++] - '0');
                if (j == start) return config_error("pii-mask: bad [index] in field path");
            }
            if (j >= text.len || text.ptr[j] != ']') return config_error("pii-mask: missing ] in field path");
            out->segs[out->n++] = s;
            i = j + 1;
            if (i < text.len && text.ptr[i] == '.') {
                i++;
                if (i >= text.len) return config_error("pii-mask: field path ends with '.'");
            }
            continue;
        }
        int32_t j = i;
        while (j < text.len && text.ptr[j] != '.' && text.ptr[j] != '[') j++;
        if (j == i) return config_error("pii-mask: empty segment in field path");
        seg s;
        s.index = 0;
        s.key = sluice_bytes_of(text.ptr + i, (size_t)(j - i));
        s.type = (s.key.len == 1 && s.key.ptr[0] == '*') ? SEG_ANY : SEG_KEY;
        out->segs[out->n++] = s;
        i = j;
        if (i < text.len && text.ptr[i] == '.') {
            i++;
            if (i >= text.len) return config_error("pii-mask: field path ends with '.'");
        }
    }
    return 0;
}

static const char *const default_secret_keys[] = {
    "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "aws_secret_key", "secret_access_key", "secret_key", "session_token",
};

int sluice_on_config(const sluice_json *cfg) {
    mask_rule base;
    base.enabled = 1;
    base.mask = sluice_str("*");
    base.keep_last = 0;
    base.replacement = sluice_null();
    base.preserve_format = 1;
    const sluice_json *detectors = NULL;
    int64_t v;

    /* Defaults (a configuration may be applied more than once): value, key and every header
     * value are masked unless switched off. */
    mode = MODE_AUTO;
    do_keys = 1;
    headers_all = 1;
    header_names = NULL;
    path_n = 0;
    secret_key_n = 0;
    for (uint32_t i = 0; i < sizeof default_secret_keys / sizeof default_secret_keys[0]; i++) {
        secret_keys[secret_key_n++] = sluice_str(default_secret_keys[i]);
    }
    if (cfg != NULL && cfg->type != SLUICE_JSON_OBJECT) return config_error("pii-mask: config must be a mapping");
    for (const sluice_json *c = cfg ? cfg->child : NULL; c; c = c->next) {
        if (sluice_eq_str(c->key, "mode")) {
            if (sluice_eq_str(c->str, "auto") && c->type == SLUICE_JSON_STRING) mode = MODE_AUTO;
            else if (sluice_eq_str(c->str, "json") && c->type == SLUICE_JSON_STRING) mode = MODE_JSON;
            else if (sluice_eq_str(c->str, "text") && c->type == SLUICE_JSON_STRING) mode = MODE_TEXT;
            else return config_error("pii-mask: mode must be auto, json or text");
        } else if (sluice_eq_str(c->key, "mask")) {
            if (c->type != SLUICE_JSON_STRING || c->str.len == 0) return config_error("pii-mask: mask must be a non-empty string");
            base.mask = c->str;
        } else if (sluice_eq_str(c->key, "keep_last")) {
            if (!sluice_json_int(c, 0, &v) || v < 0 || v > 64) return config_error("pii-mask: keep_last must be an integer 0..64");
            base.keep_last = v;
        } else if (sluice_eq_str(c->key, "replacement")) {
            if (c->type == SLUICE_JSON_NULL) base.replacement = sluice_null();
            else if (c->type == SLUICE_JSON_STRING) base.replacement = c->str;
            else return config_error("pii-mask: replacement must be a string or null");
        } else if (sluice_eq_str(c->key, "preserve_format")) {
            base.preserve_format = sluice_json_bool(c, 1);
        } else if (sluice_eq_str(c->key, "detectors")) {
            if (c->type != SLUICE_JSON_OBJECT && c->type != SLUICE_JSON_ARRAY) return config_error("pii-mask: detectors must be a mapping or a list");
            detectors = c;
        } else if (sluice_eq_str(c->key, "fields")) {
            if (c->type != SLUICE_JSON_ARRAY) return config_error("pii-mask: fields must be a list of paths");
            path_n = 0;
            for (const sluice_json *f = c->child; f; f = f->next) {
                if (f->type != SLUICE_JSON_STRING) return config_error("pii-mask: fields must be a list of paths");
                if (path_n >= MAX_PATHS) return config_error("pii-mask: at most 64 field paths");
                if (parse_path(f->str, &paths[path_n])) return 1;
                path_n++;
            }
        } else if (sluice_eq_str(c->key, "keys")) {
            if (c->type != SLUICE_JSON_TRUE && c->type != SLUICE_JSON_FALSE) return config_error("pii-mask: config.keys: must be true or false");
            do_keys = c->type == SLUICE_JSON_TRUE;
        } else if (sluice_eq_str(c->key, "headers")) {
            if (c->type == SLUICE_JSON_ARRAY) {
                for (const sluice_json *h = c->child; h; h = h->next) {
                    if (h->type != SLUICE_JSON_STRING) return config_error("pii-mask: config.headers: must be true, false or a list of header names (strings)");
                }
                header_names = c;
                headers_all = 0;
            } else if (c->type == SLUICE_JSON_TRUE || c->type == SLUICE_JSON_FALSE) {
                headers_all = c->type == SLUICE_JSON_TRUE;
                header_names = NULL;
            } else {
                return config_error("pii-mask: config.headers: must be true, false or a list of header names (strings)");
            }
        } else if (sluice_eq_str(c->key, "secret_keys")) {
            if (c->type != SLUICE_JSON_ARRAY) return config_error("pii-mask: secret_keys must be a list of names");
            secret_key_n = 0;
            for (const sluice_json *k = c->child; k; k = k->next) {
                if (k->type != SLUICE_JSON_STRING || k->str.len == 0) return config_error("pii-mask: secret_keys must be a list of names");
                if (secret_key_n >= MAX_SECRET_KEYS) return config_error("pii-mask: at most 32 secret_keys");
                secret_keys[secret_key_n++] = k->str;
            }
        } else {
            return config_error("pii-mask: unknown config key (known: mode, mask, keep_last, replacement, preserve_format, detectors, fields, keys, headers, secret_keys)");
        }
    }
    secret_key_min = 0xffffffffu;
    for (uint32_t k = 0; k < 8; k++) secret_key_last[k] = 0;
    for (uint32_t k = 0; k < secret_key_n; k++) {
        uint32_t m = 0;
        for (uint32_t t = 0; t < (uint32_t)secret_keys[k].len && m < 64; t++) {
            uint8_t ch = secret_keys[k].ptr[t];
            if (!secret_name_sep(ch)) secret_norm[k][m++] = sluice_lower(ch);
        }
        secret_norm_len[k] = m;
        if (m == 0) return config_error("pii-mask: secret_keys must be a list of names");
        if (m < secret_key_min) secret_key_min = m;
        uint8_t last = secret_norm[k][m - 1];
        secret_key_last[last >> 5] |= 1u << (last & 31);
    }
    for (int d = 0; d < D_COUNT; d++) rules[d] = base;
    if (detectors && detectors->type == SLUICE_JSON_ARRAY) {
        for (int d = 0; d < D_FIELD; d++) rules[d].enabled = 0;
    }
    for (const sluice_json *c = detectors ? detectors->child : NULL; c; c = c->next) {
        sluice_bytes name = detectors->type == SLUICE_JSON_ARRAY ? sluice_json_string(c) : c->key;
        int found = -1;
        for (int d = 0; d < D_COUNT; d++) {
            if (sluice_eq_str(name, det_names[d])) found = d;
        }
        if (found < 0) return config_error("pii-mask: unknown detector (known: email, card, phone, ssn, iban, ipv4, aws_access_key, aws_secret_key, jwt, bearer, field)");
        if (detectors->type == SLUICE_JSON_ARRAY) rules[found].enabled = 1;
        else if (parse_rule(c, &rules[found])) return 1;
    }
    enabled_detectors = 0;
    for (int d = 0; d < D_FIELD; d++) {
        if (rules[d].enabled) enabled_detectors |= 1u << d;
    }
    masks_plain = 1;
    in_place_rules = 0;
    for (int d = 0; d < D_COUNT; d++) {
        if (sluice_is_null(rules[d].replacement) && rules[d].mask.len == 1 && rules[d].keep_last == 0) in_place_rules |= 1u << d;
        const sluice_bytes units[2] = {rules[d].mask, rules[d].replacement};
        for (int u = 0; u < 2; u++) {
            for (int32_t i = 0; i < units[u].len; i++) {
                uint8_t ch = units[u].ptr[i];
                if (ch == '"' || ch == '\\' || ch < 0x20) masks_plain = 0;
            }
        }
    }
    return 0;
}

/* ------------------------------------------------------------------------------------------ */
/* Character classes                                                                          */
/* ------------------------------------------------------------------------------------------ */

/* A table: the detectors test these for almost every byte they look at. */
enum {
    C_DIGIT = 1,
    C_UPPER = 2,
    C_LOWER = 4,
    C_LOCAL = 8,   /* in an e-mail local part besides letters and digits: . _ % + - */
    C_DOMAIN = 16, /* in an e-mail domain label besides letters and digits: - */
};
static const uint8_t char_class[256] = {
    ['0' ... '9'] = C_DIGIT,
    ['A' ... 'Z'] = C_UPPER,
    ['a' ... 'z'] = C_LOWER,
    ['.'] = C_LOCAL,
    ['_'] = C_LOCAL,
    ['%'] = C_LOCAL,
    ['+'] = C_LOCAL,
    ['-'] = C_LOCAL | C_DOMAIN,
};
static int is_digit(uint8_t c) { return char_class[c] & C_DIGIT; }
static int is_upper(uint8_t c) { return char_class[c] & C_UPPER; }
static int is_alpha(uint8_t c) { return char_class[c] & (C_UPPER | C_LOWER); }
static int is_alnum(uint8_t c) { return char_class[c] & (C_DIGIT | C_UPPER | C_LOWER); }
static int is_b64url(uint8_t c) { return is_alnum(c) || c == '-' || c == '_'; }

/* East Asian input methods write digits, letters and punctuation as full-width forms (U+FF01 to
 * U+FF5E, the ASCII characters 0x21-0x7E shifted; "４１１１－１１１１", "ａ＠ｂ．ｊｐ") and spaces as
 * the ideographic space U+3000. The ASCII character the 3-byte form at p[i] stands for, or 0.
 * Lead bytes: 0xEF (U+FF01-U+FF5E are EF BC 81 .. EF BD 9E) and 0xE3 (U+3000 is E3 80 80). */
static uint8_t wide_at(const uint8_t *p, uint32_t i, uint32_t end) {
    if (end - i < 3) return 0;
    uint8_t a = p[i], b = p[i + 1], c = p[i + 2];
    if (a == 0xEF) {
        if (b == 0xBC && c >= 0x81 && c <= 0xBF) return (uint8_t)(0x21 + (c - 0x81));
        if (b == 0xBD && c >= 0x80 && c <= 0x9E) return (uint8_t)(0x60 + (c - 0x80));
    } else if (a == 0xE3 && b == 0x80 && c == 0x80) {
        return ' ';
    }
    return 0;
}

/* ------------------------------------------------------------------------------------------ */
/* Spans                                                                                      */
/* ------------------------------------------------------------------------------------------ */

typedef struct {
    uint32_t start, end;
    uint8_t det;
} span;

#define SPANS_INLINE 8

typedef struct {
    span *v;
    uint32_t n, cap;
    int failed;
    span first[SPANS_INLINE]; /* a string rarely has more matches: no allocation for those */
} spans;

static inline __attribute__((always_inline)) void spans_init(spans *s) {
    s->v = s->first;
    s->n = 0;
    s->cap = SPANS_INLINE;
    s->failed = 0;
}

static inline __attribute__((always_inline)) void add_span(spans *s, uint32_t start, uint32_t end, int det) {
    if (s->n == s->cap) {
        uint32_t cap = s->cap * 2;
        span *v = (span *)sluice_malloc(sizeof(span) * cap);
        if (v == NULL) {
            s->failed = 1;
            return;
        }
        if (s->n) memcpy(v, s->v, sizeof(span) * s->n);
        s->v = v;
        s->cap = cap;
    }
    s->v[s->n].start = start;
    s->v[s->n].end = end;
    s->v[s->n].det = (uint8_t)det;
    s->n++;
}

/* ------------------------------------------------------------------------------------------ */
/* Block scan: where a detector can start                                                      */
/* ------------------------------------------------------------------------------------------ */

/* Bytes below this address may be loaded: the end of linear memory. The scans that take a
 * string in whole 16-byte steps load past its end and clear the lanes beyond it, so any string
 * in memory (not only one followed by 16 more bytes of its own record) takes that path. */
static const uint8_t *mem_readable(void) {
    sl__arena_setup();
    return (const uint8_t *)(sl__limit < 0x7fff0000u ? sl__limit : 0x7fff0000u);
}

/* Every detector's loop passes over bytes that cannot start its match (an e-mail is found from
 * its '@', a card, SSN or IPv4 address from a digit, a phone from a digit, '+' or '(', an IBAN
 * from an upper-case letter, an AWS key id from 'A', a secret from '=' or ':', a JWT from 'e',
 * a bearer token from 'b'). These return the first offset in [i, end) holding such a byte, or
 * end: 16-byte blocks without one are rejected with a few vector compares, and the detector's
 * checks and checksums run only from the candidates. The detectors' results do not change:
 * their loops did nothing at the bytes skipped. Loads stay inside [i, end). */
#define SKIP_BLOCKS(MATCH, SCALAR)                                        \
    while (end - i >= 16) {                                               \
        v128_t v = wasm_v128_load(p + i);                                 \
        uint32_t m = (uint32_t)wasm_i8x16_bitmask(MATCH);                 \
        if (m) return i + (uint32_t)__builtin_ctz(m);                     \
        i += 16;                                                          \
    }                                                                     \
    while (i < end && !(SCALAR)) i++;                                     \
    return i

SIMD static inline uint32_t skip_to_byte(const uint8_t *p, uint32_t i, uint32_t end, uint8_t a) {
    SKIP_BLOCKS(wasm_i8x16_eq(v, wasm_i8x16_splat((int8_t)a)), p[i] == a);
}

SIMD static inline uint32_t skip_to_byte2(const uint8_t *p, uint32_t i, uint32_t end, uint8_t a, uint8_t b) {
    SKIP_BLOCKS(wasm_v128_or(wasm_i8x16_eq(v, wasm_i8x16_splat((int8_t)a)), wasm_i8x16_eq(v, wasm_i8x16_splat((int8_t)b))), p[i] == a || p[i] == b);
}

SIMD static inline v128_t in_range(v128_t v, uint8_t lo, uint8_t count) {
    return wasm_u8x16_lt(wasm_i8x16_sub(v, wasm_i8x16_splat((int8_t)lo)), wasm_i8x16_splat((int8_t)count));
}

/* v with lanes n.. cleared (n < 16) */
SIMD static v128_t first_lanes(v128_t v, uint32_t n) {
    v128_t lane = wasm_u8x16_make(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    return wasm_v128_and(v, wasm_u8x16_lt(lane, wasm_i8x16_splat((int8_t)n)));
}

SIMD static inline uint32_t skip_to_digit(const uint8_t *p, uint32_t i, uint32_t end) {
    SKIP_BLOCKS(in_range(v, '0', 10), (uint32_t)(p[i] - '0') < 10u);
}

SIMD static inline uint32_t skip_to_upper(const uint8_t *p, uint32_t i, uint32_t end) {
    SKIP_BLOCKS(in_range(v, 'A', 26), (uint32_t)(p[i] - 'A') < 26u);
}

/* The first offset in [i, end) not holding an ASCII digit, or end. */
SIMD static inline uint32_t skip_digits(const uint8_t *p, uint32_t i, uint32_t end) {
    SKIP_BLOCKS(wasm_v128_not(in_range(v, '0', 10)), (uint32_t)(p[i] - '0') >= 10u);
}

/* a digit, '+' or '(' (the bytes find_phone starts from) */
SIMD static inline uint32_t skip_to_phone(const uint8_t *p, uint32_t i, uint32_t end) {
    SKIP_BLOCKS(wasm_v128_or(in_range(v, '0', 10), wasm_v128_or(wasm_i8x16_eq(v, wasm_i8x16_splat('+')), wasm_i8x16_eq(v, wasm_i8x16_splat('(')))),
                (uint32_t)(p[i] - '0') < 10u || p[i] == '+' || p[i] == '(');
}

/* ------------------------------------------------------------------------------------------ */
/* Detectors: each scans p[0..n) and adds spans                                               */
/* ------------------------------------------------------------------------------------------ */

static int email_local(uint8_t c) { return char_class[c] & (C_DIGIT | C_UPPER | C_LOWER | C_LOCAL); }
static int email_domain(uint8_t c) { return char_class[c] & (C_DIGIT | C_UPPER | C_LOWER | C_DOMAIN); }

/* Internationalised addresses (RFC 6531) hold letters beyond ASCII: "José.Núñez@exämple.de".
 * Of those, the two-byte UTF-8 letters (U+00C0 to U+07FF: Latin, Greek, Cyrillic, Hebrew,
 * Arabic ..., but not x and ÷) belong to an address; punctuation such as « » and the no-break
 * space (U+0080 to U+00BF) and three-byte characters do not: CJK text is written without
 * spaces ("メールはa@b.jpです", "邮箱a@b.cn。") and quotes addresses in 「 」 or „ “, and none of
 * it is part of the address. */
static int email_letter2(uint8_t a, uint8_t b) {
    return a >= 0xC3 && a <= 0xDF && b >= 0x80 && b <= 0xBF && !(a == 0xC3 && (b == 0x97 || b == 0xB7));
}

/* The width (1 or 2) of the address character ending at p[j - 1] (not before floor), or 0. */
static uint32_t email_local_back(const uint8_t *p, uint32_t floor, uint32_t j) {
    if (p[j - 1] < 0x80) return email_local(p[j - 1]) ? 1 : 0;
    return j >= floor + 2 && email_letter2(p[j - 2], p[j - 1]) ? 2 : 0;
}

/* The width (1 or 2) of the domain character at p[k], or 0. */
static uint32_t email_domain_at(const uint8_t *p, uint32_t n, uint32_t k) {
    if (p[k] < 0x80) return email_domain(p[k]) ? 1 : 0;
    return k + 1 < n && email_letter2(p[k], p[k + 1]) ? 2 : 0;
}

SIMD static void find_email(const uint8_t *p, uint32_t n, spans *out) {
    uint32_t floor = 0; /* do not reach back into the previous match */
    for (uint32_t i = 1; i + 1 < n; i++) {
        i = skip_to_byte(p, i, n - 1, '@');
        if (i + 1 >= n) break;
        uint32_t j = i, w;
        while (j > floor && (w = email_local_back(p, floor, j)) != 0) j -= w;
        while (j < i && p[j] == '.') j++;
        if (j == i) continue;
        /* domain: labels of [A-Za-z0-9-] separated by single dots; last label alphabetic, >= 2 */
        uint32_t k = i + 1, label_start = k, last_label = k, labels = 0, good_end = 0;
        while (k <= n) {
            if (k < n && (w = email_domain_at(p, n, k)) != 0) {
                k += w;
                continue;
            }
            uint32_t len = k - label_start;
            if (len == 0 || p[label_start] == '-' || p[k - 1] == '-') break;
            labels++;
            last_label = label_start;
            if (labels >= 2) {
                int alpha = (k - last_label) >= 2;
                for (uint32_t t = last_label; t < k && alpha; t++) alpha = is_alpha(p[t]);
                if (alpha) good_end = k;
            }
            if (k < n && p[k] == '.' && k + 1 < n && is_alnum(p[k + 1])) {
                k++;
                label_start = k;
                continue;
            }
            break;
        }
        if (good_end == 0) continue;
        add_span(out, j, good_end, D_EMAIL);
        floor = good_end;
        i = good_end;
    }
}

/* bits k.. of a 64-bit mask, and bits below k */
static uint64_t bits_from(uint32_t k) { return k >= 64 ? 0 : ~(uint64_t)0 << k; }
static uint64_t bits_below(uint32_t k) { return k >= 64 ? ~(uint64_t)0 : ((uint64_t)1 << k) - 1; }

/* find_email for a string of at most 64 bytes that may be read in whole 16-byte steps: the
 * same walk, with the character classes as bit masks (bit i for p[i]), so that it steps over
 * '@' signs, local parts and domain labels rather than over bytes. */
SIMD static inline __attribute__((always_inline)) void find_email_short(const uint8_t *p, uint32_t n, spans *out) {
    uint64_t at = 0, local = 0, domain = 0, alpha = 0, high = 0;
    for (uint32_t i = 0; i < n; i += 16) {
        v128_t v = wasm_v128_load(p + i);
        if (n - i < 16) { /* lanes n - i.. cleared: a zero byte is in no class */
            v128_t lane = wasm_u8x16_make(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
            v = wasm_v128_and(v, wasm_u8x16_lt(lane, wasm_i8x16_splat((int8_t)(n - i))));
        }
        high |= (uint64_t)wasm_i8x16_bitmask(v);
        v128_t digit = wasm_u8x16_lt(wasm_i8x16_sub(v, wasm_i8x16_splat('0')), wasm_i8x16_splat(10));
        v128_t letter = wasm_v128_or(wasm_u8x16_lt(wasm_i8x16_sub(v, wasm_i8x16_splat('a')), wasm_i8x16_splat(26)),
                                     wasm_u8x16_lt(wasm_i8x16_sub(v, wasm_i8x16_splat('A')), wasm_i8x16_splat(26)));
        v128_t dom = wasm_v128_or(wasm_v128_or(digit, letter), wasm_v128_or(wasm_i8x16_lt(v, wasm_i8x16_splat(0)), wasm_i8x16_eq(v, wasm_i8x16_splat('-'))));
        v128_t loc = wasm_v128_or(wasm_v128_or(dom, wasm_i8x16_eq(v, wasm_i8x16_splat('.'))),
                                  wasm_v128_or(wasm_i8x16_eq(v, wasm_i8x16_splat('_')),
                                               wasm_v128_or(wasm_i8x16_eq(v, wasm_i8x16_splat('%')), wasm_i8x16_eq(v, wasm_i8x16_splat('+')))));
        at |= (uint64_t)wasm_i8x16_bitmask(wasm_i8x16_eq(v, wasm_i8x16_splat('@'))) << i;
        local |= (uint64_t)wasm_i8x16_bitmask(loc) << i;
        domain |= (uint64_t)wasm_i8x16_bitmask(dom) << i;
        alpha |= (uint64_t)wasm_i8x16_bitmask(letter) << i;
    }
    if (high) { /* UTF-8: letters of two bytes are address characters, others not */
        find_email(p, n, out);
        return;
    }
    /* the '@' of find_email's loop: 1 <= i, i + 1 < n */
    at &= bits_from(1) & bits_below(n - 1);
    uint32_t floor = 0;
    while (at) {
        uint32_t i = (uint32_t)__builtin_ctzll(at);
        at &= at - 1;
        uint64_t stop = ~local & bits_below(i) & bits_from(floor);
        uint32_t j = stop ? 64 - (uint32_t)__builtin_clzll(stop) : floor;
        while (j < i && p[j] == '.') j++;
        if (j == i) continue;
        uint32_t label_start = i + 1, labels = 0, good_end = 0;
        for (;;) {
            uint64_t rest = ~domain & bits_from(label_start);
            uint32_t k = rest ? (uint32_t)__builtin_ctzll(rest) : 64;
            if (k > n) k = n;
            if (k == label_start || p[label_start] == '-' || p[k - 1] == '-') break;
            labels++;
            if (labels >= 2 && k - label_start >= 2 && (bits_below(k) & bits_from(label_start) & ~alpha) == 0) good_end = k;
            if (k < n && p[k] == '.' && k + 1 < n && is_alnum(p[k + 1])) {
                label_start = k + 1;
                continue;
            }
            break;
        }
        if (good_end == 0) continue;
        add_span(out, j, good_end, D_EMAIL);
        floor = good_end;
        at &= bits_from(good_end + 1); /* find_email goes on after the match */
    }
}

/* Luhn's check over the digits of groups [gs[t], ge[t]) for t < g, read from the last: every
 * second digit from the right doubled (its digit sum). A group of at most 16 digits that may be
 * loaded whole is summed in one 16-byte step (its doubled digits looked up by a swizzle), the
 * others digit by digit: the same sum either way. */
SIMD static int luhn_groups(const uint8_t *p, const uint32_t *gs, const uint32_t *ge, uint32_t g, const uint8_t *readable) {
    static const uint8_t doubled[10] = {0, 2, 4, 6, 8, 1, 3, 5, 7, 9};
    const v128_t table = wasm_u8x16_make(0, 2, 4, 6, 8, 1, 3, 5, 7, 9, 0, 0, 0, 0, 0, 0);
    const v128_t lane = wasm_u8x16_make(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    const v128_t odd_lanes = wasm_u8x16_make(0, 255, 0, 255, 0, 255, 0, 255, 0, 255, 0, 255, 0, 255, 0, 255);
    v128_t acc = wasm_i64x2_splat(0); /* u16 lanes: at most 18 per group added to each */
    uint32_t sum = 0, odd = 0;
    for (uint32_t t = g; t-- > 0;) {
        uint32_t s = gs[t], len = ge[t] - s;
        if (len <= 16 && readable - (p + s) >= 16) {
            v128_t d = wasm_i8x16_sub(wasm_v128_load(p + s), wasm_i8x16_splat('0'));
            /* lane j is doubled when an odd number of the window's digits follow it */
            v128_t twice = (len - 1u + odd) & 1u ? wasm_v128_not(odd_lanes) : odd_lanes;
            v128_t vals = wasm_v128_bitselect(wasm_i8x16_swizzle(table, d), d, twice);
            vals = wasm_v128_and(vals, wasm_u8x16_lt(lane, wasm_i8x16_splat((int8_t)len)));
            acc = wasm_i16x8_add(acc, wasm_u16x8_extadd_pairwise_u8x16(vals));
            odd ^= len & 1u;
            continue;
        }
        for (uint32_t k = ge[t]; k-- > s;) {
            uint32_t d = (uint32_t)(p[k] - '0');
            sum += odd ? doubled[d] : d;
            odd ^= 1u;
        }
    }
    v128_t s32 = wasm_u32x4_extadd_pairwise_u16x8(acc);
    sum += wasm_i32x4_extract_lane(s32, 0) + wasm_i32x4_extract_lane(s32, 1) + wasm_i32x4_extract_lane(s32, 2) + wasm_i32x4_extract_lane(s32, 3);
    return sum % 10 == 0;
}

/* The end of the run of digits from p[k] (at most n); bytes up to `readable` may be loaded, so
 * a run is found with one 16-byte step rather than byte by byte. */
SIMD static inline uint32_t digit_end(const uint8_t *p, uint32_t k, uint32_t n, const uint8_t *readable) {
    while (k < n && readable - (p + k) >= 16) {
        uint32_t m = ~(uint32_t)wasm_i8x16_bitmask(in_range(wasm_v128_load(p + k), '0', 10)) & 0xffffu;
        if (m) {
            k += (uint32_t)__builtin_ctz(m);
            return k < n ? k : n;
        }
        k += 16;
    }
    if (k >= n) return n;
    while (k < n && is_digit(p[k])) k++;
    return k;
}

/* A number-like run starts here: not glued to a preceding word or decimal number. */
static int num_boundary_before(const uint8_t *p, uint32_t i) {
    if (i == 0) return 1;
    uint8_t c = p[i - 1];
    if (is_alnum(c) || c == '_') return 0;
    if ((c == '.' || c == ',' || c == '-' || c == '/' || c == ':') && i >= 2 && is_digit(p[i - 2])) return 0;
    return 1;
}

static int num_boundary_after(const uint8_t *p, uint32_t n, uint32_t e) {
    if (e >= n) return 1;
    uint8_t c = p[e];
    if (is_alnum(c) || c == '_') return 0;
    if ((c == '.' || c == ',' || c == '-' || c == '/' || c == ':') && e + 1 < n && is_digit(p[e + 1])) return 0;
    return 1;
}

#define MAX_GROUPS 24

/* "DE89 3704 ...", "GB26 MVQA 1147 ...": digits continuing an IBAN printed in groups of four
 * are an account number, not a card (even when the IBAN's checksum is wrong and the iban
 * detector passed on it). Walks back over the groups of four before i to a country code and
 * check digits that start a word. */
static inline __attribute__((always_inline)) int after_iban_prefix(const uint8_t *p, uint32_t i) {
    for (uint32_t groups = 0; groups < 8; groups++) {
        if (i < 5 || p[i - 1] != ' ') return 0;
        const uint8_t *t = p + i - 5;
        for (uint32_t k = 0; k < 4; k++) {
            if (!is_digit(t[k]) && !is_upper(t[k])) return 0;
        }
        if (is_upper(t[0]) && is_upper(t[1]) && is_digit(t[2]) && is_digit(t[3]) && (i == 5 || !is_alnum(p[i - 6]))) return 1;
        i -= 5;
    }
    return 0;
}

/* Issuer prefixes and lengths: 13-19 digits starting 2-6 (Visa, Mastercard, Amex, Discover,
 * JCB, Diners, UnionPay, Maestro); Maestro also prints 12 digits (50xx, 56-58, 6xxx) and
 * 0604 numbers; the old JCB numbers are 15 digits starting 1800 or 2131. */
static inline __attribute__((always_inline)) int card_issuer_ok(uint32_t p4, uint32_t n) {
    /* p4: the first four digits as a number (d0 = p4 / 1000) */
    if (n >= 13 && p4 >= 2000 && p4 <= 6999) return 1;
    if (n == 15 && (p4 == 1800 || p4 == 2131)) return 1;
    if (p4 == 604) return 1; /* Maestro 0604, 12-19 digits */
    if (n == 12) {
        return p4 == 5018 || p4 == 5020 || p4 == 5038 || p4 == 5893 || (p4 >= 5600 && p4 <= 5899) || p4 == 6304 || p4 == 6390 ||
               p4 == 6759 || (p4 >= 6761 && p4 <= 6763);
    }
    return 0;
}

SIMD static void find_card(const uint8_t *p, uint32_t n, spans *out, const uint8_t *readable) {
    /* A string of at most 64 bytes that may be loaded whole (nearly every card number): where
     * its digits are, as a bit mask (bits from n on clear), so that runs of digits are found
     * with bit scans rather than a vector step per run. */
    int short_text = n <= 64 && readable - p >= (int32_t)((n + 15) & ~15u);
    uint64_t digit_bits = 0;
    if (short_text) {
        for (uint32_t t = 0; t < n; t += 16) {
            v128_t v = wasm_v128_load(p + t);
            if (n - t < 16) v = first_lanes(v, n - t);
            digit_bits |= (uint64_t)wasm_i8x16_bitmask(in_range(v, '0', 10)) << t;
        }
    }
    uint32_t i = 0;
    while (i < n) {
        if (short_text) {
            uint64_t rest = digit_bits & bits_from(i);
            i = rest ? (uint32_t)__builtin_ctzll(rest) : n;
        } else {
            i = skip_to_digit(p, i, n);
        }
        if (i >= n) break;
        if (!is_digit(p[i]) || !num_boundary_before(p, i) || after_iban_prefix(p, i)) {
            i++;
            continue;
        }
        /* digit groups separated by one space, dash or underscore, the same one throughout
         * (full-width digits and separators were normalised to these, see normalise_wide) */
        uint32_t gs[MAX_GROUPS], ge[MAX_GROUPS], g = 0, k = i;
        uint8_t sep = 0;
        for (;;) {
            uint32_t s = k;
            if (short_text) {
                uint64_t rest = ~digit_bits & bits_from(k);
                k = rest ? (uint32_t)__builtin_ctzll(rest) : 64;
                if (k > n) k = n;
            } else {
                k = digit_end(p, k, n, readable);
            }
            if (g < MAX_GROUPS) {
                gs[g] = s;
                ge[g] = k;
                g++;
            }
            if (k + 1 < n && (p[k] == ' ' || p[k] == '-' || p[k] == '_') && is_digit(p[k + 1]) && (sep == 0 || sep == p[k]) && g < MAX_GROUPS) {
                sep = p[k];
                k++;
                continue;
            }
            break;
        }
        uint32_t run_end = k;
        int matched = 0;
        /* A dashed or underscored number is one token printed the way cards are (4-4-4-4,
         * 4-6-5, 4-6-4, 4-4-4-4-3): groups of 3 to 6 digits. Dates and ids joined the same way
         * ("2024_01_15_1000003") are not cards even when their digits pass Luhn. */
        if (sep == '-' || sep == '_') {
            for (uint32_t t = 0; t < g && !matched; t++) {
                if (ge[t] - gs[t] < 3 || ge[t] - gs[t] > 6) matched = -1;
            }
            if (matched) {
                i = run_end;
                continue;
            }
        }
        /* try windows of whole groups, longest first from each start; a window's digits are
         * its groups' lengths, so one with fewer than 12 or more than 19 is passed over
         * without reading it (it would fail the length checks below) */
        uint32_t below[MAX_GROUPS + 1]; /* below[t]: digits in groups 0..t-1 */
        below[0] = 0;
        for (uint32_t t = 0; t < g; t++) below[t + 1] = below[t] + (ge[t] - gs[t]);
        int end_ok = -1; /* num_boundary_after at the run's end, once needed */
        for (uint32_t a = 0; a < g && !matched; a++) {
            /* windows only get shorter from here on (later starts, earlier ends) */
            if (below[g] - below[a] < 12) break;
            /* no issuer prefix starts with 7, 8 or 9 (card_issuer_ok) */
            if (p[gs[a]] >= '7') continue;
            if (a > 0 && !num_boundary_before(p, gs[a]) && sep != ' ') continue;
            /* the issuer prefix from the window's first four digits (it has 12 or more), read
             * once per start; then Luhn over its groups where they lie: nothing is copied */
            uint32_t p4 = 0, ln = 0;
            for (uint32_t b = g; b > a && !matched; b--) {
                uint32_t e = ge[b - 1];
                if (below[b] - below[a] < 12) break;
                if (b < g && sep != ' ') continue; /* a dashed or underscored number is one token */
                if (below[b] - below[a] > 19) continue;
                if (b == g) {
                    if (end_ok < 0) end_ok = num_boundary_after(p, n, e);
                    if (!end_ok) continue;
                }
                if (ln == 0 && ge[a] - gs[a] >= 4) {
                    const uint8_t *q = p + gs[a];
                    p4 = (uint32_t)(q[0] - '0') * 1000u + (uint32_t)(q[1] - '0') * 100u + (uint32_t)(q[2] - '0') * 10u + (uint32_t)(q[3] - '0');
                    ln = 4;
                }
                for (uint32_t t = a; ln < 4; t++) {
                    for (uint32_t k = gs[t]; k < ge[t] && ln < 4; k++, ln++) p4 = p4 * 10u + (uint32_t)(p[k] - '0');
                }
                if (!card_issuer_ok(p4, below[b] - below[a])) continue;
                if (!luhn_groups(p, gs + a, ge + a, b - a, readable)) continue;
                add_span(out, gs[a], e, D_CARD);
                matched = 1;
            }
        }
        i = run_end > i ? run_end : i + 1;
    }
}

static uint32_t digits_at(const uint8_t *p, uint32_t n, uint32_t i) {
    uint32_t k = i;
    while (k < n && is_digit(p[k])) k++;
    return k - i;
}

/* Words people write before a phone number, in the languages of the corpus the detector is
 * measured on (lower case; matched case-insensitively at the start of a word). A trailing '$'
 * means the word must end there ("Tel." but not "Teller"). */
static const char *const phone_words[] = {
    "phone", "telephone", "tel$", "telefon", "telefoon", "tel\xc3\xa9\x66ono", "mobile", "mobil$", "mobilnummer",
    "cell$", "cellphone", "cellulare", "celular", "fax$", "call$", "handy$", "whatsapp", "contact$",
    "t\xc3\xa9l$",                                  /* tél. */
    "t\xc3\xa9l\xc3\xa9phone",                      /* téléphone */
    "m\xc3\xb3vil",                                 /* móvil */
    "\xe9\x9b\xbb\xe8\xa9\xb1",                     /* 電話 */
    "\xe6\x90\xba\xe5\xb8\xaf",                     /* 携帯 */
    "\xe7\x94\xb5\xe8\xaf\x9d",                     /* 电话 */
    "\xe6\x89\x8b\xe6\x9c\xba",                     /* 手机 */
    "\xe0\xa4\xab\xe0\xa4\xbc\xe0\xa5\x8b\xe0\xa4\xa8", /* फ़ोन */
    "\xe0\xa4\xab\xe0\xa5\x8b\xe0\xa4\xa8",         /* फोन */
    "\xe0\xa4\xae\xe0\xa5\x8b\xe0\xa4\xac\xe0\xa4\xbe\xe0\xa4\x87\xe0\xa4\xb2", /* मोबाइल */
};

/* A phone word starts at p[j] (within p[0..n)): at a word start, or at an upper-case letter
 * after a lower-case one ("contactPhone"). */
static int phone_word_at(const uint8_t *p, uint32_t n, uint32_t j) {
    if (j > 0 && is_alpha(p[j - 1]) && !(is_upper(p[j]) && !is_upper(p[j - 1]))) return 0;
    for (uint32_t w = 0; w < sizeof phone_words / sizeof phone_words[0]; w++) {
        const uint8_t *word = (const uint8_t *)phone_words[w];
        uint32_t L = (uint32_t)sluice_strlen(phone_words[w]), t = 0;
        int whole = word[L - 1] == '$';
        if (whole) L--;
        if (j + L > n) continue;
        while (t < L && sluice_lower(p[j + t]) == word[t]) t++;
        if (t < L) continue;
        /* a whole word: not followed by a lower-case letter ("Teller"; "telNumber" is fine) */
        if (whole && j + L < n && is_alpha(p[j + L]) && !is_upper(p[j + L])) continue;
        return 1;
    }
    return 0;
}

/* Whether a JSON member name holds a phone word ("phone", "mobile_no", "telefono"). */
static int phone_word_in(const uint8_t *p, uint32_t n) {
    for (uint32_t j = 0; j < n; j++) {
        if (phone_word_at(p, n, j)) return 1;
    }
    return 0;
}

/* The name of the JSON member whose value is being scanned, or NULL (text, array elements);
 * read only when a number needs a label (phone_labelled), so most records never look at it. */
static const uint8_t *member_name;
static uint32_t member_len;

/* A number at p[i] is labelled as a phone: a phone word ends at most 24 bytes before it with no
 * digit in between ("Tel.: ", "電話番号「", "phone number is "), or the string is the value of
 * a phone member. */
static int phone_labelled(const uint8_t *p, uint32_t i) {
    if (member_name && phone_word_in(member_name, member_len)) return 1;
    uint32_t from = i > 32 ? i - 32 : 0;
    for (uint32_t j = i; j > from; j--) {
        if (is_digit(p[j - 1])) return 0;
        if (phone_word_at(p, i, j - 1)) return 1;
    }
    return 0;
}

/* An extension after a number ending at e: "x3503", " ext. 12", " #4": the new end, or e. */
static uint32_t phone_extension(const uint8_t *p, uint32_t n, uint32_t e) {
    uint32_t k = e;
    if (k < n && p[k] == ' ') k++;
    if (k < n && (p[k] == 'x' || p[k] == 'X' || p[k] == '#')) {
        k++;
    } else if (k + 3 <= n && sluice_lower(p[k]) == 'e' && sluice_lower(p[k + 1]) == 'x' && sluice_lower(p[k + 2]) == 't') {
        k += 3;
        if (k < n && p[k] == '.') k++;
    } else {
        return e;
    }
    if (k < n && p[k] == ' ') k++;
    uint32_t d = digits_at(p, n, k);
    if (d == 0 || d > 6) return e;
    return k + d;
}

/* Digit groups from p[i]: groups of digits joined by one separator each (space - . /), the
 * first optionally in parentheses ("(0131) 496 0163", "(11) 96123-7455"). Sets the number of
 * digits and groups and returns the end, or i when there is no digit. */
static uint32_t phone_groups(const uint8_t *p, uint32_t n, uint32_t i, uint32_t *digits, uint32_t *groups, int *paren) {
    uint32_t k = i, d = 0, g = 0, shortest = 99;
    *paren = 0;
    if (k < n && p[k] == '(') {
        uint32_t a = digits_at(p, n, k + 1);
        if (a < 2 || a > 5 || k + 1 + a >= n || p[k + 1 + a] != ')') return i;
        d = a;
        g = 1;
        k += 2 + a;
        *paren = 1;
        if (k < n && (p[k] == ' ' || p[k] == '-') && k + 1 < n && is_digit(p[k + 1])) k++;
    }
    uint32_t end = k;
    for (;;) {
        uint32_t a = digits_at(p, n, k);
        if (a == 0) break;
        if (a < shortest) shortest = a;
        d += a;
        g++;
        k += a;
        end = k;
        if (d > 15) break;
        if (k + 1 < n && (p[k] == ' ' || p[k] == '-' || p[k] == '.' || p[k] == '/') && is_digit(p[k + 1])) {
            k++;
            continue;
        }
        break;
    }
    *digits = d;
    *groups = g;
    /* a one-digit group is a version or a date ("10.0.24832.4853"), not a phone */
    return g && shortest >= 2 ? end : i;
}

SIMD static void find_phone(const uint8_t *p, uint32_t n, spans *out) {
    for (uint32_t i = 0; i < n; i++) {
        i = skip_to_phone(p, i, n);
        if (i >= n) break;
        uint8_t c = p[i];
        /* Nothing starts at a digit that follows a digit (both branches below need
         * num_boundary_before), so the rest of a run of digits is passed over in one step
         * rather than tried digit by digit: "4111 1111 1111 1111" is 4 tries, not 16. */
        if (i > 0 && is_digit(c) && is_digit(p[i - 1])) {
            i = skip_digits(p, i, n) - 1;
            continue;
        }
        /* the international prefix 00 stands for '+' ("0049 30 1234567", "001-415-555-0132") */
        int intl00 = c == '0' && i + 3 < n && p[i + 1] == '0' && p[i + 2] >= '1' && p[i + 2] <= '9' && num_boundary_before(p, i) &&
                     !(i >= 2 && p[i - 1] == ' ' && is_digit(p[i - 2])) && !after_iban_prefix(p, i);
        if (c == '+' || intl00) {
            /* E.164: +CC then digits with single separators ( -.) and optional (area) */
            if (i > 0 && (is_alnum(p[i - 1]) || p[i - 1] == '_')) continue;
            uint32_t k = intl00 ? i + 2 : i + 1, digits = 0, last_digit = 0, seps = 0;
            if (k >= n || p[k] < '1' || p[k] > '9') continue;
            int prev_sep = 1;
            while (k < n) {
                uint8_t d = p[k];
                if (is_digit(d)) {
                    digits++;
                    last_digit = k;
                    prev_sep = 0;
                } else if ((d == ' ' || d == '-' || d == '.') && !prev_sep) {
                    prev_sep = 1;
                    seps++;
                } else if (d == '(' && k + 1 < n && is_digit(p[k + 1])) {
                    prev_sep = 1;
                    seps++;
                } else if (d == ')' && k > 0 && is_digit(p[k - 1])) {
                    prev_sep = 0; /* "(0) 20" : a separator may follow */
                } else {
                    break;
                }
                k++;
                if (digits > 15) break;
            }
            /* 00 and bare digits: a zero-padded id ("0012345678"), not a phone */
            if (digits < 8 || digits > 15 || (intl00 && seps == 0 && !phone_labelled(p, i))) continue;
            uint32_t e = phone_extension(p, n, last_digit + 1);
            if (!num_boundary_after(p, n, e)) continue;
            add_span(out, i, e, D_PHONE);
            i = e;
            continue;
        }
        if (c == '(' || is_digit(c)) {
            if (!num_boundary_before(p, i) || (i > 0 && p[i - 1] == '+') || after_iban_prefix(p, i)) continue;
            /* not inside a hyphenated id ("0c38195a-0118-4916-8763-ba15...": a UUID) */
            if (i >= 2 && p[i - 1] == '-' && is_alnum(p[i - 2])) continue;
            /* not the tail of a longer space-separated digit sequence */
            if (i >= 2 && p[i - 1] == ' ' && is_digit(p[i - 2])) continue;
            uint32_t k = i, e = 0, start = i;
            /* optional NANP country code written as "1-", "1 " or "1." */
            if (c == '1' && i + 2 < n && (p[i + 1] == '-' || p[i + 1] == ' ' || p[i + 1] == '.') &&
                (p[i + 2] == '(' || is_digit(p[i + 2]))) {
                i += 2;
                c = p[i];
            }
            /* North American: (NXX) NXX-XXXX, NXX-NXX-XXXX, NXX.NXX.XXXX, NXX NXX XXXX */
            if (c == '(') {
                if (digits_at(p, n, i + 1) == 3 && i + 4 < n && p[i + 4] == ')' && p[i + 1] >= '2') {
                    k = i + 5;
                    if (k < n && p[k] == ' ') k++;
                    if (digits_at(p, n, k) == 3 && p[k] >= '2' && k + 3 < n && (p[k + 3] == '-' || p[k + 3] == '.' || p[k + 3] == ' ') &&
                        digits_at(p, n, k + 4) == 4) {
                        e = k + 8;
                    }
                }
            } else if (digits_at(p, n, i) == 3 && p[i] >= '2' && i + 3 < n) {
                uint8_t sep = p[i + 3];
                if ((sep == '-' || sep == '.' || sep == ' ') && digits_at(p, n, i + 4) == 3 && p[i + 4] >= '2' && i + 7 < n &&
                    p[i + 7] == sep && digits_at(p, n, i + 8) == 4) {
                    e = i + 12;
                }
            }
            /* national trunk prefix 0: 0AA[A..] BBB[B] CCC[C], 9-12 digits, space or dash */
            if (e == 0 && c == '0') {
                uint32_t g1 = digits_at(p, n, i);
                if (g1 >= 2 && g1 <= 6 && i + g1 < n) {
                    uint8_t sep = p[i + g1];
                    if (sep == ' ' || sep == '-') {
                        uint32_t total = g1, groups = 1;
                        k = i + g1;
                        while (k < n && p[k] == sep && k + 1 < n && is_digit(p[k + 1])) {
                            uint32_t gl = digits_at(p, n, k + 1);
                            if (gl < 2 || gl > 8) break;
                            total += gl;
                            groups++;
                            k += 1 + gl;
                        }
                        /* 9 digits in two groups ("030 128950"); 3-2-4 is an SSN's shape */
                        if (groups >= 2 && total <= 12 && (total >= 10 || (total == 9 && groups == 2))) e = k;
                    }
                } else if ((g1 == 10 || g1 == 11) && p[i + 1] != '0') {
                    e = i + g1; /* unformatted: "0352959869", "02115481789" */
                }
            }
            /* an area code in parentheses, then 7-10 more digits: "(0131) 496 0163",
             * "(11) 96123-7455", "(059)-2382536"; or, after a phone word or in a phone member,
             * any 9 to 12 digits however grouped: "13094964558", "810 12 25 41", "74-9364-5006" */
            if (e == 0) {
                uint32_t digits, groups;
                int paren;
                uint32_t g_end = phone_groups(p, n, start, &digits, &groups, &paren);
                if (g_end > start && digits >= 9 && digits <= 12 && ((paren && groups >= 2) || phone_labelled(p, start))) e = g_end;
            }
            if (e != 0) e = phone_extension(p, n, e);
            if (e != 0 && e + 1 < n && p[e] == '-' && is_alnum(p[e + 1])) e = 0;
            if (e != 0 && num_boundary_after(p, n, e)) {
                add_span(out, start, e, D_PHONE);
                i = e;
            } else {
                i = start;
            }
        }
    }
}

SIMD static void find_ssn(const uint8_t *p, uint32_t n, spans *out) {
    for (uint32_t i = 0; i + 11 <= n; i++) {
        i = skip_to_digit(p, i, n - 10);
        if (i + 11 > n) break;
        if (!is_digit(p[i]) || !num_boundary_before(p, i)) continue;
        if (i >= 2 && p[i - 1] == ' ' && is_digit(p[i - 2])) continue;
        if (digits_at(p, n, i) != 3) continue;
        uint8_t sep = p[i + 3];
        if (sep != '-' && sep != ' ') continue;
        if (digits_at(p, n, i + 4) != 2 || p[i + 6] != sep || digits_at(p, n, i + 7) != 4) continue;
        uint32_t e = i + 11;
        if (!num_boundary_after(p, n, e)) continue;
        uint32_t area = (uint32_t)(p[i] - '0') * 100 + (uint32_t)(p[i + 1] - '0') * 10 + (uint32_t)(p[i + 2] - '0');
        uint32_t group = (uint32_t)(p[i + 4] - '0') * 10 + (uint32_t)(p[i + 5] - '0');
        int serial0 = p[i + 7] == '0' && p[i + 8] == '0' && p[i + 9] == '0' && p[i + 10] == '0';
        if (area == 0 || area == 666 || area >= 900 || group == 0 || serial0) continue;
        add_span(out, i, e, D_SSN);
        i = e;
    }
}

/* IBAN lengths by country (ISO 13616 registry). */
static const struct {
    char cc[3];
    uint8_t len;
} iban_lengths[] = {
    {"AD", 24}, {"AE", 23}, {"AL", 28}, {"AT", 20}, {"AZ", 28}, {"BA", 20}, {"BE", 16}, {"BG", 22}, {"BH", 22},
    {"BR", 29}, {"BY", 28}, {"CH", 21}, {"CR", 22}, {"CY", 28}, {"CZ", 24}, {"DE", 22}, {"DK", 18}, {"DO", 28},
    {"EE", 20}, {"EG", 29}, {"ES", 24}, {"FI", 18}, {"FO", 18}, {"FR", 27}, {"GB", 22}, {"GE", 22}, {"GI", 23},
    {"GL", 18}, {"GR", 27}, {"GT", 28}, {"HR", 21}, {"HU", 28}, {"IE", 22}, {"IL", 23}, {"IQ", 23}, {"IS", 26},
    {"IT", 27}, {"JO", 30}, {"KW", 30}, {"KZ", 20}, {"LB", 28}, {"LC", 32}, {"LI", 21}, {"LT", 20}, {"LU", 20},
    {"LV", 21}, {"MC", 27}, {"MD", 24}, {"ME", 22}, {"MK", 19}, {"MR", 27}, {"MT", 31}, {"MU", 30}, {"NL", 18},
    {"NO", 15}, {"PK", 24}, {"PL", 28}, {"PS", 29}, {"PT", 25}, {"QA", 29}, {"RO", 24}, {"RS", 22}, {"SA", 24},
    {"SC", 31}, {"SE", 24}, {"SI", 19}, {"SK", 24}, {"SM", 27}, {"ST", 25}, {"SV", 28}, {"TL", 23}, {"TN", 24},
    {"TR", 26}, {"UA", 29}, {"VA", 22}, {"VG", 24}, {"XK", 20},
};

static uint32_t iban_length(uint8_t a, uint8_t b) {
    for (uint32_t i = 0; i < sizeof iban_lengths / sizeof iban_lengths[0]; i++) {
        if ((uint8_t)iban_lengths[i].cc[0] == a && (uint8_t)iban_lengths[i].cc[1] == b) return iban_lengths[i].len;
    }
    return 0;
}

static int iban_checksum_ok(const uint8_t *chars, uint32_t n) {
    uint32_t rem = 0;
    for (uint32_t k = 0; k < n; k++) {
        uint8_t c = chars[(k + 4) % n];
        if (is_digit(c)) {
            rem = (rem * 10u + (uint32_t)(c - '0')) % 97u;
        } else {
            uint32_t v = (uint32_t)(c - 'A') + 10u;
            rem = (rem * 100u + v) % 97u;
        }
    }
    return rem == 1;
}

SIMD static void find_iban(const uint8_t *p, uint32_t n, spans *out) {
    for (uint32_t i = 0; i + 15 <= n; i++) {
        i = skip_to_upper(p, i, n - 14);
        if (i + 15 > n) break;
        if (!is_upper(p[i]) || !is_upper(p[i + 1]) || !is_digit(p[i + 2]) || !is_digit(p[i + 3])) continue;
        if (i > 0 && (is_alnum(p[i - 1]) || p[i - 1] == '_')) continue;
        uint32_t want = iban_length(p[i], p[i + 1]);
        uint8_t chars[34];
        uint32_t cn = 0, k = i, end = 0;
        while (k < n && cn < 34) {
            uint8_t c = p[k];
            if (is_digit(c) || is_upper(c)) {
                chars[cn++] = c;
                k++;
                end = k;
                if (want && cn == want) break;
            } else if (c == ' ' && k + 1 < n && (is_digit(p[k + 1]) || is_upper(p[k + 1])) && cn % 4 == 0) {
                k++; /* print format groups of four */
            } else {
                break;
            }
        }
        if (want && cn != want) {
            /* not the registered length: still an account number when the whole token's
             * check digits pass (generators and typos drop or add a character) */
            while (k < n && cn < 34) {
                uint8_t c = p[k];
                if (is_digit(c) || is_upper(c)) {
                    chars[cn++] = c;
                    k++;
                    end = k;
                } else if (c == ' ' && k + 1 < n && (is_digit(p[k + 1]) || is_upper(p[k + 1])) && cn % 4 == 0) {
                    k++;
                } else {
                    break;
                }
            }
            want = 0;
        }
        if (want ? cn != want : (cn < 15 || cn > 34)) continue;
        if (end < n && (is_alnum(p[end]) || p[end] == '_')) continue;
        if (!iban_checksum_ok(chars, cn)) continue;
        add_span(out, i, end, D_IBAN);
        i = end;
    }
}

SIMD static void find_ipv4(const uint8_t *p, uint32_t n, spans *out) {
    for (uint32_t i = 0; i + 7 <= n; i++) {
        i = skip_to_digit(p, i, n - 6);
        if (i + 7 > n) break;
        if (!is_digit(p[i])) continue;
        /* "IP10.0.0.1": CJK text glues the label to the address; other letters before are a
         * version ("v1.2.3.4") or a word */
        int ip_label = i >= 2 && sluice_lower(p[i - 2]) == 'i' && sluice_lower(p[i - 1]) == 'p' && (i == 2 || !is_alnum(p[i - 3]));
        if (i > 0 && !ip_label && (is_alnum(p[i - 1]) || p[i - 1] == '.' || p[i - 1] == '_')) continue;
        uint32_t k = i;
        int ok = 1;
        for (int octet = 0; octet < 4 && ok; octet++) {
            uint32_t len = digits_at(p, n, k);
            if (len == 0 || len > 3 || (len > 1 && p[k] == '0')) {
                ok = 0;
                break;
            }
            uint32_t v = 0;
            for (uint32_t t = 0; t < len; t++) v = v * 10u + (uint32_t)(p[k + t] - '0');
            if (v > 255) ok = 0;
            k += len;
            if (octet < 3) {
                if (k < n && p[k] == '.') k++;
                else ok = 0;
            }
        }
        if (!ok) {
            while (i + 1 < n && (is_digit(p[i + 1]) || p[i + 1] == '.')) i++;
            continue;
        }
        if (k < n && (is_alnum(p[k]) || p[k] == '_' || (p[k] == '.' && k + 1 < n && is_digit(p[k + 1])))) {
            while (i + 1 < n && (is_digit(p[i + 1]) || p[i + 1] == '.')) i++;
            continue;
        }
        add_span(out, i, k, D_IPV4);
        i = k;
    }
}

SIMD static void find_aws_key(const uint8_t *p, uint32_t n, spans *out) {
    static const char prefixes[][5] = {"AKIA", "ASIA", "AGPA", "AIDA", "AROA", "AIPA", "ANPA", "ANVA", "ABIA", "ACCA"};
    for (uint32_t i = 0; i + 20 <= n; i++) {
        i = skip_to_byte(p, i, n - 19, 'A');
        if (i + 20 > n) break;
        if (i > 0 && (is_alnum(p[i - 1]) || p[i - 1] == '_')) continue;
        int pre = 0;
        for (uint32_t t = 0; t < sizeof prefixes / sizeof prefixes[0]; t++) {
            if (memcmp(p + i, prefixes[t], 4) == 0) pre = 1;
        }
        if (!pre) continue;
        int ok = 1;
        for (uint32_t t = 4; t < 20; t++) {
            if (!is_upper(p[i + t]) && !is_digit(p[i + t])) ok = 0;
        }
        if (!ok || (i + 20 < n && (is_alnum(p[i + 20]) || p[i + 20] == '_'))) continue;
        add_span(out, i, i + 20, D_AWS_KEY);
        i += 19;
    }
}

static int secret_value_char(uint8_t c) {
    return is_alnum(c) || c == '/' || c == '+' || c == '=' || c == '_' || c == '-' || c == '.';
}

/* Whether key[0..len) names a secret: its last words, separators and case ignored, are one of
 * secret_keys ("aws.secretKey" and "cloud.aws.credentials.secret-key" end with secret_key),
 * starting at a word: the key's start, after a separator, or an upper-case letter after a
 * lower-case one or digit ("awsSecretKey"). */
static int secret_name_match(const uint8_t *key, uint32_t len) {
    if (len < secret_key_min) return 0;
    uint32_t e = len;
    while (e > 0 && (key[e - 1] == '"' || key[e - 1] == '\'')) e--;
    if (e == 0) return 0;
    uint8_t last = sluice_lower(key[e - 1]);
    if (!(secret_key_last[last >> 5] >> (last & 31) & 1u)) return 0;
    for (uint32_t k = 0; k < secret_key_n; k++) {
        const uint8_t *nm = secret_norm[k];
        uint32_t m = secret_norm_len[k], q = e;
        while (m > 0 && q > 0) {
            uint8_t ch = key[q - 1];
            if (secret_name_sep(ch)) {
                q--;
                continue;
            }
            if (sluice_lower(ch) != nm[m - 1]) break;
            m--;
            q--;
        }
        if (m != 0) continue;
        if (q == 0 || !is_alnum(key[q - 1]) || (is_upper(key[q]) && !is_upper(key[q - 1]))) return 1;
    }
    return 0;
}

static int secret_name_char(uint8_t c) { return is_alnum(c) || secret_name_sep(c) || c == '"' || c == '\''; }

/* NAME=value, NAME: value, "NAME": "value", NAME = 'value' */
SIMD static void find_aws_secret(const uint8_t *p, uint32_t n, spans *out) {
    for (uint32_t i = 0; i < n; i++) {
        i = skip_to_byte2(p, i, n, '=', ':');
        if (i >= n) break;
        uint32_t te = i;
        while (te > 0 && p[te - 1] == ' ') te--;
        uint32_t ts = te;
        while (ts > 0 && secret_name_char(p[ts - 1]) && (p[ts - 1] != ' ' || (ts >= 2 && is_alnum(p[ts - 2]) && te - ts < 64))) ts--;
        while (ts < te && p[ts] == ' ') ts++;
        if (te == ts || !secret_name_match(p + ts, te - ts)) continue;
        uint32_t k = i + 1;
        while (k < n && p[k] == ' ') k++;
        if (k < n && (p[k] == '"' || p[k] == '\'')) k++;
        uint32_t vs = k;
        while (k < n && secret_value_char(p[k])) k++;
        if (k == vs) continue;
        add_span(out, vs, k, D_AWS_SECRET);
        i = k;
    }
}

SIMD static void find_bearer(const uint8_t *p, uint32_t n, spans *out) {
    static const char word[] = "bearer";
    for (uint32_t i = 0; i + 7 < n; i++) {
        i = skip_to_byte2(p, i, n - 7, 'b', 'B');
        if (i + 7 >= n) break;
        if (i > 0 && (is_alnum(p[i - 1]) || p[i - 1] == '_')) continue;
        int ok = 1;
        for (uint32_t t = 0; t < 6 && ok; t++) ok = sluice_lower(p[i + t]) == (uint8_t)word[t];
        if (!ok || p[i + 6] != ' ') continue;
        uint32_t k = i + 6;
        while (k < n && p[k] == ' ') k++;
        uint32_t ts = k;
        int digit = 0;
        while (k < n && (is_alnum(p[k]) || p[k] == '-' || p[k] == '.' || p[k] == '_' || p[k] == '~' || p[k] == '+' || p[k] == '/')) {
            if (is_digit(p[k])) digit = 1;
            k++;
        }
        while (k < n && p[k] == '=') k++;
        uint32_t len = k - ts;
        if (len < 16 && !(len >= 8 && digit)) continue;
        add_span(out, ts, k, D_BEARER);
        i = k;
    }
}

SIMD static void find_jwt(const uint8_t *p, uint32_t n, spans *out) {
    for (uint32_t i = 0; i + 8 < n; i++) {
        i = skip_to_byte(p, i, n - 8, 'e');
        if (i + 8 >= n) break;
        if (p[i] != 'e' || p[i + 1] != 'y' || p[i + 2] != 'J') continue;
        if (i > 0 && is_b64url(p[i - 1])) continue;
        uint32_t k = i;
        while (k < n && is_b64url(p[k])) k++;
        if (k - i < 10 || k >= n || p[k] != '.') continue;
        uint32_t s2 = ++k;
        while (k < n && is_b64url(p[k])) k++;
        if (k - s2 < 10 || p[s2] != 'e' || p[s2 + 1] != 'y' || p[s2 + 2] != 'J' || k >= n || p[k] != '.') continue;
        k++;
        while (k < n && is_b64url(p[k])) k++;
        if (k < n && (p[k] == '.' || p[k] == '=')) continue;
        add_span(out, i, k, D_JWT);
        i = k;
    }
}

/* ------------------------------------------------------------------------------------------ */
/* Triggers: one pass over a string decides which detectors can possibly match               */
/* ------------------------------------------------------------------------------------------ */

/* Every detector needs certain bytes to match at all (an '@', 13 digits, an 'A' ...), and most
 * strings in real records hold none of them. So each string is classified once, and only the
 * detectors whose trigger bytes occur run (candidates); a string none can match is not copied.
 * (SIMD: see the top of the file.) */

/* Byte classes, chosen so that each is a set of low nibbles within a set of high nibbles: a
 * byte's classes are then LO[byte & 15] & HI[byte >> 4], two table lookups (swizzles) per 16
 * bytes. Upper-case letters span two high nibbles, hence two classes. */
enum {
    K_DIGIT = 1 << 7,  /* '0'-'9'; bit 7, the sign bit: a chunk's i8x16.bitmask of its classes is its digits */
    K_UPPER4 = 1 << 1, /* 'A'-'O' (includes the 'J' of "eyJ") */
    K_UPPER5 = 1 << 2, /* 'P'-'Z' */
    K_AT = 1 << 3,     /* '@' */
    K_ASSIGN = 1 << 4, /* ':' '=' */
    K_B = 1 << 5,      /* 'B' 'b' */
    K_DOT = 1 << 6,    /* '.' */
    K_A = 1 << 0,      /* 'A' */
    K_UPPER = K_UPPER4 | K_UPPER5,
};

/* classes by low nibble (byte & 15) */
static const uint8_t class_lo[16] = {
    [0x0] = K_DIGIT | K_UPPER5 | K_AT,           /* '0' 'P' '@' */
    [0x1] = K_DIGIT | K_UPPER4 | K_UPPER5 | K_A, /* '1' 'A' 'Q' */
    [0x2] = K_DIGIT | K_UPPER4 | K_UPPER5 | K_B, /* '2' 'B' 'R' 'b' */
    [0x3 ... 0x9] = K_DIGIT | K_UPPER4 | K_UPPER5,
    [0xa] = K_UPPER4 | K_UPPER5 | K_ASSIGN, /* 'J' 'Z' ':' */
    [0xb ... 0xc] = K_UPPER4,
    [0xd] = K_UPPER4 | K_ASSIGN, /* 'M' '=' */
    [0xe] = K_UPPER4 | K_DOT,    /* 'N' '.' */
    [0xf] = K_UPPER4,
};

/* classes by high nibble (byte >> 4); bytes >= 0x80 are in none */
static const uint8_t class_hi[16] = {
    [0x2] = K_DOT,
    [0x3] = K_DIGIT | K_ASSIGN,
    [0x4] = K_UPPER4 | K_AT | K_B | K_A,
    [0x5] = K_UPPER5,
    [0x6] = K_B,
};

static uint32_t byte_class(uint8_t c) { return (uint32_t)(class_lo[c & 15] & class_hi[c >> 4]); }

typedef struct {
    uint32_t classes; /* K_* bits of the bytes present */
    uint32_t digits;  /* how many ASCII digits */
    uint32_t wide;    /* a byte 0xEF or 0xE3 is present: maybe a full-width form (wide_at) */
} triggers;

/* Classifies chunks into acc (the union of their classes) and digits. */
typedef struct {
    v128_t lo, hi, acc;
    uint32_t digits;
} tacc;

SIMD static void tacc_init(tacc *x) {
    x->lo = wasm_v128_load(class_lo);
    x->hi = wasm_v128_load(class_hi);
    x->acc = wasm_i64x2_splat(0);
    x->digits = 0;
}

/* Byte 0 is in no class, so a partial chunk is classified with its other lanes cleared. */
SIMD static void tacc_add(tacc *x, v128_t v) {
    /* both indices are below 16, where the relaxed swizzle is exact (no saturating add) */
    v128_t lo = wasm_i8x16_relaxed_swizzle(x->lo, wasm_v128_and(v, wasm_i8x16_splat(15)));
    v128_t hi = wasm_i8x16_relaxed_swizzle(x->hi, wasm_u8x16_shr(v, 4));
    v128_t cls = wasm_v128_and(lo, hi);
    x->acc = wasm_v128_or(x->acc, cls);
    x->digits += (uint32_t)__builtin_popcount(wasm_i8x16_bitmask(cls)); /* K_DIGIT is the sign bit */
}

/* The triggers collected: the lanes of acc OR-ed together (as two 64-bit halves, folded). */
SIMD static triggers tacc_done(const tacc *x) {
    uint64_t a = wasm_i64x2_extract_lane(x->acc, 0) | wasm_i64x2_extract_lane(x->acc, 1);
    a |= a >> 32;
    a |= a >> 16;
    a |= a >> 8;
    triggers t = {(uint32_t)(a & 0xff), x->digits, 0};
    return t;
}

/* The lead bytes of the full-width forms and the ideographic space (see wide_at). */
SIMD static v128_t wide_leads(v128_t v) {
    return wasm_v128_or(wasm_i8x16_eq(v, wasm_i8x16_splat((int8_t)0xEF)), wasm_i8x16_eq(v, wasm_i8x16_splat((int8_t)0xE3)));
}

/* The triggers of p[0..n). Bytes up to `readable` may be loaded (not classified): a string
 * inside a larger buffer then needs no byte-by-byte tail. (Plain ASCII JSON strings, nearly
 * all of them, are classified by jstring_classify instead and cannot hold a wide form.) */
SIMD static triggers scan_triggers(const uint8_t *p, uint32_t n, const uint8_t *readable) {
    tacc x;
    tacc_init(&x);
    v128_t wide = wasm_i64x2_splat(0);
    uint32_t i = 0;
    for (; n - i >= 16; i += 16) {
        v128_t v = wasm_v128_load(p + i);
        tacc_add(&x, v);
        wide = wasm_v128_or(wide, wide_leads(v));
    }
    triggers t;
    if (i < n && readable - (p + i) >= 16) {
        v128_t v = first_lanes(wasm_v128_load(p + i), n - i);
        tacc_add(&x, v);
        wide = wasm_v128_or(wide, wide_leads(v));
        i = n;
    }
    t = tacc_done(&x);
    t.wide = wasm_v128_any_true(wide);
    for (; i < n; i++) {
        uint32_t k = byte_class(p[i]);
        t.classes |= k;
        t.digits += k >> 7; /* K_DIGIT */
        t.wide |= p[i] == 0xEF || p[i] == 0xE3;
    }
    return t;
}

/* How many '.' p[0..n) holds (an IPv4 address needs three). */
SIMD static uint32_t count_dots(const uint8_t *p, uint32_t n, const uint8_t *readable) {
    uint32_t dots = 0, i = 0;
    for (; n - i >= 16; i += 16) dots += (uint32_t)__builtin_popcount(wasm_i8x16_bitmask(wasm_i8x16_eq(wasm_v128_load(p + i), wasm_i8x16_splat('.'))));
    if (i < n && readable - (p + i) >= 16) return dots + (uint32_t)__builtin_popcount(wasm_i8x16_bitmask(wasm_i8x16_eq(first_lanes(wasm_v128_load(p + i), n - i), wasm_i8x16_splat('.'))));
    for (; i < n; i++) dots += p[i] == '.';
    return dots;
}

/* Whether p[0..n) may hold an IPv4 address: find_ipv4 needs three dots, each between two
 * digits. A string of at most 32 bytes (an e-mail address with four digits asks this: its dots
 * follow letters) is checked exactly so with two loads; a longer one by its number of dots. */
SIMD static inline __attribute__((always_inline)) int ipv4_possible(const uint8_t *p, uint32_t n, const uint8_t *readable) {
    if (n <= 32 && readable - p >= 32) {
        v128_t a = wasm_v128_load(p), b = wasm_v128_load(p + 16), dot = wasm_i8x16_splat('.');
        uint32_t live = n < 32 ? (1u << n) - 1u : 0xffffffffu;
        uint32_t dots = ((uint32_t)wasm_i8x16_bitmask(wasm_i8x16_eq(a, dot)) | (uint32_t)wasm_i8x16_bitmask(wasm_i8x16_eq(b, dot)) << 16) & live;
        uint32_t digits = ((uint32_t)wasm_i8x16_bitmask(in_range(a, '0', 10)) | (uint32_t)wasm_i8x16_bitmask(in_range(b, '0', 10)) << 16) & live;
        return __builtin_popcount(dots & (digits << 1) & (digits >> 1)) >= 3;
    }
    return count_dots(p, n, readable) >= 3;
}

/* Card, phone and ssn matches lie inside one run of "numeric" bytes: digits and the
 * separators and punctuation these detectors accept inside a match (space - _ . ( ) +).
 * Hex ids, hashes and UUIDs hold many digits but in short runs between letters, so the most
 * digits any one run holds rules all three out for them (a card needs 12, a phone 8, an SSN
 * 9). An SSN also needs a run of exactly three digits; a phone one of three, a '+' or '0', or
 * a numeric run of 8 to 15 digits (a bare number: "3755648665"), so that a card number ("4111
 * 1111 1111 1111": 16 digits, no run of three, no 0) is not searched for phones. Returns the
 * detectors among card, phone and ssn that can match. */
static uint32_t numeric_verdict(uint32_t best, int run3, int plus_or_zero, int phone_run) {
    return (best >= 12 ? 1u << D_CARD : 0) | (best >= 8 && (run3 || plus_or_zero || phone_run) ? 1u << D_PHONE : 0) |
           (best >= 9 && run3 ? 1u << D_SSN : 0);
}

static int numeric_byte(uint8_t c) {
    return is_digit(c) || c == ' ' || c == '-' || c == '_' || c == '.' || c == '(' || c == ')' || c == '+';
}

/* One byte of numeric_possible's scan (its state: run, run3, plus_or_zero, in_numeric, best,
 * phone_run). */
#define NUMERIC_STEP(byte)                                                \
    do {                                                                  \
        uint8_t ch = (byte);                                              \
        if (numeric_byte(ch)) {                                           \
            in_numeric += is_digit(ch) ? 1u : 0u;                         \
        } else {                                                          \
            if (in_numeric > best) best = in_numeric;                     \
            phone_run |= in_numeric >= 8 && in_numeric <= 15;             \
            in_numeric = 0;                                               \
        }                                                                 \
        if (is_digit(ch)) {                                               \
            run++;                                                        \
            plus_or_zero |= ch == '0';                                    \
        } else {                                                          \
            run3 |= run == 3;                                             \
            run = 0;                                                      \
            plus_or_zero |= ch == '+';                                    \
        }                                                                 \
    } while (0)

/* The classes of a string of at most 64 bytes that may be loaded in whole 16-byte steps, as
 * bit masks (bit i for p[i], bits from n on clear), for numeric_possible's and
 * phone_possible's checks: one pass over the bytes serves both. */
typedef struct {
    uint64_t digits, zero, plus, numeric; /* numeric: digits and ' ' _ ( ) + - . */
    uint64_t sep, sep3, one, other;       /* sep: ' ' - . , / :  sep3: ' ' - .  other: + ( letters >= 0x80 */
} num_masks;

SIMD static inline __attribute__((always_inline)) void num_masks_of(const uint8_t *p, uint32_t n, num_masks *m) {
    uint64_t digits = 0, zero = 0, plus = 0, numeric = 0, sep = 0, sep3 = 0, one = 0, other = 0;
    for (uint32_t i = 0; i < n; i += 16) {
        v128_t v = wasm_v128_load(p + i);
        if (n - i < 16) v = first_lanes(v, n - i);
        v128_t d = in_range(v, '0', 10);
        v128_t pl = wasm_i8x16_eq(v, wasm_i8x16_splat('+'));
        v128_t paren = wasm_i8x16_eq(v, wasm_i8x16_splat('('));
        v128_t s3 = wasm_v128_or(wasm_i8x16_eq(v, wasm_i8x16_splat(' ')), wasm_v128_or(wasm_i8x16_eq(v, wasm_i8x16_splat('-')), wasm_i8x16_eq(v, wasm_i8x16_splat('.'))));
        v128_t sp = wasm_v128_or(s3, wasm_v128_or(wasm_i8x16_eq(v, wasm_i8x16_splat(',')), wasm_v128_or(wasm_i8x16_eq(v, wasm_i8x16_splat('/')), wasm_i8x16_eq(v, wasm_i8x16_splat(':')))));
        /* ' ' ( ) + - . are 0x20 0x28 0x29 0x2B 0x2D 0x2E; '_' is 0x5F */
        v128_t num = wasm_v128_or(wasm_v128_or(d, s3), wasm_v128_or(wasm_v128_or(pl, paren), wasm_v128_or(wasm_i8x16_eq(v, wasm_i8x16_splat(')')), wasm_i8x16_eq(v, wasm_i8x16_splat('_')))));
        /* '+', '(', letters and bytes >= 0x80 (signed: below zero) */
        v128_t o = wasm_v128_or(wasm_v128_or(pl, paren), wasm_v128_or(in_range(wasm_v128_or(v, wasm_i8x16_splat(0x20)), 'a', 26), wasm_i8x16_lt(v, wasm_i8x16_splat(0))));
        digits |= (uint64_t)wasm_i8x16_bitmask(d) << i;
        zero |= (uint64_t)wasm_i8x16_bitmask(wasm_i8x16_eq(v, wasm_i8x16_splat('0'))) << i;
        plus |= (uint64_t)wasm_i8x16_bitmask(pl) << i;
        numeric |= (uint64_t)wasm_i8x16_bitmask(num) << i;
        sep |= (uint64_t)wasm_i8x16_bitmask(sp) << i;
        sep3 |= (uint64_t)wasm_i8x16_bitmask(s3) << i;
        one |= (uint64_t)wasm_i8x16_bitmask(wasm_i8x16_eq(v, wasm_i8x16_splat('1'))) << i;
        other |= (uint64_t)wasm_i8x16_bitmask(o) << i;
    }
    m->digits = digits;
    m->zero = zero;
    m->plus = plus;
    m->numeric = numeric;
    m->sep = sep;
    m->sep3 = sep3;
    m->one = one;
    m->other = other;
}

/* numeric_possible of a short string, from its masks */
static inline __attribute__((always_inline)) uint32_t numeric_verdict_masks(const num_masks *m) {
    uint64_t digits = m->digits, numeric = m->numeric;
    /* a run of exactly three: starts, has its next two digits and not a third */
    uint64_t run3 = digits & ~(digits << 1) & (digits >> 1) & (digits >> 2) & ~(digits >> 3);
    uint32_t best = 0;
    int phone_run = 0;
    while (numeric) {
        uint32_t s = (uint32_t)__builtin_ctzll(numeric);
        uint64_t after = ~(numeric >> s);
        uint32_t len = after ? (uint32_t)__builtin_ctzll(after) : 64 - s;
        uint64_t run = (len >= 64 ? ~(uint64_t)0 : ((uint64_t)1 << len) - 1) << s;
        uint32_t d = (uint32_t)__builtin_popcountll(digits & run);
        if (d > best) best = d;
        phone_run |= d >= 8 && d <= 15;
        numeric &= ~run;
    }
    return numeric_verdict(best, run3 != 0, (m->zero | m->plus) != 0, phone_run);
}

/* Whether a string may hold a card, phone or ssn (see numeric_verdict); strings of at most 64
 * bytes that may be loaded whole are classified by num_masks_of instead. */
SIMD static uint32_t numeric_possible(const uint8_t *p, uint32_t n) {
    uint32_t run = 0, run3 = 0, plus_or_zero = 0, in_numeric = 0, best = 0;
    int phone_run = 0;
    uint32_t i = 0;
    /* Long strings, byte by byte, except 16-byte blocks without a digit (most of a text): in
     * one of those every byte leaves the digit counts as they are, so the block only ends the
     * current numeric run if it holds a byte outside the run's class, ends the digit run, and
     * may hold a '+'. */
    for (; n - i >= 16; i += 16) {
        v128_t v = wasm_v128_load(p + i);
        if (wasm_v128_any_true(in_range(v, '0', 10))) {
            for (uint32_t k = i; k < i + 16; k++) NUMERIC_STEP(p[k]);
            continue;
        }
        v128_t plus = wasm_i8x16_eq(v, wasm_i8x16_splat('+'));
        v128_t sep = wasm_v128_or(wasm_v128_or(wasm_i8x16_eq(v, wasm_i8x16_splat(' ')), wasm_i8x16_eq(v, wasm_i8x16_splat('_'))),
                                  wasm_v128_or(wasm_v128_or(wasm_i8x16_eq(v, wasm_i8x16_splat('(')), wasm_i8x16_eq(v, wasm_i8x16_splat(')'))),
                                               wasm_v128_or(plus, wasm_v128_or(wasm_i8x16_eq(v, wasm_i8x16_splat('-')), wasm_i8x16_eq(v, wasm_i8x16_splat('.'))))));
        if (!wasm_i8x16_all_true(sep)) {
            if (in_numeric > best) best = in_numeric;
            phone_run |= in_numeric >= 8 && in_numeric <= 15;
            in_numeric = 0;
        }
        run3 |= run == 3;
        run = 0;
        plus_or_zero |= (uint32_t)wasm_v128_any_true(plus);
    }
    for (; i < n; i++) NUMERIC_STEP(p[i]);
    run3 |= run == 3;
    if (in_numeric > best) best = in_numeric;
    phone_run |= in_numeric >= 8 && in_numeric <= 15;
    return numeric_verdict(best, run3 != 0, plus_or_zero != 0, phone_run);
}

/* Whether the member being scanned has a phone word in its name (phone_word_in), remembered
 * for the last name asked about: records of one topic repeat their member names, and this is
 * asked for nearly every card number (phone_possible). */
static uint8_t member_seen[32];
static uint32_t member_seen_len = 0xffffffffu;
static int member_seen_phone;

static __attribute__((noinline)) int member_is_phone_slow(void) {
    if (member_len == member_seen_len && memcmp(member_name, member_seen, member_len) == 0) return member_seen_phone;
    int r = phone_word_in(member_name, member_len);
    if (member_len <= sizeof member_seen) {
        memcpy(member_seen, member_name, member_len);
        member_seen_len = member_len;
        member_seen_phone = r;
    }
    return r;
}

/* member_is_phone_slow with the usual answer in line: a name of at most 16 bytes equal to the
 * one remembered, compared as one vector (a call costs the guest about 5 ns, and a card number
 * holding a 0 asks this). */
SIMD static inline __attribute__((always_inline)) int member_is_phone(void) {
    if (member_name == NULL) return 0;
    if (member_len == member_seen_len && member_len <= 16 && mem_readable() - member_name >= 16) {
        v128_t diff = wasm_v128_xor(wasm_v128_load(member_name), wasm_v128_load(member_seen));
        if (!wasm_v128_any_true(first_lanes(diff, member_len))) return member_seen_phone;
    }
    return member_is_phone_slow();
}

/* Whether find_phone can match in a short string (num_masks_of) that numeric_possible let
 * through: each of its ways to a match needs one of these. '+' (E.164); a '0' starting a run of
 * digits that find_phone tries as a start (00 for '+', a trunk prefix 0); a run of exactly
 * three digits (North American groups); '(' (an area code in parentheses); or a phone label,
 * which is a phone word in the member's name or in the string (letters or UTF-8, before the
 * number). A card number printed in groups of four ("4111 1111 1111 1230", "4111 1111 1111
 * 0123") has none of them, so the phone detector does not run on it. Strings over 64 bytes (or
 * not loadable in whole 16-byte steps) are not checked: the phone detector runs on them. */
static inline __attribute__((always_inline)) int phone_possible(const num_masks *m) {
    uint64_t digits = m->digits, zero = m->zero;
    uint64_t starts = digits & ~(digits << 1);
    uint64_t run3 = starts & (digits >> 1) & (digits >> 2) & ~(digits >> 3);
    /* The 0s find_phone tries: both its branches pass over a start after one of ' ' . , - / :
     * that follows a digit (num_boundary_before and the space rule: the tail of a longer
     * number), except a 0 after a NANP country code "1-", "1 " or "1." whose 1 starts a run
     * (the digit branch steps over the code and tries the 0 as a trunk prefix). */
    uint64_t zero_starts = zero & starts & ~((m->sep << 1) & (digits << 2));
    uint64_t after_code = zero & (m->sep3 << 1) & (m->one << 2) & ~(digits << 3);
    if (m->other || zero_starts || after_code || run3) return 1;
    return member_is_phone();
}

/* candidates' set c with card, phone and ssn kept only where p[0..n) can hold them; out of
 * line (jreplace_masked_copy says why: few strings have 8 digits or more). */
SIMD static __attribute__((noinline)) uint32_t numeric_candidates(uint32_t c, const uint8_t *p, uint32_t n, const uint8_t *readable) {
    const uint32_t cps = 1u << D_CARD | 1u << D_PHONE | 1u << D_SSN;
    if (n <= 64 && readable - p >= (int32_t)((n + 15) & ~15u)) {
        num_masks m;
        num_masks_of(p, n, &m);
        c &= ~cps | numeric_verdict_masks(&m);
        if ((c & (1u << D_PHONE)) && !phone_possible(&m)) c &= ~(1u << D_PHONE);
    } else {
        c &= ~cps | numeric_possible(p, n);
    }
    return c;
}

/* The enabled detectors that can match a string of n bytes with triggers t, as a bit set.
 * Each condition is something the detector cannot match without, so skipping the others
 * changes nothing: a card has 12-19 digits; a phone 8+ (E.164) or 9+ (national formats); an
 * SSN 9; an IBAN an upper-case country code and 2 check digits; an IPv4 address 4 digits, 3 dots
 * and 7 bytes; an AWS key id starts with 'A'; a secret needs '=' or ':'; a JWT "eyJ" and dots;
 * a bearer token "bearer". */
static inline __attribute__((always_inline)) uint32_t candidates(triggers t, const uint8_t *p, uint32_t n, const uint8_t *readable) {
    uint32_t c = 0;
    if (t.classes & K_AT) c |= 1u << D_EMAIL;
    if (t.digits >= 12) c |= 1u << D_CARD;
    if (t.digits >= 8) c |= 1u << D_PHONE;
    if (t.digits >= 9) c |= 1u << D_SSN;
    if (t.digits >= 2 && (t.classes & K_UPPER)) c |= 1u << D_IBAN;
    if (t.digits >= 4 && (t.classes & K_DOT) && n >= 7 && (enabled_detectors >> D_IPV4 & 1u) && ipv4_possible(p, n, readable)) c |= 1u << D_IPV4;
    if (t.classes & K_A) c |= 1u << D_AWS_KEY;
    if (t.classes & K_ASSIGN) c |= 1u << D_AWS_SECRET;
    if ((t.classes & K_UPPER4) && (t.classes & K_DOT)) c |= 1u << D_JWT;
    if (t.classes & K_B) c |= 1u << D_BEARER;
    c &= enabled_detectors;
    if (c & (1u << D_CARD | 1u << D_PHONE | 1u << D_SSN)) c = numeric_candidates(c, p, n, readable);
    return c;
}

/* Luhn's check of 16 digits (d: their values, the first in lane 0): from the right every second
 * digit doubled (its digit sum), i.e. lanes 0, 2, .. 14; one vector step, as luhn_groups sums
 * a group. */
SIMD static inline __attribute__((always_inline)) int luhn16(v128_t d) {
    const v128_t table = wasm_u8x16_make(0, 2, 4, 6, 8, 1, 3, 5, 7, 9, 0, 0, 0, 0, 0, 0);
    const v128_t even_lanes = wasm_u8x16_make(255, 0, 255, 0, 255, 0, 255, 0, 255, 0, 255, 0, 255, 0, 255, 0);
    v128_t vals = wasm_v128_bitselect(wasm_i8x16_swizzle(table, d), d, even_lanes);
    v128_t s32 = wasm_u32x4_extadd_pairwise_u16x8(wasm_u16x8_extadd_pairwise_u8x16(vals));
    uint32_t sum = (uint32_t)(wasm_i32x4_extract_lane(s32, 0) + wasm_i32x4_extract_lane(s32, 1) + wasm_i32x4_extract_lane(s32, 2) + wasm_i32x4_extract_lane(s32, 3));
    return sum % 10 == 0;
}

/* The commonest card strings, 16 digits alone or in four groups of four joined by one space,
 * dash or underscore ("4111 1111 1111 1111"), decided before candidates and find_card. A string
 * of that exact shape (t: 16 digits, no other trigger class) can hold no match but a card's or a
 * phone's. The phone detector would not run on it (candidates, phone_possible) unless it holds a
 * '0' and a 0 starts a group that no separator of phone_possible's precedes, or the member is a
 * phone's. find_card tries the whole string first (groups 0 to 3) and, only with spaces, the
 * 12-digit windows of groups 0-2 and 1-3, which need a Maestro prefix (card_issuer_ok). So
 * without those, the string's one possible match is the whole string, when it passes the
 * issuer and Luhn checks. Returns 1 with s holding what find_spans would find (nothing or
 * [0, n)), 0 to take the general path (which decides every other case). */
SIMD static inline __attribute__((always_inline)) int card_shape(const uint8_t *p, uint32_t n, spans *s, const uint8_t *readable) {
    if (!(enabled_detectors >> D_CARD & 1u) || readable - p < 32) return 0;
    v128_t v = wasm_v128_load(p), digits = v;
    uint8_t sep = 0;
    if (n == 19) {
        sep = p[4];
        if ((sep != ' ' && sep != '-' && sep != '_') || p[9] != sep || p[14] != sep) return 0;
        /* 16 digits in 19 bytes with the separators placed: every other byte is a digit;
         * gathered from p[0..16) and p[3..19) (lanes 12-15 of the second are p[15..19)) */
        const v128_t from_v = wasm_i8x16_make(0, 1, 2, 3, 5, 6, 7, 8, 10, 11, 12, 13, -1, -1, -1, -1);
        const v128_t from_w = wasm_i8x16_make(-1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, 12, 13, 14, 15);
        digits = wasm_v128_or(wasm_i8x16_swizzle(v, from_v), wasm_i8x16_swizzle(wasm_v128_load(p + 3), from_w));
    } else if (n != 16) {
        return 0;
    }
    digits = wasm_i8x16_sub(digits, wasm_i8x16_splat('0'));
    if ((enabled_detectors >> D_PHONE & 1u) && wasm_v128_any_true(wasm_i8x16_eq(digits, wasm_i8x16_splat(0)))) {
        /* '_' is not among phone_possible's separators: a group's 0 after it starts a run */
        if (p[0] == '0' || (sep == '_' && (p[5] == '0' || p[10] == '0' || p[15] == '0')) || member_is_phone()) return 0;
    }
    uint32_t p4 = (uint32_t)(p[0] - '0') * 1000u + (uint32_t)(p[1] - '0') * 100u + (uint32_t)(p[2] - '0') * 10u + (uint32_t)(p[3] - '0');
    spans_init(s);
    if (p[0] < '7' && card_issuer_ok(p4, 16) && luhn16(digits)) {
        add_span(s, 0, n, D_CARD);
        return 1;
    }
    if (sep == ' ') {
        uint32_t q4 = (uint32_t)(p[5] - '0') * 1000u + (uint32_t)(p[6] - '0') * 100u + (uint32_t)(p[7] - '0') * 10u + (uint32_t)(p[8] - '0');
        if (card_issuer_ok(p4, 12) || card_issuer_ok(q4, 12)) return 0;
    }
    return 1;
}

/* Run the detectors in the set c on p[0..n). */
SIMD static void find_spans(const uint8_t *p, uint32_t n, uint32_t c, spans *s, const uint8_t *readable) {
    if (c & (1u << D_EMAIL)) {
        if (n <= 64 && readable - p >= (int32_t)((n + 15) & ~15u)) find_email_short(p, n, s);
        else find_email(p, n, s);
    }
    if (c & (1u << D_CARD)) find_card(p, n, s, readable);
    if (c & (1u << D_PHONE)) find_phone(p, n, s);
    if (c & (1u << D_SSN)) find_ssn(p, n, s);
    if (c & (1u << D_IBAN)) find_iban(p, n, s);
    if (c & (1u << D_IPV4)) find_ipv4(p, n, s);
    if (c & (1u << D_AWS_KEY)) find_aws_key(p, n, s);
    if (c & (1u << D_AWS_SECRET)) find_aws_secret(p, n, s);
    if (c & (1u << D_JWT)) find_jwt(p, n, s);
    if (c & (1u << D_BEARER)) find_bearer(p, n, s);
}

/* ------------------------------------------------------------------------------------------ */
/* Masking                                                                                    */
/* ------------------------------------------------------------------------------------------ */

static int utf8_step(const uint8_t *p, uint32_t i, uint32_t end) {
    if (p[i] < 0x80) return 1;
    int n = sluice_utf8_len(p + i, p + end);
    return n ? n : 1;
}

/* With preserve_format, separators and punctuation stay, full-width ones too ("－", "＠",
 * U+3000); every other character is masked (letters and digits of any script). */
static int maskable(const mask_rule *r, const uint8_t *p, uint32_t i, uint32_t end) {
    if (!r->preserve_format) return 1;
    if (p[i] < 0x80) return is_alnum(p[i]);
    uint8_t ascii = wide_at(p, i, end);
    return ascii == 0 || is_alnum(ascii);
}

/* Mask whole 16-byte chunks of ASCII from p[s] on into w with the one-byte mask, every
 * maskable character masked; returns where the chunks stopped (at a non-ASCII byte or fewer
 * than 16 bytes before e). */
SIMD static uint32_t mask_ascii_chunks(uint8_t *w, const uint8_t *p, uint32_t s, uint32_t e, uint8_t mask, int preserve_format) {
    v128_t m = wasm_i8x16_splat((int8_t)mask);
    uint32_t i = s;
    for (; e - i >= 16; i += 16) {
        v128_t v = wasm_v128_load(p + i);
        if (wasm_i8x16_bitmask(v)) break; /* a byte >= 0x80 */
        v128_t out = m;
        if (preserve_format) {
            v128_t digit = wasm_u8x16_lt(wasm_i8x16_sub(v, wasm_i8x16_splat('0')), wasm_i8x16_splat(10));
            v128_t alpha = wasm_u8x16_lt(wasm_i8x16_sub(wasm_v128_or(v, wasm_i8x16_splat(0x20)), wasm_i8x16_splat('a')), wasm_i8x16_splat(26));
            out = wasm_v128_bitselect(m, v, wasm_v128_or(digit, alpha));
        }
        wasm_v128_store(w + (i - s), out);
    }
    if (i < e && e - i < 16 && e - s >= 16) {
        /* the last 16 bytes, overlapping: each output byte depends on its input byte only */
        v128_t v = wasm_v128_load(p + e - 16);
        if (wasm_i8x16_bitmask(v)) return i;
        v128_t out = m;
        if (preserve_format) {
            v128_t digit = wasm_u8x16_lt(wasm_i8x16_sub(v, wasm_i8x16_splat('0')), wasm_i8x16_splat(10));
            v128_t alpha = wasm_u8x16_lt(wasm_i8x16_sub(wasm_v128_or(v, wasm_i8x16_splat(0x20)), wasm_i8x16_splat('a')), wasm_i8x16_splat(26));
            out = wasm_v128_bitselect(m, v, wasm_v128_or(digit, alpha));
        }
        wasm_v128_store(w + (e - 16 - s), out);
        return e;
    }
    return i;
}

/* Append the masked form of p[s..e) to out. It runs for every match, so it reserves once and
 * writes in place rather than appending character by character. */
static void put_masked(sluice_buf *out, const uint8_t *p, uint32_t s, uint32_t e, const mask_rule *r) {
    if (!sluice_is_null(r->replacement)) {
        sluice_buf_put_bytes(out, r->replacement);
        return;
    }
    uint32_t mlen = (uint32_t)r->mask.len;
    /* how many maskable characters to mask: all of them unless keep_last leaves some visible;
     * e - s is at least their number */
    uint32_t hide = e - s;
    if (r->keep_last != 0 || mlen != 1) {
        uint32_t total = 0;
        for (uint32_t i = s; i < e; i += (uint32_t)utf8_step(p, i, e)) {
            if (maskable(r, p, i, e)) total++;
        }
        uint32_t keep = (uint32_t)r->keep_last;
        if (keep >= total) keep = 0; /* never reveal a whole match */
        hide = total - keep;
    }
    /* every hidden character is at least one byte and becomes one mask: an upper bound */
    uint64_t most = (uint64_t)(e - s) + (uint64_t)hide * (mlen - 1u);
    if (most > 0x7fffffffu) {
        out->failed = 1;
        return;
    }
    if (!sluice_buf_reserve(out, (uint32_t)most)) return;
    uint8_t *w = out->ptr + out->len;
    uint32_t i = s, seen = 0;
    if (mlen == 1 && hide == e - s) {
        i = mask_ascii_chunks(w, p, s, e, r->mask.ptr[0], r->preserve_format);
        w += i - s;
    }
    while (i < e) {
        uint32_t step = (uint32_t)utf8_step(p, i, e);
        if (maskable(r, p, i, e) && seen++ < hide) {
            if (mlen == 1) {
                *w++ = r->mask.ptr[0];
            } else {
                memcpy(w, r->mask.ptr, mlen);
                w += mlen;
            }
        } else {
            for (uint32_t k = 0; k < step; k++) *w++ = p[i + k];
        }
        i += step;
    }
    out->len = (uint32_t)(w - out->ptr);
}

/* Whether s[0..n) holds a byte a JSON string literal must escape. */
SIMD static int needs_escape(const uint8_t *s, uint32_t n) {
    uint32_t i = 0;
    for (; n - i >= 16; i += 16) {
        v128_t v = wasm_v128_load(s + i);
        v128_t esc = wasm_v128_or(wasm_v128_or(wasm_i8x16_eq(v, wasm_i8x16_splat('"')), wasm_i8x16_eq(v, wasm_i8x16_splat('\\'))),
                                  wasm_u8x16_lt(v, wasm_i8x16_splat(0x20)));
        if (wasm_v128_any_true(esc)) return 1;
    }
    for (; i < n; i++) {
        if (s[i] == '"' || s[i] == '\\' || s[i] < 0x20) return 1;
    }
    return 0;
}

/* Append s[0..n) as a JSON string literal: the same bytes as sluice_buf_put_json_string,
 * reserved once instead of byte by byte. */
static void put_json_string(sluice_buf *b, const uint8_t *s, uint32_t n) {
    if (!needs_escape(s, n)) {
        if (!sluice_buf_reserve(b, n + 2u)) return;
        b->ptr[b->len] = '"';
        if (n) memcpy(b->ptr + b->len + 1, s, n);
        b->ptr[b->len + 1 + n] = '"';
        b->len += n + 2u;
        return;
    }
    static const char hex[] = "0123456789abcdef";
    uint64_t size = 2u + (uint64_t)n;
    for (uint32_t i = 0; i < n; i++) {
        uint8_t c = s[i];
        if (c == '"' || c == '\\') size += 1;
        else if (c < 0x20) size += (c == '\n' || c == '\r' || c == '\t' || c == '\b' || c == '\f') ? 1 : 5;
    }
    if (size > 0x7fffffffu) {
        b->failed = 1;
        return;
    }
    if (!sluice_buf_reserve(b, (uint32_t)size)) return;
    uint8_t *w = b->ptr + b->len;
    *w++ = '"';
    for (uint32_t i = 0; i < n; i++) {
        uint8_t c = s[i];
        if (c == '"' || c == '\\') {
            *w++ = '\\';
            *w++ = c;
        } else if (c < 0x20) {
            *w++ = '\\';
            switch (c) {
            case '\n': *w++ = 'n'; break;
            case '\r': *w++ = 'r'; break;
            case '\t': *w++ = 't'; break;
            case '\b': *w++ = 'b'; break;
            case '\f': *w++ = 'f'; break;
            default:
                *w++ = 'u';
                *w++ = '0';
                *w++ = '0';
                *w++ = (uint8_t)hex[c >> 4];
                *w++ = (uint8_t)hex[c & 15];
            }
        } else {
            *w++ = c;
        }
    }
    *w++ = '"';
    b->len = (uint32_t)(w - b->ptr);
}

static inline __attribute__((always_inline)) void sort_spans(spans *s) {
    for (uint32_t i = 1; i < s->n; i++) {
        span x = s->v[i];
        uint32_t j = i;
        while (j > 0) {
            span *y = &s->v[j - 1];
            int after = y->start > x.start || (y->start == x.start && (y->end < x.end || (y->end == x.end && y->det > x.det)));
            if (!after) break;
            s->v[j] = *y;
            j--;
        }
        s->v[j] = x;
    }
}

/* The matches of the detectors in the set c (see candidates) in p[0..n), sorted into s;
 * returns 0 when memory ran out. */
static inline __attribute__((always_inline)) int collect_spans(const uint8_t *p, uint32_t n, uint32_t c, spans *s, const uint8_t *readable) {
    spans_init(s);
    if (n == 0 || c == 0) return 1;
    find_spans(p, n, c, s, readable);
    if (s->failed) return 0;
    sort_spans(s);
    return 1;
}

/* A copy of a string with its full-width forms replaced by the ASCII characters they stand for
 * (one byte each; every other byte copied), and where those characters are in the copy: an
 * offset k of the copy is offset k + 2 * (forms before k) of the original (each form is 3
 * bytes there, 1 here). Memory: the copy and 4 bytes per form, not per byte. */
typedef struct {
    uint8_t *text; /* n bytes, then 16 readable bytes (the detectors' whole-chunk loads) */
    uint32_t n;
    uint32_t *forms; /* offsets in text of the replaced characters, ascending */
    uint32_t form_n;
} wide_copy;

/* Fills w and returns 1 when p[0..n) holds a full-width form, 0 when it holds none, -1 when
 * memory ran out. */
static int normalise_wide(const uint8_t *p, uint32_t n, wide_copy *w) {
    uint32_t first = 0, forms = 0;
    for (uint32_t i = 0; i < n; i++) {
        if ((p[i] == 0xEF || p[i] == 0xE3) && wide_at(p, i, n)) {
            if (forms++ == 0) first = i;
            i += 2;
        }
    }
    if (forms == 0) return 0;
    w->text = (uint8_t *)sluice_malloc(n + 16u);
    w->forms = (uint32_t *)sluice_malloc(sizeof(uint32_t) * forms);
    if (w->text == NULL || w->forms == NULL) return -1;
    memcpy(w->text, p, first);
    uint32_t m = first, f = 0;
    for (uint32_t i = first; i < n;) {
        uint8_t ascii = (p[i] == 0xEF || p[i] == 0xE3) ? wide_at(p, i, n) : 0;
        if (ascii) {
            w->forms[f++] = m;
            w->text[m++] = ascii;
            i += 3;
        } else {
            w->text[m++] = p[i++];
        }
    }
    memset(w->text + m, 0, 16);
    w->n = m;
    w->form_n = f;
    return 1;
}

/* The offset in the original of offset k of the copy. */
static uint32_t wide_origin(const wide_copy *w, uint32_t k) {
    uint32_t lo = 0, hi = w->form_n; /* forms[0..lo) < k <= forms[hi..) */
    while (lo < hi) {
        uint32_t mid = lo + (hi - lo) / 2;
        if (w->forms[mid] < k) lo = mid + 1;
        else hi = mid;
    }
    return k + 2u * lo;
}

/* collect_spans for a string whose triggers t are known: a string with full-width forms is
 * searched in its ASCII reading (normalise_wide) and the matches mapped back onto its own
 * bytes, so every detector finds "４１１１ １１１１ １１１１ １１１１" as it finds the ASCII
 * number, with the same checks (Luhn, boundaries, lengths). Returns 0 when memory ran out. */
static int find_matches(const uint8_t *p, uint32_t n, triggers t, spans *s, const uint8_t *readable) {
    if (t.wide) {
        wide_copy w;
        int r = normalise_wide(p, n, &w);
        if (r < 0) {
            spans_init(s);
            return 0;
        }
        if (r > 0) {
            const uint8_t *wr = w.text + w.n + 16;
            if (!collect_spans(w.text, w.n, candidates(scan_triggers(w.text, w.n, wr), w.text, w.n, wr), s, wr)) return 0;
            for (uint32_t k = 0; k < s->n; k++) {
                s->v[k].start = wide_origin(&w, s->v[k].start);
                s->v[k].end = wide_origin(&w, s->v[k].end);
            }
            return 1;
        }
    }
    return collect_spans(p, n, candidates(t, p, n, readable), s, readable);
}

/* Append p[0..n) to out with the matches in s masked (of overlapping ones, the first in sort
 * order wins) and count them; returns how many were masked. */
static uint32_t put_spans_masked(sluice_buf *out, const uint8_t *p, uint32_t n, const spans *s, det_counts *k) {
    uint32_t pos = 0, matches = 0;
    for (uint32_t i = 0; i < s->n; i++) {
        const span *x = &s->v[i];
        if (x->start < pos) continue; /* overlaps a match already taken */
        sluice_buf_put(out, p + pos, x->start - pos);
        put_masked(out, p, x->start, x->end, &rules[x->det]);
        count_match(k, x->det, 1);
        pos = x->end;
        matches++;
    }
    sluice_buf_put(out, p + pos, n - pos);
    return matches;
}

/* ------------------------------------------------------------------------------------------ */
/* JSON-aware masking: the input with some string and number literals replaced               */
/* ------------------------------------------------------------------------------------------ */

/* A match's bytes w[start..end) overwritten as put_masked writes them for rule r when it masks
 * byte for byte (spans_mask_in_place): each letter and digit (every byte without
 * preserve_format) becomes the mask byte. w[end..end + 16) must be readable and writable (its
 * bytes are stored back as they are). */
SIMD static inline __attribute__((always_inline)) void mask_span_bytes(uint8_t *w, uint32_t start, uint32_t end, const mask_rule *r) {
    const v128_t lane = wasm_u8x16_make(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    v128_t m = wasm_i8x16_splat((int8_t)r->mask.ptr[0]);
    for (uint32_t k = start; k < end; k += 16) {
        v128_t v = wasm_v128_load(w + k);
        v128_t to = m;
        if (r->preserve_format) {
            v128_t alnum = wasm_v128_or(in_range(v, '0', 10), in_range(wasm_v128_or(v, wasm_i8x16_splat(0x20)), 'a', 26));
            to = wasm_v128_bitselect(m, v, alnum);
        }
        if (end - k < 16) to = wasm_v128_bitselect(to, v, wasm_u8x16_lt(lane, wasm_i8x16_splat((int8_t)(end - k))));
        wasm_v128_store(w + k, to);
    }
}

#define MAX_DEPTH 64
#define PENDING_MAX 16

/* Everything but the masked literals is kept byte for byte, so the scanner copies nothing
 * until the first replacement; jreplace then appends the unchanged stretch before it in one
 * piece, and mask_bytes the rest at the end. A record without personal data is never copied. */
typedef struct {
    const uint8_t *begin, *p, *end;
    const uint8_t *copied; /* input before this is in out already (or still unchanged) */
    sluice_buf out;        /* the masked record, allocated at the first replacement */
    sluice_buf undo;       /* literals masked in place in the input: offset, length, old bytes */
    /* matches to be masked in the input where they lie once the value has been read as JSON
     * (offsets from begin): masked then, nothing needs saving to be put back */
    uint32_t pending_n;
    struct {
        uint32_t start, end;
        uint8_t det;
    } pending[PENDING_MAX];
    uint32_t out_cap;
    int started; /* out is allocated */
    int failed;  /* memory ran out: the caller fails the batch rather than leak data */
    uint32_t changes;
    int depth;
    int field_depth; /* depth of the value a field path matched, or -1 */
    int secret;      /* the current member name is a secret key name */
    det_counts counts; /* the walk's matches, the batch's once the value is read as JSON */
    struct {
        uint8_t is_array;
        uint32_t index;
        sluice_bytes key; /* raw member name (escapes not decoded) */
    } frames[MAX_DEPTH];
} jctx;

/* The literal at [from, to) is replaced by what the caller appends to the returned buffer. */
static void flush_pending(jctx *c);

static inline __attribute__((always_inline)) sluice_buf *jreplace(jctx *c, const uint8_t *from, const uint8_t *to) {
    if (c->pending_n) flush_pending(c); /* the stretch copied below may hold pending matches */
    if (!c->started) {
        sluice_buf_init(&c->out, c->out_cap);
        c->started = 1;
    }
    sluice_buf_put(&c->out, c->copied, (uint32_t)(from - c->copied));
    c->copied = to;
    return &c->out;
}

/* Mask the pending matches where they lie, each saved in undo first (the walk may still find
 * that the value is not JSON); before a stretch of the input that may hold them is copied. */
static __attribute__((noinline)) void flush_pending(jctx *c) {
    for (uint32_t i = 0; i < c->pending_n; i++) {
        uint32_t at = c->pending[i].start, n = c->pending[i].end - at;
        if (!sluice_buf_reserve(&c->undo, n + 8u)) {
            c->failed = 1;
            return;
        }
        uint8_t *u = c->undo.ptr + c->undo.len;
        memcpy(u, &at, 4);
        memcpy(u + 4, &n, 4);
        memcpy(u + 8, c->begin + at, n);
        c->undo.len += n + 8u;
        mask_span_bytes((uint8_t *)(uintptr_t)c->begin, at, at + n, &rules[c->pending[i].det]);
    }
    c->pending_n = 0;
}

/* Mask the pending matches where they lie: the value was read as JSON. */
static inline __attribute__((always_inline)) void apply_pending(jctx *c) {
    for (uint32_t i = 0; i < c->pending_n; i++) mask_span_bytes((uint8_t *)(uintptr_t)c->begin, c->pending[i].start, c->pending[i].end, &rules[c->pending[i].det]);
    c->pending_n = 0;
}

static int is_ws(uint8_t ch) { return ch == ' ' || ch == '\t' || ch == '\n' || ch == '\r'; }

static void jws(jctx *c) {
    /* between tokens there is mostly no whitespace or one space: those without a loop */
    if (c->p < c->end && !is_ws(*c->p)) return;
    if (c->end - c->p >= 2 && !is_ws(c->p[1])) {
        c->p++;
        return;
    }
    while (c->p < c->end && is_ws(*c->p)) c->p++;
}

static int path_matches(const jctx *c) {
    for (uint32_t k = 0; k < path_n; k++) {
        const path *pa = &paths[k];
        if (pa->n != (uint32_t)c->depth) continue;
        int ok = 1;
        for (uint32_t i = 0; i < pa->n && ok; i++) {
            const seg *sg = &pa->segs[i];
            int arr = c->frames[i].is_array;
            switch (sg->type) {
            case SEG_ANY: break;
            case SEG_ANY_INDEX: ok = arr; break;
            case SEG_INDEX: ok = arr && c->frames[i].index == sg->index; break;
            default: ok = !arr && sluice_eq(c->frames[i].key, sg->key); break;
            }
        }
        if (ok) return 1;
    }
    return 0;
}

/* Scan the string literal at c->p (on the quote) to past its end without copying; returns 0 if
 * malformed. Sets its body [*s, *e) and whether it holds escape sequences. Plain ASCII goes 16
 * bytes at a time; quotes, backslashes, control and non-ASCII bytes are looked at one by one.
 * The scan resumes at q (inside the body: the bytes before it are plain ASCII). */
SIMD static int jstring_from(jctx *c, const uint8_t *q, const uint8_t **e, int *escaped) {
    const uint8_t *end = c->end;
    for (;;) {
        while (end - q >= 16) {
            v128_t v = wasm_v128_load(q);
            /* signed: bytes >= 0x80 are below 0x20 too */
            v128_t look = wasm_v128_or(wasm_v128_or(wasm_i8x16_eq(v, wasm_i8x16_splat('"')), wasm_i8x16_eq(v, wasm_i8x16_splat('\\'))),
                                       wasm_i8x16_lt(v, wasm_i8x16_splat(0x20)));
            uint32_t m = wasm_i8x16_bitmask(look);
            if (m) {
                q += __builtin_ctz(m);
                goto look;
            }
            q += 16;
        }
        while (q < end && *q != '"' && *q != '\\' && *q >= 0x20 && *q < 0x80) q++;
        if (q >= end) return 0;
    look:;
        uint8_t ch = *q;
        if (ch == '"') {
            *e = q;
            c->p = q + 1;
            return 1;
        }
        if (ch < 0x20) return 0;
        if (ch == '\\') {
            *escaped = 1;
            q += 2;
            continue;
        }
        int n = sluice_utf8_len(q, end);
        if (!n) return 0;
        q += n;
    }
}

/* The quotes, backslashes, control and non-ASCII bytes of a chunk, as a bit mask. */
SIMD static uint32_t jstring_stops(v128_t v) {
    /* signed: bytes >= 0x80 are below 0x20 too */
    v128_t look = wasm_v128_or(wasm_v128_or(wasm_i8x16_eq(v, wasm_i8x16_splat('"')), wasm_i8x16_eq(v, wasm_i8x16_splat('\\'))),
                               wasm_i8x16_lt(v, wasm_i8x16_splat(0x20)));
    return wasm_i8x16_bitmask(look);
}

/* jstring_from from the opening quote; the last bytes of the input are read with one load
 * ending at its end (overlapping bytes already scanned) rather than one by one. */
SIMD static inline __attribute__((always_inline)) int jstring_span(jctx *c, const uint8_t **s, const uint8_t **e, int *escaped) {
    const uint8_t *q = c->p + 1, *end = c->end;
    *escaped = 0;
    *s = q;
    while (end - q >= 16) {
        uint32_t m = jstring_stops(wasm_v128_load(q));
        if (m) {
            q += __builtin_ctz(m);
            if (*q != '"') return jstring_from(c, q, e, escaped);
            *e = q;
            c->p = q + 1;
            return 1;
        }
        q += 16;
    }
    if (q < end && end - c->begin >= 16) {
        uint32_t m = jstring_stops(wasm_v128_load(end - 16)) >> (16 - (end - q));
        if (m == 0) return 0; /* no closing quote */
        q += __builtin_ctz(m);
        if (*q != '"') return jstring_from(c, q, e, escaped);
        *e = q;
        c->p = q + 1;
        return 1;
    }
    return jstring_from(c, q, e, escaped);
}

/* jstring_span for a value, classifying the body in the same pass (scan_triggers' result):
 * returns 2 with *t set for a body of plain ASCII without escapes (nearly every string), 1
 * without *t for any other well-formed literal (the caller classifies the decoded text), 0 if
 * malformed. The last bytes of the input are read with one load ending at its end, which
 * overlaps bytes already scanned. */
#define JCLASSIFY_STRAIGHT 5
SIMD static inline __attribute__((always_inline)) int jstring_classify(jctx *c, const uint8_t **s, const uint8_t **e, int *escaped, triggers *t) {
    const uint8_t *q = c->p + 1, *end = c->end;
    *escaped = 0;
    *s = q;
    tacc x;
    tacc_init(&x);
#define JCLASSIFY_CHUNK()                                                      \
    do {                                                                       \
        v128_t v = wasm_v128_load(q);                                          \
        uint32_t m = jstring_stops(v);                                         \
        if (m) {                                                               \
            uint32_t k = (uint32_t)__builtin_ctz(m);                           \
            if (q[k] != '"') return jstring_from(c, q + k, e, escaped);        \
            tacc_add(&x, first_lanes(v, k));                                   \
            *e = q + k;                                                        \
            c->p = q + k + 1;                                                  \
            *t = tacc_done(&x);                                                \
            return 2;                                                          \
        }                                                                      \
        tacc_add(&x, v);                                                       \
        q += 16;                                                               \
    } while (0)
    /* The first JCLASSIFY_STRAIGHT chunks without a loop: wasmtime checks its epoch on every
     * loop header, and around that check (a possible call) the loop's vectors (the constants
     * Cranelift hoists, the accumulator) are stored to the stack and loaded back each turn.
     * 5 chunks measured better than 3; 8 (more code in the one large function) worse. */
#pragma clang loop unroll(full)
    for (int i = 0; i < JCLASSIFY_STRAIGHT; i++) {
        if (end - q < 16) goto tail;
        JCLASSIFY_CHUNK();
    }
    while (end - q >= 16) JCLASSIFY_CHUNK();
#undef JCLASSIFY_CHUNK
tail:
    if (q < end && end - c->begin >= 16) {
        uint32_t r = (uint32_t)(end - q); /* 1..15 bytes left, lanes 16 - r .. 15 */
        v128_t v = wasm_v128_load(end - 16);
        uint32_t m = jstring_stops(v) >> (16 - r);
        if (m == 0) return 0; /* no closing quote */
        uint32_t k = (uint32_t)__builtin_ctz(m);
        if (q[k] != '"') return jstring_from(c, q + k, e, escaped);
        v128_t lane = wasm_u8x16_make(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
        v128_t keep = wasm_v128_and(wasm_u8x16_ge(lane, wasm_i8x16_splat((int8_t)(16 - r))), wasm_u8x16_lt(lane, wasm_i8x16_splat((int8_t)(16 - r + k))));
        tacc_add(&x, wasm_v128_and(v, keep));
        *e = q + k;
        c->p = q + k + 1;
        *t = tacc_done(&x);
        return 2;
    }
    return jstring_from(c, q, e, escaped);
}

/* Decode a string literal body (escapes) into out, with the SDK's strict decoder. */
static int jdecode(const uint8_t *s, const uint8_t *e, sluice_buf *out) {
    sl__jp j = {s - 1, e + 1, NULL, 0};
    return sl__jstring(&j, out) && j.p == e + 1;
}

/* Replace the literal [from, to) by text[0..n) masked whole with rule r, as a JSON string. */
static __attribute__((noinline)) void jmask_whole(jctx *c, const uint8_t *from, const uint8_t *to, const uint8_t *text, uint32_t n, const mask_rule *r) {
    sluice_buf tmp;
    sluice_buf_init(&tmp, n + 8);
    put_masked(&tmp, text, 0, n, r);
    if (tmp.failed) c->failed = 1;
    put_json_string(jreplace(c, from, to), tmp.ptr, tmp.len);
}

/* Whether the matches of s that put_spans_masked would mask (the first of overlapping ones)
 * are ASCII and masked one mask byte per byte (no replacement, no keep_last, a one-byte mask):
 * then the masked text is the text with those bytes overwritten, as long as the text. With
 * `ascii` the whole text is known to be ASCII (a plain JSON string or number) and only the
 * rules are looked at. */
SIMD static inline __attribute__((always_inline)) int spans_mask_in_place(const uint8_t *text, const spans *s, int ascii) {
    const uint8_t *readable = ascii ? text : mem_readable();
    uint32_t pos = 0;
    for (uint32_t i = 0; i < s->n; i++) {
        const span *x = &s->v[i];
        if (x->start < pos) continue;
        if (!(in_place_rules >> x->det & 1u)) return 0;
        if (ascii) {
            pos = x->end;
            continue;
        }
        for (uint32_t k = x->start; k < x->end; k += 16) {
            uint32_t high;
            if (readable - (text + k) >= 16) {
                high = (uint32_t)wasm_i8x16_bitmask(wasm_v128_load(text + k));
                if (x->end - k < 16) high &= (1u << (x->end - k)) - 1u;
            } else {
                high = 0;
                for (uint32_t t = k; t < x->end && t < k + 16; t++) high |= text[t] >> 7;
            }
            if (high) return 0;
        }
        pos = x->end;
    }
    return 1;
}

/* put_spans_masked for spans_mask_in_place's case, on w[0..n), a copy of the text followed
 * by 16 bytes of room: each match's letters and digits (every byte without preserve_format)
 * become its mask byte, as put_masked writes them. Counts and returns the matches masked. */
SIMD static inline __attribute__((always_inline)) uint32_t mask_spans_in_place(uint8_t *w, const spans *s, det_counts *k) {
    uint32_t pos = 0, matches = 0;
    for (uint32_t i = 0; i < s->n; i++) {
        const span *x = &s->v[i];
        if (x->start < pos) continue;
        mask_span_bytes(w, x->start, x->end, &rules[x->det]);
        count_match(k, x->det, 1);
        pos = x->end;
        matches++;
    }
    return matches;
}

/* Replace the literal [from, c->p) by text[0..n) with the matches in s masked, as a JSON
 * string. The masked text goes straight into the output and is escaped afterwards only when it
 * must be (a quote, backslash or control character kept from the text). */
static void jreplace_masked_copy(jctx *c, const uint8_t *from, const uint8_t *text, uint32_t n, const spans *s, int plain, int ascii);

static inline __attribute__((always_inline)) void jreplace_masked(jctx *c, const uint8_t *from, const uint8_t *text, uint32_t n, const spans *s, int plain, int ascii) {
    if (plain && masks_plain && text == from + 1 && c->p == text + n + 1 && spans_mask_in_place(text, s, ascii) &&
        (uint64_t)(mem_readable() - text) >= (uint64_t)n + 16u) {
        /* the mask keeps every byte's place: mask the literal where it lies in the input, so
         * a record whose every change is of this kind is not copied at all here (the SDK copies
         * it once, as it came, into its output). The matches are noted (pending) and masked
         * once the whole value has been read as JSON; when the list is full, those in it are
         * masked at once with their bytes saved first (flush_pending), so that a value that
         * turns out not to be JSON can be put back for the text scan. */
        uint32_t at = (uint32_t)(text - c->begin), pos = 0;
        if (c->pending_n + s->n > PENDING_MAX) flush_pending(c);
        for (uint32_t i = 0; i < s->n; i++) {
            const span *x = &s->v[i];
            if (x->start < pos) continue;
            if (c->pending_n == PENDING_MAX) flush_pending(c); /* more matches than the list holds */
            c->pending[c->pending_n].start = at + x->start;
            c->pending[c->pending_n].end = at + x->end;
            c->pending[c->pending_n].det = x->det;
            c->pending_n++;
            count_match(&c->counts, x->det, 1);
            pos = x->end;
            c->changes++;
        }
        return;
    }
    jreplace_masked_copy(c, from, text, n, s, plain, ascii);
}

/* jreplace_masked's other cases, the literal copied into the output: out of line, as every
 * step off the usual path of a record (a call there is paid rarely, while its code in line
 * makes the walk's one large function keep more of its values on the stack). */
SIMD static __attribute__((noinline)) void jreplace_masked_copy(jctx *c, const uint8_t *from, const uint8_t *text, uint32_t n, const spans *s, int plain, int ascii) {
    sluice_buf *out = jreplace(c, from, c->p);
    if (plain && masks_plain && spans_mask_in_place(text, s, ascii)) {
        /* the usual case: the literal copied whole, its matches overwritten */
        if (!sluice_buf_reserve(out, n + 18u)) {
            c->failed = 1;
            return;
        }
        uint8_t *w = out->ptr + out->len;
        w[0] = '"';
        memcpy(w + 1, text, n);
        c->changes += mask_spans_in_place(w + 1, s, &c->counts);
        w[n + 1] = '"';
        out->len += n + 2u;
        return;
    }
    uint32_t start = out->len;
    sluice_buf_putc(out, '"');
    c->changes += put_spans_masked(out, text, n, s, &c->counts);
    if (out->failed) {
        c->failed = 1;
        return;
    }
    uint32_t len = out->len - start - 1;
    /* plain text masked with plain masks is plain */
    if ((plain && masks_plain) || !needs_escape(out->ptr + start + 1, len)) {
        sluice_buf_putc(out, '"');
        return;
    }
    sluice_bytes raw = sluice_copy(sluice_bytes_of(out->ptr + start + 1, len));
    if (sluice_is_null(raw)) {
        c->failed = 1;
        return;
    }
    out->len = start;
    put_json_string(out, raw.ptr, (uint32_t)raw.len);
}

static int jvalue(jctx *c);

/* jstring_value's other cases, out of line (jreplace_masked_copy says why): a literal with
 * escapes or non-ASCII bytes (scanned 1: its text decoded or classified here), one masked whole
 * (a field path or a secret's value), and a plain one whose candidates are not an e-mail
 * address alone (t: its triggers). */
SIMD static __attribute__((noinline)) int jstring_value_rare(jctx *c, const uint8_t *lit, const uint8_t *s, const uint8_t *e, int escaped, int scanned, triggers t) {
    const uint8_t *text = s, *readable = mem_readable();
    uint32_t n = (uint32_t)(e - s);
    if (escaped) {
        sluice_buf dec;
        sluice_buf_init(&dec, n + 1);
        if (!jdecode(s, e, &dec)) return 0;
        if (dec.failed) {
            c->failed = 1; /* never scan a truncated copy: fail the batch instead */
            return 0;
        }
        text = dec.ptr;
        n = dec.len;
    }
    if (c->field_depth >= 0 || (c->secret && rules[D_AWS_SECRET].enabled)) {
        int field = c->field_depth >= 0;
        if (n == 0) return 1; /* nothing to mask: the literal stays */
        jmask_whole(c, lit, c->p, text, n, &rules[field ? D_FIELD : D_AWS_SECRET]);
        if (!field) count_match(&c->counts, D_AWS_SECRET, 1);
        c->changes++;
        return 1;
    }
    if (scanned != 2) t = scan_triggers(text, n, readable);
    spans found;
    if (!t.wide) {
        /* most strings hold no trigger at all (see candidates) */
        if (!(t.classes & (K_AT | K_UPPER | K_ASSIGN | K_B)) && t.digits < 8 && !(t.digits >= 4 && (t.classes & K_DOT))) return 1;
        uint32_t todo;
        if (t.classes == K_DIGIT && t.digits == 16 && scanned == 2 && card_shape(text, n, &found, readable)) {
            if (found.n == 0) return 1;
            goto masked;
        }
        todo = candidates(t, text, n, readable);
        if (todo == 0) return 1; /* the common case: the literal stays */
        if (todo == 1u << D_EMAIL && n <= 64 && readable - text >= (int32_t)((n + 15) & ~15u)) {
            spans_init(&found);
            find_email_short(text, n, &found);
            if (found.failed) {
                c->failed = 1;
                return 0;
            }
        } else if (!collect_spans(text, n, todo, &found, readable)) {
            c->failed = 1;
            return 0;
        }
    } else if (!find_matches(text, n, t, &found, readable)) {
        c->failed = 1;
        return 0;
    }
masked:
    /* a raw body escapes nothing; one jstring_classify passed whole (scanned 2) is ASCII */
    if (found.n) jreplace_masked(c, lit, text, n, &found, !escaped, scanned == 2);
    return 1;
}

/* A string value: the usual case in line, a plain ASCII literal (scanned 2) outside a field
 * path or secret whose triggers rule out every detector, or a card-shaped one, or whose one
 * candidate is an e-mail address; the others in jstring_value_rare. */
SIMD static inline __attribute__((always_inline)) int jstring_value(jctx *c) {
    const uint8_t *lit = c->p, *s, *e;
    int escaped;
    triggers t;
    int scanned = jstring_classify(c, &s, &e, &escaped, &t);
    if (!scanned) return 0;
    if (scanned != 2 || c->field_depth >= 0 || c->secret) return jstring_value_rare(c, lit, s, e, escaped, scanned, t);
    /* most strings hold no trigger at all (see candidates) */
    if (!(t.classes & (K_AT | K_UPPER | K_ASSIGN | K_B)) && t.digits < 8 && !(t.digits >= 4 && (t.classes & K_DOT))) return 1;
    const uint8_t *readable = mem_readable();
    uint32_t n = (uint32_t)(e - s);
    spans found;
    if (t.classes == K_DIGIT && t.digits == 16 && card_shape(s, n, &found, readable)) {
        if (found.n == 0) return 1;
    } else {
        uint32_t todo = candidates(t, s, n, readable);
        if (todo == 0) return 1; /* the common case: the literal stays */
        if (todo != 1u << D_EMAIL || n > 64 || readable - s < (int32_t)((n + 15) & ~15u)) return jstring_value_rare(c, lit, s, e, 0, 2, t);
        /* an e-mail address alone: find_spans' first step, in line (its spans come in order,
         * so there is nothing to sort) */
        spans_init(&found);
        find_email_short(s, n, &found);
        if (found.failed) {
            c->failed = 1;
            return 0;
        }
    }
    /* a literal jstring_classify passed whole (scanned 2) is ASCII and escapes nothing */
    if (found.n) jreplace_masked(c, lit, s, n, &found, 1, 1);
    return 1;
}

/* The end of the run of ASCII digits from p (at most e). A run of fewer than 16 (nearly every
 * number's) is measured with one 16-byte load where it may be loaded, not with a byte loop: the
 * compiled code checks wasmtime's epoch on every loop iteration. */
SIMD static inline __attribute__((always_inline)) const uint8_t *digits_end(const uint8_t *p, const uint8_t *e, const uint8_t *readable) {
    if (readable - p >= 16) {
        uint32_t m = ~(uint32_t)wasm_i8x16_bitmask(in_range(wasm_v128_load(p), '0', 10)) & 0xffffu;
        if (m) {
            uint32_t k = (uint32_t)__builtin_ctz(m);
            return (uint32_t)(e - p) < k ? e : p + k;
        }
        if (e - p <= 16) return e;
        p += 16;
    }
    while (p < e && (uint32_t)(*p - '0') < 10u) p++;
    return p;
}

/* The end of the JSON number at p (sl__jnumber's grammar), or NULL; its digits counted on the
 * way. In line: the SDK's parser is a call, and a number needs its digits counted anyway. */
static inline __attribute__((always_inline)) const uint8_t *jnumber_end(const uint8_t *p, const uint8_t *e, uint32_t *digits) {
    const uint8_t *from, *readable = mem_readable();
    uint32_t d;
    if (p < e && *p == '-') p++;
    if (p >= e) return NULL;
    if (*p == '0') {
        p++;
        d = 1;
    } else if ((uint32_t)(*p - '1') < 9u) {
        from = p;
        p = digits_end(p, e, readable);
        d = (uint32_t)(p - from);
    } else {
        return NULL;
    }
    if (p < e && *p == '.') {
        p++;
        if (p >= e || (uint32_t)(*p - '0') >= 10u) return NULL;
        from = p;
        p = digits_end(p, e, readable);
        d += (uint32_t)(p - from);
    }
    if (p < e && (*p == 'e' || *p == 'E')) {
        p++;
        if (p < e && (*p == '+' || *p == '-')) p++;
        if (p >= e || (uint32_t)(*p - '0') >= 10u) return NULL;
        from = p;
        p = digits_end(p, e, readable);
        d += (uint32_t)(p - from);
    }
    *digits = d;
    return p;
}

/* The detectors on a number of 8 digits or more at s (n bytes), out of line
 * (jreplace_masked_copy says why). */
SIMD static __attribute__((noinline)) int jnumber_scan(jctx *c, const uint8_t *s, uint32_t n) {
    uint32_t todo = candidates(scan_triggers(s, n, mem_readable()), s, n, mem_readable());
    if (todo == 0) return 1;
    spans found;
    if (!collect_spans(s, n, todo, &found, mem_readable())) {
        c->failed = 1;
        return 0;
    }
    if (found.n) jreplace_masked(c, s, s, n, &found, 1, 1); /* a number is ASCII */
    return 1;
}

static inline __attribute__((always_inline)) int jnumber_value(jctx *c) {
    uint32_t digits;
    const uint8_t *s = c->p, *past = jnumber_end(s, c->end, &digits);
    if (past == NULL) return 0;
    uint32_t n = (uint32_t)(past - s);
    c->p = past;
    if (c->field_depth >= 0) {
        jmask_whole(c, s, c->p, s, n, &rules[D_FIELD]); /* the masked number becomes a string */
        c->changes++;
        return 1;
    }
    /* Of the detectors only card, phone and ssn can match in a number ([0-9.eE+-] only: no
     * '@', 'A', 'b', '=' or ':', no two upper-case letters as an IBAN starts, no three dots as
     * in an IPv4 address, no "eyJ"), and they need 8 digits or more. */
    if (digits < 8) return 1;
    return jnumber_scan(c, s, n);
}

static int jlit(jctx *c, const char *lit) {
    uint32_t n = (uint32_t)sluice_strlen(lit);
    if ((uint32_t)(c->end - c->p) < n || memcmp(c->p, lit, n) != 0) return 0;
    c->p += n;
    return 1;
}

/* Whether a member name names a secret (secret_name_match). */
static __attribute__((noinline)) int is_secret_key(sluice_bytes key) { return secret_name_match(key.ptr, (uint32_t)key.len); }

/* A string, number, true, false or null at c->p. */
static inline __attribute__((always_inline)) int jscalar(jctx *c) {
    if (c->p >= c->end) return 0;
    uint8_t ch = *c->p;
    if (ch == '"') return jstring_value(c);
    if (ch == '-' || is_digit(ch)) return jnumber_value(c);
    if (ch == 't') return jlit(c, "true");
    if (ch == 'f') return jlit(c, "false");
    if (ch == 'n') return jlit(c, "null");
    return 0;
}

/* Value at the current path (frames[0..depth)); handles field-path matching on entry. */
SIMD static int jvalue(jctx *c) {
    int entered_field = 0;
    if (c->field_depth < 0 && path_n && path_matches(c)) {
        c->field_depth = c->depth;
        entered_field = 1;
        count_match(&c->counts, D_FIELD, 1);
    }
    int ok = 0;
    if (c->p >= c->end) return 0;
    uint8_t ch = *c->p;
    if (ch == '{' || ch == '[') {
        if (c->depth >= MAX_DEPTH) return 0;
        int is_array = ch == '[';
        uint8_t close = is_array ? ']' : '}';
        c->p++;
        jws(c);
        if (c->p < c->end && *c->p == close) {
            c->p++;
            ok = 1;
        } else {
            uint32_t index = 0;
            int outer_secret = c->secret;
            for (;;) {
                c->frames[c->depth].is_array = (uint8_t)is_array;
                c->frames[c->depth].index = index;
                c->frames[c->depth].key = sluice_null();
                c->secret = 0;
                member_name = NULL;
                if (!is_array) {
                    const uint8_t *s, *e;
                    int escaped;
                    jws(c);
                    if (c->p >= c->end || *c->p != '"') return 0;
                    if (!jstring_span(c, &s, &e, &escaped)) return 0;
                    c->frames[c->depth].key = sluice_bytes_of(s, (size_t)(e - s));
                    sluice_bytes key = c->frames[c->depth].key;
                    c->secret = is_secret_key(key);
                    member_name = key.ptr;
                    member_len = (uint32_t)key.len;
                    jws(c);
                    if (c->p >= c->end || *c->p != ':') return 0;
                    c->p++;
                }
                jws(c);
                c->depth++;
                /* without field paths a scalar member needs none of jvalue's bookkeeping */
                int scalar = path_n == 0 && c->p < c->end && *c->p != '{' && *c->p != '[';
                int vok = scalar ? jscalar(c) : jvalue(c);
                c->depth--;
                if (!vok) return 0;
                jws(c);
                if (c->p >= c->end) return 0;
                if (*c->p == ',') {
                    c->p++;
                    index++;
                    continue;
                }
                if (*c->p == close) {
                    c->p++;
                    break;
                }
                return 0;
            }
            c->secret = outer_secret;
            ok = 1;
        }
    } else {
        ok = jscalar(c);
    }
    if (entered_field) c->field_depth = -1;
    return ok;
}

/* jws on a local pointer: the same skip, returns where it stopped. */
static inline __attribute__((always_inline)) const uint8_t *ws_from(const uint8_t *p, const uint8_t *end) {
    if (p < end && !is_ws(*p)) return p;
    if (end - p >= 2 && !is_ws(p[1])) return p + 1;
    while (p < end && is_ws(*p)) p++;
    return p;
}

/* jvalue without field paths (the usual configuration) as one loop over an explicit stack of
 * open containers: the same grammar, depth limit and results, without a call per value and
 * without the per-member frames that only field paths read. The position is kept in a local
 * (c->p is memory the compiled code reloads after every store) and handed over in c->p only
 * around the calls that read it. */
SIMD static int jwalk(jctx *c) {
    uint8_t closes[MAX_DEPTH]; /* '}' or ']' of each open container */
    uint32_t depth = 0;
    const uint8_t *p = c->p, *end = c->end;
value:
    if (p >= end) return 0;
    if (*p == '{' || *p == '[') {
        if (depth >= MAX_DEPTH) return 0;
        uint8_t close = *p == '[' ? ']' : '}';
        p = ws_from(p + 1, end);
        if (p < end && *p == close) {
            p++;
            goto after;
        }
        closes[depth++] = close;
        goto member;
    }
    c->p = p;
    if (!jscalar(c)) return 0;
    p = c->p;
after:
    if (depth == 0) {
        c->p = p;
        return 1;
    }
    p = ws_from(p, end);
    if (p >= end) return 0;
    if (*p == ',') {
        p++;
        goto member;
    }
    if (*p != closes[depth - 1]) return 0;
    p++;
    depth--;
    goto after;
member:
    c->secret = 0;
    member_name = NULL;
    if (closes[depth - 1] == '}') {
        const uint8_t *s, *e;
        int escaped;
        p = ws_from(p, end);
        if (p >= end || *p != '"') return 0;
        c->p = p;
        if (!jstring_span(c, &s, &e, &escaped)) return 0;
        p = c->p;
        uint32_t klen = (uint32_t)(e - s);
        c->secret = klen >= secret_key_min && is_secret_key(sluice_bytes_of(s, klen));
        member_name = s;
        member_len = klen;
        p = ws_from(p, end);
        if (p >= end || *p != ':') return 0;
        p++;
    }
    p = ws_from(p, end);
    goto value;
}

/* Whether c could be the last character of a secret key name (secret_name_match's first test). */
static inline __attribute__((always_inline)) int secret_last_byte(uint8_t c) {
    uint8_t last = sluice_lower(c);
    return secret_key_last[last >> 5] >> (last & 31) & 1u;
}

/* Whether p[0..n) provably holds nothing to mask, read as JSON or as text, in one pass of
 * 16-byte steps that stops at the first byte that might start a match; then mask_bytes neither
 * walks nor classifies it. Every detector needs one of: '@' (email), an upper-case letter (iban,
 * aws_access_key, jwt), "bearer" (bearer), '=' or a ':' after a name that can end a secret key
 * name (aws_secret_key, and a JSON member named as a secret, whose name ends before its ':'),
 * a run of numeric bytes (digits and ' ' - _ . ( ) +) holding 8 digits (card, phone, ssn:
 * numeric_verdict), or 4 digits and 3 dots (ipv4). A JSON string or number lies inside the
 * record, so its runs are no longer than the record's; a backslash (an escape may stand for any
 * of these) or a byte >= 0x80 (UTF-8, full-width forms) sends the record the long way. Field
 * paths are not decided here. */
SIMD static int record_clean(const uint8_t *p, uint32_t n) {
    const uint8_t *readable = mem_readable();
    if ((uint64_t)(readable - p) < (((uint64_t)n + 15u) & ~(uint64_t)15u)) return 0;
    /* first the bytes that rule the record out by themselves, a light pass that stops at the
     * first (a record with personal data usually has one early), then the rest. 64 bytes a
     * step (the inner loop is unrolled): the compiled code checks wasmtime's epoch on every
     * iteration of a loop. */
    for (uint32_t i = 0; i < n; i += 64) {
        uint64_t bad = 0;
        for (uint32_t k = 0; k < 64 && i + k < n; k += 16) {
            v128_t v = wasm_v128_load(p + i + k);
            v128_t b = wasm_v128_or(wasm_v128_or(wasm_i8x16_eq(v, wasm_i8x16_splat('@')), in_range(v, 'A', 26)),
                                    wasm_v128_or(wasm_v128_or(wasm_i8x16_eq(v, wasm_i8x16_splat('=')), wasm_i8x16_eq(v, wasm_i8x16_splat('\\'))),
                                                 wasm_i8x16_lt(v, wasm_i8x16_splat(0))));
            bad |= (uint64_t)(uint32_t)wasm_i8x16_bitmask(b) << k;
        }
        if (bad & bits_below(n - i)) return 0;
    }
    uint32_t run = 0, digits = 0, dots = 0; /* run: digits since the last non-numeric byte */
    for (uint32_t i = 0; i < n; i += 16) {
        v128_t v = wasm_v128_load(p + i);
        uint32_t live = n - i >= 16 ? 0xffffu : (1u << (n - i)) - 1u;
        v128_t d = in_range(v, '0', 10);
        v128_t num = wasm_v128_or(wasm_v128_or(d, wasm_i8x16_eq(v, wasm_i8x16_splat(' '))),
                                  wasm_v128_or(wasm_v128_or(wasm_i8x16_eq(v, wasm_i8x16_splat('-')), wasm_i8x16_eq(v, wasm_i8x16_splat('_'))),
                                               wasm_v128_or(wasm_v128_or(wasm_i8x16_eq(v, wasm_i8x16_splat('.')), wasm_i8x16_eq(v, wasm_i8x16_splat('('))),
                                                            wasm_v128_or(wasm_i8x16_eq(v, wasm_i8x16_splat(')')), wasm_i8x16_eq(v, wasm_i8x16_splat('+'))))));
        uint32_t dm = (uint32_t)wasm_i8x16_bitmask(d) & live;
        uint32_t stops = ~(uint32_t)wasm_i8x16_bitmask(num) & live;
        uint32_t colons = (uint32_t)wasm_i8x16_bitmask(wasm_i8x16_eq(v, wasm_i8x16_splat(':'))) & live;
        uint32_t bs = (uint32_t)wasm_i8x16_bitmask(wasm_i8x16_eq(v, wasm_i8x16_splat('b'))) & live;
        dots += (uint32_t)__builtin_popcount((uint32_t)wasm_i8x16_bitmask(wasm_i8x16_eq(v, wasm_i8x16_splat('.'))) & live);
        uint32_t nd = (uint32_t)__builtin_popcount(dm);
        digits += nd;
        if (run + nd >= 8) {
            /* the runs of this chunk one by one: each ends at a stop */
            uint32_t from = 0;
            while (stops) {
                uint32_t k = (uint32_t)__builtin_ctz(stops);
                if (run + (uint32_t)__builtin_popcount(dm & ((1u << k) - 1u) & ~((1u << from) - 1u)) >= 8) return 0;
                run = 0;
                from = k + 1;
                stops &= stops - 1u;
            }
            run += (uint32_t)__builtin_popcount(dm & ~((1u << from) - 1u));
            if (run >= 8) return 0;
        } else if (stops) {
            run = (uint32_t)__builtin_popcount(dm >> (31u - (uint32_t)__builtin_clz(stops)));
        } else {
            run += nd;
        }
        while (bs) { /* find_bearer starts at "bearer" (either case; 'B' is upper-case) */
            uint32_t k = i + (uint32_t)__builtin_ctz(bs);
            bs &= bs - 1u;
            if (n - k >= 6 && sluice_lower(p[k + 1]) == 'e' && sluice_lower(p[k + 2]) == 'a' && sluice_lower(p[k + 3]) == 'r' &&
                sluice_lower(p[k + 4]) == 'e' && sluice_lower(p[k + 5]) == 'r')
                return 0;
        }
        while (colons) { /* the bytes a name before this ':' may end with: quotes and spaces, then the next */
            uint32_t k = i + (uint32_t)__builtin_ctz(colons);
            colons &= colons - 1u;
            for (;;) {
                if (k == 0) return 0;
                uint8_t ch = p[--k];
                if (secret_last_byte(ch)) return 0;
                if (ch != ' ' && ch != '"' && ch != '\'' && ch != '\t' && ch != '\n' && ch != '\r') break;
            }
        }
    }
    return !(digits >= 4 && dots >= 3);
}

static int looks_like_json(sluice_bytes b) {
    if (b.len > 0 && (b.ptr[0] == '{' || b.ptr[0] == '[')) return 1; /* without entering the loop */
    for (int32_t i = 0; i < b.len; i++) {
        uint8_t ch = b.ptr[i];
        if (ch == ' ' || ch == '\t' || ch == '\n' || ch == '\r') continue;
        return ch == '{' || ch == '[';
    }
    return 0;
}

/* Put back what a walk masked in place (undo: offset, length, old bytes) in the value at p:
 * the value was not JSON after all. */
static __attribute__((noinline)) void undo_in_place(const sluice_buf *undo, const uint8_t *p) {
    for (uint32_t k = 0; k < undo->len;) {
        uint32_t at, len;
        memcpy(&at, undo->ptr + k, 4);
        memcpy(&len, undo->ptr + k + 4, 4);
        memcpy((uint8_t *)(uintptr_t)p + at, undo->ptr + k + 8, len);
        k += len + 8u;
    }
}

/* mask_bytes for a value read as text (not JSON), out of line (jreplace_masked_copy says
 * why). */
SIMD static __attribute__((noinline)) int mask_text(sluice_bytes in, sluice_bytes *res) {
    uint32_t n = (uint32_t)in.len;
    spans found;
    if (!find_matches(in.ptr, n, scan_triggers(in.ptr, n, mem_readable()), &found, mem_readable())) return -1;
    if (found.n == 0) return 0;
    sluice_buf out;
    sluice_buf_init(&out, n + 16);
    put_spans_masked(&out, in.ptr, n, &found, &batch_counts);
    if (out.failed) return -1;
    *res = sluice_buf_bytes(&out);
    return 1;
}

/* Masks one key / value / header value. Returns 1 and sets *res when something changed, 0 when
 * nothing did, -1 when memory ran out (the caller fails the batch rather than leak data). */
static int mask_bytes(sluice_bytes in, sluice_bytes *res) {
    member_name = NULL; /* set by the JSON walk for a member's value only */
    if (in.len <= 0) return 0;
    uint32_t n = (uint32_t)in.len;
    if (path_n == 0 && record_clean(in.ptr, n)) return 0;
    if (mode == MODE_JSON || (mode == MODE_AUTO && looks_like_json(in))) {
        jctx c;
        c.begin = in.ptr;
        c.p = in.ptr;
        c.end = in.ptr + n;
        c.copied = in.ptr;
        c.out_cap = n + n / 4 + 16;
        c.started = 0;
        c.failed = 0;
        c.changes = 0;
        c.depth = 0;
        c.field_depth = -1;
        c.secret = 0;
        c.undo.ptr = NULL;
        c.undo.len = 0;
        c.undo.cap = 0;
        c.undo.failed = 0;
        c.pending_n = 0;
        c.counts.seen = 0; /* counted only if the JSON pass succeeds */
        c.counts.n = 0;
        jws(&c);
        int ok = path_n ? jvalue(&c) : jwalk(&c);
        if (ok) {
            jws(&c);
            ok = c.p == c.end;
        }
        if (c.failed || (c.started && c.out.failed)) return -1;
        if (ok) {
            apply_pending(&c);
            for (uint32_t i = 0; i < c.counts.n; i++) count_match(&batch_counts, c.counts.order[i], c.counts.count[c.counts.order[i]]);
            if (c.changes == 0) return 0;
            if (!c.started) { /* every change was made in place: the value is the input's */
                *res = in;
                return 1;
            }
            sluice_buf_put(&c.out, c.copied, (uint32_t)(c.end - c.copied));
            if (c.out.failed) return -1;
            *res = sluice_buf_bytes(&c.out);
            return 1;
        }
        if (c.undo.len) undo_in_place(&c.undo, in.ptr);
        /* not JSON after all: fall through to text */
    }
    return mask_text(in, res);
}

static int header_selected(sluice_bytes name) {
    if (headers_all) return 1;
    if (header_names == NULL) return 0;
    for (const sluice_json *h = header_names->child; h; h = h->next) {
        if (sluice_eq_nocase(sluice_json_string(h), name)) return 1;
    }
    return 0;
}

sluice_decision sluice_on_record(const sluice_record *rec) {
    sluice_bytes key = rec->key, value = rec->value;
    int changed = 0;
    sluice_bytes tmp;
    int r = mask_bytes(rec->value, &tmp);
    if (r < 0) return sluice_error("pii-mask: out of memory");
    if (r) {
        value = tmp;
        changed = 1;
    }
    /* not for a null or empty key (mask_bytes' answer is 0): a call costs the guest ~5 ns */
    r = do_keys && rec->key.len > 0 ? mask_bytes(rec->key, &tmp) : 0;
    if (r < 0) return sluice_error("pii-mask: out of memory");
    if (r) {
        key = tmp;
        changed = 1;
    }
    const sluice_header *headers = rec->headers;
    if ((headers_all || header_names) && rec->header_count) {
        sluice_header *hs = NULL;
        for (uint32_t i = 0; i < rec->header_count; i++) {
            if (!header_selected(rec->headers[i].key)) continue;
            r = mask_bytes(rec->headers[i].value, &tmp);
            if (r < 0) return sluice_error("pii-mask: out of memory");
            if (r == 0) continue;
            if (hs == NULL) {
                hs = (sluice_header *)sluice_malloc(sizeof(sluice_header) * rec->header_count);
                if (hs == NULL) return sluice_error("pii-mask: out of memory");
                memcpy(hs, rec->headers, sizeof(sluice_header) * rec->header_count);
            }
            hs[i].value = tmp;
            changed = 1;
        }
        if (hs) headers = hs;
    }
    if (!changed) return sluice_keep();
    return sluice_rewrite(key, value, headers, rec->header_count);
}

#pragma clang attribute pop
