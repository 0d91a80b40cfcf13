/*
 * sluice_js.c: the Sluice Wasm ABI v1 for filters written in JavaScript.
 *
 * A JavaScript filter module is this shim, the QuickJS-ng engine (compiled to wasm32-wasi with
 * wasi-libc), the SDK module "sluice" (sluice.js) and the user's filter.js, both embedded as
 * source by `sluice filter build` (embedded.c, generated). The shim implements every export
 * of the ABI (FILTER_ABI.md): both batch entry points, sluice_filter (the decoding path) and
 * sluice_filter_records (Kafka's record encoding), plus init, alloc and last_error, and
 * sluice_admin for a filter that calls onAdmin (the build defines SLUICE_JS_ADMIN). Each batch
 * becomes one array of record objects and one call into the SDK's driver (one crossing per
 * batch, as in every SDK); the driver answers one normalised result per record, which the
 * shim turns into decisions and encodes with the C SDK's helpers (sluice_filter.h, included
 * as a library: its own exports and freestanding memory routines are left out).
 *
 * The engine is created in sluice_init (or at the first batch), with the filter's config
 * available to the script's top level. The host's limits apply as to any module: the epoch
 * deadline stops a runaway script (the interpreter is ordinary Wasm code), and malloc fails
 * at max_memory_mb, which QuickJS reports as an out-of-memory exception: a filter error.
 */
#define SLUICE_SDK_LIBRARY 1
#include <stdlib.h>
#include <string.h>

#include "quickjs.h"
#include "sluice_filter.h"

/* embedded.c, written by the build */
extern const unsigned char sluice_js_sdk[];
extern const unsigned int sluice_js_sdk_len;
extern const unsigned char sluice_js_filter[];
extern const unsigned int sluice_js_filter_len;

#define FILTER_NAME "filter.js"
/* Under the linker's 1 MiB stack in linear memory (-z stack-size), so that QuickJS's own check
 * fires before that stack overflows. Deep recursion usually exhausts the host's 512 KiB Wasm
 * call stack first, which is a trap (the instance is replaced): the batch fails either way. */
#define JS_STACK_LIMIT (768 * 1024)

/* ------------------------------------------------------------------------------------------ */
/* Per-call memory: input buffer, arena for outputs and copies                                  */
/* ------------------------------------------------------------------------------------------ */

typedef struct chunk {
    struct chunk *next;
    size_t used, cap;
    uint8_t data[];
} chunk;

static chunk *arena;
static uint8_t *in_buf;
static size_t in_cap;

static void *arena_alloc(size_t n) {
    n = (n + 7u) & ~(size_t)7u;
    if (arena == NULL || arena->cap - arena->used < n) {
        size_t cap = arena ? arena->cap * 2 : 65536;
        while (cap < n) cap *= 2;
        chunk *c = (chunk *)malloc(sizeof(chunk) + cap);
        if (c == NULL) return NULL;
        c->next = arena;
        c->used = 0;
        c->cap = cap;
        arena = c;
    }
    void *p = arena->data + arena->used;
    arena->used += n;
    return p;
}

/* Free every chunk but the newest (the largest), which is reused. */
static void arena_reset(void) {
    if (arena == NULL) return;
    chunk *c = arena->next;
    while (c) {
        chunk *next = c->next;
        free(c);
        c = next;
    }
    arena->next = NULL;
    arena->used = 0;
}

/* ------------------------------------------------------------------------------------------ */
/* Errors and counters                                                                         */
/* ------------------------------------------------------------------------------------------ */

static char err_buf[500];
static uint32_t err_len;

static void set_error_n(const char *msg, size_t n) {
    if (n > sizeof err_buf) n = sizeof err_buf;
    memcpy(err_buf, msg, n);
    err_len = (uint32_t)n;
}

static void set_error(const char *msg) { set_error_n(msg, strlen(msg)); }

#define MAX_COUNTERS 32
static struct {
    char *name;
    uint32_t len;
    uint32_t count;
} counters[MAX_COUNTERS];
static uint32_t counter_n;

static void counters_reset(void) {
    for (uint32_t i = 0; i < counter_n; i++) free(counters[i].name);
    counter_n = 0;
}

static void count_add(const char *name, size_t len, uint32_t n) {
    for (uint32_t i = 0; i < counter_n; i++) {
        if (counters[i].len == len && memcmp(counters[i].name, name, len) == 0) {
            counters[i].count += n;
            return;
        }
    }
    if (counter_n == MAX_COUNTERS) return;
    char *copy = (char *)malloc(len ? len : 1);
    if (copy == NULL) return;
    memcpy(copy, name, len);
    counters[counter_n].name = copy;
    counters[counter_n].len = (uint32_t)len;
    counters[counter_n].count = n;
    counter_n++;
}

/* ------------------------------------------------------------------------------------------ */
/* The engine                                                                                   */
/* ------------------------------------------------------------------------------------------ */

static JSRuntime *rt;
static JSContext *ctx;
static JSClassID data_class, record_class;
static JSValue native_obj, driver_obj, driver_run, record_proto, empty_headers;
static JSAtom atom_index, atom_offset, atom_timestamp, atom_key, atom_value, atom_headers;
static uint32_t generation; /* RecordData objects of earlier batches are refused */
static int engine_state;    /* 0 not started, 1 ready, -1 failed (err_buf kept in init_error) */
static char init_error[500];
static uint32_t init_error_len;

typedef struct {
    /* the record as it came */
    const uint8_t *raw; /* native path: the record's bytes, length prefix included */
    uint32_t raw_len;
    uint8_t attributes;
    int64_t timestamp_delta;
    int32_t offset_delta;
    int64_t offset, timestamp;
    sluice_bytes key, value;
    uint32_t header_count;
    sluice_header *headers;
    /* its fate */
    sluice_decision d;
} js_record;

