/*
 * builtin:rules: a data-mutating filter for people who write no code (seed 004's "filter that
 * interprets mutating rules"). Its config is a list of rules over JSON record values; each
 * rule names a field (a dotted path into the value's objects), an optional condition and one
 * action:
 *
 *   rules:
 *     - {field: card, action: remove}
 *     - {field: email, action: hash, salt: "s3cret"}
 *     - {field: user.name, action: rename, to: user.display_name}   (same parent object)
 *     - {field: comment, action: truncate, length: 100}              (bytes, UTF-8 kept whole)
 *     - {field: source, action: set, value: "web"}                   (any JSON value)
 *     - {field: type, action: drop, when: {equals: "debug"}}
 *
 * when (optional): {exists: true|false} | {equals: scalar} | {prefix: "s"} | {contains: "s"},
 * with an optional `field:` to test another field than the one acted on. Without `when`, a
 * rule applies when its field exists (`set`: always; it creates the field when its parent
 * object exists). Rules run in order on the result of the previous ones; `drop` ends the
 * record. A value that is not a JSON object, or a null value, is kept unchanged (counted as
 * "not_json_object" when it had to be parsed: unless a rule is a `set` or tests `exists:
 * false`, a value that mentions none of the rules' field names is kept without parsing). A changed value is written back as compact JSON. `hash` replaces the
 * field with the lowercase hex SHA-256 of salt + the field's bytes (a string's text, any other
 * value's compact JSON). Counters: set, removed, renamed, hashed, truncated, dropped,
 * not_json_object.
 *
 * The proxy validates the config when it loads (file:line:field errors, filters/rules_config.py);
 * sluice_on_config checks it again for configs that come from elsewhere (code, the fleet).
 */
#define SLUICE_BATCH_BEGIN begin_batch /* the SDK calls these around each batch call */
#define SLUICE_BATCH_END end_batch
#define SLUICE_VALUE_WRITTEN value_written /* host_sha256: where each digest lands */
/* sluice_on_record is below: the records entry point calls it in line (a call per record
 * costs ~5 ns under wasmtime) */
#define SLUICE_ON_RECORD_DEFINED 1
#pragma clang attribute push(__attribute__((target("simd128"))), apply_to = function)
#include "sluice_filter.h"
#include <wasm_simd128.h>

/* The scans over a value's strings use Wasm SIMD, 16 bytes per step, as builtin:pii-mask's do
 * (enabled for those functions only). */
#define SIMD __attribute__((target("simd128")))

#define MAX_RULES 64

enum { A_SET, A_REMOVE, A_RENAME, A_HASH, A_TRUNCATE, A_DROP };
/* Node types beside the SDK's: a value kept as its source text (see parse_value). */
#define J_RAW 0x40         /* source text that needs minifying when written */
#define J_RAW_COMPACT 0x41 /* source text that is already compact JSON */
#define J_HASH 0x42        /* a hashed string whose digest comes at the batch's end: str = the
                            * bytes to hash, count = its entry in `pending` (see hash_pending) */

enum { W_DEFAULT, W_EXISTS, W_MISSING, W_EQUALS, W_PREFIX, W_CONTAINS };

/* A hash rule's salt, compressed once at load (see sha_hex). */
typedef struct {
    uint32_t h[8];      /* state after the salt's whole blocks */
    uint64_t done;      /* bytes those blocks held */
    uint8_t tail[64];   /* the salt's remaining bytes, then zeros */
    int32_t tail_len;
    sluice_bytes salt;  /* the whole salt (the config's bytes), for the host's hash requests */
} salt_state;

typedef struct {
    sluice_bytes field;
    const sluice_bytes *seg;      /* field split at its dots (at load) */
    int nseg;
    int k0, when_k0, to_k;        /* name indexes of seg[0], when_seg[0], to (-1: no slots) */
    int action;
    int when;
    sluice_bytes when_field;    /* the field the condition tests */
    const sluice_bytes *when_seg; /* when_field split at its dots; seg when it is field */
    int when_nseg;
    const sluice_json *operand; /* equals */
    sluice_bytes text;          /* prefix / contains */
    const sluice_json *value;   /* set */
    sluice_bytes to;            /* rename: the new member name (last segment of `to`) */
    sluice_bytes salt;          /* hash */
    salt_state hash;            /* hash: the salt's midstate */
    int64_t length;             /* truncate */
} rule;

static rule rules[MAX_RULES];
static int nrules;
/* Set when every rule needs a field to be present (no `set`, no `exists: false`): a value that
 * does not mention any of those names cannot change and is kept without being parsed. */
static int skip_unmentioned;

/* Short copies and compares as a few loads and stores, overlapping at the end, without a loop
 * for up to 16 bytes: memcpy compiles to memory.copy, which wasmtime runs as a call into the
 * runtime, memcmp is a call with a byte loop, and every loop back-edge costs wasmtime an epoch
 * check; names and fields are a few dozen bytes. */
static inline uint64_t ld64(const uint8_t *p) {
    uint64_t v;
    __builtin_memcpy(&v, p, 8);
    return v;
}

static inline uint32_t ld32(const uint8_t *p) {
    uint32_t v;
    __builtin_memcpy(&v, p, 4);
    return v;
}

/* Inlined: a call per member name and value cost ~2.5 % of the bench once the one-pass loop
 * had a function of its own. */
static inline __attribute__((always_inline)) void copy_bytes(uint8_t *d, const uint8_t *s, int32_t n) {
    if (n >= 256) {
        memcpy(d, s, (size_t)n);
        return;
    }
    if (n > 16 && n <= 64) { /* 16-byte loads, all before the stores, without a loop */
        v128_t a = wasm_v128_load(s), z = wasm_v128_load(s + n - 16);
        if (n > 32) {
            v128_t b = wasm_v128_load(s + 16), y = wasm_v128_load(s + n - 32);
            wasm_v128_store(d + 16, b);
            wasm_v128_store(d + n - 32, y);
        }
        wasm_v128_store(d, a);
        wasm_v128_store(d + n - 16, z);
        return;
    }
    if (n >= 8) {
        uint64_t last = ld64(s + n - 8);
        for (; n > 8; d += 8, s += 8, n -= 8) {
            uint64_t w = ld64(s);
            __builtin_memcpy(d, &w, 8);
        }
        __builtin_memcpy(d + n - 8, &last, 8);
    } else if (n >= 4) {
        uint32_t first = ld32(s), last = ld32(s + n - 4);
        __builtin_memcpy(d, &first, 4);
        __builtin_memcpy(d + n - 4, &last, 4);
    } else if (n > 0) {
        uint8_t first = s[0], mid = s[n / 2], last = s[n - 1];
        d[0] = first;
        d[n / 2] = mid;
        d[n - 1] = last;
    }
}

/* Whether a[0..n) == b[0..n). */
__attribute__((always_inline)) static inline int same_bytes(const uint8_t *a, const uint8_t *b, int32_t n) {
    if (n >= 8) {
        if (ld64(a + n - 8) != ld64(b + n - 8)) return 0;
        for (; n > 8; a += 8, b += 8, n -= 8)
            if (ld64(a) != ld64(b)) return 0;
        return 1;
    }
    if (n >= 4) return ld32(a) == ld32(b) && ld32(a + n - 4) == ld32(b + n - 4);
    return n <= 0 || (a[0] == b[0] && a[n / 2] == b[n / 2] && a[n - 1] == b[n - 1]);
}

__attribute__((always_inline)) static inline int eq(sluice_bytes a, sluice_bytes b) {
    return a.len == b.len && (a.len <= 0 || same_bytes(a.ptr, b.ptr, a.len));
}

/* Room for n more bytes: the check inline, growing out of line. */
__attribute__((always_inline)) static inline int room(sluice_buf *b, uint32_t n) {
    return (!b->failed && b->cap - b->len >= n) || sluice_buf_reserve(b, n);
}

__attribute__((always_inline)) static void put_bytes(sluice_buf *b, const uint8_t *p, int32_t n) {
    if (n <= 0 || !room(b, (uint32_t)n)) return;
    copy_bytes(b->ptr + b->len, p, n);
    b->len += (uint32_t)n;
}

/* ---------------------------------------------------------------- SHA-256 (FIPS 180-4) */

static const uint32_t K[64] = {
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
    0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
    0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
    0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
    0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
    0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
    0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2};

/* The salt is the same for every record, so its whole 64-byte blocks are compressed once at
 * load (the midstate) and its remaining bytes kept as the start of a block template; a record
 * then costs one compression per 64 bytes of salt tail + field + padding (one for a short
 * e-mail or id), with the block built in place: no per-call state, no byte-wise padding. The
 * rounds stay a loop: fully unrolled, wasmtime's code for them ran slower (register spills). */
#define ROR(x, n) (((x) >> (n)) | ((x) << (32 - (n))))
#define BSIG0(a) (ROR(a, 2) ^ ROR(a, 13) ^ ROR(a, 22))
#define BSIG1(e) (ROR(e, 6) ^ ROR(e, 11) ^ ROR(e, 25))
#define SSIG0(x) (ROR(x, 7) ^ ROR(x, 18) ^ ((x) >> 3))
#define SSIG1(x) (ROR(x, 17) ^ ROR(x, 19) ^ ((x) >> 10))

static uint32_t load_be32(const uint8_t *p) {
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

static void sha_block(uint32_t st[8], const uint8_t *p) {
    uint32_t w[64];
    for (int i = 0; i < 16; i++) w[i] = load_be32(p + 4 * i);
    for (int i = 16; i < 64; i++) w[i] = w[i - 16] + SSIG0(w[i - 15]) + w[i - 7] + SSIG1(w[i - 2]);
    uint32_t a = st[0], b = st[1], c = st[2], d = st[3], e = st[4], f = st[5], g = st[6], h = st[7];
    for (int i = 0; i < 64; i++) {
        uint32_t t1 = h + BSIG1(e) + (g ^ (e & (f ^ g))) + K[i] + w[i];
        uint32_t t2 = BSIG0(a) + ((a & b) | (c & (a | b)));
        h = g; g = f; f = e; e = d + t1; d = c; c = b; b = a; a = t1 + t2;
    }
    st[0] += a; st[1] += b; st[2] += c; st[3] += d;
    st[4] += e; st[5] += f; st[6] += g; st[7] += h;
}

static void salt_init(salt_state *s, sluice_bytes salt) {
    static const uint32_t iv[8] = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
                                   0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};
    for (int i = 0; i < 8; i++) s->h[i] = iv[i];
    int32_t n = salt.len > 0 ? salt.len : 0, at = 0;
    for (; n - at >= 64; at += 64) sha_block(s->h, salt.ptr + at);
    s->done = (uint64_t)at;
    s->tail_len = n - at;
    for (int i = 0; i < 64; i++) s->tail[i] = i < s->tail_len ? salt.ptr[at + i] : 0;
    s->salt = sluice_bytes_of(salt.ptr, (size_t)n);
}

/* "0".."ff" as two bytes each, for writing the digest a byte at a time. */
static uint16_t hex_pairs[256];

