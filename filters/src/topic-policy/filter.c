/*
 * builtin:topic-policy: validates (and optionally rewrites) topic administration requests,
 * like Kafka's CreateTopicPolicy / AlterConfigPolicy or a Kubernetes validating / mutating
 * admission webhook. Admin-only: records pass untouched.
 *
 * Configuration (every rule optional; the key names are a public contract):
 *   name_pattern: "^[a-z0-9._-]+$"         regex subset, searched (anchor it with ^ and $)
 *   partitions: {min: 1, max: 12}
 *   min_replication_factor: 1
 *   allowed_cleanup_policies: [delete]
 *   retention_ms: {min: 3600000, max: 604800000}
 *   max_message_bytes: {max: 1048576}      ({min: ...} accepted too)
 *   required_configs: [retention.ms]
 *   forbidden_configs: [unclean.leader.election.enable]
 * Rewrite (mutating) mode, also optional:
 *   defaults: {retention.ms: "604800000"}  missing configs are set before the rules run
 *   cap_partitions: true                    partitions outside {min,max} are clamped instead
 *                                           of denied
 *
 * A denial's message names each broken rule and the offending value, e.g.
 *   "topic-policy: partitions.max: 50 requested, at most 12 allowed".
 *
 * Regex subset (name_pattern): literals, `.`, classes `[a-z0-9._-]` / `[^...]`, escapes
 * `\d \w \s \D \W \S` and escaped punctuation, groups `( )` / `(?: )`, alternation `|`,
 * quantifiers `* + ? {m} {m,} {m,n}` (lazy `?` suffixes accepted, same result), anchors
 * `^ $`. Matching is linear-time (a Thompson NFA), so no pattern can stall the proxy.
 */
#define SLUICE_ADMIN_FILTER 1
#include "sluice_filter.h"

/* ------------------------------------------------------------------------------------------ */
/* Regex subset -> NFA program                                                                */
/* ------------------------------------------------------------------------------------------ */

enum { I_CLASS, I_SPLIT, I_JMP, I_BOL, I_EOL, I_MATCH };

typedef struct {
    uint8_t op;
    uint16_t x, y; /* SPLIT targets / JMP target / CLASS index */
} inst;

typedef struct {
    uint8_t bits[32];
} cset;

enum { N_CLASS, N_CAT, N_ALT, N_STAR, N_PLUS, N_QUEST, N_REP, N_BOL, N_EOL, N_EMPTY };

typedef struct node {
    uint8_t type;
    uint16_t cls;
    int32_t min, max; /* N_REP; max < 0 = unbounded */
    struct node *a, *b;
} node;

#define MAX_INST 4096
#define MAX_CLASSES 512

typedef struct {
    const uint8_t *p, *end;
    const char *error;
    cset *classes;
    uint32_t nclasses;
    inst *prog;
    uint32_t n;
    int depth;
} rx;

static node *rx_node(rx *r, uint8_t type) {
    node *n = (node *)sluice_malloc(sizeof(node));
    if (n == NULL) {
        r->error = "out of memory";
        return NULL;
    }
    memset(n, 0, sizeof *n);
    n->type = type;
    return n;
}

static int rx_new_class(rx *r) {
    if (r->nclasses >= MAX_CLASSES) {
        r->error = "too many character classes";
        return -1;
    }
    memset(&r->classes[r->nclasses], 0, sizeof(cset));
    return (int)r->nclasses++;
}

static int is_alnum_c(uint8_t c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); }

static void cs_add(cset *c, uint8_t ch) { c->bits[ch >> 3] |= (uint8_t)(1u << (ch & 7)); }
static void cs_range(cset *c, uint8_t lo, uint8_t hi) {
    for (uint32_t ch = lo; ch <= hi; ch++) cs_add(c, (uint8_t)ch);
}
static int cs_has(const cset *c, uint8_t ch) { return (c->bits[ch >> 3] >> (ch & 7)) & 1; }

/* \d \w \s and friends into `c`; returns 0 when `e` is not a class escape. */
static int cs_escape(cset *c, uint8_t e) {
    cset t;
    memset(&t, 0, sizeof t);
    uint8_t lower = sluice_lower(e);
    if (lower == 'd') {
        cs_range(&t, '0', '9');
    } else if (lower == 'w') {
        cs_range(&t, '0', '9');
        cs_range(&t, 'a', 'z');
        cs_range(&t, 'A', 'Z');
        cs_add(&t, '_');
    } else if (lower == 's') {
        cs_add(&t, ' ');
        cs_range(&t, '\t', '\r');
    } else {
        return 0;
    }
    for (int i = 0; i < 32; i++) c->bits[i] |= (e == lower) ? t.bits[i] : (uint8_t)~t.bits[i];
    return 1;
}