/* The batch being filtered: records read their fields from here, lazily. */
static js_record *cur_recs;
static uint32_t cur_count;

/* A record object's place in its batch. */
typedef struct {
    uint32_t index;
    uint32_t gen;
} record_ref;

/* A record's key, value or header value: bytes in the host's input for one batch. */
typedef struct {
    const uint8_t *ptr;
    int32_t len;
    uint32_t gen;
} data_ref;

/* The pending exception as "Name: message" plus the script position (filter.js:LINE). */
static void error_from_exception(const char *prefix) {
    JSValue exc = JS_GetException(ctx);
    const char *text = JS_ToCString(ctx, exc);
    char msg[500];
    size_t n = 0;
    if (prefix) {
        size_t p = strlen(prefix);
        memcpy(msg, prefix, p);
        n = p;
    }
    if (text) {
        size_t t = strlen(text);
        if (t > sizeof msg - n) t = sizeof msg - n;
        memcpy(msg + n, text, t);
        n += t;
        JS_FreeCString(ctx, text);
    } else {
        const char *unknown = "exception";
        memcpy(msg + n, unknown, strlen(unknown));
        n += strlen(unknown);
    }
    if (JS_IsError(exc)) {
        JSValue stack = JS_GetPropertyStr(ctx, exc, "stack");
        const char *st = JS_IsString(stack) ? JS_ToCString(ctx, stack) : NULL;
        const char *at = st ? strstr(st, FILTER_NAME ":") : NULL;
        if (at) {
            size_t a = 0;
            while (at[a] && at[a] != ')' && at[a] != '\n') a++;
            /* keep FILTER_NAME:LINE (the column says little in minified code) */
            size_t colon = a;
            while (colon > 0 && at[colon - 1] != ':') colon--;
            if (colon > strlen(FILTER_NAME) + 1) a = colon - 1;
            if (n + 4 + a <= sizeof msg) {
                memcpy(msg + n, " at ", 4);
                memcpy(msg + n + 4, at, a);
                n += 4 + a;
            }
        }
        if (st) JS_FreeCString(ctx, st);
        JS_FreeValue(ctx, stack);
    }
    JS_FreeValue(ctx, exc);
    set_error_n(msg, n);
}

static const data_ref *data_of(JSContext *c, JSValueConst this_val) {
    data_ref *d = (data_ref *)JS_GetOpaque(this_val, data_class);
    if (d == NULL) {
        JS_ThrowTypeError(c, "not a RecordData");
        return NULL;
    }
    if (d->gen != generation) {
        JS_ThrowTypeError(c, "this RecordData belongs to an earlier batch: keep a copy "
                             "(text(), array()) of what you need past the call");
        return NULL;
    }
    return d;
}

static JSValue data_text(JSContext *c, JSValueConst this_val, int argc, JSValueConst *argv) {
    const data_ref *d = data_of(c, this_val);
    if (d == NULL) return JS_EXCEPTION;
    return JS_NewStringLen(c, (const char *)d->ptr, (size_t)d->len);
}

static JSValue data_array(JSContext *c, JSValueConst this_val, int argc, JSValueConst *argv) {
    const data_ref *d = data_of(c, this_val);
    if (d == NULL) return JS_EXCEPTION;
    return JS_NewUint8ArrayCopy(c, d->ptr, (size_t)d->len);
}

/* Whether the bytes are valid UTF-8: text() then decodes them exactly (else each invalid byte
 * becomes U+FFFD). */
static JSValue data_is_text(JSContext *c, JSValueConst this_val, int argc, JSValueConst *argv) {
    const data_ref *d = data_of(c, this_val);
    if (d == NULL) return JS_EXCEPTION;
    const uint8_t *p = d->ptr, *end = d->ptr + d->len;
    while (p < end) {
        if (*p < 0x80) {
            p++;
            continue;
        }
        int n = sluice_utf8_len(p, end);
        if (n == 0) return JS_FALSE;
        p += n;
    }
    return JS_TRUE;
}

static JSValue data_length(JSContext *c, JSValueConst this_val) {
    const data_ref *d = data_of(c, this_val);
    if (d == NULL) return JS_EXCEPTION;
    return JS_NewInt32(c, d->len);
}

/* The C SDK's strict parser decides (same rules and messages as every SDK), then QuickJS
 * builds the value. */
static JSValue data_json(JSContext *c, JSValueConst this_val, int argc, JSValueConst *argv) {
    const data_ref *d = data_of(c, this_val);
    if (d == NULL) return JS_EXCEPTION;
    const char *why = NULL;
    if (!sluice_json_valid(sluice_bytes_of(d->ptr, (size_t)d->len), &why)) {
        JS_ThrowSyntaxError(c, "%s", why ? why : "invalid JSON");
        return JS_EXCEPTION;
    }
    char *text = (char *)malloc((size_t)d->len + 1);
    if (text == NULL) return JS_ThrowOutOfMemory(c);
    memcpy(text, d->ptr, (size_t)d->len);
    text[d->len] = 0;
    JSValue v = JS_ParseJSON(c, text, (size_t)d->len, "<record>");
    free(text);
    return v;
}

static JSValue data_ctor(JSContext *c, JSValueConst new_target, int argc, JSValueConst *argv) {
    return JS_ThrowTypeError(c, "RecordData objects come with records");
}

static void data_finalizer(JSRuntime *r, JSValue val) {
    js_free_rt(r, JS_GetOpaque(val, data_class));
}

static const JSCFunctionListEntry data_funcs[] = {
    JS_CFUNC_DEF("text", 0, data_text),
    JS_CFUNC_DEF("json", 0, data_json),
    JS_CFUNC_DEF("array", 0, data_array),
    JS_CFUNC_DEF("isText", 0, data_is_text),
    JS_CGETSET_DEF("length", data_length, NULL),
};