/* The lowercase hex SHA-256 of salt + p[0..n) into out[0..64). */
static void sha_hex(const salt_state *s, const uint8_t *p, int32_t n, uint8_t out[64]) {
    uint32_t st[8];
    uint64_t block[16]; /* two blocks: the last one may not hold the padding */
    uint8_t *bb = (uint8_t *)block;
    for (int i = 0; i < 8; i++) st[i] = s->h[i];
    uint64_t bits = (s->done + (uint64_t)s->tail_len + (uint64_t)n) * 8u;
    int32_t fill = s->tail_len, streamed = 0;
    for (int i = 0; i < 8; i++) __builtin_memcpy(&block[i], s->tail + 8 * i, 8);
    for (int i = 8; i < 16; i++) block[i] = 0;
    while (fill + n >= 64) { /* whole blocks of field bytes */
        int32_t take = 64 - fill;
        copy_bytes(bb + fill, p, take);
        sha_block(st, bb);
        p += take;
        n -= take;
        fill = 0;
        streamed = 1;
    }
    copy_bytes(bb + fill, p, n);
    fill += n;
    if (streamed) /* the block still holds field bytes after fill */
        for (int i = fill; i < 64; i++) bb[i] = 0;
    bb[fill] = 0x80;
    int32_t last = fill < 56 ? 56 : 120;
    for (int i = 0; i < 8; i++) bb[last + i] = (uint8_t)(bits >> (56 - 8 * i));
    sha_block(st, bb);
    if (last == 120) sha_block(st, bb + 64);
    for (int i = 0; i < 8; i++) {
        uint32_t v = st[i];
        for (int k = 0; k < 4; k++) {
            uint16_t pair = hex_pairs[(v >> (24 - 8 * k)) & 0xff];
            __builtin_memcpy(out + 8 * i + 2 * k, &pair, 2);
        }
    }
}

/* ---------------------------------------------------------------- four hashes at a time */

/* One compression is ~2,300 dependent 32-bit operations, most of a record's time when a rule
 * hashes a field of every record. Four independent messages fit the four lanes of a Wasm SIMD
 * vector, so a hash rule whose salt tail + field fit one block (55 bytes: an e-mail, an id)
 * writes a placeholder and queues the field; at the batch's end (SLUICE_BATCH_END) the queue
 * is hashed four at a time and the digests written over the placeholders. A rule that reads
 * a queued field before then (a condition, truncate, another hash) computes it on the spot
 * (settle), so every output is what hashing in place gives. */
typedef struct {
    const salt_state *salt;
    sluice_bytes in;
    int32_t off;  /* offset of its placeholder in the record's output; -1 while not written */
    uint8_t *out; /* the placeholder, once the record's output is final */
} pending_hash;

static pending_hash *pending; /* this call's queue (arena memory) */
static uint32_t npending, cap_pending;

/* A new call (begin_batch): a queue a failed call left went with its arena. */
static void forget_pending(void) {
    pending = NULL;
    npending = cap_pending = 0;
}

/* Queue salt + in; the index, or -1 out of memory. */
__attribute__((always_inline)) static int32_t queue_hash(const salt_state *salt, sluice_bytes in) {
    if (npending == cap_pending) {
        uint32_t cap = cap_pending ? cap_pending * 2u : 128u;
        pending_hash *grown = (pending_hash *)sl__realloc(pending, sizeof(pending_hash) * cap_pending,
                                                          sizeof(pending_hash) * cap);
        if (grown == NULL) return -1;
        pending = grown;
        cap_pending = cap;
    }
    pending_hash *h = &pending[npending];
    h->salt = salt;
    h->in = in;
    h->off = -1;
    h->out = NULL;
    return (int32_t)npending++;
}

static int settle_now(sluice_json *n);

/* A queued hash computed now: the member becomes its digest. 0 when out of memory. */
__attribute__((always_inline)) static inline int settle(sluice_json *n) {
    return n == NULL || n->type != J_HASH || settle_now(n);
}

static int settle_now(sluice_json *n) {
    uint8_t *hex = (uint8_t *)sluice_malloc(64);
    if (hex == NULL) return 0;
    sha_hex(pending[n->count].salt, n->str.ptr, n->str.len, hex);
    n->type = SLUICE_JSON_STRING;
    n->str = sluice_bytes_of(hex, 64);
    n->count = 1; /* lowercase hex: nothing to escape */
    return 1;
}

#define VROR(x, n) wasm_v128_or(wasm_u32x4_shr((x), (n)), wasm_i32x4_shl((x), 32 - (n)))
#define VADD wasm_i32x4_add
#define VXOR wasm_v128_xor

/* Four 4-word rows (one per lane) as four columns (word q of every lane). */
SIMD static void transpose4(v128_t *r0, v128_t *r1, v128_t *r2, v128_t *r3) {
    v128_t t0 = wasm_i32x4_shuffle(*r0, *r1, 0, 4, 1, 5), t1 = wasm_i32x4_shuffle(*r0, *r1, 2, 6, 3, 7);
    v128_t t2 = wasm_i32x4_shuffle(*r2, *r3, 0, 4, 1, 5), t3 = wasm_i32x4_shuffle(*r2, *r3, 2, 6, 3, 7);
    *r0 = wasm_i32x4_shuffle(t0, t2, 0, 1, 4, 5);
    *r1 = wasm_i32x4_shuffle(t0, t2, 2, 3, 6, 7);
    *r2 = wasm_i32x4_shuffle(t1, t3, 0, 1, 4, 5);
    *r3 = wasm_i32x4_shuffle(t1, t3, 2, 3, 6, 7);
}

#define BSWAP32X4(v) wasm_i8x16_shuffle((v), (v), 3, 2, 1, 0, 7, 6, 5, 4, 11, 10, 9, 8, 15, 14, 13, 12)

/* 16 digest bytes (four words, host order) as 32 hex digits at out. */
SIMD static void put_hex16(v128_t words, uint8_t *out) {
    const v128_t digits = wasm_i8x16_const('0', '1', '2', '3', '4', '5', '6', '7', '8', '9', 'a', 'b',
                                           'c', 'd', 'e', 'f');
    v128_t bytes = BSWAP32X4(words);
    v128_t hi = wasm_i8x16_swizzle(digits, wasm_u8x16_shr(bytes, 4));
    v128_t lo = wasm_i8x16_swizzle(digits, wasm_v128_and(bytes, wasm_i8x16_splat(15)));
    wasm_v128_store(out, wasm_i8x16_shuffle(hi, lo, 0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23));
    wasm_v128_store(out + 16, wasm_i8x16_shuffle(hi, lo, 8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31));
}

/* The four one-block hashes e[0..3] (repeats allowed), their digests written to e[i]->out.
 * `short_msg` (a constant where this is inlined): every lane's salt tail + field is at most 27
 * bytes and its bit length fits 32 bits, so words 7..14 of every block are zero; the compiler
 * then drops the message schedule's terms and the round additions they feed (~3 % of it). */
__attribute__((always_inline)) SIMD static inline void sha4_body(pending_hash *const e[4], const int short_msg) {
    v128_t w[64], st[8];
    for (int l = 0; l < 4; l++) {
        const salt_state *s = e[l]->salt;
        uint64_t block[8];
        uint8_t *bb = (uint8_t *)block;
        for (int i = 0; i < 8; i++) __builtin_memcpy(&block[i], s->tail + 8 * i, 8);
        int32_t n = e[l]->in.len, fill = s->tail_len + n;
        copy_bytes(bb + s->tail_len, e[l]->in.ptr, n);
        bb[fill] = 0x80; /* the template's zeros follow */
        uint64_t bits = (s->done + (uint64_t)fill) * 8u;
        uint64_t be_bits = __builtin_bswap64(bits); /* big-endian, one store */
        __builtin_memcpy(bb + 56, &be_bits, 8);
        for (int q = 0; q < 4; q++) w[4 * q + l] = BSWAP32X4(wasm_v128_load(bb + 16 * q));
    }
    for (int q = 0; q < 4; q++) transpose4(&w[4 * q], &w[4 * q + 1], &w[4 * q + 2], &w[4 * q + 3]);
    if (short_msg) /* the same values, known to the compiler */
        for (int i = 7; i < 15; i++) w[i] = wasm_i32x4_splat(0);
    for (int i = 0; i < 8; i++)
        st[i] = wasm_i32x4_make((int32_t)e[0]->salt->h[i], (int32_t)e[1]->salt->h[i],
                                (int32_t)e[2]->salt->h[i], (int32_t)e[3]->salt->h[i]);
    v128_t a = st[0], b = st[1], c = st[2], d = st[3], f4 = st[4], f = st[5], g = st[6], h = st[7];
    v128_t bc = VXOR(b, c); /* Maj(a, b, c) = b ^ ((a ^ b) & (b ^ c)): one op fewer a round */
    /* unrolled: a loop back-edge's epoch check spills the eight state vectors every round */
#pragma clang loop unroll(full)
    for (int i = 0; i < 64; i++) {
        if (i >= 16) { /* the schedule word this round needs, computed as it is needed */
            v128_t x = w[i - 15], y = w[i - 2];
            v128_t s0 = VXOR(VXOR(VROR(x, 7), VROR(x, 18)), wasm_u32x4_shr(x, 3));
            v128_t s1 = VXOR(VXOR(VROR(y, 17), VROR(y, 19)), wasm_u32x4_shr(y, 10));
            w[i] = VADD(VADD(w[i - 16], s0), VADD(w[i - 7], s1));
        }
        v128_t bs1 = VXOR(VXOR(VROR(f4, 6), VROR(f4, 11)), VROR(f4, 25));
        v128_t ch = VXOR(g, wasm_v128_and(f4, VXOR(f, g)));
        v128_t t1 = VADD(VADD(h, bs1), VADD(ch, VADD(wasm_i32x4_splat((int32_t)K[i]), w[i])));
        v128_t bs0 = VXOR(VXOR(VROR(a, 2), VROR(a, 13)), VROR(a, 22));
        v128_t ab = VXOR(a, b), maj = VXOR(b, wasm_v128_and(ab, bc)); /* bc: b ^ c */
        h = g; g = f; f = f4; f4 = VADD(d, t1); d = c; c = b; b = a; a = VADD(t1, VADD(bs0, maj));
        bc = ab; /* the next round's b ^ c */
    }
    v128_t r[8] = {VADD(st[0], a), VADD(st[1], b), VADD(st[2], c), VADD(st[3], d),
                   VADD(st[4], f4), VADD(st[5], f), VADD(st[6], g), VADD(st[7], h)};
    transpose4(&r[0], &r[1], &r[2], &r[3]); /* r[l]: words 0..3 of lane l */
    transpose4(&r[4], &r[5], &r[6], &r[7]); /* r[4 + l]: words 4..7 */
    for (int l = 0; l < 4; l++) {
        put_hex16(r[l], e[l]->out);
        put_hex16(r[4 + l], e[l]->out + 32);
    }
}

/* Whether a queued hash's block has zeros in words 7..14 (see sha4_body). */
static inline int short_block(const pending_hash *h) {
    return h->salt->tail_len + h->in.len <= 27 && h->salt->done < (1u << 28);
}

SIMD static void sha4_short(pending_hash *const e[4]) { sha4_body(e, 1); }
SIMD static void sha4_long(pending_hash *const e[4]) { sha4_body(e, 0); }

static void sha4(pending_hash *const e[4]) {
    if (short_block(e[0]) && short_block(e[1]) && short_block(e[2]) && short_block(e[3])) sha4_short(e);
    else sha4_long(e);
}

/* At the batch's end (end_batch): the queued digests whose placeholders made it into an output.
 * Fields queued for the host that do not fit one block (see queue_limit) are hashed alone. */
static void hash_pending(void) {
    pending_hash *lanes[4];
    int n = 0;
    for (uint32_t i = 0; i < npending; i++) {
        if (pending[i].out == NULL) continue; /* removed, replaced, dropped or settled */
        if (pending[i].salt->tail_len + pending[i].in.len > 55) {
            sha_hex(pending[i].salt, pending[i].in.ptr, pending[i].in.len, pending[i].out);
            continue;
        }
        lanes[n++] = &pending[i];
        if (n == 4) {
            sha4(lanes);
            n = 0;
        }
    }
    if (n > 0) {
        for (int l = n; l < 4; l++) lanes[l] = lanes[0]; /* the spare lanes redo the first */
        sha4(lanes);
    }
    npending = 0;
}

/* ---------------------------------------------------------------- hashes the host computes */

