/*
 * sluice_filter.h: the C SDK for Sluice Wasm filters (Sluice Wasm ABI v1).
 *
 * A filter is ONE C file that includes this header and defines
 *
 *     sluice_decision sluice_on_record(const sluice_record *rec);
 *
 * and optionally
 *
 *     int sluice_on_config(const sluice_json *config);      // once, at start-up; 0 = ok
 *
 * An admin filter (topic policies) defines SLUICE_ADMIN_FILTER before including this header
 * and writes
 *
 *     int sluice_on_admin(const sluice_json *req, sluice_buf *out);  // JSON in, JSON out
 *
 * (sluice_on_record is then optional: without it every record is kept.)
 *
 * The header implements the ABI exports (sluice_abi_version, sluice_alloc, sluice_init,
 * sluice_filter, sluice_admin, sluice_last_error): it parses the host's batch buffer, calls
 * sluice_on_record once per record, and encodes the decisions plus the detector counters
 * (sluice_count) for the host. Build freestanding, without libc:
 *
 *     python -m ziglang cc --target=wasm32-freestanding -Oz -s -nostdlib -mbulk-memory \
 *         -Wl,--no-entry -Wl,--export-dynamic -I filters/sdk myfilter.c -o myfilter.wasm
 *
 * or simply `sluice filter build DIR`. Include this header in exactly one .c file.
 *
 * Memory: sluice_malloc() hands out memory from an arena that is reset at the start of every
 * batch (and every admin call); there is no free. Memory allocated while sluice_on_config runs
 * is kept for the life of the instance (keep your parsed configuration there).
 *
 * Everything here is static except the ABI exports and the four memory routines the compiler
 * may call on its own (memcpy, memmove, memset, memcmp).
 *
 * Defining SLUICE_SDK_LIBRARY before the include leaves both out: the header is then a library
 * of helpers (JSON parser, record readers and writers) for a shim that brings its own exports
 * and a libc, as the JavaScript SDK's filters/sdk/js/sluice_js.c does.
 */
#ifndef SLUICE_FILTER_H
#define SLUICE_FILTER_H

#include <stddef.h>
#include <stdint.h>

#define SLUICE_ABI_VERSION 1

/* ------------------------------------------------------------------------------------------ */
/* Public types                                                                               */
/* ------------------------------------------------------------------------------------------ */

/* A byte string that may be null: len < 0 means null (absent key, tombstone value). */
typedef struct {
    const uint8_t *ptr;
    int32_t len;
} sluice_bytes;

typedef struct {
    sluice_bytes key; /* never null */
    sluice_bytes value;
} sluice_header;

enum { SLUICE_PRODUCE = 0, SLUICE_FETCH = 1 };

typedef struct {
    uint8_t direction;       /* SLUICE_PRODUCE or SLUICE_FETCH */
    sluice_bytes topic;
    int32_t partition;
    sluice_bytes client_id;
    sluice_bytes principal;
    uint32_t index;          /* position in the batch */
    int64_t offset;          /* produce: offset delta; fetch: absolute offset */
    int64_t timestamp_ms;
    sluice_bytes key;
    sluice_bytes value;
    uint32_t header_count;
    const sluice_header *headers;
} sluice_record;

enum { SLUICE_KEEP = 0, SLUICE_REWRITE = 1, SLUICE_DROP = 2, SLUICE_REJECT = 3, SLUICE_ERROR = 255 };

typedef struct {
    uint8_t kind;                 /* one of the enum above */
    sluice_bytes key;             /* rewrite: the new record */
    sluice_bytes value;
    uint32_t header_count;
    const sluice_header *headers;
    sluice_bytes reason;          /* reject / error: why */
} sluice_decision;

/* A growable byte buffer living in the per-call arena. */
typedef struct {
    uint8_t *ptr;
    uint32_t len;
    uint32_t cap;
    int failed; /* set when an allocation failed; the contents are then incomplete */
} sluice_buf;

/* A parsed JSON value (configuration, admin requests, or any value you parse yourself). */
enum {
    SLUICE_JSON_NULL = 0,
    SLUICE_JSON_FALSE,
    SLUICE_JSON_TRUE,
    SLUICE_JSON_NUMBER,
    SLUICE_JSON_STRING,
    SLUICE_JSON_ARRAY,
    SLUICE_JSON_OBJECT
};

typedef struct sluice_json {
    uint8_t type;
    sluice_bytes key;           /* member name when the parent is an object (decoded UTF-8) */
    sluice_bytes str;           /* decoded string, or the number's text */
    uint32_t count;             /* number of children (array / object) */
    struct sluice_json *child;  /* first child */
    struct sluice_json *next;   /* next sibling */
} sluice_json;

/* ------------------------------------------------------------------------------------------ */
/* The functions a filter author writes                                                       */
/* ------------------------------------------------------------------------------------------ */

/* `#define SLUICE_ON_RECORD_DEFINED` before including this header promises a sluice_on_record
 * in the same file: then it is not weak, and sluice_filter_records calls it in line (a call
 * per record costs the guest ~5 ns under wasmtime). */
#ifdef SLUICE_ON_RECORD_DEFINED
sluice_decision sluice_on_record(const sluice_record *rec);
#else
sluice_decision sluice_on_record(const sluice_record *rec) __attribute__((weak));
#endif
int sluice_on_config(const sluice_json *config) __attribute__((weak));
int sluice_on_admin(const sluice_json *request, sluice_buf *out) __attribute__((weak));

/* A filter may finish work it deferred for a whole batch (builtin:rules hashes four fields at
 * a time): `#define SLUICE_BATCH_END name` before including this header and define
 * `static void name(void)`. Both batch entry points call it after the last record's
 * sluice_on_record, before the output is written; decisions may point at bytes it fills in.
 * SLUICE_BATCH_BEGIN (same form) is called at the start of each batch call, before any record,
 * so state a failed call left behind can be dropped. Filters that define neither compile
 * exactly as before. */
#ifdef SLUICE_BATCH_END
static void SLUICE_BATCH_END(void);
#endif
/* A filter that hands work to the host after a sluice_filter_records call (builtin:rules'
 * host_sha256 requests point into the output's records section): `#define
 * SLUICE_VALUE_WRITTEN name` and define `static void name(const uint8_t *src, uint8_t *dst,
 * int32_t len)`; sluice_filter_records calls it for each rewritten record whose value is not
 * null, once the value's `len` bytes at `src` (its decision's value) are copied to `dst` in the
 * output, in record order. `sl__records_call` then says which entry point is running (1:
 * sluice_filter_records, 0: sluice_filter). Filters that define neither compile as before. */
#ifdef SLUICE_VALUE_WRITTEN
static void SLUICE_VALUE_WRITTEN(const uint8_t *src, uint8_t *dst, int32_t len);
static int sl__records_call;
#endif
/* A filter that may change a record's key, value or header values where they lie in the input
 * (byte for byte, keeping every length) and return them as its rewrite defines
 * SLUICE_REWRITE_IN_PLACE: sluice_filter_records then copies such a record as it is now, with
 * the kept records around it, instead of writing it field by field. */
#ifdef SLUICE_BATCH_BEGIN
static void SLUICE_BATCH_BEGIN(void);
#endif

/* ------------------------------------------------------------------------------------------ */
/* Freestanding memory routines (clang may emit calls to these)                               */
/* ------------------------------------------------------------------------------------------ */
#ifndef SLUICE_SDK_LIBRARY

void *memcpy(void *dst, const void *src, size_t n) { return __builtin_memmove(dst, src, n); }
void *memmove(void *dst, const void *src, size_t n) { return __builtin_memmove(dst, src, n); }
void *memset(void *dst, int c, size_t n) { return __builtin_memset(dst, c, n); }
int memcmp(const void *a, const void *b, size_t n) {
    const uint8_t *x = (const uint8_t *)a, *y = (const uint8_t *)b;
    for (size_t i = 0; i < n; i++) {
        if (x[i] != y[i]) return (int)x[i] - (int)y[i];
    }
    return 0;
}
#endif /* SLUICE_SDK_LIBRARY */

static size_t sluice_strlen(const char *s) {
    size_t n = 0;
    while (s[n]) n++;
    return n;
}

/* ------------------------------------------------------------------------------------------ */
/* Arena                                                                                      */
/* ------------------------------------------------------------------------------------------ */

extern unsigned char __heap_base;

static uintptr_t sl__arena_base; /* first byte of the per-call arena (after init memory) */
static uintptr_t sl__top;        /* next free byte */
static uintptr_t sl__limit;      /* end of linear memory */