static JSValue new_data(sluice_bytes b) {
    if (b.len < 0) return JS_NULL;
    JSValue obj = JS_NewObjectClass(ctx, (int)data_class);
    if (JS_IsException(obj)) return obj;
    data_ref *d = (data_ref *)js_malloc(ctx, sizeof *d);
    if (d == NULL) {
        JS_FreeValue(ctx, obj);
        return JS_EXCEPTION;
    }
    d->ptr = b.ptr;
    d->len = b.len;
    d->gen = generation;
    JS_SetOpaque(obj, d);
    return obj;
}

static JSValue str_of(sluice_bytes b);
static JSValue int64_value(int64_t v);
static JSValue new_headers(const js_record *r);

enum { FIELD_INDEX, FIELD_TIMESTAMP, FIELD_KEY, FIELD_VALUE, FIELD_HEADERS };

/* record.index, .timestamp, .key, .value, .headers: built on first use (most filters read only
 * the value), then kept as the object's own property, so a spread copy carries them. */
static JSValue record_field(JSContext *c, JSValueConst this_val, int field) {
    record_ref *ref = (record_ref *)JS_GetOpaque(this_val, record_class);
    if (ref == NULL) return JS_ThrowTypeError(c, "not a record");
    if (ref->gen != generation || ref->index >= cur_count)
        return JS_ThrowTypeError(c, "this record belongs to an earlier batch: keep a copy of "
                                    "what you need past the call");
    const js_record *r = &cur_recs[ref->index];
    JSValue v;
    JSAtom atom;
    switch (field) {
    case FIELD_INDEX: v = JS_NewUint32(c, ref->index); atom = atom_index; break;
    case FIELD_TIMESTAMP: v = int64_value(r->timestamp); atom = atom_timestamp; break;
    case FIELD_KEY: v = new_data(r->key); atom = atom_key; break;
    case FIELD_VALUE: v = new_data(r->value); atom = atom_value; break;
    default: v = new_headers(r); atom = atom_headers; break;
    }
    if (JS_IsException(v)) return v;
    JS_DefinePropertyValue(c, this_val, atom, JS_DupValue(c, v), JS_PROP_C_W_E);
    return v;
}

static void record_finalizer(JSRuntime *r, JSValue val) {
    js_free_rt(r, JS_GetOpaque(val, record_class));
}

static const JSCFunctionListEntry record_getters[] = {
    JS_CGETSET_MAGIC_DEF("index", record_field, NULL, FIELD_INDEX),
    JS_CGETSET_MAGIC_DEF("timestamp", record_field, NULL, FIELD_TIMESTAMP),
    JS_CGETSET_MAGIC_DEF("key", record_field, NULL, FIELD_KEY),
    JS_CGETSET_MAGIC_DEF("value", record_field, NULL, FIELD_VALUE),
    JS_CGETSET_MAGIC_DEF("headers", record_field, NULL, FIELD_HEADERS),
};

static JSValue native_count(JSContext *c, JSValueConst this_val, int argc, JSValueConst *argv) {
    size_t len;
    const char *name = JS_ToCStringLen(c, &len, argv[0]);
    if (name == NULL) return JS_EXCEPTION;
    int64_t n = 1;
    if (argc > 1 && JS_ToInt64(c, &n, argv[1]) < 0) {
        JS_FreeCString(c, name);
        return JS_EXCEPTION;
    }
    if (n < 0 || n > 0xffffffffLL) {
        JS_FreeCString(c, name);
        return JS_ThrowRangeError(c, "count(name, n): n must be 0 to 4294967295");
    }
    count_add(name, len, (uint32_t)n);
    JS_FreeCString(c, name);
    return JS_UNDEFINED;
}

static JSValue native_utf8(JSContext *c, JSValueConst this_val, int argc, JSValueConst *argv) {
    size_t len;
    const char *s = JS_ToCStringLen(c, &len, argv[0]);
    if (s == NULL) return JS_EXCEPTION;
    JSValue r = JS_NewUint8ArrayCopy(c, (const uint8_t *)s, len);
    JS_FreeCString(c, s);
    return r;
}

/* String.prototype.toUpperCase / toLowerCase with a fast path for ASCII text: QuickJS maps
 * every character through its Unicode tables (~20 ns a character here), which made case
 * changes the bulk of a filter's time. Text with any non-ASCII character goes to the
 * engine's own function, so results are identical. */
static JSValue case_original[2];

static JSValue fast_case(JSContext *c, JSValueConst this_val, int argc, JSValueConst *argv,
                         int to_lower) {
    if (JS_IsString(this_val)) {
        size_t n;
        const char *s = JS_ToCStringLen(c, &n, this_val);
        if (s == NULL) return JS_EXCEPTION;
        size_t i = 0;
        while (i < n && (uint8_t)s[i] < 0x80) i++;
        if (i == n) {
            char *out = (char *)malloc(n ? n : 1);
            if (out == NULL) {
                JS_FreeCString(c, s);
                return JS_ThrowOutOfMemory(c);
            }
            uint8_t lo = to_lower ? 'A' : 'a', hi = to_lower ? 'Z' : 'z';
            for (i = 0; i < n; i++) {
                uint8_t ch = (uint8_t)s[i];
                out[i] = (char)((ch >= lo && ch <= hi) ? ch ^ 0x20 : ch);
            }
            JS_FreeCString(c, s);
            JSValue r = JS_NewStringLen(c, out, n);
            free(out);
            return r;
        }
        JS_FreeCString(c, s);
    }
    return JS_Call(c, case_original[to_lower], this_val, argc, argv);
}