static node *rx_alt(rx *r);

static node *rx_class_node(rx *r) {
    int idx = rx_new_class(r);
    if (idx < 0) return NULL;
    node *n = rx_node(r, N_CLASS);
    if (n) n->cls = (uint16_t)idx;
    return n;
}

static node *rx_bracket(rx *r) {
    node *n = rx_class_node(r);
    if (n == NULL) return NULL;
    cset *c = &r->classes[n->cls];
    int negate = 0, first = 1;
    r->p++; /* [ */
    if (r->p < r->end && *r->p == '^') {
        negate = 1;
        r->p++;
    }
    for (;;) {
        if (r->p >= r->end) {
            r->error = "missing ]";
            return NULL;
        }
        uint8_t ch = *r->p;
        if (ch == ']' && !first) {
            r->p++;
            break;
        }
        first = 0;
        uint8_t lo;
        if (ch == '\\') {
            if (r->p + 1 >= r->end) {
                r->error = "trailing backslash";
                return NULL;
            }
            r->p++;
            if (cs_escape(c, *r->p)) {
                r->p++;
                continue;
            }
            lo = *r->p++;
        } else {
            lo = ch;
            r->p++;
        }
        if (r->p + 1 < r->end && *r->p == '-' && r->p[1] != ']') {
            uint8_t hi = r->p[1];
            r->p += 2;
            if (hi == '\\' && r->p < r->end) hi = *r->p++;
            if (hi < lo) {
                r->error = "bad range in []";
                return NULL;
            }
            cs_range(c, lo, hi);
        } else {
            cs_add(c, lo);
        }
    }
    if (negate) {
        for (int i = 0; i < 32; i++) c->bits[i] = (uint8_t)~c->bits[i];
    }
    return n;
}

static int rx_int(rx *r, int32_t *out) {
    int32_t v = 0, digits = 0;
    while (r->p < r->end && *r->p >= '0' && *r->p <= '9') {
        v = v * 10 + (*r->p++ - '0');
        if (v > 1000) {
            r->error = "repeat count above 1000";
            return 0;
        }
        digits++;
    }
    *out = v;
    return digits > 0;
}

static node *rx_atom(rx *r) {
    uint8_t ch = *r->p;
    if (ch == '(') {
        r->p++;
        if (r->end - r->p >= 2 && r->p[0] == '?' && r->p[1] == ':') r->p += 2;
        if (++r->depth > 32) {
            r->error = "groups nested too deeply";
            return NULL;
        }
        node *inner = rx_alt(r);
        r->depth--;
        if (inner == NULL) return NULL;
        if (r->p >= r->end || *r->p != ')') {
            r->error = "missing )";
            return NULL;
        }
        r->p++;
        return inner;
    }
    if (ch == '[') return rx_bracket(r);
    if (ch == '^' || ch == '$') {
        r->p++;
        return rx_node(r, ch == '^' ? N_BOL : N_EOL);
    }
    if (ch == '*' || ch == '+' || ch == '?' || ch == '{') {
        r->error = "quantifier without anything to repeat";
        return NULL;
    }
    node *n = rx_class_node(r);
    if (n == NULL) return NULL;
    cset *c = &r->classes[n->cls];
    r->p++;
    if (ch == '.') {
        cs_range(c, 0, 255);
        cs_add(c, '\n');
    } else if (ch == '\\') {
        if (r->p >= r->end) {
            r->error = "trailing backslash";
            return NULL;
        }
        uint8_t e = *r->p++;
        if (!cs_escape(c, e)) {
            if (is_alnum_c(e)) {
                r->error = "unsupported escape";
                return NULL;
            }
            cs_add(c, e);
        }
    } else {
        cs_add(c, ch);
    }
    return n;
}