static void sl__arena_setup(void) {
    if (sl__arena_base == 0) {
        sl__arena_base = ((uintptr_t)&__heap_base + 15u) & ~(uintptr_t)15u;
        sl__top = sl__arena_base;
        sl__limit = (uintptr_t)__builtin_wasm_memory_size(0) * 65536u;
    }
}

/* Memory for the current call; NULL when the host's memory cap is reached. */
static void *sluice_malloc(size_t n) {
    sl__arena_setup();
    uintptr_t p = (sl__top + 7u) & ~(uintptr_t)7u;
    if (n > 0x7fffffffu || p + n < p) return NULL;
    uintptr_t end = p + n;
    if (end > sl__limit) {
        size_t pages = (end - sl__limit + 65535u) / 65536u;
        if (__builtin_wasm_memory_grow(0, pages) == (size_t)-1) return NULL;
        sl__limit = (uintptr_t)__builtin_wasm_memory_size(0) * 65536u;
    }
    sl__top = end;
    return (void *)p;
}

static void sl__arena_reset(void) {
    sl__arena_setup();
    sl__top = sl__arena_base;
}

/* Grow the most recent allocation in place when possible, else copy. */
static void *sl__realloc(void *old, size_t old_n, size_t new_n) {
    if (old != NULL && (uintptr_t)old + old_n == sl__top) {
        uintptr_t end = (uintptr_t)old + new_n;
        if (end <= sl__limit) {
            sl__top = end;
            return old;
        }
    }
    void *p = sluice_malloc(new_n);
    if (p != NULL && old != NULL) memcpy(p, old, old_n < new_n ? old_n : new_n);
    return p;
}

/* ------------------------------------------------------------------------------------------ */
/* Small helpers                                                                              */
/* ------------------------------------------------------------------------------------------ */

static sluice_bytes sluice_null(void) {
    sluice_bytes b = {NULL, -1};
    return b;
}

static sluice_bytes sluice_bytes_of(const void *ptr, size_t len) {
    sluice_bytes b = {(const uint8_t *)ptr, (int32_t)len};
    return b;
}

static sluice_bytes sluice_str(const char *s) { return sluice_bytes_of(s, sluice_strlen(s)); }

static int sluice_is_null(sluice_bytes b) { return b.len < 0; }

static int sluice_eq(sluice_bytes a, sluice_bytes b) {
    if (a.len != b.len) return 0;
    if (a.len <= 0) return 1;
    return memcmp(a.ptr, b.ptr, (size_t)a.len) == 0;
}

static int sluice_eq_str(sluice_bytes a, const char *s) { return a.len >= 0 && sluice_eq(a, sluice_str(s)); }

static uint8_t sluice_lower(uint8_t c) { return (c >= 'A' && c <= 'Z') ? (uint8_t)(c + 32) : c; }

static int sluice_eq_nocase(sluice_bytes a, sluice_bytes b) {
    if (a.len != b.len || a.len < 0) return 0;
    for (int32_t i = 0; i < a.len; i++) {
        if (sluice_lower(a.ptr[i]) != sluice_lower(b.ptr[i])) return 0;
    }
    return 1;
}

/* Copy bytes into the arena (a rewrite must not point into the host's input if you modify). */
static sluice_bytes sluice_copy(sluice_bytes b) {
    if (b.len <= 0) return b;
    uint8_t *p = (uint8_t *)sluice_malloc((size_t)b.len);
    if (p == NULL) return sluice_null();
    memcpy(p, b.ptr, (size_t)b.len);
    return sluice_bytes_of(p, (size_t)b.len);
}

/* First header with this name, or null bytes. */
static sluice_bytes sluice_header_get(const sluice_record *rec, const char *name) {
    sluice_bytes n = sluice_str(name);
    for (uint32_t i = 0; i < rec->header_count; i++) {
        if (sluice_eq(rec->headers[i].key, n)) return rec->headers[i].value;
    }
    return sluice_null();
}

/* ------------------------------------------------------------------------------------------ */
/* Buffers                                                                                    */
/* ------------------------------------------------------------------------------------------ */

static void sluice_buf_init(sluice_buf *b, uint32_t cap) {
    b->len = 0;
    b->failed = 0;
    b->cap = cap ? cap : 64;
    b->ptr = (uint8_t *)sluice_malloc(b->cap);
    if (b->ptr == NULL) {
        b->cap = 0;
        b->failed = 1;
    }
}

static inline __attribute__((always_inline)) int sluice_buf_reserve(sluice_buf *b, uint32_t extra) {
    if (b->failed) return 0;
    if ((uint64_t)b->len + extra <= b->cap) return 1;
    uint64_t want = (uint64_t)b->cap * 2u;
    if (want < (uint64_t)b->len + extra) want = (uint64_t)b->len + extra;
    if (want > 0x7fffffffu) {
        b->failed = 1;
        return 0;
    }
    uint8_t *p = (uint8_t *)sl__realloc(b->ptr, b->cap, (size_t)want);
    if (p == NULL) {
        b->failed = 1;
        return 0;
    }
    b->ptr = p;
    b->cap = (uint32_t)want;
    return 1;
}

static inline __attribute__((always_inline)) void sluice_buf_put(sluice_buf *b, const void *src, uint32_t n) {
    if (n == 0 || !sluice_buf_reserve(b, n)) return;
    memcpy(b->ptr + b->len, src, n);
    b->len += n;
}

static void sluice_buf_putc(sluice_buf *b, uint8_t c) {
    if (!sluice_buf_reserve(b, 1)) return;
    b->ptr[b->len++] = c;
}

static void sluice_buf_puts(sluice_buf *b, const char *s) { sluice_buf_put(b, s, (uint32_t)sluice_strlen(s)); }

static void sluice_buf_put_bytes(sluice_buf *b, sluice_bytes s) {
    if (s.len > 0) sluice_buf_put(b, s.ptr, (uint32_t)s.len);
}

static void sluice_buf_put_int(sluice_buf *b, int64_t v) {
    char tmp[24];
    int n = 0;
    uint64_t u = v < 0 ? (uint64_t)0 - (uint64_t)v : (uint64_t)v;
    do {
        tmp[n++] = (char)('0' + (u % 10u));
        u /= 10u;
    } while (u);
    if (v < 0) sluice_buf_putc(b, '-');
    while (n) sluice_buf_putc(b, (uint8_t)tmp[--n]);
}

/* Append `s` as a JSON string literal (quotes included), escaping what JSON requires. */
static void sluice_buf_put_json_string(sluice_buf *b, sluice_bytes s) {
    static const char hex[] = "0123456789abcdef";
    sluice_buf_putc(b, '"');
    for (int32_t i = 0; i < s.len; i++) {
        uint8_t c = s.ptr[i];
        if (c == '"' || c == '\\') {
            sluice_buf_putc(b, '\\');
            sluice_buf_putc(b, c);
        } else if (c < 0x20) {
            switch (c) {
            case '\n': sluice_buf_puts(b, "\\n"); break;
            case '\r': sluice_buf_puts(b, "\\r"); break;
            case '\t': sluice_buf_puts(b, "\\t"); break;
            case '\b': sluice_buf_puts(b, "\\b"); break;
            case '\f': sluice_buf_puts(b, "\\f"); break;
            default:
                sluice_buf_puts(b, "\\u00");
                sluice_buf_putc(b, (uint8_t)hex[c >> 4]);
                sluice_buf_putc(b, (uint8_t)hex[c & 15]);
            }
        } else {
            sluice_buf_putc(b, c);
        }
    }
    sluice_buf_putc(b, '"');
}

static sluice_bytes sluice_buf_bytes(const sluice_buf *b) { return sluice_bytes_of(b->ptr, b->len); }

/* ------------------------------------------------------------------------------------------ */
/* Decisions                                                                                  */
/* ------------------------------------------------------------------------------------------ */

static sluice_decision sl__decision(uint8_t kind) {
    sluice_decision d;
    memset(&d, 0, sizeof d);
    d.kind = kind;
    d.key = sluice_null();
    d.value = sluice_null();
    d.reason = sluice_null();
    return d;
}

static sluice_decision sluice_keep(void) { return sl__decision(SLUICE_KEEP); }
static sluice_decision sluice_drop(void) { return sl__decision(SLUICE_DROP); }

static sluice_decision sluice_reject_bytes(sluice_bytes reason) {
    sluice_decision d = sl__decision(SLUICE_REJECT);
    d.reason = reason.len < 0 ? sluice_bytes_of("", 0) : reason;
    return d;
}

static sluice_decision sluice_reject(const char *reason) { return sluice_reject_bytes(sluice_str(reason)); }

/* Abort the whole batch: the host applies the filter's on_error policy. */
static sluice_decision sluice_error(const char *message) {
    sluice_decision d = sl__decision(SLUICE_ERROR);
    d.reason = sluice_str(message);
    return d;
}