/* The host_sha256 capability (docs/FILTER_ABI.md): a host that calls sluice_host_sha256 once
 * after init promises to hash, after every successful sluice_filter_records call, the
 * requests this module lists in `hash_slot`, with the CPU's SHA instructions: in Wasm even
 * four lanes at a time a digest cost more than the rest of the record. Each request asks for
 * the hex SHA-256 of salt || field written over the field's placeholder (64 '0' bytes) in the
 * output's records section; where each placeholder lands is known only once the SDK copies the
 * record's value there (value_written). sluice_filter calls, and an old host that never calls
 * sluice_host_sha256, get the digests computed here, as before. */
#define HOST_MAX_ENTRIES (1u << 20) /* the host's limits (filters/host_sha256.c) */
#define HOST_MAX_BYTES (4u << 20)

typedef struct {
    uint32_t prefix_ptr, prefix_len, data_ptr, data_len, out_ptr;
} hash_request;

static int host_hashes;               /* the host called sluice_host_sha256 */
static uint32_t hash_slot[2];         /* this call's table and its entry count, for the host */
static hash_request *requests;        /* the table (arena memory); NULL: none this call */
static uint32_t next_request;         /* value_written's place in `pending` */

__attribute__((export_name("sluice_host_sha256"))) int32_t sluice_host_sha256(void) {
    host_hashes = 1;
    return (int32_t)(uintptr_t)hash_slot;
}

static void forget_requests(void) {
    requests = NULL;
    hash_slot[0] = hash_slot[1] = 0;
    next_request = 0;
}

/* end_batch of a records call on a host that hashes: room for a request per queued digest that
 * reached an output; value_written fills it in. 0 (hash here instead) on any other call, over
 * the host's limits or out of memory. */
static int request_hashes(void) {
    if (!host_hashes || !sl__records_call) return 0;
    uint32_t live = 0;
    uint64_t bytes = 0;
    for (uint32_t i = 0; i < npending; i++) {
        if (pending[i].out == NULL) continue;
        live++;
        bytes += (uint64_t)pending[i].salt->salt.len + (uint64_t)pending[i].in.len;
    }
    if (live == 0 || live > HOST_MAX_ENTRIES || bytes > HOST_MAX_BYTES) return 0;
    requests = (hash_request *)sluice_malloc(sizeof(hash_request) * live);
    if (requests == NULL) return 0;
    hash_slot[0] = (uint32_t)(uintptr_t)requests;
    return 1;
}

/* SLUICE_VALUE_WRITTEN: a rewritten value, `len` bytes at `src`, now lies at `dst` in the output;
 * the requests for its placeholders (queued in record order, as the values are written). */
__attribute__((always_inline)) static inline void value_written(const uint8_t *src, uint8_t *dst, int32_t len) {
    if (requests == NULL) return;
    /* One turn: 0 when the queue is done or its next entry is a later record's. */
#define VALUE_WRITTEN_TURN()                                                                      \
    ({                                                                                            \
        int more = 0;                                                                             \
        const pending_hash *h = &pending[next_request];                                           \
        if (h->out == NULL) {                                                                     \
            more = 1;                                                                             \
        } else if (h->out >= src && h->out + 64 <= src + len) {                                   \
            hash_request q = {(uint32_t)(uintptr_t)h->salt->salt.ptr, (uint32_t)h->salt->salt.len, \
                              (uint32_t)(uintptr_t)h->in.ptr, (uint32_t)h->in.len,                 \
                              (uint32_t)(uintptr_t)(dst + (h->out - src))};                       \
            /* The host takes requests in output order; a record's come in rule order (the     \
             * first hash rule may name a later member), so each goes in before any of its      \
             * record's requests that land after it. */                                       \
            uint32_t at = hash_slot[1]++;                                                         \
            while (at > 0 && requests[at - 1].out_ptr > q.out_ptr) {                              \
                requests[at] = requests[at - 1];                                                  \
                at--;                                                                             \
            }                                                                                     \
            requests[at] = q;                                                                     \
            more = 1;                                                                             \
        }                                                                                         \
        more;                                                                                     \
    })
    /* A record's one hash and the look at the next record's are the first two turns, before
     * the loop (whose entry costs wasmtime's epoch check). */
    if (next_request >= npending || !VALUE_WRITTEN_TURN()) return;
    if (++next_request >= npending || !VALUE_WRITTEN_TURN()) return;
    for (++next_request; next_request < npending; next_request++)
        if (!VALUE_WRITTEN_TURN()) return;
#undef VALUE_WRITTEN_TURN
}

/* ---------------------------------------------------------------- counters */

/* The counters add up in plain statics and reach the SDK once per batch (flush_counts), in the
 * order each was first counted, as counting through sluice_count record by record reported
 * them: its look-up by name cost as much as a rule. */
enum { C_SET, C_REMOVED, C_RENAMED, C_HASHED, C_TRUNCATED, C_NOT_JSON_OBJECT, C_DROPPED, NCOUNTERS };
static const char *const counter_names[NCOUNTERS] = {"set", "removed", "renamed", "hashed",
                                                     "truncated", "not_json_object", "dropped"};
static uint32_t counts[NCOUNTERS];
static uint8_t count_order[NCOUNTERS];
static uint32_t ncounted;

static inline __attribute__((always_inline)) void count(int c) {
    if (counts[c]++ == 0) count_order[ncounted++] = (uint8_t)c;
}

/* Most records of a batch fire the same rules: a rewritten record whose rules are the run's
 * (the last rewritten record's, on the one-pass path) only adds to run_repeats instead of
 * counting rule by rule (a loop that cost ~5 % of the bench). The run's first record is
 * counted at once, so each counter still comes in the order it was first counted; the
 * repeats are added when the run ends (other rules fire, or end_batch). */
static const uint8_t counter_of[] = {C_SET, C_REMOVED, C_RENAMED, C_HASHED, C_TRUNCATED, C_DROPPED};
static uint64_t run_fired;
static uint32_t run_repeats;
static void end_run(void);

static void flush_counts(void) {
    for (uint32_t i = 0; i < ncounted; i++) {
        int c = count_order[i];
        sluice_count(counter_names[c], counts[c]);
        counts[c] = 0;
    }
    ncounted = 0;
}

/* A buffer the last record did not need (kept or dropped), reused by the next: the arena
 * gives memory back only when the call ends. Forgotten with the arena (begin_batch). */
static sluice_buf spare;
static int have_spare;

/* SLUICE_BATCH_BEGIN: a new call; what a failed call left (queue, requests, counts) is
 * forgotten. */
static void begin_batch(void) {
    forget_pending();
    forget_requests();
    have_spare = 0;
    run_fired = 0;
    run_repeats = 0;
    for (int c = 0; c < NCOUNTERS; c++) counts[c] = 0;
    ncounted = 0;
}

/* SLUICE_BATCH_END: the deferred hashes (or their requests to the host), then the batch's
 * counters. */
static void end_batch(void) {
    if (!request_hashes()) hash_pending();
    end_run();
    flush_counts();
}

/* ---------------------------------------------------------------- JSON tree helpers */

/* A JSON string literal: runs of bytes that need no escape go in with one copy each. */
static void put_string(sluice_buf *b, sluice_bytes s) {
    static const char hex[] = "0123456789abcdef";
    int32_t run = 0;
    sluice_buf_putc(b, '"');
    for (int32_t i = 0; i < s.len; i++) {
        uint8_t c = s.ptr[i];
        if (c >= 0x20 && c != '"' && c != '\\') continue;
        put_bytes(b, s.ptr + run, i - run);
        run = i + 1;
        sluice_buf_putc(b, '\\');
        switch (c) {
        case '"': sluice_buf_putc(b, '"'); break;
        case '\\': sluice_buf_putc(b, '\\'); break;
        case '\n': sluice_buf_putc(b, 'n'); break;
        case '\r': sluice_buf_putc(b, 'r'); break;
        case '\t': sluice_buf_putc(b, 't'); break;
        case '\b': sluice_buf_putc(b, 'b'); break;
        case '\f': sluice_buf_putc(b, 'f'); break;
        default:
            sluice_buf_puts(b, "u00");
            sluice_buf_putc(b, (uint8_t)hex[c >> 4]);
            sluice_buf_putc(b, (uint8_t)hex[c & 15]);
        }
    }
    put_bytes(b, s.ptr + run, s.len - run);
    sluice_buf_putc(b, '"');
}

static int read_string(sl__jp *j, sluice_bytes *out);

/* The compact JSON of valid JSON text `s`: whitespace between tokens left out, strings written
 * as put_string writes them, numbers and literals as they are (what put_json writes for it). */
static void put_minified(sluice_buf *b, sluice_bytes s) {
    const uint8_t *p = s.ptr, *e = s.ptr + s.len;
    while (p < e) {
        uint8_t c = *p;
        if (c == ' ' || c == '\t' || c == '\n' || c == '\r') {
            p++;
        } else if (c != '"') {
            const uint8_t *q = p + 1;
            while (q < e && *q != '"' && *q != ' ' && *q != '\t' && *q != '\n' && *q != '\r') q++;
            put_bytes(b, p, (int32_t)(q - p));
            p = q;
        } else {
            sl__jp j = {p, e, NULL, 0};
            sluice_bytes text;
            if (!read_string(&j, &text)) {
                b->failed = 1;
                return;
            }
            put_string(b, text);
            p = j.p;
        }
    }
}

/* The record value being rewritten: a member name that points into it was read without an
 * escape (decoded names live elsewhere in the arena), so it is written as it is. */
static const uint8_t *src_lo, *src_hi;
static int writing_output; /* put_json is writing the record's new value (not a hash's input) */

static void put_container(sluice_buf *b, const sluice_json *n);

/* A node's compact JSON: scalars written here (inlined where members are written), objects and
 * arrays by put_container. */
static inline __attribute__((always_inline)) void put_node(sluice_buf *b, const sluice_json *n) {
    switch (n->type) {
    case SLUICE_JSON_OBJECT:
    case SLUICE_JSON_ARRAY: put_container(b, n); break;
    case SLUICE_JSON_STRING:
        if (n->count != 1) {
            put_string(b, n->str);
        } else if (room(b, (uint32_t)n->str.len + 2u)) {
            b->ptr[b->len++] = '"';
            copy_bytes(b->ptr + b->len, n->str.ptr, n->str.len);
            b->len += (uint32_t)n->str.len;
            b->ptr[b->len++] = '"';
        }
        break;
    case J_RAW_COMPACT: put_bytes(b, n->str.ptr, n->str.len); break;
    case J_HASH: /* a placeholder in the record's output; the digest itself anywhere else */
        if (room(b, 66)) {
            b->ptr[b->len++] = '"';
            if (writing_output) { /* '0's: the placeholder a host_sha256 request replaces */
                pending[n->count].off = (int32_t)b->len;
                const v128_t zeros = wasm_i8x16_splat('0');
                for (int k = 0; k < 64; k += 16) wasm_v128_store(b->ptr + b->len + k, zeros);
            } else {
                sha_hex(pending[n->count].salt, n->str.ptr, n->str.len, b->ptr + b->len);
            }
            b->len += 64;
            b->ptr[b->len++] = '"';
        }
        break;
    case J_RAW: put_minified(b, n->str); break;
    case SLUICE_JSON_NUMBER: put_bytes(b, n->str.ptr, n->str.len); break;
    case SLUICE_JSON_TRUE: sluice_buf_puts(b, "true"); break;
    case SLUICE_JSON_FALSE: sluice_buf_puts(b, "false"); break;
    default: sluice_buf_puts(b, "null"); break;
    }
}

static void put_json(sluice_buf *b, const sluice_json *n) { put_node(b, n); }