static node *rx_repeat(rx *r) {
    node *a = rx_atom(r);
    while (a && r->p < r->end) {
        uint8_t q = *r->p;
        uint8_t type;
        int32_t min = 0, max = -1;
        if (q == '*') type = N_STAR;
        else if (q == '+') type = N_PLUS;
        else if (q == '?') type = N_QUEST;
        else if (q == '{') {
            const uint8_t *save = r->p;
            r->p++;
            if (!rx_int(r, &min)) {
                if (r->error) return NULL;
                r->p = save; /* a literal '{' */
                break;
            }
            max = min;
            if (r->p < r->end && *r->p == ',') {
                r->p++;
                max = -1;
                if (r->p < r->end && *r->p != '}' && !rx_int(r, &max)) return NULL;
            }
            if (r->p >= r->end || *r->p != '}' || (max >= 0 && max < min)) {
                r->error = "bad {m,n} repeat";
                return NULL;
            }
            type = N_REP;
        } else {
            break;
        }
        r->p++;
        if (r->p < r->end && *r->p == '?') r->p++; /* lazy: same language */
        node *n = rx_node(r, type);
        if (n == NULL) return NULL;
        n->a = a;
        n->min = min;
        n->max = max;
        a = n;
    }
    return a;
}

static node *rx_concat(rx *r) {
    node *acc = NULL;
    while (r->p < r->end && *r->p != '|' && *r->p != ')') {
        node *n = rx_repeat(r);
        if (n == NULL) return NULL;
        if (acc == NULL) {
            acc = n;
        } else {
            node *c = rx_node(r, N_CAT);
            if (c == NULL) return NULL;
            c->a = acc;
            c->b = n;
            acc = c;
        }
    }
    return acc ? acc : rx_node(r, N_EMPTY);
}

static node *rx_alt(rx *r) {
    node *a = rx_concat(r);
    while (a && r->p < r->end && *r->p == '|') {
        r->p++;
        node *b = rx_concat(r);
        if (b == NULL) return NULL;
        node *n = rx_node(r, N_ALT);
        if (n == NULL) return NULL;
        n->a = a;
        n->b = b;
        a = n;
    }
    return a;
}

static int emit(rx *r, uint8_t op, uint16_t x, uint16_t y) {
    if (r->n >= MAX_INST) {
        r->error = "pattern too large";
        return -1;
    }
    r->prog[r->n].op = op;
    r->prog[r->n].x = x;
    r->prog[r->n].y = y;
    return (int)r->n++;
}

static int gen(rx *r, const node *n) {
    int l1, l2;
    switch (n->type) {
    case N_EMPTY: return 0;
    case N_CLASS: return emit(r, I_CLASS, n->cls, 0) < 0 ? -1 : 0;
    case N_BOL: return emit(r, I_BOL, 0, 0) < 0 ? -1 : 0;
    case N_EOL: return emit(r, I_EOL, 0, 0) < 0 ? -1 : 0;
    case N_CAT: return gen(r, n->a) < 0 ? -1 : gen(r, n->b);
    case N_ALT:
        if ((l1 = emit(r, I_SPLIT, 0, 0)) < 0) return -1;
        r->prog[l1].x = (uint16_t)r->n;
        if (gen(r, n->a) < 0 || (l2 = emit(r, I_JMP, 0, 0)) < 0) return -1;
        r->prog[l1].y = (uint16_t)r->n;
        if (gen(r, n->b) < 0) return -1;
        r->prog[l2].x = (uint16_t)r->n;
        return 0;
    case N_STAR:
        if ((l1 = emit(r, I_SPLIT, 0, 0)) < 0) return -1;
        r->prog[l1].x = (uint16_t)r->n;
        if (gen(r, n->a) < 0 || emit(r, I_JMP, (uint16_t)l1, 0) < 0) return -1;
        r->prog[l1].y = (uint16_t)r->n;
        return 0;
    case N_PLUS:
        l1 = (int)r->n;
        if (gen(r, n->a) < 0) return -1;
        if ((l2 = emit(r, I_SPLIT, (uint16_t)l1, 0)) < 0) return -1;
        r->prog[l2].y = (uint16_t)r->n;
        return 0;
    case N_QUEST:
        if ((l1 = emit(r, I_SPLIT, 0, 0)) < 0) return -1;
        r->prog[l1].x = (uint16_t)r->n;
        if (gen(r, n->a) < 0) return -1;
        r->prog[l1].y = (uint16_t)r->n;
        return 0;
    case N_REP: {
        node star = *n, quest = *n;
        star.type = N_STAR;
        quest.type = N_QUEST;
        for (int32_t i = 0; i < n->min; i++) {
            if (gen(r, n->a) < 0) return -1;
        }
        if (n->max < 0) return gen(r, &star);
        for (int32_t i = n->min; i < n->max; i++) {
            if (gen(r, &quest) < 0) return -1;
        }
        return 0;
    }
    }
    return -1;
}

typedef struct {
    inst *prog;
    uint32_t n;
    cset *classes;
} regex;