static sluice_decision sluice_rewrite(sluice_bytes key, sluice_bytes value, const sluice_header *headers,
                                      uint32_t header_count) {
    sluice_decision d = sl__decision(SLUICE_REWRITE);
    d.key = key;
    d.value = value;
    d.headers = headers;
    d.header_count = header_count;
    return d;
}

/* Same key and headers, new value. */
static sluice_decision sluice_rewrite_value(const sluice_record *rec, sluice_bytes value) {
    return sluice_rewrite(rec->key, value, rec->headers, rec->header_count);
}

/* Same value and headers, new key. */
static sluice_decision sluice_rewrite_key(const sluice_record *rec, sluice_bytes key) {
    return sluice_rewrite(key, rec->value, rec->headers, rec->header_count);
}

/* ------------------------------------------------------------------------------------------ */
/* Detector counters: reported to the host once per batch (telemetry)                         */
/* ------------------------------------------------------------------------------------------ */

#ifndef SLUICE_MAX_COUNTERS
#define SLUICE_MAX_COUNTERS 32
#endif

static struct {
    const char *name;
    uint32_t name_len;
    uint32_t count;
} sl__counters[SLUICE_MAX_COUNTERS];
static uint32_t sl__counter_n;

/* Add n to the counter `name` for this batch. `name` must be a string literal (or live as long
 * as the instance): the SDK keeps the pointer. */
static void sluice_count(const char *name, uint32_t n) {
    for (uint32_t i = 0; i < sl__counter_n; i++) {
        if (sl__counters[i].name == name) {
            sl__counters[i].count += n;
            return;
        }
    }
    uint32_t len = (uint32_t)sluice_strlen(name);
    for (uint32_t i = 0; i < sl__counter_n; i++) {
        if (sl__counters[i].name_len == len && memcmp(sl__counters[i].name, name, len) == 0) {
            sl__counters[i].count += n;
            return;
        }
    }
    if (sl__counter_n < SLUICE_MAX_COUNTERS) {
        sl__counters[sl__counter_n].name = name;
        sl__counters[sl__counter_n].name_len = len;
        sl__counters[sl__counter_n].count = n;
        sl__counter_n++;
    }
}

/* ------------------------------------------------------------------------------------------ */
/* Errors                                                                                     */
/* ------------------------------------------------------------------------------------------ */

static char sl__error[256];
static uint32_t sl__error_len;

static void sluice_set_error_bytes(sluice_bytes msg) {
    uint32_t n = msg.len > 0 ? (uint32_t)msg.len : 0;
    if (n > sizeof sl__error) n = sizeof sl__error;
    if (n) memcpy(sl__error, msg.ptr, n);
    sl__error_len = n;
}

static void sluice_set_error(const char *msg) { sluice_set_error_bytes(sluice_str(msg)); }

/* ------------------------------------------------------------------------------------------ */
/* JSON parser (RFC 8259, strict, UTF-8 checked, depth-limited)                               */
/* ------------------------------------------------------------------------------------------ */

#ifndef SLUICE_JSON_MAX_DEPTH
#define SLUICE_JSON_MAX_DEPTH 64
#endif

typedef struct {
    const uint8_t *p;
    const uint8_t *end;
    const char *error;
    int depth;
} sl__jp;

static void sl__ws(sl__jp *j) {
    while (j->p < j->end && (*j->p == ' ' || *j->p == '\t' || *j->p == '\n' || *j->p == '\r')) j->p++;
}