static void put_container(sluice_buf *b, const sluice_json *n) {
    int object = n->type == SLUICE_JSON_OBJECT;
    if (!room(b, 1)) return;
    b->ptr[b->len++] = object ? '{' : '[';
    for (const sluice_json *c = n->child; c; c = c->next) {
        if (c != n->child) {
            if (!room(b, 1)) return;
            b->ptr[b->len++] = ',';
        }
        if (object) {
            sluice_bytes k = c->key;
            if (k.ptr >= src_lo && k.ptr + k.len <= src_hi) { /* read from the value unescaped */
                if (!room(b, (uint32_t)k.len + 3u)) return;
                b->ptr[b->len++] = '"';
                copy_bytes(b->ptr + b->len, k.ptr, k.len);
                b->len += (uint32_t)k.len;
                b->ptr[b->len++] = '"';
                b->ptr[b->len++] = ':';
            } else {
                put_string(b, k);
                sluice_buf_putc(b, ':');
            }
        }
        put_node(b, c);
    }
    if (!room(b, 1)) return;
    b->ptr[b->len++] = object ? '}' : ']';
}

/* ---------------------------------------------------------------- parsing only what rules touch */

/* A record's value is parsed in one pass that validates all of it (a value that is not valid
 * JSON is kept and counted, as before) but builds nodes only where a rule can look: the
 * members whose names are a segment of some rule's field, `when.field` or `to`, and the
 * objects under them. Every other value (and every array: paths walk objects only) becomes one
 * J_RAW node that points at its source text; strings without escapes point into the value
 * instead of being decoded. The writer copies a J_RAW node's text as it is when it is already
 * compact (J_RAW_COMPACT), so an unchanged member costs a scan, not a tree and a re-encoding. */

#define MAX_NAMES 256
static sluice_bytes names[MAX_NAMES];
static int nnames;
static int all_names; /* more names than fit: build every member */

static void add_path_names(sluice_bytes path) {
    int32_t start = 0;
    for (int32_t i = 0; i <= path.len; i++) {
        if (i < path.len && path.ptr[i] != '.') continue;
        sluice_bytes seg = sluice_bytes_of(path.ptr + start, (size_t)(i - start));
        start = i + 1;
        int known = 0;
        for (int k = 0; k < nnames && !known; k++) known = sluice_eq(names[k], seg);
        if (known) continue;
        if (nnames == MAX_NAMES) all_names = 1;
        else names[nnames++] = seg;
    }
}

/* A name's slot in a 64-entry table (its length, first and last byte): a key is looked up with
 * one compare instead of a loop over every name. Entries: 0 empty, NAME_CLASH two names share
 * the slot (compare with each), else 1 + the name's index. */
#define NAME_CLASH 255
static uint8_t name_tab[64], tested_tab[64];

static inline uint32_t name_slot(const uint8_t *p, int32_t n) {
    return n <= 0 ? 0u : ((uint32_t)n * 7u + (uint32_t)p[0] * 3u + p[n - 1]) & 63u;
}

static void tab_add(uint8_t tab[64], sluice_bytes name, int index) {
    uint32_t h = name_slot(name.ptr, name.len);
    tab[h] = tab[h] == 0 && index + 1 < NAME_CLASH ? (uint8_t)(index + 1) : NAME_CLASH;
}

/* The index of p[0..len) in list[0..n) (tab: their slots), or -1. */
__attribute__((always_inline)) static inline int find_in(const uint8_t tab[64], const sluice_bytes *list, int n, const uint8_t *p,
                          int32_t len) {
    uint8_t t = tab[name_slot(p, len)];
    if (t == 0) return -1;
    if (t != NAME_CLASH) return list[t - 1].len == len && same_bytes(list[t - 1].ptr, p, len) ? t - 1 : -1;
    for (int k = 0; k < n; k++)
        if (list[k].len == len && same_bytes(list[k].ptr, p, len)) return k;
    return -1;
}

__attribute__((always_inline)) static inline int find_name(sluice_bytes key) { return find_in(name_tab, names, nnames, key.ptr, key.len); }

/* The record's top-level members by name index (the last of duplicates, as lookups find),
 * valid while top_gen[k] == gen: a rule's first path step is one load instead of a walk over
 * the members. Kept exact by the rules that change the top level (set, remove, rename). Off
 * when the names did not all fit (all_names). */
static sluice_json *top_member[MAX_NAMES];
static uint32_t top_gen[MAX_NAMES];
static uint32_t gen;

static inline sluice_json *top(int k) { return top_gen[k] == gen ? top_member[k] : NULL; }

static inline void top_set(int k, sluice_json *n) {
    top_member[k] = n;
    top_gen[k] = gen;
}

/* The string at j->p (its opening quote), checked as the SDK's parser checks it. Returns 1 and
 * sets *plain when it holds no escape (its text is the bytes between the quotes); an escape or
 * anything unusual goes to the SDK's own string parser, so the verdict is always the same. */
#define SCAN_STRAIGHT 4 /* 1, 2 and 8 measured no better than the loop alone; 4: ~1-2 % */
__attribute__((always_inline)) SIMD static int scan_string(sl__jp *j, int *plain) {
    const uint8_t *p = j->p + 1, *e = j->end;
    /* 16 bytes at a time to the first quote, backslash, control or non-ASCII byte (the signed
     * compare catches both of the last two) */
#define SCAN_CHUNK(stop)                                                                          \
    do {                                                                                          \
        v128_t v = wasm_v128_load(p);                                                             \
        uint32_t m = (uint32_t)wasm_i8x16_bitmask(                                                \
            wasm_v128_or(wasm_i8x16_lt(v, wasm_i8x16_splat(0x20)),                                \
                         wasm_v128_or(wasm_i8x16_eq(v, wasm_i8x16_splat('"')),                    \
                                      wasm_i8x16_eq(v, wasm_i8x16_splat('\\')))));                \
        if (m) {                                                                                  \
            p += __builtin_ctz(m);                                                                \
            goto stop;                                                                            \
        }                                                                                         \
        p += 16;                                                                                  \
    } while (0)
    /* The first SCAN_STRAIGHT chunks before any loop: wasmtime checks its epoch on every loop
     * header, and around that check the loop's three constant vectors are loaded back from the
     * stack each turn (as in pii-mask's jstring_classify). Keys and short values end in the
     * straight part at their closing quote and return without entering any loop (the loop for
     * escapes and non-ASCII text used to hold the straight part, so every string paid its
     * header); the bench's 120-byte note takes the chunk loop for its rest. */
#pragma clang loop unroll(full)
    for (int i = 0; i < SCAN_STRAIGHT; i++) {
        if (e - p < 16) goto slow;
        SCAN_CHUNK(found);
    }
    while (e - p >= 16) SCAN_CHUNK(found);
    goto slow;
found:
    if (*p == '"') {
        j->p = p + 1;
        *plain = 1;
        return 1;
    }
slow: /* at a byte that stops the scan, or fewer than 16 bytes before the end */
    for (;;) {
        while (p < e && *p >= 0x20 && *p < 0x80 && *p != '"' && *p != '\\') p++;
        if (p >= e) break;
        if (*p == '"') {
            j->p = p + 1;
            *plain = 1;
            return 1;
        }
        if (*p < 0x80) break; /* an escape or a control character */
        int n = sluice_utf8_len(p, e);
        if (n == 0) break;
        p += n;
        while (e - p >= 16) SCAN_CHUNK(next);
    next:;
    }
#undef SCAN_CHUNK
    *plain = 0;
    return sl__jstring(j, NULL);
}

/* The text of the string at j->p: the source bytes when there is no escape, else decoded. */
__attribute__((always_inline)) static int read_string(sl__jp *j, sluice_bytes *out) {
    const uint8_t *start = j->p;
    int plain;
    if (!scan_string(j, &plain)) return 0;
    if (plain) {
        *out = sluice_bytes_of(start + 1, (size_t)(j->p - start - 2));
        return 1;
    }
    sluice_buf b;
    sluice_buf_init(&b, 16);
    j->p = start;
    if (!sl__jstring(j, &b)) return 0;
    if (b.failed) {
        j->error = "out of memory";
        return 0;
    }
    *out = sluice_buf_bytes(&b);
    return 1;
}

/* Whitespace, noting in *compact that there was some. */
static void skip_ws(sl__jp *j, int *compact) {
    const uint8_t *p = j->p;
    sl__ws(j);
    if (j->p != p) *compact = 0;
}

/* Checks the value at j->p without building anything; *compact = 0 when its text has
 * whitespace or an escape (its compact JSON differs from it). */
static int skip_value(sl__jp *j, int *compact) {
    if (j->p >= j->end) {
        j->error = "unexpected end of input";
        return 0;
    }
    uint8_t c = *j->p;
    if (c == '"') {
        int plain;
        if (!scan_string(j, &plain)) return 0;
        if (!plain) *compact = 0;
        return 1;
    }
    if (c == '{' || c == '[') {
        if (++j->depth > SLUICE_JSON_MAX_DEPTH) {
            j->error = "nesting too deep";
            return 0;
        }
        uint8_t close = c == '{' ? '}' : ']';
        j->p++;
        skip_ws(j, compact);
        if (j->p < j->end && *j->p == close) {
            j->p++;
            j->depth--;
            return 1;
        }
        for (;;) {
            skip_ws(j, compact);
            if (c == '{') {
                int plain;
                if (j->p >= j->end || *j->p != '"') {
                    j->error = "expected member name";
                    return 0;
                }
                if (!scan_string(j, &plain)) return 0;
                if (!plain) *compact = 0;
                skip_ws(j, compact);
                if (j->p >= j->end || *j->p != ':') {
                    j->error = "expected ':'";
                    return 0;
                }
                j->p++;
                skip_ws(j, compact);
            }
            if (!skip_value(j, compact)) return 0;
            skip_ws(j, compact);
            if (j->p >= j->end) {
                j->error = "unexpected end of input";
                return 0;
            }
            if (*j->p == ',') {
                j->p++;
                continue;
            }
            if (*j->p == close) {
                j->p++;
                break;
            }
            j->error = "expected ',' or a closing bracket";
            return 0;
        }
        j->depth--;
        return 1;
    }
    if (c == '-' || (c >= '0' && c <= '9')) return sl__jnumber(j);
    if (c == 't') return sl__jlit(j, "true");
    if (c == 'f') return sl__jlit(j, "false");
    if (c == 'n') return sl__jlit(j, "null");
    j->error = "unexpected character";
    return 0;
}

/* A record's parsed nodes live only while its rules run and its value is written (the hash
 * queue keeps the bytes to hash, never a node), so they come from a static pool that every
 * record reuses: taking one is an index bump, not an arena allocation with its alignment and
 * memory checks. A value with more nodes than the pool holds takes the rest from the arena. */
#define NODE_POOL 1024
static sluice_json node_pool[NODE_POOL];
static uint32_t nodes_used;

__attribute__((always_inline)) static sluice_json *new_node(uint8_t type) {
    sluice_json *n = nodes_used < NODE_POOL ? &node_pool[nodes_used++]
                                            : (sluice_json *)sluice_malloc(sizeof(sluice_json));
    if (n == NULL) return NULL;
    n->type = type;
    n->key = sluice_null();
    n->str = sluice_null();
    n->count = 0;
    n->child = NULL;
    n->next = NULL;
    return n;
}

/* The end of the run of digits at p: one 16-byte load where 16 bytes remain (most numbers end
 * in it), the byte loop only for the rest; a loop costs wasmtime's epoch check on entry. */
static inline __attribute__((always_inline)) const uint8_t *digits_end(const uint8_t *p, const uint8_t *e) {
    if (e - p >= 16) {
        v128_t v = wasm_v128_load(p);
        uint32_t m = ~(uint32_t)wasm_i8x16_bitmask(
                         wasm_u8x16_lt(wasm_i8x16_sub(v, wasm_i8x16_splat('0')), wasm_i8x16_splat(10))) &
                     0xffffu;
        if (m) return p + __builtin_ctz(m);
        p += 16;
    }
    while (p < e && *p >= '0' && *p <= '9') p++;
    return p;
}

/* A number as sl__jnumber reads it (same grammar, same verdict), inlined where values are read:
 * a call per number cost more than reading one. */