static int regex_compile(sluice_bytes pattern, regex *out, const char **error) {
    rx r;
    memset(&r, 0, sizeof r);
    r.p = pattern.ptr;
    r.end = pattern.ptr + pattern.len;
    r.classes = (cset *)sluice_malloc(sizeof(cset) * MAX_CLASSES);
    r.prog = (inst *)sluice_malloc(sizeof(inst) * MAX_INST);
    if (r.classes == NULL || r.prog == NULL) {
        *error = "out of memory";
        return 0;
    }
    node *root = rx_alt(&r);
    if (root && r.p != r.end) r.error = "unbalanced )";
    if (root == NULL || r.error) {
        *error = r.error ? r.error : "invalid pattern";
        return 0;
    }
    if (gen(&r, root) < 0 || emit(&r, I_MATCH, 0, 0) < 0) {
        *error = r.error ? r.error : "invalid pattern";
        return 0;
    }
    out->prog = r.prog;
    out->n = r.n;
    out->classes = r.classes;
    return 1;
}

/* Pike VM without captures: the set of live program counters advances one byte at a time. */
static void add_thread(const regex *re, uint16_t *list, uint32_t *count, uint32_t *mark, uint32_t gen_id, uint16_t pc,
                       uint32_t pos, uint32_t len) {
    /* explicit stack: epsilon closure over SPLIT / JMP / anchors */
    uint16_t stack[2 * MAX_INST + 2]; /* a SPLIT pushes two; each pc expands once */
    uint32_t sp = 0;
    stack[sp++] = pc;
    while (sp) {
        uint16_t p = stack[--sp];
        if (mark[p] == gen_id) continue;
        mark[p] = gen_id;
        const inst *in = &re->prog[p];
        switch (in->op) {
        case I_JMP: stack[sp++] = in->x; break;
        case I_SPLIT:
            stack[sp++] = in->y;
            stack[sp++] = in->x;
            break;
        case I_BOL:
            if (pos == 0) stack[sp++] = (uint16_t)(p + 1);
            break;
        case I_EOL:
            if (pos == len) stack[sp++] = (uint16_t)(p + 1);
            break;
        default: list[(*count)++] = p; break;
        }
    }
}

static int regex_search(const regex *re, sluice_bytes text) {
    uint32_t len = text.len > 0 ? (uint32_t)text.len : 0;
    uint16_t *clist = (uint16_t *)sluice_malloc(sizeof(uint16_t) * re->n);
    uint16_t *nlist = (uint16_t *)sluice_malloc(sizeof(uint16_t) * re->n);
    uint32_t *mark = (uint32_t *)sluice_malloc(sizeof(uint32_t) * re->n);
    if (!clist || !nlist || !mark) return -1;
    memset(mark, 0, sizeof(uint32_t) * re->n);
    uint32_t cn = 0, gen_id = 1;
    for (uint32_t pos = 0;; pos++) {
        add_thread(re, clist, &cn, mark, gen_id, 0, pos, len); /* unanchored search */
        for (uint32_t i = 0; i < cn; i++) {
            if (re->prog[clist[i]].op == I_MATCH) return 1;
        }
        if (pos == len) return 0;
        uint8_t ch = text.ptr[pos];
        uint32_t nn = 0;
        gen_id++;
        for (uint32_t i = 0; i < cn; i++) {
            const inst *in = &re->prog[clist[i]];
            if (in->op == I_CLASS && cs_has(&re->classes[in->x], ch)) {
                add_thread(re, nlist, &nn, mark, gen_id, (uint16_t)(clist[i] + 1), pos + 1, len);
            }
        }
        uint16_t *t = clist;
        clist = nlist;
        nlist = t;
        cn = nn;
        /* marks of gen_id now describe clist; the next add_thread at pos+1 shares them */
    }
}

/* ------------------------------------------------------------------------------------------ */
/* Policy configuration                                                                       */
/* ------------------------------------------------------------------------------------------ */

typedef struct {
    int has_min, has_max;
    int64_t min, max;
} bounds;

static int have_pattern;
static regex name_re;
static sluice_bytes name_pattern;
static bounds partitions_b, retention_b, message_b;
static int has_min_rf;
static int64_t min_rf;
static const sluice_json *allowed_cleanup; /* array of strings */
static const sluice_json *required_configs;
static const sluice_json *forbidden_configs;
static const sluice_json *defaults; /* object */
static int cap_partitions;

static int cfg_error(const char *msg) {
    sluice_set_error(msg);
    return 1;
}