static void install_fast_case(JSValueConst global) {
    JSValue string_ctor = JS_GetPropertyStr(ctx, global, "String");
    JSValue proto = JS_GetPropertyStr(ctx, string_ctor, "prototype");
    static const char *names[2] = {"toUpperCase", "toLowerCase"};
    for (int k = 0; k < 2; k++) {
        case_original[k] = JS_GetPropertyStr(ctx, proto, names[k]);
        JS_DefinePropertyValueStr(ctx, proto, names[k],
                                  JS_NewCFunctionMagic(ctx, fast_case, names[k], 0,
                                                       JS_CFUNC_generic_magic, k),
                                  JS_PROP_WRITABLE | JS_PROP_CONFIGURABLE);
    }
    JS_FreeValue(ctx, proto);
    JS_FreeValue(ctx, string_ctor);
}

static JSModuleDef *load_module(JSContext *c, const char *name, void *opaque) {
    JS_ThrowReferenceError(c, FILTER_NAME " imports '%s': a filter can import only 'sluice'",
                           name);
    return NULL;
}

/* Run queued promise jobs; 0 when one threw (the exception is pending). */
static int drain_jobs(void) {
    JSContext *c;
    int r;
    while ((r = JS_ExecutePendingJob(rt, &c)) > 0) {
    }
    return r == 0;
}

/* Settle `v` (a promise or a plain value): returns the value, or JS_EXCEPTION with the error
 * message set. Takes ownership of v. */
static JSValue settle(JSValue v, const char *what) {
    if (JS_IsException(v) || !drain_jobs()) {
        JS_FreeValue(ctx, v);
        error_from_exception(NULL);
        return JS_EXCEPTION;
    }
    JSPromiseStateEnum st = JS_PromiseState(ctx, v);
    if (st == JS_PROMISE_NOT_A_PROMISE) return v;
    if (st == JS_PROMISE_FULFILLED) {
        JSValue r = JS_PromiseResult(ctx, v);
        JS_FreeValue(ctx, v);
        return r;
    }
    if (st == JS_PROMISE_REJECTED) {
        JS_Throw(ctx, JS_PromiseResult(ctx, v));
        JS_FreeValue(ctx, v);
        error_from_exception(NULL);
        return JS_EXCEPTION;
    }
    JS_FreeValue(ctx, v);
    set_error(what);
    return JS_EXCEPTION;
}

static int eval_module(const unsigned char *src, unsigned int len, const char *name) {
    /* QuickJS wants the source NUL-terminated */
    char *text = (char *)malloc(len + 1u);
    if (text == NULL) {
        set_error("out of memory");
        return 0;
    }
    memcpy(text, src, len);
    text[len] = 0;
    JSValue r = JS_Eval(ctx, text, len, name, JS_EVAL_TYPE_MODULE);
    free(text);
    r = settle(r, "the module's top-level await never settled (a filter cannot wait for timers "
                  "or I/O)");
    if (JS_IsException(r)) return 0;
    JS_FreeValue(ctx, r);
    return 1;
}

static int engine_start(sluice_bytes cfg) {
    rt = JS_NewRuntime();
    if (rt == NULL || (ctx = JS_NewContext(rt)) == NULL) {
        set_error("out of memory starting the JavaScript engine");
        return 0;
    }
    JS_SetMaxStackSize(rt, JS_STACK_LIMIT);
    JS_SetModuleLoaderFunc(rt, NULL, load_module, NULL);

    JS_NewClassID(rt, &data_class);
    JSClassDef def = {"RecordData", .finalizer = data_finalizer};
    JS_NewClass(rt, data_class, &def);
    JSValue proto = JS_NewObject(ctx);
    JS_SetPropertyFunctionList(ctx, proto, data_funcs, sizeof data_funcs / sizeof data_funcs[0]);
    JSValue ctor = JS_NewCFunction2(ctx, data_ctor, "RecordData", 0, JS_CFUNC_constructor, 0);
    JS_SetConstructor(ctx, ctor, proto);
    JS_SetClassProto(ctx, data_class, proto);
    JS_NewClassID(rt, &record_class);
    JSClassDef record_def = {"Record", .finalizer = record_finalizer};
    JS_NewClass(rt, record_class, &record_def);

    JSValue global = JS_GetGlobalObject(ctx);
    install_fast_case(global);
    native_obj = JS_NewObject(ctx);
    JS_SetPropertyStr(ctx, native_obj, "RecordData", ctor);
    JS_SetPropertyStr(ctx, native_obj, "count", JS_NewCFunction(ctx, native_count, "count", 2));
    JS_SetPropertyStr(ctx, native_obj, "utf8", JS_NewCFunction(ctx, native_utf8, "utf8", 1));
    JSValue config;
    if (cfg.len > 0) {
        char *text = (char *)malloc((size_t)cfg.len + 1); /* QuickJS wants it NUL-terminated */
        if (text == NULL) {
            set_error("out of memory");
            JS_FreeValue(ctx, global);
            return 0;
        }
        memcpy(text, cfg.ptr, (size_t)cfg.len);
        text[cfg.len] = 0;
        config = JS_ParseJSON(ctx, text, (size_t)cfg.len, "<config>");
        free(text);
    } else {
        config = JS_NewObject(ctx);
    }
    if (JS_IsException(config)) {
        error_from_exception("configuration is not valid JSON: ");
        JS_FreeValue(ctx, global);
        return 0;
    }
    JS_SetPropertyStr(ctx, native_obj, "config", config);
    JS_SetPropertyStr(ctx, global, "__sluice_native", JS_DupValue(ctx, native_obj));

    atom_index = JS_NewAtom(ctx, "index");
    atom_offset = JS_NewAtom(ctx, "offset");
    atom_timestamp = JS_NewAtom(ctx, "timestamp");
    atom_key = JS_NewAtom(ctx, "key");
    atom_value = JS_NewAtom(ctx, "value");
    atom_headers = JS_NewAtom(ctx, "headers");

    int ok = eval_module(sluice_js_sdk, sluice_js_sdk_len, "sluice");
    if (ok) {
        driver_obj = JS_GetPropertyStr(ctx, global, "__sluice_driver");
        driver_run = JS_GetPropertyStr(ctx, driver_obj, "run");
        record_proto = JS_GetPropertyStr(ctx, driver_obj, "recordPrototype");
        JS_SetPropertyFunctionList(ctx, record_proto, record_getters,
                                   sizeof record_getters / sizeof record_getters[0]);
        ok = eval_module(sluice_js_filter, sluice_js_filter_len, FILTER_NAME);
    }
    if (ok) {
        JSValue ready = JS_GetPropertyStr(ctx, driver_obj, "ready");
        JSValue r = JS_Call(ctx, ready, driver_obj, 0, NULL);
        JS_FreeValue(ctx, ready);
        if (JS_IsException(r)) {
            error_from_exception(NULL);
            ok = 0;
        }
        JS_FreeValue(ctx, r);
    }
    if (ok) {
        JSValue none = JS_NewArray(ctx);
        JSValue object_ctor = JS_GetPropertyStr(ctx, global, "Object");
        JSValue freeze = JS_GetPropertyStr(ctx, object_ctor, "freeze");
        empty_headers = JS_Call(ctx, freeze, object_ctor, 1, (JSValueConst *)&none);
        JS_FreeValue(ctx, freeze);
        JS_FreeValue(ctx, object_ctor);
        JS_FreeValue(ctx, none);
    }
    JS_FreeValue(ctx, global);
    return ok;
}