static inline __attribute__((always_inline)) int read_number(sl__jp *j) {
    const uint8_t *p = j->p, *e = j->end;
    if (p < e && *p == '-') p++;
    if (p >= e) return sl__jnumber(j);
    if (*p == '0') p++;
    else if (*p >= '1' && *p <= '9') p = digits_end(p + 1, e);
    else return sl__jnumber(j); /* not a number: the SDK's error */
    if (p < e && *p == '.') {
        p++;
        if (p >= e || *p < '0' || *p > '9') return sl__jnumber(j);
        p = digits_end(p + 1, e);
    }
    if (p < e && (*p == 'e' || *p == 'E')) return sl__jnumber(j); /* exponents: the SDK reads them */
    j->p = p;
    return 1;
}

static sluice_json *parse_object(sl__jp *j);

/* A node for the source text start..j->p: J_RAW_COMPACT when it is compact JSON, else J_RAW. */
static inline __attribute__((always_inline)) sluice_json *raw_node(sl__jp *j, const uint8_t *start,
                                                                   int compact) {
    sluice_json *n = new_node(compact ? J_RAW_COMPACT : J_RAW);
    if (n == NULL) j->error = "out of memory";
    else n->str = sluice_bytes_of(start, (size_t)(j->p - start));
    return n;
}

/* The value at j->p (whitespace skipped, not at the end) as a node: objects and the scalars a
 * rule may test are built when `build`, everything else is one J_RAW node. NULL when invalid
 * or out of memory (j->error says which). Inlined into the member loop: scalars, most of a
 * record's members, cost no call. */
static inline __attribute__((always_inline)) sluice_json *parse_value(sl__jp *j, int build) {
    uint8_t c = *j->p;
    const uint8_t *start = j->p;
    if (c == '"') {
        int plain;
        if (!scan_string(j, &plain)) return NULL;
        if (!build) return raw_node(j, start, plain);
        sluice_json *n = new_node(SLUICE_JSON_STRING);
        if (n == NULL) {
            j->error = "out of memory";
            return NULL;
        }
        if (plain) {
            n->str = sluice_bytes_of(start + 1, (size_t)(j->p - start - 2));
            n->count = 1; /* the text came from the source unescaped: it needs no escaping */
            return n;
        }
        j->p = start;
        if (!read_string(j, &n->str)) return NULL; /* decoded: count stays 0 */
        return n;
    }
    if (c == '{' && build) return parse_object(j);
    uint8_t type;
    if (c == '-' || (c >= '0' && c <= '9')) {
        if (!read_number(j)) return NULL;
        type = SLUICE_JSON_NUMBER;
    } else if (c == 't' || c == 'f' || c == 'n') {
        if (!sl__jlit(j, c == 't' ? "true" : c == 'f' ? "false" : "null")) return NULL;
        type = c == 't' ? SLUICE_JSON_TRUE : c == 'f' ? SLUICE_JSON_FALSE : SLUICE_JSON_NULL;
    } else { /* an array, an object no rule looks into, or not JSON */
        int compact = 1;
        if (!skip_value(j, &compact)) return NULL;
        return raw_node(j, start, compact);
    }
    if (!build) return raw_node(j, start, 1);
    /* a number or a literal a rule may compare */
    sluice_json *n = new_node(type);
    if (n == NULL) j->error = "out of memory";
    else if (type == SLUICE_JSON_NUMBER) n->str = sluice_bytes_of(start, (size_t)(j->p - start));
    return n;
}

/* Whitespace: most JSON has none or one space between tokens, so the loop is entered only
 * when the next byte can be whitespace (every whitespace byte is <= ' '). */
static inline __attribute__((always_inline)) void ws(sl__jp *j) {
    if (j->p < j->end && *j->p <= ' ') sl__ws(j);
}

/* The object at j->p, its members built where a rule can look (see parse_value). */
static sluice_json *parse_object(sl__jp *j) {
    if (++j->depth > SLUICE_JSON_MAX_DEPTH) {
        j->error = "nesting too deep";
        return NULL;
    }
    sluice_json *node = new_node(SLUICE_JSON_OBJECT);
    if (node == NULL) {
        j->error = "out of memory";
        return NULL;
    }
    j->p++;
    ws(j);
    if (j->p < j->end && *j->p == '}') {
        j->p++;
        j->depth--;
        return node;
    }
    sluice_json **link = &node->child;
    for (;;) {
        ws(j);
        sluice_bytes key;
        if (j->p >= j->end || *j->p != '"') {
            j->error = "expected member name";
            return NULL;
        }
        if (!read_string(j, &key)) return NULL;
        ws(j);
        if (j->p >= j->end || *j->p != ':') {
            j->error = "expected ':'";
            return NULL;
        }
        j->p++;
        ws(j);
        if (j->p >= j->end) {
            j->error = "unexpected end of input";
            return NULL;
        }
        int k = all_names ? -1 : find_name(key);
        sluice_json *child = parse_value(j, all_names || k >= 0);
        if (child == NULL) return NULL;
        child->key = key;
        if (k >= 0 && j->depth == 1) top_set(k, child); /* a member of the record's object */
        *link = child;
        link = &child->next;
        node->count++;
        ws(j);
        if (j->p >= j->end) {
            j->error = "unexpected end of input";
            return NULL;
        }
        if (*j->p == ',') {
            j->p++;
            continue;
        }
        if (*j->p == '}') {
            j->p++;
            break;
        }
        j->error = "expected ',' or '}'";
        return NULL;
    }
    j->depth--;
    return node;
}

/* A record's value as a tree of what the rules can touch; NULL unless it is one valid JSON
 * text (the same verdict as sluice_json_parse). */
static sluice_json *parse_doc(sluice_bytes data) {
    if (++gen == 0) { /* after 2^32 records: forget every slot rather than trust an old one */
        for (int k = 0; k < MAX_NAMES; k++) top_gen[k] = 0;
        gen = 1;
    }
    nodes_used = 0; /* the previous record's nodes are done with */
    sl__jp j = {data.ptr, data.ptr + data.len, NULL, 0};
    sl__ws(&j);
    if (j.p >= j.end) return NULL;
    sluice_json *root = parse_value(&j, 1);
    if (root == NULL) return NULL;
    sl__ws(&j);
    return j.p == j.end ? root : NULL;
}

__attribute__((always_inline)) static sluice_json *member(sluice_json *parent, sluice_bytes name) {
    sluice_json *found = NULL;
    if (parent == NULL) return NULL;
    for (sluice_json *c = parent->child; c; c = c->next)
        if (eq(c->key, name)) found = c; /* the last duplicate wins, as in lookups */
    return found;
}

/* The member at the path seg[0..n) (walking objects only; NULL when missing) and in *parent the
 * object that holds it or would (NULL when a step is missing or not an object). The first
 * step comes from the top-level slots when k0 (seg[0]'s name index) >= 0. */
__attribute__((always_inline)) static sluice_json *find_path(sluice_json *doc, const sluice_bytes *seg, int n, int k0,
                              sluice_json **parent) {
    sluice_json *node = doc;
    for (int i = 0; i + 1 < n; i++) {
        node = i == 0 && k0 >= 0 ? top(k0) : member(node, seg[i]);
        if (node == NULL || node->type != SLUICE_JSON_OBJECT) {
            *parent = NULL;
            return NULL;
        }
    }
    *parent = node;
    return n == 1 && k0 >= 0 ? top(k0) : member(node, seg[n - 1]);
}

/* A path's n segments, split once at load. */
static const sluice_bytes *split_path(sluice_bytes path, int *n) {
    int count = 1;
    for (int32_t i = 0; i < path.len; i++) count += path.ptr[i] == '.';
    sluice_bytes *seg = (sluice_bytes *)sluice_malloc(sizeof(sluice_bytes) * (size_t)count);
    if (seg == NULL) return NULL;
    int32_t start = 0;
    int k = 0;
    for (int32_t i = 0; i <= path.len; i++) {
        if (i < path.len && path.ptr[i] != '.') continue;
        seg[k++] = sluice_bytes_of(path.ptr + start, (size_t)(i - start));
        start = i + 1;
    }
    *n = count;
    return seg;
}

/* Unlink every member called `name` from `parent`. */
__attribute__((always_inline)) static void unlink_all(sluice_json *parent, sluice_bytes name) {
    sluice_json **link = &parent->child;
    while (*link) {
        if (eq((*link)->key, name)) {
            *link = (*link)->next;
            parent->count--;
        } else {
            link = &(*link)->next;
        }
    }
}

/* A copy of `n` (and everything under it) in this call's memory: a set value is shared by
 * every record, and later rules may change what they find. */
static sluice_json *copy_tree(const sluice_json *n) {
    sluice_json *c = (sluice_json *)sluice_malloc(sizeof(sluice_json));
    if (c == NULL) return NULL;
    *c = *n;
    c->next = NULL;
    sluice_json **link = &c->child;
    for (const sluice_json *k = n->child; k; k = k->next) {
        if ((*link = copy_tree(k)) == NULL) return NULL;
        link = &(*link)->next;
    }
    return c;
}

__attribute__((always_inline)) static int same_scalar(const sluice_json *a, const sluice_json *b) {
    if (a->type != b->type) return 0;
    if (a->type == SLUICE_JSON_STRING || a->type == SLUICE_JSON_NUMBER) return eq(a->str, b->str);
    return a->type != SLUICE_JSON_OBJECT && a->type != SLUICE_JSON_ARRAY;
}

static int contains(sluice_bytes hay, sluice_bytes needle) {
    for (int32_t i = 0; i + needle.len <= hay.len; i++)
        if (sluice_eq(sluice_bytes_of(hay.ptr + i, (size_t)needle.len), needle)) return 1;
    return 0;
}

/* Whether the rule's condition holds; n is the member it tests (NULL: missing). */
__attribute__((always_inline)) static int matches(const rule *r, const sluice_json *n) {
    switch (r->when) {
    case W_DEFAULT: return r->action == A_SET || n != NULL;
    case W_EXISTS: return n != NULL;
    case W_MISSING: return n == NULL;
    case W_EQUALS: return n != NULL && same_scalar(n, r->operand);
    case W_PREFIX:
        return n != NULL && n->type == SLUICE_JSON_STRING && n->str.len >= r->text.len &&
               sluice_eq(sluice_bytes_of(n->str.ptr, (size_t)r->text.len), r->text);
    default: return n != NULL && n->type == SLUICE_JSON_STRING && contains(n->str, r->text);
    }
}

/* hash: the member `m` becomes the hex digest of the rule's salt and its bytes, queued (a
 * placeholder until the batch's end) or computed now. 1, or -2 out of memory. */
static inline __attribute__((always_inline)) int hash_member(const rule *r, sluice_json *m) {
    if (!settle(m)) return -2;
    if (m->type == SLUICE_JSON_STRING &&
        (r->hash.tail_len + m->str.len <= 55 || (host_hashes && sl__records_call))) {
        int32_t at = queue_hash(&r->hash, m->str);
        if (at < 0) return -2;
        m->type = J_HASH;
        m->count = (uint32_t)at;
        m->child = NULL;
        return 1;
    }
    uint8_t *hex = (uint8_t *)sluice_malloc(64);
    if (hex == NULL) return -2;
    if (m->type == SLUICE_JSON_STRING) {
        sha_hex(&r->hash, m->str.ptr, m->str.len, hex);
    } else {
        sluice_buf b;
        sluice_buf_init(&b, 64);
        put_json(&b, m);
        if (b.failed) return -2;
        sha_hex(&r->hash, b.ptr, (int32_t)b.len, hex);
    }
    m->type = SLUICE_JSON_STRING;
    m->str = sluice_bytes_of(hex, 64);
    m->child = NULL;
    m->count = 1; /* lowercase hex: nothing to escape */
    return 1;
}

/* truncate: 1 when the member (NULL: missing) was a string longer than the rule's length and is
 * now cut (never inside a UTF-8 character), 0 when unchanged, -2 out of memory. */