static int parse_bounds(const sluice_json *n, bounds *b, const char *what, int allow_min) {
    if (n->type != SLUICE_JSON_OBJECT) return cfg_error(what);
    for (const sluice_json *c = n->child; c; c = c->next) {
        int64_t v;
        if (!sluice_json_int(c, 0, &v)) return cfg_error(what);
        if (sluice_eq_str(c->key, "min") && allow_min) {
            b->has_min = 1;
            b->min = v;
        } else if (sluice_eq_str(c->key, "max")) {
            b->has_max = 1;
            b->max = v;
        } else {
            return cfg_error(what);
        }
    }
    if (b->has_min && b->has_max && b->min > b->max) return cfg_error(what);
    return 0;
}

static int string_list(const sluice_json *n) {
    if (n->type != SLUICE_JSON_ARRAY) return 0;
    for (const sluice_json *c = n->child; c; c = c->next) {
        if (c->type != SLUICE_JSON_STRING) return 0;
    }
    return 1;
}

int sluice_on_config(const sluice_json *cfg) {
    if (cfg == NULL || cfg->type == SLUICE_JSON_NULL) return 0;
    if (cfg->type != SLUICE_JSON_OBJECT) return cfg_error("topic-policy: config must be a mapping");
    for (const sluice_json *c = cfg->child; c; c = c->next) {
        if (sluice_eq_str(c->key, "name_pattern")) {
            const char *err = NULL;
            if (c->type != SLUICE_JSON_STRING) return cfg_error("topic-policy: name_pattern must be a string");
            if (!regex_compile(c->str, &name_re, &err)) {
                sluice_buf b;
                sluice_buf_init(&b, 96);
                sluice_buf_puts(&b, "topic-policy: name_pattern: ");
                sluice_buf_puts(&b, err);
                sluice_set_error_bytes(sluice_buf_bytes(&b));
                return 1;
            }
            have_pattern = 1;
            name_pattern = c->str;
        } else if (sluice_eq_str(c->key, "partitions")) {
            if (parse_bounds(c, &partitions_b, "topic-policy: partitions must be {min: int, max: int}", 1)) return 1;
        } else if (sluice_eq_str(c->key, "min_replication_factor")) {
            if (!sluice_json_int(c, 0, &min_rf)) return cfg_error("topic-policy: min_replication_factor must be an integer");
            has_min_rf = 1;
        } else if (sluice_eq_str(c->key, "allowed_cleanup_policies")) {
            if (!string_list(c)) return cfg_error("topic-policy: allowed_cleanup_policies must be a list of strings");
            allowed_cleanup = c;
        } else if (sluice_eq_str(c->key, "retention_ms")) {
            if (parse_bounds(c, &retention_b, "topic-policy: retention_ms must be {min: int, max: int}", 1)) return 1;
        } else if (sluice_eq_str(c->key, "max_message_bytes")) {
            if (parse_bounds(c, &message_b, "topic-policy: max_message_bytes must be {max: int} (min optional)", 1)) return 1;
        } else if (sluice_eq_str(c->key, "required_configs")) {
            if (!string_list(c)) return cfg_error("topic-policy: required_configs must be a list of config names");
            required_configs = c;
        } else if (sluice_eq_str(c->key, "forbidden_configs")) {
            if (!string_list(c)) return cfg_error("topic-policy: forbidden_configs must be a list of config names");
            forbidden_configs = c;
        } else if (sluice_eq_str(c->key, "defaults")) {
            if (c->type != SLUICE_JSON_OBJECT) return cfg_error("topic-policy: defaults must map config names to values");
            for (const sluice_json *d = c->child; d; d = d->next) {
                if (d->type != SLUICE_JSON_STRING && d->type != SLUICE_JSON_NUMBER && d->type != SLUICE_JSON_TRUE &&
                    d->type != SLUICE_JSON_FALSE)
                    return cfg_error("topic-policy: defaults values must be strings, numbers or booleans");
            }
            defaults = c;
        } else if (sluice_eq_str(c->key, "cap_partitions")) {
            cap_partitions = sluice_json_bool(c, 0);
        } else {
            return cfg_error("topic-policy: unknown config key (known: name_pattern, partitions, min_replication_factor, "
                             "allowed_cleanup_policies, retention_ms, max_message_bytes, required_configs, "
                             "forbidden_configs, defaults, cap_partitions)");
        }
    }
    return 0;
}

/* ------------------------------------------------------------------------------------------ */
/* Evaluation                                                                                 */
/* ------------------------------------------------------------------------------------------ */