/* 1 when the engine runs; else 0 with the start-up error as the call's error. */
static int engine_ready(sluice_bytes cfg) {
    if (engine_state == 0) {
        if (engine_start(cfg)) {
            engine_state = 1;
        } else {
            engine_state = -1;
            memcpy(init_error, err_buf, err_len);
            init_error_len = err_len;
        }
    }
    if (engine_state < 0) {
        set_error_n(init_error, init_error_len);
        return 0;
    }
    return 1;
}

/* ------------------------------------------------------------------------------------------ */
/* One batch through the driver                                                                 */
/* ------------------------------------------------------------------------------------------ */


/* A Number, exact up to 2^53 (every real offset and timestamp); beyond, a BigInt, so that no
 * digit is lost. */
static JSValue int64_value(int64_t v) {
    const int64_t safe = ((int64_t)1 << 53) - 1;
    return (v >= -safe && v <= safe) ? JS_NewInt64(ctx, v) : JS_NewBigInt64(ctx, v);
}

static JSValue str_of(sluice_bytes b) {
    return JS_NewStringLen(ctx, (const char *)b.ptr, b.len > 0 ? (size_t)b.len : 0);
}

static JSValue new_headers(const js_record *r) {
    if (r->header_count == 0) return JS_DupValue(ctx, empty_headers);
    JSValue *hs = (JSValue *)arena_alloc(sizeof(JSValue) * r->header_count);
    if (hs == NULL) return JS_ThrowOutOfMemory(ctx);
    for (uint32_t h = 0; h < r->header_count; h++) {
        JSValue pair = JS_NewObject(ctx);
        JS_DefinePropertyValue(ctx, pair, atom_key, str_of(r->headers[h].key), JS_PROP_C_W_E);
        JS_DefinePropertyValue(ctx, pair, atom_value, new_data(r->headers[h].value),
                               JS_PROP_C_W_E);
        hs[h] = pair;
    }
    return JS_NewArrayFrom(ctx, (int)r->header_count, hs);
}

/* The offset is the record's only own property from the start: a batch filter's spread
 * copies ({...record, value}) find their input record by it. */
static JSValue new_record(const js_record *r, uint32_t index, JSValueConst proto) {
    JSValue obj = JS_NewObjectProtoClass(ctx, proto, record_class);
    if (JS_IsException(obj)) return obj;
    record_ref *ref = (record_ref *)js_malloc(ctx, sizeof *ref);
    if (ref == NULL) {
        JS_FreeValue(ctx, obj);
        return JS_EXCEPTION;
    }
    ref->index = index;
    ref->gen = generation;
    JS_SetOpaque(obj, ref);
    JS_DefinePropertyValue(ctx, obj, atom_offset, int64_value(r->offset), JS_PROP_C_W_E);
    return obj;
}

/* A JS value as bytes for a new key, value or header value (copied into the arena, except a
 * RecordData of this batch, which already lives in the input). 0 with an exception pending
 * when it is none of the accepted types. */