static inline __attribute__((always_inline)) int truncate_member(const rule *r, sluice_json *m) {
    if (!settle(m)) return -2;
    if (m == NULL || m->type != SLUICE_JSON_STRING || m->str.len <= r->length) return 0;
    int32_t n = (int32_t)r->length;
    while (n > 0 && (m->str.ptr[n] & 0xc0) == 0x80) n--; /* never split a character */
    m->str.len = n;
    return 1;
}

/* Applies `r` to `doc`: 1 changed, 0 unchanged, -1 drop, -2 out of memory. */
static inline __attribute__((always_inline)) int apply(const rule *r, sluice_json *doc) {
    sluice_bytes last = r->seg[r->nseg - 1];
    sluice_json *parent, *when_parent;
    sluice_json *m = find_path(doc, r->seg, r->nseg, r->k0, &parent);
    const sluice_json *tested_member =
        r->when_seg == r->seg ? m : find_path(doc, r->when_seg, r->when_nseg, r->when_k0, &when_parent);
    if (r->when >= W_EQUALS && !settle((sluice_json *)tested_member)) return -2;
    if (!matches(r, tested_member)) return 0;
    if (r->action == A_DROP) return -1;
    switch (r->action) {
    case A_SET:
        if (parent == NULL) return 0;
        if (m == NULL) {
            m = (sluice_json *)sluice_malloc(sizeof(sluice_json));
            if (m == NULL) return -2;
            m->key = last;
            m->next = NULL;
            sluice_json **link = &parent->child;
            while (*link) link = &(*link)->next;
            *link = m;
            if (r->nseg == 1 && r->k0 >= 0) top_set(r->k0, m);
            parent->count++;
        }
        const sluice_json *v = r->value;
        if (v->child != NULL && (v = copy_tree(v)) == NULL) return -2;
        m->type = v->type;
        m->str = v->str;
        m->count = v->count;
        m->child = v->child;
        count(C_SET);
        return 1;
    case A_REMOVE:
        if (m == NULL) return 0;
        unlink_all(parent, last);
        if (r->nseg == 1 && r->k0 >= 0) top_set(r->k0, NULL);
        count(C_REMOVED);
        return 1;
    case A_RENAME:
        if (m == NULL) return 0;
        if (eq(last, r->to)) return 0;
        unlink_all(parent, r->to);
        m->key = r->to;
        if (r->nseg == 1 && r->k0 >= 0) { /* the top level changed: the new name, and the old
                                              * one's earlier duplicate if any */
            top_set(r->to_k, m);
            top_set(r->k0, member(doc, last));
        }
        count(C_RENAMED);
        return 1;
    case A_HASH: {
        if (m == NULL) return 0;
        int rc = hash_member(r, m);
        if (rc > 0) count(C_HASHED);
        return rc;
    }
    default: { /* A_TRUNCATE */
        int rc = truncate_member(r, m);
        if (rc > 0) count(C_TRUNCATED);
        return rc;
    }
    }
}

/* The last segments of the rules' tested fields: the names a value must mention to change. */
static sluice_bytes tested[MAX_RULES];
static int ntested;
static int tested_quote; /* a tested name holds a quote: look for it byte by byte */

/* Whether `name` occurs in `v` as a quoted string ("name"). */
static int mentions(sluice_bytes v, sluice_bytes name) {
    for (int32_t i = 0; i + name.len + 1 < v.len; i++) {
        if (v.ptr[i] != '"' || v.ptr[i + name.len + 1] != '"') continue;
        if (sluice_eq(sluice_bytes_of(v.ptr + i + 1, (size_t)name.len), name)) return 1;
    }
    return 0;
}

/* A value that no rule can change: names in JSON appear as they are unless escaped, so with
 * no backslash in the text, a name it does not contain in quotes is not a member of it. One
 * pass: a name without a quote in it can only sit between two consecutive quotes. The quotes
 * and backslashes are found 16 bytes at a time (a byte loop cost ~1 ns a byte, as much as
 * parsing the value). */
__attribute__((always_inline)) static inline int unmentioned(sluice_bytes v) {
    if (!skip_unmentioned) return 0;
    const uint8_t *base = v.ptr, *open = NULL;
    int32_t n = v.len;
    /* The common answer first, without a loop: the value's first name, in its first 16 bytes,
     * is one the rules test (the loop below would answer the same at its first two quotes). */
    if (n >= 16) {
        v128_t x = wasm_v128_load(base);
        uint32_t quotes = (uint32_t)wasm_i8x16_bitmask(wasm_i8x16_eq(x, wasm_i8x16_splat('"')));
        if (wasm_i8x16_bitmask(wasm_i8x16_eq(x, wasm_i8x16_splat('\\')))) return 0;
        uint32_t rest = quotes & (quotes - 1);
        if (rest) {
            int32_t q0 = __builtin_ctz(quotes), q1 = __builtin_ctz(rest);
            if (find_in(tested_tab, tested, ntested, base + q0 + 1, q1 - q0 - 1) >= 0) return 0;
        }
    }
    for (int32_t i = 0; i < n; i += 16) {
        uint32_t quotes = 0, escapes = 0;
        if (n - i >= 16) {
            v128_t x = wasm_v128_load(base + i);
            quotes = (uint32_t)wasm_i8x16_bitmask(wasm_i8x16_eq(x, wasm_i8x16_splat('"')));
            escapes = (uint32_t)wasm_i8x16_bitmask(wasm_i8x16_eq(x, wasm_i8x16_splat('\\')));
        } else {
            for (int32_t k = i; k < n; k++) {
                quotes |= (uint32_t)(base[k] == '"') << (k - i);
                escapes |= (uint32_t)(base[k] == '\\') << (k - i);
            }
        }
        if (escapes) return 0;
        for (; quotes; quotes &= quotes - 1) {
            const uint8_t *p = base + i + __builtin_ctz(quotes);
            if (open != NULL &&
                find_in(tested_tab, tested, ntested, open + 1, (int32_t)(p - open - 1)) >= 0)
                return 0;
            open = p;
        }
    }
    if (tested_quote)
        for (int t = 0; t < ntested; t++)
            if (mentions(v, tested[t])) return 0;
    return 1;
}

/* ---------------------------------------------------------------- one pass: read and write */

/* When every rule looks at one top-level member only (no dots in its paths, its condition on
 * the member it acts on, or a drop's condition on any member) and only removes, hashes,
 * truncates or drops, a member's fate depends on that member alone: its rules can run the
 * moment it is read, and it is written to the output in the same pass, with no tree and no
 * second walk. The rules of one member keep their order, and every counter is counted at the
 * record's end in rule order, so decisions, values and counters are the tree path's. A record
 * where a member a rule names appears twice (the last one counts, known only at the end) goes
 * to the tree path. Set up at load (sluice_on_config). */
static int stream_ok;
static uint8_t pipe_rules[MAX_RULES];  /* rule indexes by the member they test, in rule order */
static uint8_t pipe_start[65];         /* name index k's rules: pipe_rules[pipe_start[k]..[k+1]) */
static uint8_t missing_drop[MAX_RULES]; /* drop rules that test `exists: false` */
static int nmissing_drop;

/* Rule i on the member *mp: 0 go on with the next rule, 1 stop (a drop holds), -2 out of
 * memory. */
static inline __attribute__((always_inline)) int run_member_rule(int i, sluice_json **mp,
                                                                 uint64_t *fired, int *drop_at) {
    const rule *r = &rules[i];
    sluice_json *m = *mp;
    if (r->when >= W_EQUALS && !settle(m)) return -2;
    if (!matches(r, m)) return 0;
    int rc;
    switch (r->action) {
    case A_DROP:
        if (i < *drop_at) *drop_at = i;
        return 1; /* the record ends at this rule: later ones change nothing it keeps */
    case A_REMOVE:
        if (m == NULL) return 0;
        *mp = NULL;
        rc = 1;
        break;
    case A_HASH:
        if (m == NULL) return 0;
        rc = hash_member(r, m);
        break;
    default: rc = truncate_member(r, m); break;
    }
    if (rc < 0) return -2;
    if (rc > 0) *fired |= 1ull << i;
    return 0;
}

/* Runs name k's rules on the member *mp (NULL: missing): *mp becomes NULL when removed.
 * Sets bit i of *fired for each rule i that changed it and lowers *drop_at to the first drop
 * rule that holds. 0, or -2 out of memory. The first rule runs before the loop: most members
 * have one, and then the loop (and wasmtime's epoch check on entering it) is skipped. */
static inline __attribute__((always_inline)) int run_member_rules(int k, sluice_json **mp,
                                                                  uint64_t *fired, int *drop_at) {
    int at = pipe_start[k], end = pipe_start[k + 1];
    if (at >= end) return 0;
    int rc = run_member_rule(pipe_rules[at], mp, fired, drop_at);
    if (rc) return rc < 0 ? -2 : 0;
    for (at++; at < end; at++) {
        rc = run_member_rule(pipe_rules[at], mp, fired, drop_at);
        if (rc) return rc < 0 ? -2 : 0;
    }
    return 0;
}

/* A member's name and colon, with the comma before every member but the first. */
static inline __attribute__((always_inline)) void put_name(sluice_buf *b, sluice_bytes key, int first) {
    if (key.ptr >= src_lo && key.ptr + key.len <= src_hi) { /* read from the value unescaped */
        if (!room(b, (uint32_t)key.len + 4u)) return;
        if (!first) b->ptr[b->len++] = ',';
        b->ptr[b->len++] = '"';
        copy_bytes(b->ptr + b->len, key.ptr, key.len);
        b->len += (uint32_t)key.len;
        b->ptr[b->len++] = '"';
        b->ptr[b->len++] = ':';
    } else {
        if (!first) sluice_buf_putc(b, ',');
        put_string(b, key);
        sluice_buf_putc(b, ':');
    }
}

/* The counters of the rules in `fired` below rule `below`, in rule order (as the tree path
 * counts them, one rule after the other). */
static void count_fired(uint64_t fired, int below) {
    for (; fired; fired &= fired - 1) {
        int i = __builtin_ctzll(fired);
        if (i >= below) break;
        count(counter_of[rules[i].action]);
    }
}

static void end_run(void) {
    if (run_repeats)
        for (uint64_t f = run_fired; f; f &= f - 1)
            counts[counter_of[rules[__builtin_ctzll(f)].action]] += run_repeats;
    run_repeats = 0;
    run_fired = 0;
}

/* A rewritten record's counters: a repeat of the run's rules is one compare. */
static inline __attribute__((always_inline)) void count_rewrite(uint64_t fired) {
    if (fired == run_fired) {
        run_repeats++;
        return;
    }
    end_run();
    run_fired = fired;
    count_fired(fired, MAX_RULES);
}

enum { STREAM_DONE, STREAM_TREE };

/* A batch's records mostly share one layout: the member at a given place has the name the
 * previous record had there. guess[i] is that name's index for the i-th member (-1: none, or a
 * name no rule looks at), and key_pat[k] name k's key as compact JSON text ('"' name '"' ':',
 * zeros after it): one 16-byte compare reads a guessed member's key and colon where the string
 * scan, the name look-up and the colon's checks took ~50 instructions. The compared bytes hold no
 * quote, backslash, control or non-ASCII byte before the closing quote, so the string scan would
 * have read the same plain key and find_name answered k (names are unique). out_pat[k] is the
 * key as written, ',' '"' name '"' ':' (one 16-byte store). Names of up to 12 bytes. */
#define KEY_GUESSES 16
static int8_t guess[KEY_GUESSES];
/* The same for a member with the bytes before it: sep_pat[i] the previous record's bytes from
 * the end of member i-1's value to the start of member i's (',', the key, ':' and whitespace,
 * at most 16), sep_mask[i] their bits, sep_k[i] the key's name index (-1: no guess),
 * sep_name[i] where the name starts in them. Those bytes, the same, are parsed the same way:
 * one compare stands for the separator's and the key's checks. */