static int sl__hex(uint8_t c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

static void sl__put_utf8(sluice_buf *b, uint32_t cp) {
    if (cp < 0x80) {
        sluice_buf_putc(b, (uint8_t)cp);
    } else if (cp < 0x800) {
        sluice_buf_putc(b, (uint8_t)(0xC0 | (cp >> 6)));
        sluice_buf_putc(b, (uint8_t)(0x80 | (cp & 0x3F)));
    } else if (cp < 0x10000) {
        sluice_buf_putc(b, (uint8_t)(0xE0 | (cp >> 12)));
        sluice_buf_putc(b, (uint8_t)(0x80 | ((cp >> 6) & 0x3F)));
        sluice_buf_putc(b, (uint8_t)(0x80 | (cp & 0x3F)));
    } else {
        sluice_buf_putc(b, (uint8_t)(0xF0 | (cp >> 18)));
        sluice_buf_putc(b, (uint8_t)(0x80 | ((cp >> 12) & 0x3F)));
        sluice_buf_putc(b, (uint8_t)(0x80 | ((cp >> 6) & 0x3F)));
        sluice_buf_putc(b, (uint8_t)(0x80 | (cp & 0x3F)));
    }
}

/* Length of the valid UTF-8 sequence at p (1..4), or 0 if invalid. */
static int sluice_utf8_len(const uint8_t *p, const uint8_t *end) {
    uint8_t c = p[0];
    if (c < 0x80) return 1;
    int n;
    uint32_t cp;
    if (c >= 0xC2 && c <= 0xDF) {
        n = 2;
        cp = c & 0x1F;
    } else if (c >= 0xE0 && c <= 0xEF) {
        n = 3;
        cp = c & 0x0F;
    } else if (c >= 0xF0 && c <= 0xF4) {
        n = 4;
        cp = c & 0x07;
    } else {
        return 0;
    }
    if (end - p < n) return 0;
    for (int i = 1; i < n; i++) {
        if ((p[i] & 0xC0) != 0x80) return 0;
        cp = (cp << 6) | (p[i] & 0x3F);
    }
    if ((n == 3 && cp < 0x800) || (n == 4 && (cp < 0x10000 || cp > 0x10FFFF))) return 0;
    if (cp >= 0xD800 && cp <= 0xDFFF) return 0;
    return n;
}

/* Parses a string at j->p (which is at the opening quote). When out != NULL the decoded bytes
 * are appended to it. Returns 1 on success. */
static int sl__jstring(sl__jp *j, sluice_buf *out) {
    j->p++; /* opening quote */
    for (;;) {
        if (j->p >= j->end) {
            j->error = "unterminated string";
            return 0;
        }
        uint8_t c = *j->p;
        if (c == '"') {
            j->p++;
            return 1;
        }
        if (c < 0x20) {
            j->error = "control character in string";
            return 0;
        }
        if (c == '\\') {
            if (j->end - j->p < 2) {
                j->error = "bad escape";
                return 0;
            }
            uint8_t e = j->p[1];
            uint8_t lit = 0;
            switch (e) {
            case '"': lit = '"'; break;
            case '\\': lit = '\\'; break;
            case '/': lit = '/'; break;
            case 'b': lit = '\b'; break;
            case 'f': lit = '\f'; break;
            case 'n': lit = '\n'; break;
            case 'r': lit = '\r'; break;
            case 't': lit = '\t'; break;
            case 'u': break;
            default: j->error = "bad escape"; return 0;
            }
            if (e != 'u') {
                if (out) sluice_buf_putc(out, lit);
                j->p += 2;
                continue;
            }
            if (j->end - j->p < 6) {
                j->error = "bad \\u escape";
                return 0;
            }
            uint32_t cp = 0;
            for (int i = 2; i < 6; i++) {
                int h = sl__hex(j->p[i]);
                if (h < 0) {
                    j->error = "bad \\u escape";
                    return 0;
                }
                cp = (cp << 4) | (uint32_t)h;
            }
            j->p += 6;
            if (cp >= 0xD800 && cp <= 0xDBFF) {
                /* a high surrogate must be followed by a low one */
                uint32_t lo = 0;
                if (j->end - j->p >= 6 && j->p[0] == '\\' && j->p[1] == 'u') {
                    int okhex = 1;
                    for (int i = 2; i < 6; i++) {
                        int h = sl__hex(j->p[i]);
                        if (h < 0) okhex = 0;
                        lo = (lo << 4) | (uint32_t)(h < 0 ? 0 : h);
                    }
                    if (okhex && lo >= 0xDC00 && lo <= 0xDFFF) {
                        j->p += 6;
                        cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
                        if (out) sl__put_utf8(out, cp);
                        continue;
                    }
                }
                cp = 0xFFFD; /* lone surrogate: JSON allows it, UTF-8 cannot hold it */
            } else if (cp >= 0xDC00 && cp <= 0xDFFF) {
                cp = 0xFFFD;
            }
            if (out) sl__put_utf8(out, cp);
            continue;
        }
        int n = sluice_utf8_len(j->p, j->end);
        if (n == 0) {
            j->error = "invalid UTF-8";
            return 0;
        }
        if (out) sluice_buf_put(out, j->p, (uint32_t)n);
        j->p += n;
    }
}

static int sl__jnumber(sl__jp *j) {
    const uint8_t *p = j->p, *e = j->end;
    if (p < e && *p == '-') p++;
    if (p >= e) goto bad;
    if (*p == '0') {
        p++;
    } else if (*p >= '1' && *p <= '9') {
        while (p < e && *p >= '0' && *p <= '9') p++;
    } else {
        goto bad;
    }
    if (p < e && *p == '.') {
        p++;
        if (p >= e || *p < '0' || *p > '9') goto bad;
        while (p < e && *p >= '0' && *p <= '9') p++;
    }
    if (p < e && (*p == 'e' || *p == 'E')) {
        p++;
        if (p < e && (*p == '+' || *p == '-')) p++;
        if (p >= e || *p < '0' || *p > '9') goto bad;
        while (p < e && *p >= '0' && *p <= '9') p++;
    }
    j->p = p;
    return 1;
bad:
    j->error = "bad number";
    return 0;
}

static int sl__jlit(sl__jp *j, const char *lit) {
    size_t n = sluice_strlen(lit);
    if ((size_t)(j->end - j->p) < n || memcmp(j->p, lit, n) != 0) {
        j->error = "unexpected token";
        return 0;
    }
    j->p += n;
    return 1;
}

static sluice_json *sl__jnode(sl__jp *j, uint8_t type) {
    sluice_json *n = (sluice_json *)sluice_malloc(sizeof(sluice_json));
    if (n == NULL) {
        j->error = "out of memory";
        return NULL;
    }
    memset(n, 0, sizeof *n);
    n->type = type;
    n->key = sluice_null();
    n->str = sluice_null();
    return n;
}

/* build: 0 = validate only (no allocation), 1 = build nodes */
static sluice_json *sl__jvalue(sl__jp *j, int build, int *ok);

static sluice_bytes sl__jdecoded(sl__jp *j, int build, int *ok) {
    if (!build) {
        *ok = sl__jstring(j, NULL);
        return sluice_null();
    }
    sluice_buf b;
    sluice_buf_init(&b, 16);
    *ok = sl__jstring(j, &b);
    if (*ok && b.failed) {
        j->error = "out of memory";
        *ok = 0;
    }
    return sluice_buf_bytes(&b);
}

static sluice_json *sl__jvalue(sl__jp *j, int build, int *ok) {
    static sluice_json dummy;
    sluice_json *node = build ? NULL : &dummy;
    *ok = 0;
    sl__ws(j);
    if (j->p >= j->end) {
        j->error = "unexpected end of input";
        return NULL;
    }
    uint8_t c = *j->p;
    if (c == '{' || c == '[') {
        if (++j->depth > SLUICE_JSON_MAX_DEPTH) {
            j->error = "nesting too deep";
            return NULL;
        }
        uint8_t close = c == '{' ? '}' : ']';
        if (build && (node = sl__jnode(j, c == '{' ? SLUICE_JSON_OBJECT : SLUICE_JSON_ARRAY)) == NULL) return NULL;
        j->p++;
        sl__ws(j);
        sluice_json *last = NULL;
        if (j->p < j->end && *j->p == close) {
            j->p++;
            j->depth--;
            *ok = 1;
            return node;
        }
        for (;;) {
            sluice_bytes key = sluice_null();
            sl__ws(j);
            if (c == '{') {
                int kok;
                if (j->p >= j->end || *j->p != '"') {
                    j->error = "expected member name";
                    return NULL;
                }
                key = sl__jdecoded(j, build, &kok);
                if (!kok) return NULL;
                sl__ws(j);
                if (j->p >= j->end || *j->p != ':') {
                    j->error = "expected ':'";
                    return NULL;
                }
                j->p++;
            }
            int vok;
            sluice_json *child = sl__jvalue(j, build, &vok);
            if (!vok) return NULL;
            if (build) {
                child->key = key;
                if (last) last->next = child;
                else node->child = child;
                last = child;
                node->count++;
            }
            sl__ws(j);
            if (j->p >= j->end) {
                j->error = "unexpected end of input";
                return NULL;
            }
            if (*j->p == ',') {
                j->p++;
                continue;
            }
            if (*j->p == close) {
                j->p++;
                break;
            }
            j->error = c == '{' ? "expected ',' or '}'" : "expected ',' or ']'";
            return NULL;
        }
        j->depth--;
        *ok = 1;
        return node;
    }
    if (c == '"') {
        int sok;
        sluice_bytes s = sl__jdecoded(j, build, &sok);
        if (!sok) return NULL;
        if (build) {
            if ((node = sl__jnode(j, SLUICE_JSON_STRING)) == NULL) return NULL;
            node->str = s;
        }
        *ok = 1;
        return node;
    }
    if (c == '-' || (c >= '0' && c <= '9')) {
        const uint8_t *start = j->p;
        if (!sl__jnumber(j)) return NULL;
        if (build) {
            if ((node = sl__jnode(j, SLUICE_JSON_NUMBER)) == NULL) return NULL;
            node->str = sluice_bytes_of(start, (size_t)(j->p - start));
        }
        *ok = 1;
        return node;
    }
    uint8_t type;
    if (c == 't') {
        if (!sl__jlit(j, "true")) return NULL;
        type = SLUICE_JSON_TRUE;
    } else if (c == 'f') {
        if (!sl__jlit(j, "false")) return NULL;
        type = SLUICE_JSON_FALSE;
    } else if (c == 'n') {
        if (!sl__jlit(j, "null")) return NULL;
        type = SLUICE_JSON_NULL;
    } else {
        j->error = "unexpected character";
        return NULL;
    }
    if (build && (node = sl__jnode(j, type)) == NULL) return NULL;
    *ok = 1;
    return node;
}

/* Byte offset of the last error of sluice_json_parse / sluice_json_valid. */
static int32_t sluice_json_error_offset;

/* Parse one JSON text. Returns NULL on error and sets *error (if given) to a static message.
 * Number and string values may point into `data` (numbers) or the arena (strings). */
static sluice_json *sluice_json_parse(sluice_bytes data, const char **error) {
    sl__jp j = {data.ptr, data.ptr + (data.len > 0 ? data.len : 0), NULL, 0};
    int ok;
    if (data.len < 0) {
        if (error) *error = "null";
        return NULL;
    }
    sluice_json *root = sl__jvalue(&j, 1, &ok);
    if (ok) {
        sl__ws(&j);
        if (j.p != j.end) {
            ok = 0;
            j.error = "trailing characters after JSON value";
        }
    }
    if (!ok) {
        if (error) *error = j.error ? j.error : "invalid JSON";
        sluice_json_error_offset = (int32_t)(j.p - data.ptr);
        return NULL;
    }
    return root;
}

/* Validate without building a tree (no allocation). Returns 1 if `data` is one JSON text. */
static int sluice_json_valid(sluice_bytes data, const char **error) {
    sl__jp j = {data.ptr, data.ptr + (data.len > 0 ? data.len : 0), NULL, 0};
    int ok;
    if (data.len < 0) {
        if (error) *error = "null";
        return 0;
    }
    sl__jvalue(&j, 0, &ok);
    if (ok) {
        sl__ws(&j);
        if (j.p != j.end) {
            ok = 0;
            j.error = "trailing characters after JSON value";
        }
    }
    if (!ok) {
        if (error) *error = j.error ? j.error : "invalid JSON";
        sluice_json_error_offset = (int32_t)(j.p - data.ptr);
    }
    return ok;
}

/* Member of an object by name (NULL if absent or not an object). */
static const sluice_json *sluice_json_get(const sluice_json *obj, const char *name) {
    if (obj == NULL || obj->type != SLUICE_JSON_OBJECT) return NULL;
    sluice_bytes n = sluice_str(name);
    const sluice_json *found = NULL;
    for (const sluice_json *c = obj->child; c; c = c->next) {
        if (sluice_eq(c->key, n)) found = c; /* last duplicate wins, like most parsers */
    }
    return found;
}

/* Member by dotted path ("user.address.city"); array elements by index ("items.0.id"). */
static const sluice_json *sluice_json_path(const sluice_json *node, sluice_bytes path) {
    int32_t i = 0;
    while (node && i <= path.len) {
        int32_t s = i;
        while (i < path.len && path.ptr[i] != '.') i++;
        sluice_bytes seg = sluice_bytes_of(path.ptr + s, (size_t)(i - s));
        const sluice_json *next = NULL;
        if (node->type == SLUICE_JSON_OBJECT) {
            for (const sluice_json *c = node->child; c; c = c->next) {
                if (sluice_eq(c->key, seg)) next = c;
            }
        } else if (node->type == SLUICE_JSON_ARRAY && seg.len > 0) {
            uint32_t idx = 0;
            int digits = 1;
            for (int32_t k = 0; k < seg.len; k++) {
                if (seg.ptr[k] < '0' || seg.ptr[k] > '9') digits = 0;
                else idx = idx * 10u + (uint32_t)(seg.ptr[k] - '0');
            }
            if (digits) {
                const sluice_json *c = node->child;
                while (c && idx--) c = c->next;
                next = c;
            }
        }
        node = next;
        i++;
        if (i > path.len) break;
    }
    return node;
}

static int sluice_json_bool(const sluice_json *n, int dflt) {
    if (n == NULL) return dflt;
    if (n->type == SLUICE_JSON_TRUE) return 1;
    if (n->type == SLUICE_JSON_FALSE) return 0;
    return dflt;
}

/* Integer value of a number (or of a string holding an integer, as Kafka configs are); dflt if
 * absent, fractional or out of range. */
static int sluice_json_int(const sluice_json *n, int64_t dflt, int64_t *out) {
    *out = dflt;
    if (n == NULL || (n->type != SLUICE_JSON_NUMBER && n->type != SLUICE_JSON_STRING)) return 0;
    sluice_bytes s = n->str;
    int32_t i = 0;
    int neg = 0;
    if (s.len <= 0) return 0;
    if (s.ptr[0] == '-') {
        neg = 1;
        i = 1;
    }
    if (i >= s.len) return 0;
    uint64_t v = 0;
    for (; i < s.len; i++) {
        uint8_t c = s.ptr[i];
        if (c < '0' || c > '9') return 0;
        if (v > (UINT64_C(9223372036854775807) - (c - '0')) / 10u) return 0;
        v = v * 10u + (c - '0');
    }
    *out = neg ? -(int64_t)v : (int64_t)v;
    return 1;
}

/* String value, or null bytes when `n` is not a string. */
static sluice_bytes sluice_json_string(const sluice_json *n) {
    if (n == NULL || n->type != SLUICE_JSON_STRING) return sluice_null();
    return n->str;
}

/* ------------------------------------------------------------------------------------------ */
/* The ABI (do not call these yourself)                                                       */
/* ------------------------------------------------------------------------------------------ */

static const sluice_json *sl__config;
static int sl__initialised;

/* The configuration object handed over by the host (NULL before sluice_init / without one). */
static const sluice_json *sluice_config(void) { return sl__config; }

typedef struct {
    const uint8_t *p;
    const uint8_t *end;
    int ok;
} sl__rd;

static uint32_t sl__u32(sl__rd *r) {
    if (r->end - r->p < 4) {
        r->ok = 0;
        return 0;
    }
    uint32_t v = (uint32_t)r->p[0] | ((uint32_t)r->p[1] << 8) | ((uint32_t)r->p[2] << 16) | ((uint32_t)r->p[3] << 24);
    r->p += 4;
    return v;
}

static int64_t sl__i64(sl__rd *r) {
    uint64_t lo = sl__u32(r);
    uint64_t hi = sl__u32(r);
    return (int64_t)(lo | (hi << 32));
}

/* `n` bytes at the cursor, for a length just read (-1 = null where `nullable`). */
static sluice_bytes sl__take(sl__rd *r, int32_t n, int nullable) {
    if (!r->ok) return sluice_null();
    if (n < 0) {
        if (!nullable || n != -1) r->ok = 0;
        return sluice_null();
    }
    if (r->end - r->p < n) {
        r->ok = 0;
        return sluice_null();
    }
    sluice_bytes b = sluice_bytes_of(r->p, (size_t)n);
    r->p += n;
    return b;
}

static sluice_bytes sl__bytes(sl__rd *r, int nullable) {
    int32_t n = (int32_t)sl__u32(r);
    return sl__take(r, n, nullable);
}

static int64_t sl__pack(const void *ptr, uint32_t len) {
    return (int64_t)(((uint64_t)(uintptr_t)ptr << 32) | (uint64_t)len);
}

static void sl__w32(uint8_t **p, uint32_t v) {
    (*p)[0] = (uint8_t)v;
    (*p)[1] = (uint8_t)(v >> 8);
    (*p)[2] = (uint8_t)(v >> 16);
    (*p)[3] = (uint8_t)(v >> 24);
    *p += 4;
}

static void sl__wbytes(uint8_t **p, sluice_bytes b) {
    if (b.len < 0) {
        sl__w32(p, 0xFFFFFFFFu);
        return;
    }
    sl__w32(p, (uint32_t)b.len);
    if (b.len) memcpy(*p, b.ptr, (size_t)b.len);
    *p += b.len;
}

static uint64_t sl__blen(sluice_bytes b) { return 4u + (b.len > 0 ? (uint64_t)b.len : 0u); }

#ifndef SLUICE_SDK_LIBRARY
__attribute__((export_name("sluice_abi_version"))) int32_t sluice_abi_version(void) { return SLUICE_ABI_VERSION; }

__attribute__((export_name("sluice_alloc"))) int32_t sluice_alloc(int32_t size) {
    /* The host allocates the input of the next call: the previous call's memory is dead. */
    sl__arena_reset();
    void *p = sluice_malloc(size > 0 ? (size_t)size : 1u);
    return (int32_t)(uintptr_t)p;
}

__attribute__((export_name("sluice_last_error"))) int64_t sluice_last_error(void) {
    return sl__pack(sl__error, sl__error_len);
}
#endif /* SLUICE_SDK_LIBRARY */

/* Keep the input alive: the arena restarts after it, wherever the host put it. */
static void sl__begin_call(int32_t in_ptr, int32_t in_len) {
    sl__arena_setup();
    uintptr_t end = (uintptr_t)(uint32_t)in_ptr + (uint32_t)in_len;
    if ((uintptr_t)(uint32_t)in_ptr >= sl__arena_base && end <= sl__limit && end > sl__top) sl__top = end;
    sl__error_len = 0;
    sl__counter_n = 0;
}

#ifndef SLUICE_SDK_LIBRARY
__attribute__((export_name("sluice_init"))) int32_t sluice_init(int32_t cfg_ptr, int32_t cfg_len) {
    sl__begin_call(cfg_ptr, cfg_len);
    sluice_bytes cfg = sluice_bytes_of((const void *)(uintptr_t)(uint32_t)cfg_ptr, (size_t)(cfg_len > 0 ? cfg_len : 0));
    sl__config = NULL;
    int rc = 0;
    if (cfg.len > 0) {
        const char *err = NULL;
        sl__config = sluice_json_parse(cfg, &err);
        if (sl__config == NULL) {
            sluice_set_error("configuration is not valid JSON");
            return 1;
        }
    }
    if (sluice_on_config) rc = sluice_on_config(sl__config);
    if (rc != 0 && sl__error_len == 0) sluice_set_error("configuration rejected by the filter");
    /* Everything allocated so far (config text, tree, the filter's own state) stays. */
    sl__arena_base = (sl__top + 15u) & ~(uintptr_t)15u;
    sl__initialised = 1;
    return rc;
}
#endif /* SLUICE_SDK_LIBRARY */

static int sl__ensure_init(void) {
    if (!sl__initialised && sluice_on_config) {
        if (sluice_on_config(NULL) != 0) {
            if (sl__error_len == 0) sluice_set_error("filter needs a configuration");
            return 0;
        }
        sl__initialised = 1;
    }
    return 1;
}

/* The input fields both batch entry points start with; 0 (error set) on a foreign version.
 * Truncation is left in r->ok for the caller's own header check. */
static int sl__read_context(sl__rd *r, sluice_record *ctx) {
    memset(ctx, 0, sizeof *ctx);
    uint32_t version = sl__u32(r);
    if (r->ok && version != SLUICE_ABI_VERSION) {
        sluice_set_error("unsupported input version");
        return 0;
    }
    if (r->end - r->p < 1) r->ok = 0;
    else ctx->direction = *r->p++;
    ctx->topic = sl__bytes(r, 0);
    ctx->partition = (int32_t)sl__u32(r);
    ctx->client_id = sl__bytes(r, 0);
    ctx->principal = sl__bytes(r, 0);
    return 1;
}

/* The decoding entry point's record helpers, shared with the JavaScript shim's sluice_filter
 * (sdk/js/sluice_js.c) like the native ones below. Reads the record at `r` (the ABI's
 * decoded layout): its fields, the headers into an array from `alloc`. Returns NULL, or why
 * it failed. */
static const char *sl__read_decoded(sl__rd *r, int64_t *offset, int64_t *timestamp_ms,
                                    sluice_bytes *key, sluice_bytes *value,
                                    uint32_t *header_count, sluice_header **headers,
                                    void *(*alloc)(size_t)) {
    *offset = sl__i64(r);
    *timestamp_ms = sl__i64(r);
    *key = sl__bytes(r, 1);
    *value = sl__bytes(r, 1);
    uint32_t hc = sl__u32(r);
    if (!r->ok || hc > (uint32_t)(r->end - r->p) / 8u) return "malformed record";
    *header_count = hc;
    if (hc) {
        sluice_header *hs = (sluice_header *)alloc(sizeof(sluice_header) * hc);
        if (hs == NULL) return "out of memory";
        for (uint32_t h = 0; h < hc; h++) {
            hs[h].key = sl__bytes(r, 0);
            hs[h].value = sl__bytes(r, 1);
        }
        if (!r->ok) return "malformed header";
        *headers = hs;
    }
    return NULL;
}

/* The bytes a decision takes in the decoding entry point's output. */
static uint64_t sl__decided_size(const sluice_decision *d) {
    uint64_t size = 1;
    if (d->kind == SLUICE_REWRITE) {
        size += sl__blen(d->key) + sl__blen(d->value) + 4;
        for (uint32_t h = 0; h < d->header_count; h++)
            size += sl__blen(d->headers[h].key) + sl__blen(d->headers[h].value);
    } else if (d->kind == SLUICE_REJECT) {
        size += sl__blen(d->reason);
    }
    return size;
}

/* Writes a decision of the decoding entry point's output (a null header name as ""). */
static void sl__write_decided(uint8_t **w, const sluice_decision *d) {
    *(*w)++ = d->kind;
    if (d->kind == SLUICE_REWRITE) {
        sl__wbytes(w, d->key);
        sl__wbytes(w, d->value);
        sl__w32(w, d->header_count);
        for (uint32_t h = 0; h < d->header_count; h++) {
            sluice_bytes hk = d->headers[h].key;
            sl__wbytes(w, hk.len < 0 ? sluice_bytes_of("", 0) : hk);
            sl__wbytes(w, d->headers[h].value);
        }
    } else if (d->kind == SLUICE_REJECT) {
        sl__wbytes(w, d->reason);
    }
}

#ifndef SLUICE_SDK_LIBRARY
__attribute__((export_name("sluice_filter"))) int64_t sluice_filter(int32_t in_ptr, int32_t in_len) {
    sl__begin_call(in_ptr, in_len);
#ifdef SLUICE_VALUE_WRITTEN
    sl__records_call = 0;
#endif
#ifdef SLUICE_BATCH_BEGIN
    SLUICE_BATCH_BEGIN();
#endif
    if (!sl__ensure_init()) return -1;
    sl__rd r = {(const uint8_t *)(uintptr_t)(uint32_t)in_ptr, (const uint8_t *)(uintptr_t)(uint32_t)in_ptr + (uint32_t)in_len, 1};
    sluice_record ctx;
    if (!sl__read_context(&r, &ctx)) return -1;
    uint32_t count = sl__u32(&r);
    if (!r.ok || count > (uint32_t)(r.end - r.p) / 28u + 1u) {
        sluice_set_error("malformed batch header");
        return -1;
    }
    sluice_decision *decisions = (sluice_decision *)sluice_malloc(sizeof(sluice_decision) * (count ? count : 1));
    if (decisions == NULL) {
        sluice_set_error("out of memory");
        return -1;
    }
    uint64_t out_size = 4;
    for (uint32_t i = 0; i < count; i++) {
        sluice_record rec = ctx;
        rec.index = i;
        sluice_header *hs = NULL;
        const char *bad = sl__read_decoded(&r, &rec.offset, &rec.timestamp_ms, &rec.key,
                                           &rec.value, &rec.header_count, &hs, sluice_malloc);
        if (bad) {
            sluice_set_error(bad);
            return -1;
        }
        rec.headers = hs;
#ifdef SLUICE_ON_RECORD_DEFINED
        sluice_decision d = sluice_on_record(&rec);
#else
        sluice_decision d = sluice_on_record ? sluice_on_record(&rec) : sluice_keep();
#endif
        if (d.kind == SLUICE_ERROR) {
            sluice_set_error_bytes(d.reason);
            if (sl__error_len == 0) sluice_set_error("filter error");
            return -1;
        }
        if (d.kind != SLUICE_KEEP && d.kind != SLUICE_DROP && d.kind != SLUICE_REWRITE &&
            d.kind != SLUICE_REJECT) {
            sluice_set_error("filter returned an unknown decision");
            return -1;
        }
        out_size += sl__decided_size(&d);
        decisions[i] = d;
    }
#ifdef SLUICE_BATCH_END
    SLUICE_BATCH_END();
#endif
    out_size += 4;
    for (uint32_t c = 0; c < sl__counter_n; c++) out_size += 8u + sl__counters[c].name_len;
    if (out_size > 0x7fffffffu) {
        sluice_set_error("output too large");
        return -1;
    }
    uint8_t *out = (uint8_t *)sluice_malloc((size_t)out_size);
    if (out == NULL) {
        sluice_set_error("out of memory");
        return -1;
    }
    uint8_t *w = out;
    sl__w32(&w, count);
    for (uint32_t i = 0; i < count; i++) sl__write_decided(&w, &decisions[i]);
    sl__w32(&w, sl__counter_n);
    for (uint32_t c = 0; c < sl__counter_n; c++) {
        sl__wbytes(&w, sluice_bytes_of(sl__counters[c].name, sl__counters[c].name_len));
        sl__w32(&w, sl__counters[c].count);
    }
    return sl__pack(out, (uint32_t)(w - out));
}
#endif /* SLUICE_SDK_LIBRARY */

/* ------------------------------------------------------------------------------------------ */
/* sluice_filter_records: the same filter over Kafka's own record encoding                     */
/* ------------------------------------------------------------------------------------------ */
/* The host hands over a batch's records section exactly as Kafka stores it (uncompressed) and
 * gets back the new records section plus one fate byte per record. Keeping Kafka's encoding on
 * both sides is what lets the host skip decoding and re-encoding every record in Python. */

static int64_t sl__varlong(sl__rd *r) {
    uint64_t v = 0;
    for (unsigned shift = 0; shift < 64; shift += 7) {
        if (r->p >= r->end) break;
        uint8_t b = *r->p++;
        v |= (uint64_t)(b & 0x7f) << shift;
        if (!(b & 0x80)) return (int64_t)((v >> 1) ^ (~(v & 1) + 1)); /* zigzag */
    }
    r->ok = 0;
    return 0;
}

/* Kafka's varint fields are 32-bit; anything wider is a malformed record. */
static int32_t sl__varint(sl__rd *r) {
    int64_t v = sl__varlong(r);
    if (v < -2147483647 - 1 || v > 2147483647) r->ok = 0;
    return r->ok ? (int32_t)v : 0;
}

static sluice_bytes sl__vbytes(sl__rd *r, int nullable) {
    int32_t n = sl__varint(r);
    return sl__take(r, n, nullable);
}

/* Without a loop (a Wasm loop pays wasmtime's epoch check on every turn): from the highest set
 * bit of the zigzag value (0 for 0), floor(bit * 9 / 64) + 1 is 1 for bits 0-6, 2 for 7-13,
 * ..., 10 for 63, the bytes of 7 bits each. */
static inline uint32_t sl__vsize(int64_t v) {
    uint64_t z = ((uint64_t)v << 1) ^ (uint64_t)(v >> 63);
    uint32_t bit = 63u - (uint32_t)__builtin_clzll(z | 1u);
    return (bit * 9u + 73u) >> 6;
}

static void sl__wvar(uint8_t **p, int64_t v) {
    uint64_t z = ((uint64_t)v << 1) ^ (uint64_t)(v >> 63);
    while (z > 0x7f) {
        *(*p)++ = (uint8_t)((z & 0x7f) | 0x80);
        z >>= 7;
    }
    *(*p)++ = (uint8_t)z;
}

static uint64_t sl__vblen(sluice_bytes b) {
    return b.len < 0 ? 1u : sl__vsize(b.len) + (uint64_t)b.len;
}

static void sl__wvbytes(uint8_t **p, sluice_bytes b) {
    if (b.len < 0) {
        sl__wvar(p, -1);
        return;
    }
    sl__wvar(p, b.len);
    if (b.len) memcpy(*p, b.ptr, (size_t)b.len);
    *p += b.len;
}

typedef struct {
    const uint8_t *raw;  /* the record as it came, length prefix included */
    uint32_t raw_len;
    uint8_t attributes;
    int64_t timestamp_delta;
    int32_t offset_delta;
    uint32_t body_size;  /* a rewrite's new body size (counted once, written once) */
    sluice_decision d;
} sl__native;

/* The native entry point's record helpers, shared by this SDK's sluice_filter_records and
 * the JavaScript shim's (sdk/js/sluice_js.c), which keeps its records in a struct of its own:
 * the fields are passed one by one (each helper has one caller per module, which the compiler
 * inlines). */

/* Reads the record at `r` (Kafka's encoding, length prefix first): its bytes and fields, the
 * headers into an array from `alloc`. Returns NULL, or why it failed. */
static const char *sl__read_record(sl__rd *r, const uint8_t **raw, uint32_t *raw_len,
                                       uint8_t *attributes, int64_t *timestamp_delta,
                                       int32_t *offset_delta, sluice_bytes *key,
                                       sluice_bytes *value, uint32_t *header_count,
                                       sluice_header **headers, void *(*alloc)(size_t)) {
    *raw = r->p;
    int32_t len = sl__varint(r);
    if (!r->ok || len < 0 || r->end - r->p < len) return "malformed record";
    sl__rd body = {r->p, r->p + len, 1};
    r->p += len;
    *raw_len = (uint32_t)(r->p - *raw);
    if (body.end - body.p < 1) body.ok = 0;
    else *attributes = *body.p++;
    *timestamp_delta = sl__varlong(&body);
    *offset_delta = sl__varint(&body);
    *key = sl__vbytes(&body, 1);
    *value = sl__vbytes(&body, 1);
    int32_t hc = sl__varint(&body);
    if (!body.ok || hc < 0 || (uint32_t)hc > (uint32_t)(body.end - body.p) / 2u)
        return "malformed record";
    *header_count = (uint32_t)hc;
    if (hc) {
        sluice_header *hs = (sluice_header *)alloc(sizeof(sluice_header) * (uint32_t)hc);
        if (hs == NULL) return "out of memory";
        for (int32_t h = 0; h < hc; h++) {
            hs[h].key = sl__vbytes(&body, 0);
            hs[h].value = sl__vbytes(&body, 1);
        }
        *headers = hs;
    }
    if (!body.ok || body.p != body.end) return "malformed record";
    return NULL;
}

/* The body size of a record rewritten as `d` says (a null header name is written as ""). */
static uint64_t sl__rewrite_size(int64_t timestamp_delta, int32_t offset_delta,
                                     const sluice_decision *d) {
    uint64_t size = 1u + sl__vsize(timestamp_delta) + sl__vsize(offset_delta) + sl__vblen(d->key) +
                    sl__vblen(d->value) + sl__vsize(d->header_count);
    for (uint32_t h = 0; h < d->header_count; h++) {
        sluice_bytes hk = d->headers[h].key;
        size += sl__vblen(hk.len < 0 ? sluice_bytes_of("", 0) : hk) + sl__vblen(d->headers[h].value);
    }
    return size;
}

/* Counts a record's decision into the output's sizes; 0 for a kind the ABI does not have. */
static int sl__count_decision(const sluice_decision *d, uint32_t raw_len,
                                  int64_t timestamp_delta, int32_t offset_delta,
                                  uint64_t *records_size, uint64_t *rejects_size,
                                  uint32_t *changed, uint32_t *rejects) {
    if (d->kind == SLUICE_KEEP) {
        *records_size += raw_len;
    } else if (d->kind == SLUICE_REWRITE) {
        uint64_t b = sl__rewrite_size(timestamp_delta, offset_delta, d);
        *records_size += sl__vsize((int64_t)b) + b;
        (*changed)++;
    } else if (d->kind == SLUICE_DROP) {
        (*changed)++;
    } else if (d->kind == SLUICE_REJECT) {
        *rejects_size += 4u + sl__blen(d->reason);
        (*changed)++;
        (*rejects)++;
    } else {
        return 0;
    }
    return 1;
}

/* Writes a record of the changed records section: as it came when kept, rewritten as `d`
 * says, nothing when dropped or rejected. */
static void sl__write_record(uint8_t **w, const uint8_t *raw, uint32_t raw_len,
                                 uint8_t attributes, int64_t timestamp_delta,
                                 int32_t offset_delta, const sluice_decision *d) {
    if (d->kind == SLUICE_KEEP) {
        memcpy(*w, raw, raw_len);
        *w += raw_len;
    } else if (d->kind == SLUICE_REWRITE) {
        sl__wvar(w, (int64_t)sl__rewrite_size(timestamp_delta, offset_delta, d));
        *(*w)++ = attributes;
        sl__wvar(w, timestamp_delta);
        sl__wvar(w, offset_delta);
        sl__wvbytes(w, d->key);
        sl__wvbytes(w, d->value);
        sl__wvar(w, d->header_count);
        for (uint32_t h = 0; h < d->header_count; h++) {
            sluice_bytes hk = d->headers[h].key;
            sl__wvbytes(w, hk.len < 0 ? sluice_bytes_of("", 0) : hk);
            sl__wvbytes(w, d->headers[h].value);
        }
    }
}

#ifndef SLUICE_SDK_LIBRARY
/* This SDK's own sluice_filter_records reads records with the helpers below: sl__read_record's
 * reading, checks and errors, with the varints of one and two bytes (every field of a record
 * under 8 KB but its timestamp delta) read in line rather than by a call into the loop. */
static inline __attribute__((always_inline)) int64_t sl__varlong_fast(sl__rd *r) {
    const uint8_t *p = r->p;
    if (p < r->end && p[0] < 0x80) {
        r->p = p + 1;
        return (int64_t)(((uint64_t)p[0] >> 1) ^ (~((uint64_t)p[0] & 1) + 1));
    }
    if (r->end - p >= 2 && p[1] < 0x80) {
        uint64_t v = (uint64_t)(p[0] & 0x7f) | ((uint64_t)p[1] << 7);
        r->p = p + 2;
        return (int64_t)((v >> 1) ^ (~(v & 1) + 1));
    }
    return sl__varlong(r);
}

/* A value of one or two varint bytes is well inside 32 bits. */
static inline __attribute__((always_inline)) int32_t sl__varint_fast(sl__rd *r) {
    const uint8_t *p = r->p;
    if (p < r->end && p[0] < 0x80) {
        r->p = p + 1;
        return (int32_t)(((uint32_t)p[0] >> 1) ^ (~((uint32_t)p[0] & 1) + 1));
    }
    if (r->end - p >= 2 && p[1] < 0x80) {
        uint32_t v = (uint32_t)(p[0] & 0x7f) | ((uint32_t)p[1] << 7);
        r->p = p + 2;
        return (int32_t)((v >> 1) ^ (~(v & 1) + 1));
    }
    return sl__varint(r);
}

static inline __attribute__((always_inline)) sluice_bytes sl__vbytes_fast(sl__rd *r, int nullable) {
    int32_t n = sl__varint_fast(r);
    return sl__take(r, n, nullable);
}

static inline __attribute__((always_inline)) const char *sl__read_native(sl__rd *r, sl__native *n,
                                                                       sluice_record *rec) {
    const uint8_t *raw = r->p;
    int32_t len = sl__varint_fast(r);
    if (!r->ok || len < 0 || r->end - r->p < len) return "malformed record";
    sl__rd body = {r->p, r->p + len, 1};
    r->p += len;
    n->raw = raw;
    n->raw_len = (uint32_t)(r->p - raw);
    if (body.end - body.p < 1) body.ok = 0;
    else n->attributes = *body.p++;
    n->timestamp_delta = sl__varlong_fast(&body);
    n->offset_delta = sl__varint_fast(&body);
    rec->key = sl__vbytes_fast(&body, 1);
    rec->value = sl__vbytes_fast(&body, 1);
    int32_t hc = sl__varint_fast(&body);
    if (!body.ok || hc < 0 || (uint32_t)hc > (uint32_t)(body.end - body.p) / 2u)
        return "malformed record";
    rec->header_count = (uint32_t)hc;
    rec->headers = NULL;
    if (hc) {
        sluice_header *hs = (sluice_header *)sluice_malloc(sizeof(sluice_header) * (uint32_t)hc);
        if (hs == NULL) return "out of memory";
        for (int32_t h = 0; h < hc; h++) {
            hs[h].key = sl__vbytes_fast(&body, 0);
            hs[h].value = sl__vbytes_fast(&body, 1);
        }
        rec->headers = hs;
    }
    if (!body.ok || body.p != body.end) return "malformed record";
    return NULL;
}
#endif

#ifndef SLUICE_SDK_LIBRARY
__attribute__((export_name("sluice_filter_records"))) int64_t sluice_filter_records(int32_t in_ptr, int32_t in_len) {
    sl__begin_call(in_ptr, in_len);
#ifdef SLUICE_VALUE_WRITTEN
    sl__records_call = 1;
#endif
#ifdef SLUICE_BATCH_BEGIN
    SLUICE_BATCH_BEGIN();
#endif
    if (!sl__ensure_init()) return -1;
    sl__rd r = {(const uint8_t *)(uintptr_t)(uint32_t)in_ptr, (const uint8_t *)(uintptr_t)(uint32_t)in_ptr + (uint32_t)in_len, 1};
    sluice_record ctx;
    if (!sl__read_context(&r, &ctx)) return -1;
    int64_t offset_base = sl__i64(&r);
    int64_t timestamp_base = sl__i64(&r);
    uint32_t count = sl__u32(&r);
    /* The smallest Kafka record is 7 bytes (length and six one-byte fields). */
    if (!r.ok || count > (uint32_t)(r.end - r.p) / 7u + 1u) {
        sluice_set_error("malformed batch header");
        return -1;
    }
    sl__native *recs = (sl__native *)sluice_malloc(sizeof(sl__native) * (count ? count : 1));
    if (recs == NULL) {
        sluice_set_error("out of memory");
        return -1;
    }
    uint32_t changed = 0, rejects = 0;
    uint64_t records_size = 0, rejects_size = 0;
    /* One record for the whole batch: the context's fields stay, the others are set for each
     * record (copying the context into a fresh struct per record costs a memory.copy). */
    sluice_record rec = ctx;
    for (uint32_t i = 0; i < count; i++) {
        sl__native *n = &recs[i];
        rec.index = i;
        const char *bad = sl__read_native(&r, n, &rec);
        if (bad) {
            sluice_set_error(bad);
            return -1;
        }
        rec.offset = offset_base + n->offset_delta;
        rec.timestamp_ms = timestamp_base + n->timestamp_delta;
#ifdef SLUICE_ON_RECORD_DEFINED
        [[clang::always_inline]] n->d = sluice_on_record(&rec);
#else
        n->d = sluice_on_record ? sluice_on_record(&rec) : sluice_keep();
#endif
        if (n->d.kind == SLUICE_ERROR) {
            sluice_set_error_bytes(n->d.reason);
            if (sl__error_len == 0) sluice_set_error("filter error");
            return -1;
        }
        uint8_t kind = n->d.kind;
        if (kind == SLUICE_KEEP) {
            records_size += n->raw_len;
        } else if (kind == SLUICE_REWRITE) {
            uint64_t b = sl__rewrite_size(n->timestamp_delta, n->offset_delta, &n->d);
            /* a body over 2 GB fails the batch below ("output too large") */
            n->body_size = b > 0x7fffffffu ? 0x7fffffffu : (uint32_t)b;
            records_size += sl__vsize((int64_t)b) + b;
            changed++;
#if defined(SLUICE_REWRITE_IN_PLACE) && !defined(SLUICE_VALUE_WRITTEN)
            /* A rewrite that names the record's own key, value and headers, changed where they
             * lie (a mask that keeps every byte's place), is the record's bytes as they are now
             * when they come to the same size (Kafka's varints as written are then minimal):
             * it is copied with the kept records around it. Body size 0 marks it. */
            if (n->d.value.ptr == rec.value.ptr && n->d.value.len == rec.value.len &&
                n->d.key.ptr == rec.key.ptr && n->d.key.len == rec.key.len &&
                n->d.header_count == rec.header_count &&
                (rec.header_count == 0 || n->d.headers == rec.headers) &&
                sl__vsize((int64_t)b) + b == n->raw_len)
                n->body_size = 0;
#endif
        } else if (kind == SLUICE_DROP) {
            changed++;
        } else if (kind == SLUICE_REJECT) {
            rejects_size += 4u + sl__blen(n->d.reason);
            changed++;
            rejects++;
        } else {
            sluice_set_error("filter returned an unknown decision");
            return -1;
        }
    }
    if (r.p != r.end) {
        sluice_set_error("malformed batch: bytes after the last record");
        return -1;
    }
#ifdef SLUICE_BATCH_END
    SLUICE_BATCH_END();
#endif
    uint64_t out_size = 4u + count + 4u + (changed ? records_size : 0u) + 4u + rejects_size + 4u;
    for (uint32_t c = 0; c < sl__counter_n; c++) out_size += 8u + sl__counters[c].name_len;
    if (out_size > 0x7fffffffu || records_size > 0x7fffffffu) {
        sluice_set_error("output too large");
        return -1;
    }
    uint8_t *out = (uint8_t *)sluice_malloc((size_t)out_size);
    if (out == NULL) {
        sluice_set_error("out of memory");
        return -1;
    }
    uint8_t *w = out;
    sl__w32(&w, count);
    for (uint32_t i = 0; i < count; i++) *w++ = recs[i].d.kind;
    if (!changed) {
        sl__w32(&w, 0xFFFFFFFFu); /* -1: the records section is unchanged */
    } else {
        sl__w32(&w, (uint32_t)records_size);
        /* Kept records lie back to back in the input: each run of them is one copy. */
        const uint8_t *run = NULL;
        uint32_t run_len = 0;
        for (uint32_t i = 0; i < count; i++) {
            const sl__native *n = &recs[i];
#if defined(SLUICE_REWRITE_IN_PLACE) && !defined(SLUICE_VALUE_WRITTEN)
            if (n->d.kind == SLUICE_KEEP || (n->d.kind == SLUICE_REWRITE && n->body_size == 0)) {
#else
            if (n->d.kind == SLUICE_KEEP) {
#endif
                if (run_len == 0) run = n->raw;
                run_len += n->raw_len;
                continue;
            }
            if (run_len) {
                memcpy(w, run, run_len);
                w += run_len;
                run_len = 0;
            }
            if (n->d.kind != SLUICE_REWRITE) continue;
            /* sl__write_record's bytes, with the body size counted above */
            const sluice_decision *d = &n->d;
            sl__wvar(&w, (int64_t)n->body_size);
            *w++ = n->attributes;
            sl__wvar(&w, n->timestamp_delta);
            sl__wvar(&w, n->offset_delta);
            sl__wvbytes(&w, d->key);
            sl__wvbytes(&w, d->value);
#ifdef SLUICE_VALUE_WRITTEN
            if (d->value.len > 0) SLUICE_VALUE_WRITTEN(d->value.ptr, w - d->value.len, d->value.len);
#endif
            sl__wvar(&w, d->header_count);
            for (uint32_t h = 0; h < d->header_count; h++) {
                sluice_bytes hk = d->headers[h].key;
                sl__wvbytes(&w, hk.len < 0 ? sluice_bytes_of("", 0) : hk);
                sl__wvbytes(&w, d->headers[h].value);
            }
        }
        if (run_len) {
            memcpy(w, run, run_len);
            w += run_len;
        }
    }
    sl__w32(&w, rejects);
    for (uint32_t i = 0; i < count; i++) {
        if (recs[i].d.kind != SLUICE_REJECT) continue;
        sl__w32(&w, i);
        sl__wbytes(&w, recs[i].d.reason.len < 0 ? sluice_bytes_of("", 0) : recs[i].d.reason);
    }
    sl__w32(&w, sl__counter_n);
    for (uint32_t c = 0; c < sl__counter_n; c++) {
        sl__wbytes(&w, sluice_bytes_of(sl__counters[c].name, sl__counters[c].name_len));
        sl__w32(&w, sl__counters[c].count);
    }
    return sl__pack(out, (uint32_t)(w - out));
}
#endif /* SLUICE_SDK_LIBRARY */

#ifdef SLUICE_ADMIN_FILTER
/* Exported only by admin filters: the host offers admin requests to modules exporting it. */
__attribute__((export_name("sluice_admin"))) int64_t sluice_admin(int32_t in_ptr, int32_t in_len) {
    sl__begin_call(in_ptr, in_len);
    if (!sluice_on_admin) {
        sluice_set_error("this filter does not handle admin requests");
        return -1;
    }
    const char *err = NULL;
    sluice_json *req = sluice_json_parse(sluice_bytes_of((const void *)(uintptr_t)(uint32_t)in_ptr, (size_t)(uint32_t)in_len), &err);
    if (req == NULL || req->type != SLUICE_JSON_OBJECT) {
        sluice_set_error("admin request is not a JSON object");
        return -1;
    }
    sluice_buf out;
    sluice_buf_init(&out, 256);
    if (sluice_on_admin(req, &out) != 0) {
        if (sl__error_len == 0) sluice_set_error("admin handler failed");
        return -1;
    }
    if (out.failed) {
        sluice_set_error("out of memory");
        return -1;
    }
    return sl__pack(out.ptr, out.len);
}
#endif

#endif /* SLUICE_FILTER_H */