/* The resulting configs, as an editable list. */
typedef struct {
    sluice_bytes key, value; /* value.len < 0: null (removed) */
} kv;

typedef struct {
    kv *v;
    uint32_t n, cap;
} kvs;

static kv *kv_find(kvs *c, sluice_bytes key) {
    for (uint32_t i = 0; i < c->n; i++) {
        if (sluice_eq(c->v[i].key, key)) return &c->v[i];
    }
    return NULL;
}

static sluice_bytes kv_get(kvs *c, const char *key) {
    kv *e = kv_find(c, sluice_str(key));
    return e ? e->value : sluice_null();
}

static int kv_put(kvs *c, sluice_bytes key, sluice_bytes value) {
    kv *e = kv_find(c, key);
    if (e) {
        e->value = value;
        return 1;
    }
    if (c->n == c->cap) {
        uint32_t cap = c->cap ? c->cap * 2 : 16;
        kv *v = (kv *)sluice_malloc(sizeof(kv) * cap);
        if (v == NULL) return 0;
        if (c->n) memcpy(v, c->v, sizeof(kv) * c->n);
        c->v = v;
        c->cap = cap;
    }
    c->v[c->n].key = key;
    c->v[c->n].value = value;
    c->n++;
    return 1;
}

typedef struct {
    sluice_buf msg;
    int violations;
} verdict;

static void violation(verdict *v, const char *rule) {
    if (v->violations++ == 0) sluice_buf_puts(&v->msg, "topic-policy: ");
    else sluice_buf_puts(&v->msg, "; ");
    sluice_buf_puts(&v->msg, rule);
    sluice_buf_puts(&v->msg, ": ");
}

static void put_quoted(sluice_buf *b, sluice_bytes s) {
    sluice_buf_putc(b, '\'');
    if (s.len > 100) {
        sluice_buf_put(b, s.ptr, 100);
        sluice_buf_puts(b, "...");
    } else {
        sluice_buf_put_bytes(b, s);
    }
    sluice_buf_putc(b, '\'');
}

static void check_bounds(verdict *v, kvs *cfg, const char *key, const bounds *b, const char *rule_min,
                         const char *rule_max) {
    sluice_bytes raw = kv_get(cfg, key);
    if (raw.len < 0 || (!b->has_min && !b->has_max)) return;
    sluice_json tmp;
    memset(&tmp, 0, sizeof tmp);
    tmp.type = SLUICE_JSON_STRING;
    tmp.str = raw;
    int64_t val;
    if (!sluice_json_int(&tmp, 0, &val)) {
        violation(v, b->has_max ? rule_max : rule_min);
        sluice_buf_puts(&v->msg, key);
        sluice_buf_puts(&v->msg, "=");
        put_quoted(&v->msg, raw);
        sluice_buf_puts(&v->msg, " is not an integer");
        return;
    }
    if (b->has_min && val < b->min && !(val == -1 && b->has_max)) {
        violation(v, rule_min);
        sluice_buf_puts(&v->msg, key);
        sluice_buf_puts(&v->msg, "=");
        sluice_buf_put_int(&v->msg, val);
        sluice_buf_puts(&v->msg, ", at least ");
        sluice_buf_put_int(&v->msg, b->min);
        sluice_buf_puts(&v->msg, " required");
    }
    /* -1 means unlimited for retention.ms: above any maximum */
    if (b->has_max && (val > b->max || val == -1)) {
        violation(v, rule_max);
        sluice_buf_puts(&v->msg, key);
        sluice_buf_puts(&v->msg, "=");
        sluice_buf_put_int(&v->msg, val);
        if (val == -1) sluice_buf_puts(&v->msg, " (unlimited)");
        sluice_buf_puts(&v->msg, ", at most ");
        sluice_buf_put_int(&v->msg, b->max);
        sluice_buf_puts(&v->msg, " allowed");
    }
}

static int list_has(const sluice_json *list, sluice_bytes s) {
    for (const sluice_json *c = list->child; c; c = c->next) {
        if (sluice_eq(c->str, s)) return 1;
    }
    return 0;
}