static int bytes_of(JSValueConst v, sluice_bytes *out, const char *what) {
    if (JS_IsNull(v)) {
        *out = sluice_null();
        return 1;
    }
    if (JS_IsString(v)) {
        size_t n;
        const char *s = JS_ToCStringLen(ctx, &n, v);
        if (s == NULL) return 0;
        uint8_t *copy = (uint8_t *)arena_alloc(n ? n : 1);
        if (copy == NULL) {
            JS_FreeCString(ctx, s);
            JS_ThrowOutOfMemory(ctx);
            return 0;
        }
        memcpy(copy, s, n);
        JS_FreeCString(ctx, s);
        *out = sluice_bytes_of(copy, n);
        return 1;
    }
    if (JS_IsObject(v)) {
        data_ref *d = (data_ref *)JS_GetOpaque(v, data_class);
        if (d != NULL) {
            if (data_of(ctx, v) == NULL) return 0;
            *out = sluice_bytes_of(d->ptr, (size_t)d->len);
            return 1;
        }
        const uint8_t *p = NULL;
        size_t n = 0;
        if (JS_GetTypedArrayType(v) >= 0) {
            size_t off, len, per;
            JSValue buf = JS_GetTypedArrayBuffer(ctx, v, &off, &len, &per);
            if (JS_IsException(buf)) return 0;
            size_t total;
            uint8_t *base = JS_GetArrayBuffer(ctx, &total, buf);
            JS_FreeValue(ctx, buf);
            if (base == NULL) return 0;
            p = base + off;
            n = len;
        } else if (JS_IsArrayBuffer(v)) {
            p = JS_GetArrayBuffer(ctx, &n, v);
            if (p == NULL) return 0;
        } else if (JS_IsArray(v)) {
            /* seed 001: record.value.map((char) => char.toUpperCase()) gives characters */
            JSValue join = JS_GetPropertyStr(ctx, v, "join");
            JSValue sep = JS_NewString(ctx, "");
            JSValue s = JS_Call(ctx, join, v, 1, (JSValueConst *)&sep);
            JS_FreeValue(ctx, sep);
            JS_FreeValue(ctx, join);
            if (JS_IsException(s)) return 0;
            int ok = bytes_of(s, out, what);
            JS_FreeValue(ctx, s);
            return ok;
        } else {
            goto bad;
        }
        uint8_t *copy = (uint8_t *)arena_alloc(n ? n : 1);
        if (copy == NULL) {
            JS_ThrowOutOfMemory(ctx);
            return 0;
        }
        if (n) memcpy(copy, p, n);
        *out = sluice_bytes_of(copy, n);
        return 1;
    }
bad:
    JS_ThrowTypeError(ctx, "a record's %s must be a string, Uint8Array, ArrayBuffer, "
                           "RecordData, array of strings or null", what);
    return 0;
}

static int headers_of(JSValueConst v, sluice_header **out, uint32_t *count) {
    if (!JS_IsArray(v)) {
        JS_ThrowTypeError(ctx, "a record's headers must be an array of {key, value} or "
                               "[key, value]");
        return 0;
    }
    int64_t n;
    if (JS_GetLength(ctx, v, &n) < 0) return 0;
    sluice_header *hs = (sluice_header *)arena_alloc(sizeof(sluice_header) * (size_t)(n ? n : 1));
    if (hs == NULL) {
        JS_ThrowOutOfMemory(ctx);
        return 0;
    }
    for (int64_t i = 0; i < n; i++) {
        JSValue h = JS_GetPropertyUint32(ctx, v, (uint32_t)i);
        JSValue k, val;
        if (JS_IsArray(h)) {
            k = JS_GetPropertyUint32(ctx, h, 0);
            val = JS_GetPropertyUint32(ctx, h, 1);
        } else if (JS_IsObject(h)) {
            k = JS_GetProperty(ctx, h, atom_key);
            val = JS_GetProperty(ctx, h, atom_value);
        } else {
            JS_FreeValue(ctx, h);
            JS_ThrowTypeError(ctx, "a header must be {key, value} or [key, value]");
            return 0;
        }
        JS_FreeValue(ctx, h);
        int ok = JS_IsString(k) && bytes_of(k, &hs[i].key, "header name") &&
                 bytes_of(JS_IsUndefined(val) ? JS_NULL : val, &hs[i].value, "header value");
        if (!JS_IsString(k) && !JS_HasException(ctx))
            JS_ThrowTypeError(ctx, "a header's key must be a string");
        JS_FreeValue(ctx, k);
        JS_FreeValue(ctx, val);
        if (!ok) return 0;
    }
    *out = hs;
    *count = (uint32_t)n;
    return 1;
}

static int same_bytes(sluice_bytes a, sluice_bytes b) {
    if (a.len < 0 || b.len < 0) return a.len < 0 && b.len < 0;
    return a.len == b.len && (a.len == 0 || memcmp(a.ptr, b.ptr, (size_t)a.len) == 0);
}

/* The fate of record r from the driver's normalised result `v`. */
static int decide(js_record *r, JSValueConst v) {
    memset(&r->d, 0, sizeof r->d);
    if (JS_IsUndefined(v)) {
        r->d.kind = SLUICE_KEEP;
        return 1;
    }
    if (JS_IsNull(v)) {
        r->d.kind = SLUICE_DROP;
        return 1;
    }
    if (JS_IsString(v)) {
        r->d.kind = SLUICE_REJECT;
        return bytes_of(v, &r->d.reason, "reason");
    }
    sluice_bytes key = r->key, value = r->value;
    sluice_header *hs = r->headers;
    uint32_t hc = r->header_count;
    JSValue k = JS_GetProperty(ctx, v, atom_key);
    JSValue val = JS_GetProperty(ctx, v, atom_value);
    JSValue h = JS_GetProperty(ctx, v, atom_headers);
    int ok = (JS_IsUndefined(k) || bytes_of(k, &key, "key")) &&
             (JS_IsUndefined(val) || bytes_of(val, &value, "value")) &&
             (JS_IsUndefined(h) || headers_of(h, &hs, &hc));
    JS_FreeValue(ctx, k);
    JS_FreeValue(ctx, val);
    JS_FreeValue(ctx, h);
    if (!ok) return 0;
    int same = same_bytes(key, r->key) && same_bytes(value, r->value) && hc == r->header_count;
    for (uint32_t i = 0; same && i < hc; i++) {
        same = same_bytes(hs[i].key, r->headers[i].key) &&
               same_bytes(hs[i].value, r->headers[i].value);
    }
    if (same) {
        r->d.kind = SLUICE_KEEP;
        return 1;
    }
    r->d.kind = SLUICE_REWRITE;
    r->d.key = key;
    r->d.value = value;
    r->d.headers = hs;
    r->d.header_count = hc;
    return 1;
}