static v128_t sep_pat[KEY_GUESSES];
static uint32_t sep_mask[KEY_GUESSES];
static int8_t sep_k[KEY_GUESSES];
static uint8_t sep_len[KEY_GUESSES], sep_name[KEY_GUESSES];
static v128_t key_pat[64], out_pat[64];
static uint32_t key_mask[64]; /* the compared bytes' bits; 0: name k is not guessed */

static void set_key_patterns(void) {
    for (int i = 0; i < KEY_GUESSES; i++) guess[i] = sep_k[i] = -1;
    for (int k = 0; k < 64; k++) {
        key_mask[k] = 0;
        if (k >= nnames || names[k].len > 12) continue;
        uint8_t pat[16] = {0}, put[16] = {0};
        int ok = 1;
        for (int32_t i = 0; i < names[k].len; i++) {
            uint8_t c = names[k].ptr[i];
            if (c < 0x20 || c >= 0x80 || c == '"' || c == '\\') ok = 0;
            pat[1 + i] = put[2 + i] = c;
        }
        if (!ok) continue;
        pat[0] = pat[names[k].len + 1] = '"';
        pat[names[k].len + 2] = ':';
        put[0] = ',';
        put[1] = put[names[k].len + 2] = '"';
        put[names[k].len + 3] = ':';
        key_pat[k] = wasm_v128_load(pat);
        out_pat[k] = wasm_v128_load(put);
        key_mask[k] = (1u << (names[k].len + 3)) - 1u;
    }
}

/* Whitespace as ws, with the one space after a comma or colon (json.dumps' default) stepped
 * over in line: sl__ws is a call. */
static inline __attribute__((always_inline)) void ws1(sl__jp *j) {
    if (j->p < j->end && *j->p == ' ') j->p++;
    if (j->p < j->end && *j->p <= ' ') sl__ws(j);
}

/* The record's value read and, where rules change it, written in one pass (see stream_ok).
 * STREAM_TREE when the tree path must decide (a named member repeated); else *d is the
 * decision. Not inlined into sluice_on_record: in one function with the tree path, wasmtime's
 * code kept spilling and reloading this loop's values (the memory base, the scan's constants)
 * around every step; on its own it ran ~5 % faster on the bench. */
__attribute__((noinline)) static int stream_record(const sluice_record *rec, sluice_decision *d) {
    if (unmentioned(rec->value)) { /* here, not in the records loop: one call a record */
        *d = sluice_keep();
        return STREAM_DONE;
    }
    sl__jp j = {rec->value.ptr, rec->value.ptr + rec->value.len, NULL, 0};
    ws1(&j);
    if (j.p >= j.end || *j.p != '{') { /* not an object (valid or not): as parse_doc says */
        count(C_NOT_JSON_OBJECT);
        *d = sluice_keep();
        return STREAM_DONE;
    }
    nodes_used = 0; /* the previous record's nodes are done with */
    src_lo = rec->value.ptr;
    src_hi = rec->value.ptr + rec->value.len;
    uint32_t first = npending; /* this record's queued hashes start here */
    sluice_buf out;
    if (have_spare) {
        out = spare;
        out.len = 0;
        have_spare = 0;
    } else {
        sluice_buf_init(&out, (uint32_t)rec->value.len + 64);
    }
    uint64_t seen = 0, fired = 0;
    int drop_at = MAX_RULES, written = 0;
    if (room(&out, 1)) out.ptr[out.len++] = '{';
    j.p++;
    j.depth = 1;
    ws1(&j);
    if (j.p < j.end && *j.p == '}') {
        j.p++;
    } else {
        const uint8_t *sep = NULL; /* where the bytes before member `at` began: its separator */
        for (uint32_t at = 0;; at++) {
            ws1(&j);
            if (j.p >= j.end || *j.p != '"') goto invalid;
            sluice_bytes key;
            int k = at < KEY_GUESSES ? guess[at] : -1;
            if (k >= 0 && j.end - j.p >= 16 &&
                ((uint32_t)wasm_i8x16_bitmask(wasm_i8x16_eq(wasm_v128_load(j.p), key_pat[k])) &
                 key_mask[k]) == key_mask[k]) {
                key = sluice_bytes_of(j.p + 1, (size_t)names[k].len);
                j.p += names[k].len + 3;
            } else {
                if (!read_string(&j, &key)) goto invalid;
                ws1(&j);
                if (j.p >= j.end || *j.p != ':') goto invalid;
                j.p++;
                k = find_name(key);
                if (at < KEY_GUESSES) guess[at] = (int8_t)(k >= 0 && key_mask[k] ? k : -1);
            }
            ws1(&j);
            if (j.p >= j.end) goto invalid;
            if (sep != NULL && at < KEY_GUESSES) { /* the separator and key, for the next record */
                int ok = k >= 0 && key_mask[k] && j.p - sep <= 16 && j.end - sep >= 16 &&
                         key.ptr >= sep && key.ptr + key.len <= j.p;
                sep_k[at] = (int8_t)(ok ? k : -1);
                if (ok) {
                    sep_pat[at] = wasm_v128_load(sep);
                    sep_len[at] = (uint8_t)(j.p - sep);
                    sep_name[at] = (uint8_t)(key.ptr - sep);
                    sep_mask[at] = (1u << (j.p - sep)) - 1u;
                }
            }
        member:
            if (k < 0) { /* no rule looks at it: its text, compact */
                const uint8_t *start = j.p;
                uint8_t c = *j.p;
                int compact = 1;
                if (c == '"') {
                    if (!scan_string(&j, &compact)) goto invalid;
                } else if (c == '-' || (c >= '0' && c <= '9')) {
                    if (!read_number(&j)) goto invalid;
                } else if (c == 't' || c == 'f' || c == 'n') {
                    if (!sl__jlit(&j, c == 't' ? "true" : c == 'f' ? "false" : "null")) goto invalid;
                } else if (!skip_value(&j, &compact)) {
                    goto invalid;
                }
                put_name(&out, key, written++ == 0);
                if (compact) put_bytes(&out, start, (int32_t)(j.p - start));
                else put_minified(&out, sluice_bytes_of(start, (size_t)(j.p - start)));
            } else {
                if (seen >> k & 1) goto tree; /* a repeated name: the last one counts */
                seen |= 1ull << k;
                sluice_json *m = parse_value(&j, 1);
                if (m == NULL) goto invalid;
                if (run_member_rules(k, &m, &fired, &drop_at) < 0) goto oom;
                if (m != NULL) {
                    if (key_mask[k] && room(&out, 16)) { /* the key as one store (see guess) */
                        uint32_t lead = written++ == 0; /* then the byte before is the '{' */
                        wasm_v128_store(out.ptr + out.len - lead, out_pat[k]);
                        if (lead) out.ptr[out.len - 1] = '{';
                        out.len += (uint32_t)names[k].len + 4u - lead;
                    } else {
                        put_name(&out, key, written++ == 0);
                    }
                    writing_output = 1;
                    put_node(&out, m);
                    writing_output = 0;
                }
            }
            sep = j.p;
            if (at + 1 < KEY_GUESSES && sep_k[at + 1] >= 0 && j.end - j.p >= 16 &&
                ((uint32_t)wasm_i8x16_bitmask(wasm_i8x16_eq(wasm_v128_load(j.p), sep_pat[at + 1])) &
                 sep_mask[at + 1]) == sep_mask[at + 1]) { /* the next member as guessed (sep_pat) */
                at++;
                k = sep_k[at];
                key = sluice_bytes_of(j.p + sep_name[at], (size_t)names[k].len);
                j.p += sep_len[at];
                ws(&j);
                if (j.p >= j.end) goto invalid;
                goto member;
            }
            ws1(&j);
            if (j.p >= j.end) goto invalid;
            if (*j.p == ',') {
                j.p++;
                continue;
            }
            if (*j.p == '}') {
                j.p++;
                break;
            }
            goto invalid;
        }
    }
    int32_t rest = (int32_t)(j.end - j.p);
    if (rest > 0 && rest <= 8 && j.end - rec->value.ptr >= 8) { /* up to 8 spaces: one load */
        uint32_t shift = 8u * (uint32_t)(8 - rest);
        if (ld64(j.end - 8) >> shift == 0x2020202020202020ull >> shift) j.p = j.end;
    }
    while (j.end - j.p >= 8 && ld64(j.p) == 0x2020202020202020ull) j.p += 8; /* space padding */
    ws1(&j);
    if (j.p != j.end) goto invalid;
    for (int t = 0; t < nmissing_drop; t++) { /* `exists: false` on a member never read */
        int i = missing_drop[t];
        if (!(seen >> rules[i].when_k0 & 1) && i < drop_at) drop_at = i;
    }
    if (drop_at < MAX_RULES) {
        count_fired(fired, drop_at);
        count(C_DROPPED);
        npending = first;
        spare = out;
        have_spare = !out.failed;
        *d = sluice_drop();
        return STREAM_DONE;
    }
    if (fired == 0) {
        spare = out;
        have_spare = !out.failed;
        *d = sluice_keep();
        return STREAM_DONE;
    }
    count_rewrite(fired);
    if (room(&out, 1)) out.ptr[out.len++] = '}';
    if (out.failed) {
        *d = sluice_error("rules: out of memory");
        return STREAM_DONE;
    }
    /* the output is final: placeholders stay put (the first one before the loop: a record
     * hashes one field, mostly) */
    if (first < npending) {
        if (pending[first].off >= 0) pending[first].out = out.ptr + pending[first].off;
        for (uint32_t i = first + 1; i < npending; i++)
            if (pending[i].off >= 0) pending[i].out = out.ptr + pending[i].off;
    }
    *d = sluice_rewrite_value(rec, sluice_buf_bytes(&out));
    return STREAM_DONE;
invalid: /* not one valid JSON text: kept and counted, no rule counted (parse_doc's verdict) */
    npending = first;
    spare = out;
    have_spare = !out.failed;
    count(C_NOT_JSON_OBJECT);
    *d = sluice_keep();
    return STREAM_DONE;
oom:
    *d = sluice_error("rules: out of memory");
    return STREAM_DONE;
tree:
    npending = first;
    spare = out;
    have_spare = !out.failed;
    return STREAM_TREE;
}

/* The tree path: the value parsed into nodes where rules look, every rule applied in order,
 * the tree written back. Out of line: sluice_on_record is inlined into the SDK's records
 * loop, which should carry only the checks and the one-pass call. */
__attribute__((noinline)) static sluice_decision tree_record(const sluice_record *rec) {
    sluice_json *doc = parse_doc(rec->value);
    src_lo = rec->value.ptr;
    src_hi = rec->value.ptr + rec->value.len;
    if (doc == NULL || doc->type != SLUICE_JSON_OBJECT) {
        count(C_NOT_JSON_OBJECT);
        return sluice_keep();
    }
    int changed = 0;
    uint32_t first = npending; /* this record's queued hashes start here */
    for (int i = 0; i < nrules; i++) {
        int rc = apply(&rules[i], doc);
        if (rc == -1) {
            count(C_DROPPED);
            return sluice_drop();
        }
        if (rc == -2) return sluice_error("rules: out of memory");
        changed |= rc;
    }
    if (!changed) return sluice_keep();
    sluice_buf out;
    sluice_buf_init(&out, (uint32_t)rec->value.len + 64);
    writing_output = 1;
    put_json(&out, doc);
    writing_output = 0;
    if (out.failed) return sluice_error("rules: out of memory");
    for (uint32_t i = first; i < npending; i++) /* the output is final: placeholders stay put */
        if (pending[i].off >= 0) pending[i].out = out.ptr + pending[i].off;
    return sluice_rewrite_value(rec, sluice_buf_bytes(&out));
}