int sluice_on_admin(const sluice_json *req, sluice_buf *out) {
    sluice_bytes op = sluice_json_string(sluice_json_get(req, "op"));
    sluice_bytes rtype = sluice_json_string(sluice_json_get(req, "resource_type"));
    sluice_bytes name = sluice_json_string(sluice_json_get(req, "name"));
    if (rtype.len >= 0 && !sluice_eq_str(rtype, "topic")) {
        sluice_buf_puts(out, "{\"decision\":\"allow\",\"message\":\"not a topic\"}");
        return 0;
    }
    int creating = sluice_eq_str(op, "create_topics");
    int adding_partitions = sluice_eq_str(op, "create_partitions");

    kvs cfg = {NULL, 0, 0};
    const sluice_json *configs = sluice_json_get(req, "configs");
    if (configs && configs->type == SLUICE_JSON_OBJECT) {
        for (const sluice_json *c = configs->child; c; c = c->next) {
            sluice_bytes val = c->type == SLUICE_JSON_STRING ? c->str : (c->type == SLUICE_JSON_NULL ? sluice_null() : c->str);
            if (c->type == SLUICE_JSON_TRUE) val = sluice_str("true");
            if (c->type == SLUICE_JSON_FALSE) val = sluice_str("false");
            if (!kv_put(&cfg, c->key, val)) return 1;
        }
    }
    int64_t partitions = -1, rf = -1;
    const sluice_json *pn = sluice_json_get(req, "partitions");
    const sluice_json *rn = sluice_json_get(req, "replication_factor");
    int has_partitions = pn && pn->type == SLUICE_JSON_NUMBER && sluice_json_int(pn, -1, &partitions) && partitions > 0;
    int has_rf = rn && rn->type == SLUICE_JSON_NUMBER && sluice_json_int(rn, -1, &rf) && rf > 0;

    /* mutations first, so that defaults can satisfy the rules below */
    int rewrote_configs = 0, rewrote_partitions = 0;
    sluice_buf changes;
    sluice_buf_init(&changes, 128);
    if (defaults && (creating || sluice_eq_str(op, "alter_configs") || sluice_eq_str(op, "incremental_alter_configs"))) {
        for (const sluice_json *d = defaults->child; d; d = d->next) {
            kv *e = kv_find(&cfg, d->key);
            if (e && e->value.len >= 0) continue;
            sluice_bytes val = d->str;
            if (d->type == SLUICE_JSON_TRUE) val = sluice_str("true");
            if (d->type == SLUICE_JSON_FALSE) val = sluice_str("false");
            if (!kv_put(&cfg, d->key, val)) return 1;
            sluice_buf_puts(&changes, changes.len ? ", " : "");
            sluice_buf_puts(&changes, "set ");
            sluice_buf_put_bytes(&changes, d->key);
            sluice_buf_putc(&changes, '=');
            sluice_buf_put_bytes(&changes, val);
            rewrote_configs = 1;
        }
    }
    if (cap_partitions && has_partitions && (creating || adding_partitions)) {
        int64_t capped = partitions;
        if (partitions_b.has_max && capped > partitions_b.max) capped = partitions_b.max;
        if (partitions_b.has_min && capped < partitions_b.min) capped = partitions_b.min;
        if (capped != partitions && capped > 0) {
            sluice_buf_puts(&changes, changes.len ? ", " : "");
            sluice_buf_puts(&changes, "partitions ");
            sluice_buf_put_int(&changes, partitions);
            sluice_buf_puts(&changes, " -> ");
            sluice_buf_put_int(&changes, capped);
            partitions = capped;
            rewrote_partitions = 1;
        }
    }

    verdict v;
    sluice_buf_init(&v.msg, 256);
    v.violations = 0;
    if (creating && have_pattern) {
        int m = regex_search(&name_re, name);
        if (m < 0) return 1;
        if (!m) {
            violation(&v, "name_pattern");
            sluice_buf_puts(&v.msg, "topic name ");
            put_quoted(&v.msg, name);
            sluice_buf_puts(&v.msg, " does not match ");
            put_quoted(&v.msg, name_pattern);
        }
    }
    if (has_partitions && (creating || adding_partitions)) {
        if (partitions_b.has_min && partitions < partitions_b.min) {
            violation(&v, "partitions.min");
            sluice_buf_put_int(&v.msg, partitions);
            sluice_buf_puts(&v.msg, " requested, at least ");
            sluice_buf_put_int(&v.msg, partitions_b.min);
            sluice_buf_puts(&v.msg, " required");
        }
        if (partitions_b.has_max && partitions > partitions_b.max) {
            violation(&v, "partitions.max");
            sluice_buf_put_int(&v.msg, partitions);
            sluice_buf_puts(&v.msg, " requested, at most ");
            sluice_buf_put_int(&v.msg, partitions_b.max);
            sluice_buf_puts(&v.msg, " allowed");
        }
    }
    if (creating && has_min_rf && has_rf && rf < min_rf) {
        violation(&v, "min_replication_factor");
        sluice_buf_puts(&v.msg, "replication factor ");
        sluice_buf_put_int(&v.msg, rf);
        sluice_buf_puts(&v.msg, ", at least ");
        sluice_buf_put_int(&v.msg, min_rf);
        sluice_buf_puts(&v.msg, " required");
    }
    if (!adding_partitions) {
        if (allowed_cleanup) {
            sluice_bytes cp = kv_get(&cfg, "cleanup.policy");
            /* a comma-separated list ("compact,delete"): every entry must be allowed */
            int32_t i = 0;
            while (cp.len >= 0 && i <= cp.len) {
                int32_t s = i;
                while (i < cp.len && cp.ptr[i] != ',') i++;
                int32_t a = s, b = i;
                while (a < b && cp.ptr[a] == ' ') a++;
                while (b > a && cp.ptr[b - 1] == ' ') b--;
                sluice_bytes item = sluice_bytes_of(cp.ptr + a, (size_t)(b - a));
                if (!list_has(allowed_cleanup, item)) {
                    violation(&v, "allowed_cleanup_policies");
                    sluice_buf_puts(&v.msg, "cleanup.policy ");
                    put_quoted(&v.msg, item);
                    sluice_buf_puts(&v.msg, " is not allowed (allowed:");
                    for (const sluice_json *c = allowed_cleanup->child; c; c = c->next) {
                        sluice_buf_putc(&v.msg, ' ');
                        sluice_buf_put_bytes(&v.msg, c->str);
                    }
                    sluice_buf_putc(&v.msg, ')');
                }
                i++;
            }
        }
        check_bounds(&v, &cfg, "retention.ms", &retention_b, "retention_ms.min", "retention_ms.max");
        check_bounds(&v, &cfg, "max.message.bytes", &message_b, "max_message_bytes.min", "max_message_bytes.max");
        if (required_configs) {
            for (const sluice_json *c = required_configs->child; c; c = c->next) {
                kv *e = kv_find(&cfg, c->str);
                if (e == NULL || e->value.len < 0) {
                    violation(&v, "required_configs");
                    put_quoted(&v.msg, c->str);
                    sluice_buf_puts(&v.msg, " must be set");
                }
            }
        }
        if (forbidden_configs) {
            for (const sluice_json *c = forbidden_configs->child; c; c = c->next) {
                kv *e = kv_find(&cfg, c->str);
                if (e && e->value.len >= 0) {
                    violation(&v, "forbidden_configs");
                    put_quoted(&v.msg, c->str);
                    sluice_buf_puts(&v.msg, " may not be set (value ");
                    put_quoted(&v.msg, e->value);
                    sluice_buf_putc(&v.msg, ')');
                }
            }
        }
    }

    if (v.violations) {
        sluice_count("denied", 1);
        sluice_buf_puts(out, "{\"decision\":\"deny\",\"message\":");
        sluice_buf_put_json_string(out, sluice_buf_bytes(&v.msg));
        sluice_buf_putc(out, '}');
    } else if (rewrote_configs || rewrote_partitions) {
        sluice_count("rewritten", 1);
        sluice_buf_puts(out, "{\"decision\":\"rewrite\",\"message\":");
        sluice_buf msg;
        sluice_buf_init(&msg, 128);
        sluice_buf_puts(&msg, "topic-policy: ");
        sluice_buf_put_bytes(&msg, sluice_buf_bytes(&changes));
        sluice_buf_put_json_string(out, sluice_buf_bytes(&msg));
        if (rewrote_partitions) {
            sluice_buf_puts(out, ",\"partitions\":");
            sluice_buf_put_int(out, partitions);
        }
        if (rewrote_configs) {
            sluice_buf_puts(out, ",\"configs\":{");
            for (uint32_t i = 0; i < cfg.n; i++) {
                if (i) sluice_buf_putc(out, ',');
                sluice_buf_put_json_string(out, cfg.v[i].key);
                sluice_buf_putc(out, ':');
                if (cfg.v[i].value.len < 0) sluice_buf_puts(out, "null");
                else sluice_buf_put_json_string(out, cfg.v[i].value);
            }
            sluice_buf_putc(out, '}');
        }
        sluice_buf_putc(out, '}');
    } else {
        sluice_buf_puts(out, "{\"decision\":\"allow\",\"message\":\"\"}");
    }
    if (out->failed || v.msg.failed) {
        sluice_set_error("topic-policy: out of memory");
        return 1;
    }
    return 0;
}