/* Calls the driver on the batch and fills every record's decision; 0 = the batch failed. */
static int run_batch(const sluice_record *bctx, int64_t offset_base, int64_t timestamp_base,
                     js_record *recs, uint32_t count) {
    generation++;
    cur_recs = recs;
    cur_count = count;
    JSValue proto = JS_NewObjectProto(ctx, record_proto);
    JS_SetPropertyStr(ctx, proto, "topic", str_of(bctx->topic));
    JS_SetPropertyStr(ctx, proto, "partition", JS_NewInt32(ctx, bctx->partition));
    JS_SetPropertyStr(ctx, proto, "direction",
                      JS_NewString(ctx, bctx->direction == SLUICE_FETCH ? "fetch" : "produce"));
    JS_SetPropertyStr(ctx, proto, "clientId", str_of(bctx->client_id));
    JS_SetPropertyStr(ctx, proto, "principal", str_of(bctx->principal));
    JS_SetPropertyStr(ctx, proto, "baseOffset", int64_value(offset_base));
    JS_SetPropertyStr(ctx, proto, "baseTimestamp", int64_value(timestamp_base));
    JSValue *objs = (JSValue *)arena_alloc(sizeof(JSValue) * (count ? count : 1));
    if (objs == NULL) {
        JS_FreeValue(ctx, proto);
        set_error("out of memory");
        return 0;
    }
    for (uint32_t i = 0; i < count; i++) {
        objs[i] = new_record(&recs[i], i, proto);
        if (JS_IsException(objs[i])) {
            for (uint32_t j = 0; j < i; j++) JS_FreeValue(ctx, objs[j]);
            JS_FreeValue(ctx, proto);
            error_from_exception(NULL);
            return 0;
        }
    }
    JSValue args[2] = {proto, JS_NewArrayFrom(ctx, (int)count, objs)};
    JSValue res = JS_Call(ctx, driver_run, driver_obj, 2, (JSValueConst *)args);
    JS_FreeValue(ctx, args[0]);
    JS_FreeValue(ctx, args[1]);
    res = settle(res, "the filter's promise never settled (a filter cannot wait for timers or "
                      "I/O)");
    if (JS_IsException(res)) return 0;
    int ok = 1;
    for (uint32_t i = 0; ok && i < count; i++) {
        JSValue v = JS_GetPropertyUint32(ctx, res, i);
        ok = decide(&recs[i], v);
        JS_FreeValue(ctx, v);
    }
    JS_FreeValue(ctx, res);
    if (!ok) error_from_exception(NULL);
    return ok;
}

/* ------------------------------------------------------------------------------------------ */
/* The ABI exports                                                                              */
/* ------------------------------------------------------------------------------------------ */

__attribute__((export_name("sluice_abi_version"))) int32_t sluice_abi_version(void) {
    return SLUICE_ABI_VERSION;
}

__attribute__((export_name("sluice_alloc"))) int32_t sluice_alloc(int32_t size) {
    /* The host allocates the next call's input: the previous call's output is dead. */
    arena_reset();
    size_t n = size > 0 ? (size_t)size : 1u;
    if (n > in_cap) {
        free(in_buf);
        in_buf = (uint8_t *)malloc(n);
        in_cap = in_buf ? n : 0;
    }
    return (int32_t)(uintptr_t)in_buf;
}

__attribute__((export_name("sluice_last_error"))) int64_t sluice_last_error(void) {
    return sl__pack(err_buf, err_len);
}

static void begin_call(void) {
    err_len = 0;
    counters_reset();
}

__attribute__((export_name("sluice_init"))) int32_t sluice_init(int32_t cfg_ptr, int32_t cfg_len) {
    begin_call();
    sluice_bytes cfg = sluice_bytes_of((const void *)(uintptr_t)(uint32_t)cfg_ptr,
                                       (size_t)(cfg_len > 0 ? cfg_len : 0));
    return engine_ready(cfg) ? 0 : 1;
}

static uint64_t counters_size(void) {
    uint64_t n = 4;
    for (uint32_t c = 0; c < counter_n; c++) n += 8u + counters[c].len;
    return n;
}

static void write_counters(uint8_t **w) {
    sl__w32(w, counter_n);
    for (uint32_t c = 0; c < counter_n; c++) {
        sl__wbytes(w, sluice_bytes_of(counters[c].name, counters[c].len));
        sl__w32(w, counters[c].count);
    }
}

__attribute__((export_name("sluice_filter"))) int64_t sluice_filter(int32_t in_ptr, int32_t in_len) {
    begin_call();
    if (!engine_ready(sluice_bytes_of("", 0))) return -1;
    sl__rd r = {(const uint8_t *)(uintptr_t)(uint32_t)in_ptr,
                (const uint8_t *)(uintptr_t)(uint32_t)in_ptr + (uint32_t)in_len, 1};
    sluice_record bctx;
    if (!sl__read_context(&r, &bctx)) {
        set_error("unsupported input version");
        return -1;
    }
    uint32_t count = sl__u32(&r);
    if (!r.ok || count > (uint32_t)(r.end - r.p) / 28u + 1u) {
        set_error("malformed batch header");
        return -1;
    }
    js_record *recs = (js_record *)arena_alloc(sizeof(js_record) * (count ? count : 1));
    if (recs == NULL) {
        set_error("out of memory");
        return -1;
    }
    for (uint32_t i = 0; i < count; i++) {
        js_record *rec = &recs[i];
        memset(rec, 0, sizeof *rec);
        const char *bad = sl__read_decoded(&r, &rec->offset, &rec->timestamp, &rec->key,
                                           &rec->value, &rec->header_count, &rec->headers,
                                           arena_alloc);
        if (bad) {
            set_error(bad);
            return -1;
        }
    }
    if (!run_batch(&bctx, 0, 0, recs, count)) return -1;
    uint64_t out_size = 4u + counters_size();
    for (uint32_t i = 0; i < count; i++) out_size += sl__decided_size(&recs[i].d);
    if (out_size > 0x7fffffffu) {
        set_error("output too large");
        return -1;
    }
    uint8_t *out = (uint8_t *)arena_alloc((size_t)out_size);
    if (out == NULL) {
        set_error("out of memory");
        return -1;
    }
    uint8_t *w = out;
    sl__w32(&w, count);
    for (uint32_t i = 0; i < count; i++) sl__write_decided(&w, &recs[i].d);
    write_counters(&w);
    return sl__pack(out, (uint32_t)(w - out));
}