/* A value no rule can change is kept unparsed (unmentioned), else the tree path decides. */
__attribute__((noinline)) static sluice_decision checked_tree_record(const sluice_record *rec) {
    if (unmentioned(rec->value)) return sluice_keep();
    return tree_record(rec);
}

sluice_decision sluice_on_record(const sluice_record *rec) {
    if (sluice_is_null(rec->value) || nrules == 0) return sluice_keep();
    if (stream_ok) { /* stream_record asks unmentioned first */
        sluice_decision d;
        if (stream_record(rec, &d) == STREAM_DONE) return d;
        return tree_record(rec);
    }
    return checked_tree_record(rec);
}

/* ---------------------------------------------------------------- configuration */

static sluice_buf errbuf;

static int refuse(int i, const char *field, const char *reason) {
    sluice_buf_init(&errbuf, 128);
    sluice_buf_puts(&errbuf, "rules[");
    sluice_buf_put_int(&errbuf, i);
    sluice_buf_puts(&errbuf, "]");
    if (field[0]) {
        sluice_buf_putc(&errbuf, '.');
        sluice_buf_puts(&errbuf, field);
    }
    sluice_buf_puts(&errbuf, ": ");
    sluice_buf_puts(&errbuf, reason);
    sluice_set_error_bytes(sluice_buf_bytes(&errbuf));
    return 1;
}

static int valid_path(sluice_bytes p) {
    if (p.len <= 0 || p.ptr[0] == '.' || p.ptr[p.len - 1] == '.') return 0;
    for (int32_t i = 1; i < p.len; i++)
        if (p.ptr[i] == '.' && p.ptr[i - 1] == '.') return 0;
    return 1;
}

static int is_scalar(const sluice_json *n) {
    return n->type != SLUICE_JSON_OBJECT && n->type != SLUICE_JSON_ARRAY;
}

static const char *const ACTIONS[] = {"set", "remove", "rename", "hash", "truncate", "drop"};

int sluice_on_config(const sluice_json *config) {
    static const char *const keys[] = {"field", "action", "when", "value", "to", "salt", "length"};
    nrules = 0;
    if (config == NULL || config->type == SLUICE_JSON_NULL) return 0;
    if (config->type != SLUICE_JSON_OBJECT) {
        sluice_set_error("config: must be a mapping");
        return 1;
    }
    for (const sluice_json *k = config->child; k; k = k->next) {
        if (!sluice_eq_str(k->key, "rules")) {
            sluice_set_error("config: unknown field (expected rules)");
            return 1;
        }
    }
    const sluice_json *list = sluice_json_get(config, "rules");
    if (list == NULL) return 0;
    if (list->type != SLUICE_JSON_ARRAY) {
        sluice_set_error("rules: must be a list of rules");
        return 1;
    }
    if (list->count > MAX_RULES) {
        sluice_set_error("rules: at most 64 rules");
        return 1;
    }
    int i = 0;
    for (const sluice_json *item = list->child; item; item = item->next, i++) {
        rule *r = &rules[i];
        if (item->type != SLUICE_JSON_OBJECT) return refuse(i, "", "each rule must be a mapping");
        for (const sluice_json *k = item->child; k; k = k->next) {
            int known = 0;
            for (unsigned j = 0; j < sizeof keys / sizeof keys[0]; j++)
                known |= sluice_eq_str(k->key, keys[j]);
            if (!known) return refuse(i, "", "unknown field (expected field, action, when, value, to, salt, length)");
        }
        r->field = sluice_json_string(sluice_json_get(item, "field"));
        if (sluice_is_null(r->field) || !valid_path(r->field))
            return refuse(i, "field", "required: a field name or dotted path such as user.email");
        sluice_bytes action = sluice_json_string(sluice_json_get(item, "action"));
        r->action = -1;
        for (int a = 0; a < 6; a++)
            if (sluice_eq_str(action, ACTIONS[a])) r->action = a;
        if (r->action < 0)
            return refuse(i, "action", "required: one of set, remove, rename, hash, truncate, drop");
        /* what each action needs, and nothing another action needs */
        const sluice_json *value = sluice_json_get(item, "value");
        const sluice_json *to = sluice_json_get(item, "to");
        const sluice_json *salt = sluice_json_get(item, "salt");
        const sluice_json *length = sluice_json_get(item, "length");
        if ((value != NULL) != (r->action == A_SET))
            return refuse(i, "value", r->action == A_SET ? "required by set" : "only set takes a value");
        if ((to != NULL) != (r->action == A_RENAME))
            return refuse(i, "to", r->action == A_RENAME ? "required by rename" : "only rename takes to");
        if (salt != NULL && r->action != A_HASH) return refuse(i, "salt", "only hash takes a salt");
        if ((length != NULL) != (r->action == A_TRUNCATE))
            return refuse(i, "length", r->action == A_TRUNCATE ? "required by truncate" : "only truncate takes a length");
        r->value = value;
        if (to != NULL) {
            sluice_bytes t = sluice_json_string(to);
            if (sluice_is_null(t) || t.len == 0) return refuse(i, "to", "must be a non-empty string");
            /* `to` may repeat the parent path (user.name -> user.display_name) */
            int32_t dot = r->field.len - 1;
            while (dot >= 0 && r->field.ptr[dot] != '.') dot--;
            int32_t tdot = t.len - 1;
            while (tdot >= 0 && t.ptr[tdot] != '.') tdot--;
            if (tdot >= 0 && (tdot != dot || !sluice_eq(sluice_bytes_of(t.ptr, (size_t)tdot),
                                                        sluice_bytes_of(r->field.ptr, (size_t)dot))))
                return refuse(i, "to", "rename keeps the field in its object: give a new name, or the same parent path");
            r->to = sluice_bytes_of(t.ptr + tdot + 1, (size_t)(t.len - tdot - 1));
            if (r->to.len == 0) return refuse(i, "to", "must be a non-empty string");
        }
        r->salt = sluice_str("");
        if (salt != NULL) {
            r->salt = sluice_json_string(salt);
            if (sluice_is_null(r->salt)) return refuse(i, "salt", "must be a string");
        }
        if (r->action == A_HASH) salt_init(&r->hash, r->salt);
        if (length != NULL && (!sluice_json_int(length, 0, &r->length) || r->length < 0 ||
                               length->type != SLUICE_JSON_NUMBER))
            return refuse(i, "length", "must be a whole number of bytes, 0 or more");
        r->when = W_DEFAULT;
        r->when_field = r->field;
        const sluice_json *when = sluice_json_get(item, "when");
        if (when != NULL) {
            if (when->type != SLUICE_JSON_OBJECT)
                return refuse(i, "when", "must be a mapping: exists, equals, prefix or contains (and field)");
            int tests = 0;
            for (const sluice_json *k = when->child; k; k = k->next) {
                if (sluice_eq_str(k->key, "field")) {
                    r->when_field = sluice_json_string(k);
                    if (sluice_is_null(r->when_field) || !valid_path(r->when_field))
                        return refuse(i, "when.field", "must be a field name or dotted path");
                } else if (sluice_eq_str(k->key, "exists")) {
                    if (k->type != SLUICE_JSON_TRUE && k->type != SLUICE_JSON_FALSE)
                        return refuse(i, "when.exists", "must be true or false");
                    r->when = k->type == SLUICE_JSON_TRUE ? W_EXISTS : W_MISSING;
                    tests++;
                } else if (sluice_eq_str(k->key, "equals")) {
                    if (!is_scalar(k))
                        return refuse(i, "when.equals", "must be a string, number, true, false or null");
                    r->when = W_EQUALS;
                    r->operand = k;
                    tests++;
                } else if (sluice_eq_str(k->key, "prefix") || sluice_eq_str(k->key, "contains")) {
                    r->text = sluice_json_string(k);
                    if (sluice_is_null(r->text))
                        return refuse(i, sluice_eq_str(k->key, "prefix") ? "when.prefix" : "when.contains",
                                      "must be a string");
                    r->when = sluice_eq_str(k->key, "prefix") ? W_PREFIX : W_CONTAINS;
                    tests++;
                } else {
                    return refuse(i, "when", "unknown test (expected exists, equals, prefix, contains, field)");
                }
            }
            if (tests != 1)
                return refuse(i, "when", "needs exactly one of exists, equals, prefix, contains");
        }
        r->seg = split_path(r->field, &r->nseg);
        r->when_seg = r->seg;
        r->when_nseg = r->nseg;
        if (r->when_field.ptr != r->field.ptr || r->when_field.len != r->field.len)
            r->when_seg = split_path(r->when_field, &r->when_nseg);
        if (r->seg == NULL || r->when_seg == NULL) {
            sluice_set_error("rules: out of memory");
            return 1;
        }
    }
    nrules = i;
    for (int b = 0; b < 256; b++) {
        static const char hex[] = "0123456789abcdef";
        uint8_t pair[2] = {(uint8_t)hex[b >> 4], (uint8_t)hex[b & 15]};
        __builtin_memcpy(&hex_pairs[b], pair, 2);
    }
    nnames = 0;
    all_names = 0;
    for (int r = 0; r < nrules; r++) {
        add_path_names(rules[r].field);
        add_path_names(rules[r].when_field);
        if (rules[r].action == A_RENAME) add_path_names(rules[r].to);
    }
    ntested = 0;
    tested_quote = 0;
    for (int r = 0; r < nrules; r++) {
        sluice_bytes f = rules[r].when_field;
        int32_t dot = f.len - 1;
        while (dot >= 0 && f.ptr[dot] != '.') dot--;
        tested[ntested++] = sluice_bytes_of(f.ptr + dot + 1, (size_t)(f.len - dot - 1));
        for (int32_t i = dot + 1; i < f.len; i++) tested_quote |= f.ptr[i] == '"';
    }
    for (int k = 0; k < 64; k++) name_tab[k] = tested_tab[k] = 0;
    for (int k = 0; k < nnames; k++) tab_add(name_tab, names[k], k);
    for (int k = 0; k < ntested; k++) tab_add(tested_tab, tested[k], k);
    for (int i = 0; i < nrules; i++) {
        rule *r = &rules[i];
        r->k0 = all_names ? -1 : find_name(r->seg[0]);
        r->when_k0 = all_names ? -1 : find_name(r->when_seg[0]);
        r->to_k = all_names || r->action != A_RENAME ? -1 : find_name(r->to);
        if (r->action == A_RENAME && r->to_k < 0) r->k0 = -1; /* cannot happen: `to` is a name */
    }
    skip_unmentioned = 1;
    for (int r = 0; r < nrules; r++)
        if (rules[r].action == A_SET || rules[r].when == W_MISSING) skip_unmentioned = 0;
    /* the one-pass path (stream_record): each rule on one top-level member */
    stream_ok = nrules > 0 && !all_names && nnames <= 64;
    for (int i = 0; i < nrules; i++) {
        const rule *r = &rules[i];
        if (r->nseg != 1 || r->when_nseg != 1 || r->when_k0 < 0 || r->action == A_SET ||
            r->action == A_RENAME || (r->action != A_DROP && r->when_k0 != r->k0))
            stream_ok = 0;
    }
    nmissing_drop = 0;
    set_key_patterns();
    if (stream_ok) { /* each name's rules, in rule order */
        for (int k = 0; k <= 64; k++) pipe_start[k] = 0;
        for (int i = 0; i < nrules; i++) pipe_start[rules[i].when_k0 + 1]++;
        for (int k = 0; k < 64; k++) pipe_start[k + 1] = (uint8_t)(pipe_start[k + 1] + pipe_start[k]);
        uint8_t next[64];
        for (int k = 0; k < 64; k++) next[k] = pipe_start[k];
        for (int i = 0; i < nrules; i++) {
            pipe_rules[next[rules[i].when_k0]++] = (uint8_t)i;
            if (rules[i].action == A_DROP && rules[i].when == W_MISSING)
                missing_drop[nmissing_drop++] = (uint8_t)i;
        }
    }
    return 0;
}
#pragma clang attribute pop