/* Size of a rewritten record's body in Kafka's encoding (as the C SDK computes it). */
__attribute__((export_name("sluice_filter_records"))) int64_t sluice_filter_records(int32_t in_ptr, int32_t in_len) {
    begin_call();
    if (!engine_ready(sluice_bytes_of("", 0))) return -1;
    sl__rd r = {(const uint8_t *)(uintptr_t)(uint32_t)in_ptr,
                (const uint8_t *)(uintptr_t)(uint32_t)in_ptr + (uint32_t)in_len, 1};
    sluice_record bctx;
    if (!sl__read_context(&r, &bctx)) {
        set_error("unsupported input version");
        return -1;
    }
    int64_t offset_base = sl__i64(&r);
    int64_t timestamp_base = sl__i64(&r);
    uint32_t count = sl__u32(&r);
    /* The smallest Kafka record is 7 bytes (length and six one-byte fields). */
    if (!r.ok || count > (uint32_t)(r.end - r.p) / 7u + 1u) {
        set_error("malformed batch header");
        return -1;
    }
    js_record *recs = (js_record *)arena_alloc(sizeof(js_record) * (count ? count : 1));
    if (recs == NULL) {
        set_error("out of memory");
        return -1;
    }
    for (uint32_t i = 0; i < count; i++) {
        js_record *n = &recs[i];
        memset(n, 0, sizeof *n);
        const char *bad = sl__read_record(&r, &n->raw, &n->raw_len, &n->attributes,
                                          &n->timestamp_delta, &n->offset_delta, &n->key,
                                          &n->value, &n->header_count, &n->headers, arena_alloc);
        if (bad) {
            set_error(bad);
            return -1;
        }
        n->offset = offset_base + n->offset_delta;
        n->timestamp = timestamp_base + n->timestamp_delta;
    }
    if (r.p != r.end) {
        set_error("malformed batch: bytes after the last record");
        return -1;
    }
    if (!run_batch(&bctx, offset_base, timestamp_base, recs, count)) return -1;
    uint32_t changed = 0, rejects = 0;
    uint64_t records_size = 0, rejects_size = 0;
    for (uint32_t i = 0; i < count; i++) {
        const js_record *n = &recs[i];
        /* decide() gives every record a kind the ABI has */
        sl__count_decision(&n->d, n->raw_len, n->timestamp_delta, n->offset_delta,
                           &records_size, &rejects_size, &changed, &rejects);
    }
    uint64_t out_size = 4u + count + 4u + (changed ? records_size : 0u) + 4u + rejects_size +
                        counters_size();
    if (out_size > 0x7fffffffu || records_size > 0x7fffffffu) {
        set_error("output too large");
        return -1;
    }
    uint8_t *out = (uint8_t *)arena_alloc((size_t)out_size);
    if (out == NULL) {
        set_error("out of memory");
        return -1;
    }
    uint8_t *w = out;
    sl__w32(&w, count);
    for (uint32_t i = 0; i < count; i++) *w++ = recs[i].d.kind;
    if (!changed) {
        sl__w32(&w, 0xFFFFFFFFu); /* -1: the records section is unchanged */
    } else {
        sl__w32(&w, (uint32_t)records_size);
        for (uint32_t i = 0; i < count; i++) {
            const js_record *n = &recs[i];
            sl__write_record(&w, n->raw, n->raw_len, n->attributes, n->timestamp_delta,
                             n->offset_delta, &n->d);
        }
    }
    sl__w32(&w, rejects);
    for (uint32_t i = 0; i < count; i++) {
        if (recs[i].d.kind != SLUICE_REJECT) continue;
        sl__w32(&w, i);
        sl__wbytes(&w, recs[i].d.reason);
    }
    write_counters(&w);
    return sl__pack(out, (uint32_t)(w - out));
}

#ifdef SLUICE_JS_ADMIN
/* Exported only when filter.js registers an admin function (the build defines SLUICE_JS_ADMIN
 * then), so that a record filter cannot be bound to admin. One crossing into JavaScript per
 * admin resource: the request's JSON text to the driver, the answer's JSON text back. */
__attribute__((export_name("sluice_admin"))) int64_t sluice_admin(int32_t in_ptr, int32_t in_len) {
    begin_call();
    if (!engine_ready(sluice_bytes_of("", 0))) return -1;
    JSValue fn = JS_GetPropertyStr(ctx, driver_obj, "admin");
    JSValue arg = JS_NewStringLen(ctx, (const char *)(uintptr_t)(uint32_t)in_ptr,
                                  (size_t)(in_len > 0 ? in_len : 0));
    JSValue res = JS_Call(ctx, fn, driver_obj, 1, (JSValueConst *)&arg);
    JS_FreeValue(ctx, fn);
    JS_FreeValue(ctx, arg);
    res = settle(res, "the admin function's promise never settled (a filter cannot wait for "
                      "timers or I/O)");
    if (JS_IsException(res)) return -1;
    size_t n = 0;
    const char *text = JS_ToCStringLen(ctx, &n, res);
    JS_FreeValue(ctx, res);
    if (text == NULL) {
        error_from_exception(NULL);
        return -1;
    }
    uint8_t *out = (uint8_t *)arena_alloc(n ? n : 1);
    if (out == NULL) {
        JS_FreeCString(ctx, text);
        set_error("out of memory");
        return -1;
    }
    memcpy(out, text, n);
    JS_FreeCString(ctx, text);
    return sl__pack(out, (uint32_t)n);
}
#endif
