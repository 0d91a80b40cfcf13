/* Whole-value record encryption over a Kafka records section, one call per batch.
 *
 * Compiled at install (crypto/batch_seal_build.py, cffi API mode) against OpenSSL's libcrypto:
 * AES-256-GCM through the EVP interface (which uses the CPU's AES and carry-less multiply
 * instructions) and SHA-256 for the record digest. The Python reference is
 * crypto/envelope.py + crypto/record_filter.py; the layout and the associated data written
 * here are exactly the reference's (layout 3 today, layout 2 still opened; the proxy's header
 * group is built by the caller), byte for byte (docs/ENCRYPTION.md).
 *
 * Input sections were checked by the codec before any filter sees them, but every length is
 * still bounds-checked here: a malformed section returns SB_MALFORMED, never reads past it.
 */
#include <stdint.h>
#include <stdlib.h>
#include <limits.h>
#include <string.h>
#include <pthread.h>
#include <openssl/evp.h>
#include <openssl/sha.h>
#include <openssl/err.h>
#include <openssl/rand.h>
#include <openssl/crypto.h>
#include <openssl/opensslv.h>
#ifdef __SSE2__
#include <emmintrin.h>
#endif

#define SB_MALFORMED (-1)  /* the section is not `count` well-formed records */
#define SB_SLOW (-2)       /* a record this code does not handle: use the reference path */
#define SB_TAMPERED (-3)   /* a record failed authentication (its index in *where) */
#define SB_CRYPTO (-4)     /* OpenSSL failed */
#define SB_SPACE (-5)      /* the output buffer is too small (a bug of the caller) */
#define SB_PLAN (-6)       /* a field plan that does not fit this section (a bug of the caller) */

#define NONCE 12
#define TAG 16

typedef struct {
    const uint8_t *p;
    const uint8_t *end;
} cursor;

/* Inlined, with a first test for the one-byte varint (lengths and counts under 64, most of
 * them): the record parse reads several per record and was a tenth of a fields-mode fetch. */
static inline __attribute__((always_inline)) int rd_varint(cursor *c, int64_t *out) {
    if (c->p < c->end && *c->p < 0x80) {
        uint64_t b = *c->p++;
        *out = (int64_t)((b >> 1) ^ (~(b & 1) + 1));
        return 0;
    }
    uint64_t v = 0;
    int shift = 0;
    while (c->p < c->end && shift < 64) {
        uint8_t b = *c->p++;
        v |= (uint64_t)(b & 0x7f) << shift;
        if (!(b & 0x80)) {
            *out = (int64_t)((v >> 1) ^ (~(v & 1) + 1));  /* zigzag */
            return 0;
        }
        shift += 7;
    }
    return -1;
}

static size_t varint_len(int64_t value) {
    uint64_t v = ((uint64_t)value << 1) ^ (uint64_t)(value >> 63);
    size_t n = 1;
    while (v > 0x7f) {
        v >>= 7;
        n++;
    }
    return n;
}

static uint8_t *wr_varint(uint8_t *o, int64_t value) {
    uint64_t v = ((uint64_t)value << 1) ^ (uint64_t)(value >> 63);
    while (v > 0x7f) {
        *o++ = (uint8_t)((v & 0x7f) | 0x80);
        v >>= 7;
    }
    *o++ = (uint8_t)v;
    return o;
}

static void be32(uint8_t *o, uint32_t v) {
    o[0] = (uint8_t)(v >> 24);
    o[1] = (uint8_t)(v >> 16);
    o[2] = (uint8_t)(v >> 8);
    o[3] = (uint8_t)v;
}

/* Reads a length-prefixed blob (-1: null). */
static inline __attribute__((always_inline)) int rd_blob(cursor *c, const uint8_t **data, int64_t *len) {
    if (rd_varint(c, len)) return -1;
    if (*len < -1 || *len > c->end - c->p) return -1;
    *data = *len < 0 ? NULL : c->p;
    if (*len > 0) c->p += *len;
    return 0;
}

#define MAX_HEADERS 4096

typedef struct {
    const uint8_t *start;     /* first byte of the record's body (attributes) */
    const uint8_t *end;       /* one past its last byte */
    const uint8_t *key_end;   /* one past the key (attributes..key copied as is) */
    const uint8_t *key;
    int64_t key_len;
    const uint8_t *value;
    int64_t value_len;
    const uint8_t *headers;   /* first header's bytes */
    int64_t header_count;
    /* offsets of each header's start, relative to `headers`, plus one past the last */
    uint32_t hoff[MAX_HEADERS + 1];
    int32_t last_enc;         /* index of the last "sluice.enc" header, -1: none */
} record;

static const char H_ENC[] = "sluice.enc";

static int parse_record(cursor *c, record *r) {
    int64_t len, skip;
    /* Kafka's record length is an int32: past it a record is malformed, and every offset
     * inside one (hoff, a field plan's spans) fits the 32 bits kept for it, never wraps. */
    if (rd_varint(c, &len) || len < 0 || len > INT32_MAX || len > c->end - c->p) return -1;
    cursor b = {c->p, c->p + len};
    r->start = b.p;
    r->end = b.end;
    c->p = b.end;
    if (b.p >= b.end) return -1;
    b.p++; /* attributes */
    if (rd_varint(&b, &skip) || rd_varint(&b, &skip)) return -1; /* timestamp, offset delta */
    if (rd_blob(&b, &r->key, &r->key_len)) return -1;
    r->key_end = b.p;
    if (rd_blob(&b, &r->value, &r->value_len)) return -1;
    if (rd_varint(&b, &r->header_count) || r->header_count < 0) return -1;
    if (r->header_count > MAX_HEADERS) return -2;
    r->headers = b.p;
    r->last_enc = -1;
    for (int64_t i = 0; i < r->header_count; i++) {
        const uint8_t *name, *val;
        int64_t nlen, vlen;
        r->hoff[i] = (uint32_t)(b.p - r->headers);
        if (rd_blob(&b, &name, &nlen) || nlen < 0 || rd_blob(&b, &val, &vlen)) return -1;
        if (nlen == (int64_t)(sizeof(H_ENC) - 1) && memcmp(name, H_ENC, sizeof(H_ENC) - 1) == 0)
            r->last_enc = (int32_t)i;
    }
    r->hoff[r->header_count] = (uint32_t)(b.p - r->headers);
    if (b.p != b.end) return -1;
    return 0;
}

/* SHA-256 fed through a buffer: a digest's input is many small pieces (4-byte lengths, short
 * names, the document's clear pieces), and each SHA256_Update costs more than copying a few
 * bytes, so pieces are gathered here and hashed in few calls (a whole fields-mode digest of a
 * small record in one). Pieces longer than half the buffer go to SHA-256 directly. */
#define HB_ROOM 1024
typedef struct {
    SHA256_CTX h;
    size_t n;
    uint8_t buf[HB_ROOM];
} hbuf;

static void hb_init(hbuf *b) {
    SHA256_Init(&b->h);
    b->n = 0;
}

static void hb_put(hbuf *b, const void *p, size_t n) {
    if (n > HB_ROOM - b->n) {
        if (b->n) SHA256_Update(&b->h, b->buf, b->n);
        b->n = 0;
        if (n > HB_ROOM / 2) {
            SHA256_Update(&b->h, p, n);
            return;
        }
    }
    memcpy(b->buf + b->n, p, n);
    b->n += n;
}

static void hb_len(hbuf *b, size_t n) {
    uint8_t l[4];
    be32(l, (uint32_t)n);
    hb_put(b, l, 4);
}

static void hb_final(hbuf *b, uint8_t *out) {
    if (b->n) SHA256_Update(&b->h, b->buf, b->n);
    SHA256_Final(out, &b->h);
}

/* The first `n` headers of `r` as crypto/envelope.py's digests hash them: their count, then
 * per header its name's length and bytes, and 0 (null value) or 1, the value's length and
 * bytes. Both modes' digests start so. */
static void hash_headers(hbuf *h, const record *r, int64_t n) {
    hb_len(h, (size_t)n);
    for (int64_t i = 0; i < n; i++) {
        cursor c = {r->headers + r->hoff[i], r->headers + r->hoff[i + 1]};
        const uint8_t *name = NULL, *val = NULL;
        int64_t nlen = 0, vlen = -1;  /* parsed before: these reads succeed */
        rd_blob(&c, &name, &nlen);
        rd_blob(&c, &val, &vlen);
        hb_len(h, (size_t)nlen);
        hb_put(h, name, (size_t)nlen);
        if (vlen < 0) {
            hb_put(h, "\x00", 1);
        } else {
            uint8_t tag5[5] = {1};
            be32(tag5 + 1, (uint32_t)vlen);
            hb_put(h, tag5, 5);
            if (vlen) hb_put(h, val, (size_t)vlen);
        }
    }
}

/* Parses the record at `c` into `r`: its first byte in *start, its size in *raw. Returns 0,
 * or SB_SLOW (a record the reference path must read) or SB_MALFORMED. */
static long next_record(cursor *c, record *r, const uint8_t **start, size_t *raw) {
    *start = c->p;
    int p = parse_record(c, r);
    if (p) return p == -2 ? SB_SLOW : SB_MALFORMED;
    *raw = (size_t)(c->p - *start);
    return 0;
}

/* record_digest of crypto/envelope.py over the first `n` headers of `r`. */
static void headers_digest(const record *r, int64_t n, uint8_t *out) {
    hbuf h;
    hb_init(&h);
    hash_headers(&h, r, n);
    hb_final(&h, out);
}

/* What follows the prefix in aad_for(prefix, key, "", digest), written at `o`: returns the
 * end of what it wrote (room for the key + 45 bytes). */
static uint8_t *aad_tail_of(uint8_t *o, const uint8_t *key, int64_t key_len,
                            const uint8_t *digest) {
    if (key_len < 0) {
        be32(o, 1);
        o[4] = 0;
        o += 5;
    } else {
        be32(o, (uint32_t)key_len + 1);
        o[4] = 1;
        memcpy(o + 5, key, (size_t)key_len);
        o += 5 + key_len;
    }
    be32(o, 32);
    memcpy(o + 4, digest, 32);
    o += 36;
    be32(o, 0);
    return o + 4;
}

static uint8_t *aad_tail(uint8_t *o, const record *r, const uint8_t *digest) {
    return aad_tail_of(o, r->key, r->key_len, digest);
}

/* aad_for(prefix, key, "", digest): written into `aad` (room for prefix + key + 48). */
static size_t build_aad(uint8_t *aad, const uint8_t *prefix, size_t prefix_len,
                        const record *r, const uint8_t *digest) {
    memcpy(aad, prefix, prefix_len);
    return (size_t)(aad_tail(aad + prefix_len, r, digest) - aad);
}

/* ------------------------------------------------------------------ AES-256-GCM
 *
 * One EVP context per call (one data key), one message per record or field. OpenSSL 3.0
 * spends as long setting each message up as sealing a short one: EVP_CipherInit_ex with a
 * new IV forgets the context's IV length and asks the provider for it again through its
 * parameter look-up (a strcmp per parameter name it knows), and the tag goes through
 * EVP_CIPHER_CTX_ctrl, which builds a parameter list per call. Here the tag is read or
 * set through a parameter list made once per context, and the IV is handed to the provider
 * as its "TLS fixed IV" parameter with the length -1, which OpenSSL's GCM implementations
 * (the 3.x providers, the legacy EVP code before them) define as "restore the whole IV" and
 * which then works as EVP_CipherInit_ex's IV does (applied before the next message, the
 * message counter restarted). The nonce of a message must be exactly the one given: this
 * shortcut is taken only after a known-answer check against EVP_CipherInit_ex on the
 * libcrypto the process loaded (`gcm_fast_iv`), else every message goes through the init. */
#if OPENSSL_VERSION_MAJOR >= 3
#include <openssl/core_names.h>
#include <openssl/params.h>
#define GCM_PARAMS 1
#else
#define GCM_PARAMS 0
#endif

/* ------------------------------------------------------------------ AES-256-GCM on x86-64
 *
 * Whole values and fields are short (a 200-byte value is 13 blocks) and every message of a
 * call starts its associated data with the same prefix (the KEK, the wrapped data key, the
 * filter, the topic: 144 bytes, 9 blocks, in the benchmark), so through EVP about a third
 * of GHASH's input per message is that prefix again, and OpenSSL 3.0 spends a quarter of a
 * message in its parameter and provider plumbing. On x86-64 CPUs with AES-NI and PCLMULQDQ
 * the module therefore runs AES-256-GCM itself (NIST SP 800-38D, 96-bit IVs only): the
 * GHASH state after the prefix's whole blocks is computed once per call and each message
 * continues from it; the counter blocks of a message are encrypted eight at a time; GHASH
 * takes eight blocks per reduction (powers H..H^8) in the POLYVAL representation of RFC 8452
 * (a block byte-reversed, H multiplied by x once, Montgomery reduction by two carry-less
 * multiplications). Every step is the instructions' constant-time work (no table look-up,
 * no branch on secret data) and the tag is compared with CRYPTO_memcmp. The round keys and
 * powers of H live in a per-thread block cleansed at the end of each call. The code is used
 * only once a known-answer check against OpenSSL's EVP (`own_gcm_check`: messages over
 * every split of prefix, rest of the associated data and plaintext lengths that matter,
 * opened again, a wrong tag refused) agrees, else EVP runs every message as before. */
#if defined(__x86_64__) && defined(__GNUC__)
#define OWN_GCM 1
#include <immintrin.h>
#include <openssl/crypto.h>

#define OG_TGT __attribute__((target("aes,pclmul,ssse3,sse4.1")))
#define OG_POWERS 16             /* blocks per GHASH reduction in og_message */

typedef struct {
    __m128i rk[15];          /* AES-256 round keys */
    __m128i hp[OG_POWERS];   /* H^1..H^16 (POLYVAL representation, H times x) */
    __m128i hk[OG_POWERS];   /* each power's two halves XORed (Karatsuba's middle factor) */
} og_key;

/* A GHASH in progress: the state, the bytes of a partial block, how many bytes went in. */
typedef struct {
    __m128i x;
    uint8_t buf[16];
    size_t n;
    size_t total;
} og_hash;

OG_TGT static inline __m128i og_rev(__m128i v) {
    const __m128i m = _mm_set_epi8(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    return _mm_shuffle_epi8(v, m);
}

OG_TGT static inline __m128i og_expand_a(__m128i k, __m128i t) {
    t = _mm_shuffle_epi32(t, 0xff);
    k = _mm_xor_si128(k, _mm_slli_si128(k, 4));
    k = _mm_xor_si128(k, _mm_slli_si128(k, 4));
    k = _mm_xor_si128(k, _mm_slli_si128(k, 4));
    return _mm_xor_si128(k, t);
}

OG_TGT static inline __m128i og_expand_b(__m128i k, __m128i t) {
    t = _mm_shuffle_epi32(t, 0xaa);
    k = _mm_xor_si128(k, _mm_slli_si128(k, 4));
    k = _mm_xor_si128(k, _mm_slli_si128(k, 4));
    k = _mm_xor_si128(k, _mm_slli_si128(k, 4));
    return _mm_xor_si128(k, t);
}

/* The 256-bit carry-less product of a and b, in (lo, hi). */
OG_TGT static inline void og_clmul(__m128i a, __m128i b, __m128i *lo, __m128i *hi) {
    __m128i t0 = _mm_clmulepi64_si128(a, b, 0x00);
    __m128i t1 = _mm_clmulepi64_si128(a, b, 0x10);
    __m128i t2 = _mm_clmulepi64_si128(a, b, 0x01);
    __m128i t3 = _mm_clmulepi64_si128(a, b, 0x11);
    t1 = _mm_xor_si128(t1, t2);
    *lo = _mm_xor_si128(t0, _mm_slli_si128(t1, 8));
    *hi = _mm_xor_si128(t3, _mm_srli_si128(t1, 8));
}

/* Montgomery reduction of (lo, hi) modulo x^128 + x^127 + x^126 + x^121 + 1. */
OG_TGT static inline __m128i og_reduce(__m128i lo, __m128i hi) {
    const __m128i poly = _mm_set_epi64x((long long)0xc200000000000000ULL, 1);
    __m128i t = _mm_clmulepi64_si128(lo, poly, 0x10);
    lo = _mm_xor_si128(_mm_shuffle_epi32(lo, 0x4e), t);
    t = _mm_clmulepi64_si128(lo, poly, 0x10);
    lo = _mm_xor_si128(_mm_shuffle_epi32(lo, 0x4e), t);
    return _mm_xor_si128(lo, hi);
}

OG_TGT static inline __m128i og_mul(__m128i a, __m128i b) {
    __m128i lo, hi;
    og_clmul(a, b, &lo, &hi);
    return og_reduce(lo, hi);
}

OG_TGT static void og_init(og_key *k, const uint8_t *key) {
    __m128i a = _mm_loadu_si128((const __m128i *)key);
    __m128i b = _mm_loadu_si128((const __m128i *)(key + 16));
    k->rk[0] = a;
    k->rk[1] = b;
#define OG_STEP(i, rcon)                                            \
    a = og_expand_a(a, _mm_aeskeygenassist_si128(b, rcon));         \
    k->rk[i] = a;                                                   \
    b = og_expand_b(b, _mm_aeskeygenassist_si128(a, 0));            \
    k->rk[i + 1] = b;
    OG_STEP(2, 0x01) OG_STEP(4, 0x02) OG_STEP(6, 0x04) OG_STEP(8, 0x08) OG_STEP(10, 0x10)
    OG_STEP(12, 0x20)
#undef OG_STEP
    k->rk[14] = og_expand_a(a, _mm_aeskeygenassist_si128(b, 0x40));
    __m128i h = k->rk[0];
    for (int r = 1; r < 14; r++) h = _mm_aesenc_si128(h, k->rk[r]);
    h = og_rev(_mm_aesenclast_si128(h, k->rk[14]));  /* E(K, 0) as GHASH's H, reversed */
    /* H times x: shift left one bit, the top bit folded back by the polynomial */
    __m128i top = _mm_srai_epi32(_mm_shuffle_epi32(h, 0xff), 31);
    __m128i sh = _mm_or_si128(_mm_slli_epi64(h, 1), _mm_srli_epi64(_mm_slli_si128(h, 8), 63));
    h = _mm_xor_si128(sh, _mm_and_si128(top, _mm_set_epi64x((long long)0xc200000000000000ULL,
                                                            1)));
    k->hp[0] = h;
    for (int i = 1; i < OG_POWERS; i++) k->hp[i] = og_mul(k->hp[i - 1], h);
    for (int i = 0; i < OG_POWERS; i++)
        k->hk[i] = _mm_xor_si128(k->hp[i], _mm_shuffle_epi32(k->hp[i], 0x4e));
}

/* `n` whole blocks at `p` into the state `x`: eight, then four per reduction. */
OG_TGT static inline __m128i og_blocks(const og_key *k, __m128i x, const uint8_t *p, size_t n) {
    __m128i lo, hi, l, h;
#define OG_LOAD(j) og_rev(_mm_loadu_si128((const __m128i *)(p + 16 * (j))))
#define OG_ADD(j, pw)                           \
    og_clmul(OG_LOAD(j), k->hp[pw], &l, &h);    \
    lo = _mm_xor_si128(lo, l);                  \
    hi = _mm_xor_si128(hi, h);
    while (n >= 8) {
        og_clmul(_mm_xor_si128(x, OG_LOAD(0)), k->hp[7], &lo, &hi);
        OG_ADD(1, 6) OG_ADD(2, 5) OG_ADD(3, 4) OG_ADD(4, 3) OG_ADD(5, 2) OG_ADD(6, 1)
        OG_ADD(7, 0)
        x = og_reduce(lo, hi);
        p += 128;
        n -= 8;
    }
    if (n >= 4) {
        og_clmul(_mm_xor_si128(x, OG_LOAD(0)), k->hp[3], &lo, &hi);
        OG_ADD(1, 2) OG_ADD(2, 1) OG_ADD(3, 0)
        x = og_reduce(lo, hi);
        p += 64;
        n -= 4;
    }
#undef OG_ADD
    while (n--) {
        x = og_mul(_mm_xor_si128(x, OG_LOAD(0)), k->hp[0]);
        p += 16;
    }
#undef OG_LOAD
    return x;
}

OG_TGT static inline void og_update(const og_key *k, og_hash *s, const uint8_t *p, size_t len) {
    s->total += len;
    if (!len) return; /* gcm_new's empty prefix: `p` is NULL, no arithmetic on it */
    if (s->n) {
        size_t t = 16 - s->n;
        if (t > len) t = len;
        memcpy(s->buf + s->n, p, t);
        s->n += t;
        p += t;
        len -= t;
        if (s->n < 16) return;
        s->x = og_blocks(k, s->x, s->buf, 1);
        s->n = 0;
    }
    size_t whole = len / 16;
    s->x = og_blocks(k, s->x, p, whole);
    p += whole * 16;
    len -= whole * 16;
    if (len) memcpy(s->buf, p, len);
    s->n = len;
}

/* The keystream of `nonce` from counter 1: the first block (E(K, J0), the tag's mask) in
 * *mask, the following ones XORed over `len` bytes of `in` into `out`. */
OG_TGT static inline void og_ctr(const og_key *k, const uint8_t *nonce, const uint8_t *in,
                                 uint8_t *out, size_t len, __m128i *mask) {
    uint8_t j0[16] = {0};
    memcpy(j0, nonce, NONCE);
    const __m128i base = _mm_loadu_si128((const __m128i *)j0);
    uint32_t ctr = 1;
    int first = 1;
#define OG_CB(i) _mm_xor_si128(_mm_insert_epi32(base, (int)__builtin_bswap32(ctr + (i)), 3), \
                               k->rk[0])
#define OG_R8(op, rk)                                                            \
    b[0] = op(b[0], rk); b[1] = op(b[1], rk); b[2] = op(b[2], rk); b[3] = op(b[3], rk); \
    b[4] = op(b[4], rk); b[5] = op(b[5], rk); b[6] = op(b[6], rk); b[7] = op(b[7], rk);
    for (;;) {
        __m128i b[8] = {OG_CB(0), OG_CB(1), OG_CB(2), OG_CB(3),
                        OG_CB(4), OG_CB(5), OG_CB(6), OG_CB(7)};
        ctr += 8;
        for (int r = 1; r < 14; r++) {
            OG_R8(_mm_aesenc_si128, k->rk[r])
        }
        OG_R8(_mm_aesenclast_si128, k->rk[14])
        int i = 0;
        if (first) {
            *mask = b[0];
            first = 0;
            i = 1;
        }
        for (; i < 8; i++) {
            if (len < 16) {
                if (len) {
                    uint8_t t[16];
                    _mm_storeu_si128((__m128i *)t, b[i]);
                    for (size_t j = 0; j < len; j++) out[j] = in[j] ^ t[j];
                }
                return;
            }
            _mm_storeu_si128((__m128i *)out,
                             _mm_xor_si128(_mm_loadu_si128((const __m128i *)in), b[i]));
            in += 16;
            out += 16;
            len -= 16;
        }
    }
#undef OG_R8
#undef OG_CB
}

/* The state after `len` bytes of associated data that start every message of a call. */
OG_TGT static void og_prefix(const og_key *k, og_hash *s, const uint8_t *prefix, size_t len) {
    s->x = _mm_setzero_si128();
    s->n = 0;
    s->total = 0;
    og_update(k, s, prefix, len);
}

/* The lengths block of a message (bits of associated data, bits of ciphertext). */
static void og_lens(uint8_t *lens, size_t aad_len, size_t ct_len) {
    uint64_t a = (uint64_t)aad_len * 8, c = (uint64_t)ct_len * 8;
    for (int i = 0; i < 8; i++) {
        lens[i] = (uint8_t)(a >> (56 - 8 * i));
        lens[8 + i] = (uint8_t)(c >> (56 - 8 * i));
    }
}

/* Whole blocks to hash: `n` of them at `p`. */
typedef struct {
    const uint8_t *p;
    size_t n;
} og_seg;

/* The GHASH of one message from the state `pre` (its prefix hashed, maybe a partial block
 * left): the rest of the associated data, the ciphertext and the lengths block, each padded,
 * taken as one run of blocks with one reduction per OG_POWERS blocks (a message of a short
 * value in one or two), where hashing each part on its own reduced after every part. */
OG_TGT static __m128i og_message(const og_key *k, const og_hash *pre, const uint8_t *rest,
                                 size_t rest_len, const uint8_t *ct, size_t ct_len) {
    uint8_t head[16], rest_pad[16], ct_pad[16], lens[16];
    og_seg seg[6];
    int nseg = 0;
    size_t total = 0;
    og_lens(lens, pre->total + rest_len, ct_len);
    if (pre->n) { /* the prefix's partial block, completed by the rest */
        size_t t = 16 - pre->n < rest_len ? 16 - pre->n : rest_len;
        memcpy(head, pre->buf, pre->n);
        memcpy(head + pre->n, rest, t);
        memset(head + pre->n + t, 0, 16 - pre->n - t);
        rest += t;
        rest_len -= t;
        seg[nseg++] = (og_seg){head, 1};
    }
    if (rest_len >= 16) seg[nseg++] = (og_seg){rest, rest_len / 16};
    if (rest_len % 16) {
        memcpy(rest_pad, rest + rest_len / 16 * 16, rest_len % 16);
        memset(rest_pad + rest_len % 16, 0, 16 - rest_len % 16);
        seg[nseg++] = (og_seg){rest_pad, 1};
    }
    if (ct_len >= 16) seg[nseg++] = (og_seg){ct, ct_len / 16};
    if (ct_len % 16) {
        memcpy(ct_pad, ct + ct_len / 16 * 16, ct_len % 16);
        memset(ct_pad + ct_len % 16, 0, 16 - ct_len % 16);
        seg[nseg++] = (og_seg){ct_pad, 1};
    }
    seg[nseg++] = (og_seg){lens, 1};
    for (int i = 0; i < nseg; i++) total += seg[i].n;
    __m128i x = pre->x;
    int si = 0;
    size_t bi = 0;
    while (total) {
        size_t m = total < OG_POWERS ? total : OG_POWERS;
        /* Karatsuba: per block the products of the low halves, of the high halves and of
         * the halves' sums, added up over the run and combined once */
        __m128i lo = _mm_setzero_si128(), hi = lo, mid = lo;
        for (size_t j = 0; j < m; j++) {
            while (bi == seg[si].n) {
                si++;
                bi = 0;
            }
            __m128i b = og_rev(_mm_loadu_si128((const __m128i *)(seg[si].p + 16 * bi)));
            bi++;
            if (j == 0) b = _mm_xor_si128(b, x);
            size_t pw = m - 1 - j;
            lo = _mm_xor_si128(lo, _mm_clmulepi64_si128(b, k->hp[pw], 0x00));
            hi = _mm_xor_si128(hi, _mm_clmulepi64_si128(b, k->hp[pw], 0x11));
            mid = _mm_xor_si128(mid, _mm_clmulepi64_si128(
                _mm_xor_si128(b, _mm_shuffle_epi32(b, 0x4e)), k->hk[pw], 0x00));
        }
        mid = _mm_xor_si128(mid, _mm_xor_si128(lo, hi));
        x = og_reduce(_mm_xor_si128(lo, _mm_slli_si128(mid, 8)),
                      _mm_xor_si128(hi, _mm_srli_si128(mid, 8)));
        total -= m;
    }
    return x;
}

/* Seals `len` bytes of `pt` into `ct`, then the tag; the associated data is the prefix of
 * `pre` then `rest`. */
OG_TGT static void og_seal(const og_key *k, const og_hash *pre, const uint8_t *nonce,
                           const uint8_t *rest, size_t rest_len, const uint8_t *pt, size_t len,
                           uint8_t *ct) {
    __m128i mask;
    og_ctr(k, nonce, pt, ct, len, &mask);
    __m128i x = og_message(k, pre, rest, rest_len, ct, len);
    _mm_storeu_si128((__m128i *)(ct + len), _mm_xor_si128(og_rev(x), mask));
}

/* Opens `len` bytes of `ct` (its tag after it) into `pt`: 0, or 1 when the tag is wrong
 * (gcm_open then zeroes what was written to `pt`). */
OG_TGT static int og_open(const og_key *k, const og_hash *pre, const uint8_t *nonce,
                          const uint8_t *rest, size_t rest_len, const uint8_t *ct, size_t len,
                          uint8_t *pt) {
    __m128i mask;
    uint8_t tag[TAG];
    __m128i x = og_message(k, pre, rest, rest_len, ct, len);
    og_ctr(k, nonce, ct, pt, len, &mask);
    _mm_storeu_si128((__m128i *)tag, _mm_xor_si128(og_rev(x), mask));
    return CRYPTO_memcmp(tag, ct + len, TAG) != 0;
}

static int og_cpu(void) {
    __builtin_cpu_init();
    return __builtin_cpu_supports("aes") && __builtin_cpu_supports("pclmul") &&
           __builtin_cpu_supports("ssse3") && __builtin_cpu_supports("sse4.1");
}

/* Per thread, per direction: the keys of the running call (cleansed at its end). */
static __thread og_key og_keys[2];
#else
#define OWN_GCM 0
#endif

typedef struct {
    EVP_CIPHER_CTX *ctx;
    int fast_iv;             /* the IV goes through the parameter (see above) */
#if OWN_GCM
    og_key *own;             /* non-NULL: messages go through og_seal / og_open, not `ctx` */
    og_hash pre;             /* the GHASH state after the call's prefix (gcm_prefix) */
    size_t pre_len;
#endif
#if GCM_PARAMS
    OSSL_PARAM iv_tag[3];    /* open: the IV (fast_iv) then the tag; seal: the IV */
    OSSL_PARAM tag[2];       /* the tag alone (seal: read; open without fast_iv: set) */
#endif
} gcm_t;

static int gcm_init(gcm_t *g, int seal, const uint8_t *key, int fast_iv) {
    g->fast_iv = fast_iv;
#if OWN_GCM
    g->own = NULL;
    g->pre_len = 0;
#endif
    g->ctx = EVP_CIPHER_CTX_new();
    if (!g->ctx) return -1;
    int ok = seal ? EVP_EncryptInit_ex(g->ctx, EVP_aes_256_gcm(), NULL, key, NULL)
                  : EVP_DecryptInit_ex(g->ctx, EVP_aes_256_gcm(), NULL, key, NULL);
    if (ok != 1) {
        EVP_CIPHER_CTX_free(g->ctx);
        g->ctx = NULL;
        return -1;
    }
#if GCM_PARAMS
    /* data pointers are set per message */
    g->iv_tag[0] = OSSL_PARAM_construct_octet_string(OSSL_CIPHER_PARAM_AEAD_TLS1_IV_FIXED,
                                                     NULL, (size_t)-1);
    g->iv_tag[1] = OSSL_PARAM_construct_octet_string(OSSL_CIPHER_PARAM_AEAD_TAG, NULL, TAG);
    g->iv_tag[2] = OSSL_PARAM_construct_end();
    if (seal) g->iv_tag[1] = OSSL_PARAM_construct_end();
    g->tag[0] = OSSL_PARAM_construct_octet_string(OSSL_CIPHER_PARAM_AEAD_TAG, NULL, TAG);
    g->tag[1] = OSSL_PARAM_construct_end();
#endif
    return 0;
}

static void gcm_free(gcm_t *g) {
    if (g->ctx) EVP_CIPHER_CTX_free(g->ctx);
    g->ctx = NULL;
}

/* `g` keyed with `key` again, keeping its cipher and provider context (no fetch). */
static int gcm_rekey(gcm_t *g, int seal, const uint8_t *key) {
    return (seal ? EVP_EncryptInit_ex(g->ctx, NULL, NULL, key, NULL)
                 : EVP_DecryptInit_ex(g->ctx, NULL, NULL, key, NULL)) == 1 ? 0 : -1;
}

/* Whether a message's lengths are within what both implementations take: EVP's updates
 * take an int, and below INT_MAX bytes the own code's 32-bit block counter (NIST SP 800-38D
 * inc32, 2^32 - 2 blocks at most, 2^36 - 32 bytes) can never wrap back onto J0 (the tag's
 * mask). A Kafka record never comes near; a longer message is refused (SB_CRYPTO), never
 * sealed with a truncated length or a repeated counter. */
static int gcm_lengths_ok(size_t aad_len, size_t text_len) {
    return aad_len <= INT_MAX && text_len <= INT_MAX;
}

/* Seals `pt` under `nonce` and `aad`: the ciphertext (as long as `pt`) at `ct`, then the
 * tag. 0, or -1 when OpenSSL fails or the lengths are too long (gcm_lengths_ok). */
static int gcm_seal(gcm_t *g, const uint8_t *nonce, const uint8_t *aad, size_t aad_len,
                    const uint8_t *pt, size_t pt_len, uint8_t *ct) {
    int n1 = 0, n2 = 0;
    if (!gcm_lengths_ok(aad_len, pt_len)) return -1;
#if OWN_GCM
    if (g->own) {
        if (aad_len < g->pre_len) return -1;
        og_seal(g->own, &g->pre, nonce, aad + g->pre_len, aad_len - g->pre_len, pt, pt_len, ct);
        return 0;
    }
#endif
#if GCM_PARAMS
    if (g->fast_iv) {
        g->iv_tag[0].data = (void *)nonce;
        if (EVP_CIPHER_CTX_set_params(g->ctx, g->iv_tag) != 1) return -1;
    } else
#endif
    if (EVP_EncryptInit_ex(g->ctx, NULL, NULL, NULL, nonce) != 1) {
        return -1;
    }
    if (EVP_EncryptUpdate(g->ctx, NULL, &n1, aad, (int)aad_len) != 1 ||
        EVP_EncryptUpdate(g->ctx, ct, &n1, pt, (int)pt_len) != 1 ||
        EVP_EncryptFinal_ex(g->ctx, ct + n1, &n2) != 1 || (size_t)(n1 + n2) != pt_len)
        return -1;
#if GCM_PARAMS
    g->tag[0].data = ct + pt_len;
    if (EVP_CIPHER_CTX_get_params(g->ctx, g->tag) != 1) return -1;
#else
    if (EVP_CIPHER_CTX_ctrl(g->ctx, EVP_CTRL_GCM_GET_TAG, TAG, ct + pt_len) != 1) return -1;
#endif
    return 0;
}

/* Opens `ct` (then its tag) under `nonce` and `aad` into `pt`: 0, 1 when it fails
 * authentication, -1 when OpenSSL fails; on 1 and -1 the `ct_len` bytes at `pt` are zeroed
 * (both implementations decrypt before the tag is known to be right: what a refused message
 * decrypted to is never left where a caller could read it). */
static int gcm_open_raw(gcm_t *g, const uint8_t *nonce, const uint8_t *aad, size_t aad_len,
                    const uint8_t *ct, size_t ct_len, uint8_t *pt) {
    int n1 = 0, n2 = 0;
    const uint8_t *tag = ct + ct_len;
#if OWN_GCM
    if (g->own) {
        if (aad_len < g->pre_len) return -1;
        return og_open(g->own, &g->pre, nonce, aad + g->pre_len, aad_len - g->pre_len, ct,
                       ct_len, pt);
    }
#endif
#if GCM_PARAMS
    if (g->fast_iv) {
        g->iv_tag[0].data = (void *)nonce;
        g->iv_tag[1].data = (void *)tag;
        if (EVP_CIPHER_CTX_set_params(g->ctx, g->iv_tag) != 1) return -1;
    } else {
        g->tag[0].data = (void *)tag;
        if (EVP_DecryptInit_ex(g->ctx, NULL, NULL, NULL, nonce) != 1 ||
            EVP_CIPHER_CTX_set_params(g->ctx, g->tag) != 1)
            return -1;
    }
#else
    if (EVP_DecryptInit_ex(g->ctx, NULL, NULL, NULL, nonce) != 1 ||
        EVP_CIPHER_CTX_ctrl(g->ctx, EVP_CTRL_GCM_SET_TAG, TAG, (void *)tag) != 1)
        return -1;
#endif
    if (EVP_DecryptUpdate(g->ctx, NULL, &n1, aad, (int)aad_len) != 1 ||
        EVP_DecryptUpdate(g->ctx, pt, &n1, ct, (int)ct_len) != 1)
        return -1;
    if (EVP_DecryptFinal_ex(g->ctx, pt + n1, &n2) != 1) return 1;
    return (size_t)(n1 + n2) == ct_len ? 0 : -1;
}

static int gcm_open(gcm_t *g, const uint8_t *nonce, const uint8_t *aad, size_t aad_len,
                    const uint8_t *ct, size_t ct_len, uint8_t *pt) {
    if (!gcm_lengths_ok(aad_len, ct_len)) return -1; /* nothing read or written */
    int rc = gcm_open_raw(g, nonce, aad, aad_len, ct, ct_len, pt);
    if (rc && ct_len) OPENSSL_cleanse(pt, ct_len);
    return rc;
}

/* Whether the IV shortcut gives exactly EVP_CipherInit_ex's messages on this libcrypto:
 * three messages under three nonces through one context each way, every ciphertext and tag
 * compared with those of a context initialised with the nonce, a wrong tag refused. Run
 * once per process (the answer depends only on the library loaded). */
static int gcm_fast_iv_check(void) {
#if GCM_PARAMS
    static const uint8_t key[32] = {7, 1, 2, 3, 5, 8, 13, 21, 34, 55, 89, 144};
    uint8_t aad[40], pt[37], want[3][37 + TAG], got[37 + TAG], back[37];
    uint8_t nonces[3][NONCE];
    for (size_t i = 0; i < sizeof aad; i++) aad[i] = (uint8_t)(i * 7 + 1);
    for (size_t i = 0; i < sizeof pt; i++) pt[i] = (uint8_t)(i * 13 + 5);
    for (int m = 0; m < 3; m++)
        for (int i = 0; i < NONCE; i++) nonces[m][i] = (uint8_t)(m * 31 + i * 3 + 1);
    gcm_t slow, fast, open_fast;
    int ok = 1;
    if (gcm_init(&slow, 1, key, 0) || gcm_init(&fast, 1, key, 1) ||
        gcm_init(&open_fast, 0, key, 1))
        ok = 0;
    for (int m = 0; ok && m < 3; m++) {
        if (gcm_seal(&slow, nonces[m], aad, sizeof aad, pt, sizeof pt, want[m]) ||
            gcm_seal(&fast, nonces[m], aad, sizeof aad, pt, sizeof pt, got) ||
            memcmp(want[m], got, sizeof got) != 0)
            ok = 0;
    }
    /* a nonce that made no difference would mean the reference itself is wrong */
    if (ok && (!memcmp(want[0], want[1], sizeof got) || !memcmp(want[1], want[2], sizeof got)))
        ok = 0;
    for (int m = 0; ok && m < 3; m++) {
        if (gcm_open(&open_fast, nonces[m], aad, sizeof aad, want[m], sizeof pt, back) != 0 ||
            memcmp(back, pt, sizeof pt) != 0)
            ok = 0;
    }
    if (ok) {
        memcpy(got, want[2], sizeof got);
        got[sizeof got - 1] ^= 1;
        if (gcm_open(&open_fast, nonces[2], aad, sizeof aad, got, sizeof pt, back) != 1) ok = 0;
        /* and the context still opens after a refusal */
        if (gcm_open(&open_fast, nonces[1], aad, sizeof aad, want[1], sizeof pt, back) != 0)
            ok = 0;
    }
    /* a context re-keyed as gcm_new re-keys a kept one: the messages of a new context */
    static const uint8_t key2[32] = {9, 4, 6, 1, 0, 2, 8, 3, 3, 9, 7, 5, 1};
    gcm_t slow2 = {0};
    if (ok && (gcm_init(&slow2, 1, key2, 0) || gcm_rekey(&fast, 1, key2) ||
               gcm_rekey(&open_fast, 0, key2)))
        ok = 0;
    uint8_t want2[37 + TAG];
    if (ok && (gcm_seal(&slow2, nonces[0], aad, sizeof aad, pt, sizeof pt, want2) ||
               gcm_seal(&fast, nonces[0], aad, sizeof aad, pt, sizeof pt, got) ||
               memcmp(want2, got, sizeof got) != 0 || !memcmp(want2, want[0], sizeof got) ||
               gcm_open(&open_fast, nonces[0], aad, sizeof aad, want2, sizeof pt, back) != 0 ||
               memcmp(back, pt, sizeof pt) != 0))
        ok = 0;
    gcm_free(&slow2);
    gcm_free(&slow);
    gcm_free(&fast);
    gcm_free(&open_fast);
    ERR_clear_error();
    return ok;
#else
    return 0;
#endif
}

static int gcm_fast_iv(void) {
    /* -1 unknown, else the check's answer; threads racing here compute the same answer */
    static int known = -1;
    int v = __atomic_load_n(&known, __ATOMIC_ACQUIRE);
    if (v < 0) {
        v = gcm_fast_iv_check();
        __atomic_store_n(&known, v, __ATOMIC_RELEASE);
    }
    return v;
}

/* 1 when messages get their IV through the shortcut (gcm_fast_iv), else 0. */
int sb_fast_iv(void) {
    return gcm_fast_iv();
}

#if OWN_GCM
static size_t gcm_shared_aad(const gcm_t *g, gcm_t *g0, uint8_t *scratch, size_t prefix_len,
                             const uint8_t *no_headers);

/* One message of own_gcm_check: `own` seals `n` bytes of `pt` under `nonce` and `aad` to
 * exactly what `evp` seals (in `want`, the own one in `got`), and opens that to `pt` again
 * (in `back`). 1 when it does. */
static int og_kat_message(gcm_t *evp, gcm_t *own, const uint8_t *nonce, const uint8_t *aad,
                          size_t alen, const uint8_t *pt, size_t n, uint8_t *want,
                          uint8_t *got, uint8_t *back) {
    return !gcm_seal(evp, nonce, aad, alen, pt, n, want) &&
           !gcm_seal(own, nonce, aad, alen, pt, n, got) && !memcmp(want, got, n + TAG) &&
           !gcm_open(own, nonce, aad, alen, want, n, back) && !memcmp(back, pt, n);
}

/* Whether og_seal / og_open give exactly OpenSSL's messages on this CPU: for every split
 * of the associated data into a prefix and the rest (prefix lengths around one block and
 * ones that take each branch of og_blocks: 8 blocks then 1 or 2 (144, 150, 160), 4 then 3
 * (112), 8 then 4 (200), twice 8 then 2 and a partial block (300); rest lengths from none to beyond eight blocks) and plaintext lengths
 * from empty to past two rounds of eight blocks, past the fourth round of og_ctr (600) and
 * past 4 096 bytes (a length block with bit 15 set, 17 rounds of counters, 16-block GHASH
 * runs), under two keys, each ciphertext and tag must equal EVP's (a context initialised
 * with the nonce), open again to the plaintext, and a flipped bit in the tag's first, a
 * middle and its last byte, the ciphertext or the associated data must be refused.
 * tests/crypto/test_own_gcm_check.py breaks each branch in a copy of this file and expects
 * this check to fail. The state of a call's shared associated data (gcm_shared_aad: the
 * prefix, a null key and a digest, hashed whole) is checked the same way after each prefix,
 * against EVP over that whole associated data, so a fault there too leaves calls on EVP.
 * Run once per process. */
static int own_gcm_check(void) {
    if (!og_cpu()) return 0;
    static const uint8_t keys[2][32] = {{3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8, 9, 7, 9, 3},
                                        {2, 7, 1, 8, 2, 8, 1, 8, 2, 8, 4, 5, 9, 0, 4, 5, 255}};
    static const size_t prefixes[] = {0, 1, 15, 16, 17, 112, 144, 150, 160, 200, 300};
    static const size_t rests[] = {0, 5, 16, 45, 130};
    static const size_t lens[] = {0, 1, 15, 16, 17, 100, 128, 129, 200, 255, 300, 600, 4100};
#define OG_KAT_AAD 430   /* the longest prefix and rest */
#define OG_KAT_PT 4100   /* the longest plaintext */
#define OG_KAT_SHARED (300 + 48) /* the longest prefix and a shared AAD's tail */
    /* on the heap: filter threads may run on small stacks */
    uint8_t *mem = malloc(OG_KAT_AAD + 4 * (OG_KAT_PT + TAG) + OG_KAT_SHARED);
    if (!mem) return 0;
    uint8_t *aad = mem, *pt = aad + OG_KAT_AAD, *want = pt + OG_KAT_PT + TAG,
            *got = want + OG_KAT_PT + TAG, *back = got + OG_KAT_PT + TAG,
            *shared = back + OG_KAT_PT + TAG, nonce[NONCE];
    for (size_t i = 0; i < OG_KAT_AAD; i++) aad[i] = (uint8_t)(i * 29 + 7);
    for (size_t i = 0; i < OG_KAT_PT; i++) pt[i] = (uint8_t)(i * 13 + 5 + (i >> 8));
    int ok = 1;
    for (int kk = 0; ok && kk < 2; kk++) {
        gcm_t evp = {0}, own = {0};
        og_key *k = &og_keys[1];
        if (gcm_init(&evp, 1, keys[kk], 0)) {
            ok = 0;
            break;
        }
        og_init(k, keys[kk]);
        own.own = k;
        for (size_t a = 0; ok && a < sizeof prefixes / sizeof *prefixes; a++) {
            og_prefix(k, &own.pre, aad, prefixes[a]);
            own.pre_len = prefixes[a];
            for (size_t b = 0; ok && b < sizeof rests / sizeof *rests; b++) {
                size_t alen = prefixes[a] + rests[b];
                for (size_t c = 0; ok && c < sizeof lens / sizeof *lens; c++) {
                    size_t n = lens[c];
                    for (int i = 0; i < NONCE; i++)
                        nonce[i] = (uint8_t)(kk * 101 + a * 37 + b * 11 + c * 5 + i);
                    if (!og_kat_message(&evp, &own, nonce, aad, alen, pt, n, want, got,
                                        back)) {
                        ok = 0;
                        break;
                    }
                    for (int t = 0; t < TAG; t += 7) { /* the tag: bytes 0, 7 and 14, 15 */
                        uint8_t bit = (uint8_t)(1u << (t % 8));
                        got[n + (size_t)t] ^= bit;
                        if (gcm_open(&own, nonce, aad, alen, got, n, back) != 1) ok = 0;
                        got[n + (size_t)t] ^= bit;
                    }
                    got[n + TAG - 1] ^= 0x80;
                    if (gcm_open(&own, nonce, aad, alen, got, n, back) != 1) ok = 0;
                    got[n + TAG - 1] ^= 0x80;
                    if (n) {
                        got[n / 2] ^= 0x80; /* the ciphertext */
                        if (gcm_open(&own, nonce, aad, alen, got, n, back) != 1) ok = 0;
                        got[n / 2] ^= 0x80;
                    }
                    if (alen) {
                        aad[alen - 1] ^= 1; /* the rest of the associated data, or the prefix */
                        int bad = prefixes[a] && alen == prefixes[a] ? 1 :
                                  gcm_open(&own, nonce, aad, alen, got, n, back);
                        aad[alen - 1] ^= 1;
                        if (bad != 1) ok = 0;
                    }
                }
            }
            /* the call's shared associated data after this prefix (its digest: some bytes
             * of `pt`), every plaintext length: EVP over the whole AAD gives the same
             * message, which opens again, and a wrong tag is refused */
            gcm_t g0 = {0};
            memcpy(shared, aad, prefixes[a]);
            size_t slen = ok ? gcm_shared_aad(&own, &g0, shared, prefixes[a], pt + a) : 0;
            /* aad_for(prefix, None, "", digest): a null key (length 1, marker 0), the
             * digest, an empty field */
            static const uint8_t null_key[5] = {0, 0, 0, 1, 0}, dlen[4] = {0, 0, 0, 32},
                                 no_field[4] = {0};
            if (slen != prefixes[a] + 45 || memcmp(shared, aad, prefixes[a]) ||
                memcmp(shared + prefixes[a], null_key, 5) ||
                memcmp(shared + prefixes[a] + 5, dlen, 4) ||
                memcmp(shared + prefixes[a] + 9, pt + a, 32) ||
                memcmp(shared + prefixes[a] + 41, no_field, 4))
                ok = 0;
            for (size_t c = 0; ok && c < sizeof lens / sizeof *lens; c++) {
                size_t n = lens[c];
                for (int i = 0; i < NONCE; i++) nonce[i] = (uint8_t)(kk * 53 + a * 19 + c + i);
                if (!og_kat_message(&evp, &g0, nonce, shared, slen, pt, n, want, got, back)) {
                    ok = 0;
                    break;
                }
                want[n] ^= 1;
                if (gcm_open(&g0, nonce, shared, slen, want, n, back) != 1) ok = 0;
            }
            OPENSSL_cleanse(&g0, sizeof g0);
        }
        /* a changed prefix (its state made again) must be refused too */
        if (ok) {
            aad[0] ^= 1;
            og_prefix(k, &own.pre, aad, 144);
            own.pre_len = 144;
            aad[0] ^= 1;
            if (gcm_seal(&evp, nonce, aad, 150, pt, 50, want) ||
                gcm_open(&own, nonce, aad, 150, want, 50, back) != 1)
                ok = 0;
        }
        gcm_free(&evp);
        OPENSSL_cleanse(k, sizeof *k);
    }
    free(mem);
    ERR_clear_error();
    return ok;
#undef OG_KAT_AAD
#undef OG_KAT_PT
#undef OG_KAT_SHARED
}
#endif

/* 0 off (tests: the EVP path), 1 on where the check passes. */
static int own_gcm_allowed = 1;

static int own_gcm(void) {
#if OWN_GCM
    static int known = -1;  /* as gcm_fast_iv */
    if (!__atomic_load_n(&own_gcm_allowed, __ATOMIC_ACQUIRE)) return 0;
    int v = __atomic_load_n(&known, __ATOMIC_ACQUIRE);
    if (v < 0) {
        v = own_gcm_check();
        __atomic_store_n(&known, v, __ATOMIC_RELEASE);
    }
    return v;
#else
    return 0;
#endif
}

/* 1 when AES-GCM runs in this module's own code (own_gcm), else 0 (OpenSSL's EVP). */
int sb_own_gcm(void) {
    return own_gcm();
}

/* Allows (1) or forbids (0) the module's own AES-GCM for the calls that follow; returns the
 * previous setting. For tests, which run both implementations. */
int sb_allow_own_gcm(int allow) {
    return __atomic_exchange_n(&own_gcm_allowed, allow ? 1 : 0, __ATOMIC_ACQ_REL);
}

/* Each thread keeps one context per direction for its next call: making one per call
 * (EVP_CIPHER_CTX_new, OpenSSL 3's implicit fetch of the cipher by name, the provider's
 * context, then freeing it all) cost about as much as opening ten small records. A kept
 * context gets the call's key through EVP_CipherInit_ex with no cipher, which runs only the
 * key schedule and leaves the context as a new one would be (no IV yet; the fast-IV check
 * covers a re-keyed context too). It holds the last call's key schedule until the next call
 * or the thread's end: the data key itself stays in the process's data-key cache anyway,
 * and the proxy's memory is outside the threat model (docs/ENCRYPTION.md). */
typedef struct {
    gcm_t dir[2];            /* [0] open, [1] seal */
} gcm_kept_t;
static __thread gcm_kept_t gcm_kept;
static pthread_key_t gcm_kept_key;
static pthread_once_t gcm_kept_once = PTHREAD_ONCE_INIT;
static int gcm_kept_key_ok; /* 0 if pthread_key_create failed (every key slot in use) */

static void gcm_kept_free(void *p) {
    gcm_kept_t *k = p;
    gcm_free(&k->dir[0]);
    gcm_free(&k->dir[1]);
}

static void gcm_kept_key_make(void) {
    gcm_kept_key_ok = pthread_key_create(&gcm_kept_key, gcm_kept_free) == 0;
}

/* A context keyed with `key`, to seal (`seal` 1) or open, in *g (this thread's kept one):
 * 0, or -1 on failure. Give it back with gcm_done. */
static int gcm_new(gcm_t *g, int seal, const uint8_t *key) {
#if OWN_GCM
    if (own_gcm()) {
        memset(g, 0, sizeof *g);
        g->own = &og_keys[seal ? 1 : 0];
        og_init(g->own, key);
        og_prefix(g->own, &g->pre, NULL, 0);
        return 0;
    }
#endif
    gcm_t *k = &gcm_kept.dir[seal ? 1 : 0];
    if (k->ctx && gcm_rekey(k, seal, key) != 0) gcm_free(k);
    if (!k->ctx) {
        if (gcm_init(k, seal, key, gcm_fast_iv())) return -1;
        (void)pthread_once(&gcm_kept_once, gcm_kept_key_make);
        /* Frees it at the thread's end. Without a key (the process used up its key slots)
         * the contexts stay correct but are not freed when a thread ends: filter threads
         * live as long as the proxy, so that costs at most two contexts per thread. */
        if (gcm_kept_key_ok) (void)pthread_setspecific(gcm_kept_key, &gcm_kept);
    }
    *g = *k;
    return 0;
}

/* The end of a call with the context gcm_new gave: kept for the next call, unless OpenSSL
 * failed in it (rc SB_CRYPTO), which may leave it in a state not worth trusting. */
static void gcm_done(gcm_t *g, long rc) {
#if OWN_GCM
    if (g->own) {
        OPENSSL_cleanse(g->own, sizeof *g->own);
        OPENSSL_cleanse(&g->pre, sizeof g->pre);
        g->own = NULL;
        return;
    }
#endif
    if (!g->ctx || rc != SB_CRYPTO) return;
    for (int d = 0; d < 2; d++)
        if (gcm_kept.dir[d].ctx == g->ctx) gcm_free(&gcm_kept.dir[d]);
    g->ctx = NULL;
}

/* Every message of the call that follows starts its associated data with these `len`
 * bytes: the module's own AES-GCM hashes them once here (the EVP path needs nothing). */
static void gcm_prefix(gcm_t *g, const uint8_t *prefix, size_t len) {
#if OWN_GCM
    if (g->own) {
        og_prefix(g->own, &g->pre, prefix, len);
        g->pre_len = len;
    }
#else
    (void)g;
    (void)prefix;
    (void)len;
#endif
}

/* A record without a key and without headers of its own has the call's one associated data
 * for such records (the prefix, a null key, the digest of no headers, written after the
 * prefix in `scratch`). With the module's own GCM, `g0` becomes `g` with that whole AAD's
 * GHASH taken once: each such message then hashes only its text (no rest of the AAD to
 * hash per record). Returns that AAD's length, or 0 on the EVP path, which reads every
 * message's AAD anyway. */
static size_t gcm_shared_aad(const gcm_t *g, gcm_t *g0, uint8_t *scratch, size_t prefix_len,
                             const uint8_t *no_headers) {
#if OWN_GCM
    if (g->own) {
        size_t n = (size_t)(aad_tail_of(scratch + prefix_len, NULL, -1, no_headers) - scratch);
        *g0 = *g;
        gcm_prefix(g0, scratch, n);
        return n;
    }
#else
    (void)g;
    (void)g0;
    (void)scratch;
    (void)prefix_len;
    (void)no_headers;
#endif
    return 0;
}

/* Writes one record: the body from `r->start` to the key (as is), `value`, then the first
 * `keep` headers of `r` and `extra` (already encoded, `extra_count` of them). */
static uint8_t *emit(uint8_t *o, const record *r, const uint8_t *v1, size_t v1_len,
                     const uint8_t *v2, size_t v2_len, const uint8_t *v3, size_t v3_len,
                     int64_t keep, const uint8_t *extra, size_t extra_len, int64_t extra_count) {
    size_t head = (size_t)(r->key_end - r->start);
    size_t vlen = v1_len + v2_len + v3_len;
    size_t hbytes = r->hoff[keep];
    size_t body = head + varint_len((int64_t)vlen) + vlen + varint_len(keep + extra_count)
                  + hbytes + extra_len;
    o = wr_varint(o, (int64_t)body);
    memcpy(o, r->start, head);
    o += head;
    o = wr_varint(o, (int64_t)vlen);
    memcpy(o, v1, v1_len);
    o += v1_len;
    if (v2_len) memcpy(o, v2, v2_len); /* v2, v3 may be NULL when empty */
    o += v2_len;
    if (v3_len) memcpy(o, v3, v3_len);
    o += v3_len;
    o = wr_varint(o, keep + extra_count);
    memcpy(o, r->headers, hbytes);
    o += hbytes;
    if (extra_len) memcpy(o, extra, extra_len);
    return o + extra_len;
}

/* Upper bound of the bytes written for one record beyond its input bytes. */
#define SLACK(extra_len, prefix_len) ((extra_len) + 1 + NONCE + TAG + 30)

/* Fills `out` with `n` bytes from OpenSSL's CSPRNG (RAND_bytes: its CTR-DRBG, seeded from the
 * operating system and reseeded after a fork): a batch's nonces in one call, where a system
 * call per batch (os.urandom) cost the kernel's ChaCha20 over the same bytes. 0, or SB_CRYPTO
 * when the generator fails (the batch is then refused, nothing is sealed). */
long sb_nonces(uint8_t *out, size_t n) {
    while (n) {
        int step = n > (1u << 30) ? (1 << 30) : (int)n;
        if (RAND_bytes(out, step) != 1) {
            ERR_clear_error();
            return SB_CRYPTO;
        }
        out += step;
        n -= (size_t)step;
    }
    return 0;
}

/* Seals every record's value. The AAD prefix is written to `scratch` once per call and each
 * record's own part (key, record digest) after it; the ciphertext goes straight to its place
 * in `out` (the record's length is known before sealing: the value grows by 1 + NONCE + TAG),
 * so no record's value is copied twice. */
long sb_seal_values(const uint8_t *in, size_t in_len, uint32_t count, const uint8_t *key,
                    const uint8_t *nonces, size_t nonces_len, const uint8_t *prefix,
                    size_t prefix_len,
                    const uint8_t *ours, size_t ours_len, uint32_t ours_count,
                    uint8_t *scratch, size_t scratch_len, uint8_t *out, size_t out_cap,
                    uint8_t *fates, uint32_t *sealed) {
    cursor c = {in, in + in_len};
    uint8_t *o = out;
    uint8_t *limit = out + out_cap;
    long rc = 0;
    static __thread record r;
    uint8_t no_headers[32];
    r.header_count = 0;
    headers_digest(&r, 0, no_headers);
    gcm_t g = {0};
    gcm_t g0 = {0};
    size_t aad0_len = 0;
    *sealed = 0;
    if (scratch_len < prefix_len + 48) {
        rc = SB_SPACE;
        goto done;
    }
    if (gcm_new(&g, 1, key)) {
        rc = SB_CRYPTO;
        goto done;
    }
    gcm_prefix(&g, prefix, prefix_len);
    memcpy(scratch, prefix, prefix_len);
    aad0_len = gcm_shared_aad(&g, &g0, scratch, prefix_len, no_headers);
    for (uint32_t i = 0; i < count; i++) {
        const uint8_t *rec_start;
        size_t raw;
        if ((rc = next_record(&c, &r, &rec_start, &raw))) goto done;
        if (r.value_len < 0) { /* a tombstone stays as it is */
            if ((size_t)(limit - o) < raw) { rc = SB_SPACE; goto done; }
            memcpy(o, rec_start, raw);
            o += raw;
            fates[i] = 0;
            continue;
        }
        if ((size_t)(limit - o) < raw + SLACK(ours_len, prefix_len) ||
            scratch_len - prefix_len - 48 < (size_t)(r.key_len > 0 ? r.key_len : 0)) {
            rc = SB_SPACE;
            goto done;
        }
        /* build_aad, the prefix already in place */
        uint8_t digest[32];
        const uint8_t *dg = no_headers;
        if (r.header_count) {
            headers_digest(&r, r.header_count, digest);
            dg = digest;
        }
        gcm_t *gg = &g;
        size_t aad_len;
        if (aad0_len && r.key_len < 0 && !r.header_count) {
            gg = &g0;
            aad_len = aad0_len;
        } else {
            aad_len = (size_t)(aad_tail(scratch + prefix_len, &r, dg) - scratch);
        }
        /* never past the nonces given: reading on would seal with bytes that are not a
         * fresh nonce (and maybe the same ones for two records) */
        if ((size_t)(*sealed + 1) * NONCE > nonces_len) { rc = SB_SPACE; goto done; }
        const uint8_t *nonce = nonces + (size_t)(*sealed) * NONCE;
        /* emit()'s layout, the sealed value written in place */
        size_t head = (size_t)(r.key_end - r.start);
        size_t vlen = 1 + NONCE + (size_t)r.value_len + TAG;
        int64_t nheaders = r.header_count + ours_count;
        size_t hbytes = r.hoff[r.header_count];
        size_t body = head + varint_len((int64_t)vlen) + vlen + varint_len(nheaders) + hbytes
                      + ours_len;
        o = wr_varint(o, (int64_t)body);
        memcpy(o, r.start, head);
        o += head;
        o = wr_varint(o, (int64_t)vlen);
        *o++ = 1;
        memcpy(o, nonce, NONCE);
        o += NONCE;
        if (gcm_seal(gg, nonce, scratch, aad_len, r.value, (size_t)r.value_len, o)) {
            rc = SB_CRYPTO;
            goto done;
        }
        o += (size_t)r.value_len + TAG;
        o = wr_varint(o, nheaders);
        memcpy(o, r.headers, hbytes);
        o += hbytes;
        if (ours_len) memcpy(o, ours, ours_len);
        o += ours_len;
        fates[i] = 1;
        (*sealed)++;
    }
    if (c.p != c.end) {
        rc = SB_MALFORMED;
        goto done;
    }
    rc = (long)(o - out);
done:
    OPENSSL_cleanse(&g0, sizeof g0);
    gcm_done(&g, rc);
    return rc;
}

/* Opens every record whose proxy header group is byte for byte `group` (the group the caller
 * parsed, checked and unwrapped the key of); records without a "sluice.enc" header are kept.
 * A record with another group returns SB_SLOW (the reference path sorts it out). */
long sb_open_values(const uint8_t *in, size_t in_len, uint32_t count, const uint8_t *key,
                    const uint8_t *prefix, size_t prefix_len, const uint8_t *group,
                    size_t group_len, uint32_t group_count, uint8_t *scratch,
                    size_t scratch_len, uint8_t *out, size_t out_cap, uint8_t *fates,
                    uint32_t *where) {
    cursor c = {in, in + in_len};
    uint8_t *o = out;
    uint8_t *limit = out + out_cap;
    long rc = 0;
    static __thread record r;
    uint8_t no_headers[32];
    r.header_count = 0;
    headers_digest(&r, 0, no_headers);
    gcm_t g = {0};
    gcm_t g0 = {0};
    size_t aad0_len = 0;
    if (scratch_len < prefix_len + 48) {
        rc = SB_SPACE;
        goto done;
    }
    if (gcm_new(&g, 0, key)) {
        rc = SB_CRYPTO;
        goto done;
    }
    gcm_prefix(&g, prefix, prefix_len);
    memcpy(scratch, prefix, prefix_len);
    aad0_len = gcm_shared_aad(&g, &g0, scratch, prefix_len, no_headers);
    for (uint32_t i = 0; i < count; i++) {
        const uint8_t *rec_start;
        size_t raw;
        if ((rc = next_record(&c, &r, &rec_start, &raw))) goto done;
        if ((size_t)(limit - o) < raw) { rc = SB_SPACE; goto done; }
        if (r.last_enc < 0) {
            memcpy(o, rec_start, raw);
            o += raw;
            fates[i] = 0;
            continue;
        }
        int64_t start = r.last_enc;
        size_t glen = r.hoff[r.header_count] - r.hoff[start];
        if (r.header_count - start != (int64_t)group_count || glen != group_len ||
            memcmp(r.headers + r.hoff[start], group, group_len) != 0) {
            rc = SB_SLOW;
            goto done;
        }
        *where = i;
        if (r.value_len < 1 + NONCE + TAG || r.value[0] != 1) {
            rc = SB_TAMPERED;
            goto done;
        }
        size_t ct_len = (size_t)r.value_len - 1 - NONCE - TAG;
        if (scratch_len < prefix_len + (size_t)(r.key_len > 0 ? r.key_len : 0) + 48) {
            rc = SB_SPACE;
            goto done;
        }
        /* the AAD (build_aad) with the digest of the headers before the group, the prefix
         * already in place */
        uint8_t digest[32];
        const uint8_t *dg = no_headers;
        if (start) {
            headers_digest(&r, start, digest);
            dg = digest;
        }
        gcm_t *gg = &g;
        size_t aad_len;
        if (aad0_len && r.key_len < 0 && !start) {
            gg = &g0;
            aad_len = aad0_len;
        } else {
            aad_len = (size_t)(aad_tail(scratch + prefix_len, &r, dg) - scratch);
        }
        const uint8_t *nonce = r.value + 1;
        const uint8_t *ct = nonce + NONCE;
        /* emit()'s layout, the plaintext written in place: the opened record is shorter
         * than the stored one (checked above against `raw`). A record that fails has its
         * plaintext zeroed by gcm_open and the call wipes what it wrote before (`done`). */
        size_t head = (size_t)(r.key_end - r.start);
        size_t hbytes = r.hoff[start];
        size_t body = head + varint_len((int64_t)ct_len) + ct_len + varint_len(start) + hbytes;
        uint8_t *w = wr_varint(o, (int64_t)body);
        memcpy(w, r.start, head);
        w = wr_varint(w + head, (int64_t)ct_len);
        int opened = gcm_open(gg, nonce, scratch, aad_len, ct, ct_len, w);
        if (opened) {
            rc = opened > 0 ? SB_TAMPERED : SB_CRYPTO;
            goto done;
        }
        w = wr_varint(w + ct_len, start);
        memcpy(w, r.headers, hbytes);
        o = w + hbytes;
        fates[i] = 1;
    }
    if (c.p != c.end) {
        rc = SB_MALFORMED;
        goto done;
    }
    rc = (long)(o - out);
done:
    /* A declined call's output is never used, but it holds the plaintext of the records
     * opened before the one that failed: wiped (every write stays within the input's size,
     * an opened record being shorter than its stored one). */
    if (rc < 0) OPENSSL_cleanse(out, out_cap < in_len ? out_cap : in_len);
    OPENSSL_cleanse(&g0, sizeof g0);
    gcm_done(&g, rc);
    return rc;
}

/* The first record carrying a "sluice.enc" header: its index, and the offset and length of
 * its header group (from that header to the end) in `in`; *encrypted counts every record
 * with one, *values every record with a value. Returns 0, 1 when no record has one, or SB_MALFORMED / SB_SLOW. Also finds the
 * first header whose name starts with `reserved` (the produce screen): its record in
 * *reserved_at (-1: none), name offset and length in *name_off, *name_len. */
long sb_scan(const uint8_t *in, size_t in_len, uint32_t count, const uint8_t *reserved,
             size_t reserved_len, uint32_t *first, size_t *group_off, size_t *group_len,
             uint32_t *group_count, uint32_t *encrypted, uint32_t *values,
             int64_t *reserved_at, size_t *name_off, size_t *name_len) {
    cursor c = {in, in + in_len};
    static __thread record r;
    long rc = 1;
    *encrypted = 0;
    *values = 0;
    *reserved_at = -1;
    for (uint32_t i = 0; i < count; i++) {
        int p = parse_record(&c, &r);
        if (p) return p == -2 ? SB_SLOW : SB_MALFORMED;
        if (r.value_len >= 0) (*values)++;
        if (*reserved_at < 0 && reserved_len) {
            for (int64_t h = 0; h < r.header_count; h++) {
                cursor hc = {r.headers + r.hoff[h], r.headers + r.hoff[h + 1]};
                const uint8_t *name = NULL;
                int64_t nlen = 0;
                rd_blob(&hc, &name, &nlen);
                if ((size_t)nlen >= reserved_len && memcmp(name, reserved, reserved_len) == 0) {
                    *reserved_at = i;
                    *name_off = (size_t)(name - in);
                    *name_len = (size_t)nlen;
                    break;
                }
            }
        }
        if (r.last_enc < 0) continue;
        if (!*encrypted) {
            *first = i;
            *group_off = (size_t)(r.headers + r.hoff[r.last_enc] - in);
            *group_len = r.hoff[r.header_count] - r.hoff[r.last_enc];
            *group_count = (uint32_t)(r.header_count - r.last_enc);
            rc = 0;
        }
        (*encrypted)++;
    }
    if (c.p != c.end) return SB_MALFORMED;
    return rc;
}

/* sb_scan's group of the first record carrying a "sluice.enc" header, for a reader who opens
 * the batch: the parse stops there (the opener reads every record anyway, and checks what
 * follows), where sb_scan reads to the end to count them. Returns 0, 1 when no record has
 * one, or SB_MALFORMED / SB_SLOW. */
long sb_first_group(const uint8_t *in, size_t in_len, uint32_t count, uint32_t *first,
                    size_t *group_off, size_t *group_len, uint32_t *group_count) {
    cursor c = {in, in + in_len};
    static __thread record r;
    for (uint32_t i = 0; i < count; i++) {
        int p = parse_record(&c, &r);
        if (p) return p == -2 ? SB_SLOW : SB_MALFORMED;
        if (r.last_enc < 0) continue;
        *first = i;
        *group_off = (size_t)(r.headers + r.hoff[r.last_enc] - in);
        *group_len = r.hoff[r.header_count] - r.hoff[r.last_enc];
        *group_count = (uint32_t)(r.header_count - r.last_enc);
        return 0;
    }
    return c.p == c.end ? 1 : SB_MALFORMED;
}

/* ------------------------------------------------------------------ fields mode (produce)
 *
 * The JSON scanner accepts a strict subset of what the reference (Python's json module,
 * crypto/json_fields.py) accepts: RFC 8259 JSON in valid UTF-8, without NaN/Infinity, member
 * names without escapes where a path is looked up, integers of at most 4000 digits, nesting
 * of at most 64 levels. Anything else returns SB_SLOW, and the reference decides (it also
 * writes the reasons of refused values), so the two never disagree on what is sealed. */

#define MAX_SPANS 256
#define MAX_DEPTH 64
#define MAX_PATHS 64
#define MAX_PARTS 16

typedef struct {
    const uint8_t *name[MAX_PARTS];
    size_t len[MAX_PARTS];
    int parts;
    const uint8_t *full;
    size_t full_len;
    const uint8_t *json;      /* the path as a JSON string (for sluice.enc.fields) */
    size_t json_len;
} path_t;

typedef struct {
    size_t start, end;
    int path;
} span_t;

static size_t utf8_seq(const uint8_t *s, size_t n, size_t i);

static int utf8_ok(const uint8_t *s, size_t n) {
    size_t i = 0;
    while (i < n) {
        if (s[i] < 0x80) { i++; continue; }
        size_t k = utf8_seq(s, n, i);
        if (!k) return 0;
        i += k;
    }
    return 1;
}

typedef struct {
    const uint8_t *s;
    size_t n;
    size_t i;
} jcur;

static void jws(jcur *j) {
    while (j->i < j->n && (j->s[j->i] == ' ' || j->s[j->i] == '\t' || j->s[j->i] == '\n' ||
                           j->s[j->i] == '\r'))
        j->i++;
}

static int ishex(uint8_t c) {
    return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
}

/* Length of the UTF-8 sequence at s[i] (a byte >= 0x80), 0 when it is not valid UTF-8
 * (overlong, a surrogate, above U+10FFFF or cut short): what utf8_ok accepts. */
static size_t utf8_seq(const uint8_t *s, size_t n, size_t i) {
    uint8_t c = s[i];
    size_t need;
    uint32_t cp;
    if (c >= 0xc2 && c <= 0xdf) { need = 1; cp = c & 0x1f; }
    else if (c >= 0xe0 && c <= 0xef) { need = 2; cp = c & 0x0f; }
    else if (c >= 0xf0 && c <= 0xf4) { need = 3; cp = c & 0x07; }
    else return 0;
    if (i + need >= n) return 0;
    for (size_t k = 1; k <= need; k++) {
        if ((s[i + k] & 0xc0) != 0x80) return 0;
        cp = (cp << 6) | (s[i + k] & 0x3f);
    }
    if ((need == 2 && (cp < 0x800 || (cp >= 0xd800 && cp <= 0xdfff))) ||
        (need == 3 && (cp < 0x10000 || cp > 0x10ffff)))
        return 0;
    return need + 1;
}

/* Whether one of the 8 bytes of `w` is not a plain string byte: below 0x20, 0x80 or above,
 * '"' or '\\' (the usual zero-byte test per kind, exact for the word as a whole). */
static inline uint64_t special8(uint64_t w) {
    const uint64_t ones = 0x0101010101010101ull, high = 0x8080808080808080ull;
    uint64_t quote = w ^ (ones * '"'), slash = w ^ (ones * '\\');
    return ((((w - ones * 0x20) | (quote - ones) | (slash - ones)) & ~w) | w) & high;
}

/* The index of the first byte at or after `i` that is not a plain string byte (see
 * special8), or `n`: sixteen bytes a step with SSE2 (a signed compare below 0x20 also catches
 * every byte of 0x80 and above), else eight, then one by one. Most of a document is string
 * bytes (the ciphertexts of fetched fields, above all). */
static size_t plain_run(const uint8_t *s, size_t n, size_t i) {
#ifdef __SSE2__
    const __m128i space = _mm_set1_epi8(0x20), quote = _mm_set1_epi8('"'),
                  slash = _mm_set1_epi8('\\');
    while (n - i >= 16) {
        __m128i v = _mm_loadu_si128((const __m128i *)(s + i));
        __m128i bad = _mm_or_si128(_mm_cmplt_epi8(v, space),
                                   _mm_or_si128(_mm_cmpeq_epi8(v, quote),
                                                _mm_cmpeq_epi8(v, slash)));
        unsigned m = (unsigned)_mm_movemask_epi8(bad);
        if (m) return i + (size_t)__builtin_ctz(m);
        i += 16;
    }
#endif
    while (n - i >= 8) {
        uint64_t w;
        memcpy(&w, s + i, 8);
        if (special8(w)) break;
        i += 8;
    }
    while (i < n && s[i] >= 0x20 && s[i] < 0x80 && s[i] != '"' && s[i] != '\\') i++;
    return i;
}

/* A string at j->i ('"'); *escaped tells whether it held a backslash. 0 ok, -1 decline.
 * It checks the UTF-8 of what it reads: outside strings only ASCII is valid JSON, so a
 * document whose strings pass is valid UTF-8 without a separate pass over it. */
static int jstring(jcur *j, int *escaped) {
    *escaped = 0;
    j->i++;
    while (j->i < j->n) {
        j->i = plain_run(j->s, j->n, j->i);
        if (j->i >= j->n) return -1;
        uint8_t c = j->s[j->i];
        if (c == '"') { j->i++; return 0; }
        if (c < 0x20) return -1;
        if (c >= 0x80) {
            size_t k = utf8_seq(j->s, j->n, j->i);
            if (!k) return -1;
            j->i += k;
            continue;
        }
        if (c == '\\') {
            *escaped = 1;
            if (j->i + 1 >= j->n) return -1;
            uint8_t e = j->s[j->i + 1];
            if (e == 'u') {
                if (j->i + 5 >= j->n || !ishex(j->s[j->i + 2]) || !ishex(j->s[j->i + 3]) ||
                    !ishex(j->s[j->i + 4]) || !ishex(j->s[j->i + 5]))
                    return -1;
                j->i += 6;
                continue;
            }
            if (!strchr("\"\\/bfnrt", e) || e == 0) return -1;
            j->i += 2;
            continue;
        }
        j->i++;
    }
    return -1;
}

static int jdigits(jcur *j) {
    size_t s = j->i;
    while (j->i < j->n && j->s[j->i] >= '0' && j->s[j->i] <= '9') j->i++;
    return (int)(j->i - s > 1000000 ? 1000000 : j->i - s);
}

static int jvalue(jcur *j, int depth);

static int jnumber(jcur *j) {
    size_t start = j->i;
    if (j->s[j->i] == '-') j->i++;
    if (j->i >= j->n) return -1;
    if (j->s[j->i] == '0') j->i++;
    else if (j->s[j->i] >= '1' && j->s[j->i] <= '9') jdigits(j);
    else return -1;
    size_t int_digits = j->i - start;
    int real = 0;
    if (j->i < j->n && j->s[j->i] == '.') {
        j->i++;
        if (jdigits(j) == 0) return -1;
        real = 1;
    }
    if (j->i < j->n && (j->s[j->i] == 'e' || j->s[j->i] == 'E')) {
        j->i++;
        if (j->i < j->n && (j->s[j->i] == '+' || j->s[j->i] == '-')) j->i++;
        if (jdigits(j) == 0) return -1;
        real = 1;
    }
    if (!real && int_digits > 4000) return -1; /* Python's int() refuses long ones */
    return 0;
}

static int jlit(jcur *j, const char *lit) {
    size_t n = strlen(lit);
    if (j->n - j->i < n || memcmp(j->s + j->i, lit, n) != 0) return -1;
    j->i += n;
    return 0;
}

static int jvalue(jcur *j, int depth) {
    int esc;
    if (j->i >= j->n) return -1;
    uint8_t c = j->s[j->i];
    if (c == '"') return jstring(j, &esc);
    if (c == '{' || c == '[') {
        if (depth >= MAX_DEPTH) return -1;
        uint8_t close = c == '{' ? '}' : ']';
        j->i++;
        jws(j);
        if (j->i < j->n && j->s[j->i] == close) { j->i++; return 0; }
        for (;;) {
            if (c == '{') {
                if (j->i >= j->n || j->s[j->i] != '"' || jstring(j, &esc)) return -1;
                jws(j);
                if (j->i >= j->n || j->s[j->i] != ':') return -1;
                j->i++;
                jws(j);
            }
            if (jvalue(j, depth + 1)) return -1;
            jws(j);
            if (j->i >= j->n) return -1;
            if (j->s[j->i] == ',') { j->i++; jws(j); continue; }
            if (j->s[j->i] == close) { j->i++; return 0; }
            return -1;
        }
    }
    if (c == '-' || (c >= '0' && c <= '9')) return jnumber(j);
    if (c == 't') return jlit(j, "true");
    if (c == 'f') return jlit(j, "false");
    if (c == 'n') return jlit(j, "null");
    return -1;
}

/* Walks the object at j->i (nesting level `depth`), checking it as jvalue does and leaving
 * j->i after its '}', and collects the spans of the `nactive` paths of `active` (from part
 * `part` on) among its members. One pass: a member on a path is walked by the recursive
 * call, every other member by jvalue, and nothing is read twice. */
static int jspans(jcur *j, const path_t *paths, const int *active, int nactive, int part,
                  span_t *spans, int *nspans, int depth) {
    const uint8_t *s = j->s;
    size_t n = j->n;
    int esc;
    if (depth >= MAX_DEPTH) return -1;
    j->i++;
    jws(j);
    if (j->i < n && s[j->i] == '}') { j->i++; return 0; }
    for (;;) {
        size_t name_at = j->i + 1;
        if (j->i >= n || s[j->i] != '"' || jstring(j, &esc)) return -1;
        size_t name_len = j->i - 1 - name_at;
        jws(j);
        if (j->i >= n || s[j->i] != ':') return -1;
        j->i++;
        jws(j);
        size_t vstart = j->i;
        int leaf[MAX_PATHS], sub[MAX_PATHS];
        int nleaf = 0, nsub = 0;
        for (int p = 0; p < nactive; p++) {
            const path_t *pp = &paths[active[p]];
            if (pp->len[part] != name_len || memcmp(pp->name[part], s + name_at, name_len))
                continue;
            if (esc) return -1; /* the reference compares unescaped names */
            if (part + 1 == pp->parts) leaf[nleaf++] = active[p];
            else if (vstart < n && s[vstart] == '{') sub[nsub++] = active[p];
        }
        if (esc) {
            /* a name with escapes might equal a path once unescaped: let the reference look */
            for (int p = 0; p < nactive; p++)
                if (paths[active[p]].parts > part) return -1;
        }
        if (nsub ? jspans(j, paths, sub, nsub, part + 1, spans, nspans, depth + 1)
                 : jvalue(j, depth + 1))
            return -1;
        for (int a = 0; a < nleaf; a++) {
            if (*nspans >= MAX_SPANS) return -1;
            spans[*nspans].start = vstart;
            spans[*nspans].end = j->i;
            spans[*nspans].path = leaf[a];
            (*nspans)++;
        }
        jws(j);
        if (j->i >= n) return -1;
        if (s[j->i] == ',') { j->i++; jws(j); continue; }
        if (s[j->i] == '}') { j->i++; return 0; }
        return -1;
    }
}

/* The outermost spans of `paths` in the JSON object `s`, in text order; -1 to decline.
 * The document is read once (jspans checks it while it looks for the paths). */
static int find_field_spans(const uint8_t *s, size_t n, const path_t *paths, int npaths,
                            span_t *out) {
    jcur j = {s, n, 0};
    jws(&j);
    if (j.i >= n || s[j.i] != '{') return -1;
    span_t found[MAX_SPANS];
    int nfound = 0;
    int active[MAX_PATHS];
    for (int p = 0; p < npaths; p++) active[p] = p;
    if (jspans(&j, paths, active, npaths, 0, found, &nfound, 0)) return -1;
    jws(&j);
    if (j.i != n) return -1;
    /* sort by start (insertion: few spans), then keep the outermost */
    for (int a = 1; a < nfound; a++) {
        span_t t = found[a];
        int b = a - 1;
        while (b >= 0 && (found[b].start > t.start ||
                          (found[b].start == t.start && found[b].end > t.end))) {
            found[b + 1] = found[b];
            b--;
        }
        found[b + 1] = t;
    }
    int nout = 0;
    for (int a = 0; a < nfound; a++) {
        if (nout && found[a].start < out[nout - 1].end) continue;
        out[nout++] = found[a];
    }
    return nout;
}

static const char B64[] =
    "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";

static uint8_t *b64url(uint8_t *o, const uint8_t *d, size_t n) {
    size_t i = 0;
    for (; i + 3 <= n; i += 3) {
        uint32_t v = ((uint32_t)d[i] << 16) | ((uint32_t)d[i + 1] << 8) | d[i + 2];
        *o++ = (uint8_t)B64[v >> 18];
        *o++ = (uint8_t)B64[(v >> 12) & 63];
        *o++ = (uint8_t)B64[(v >> 6) & 63];
        *o++ = (uint8_t)B64[v & 63];
    }
    if (n - i == 1) {
        uint32_t v = (uint32_t)d[i] << 16;
        *o++ = (uint8_t)B64[v >> 18];
        *o++ = (uint8_t)B64[(v >> 12) & 63];
    } else if (n - i == 2) {
        uint32_t v = ((uint32_t)d[i] << 16) | ((uint32_t)d[i + 1] << 8);
        *o++ = (uint8_t)B64[v >> 18];
        *o++ = (uint8_t)B64[(v >> 12) & 63];
        *o++ = (uint8_t)B64[(v >> 6) & 63];
    }
    return o;
}

/* The sealed paths of `spans` in order of first appearance: their indexes into `paths`. */
static int sealed_paths(const span_t *spans, int nspans, int *order) {
    int n = 0;
    for (int a = 0; a < nspans; a++) {
        int seen = 0;
        for (int b = 0; b < n; b++) seen |= order[b] == spans[a].path;
        if (!seen) order[n++] = spans[a].path;
    }
    return n;
}

/* The fields-mode digest of a record (crypto/envelope.py): its first `nheaders` headers (the
 * producer's), "F", the `npaths` paths listed (`paths[order[a]]`, or `paths[a]` without an
 * order), then the clear pieces of the value between its `nspans` spans. */
static void fields_digest(const record *r, int64_t nheaders, const path_t *paths,
                          const int *order, int npaths, const span_t *spans, int nspans,
                          uint8_t *out) {
    hbuf h;
    hb_init(&h);
    hash_headers(&h, r, nheaders);
    hb_put(&h, "F", 1);
    hb_len(&h, (size_t)npaths);
    for (int a = 0; a < npaths; a++) {
        const path_t *pp = &paths[order ? order[a] : a];
        hb_len(&h, pp->full_len);
        hb_put(&h, pp->full, pp->full_len);
    }
    hb_len(&h, (size_t)nspans + 1);
    size_t pos = 0;
    for (int a = 0; a <= nspans; a++) {
        size_t end = a < nspans ? spans[a].start : (size_t)r->value_len;
        hb_len(&h, end - pos);
        if (end > pos) hb_put(&h, r->value + pos, end - pos);
        if (a < nspans) pos = spans[a].end;
    }
    hb_final(&h, out);
}

/* The AAD of one field: build_aad's, its empty last part replaced by the field's path. */
static size_t field_aad(uint8_t *aad, const uint8_t *prefix, size_t prefix_len,
                        const record *r, const uint8_t *digest, const path_t *pp) {
    size_t alen = build_aad(aad, prefix, prefix_len, r, digest) - 4;
    be32(aad + alen, (uint32_t)pp->full_len);
    memcpy(aad + alen + 4, pp->full, pp->full_len);
    return alen + 4 + pp->full_len;
}

static int parse_paths(const uint8_t *packed, size_t packed_len, uint32_t npaths,
                       path_t *paths) {
    /* per path: u32 LE length, path bytes, u32 LE length, its JSON string */
    size_t at = 0;
    if (npaths > MAX_PATHS) return -1;
    for (uint32_t p = 0; p < npaths; p++) {
        uint32_t l;
        if (packed_len - at < 4) return -1;
        memcpy(&l, packed + at, 4);
        at += 4;
        if (packed_len - at < l) return -1;
        if (l == 0 || l > 900) return -1;
        paths[p].full = packed + at;
        paths[p].full_len = l;
        paths[p].parts = 0;
        size_t s = 0;
        for (size_t k = 0; k <= l; k++) {
            if (k == l || packed[at + k] == '.') {
                if (paths[p].parts >= MAX_PARTS) return -1;
                paths[p].name[paths[p].parts] = packed + at + s;
                paths[p].len[paths[p].parts] = k - s;
                paths[p].parts++;
                s = k + 1;
            }
        }
        at += l;
        if (packed_len - at < 4) return -1;
        memcpy(&l, packed + at, 4);
        at += 4;
        if (packed_len - at < l) return -1;
        paths[p].json = packed + at;
        paths[p].json_len = l;
        at += l;
    }
    return 0;
}

static const char H_FIELDS_NAME[] = "sluice.enc.fields";

/* With `out` NULL: plans only, *seals = the fields every record would seal (SB_SLOW when a
 * value is not a JSON object the scanner accepts, or a record has more than `max_seals`),
 * and with `plan` the spans found go there (per record: u32 count, then start, end, path
 * per span; at most `plan_cap` words; the words written are returned). Otherwise seals them
 * with `nonces` (12 bytes per field, in order), reading the spans from `plan` (the planning
 * call's over this very section: SB_PLAN when it does not fit it) or, without one, scanning
 * each value again. */
long sb_seal_fields(const uint8_t *in, size_t in_len, uint32_t count, const uint8_t *key,
                    const uint8_t *nonces, size_t nonces_len, const uint8_t *prefix,
                    size_t prefix_len, const uint8_t *packed_paths, size_t packed_len,
                    uint32_t npaths, const uint8_t *ours, size_t ours_len, uint32_t ours_count,
                    uint32_t max_seals, uint8_t *scratch, size_t scratch_len, uint8_t *out,
                    size_t out_cap, uint8_t *fates, uint32_t *records, uint32_t *seals,
                    uint32_t *plan, size_t plan_cap) {
    size_t plan_at = 0;
    static __thread path_t paths[MAX_PATHS];
    static __thread record r;
    span_t spans[MAX_SPANS];
    int order[MAX_SPANS];
    cursor c = {in, in + in_len};
    uint8_t *o = out;
    uint8_t *limit = out ? out + out_cap : NULL; /* the planning call has no output */
    long rc = 0;
    uint8_t digest[32];
    gcm_t g = {0};
    *records = 0;
    *seals = 0;
    if (parse_paths(packed_paths, packed_len, npaths, paths)) return SB_SLOW;
    if (out) {
        if (gcm_new(&g, 1, key)) {
            rc = SB_CRYPTO;
            goto done;
        }
        gcm_prefix(&g, prefix, prefix_len);
    }
    for (uint32_t i = 0; i < count; i++) {
        const uint8_t *rec_start;
        size_t raw;
        if ((rc = next_record(&c, &r, &rec_start, &raw))) goto done;
        int nspans = 0;
        if (out && plan) { /* the planning call's spans for this record */
            /* Checked, not trusted: each span inside the value, after the one before, on a
             * path given, so no byte outside the value is read. A plan that does not fit the
             * section is refused; one of another section whose spans happen to fit is not
             * told apart (the caller's tie of plan to section is what keeps that out). */
            if (plan_cap - plan_at < 1) { rc = SB_PLAN; goto done; }
            uint32_t want = plan[plan_at++];
            size_t vlen = r.value_len < 0 ? 0 : (size_t)r.value_len;
            if (want > MAX_SPANS || plan_cap - plan_at < 3 * (size_t)want ||
                (want && r.value_len < 0)) {
                rc = SB_PLAN;
                goto done;
            }
            nspans = (int)want;
            size_t prev = 0;
            for (int a = 0; a < nspans; a++, plan_at += 3) {
                uint32_t start = plan[plan_at], end = plan[plan_at + 1], path = plan[plan_at + 2];
                if (start < prev || end < start || end > vlen || path >= npaths) {
                    rc = SB_PLAN;
                    goto done;
                }
                spans[a].start = start;
                spans[a].end = end;
                spans[a].path = (int)path;
                prev = end;
            }
        } else if (r.value_len >= 0) {
            nspans = find_field_spans(r.value, (size_t)r.value_len, paths, (int)npaths, spans);
            if (nspans < 0 || (uint32_t)nspans > max_seals) { rc = SB_SLOW; goto done; }
        }
        if (!out) {
            *seals += (uint32_t)nspans;
            if (plan) {
                if (plan_cap - plan_at < 1 + 3 * (size_t)nspans) { rc = SB_SPACE; goto done; }
                plan[plan_at++] = (uint32_t)nspans;
                for (int a = 0; a < nspans; a++, plan_at += 3) {
                    plan[plan_at] = (uint32_t)spans[a].start;
                    plan[plan_at + 1] = (uint32_t)spans[a].end;
                    plan[plan_at + 2] = (uint32_t)spans[a].path;
                }
            }
            continue;
        }
        if (nspans == 0) { /* a tombstone, or none of the fields: stored as it is */
            if ((size_t)(limit - o) < raw) { rc = SB_SPACE; goto done; }
            memcpy(o, rec_start, raw);
            o += raw;
            fates[i] = 0;
            continue;
        }
        int nsealed = sealed_paths(spans, nspans, order);
        /* the fields header's value: ["a","b"] */
        size_t fields_len = 2 + (size_t)(nsealed - 1);
        for (int a = 0; a < nsealed; a++) fields_len += paths[order[a]].json_len;
        /* scratch: [AAD | nonce, ciphertext, tag] then the new value */
        size_t value_bound = (size_t)r.value_len + (size_t)r.value_len / 2 + (size_t)nspans * 64;
        size_t aad_room = prefix_len + (size_t)(r.key_len > 0 ? r.key_len : 0) + 64 + 1024 +
                          NONCE + (size_t)r.value_len + TAG;
        if (scratch_len < aad_room + value_bound) { rc = SB_SPACE; goto done; }
        /* digest: the producer's headers, F, the sealed paths, the clear pieces */
        fields_digest(&r, r.header_count, paths, order, nsealed, spans, nspans, digest);
        uint8_t *v = scratch + aad_room;
        uint8_t *vo = v;
        size_t pos = 0;
        for (int a = 0; a < nspans; a++) {
            const path_t *pp = &paths[spans[a].path];
            memcpy(vo, r.value + pos, spans[a].start - pos);
            vo += spans[a].start - pos;
            if ((size_t)(*seals + 1) * NONCE > nonces_len) { rc = SB_SPACE; goto done; }
            const uint8_t *nonce = nonces + (size_t)(*seals) * NONCE;
            /* AAD: prefix, key, digest, path */
            uint8_t *aad = scratch;
            size_t alen = field_aad(aad, prefix, prefix_len, &r, digest, pp);
            uint8_t *sealed = aad + alen;
            memcpy(sealed, nonce, NONCE);
            size_t plen = spans[a].end - spans[a].start;
            if (gcm_seal(&g, nonce, aad, alen, r.value + spans[a].start, plen,
                         sealed + NONCE)) {
                rc = SB_CRYPTO;
                goto done;
            }
            memcpy(vo, "\"sluice:enc:1:", 14);
            vo = b64url(vo + 14, sealed, NONCE + plen + TAG);
            *vo++ = '"';
            pos = spans[a].end;
            (*seals)++;
        }
        memcpy(vo, r.value + pos, (size_t)r.value_len - pos);
        vo += (size_t)r.value_len - pos;
        size_t vlen = (size_t)(vo - v);
        /* headers: the producer's, ours, then sluice.enc.fields */
        size_t fh_len = varint_len((int64_t)(sizeof(H_FIELDS_NAME) - 1)) +
                        sizeof(H_FIELDS_NAME) - 1 + varint_len((int64_t)fields_len) +
                        fields_len;
        size_t head = (size_t)(r.key_end - r.start);
        int64_t hcount = r.header_count + ours_count + 1;
        size_t hbytes = r.hoff[r.header_count];
        size_t body = head + varint_len((int64_t)vlen) + vlen + varint_len(hcount) + hbytes +
                      ours_len + fh_len;
        if ((size_t)(limit - o) < body + 10) { rc = SB_SPACE; goto done; }
        uint8_t *w = wr_varint(o, (int64_t)body);
        memcpy(w, r.start, head);
        w += head;
        w = wr_varint(w, (int64_t)vlen);
        memcpy(w, v, vlen);
        w += vlen;
        w = wr_varint(w, hcount);
        memcpy(w, r.headers, hbytes);
        w += hbytes;
        memcpy(w, ours, ours_len);
        w += ours_len;
        w = wr_varint(w, (int64_t)(sizeof(H_FIELDS_NAME) - 1));
        memcpy(w, H_FIELDS_NAME, sizeof(H_FIELDS_NAME) - 1);
        w += sizeof(H_FIELDS_NAME) - 1;
        w = wr_varint(w, (int64_t)fields_len);
        *w++ = '[';
        for (int a = 0; a < nsealed; a++) {
            if (a) *w++ = ',';
            memcpy(w, paths[order[a]].json, paths[order[a]].json_len);
            w += paths[order[a]].json_len;
        }
        *w++ = ']';
        o = w;
        fates[i] = 1;
        (*records)++;
    }
    if (c.p != c.end) { rc = SB_MALFORMED; goto done; }
    if (out && plan && plan_at != plan_cap) { rc = SB_PLAN; goto done; }
    rc = out ? (long)(o - out) : (long)plan_at;
done:
    gcm_done(&g, rc);
    return rc;
}

/* ------------------------------------------------------------------ fields mode (fetch) */

/* base64url's alphabet as values (0-63); BAD (a bit above them) for any other byte, so one
 * OR over a group of four tells whether all four are in the alphabet. */
#define BAD 0x100
static const uint16_t B64DEC[256] = {
    BAD, BAD, BAD, BAD, BAD, BAD, BAD, BAD, BAD, BAD, BAD, BAD, BAD, BAD, BAD, BAD,
    BAD, BAD, BAD, BAD, BAD, BAD, BAD, BAD, BAD, BAD, BAD, BAD, BAD, BAD, BAD, BAD,
    BAD, BAD, BAD, BAD, BAD, BAD, BAD, BAD, BAD, BAD, BAD, BAD, BAD, 62, BAD, BAD,
    52, 53, 54, 55, 56, 57, 58, 59, 60, 61, BAD, BAD, BAD, BAD, BAD, BAD,
    BAD, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14,
    15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, BAD, BAD, BAD, BAD, 63,
    BAD, 26, 27, 28, 29, 30, 31, 32, 33, 34, 35, 36, 37, 38, 39, 40,
    41, 42, 43, 44, 45, 46, 47, 48, 49, 50, 51, BAD, BAD, BAD, BAD, BAD,
    BAD, BAD, BAD, BAD, BAD, BAD, BAD, BAD, BAD, BAD, BAD, BAD, BAD, BAD, BAD, BAD,
    BAD, BAD, BAD, BAD, BAD, BAD, BAD, BAD, BAD, BAD, BAD, BAD, BAD, BAD, BAD, BAD,
    BAD, BAD, BAD, BAD, BAD, BAD, BAD, BAD, BAD, BAD, BAD, BAD, BAD, BAD, BAD, BAD,
    BAD, BAD, BAD, BAD, BAD, BAD, BAD, BAD, BAD, BAD, BAD, BAD, BAD, BAD, BAD, BAD,
    BAD, BAD, BAD, BAD, BAD, BAD, BAD, BAD, BAD, BAD, BAD, BAD, BAD, BAD, BAD, BAD,
    BAD, BAD, BAD, BAD, BAD, BAD, BAD, BAD, BAD, BAD, BAD, BAD, BAD, BAD, BAD, BAD,
    BAD, BAD, BAD, BAD, BAD, BAD, BAD, BAD, BAD, BAD, BAD, BAD, BAD, BAD, BAD, BAD,
    BAD, BAD, BAD, BAD, BAD, BAD, BAD, BAD, BAD, BAD, BAD, BAD, BAD, BAD, BAD, BAD,
};
#undef BAD

/* base64url without padding; -1 on a character outside the alphabet or a length of 4n+1.
 * The bits of a last group that make no whole byte are dropped (as Python's decoder does).
 * Four characters per step through a table: the ciphertext's characters are random, so a
 * test per character (a branch on its range) was mispredicted about once a byte. */
static long unb64url(const uint8_t *s, size_t n, uint8_t *o) {
    if (n % 4 == 1) return -1;
    uint8_t *start = o;
    uint32_t bad = 0;
    size_t i = 0;
    for (; i + 4 <= n; i += 4) {
        uint32_t a = B64DEC[s[i]], b = B64DEC[s[i + 1]], c = B64DEC[s[i + 2]],
                 d = B64DEC[s[i + 3]];
        bad |= a | b | c | d;
        uint32_t v = (a << 18) | (b << 12) | (c << 6) | d;
        o[0] = (uint8_t)(v >> 16);
        o[1] = (uint8_t)(v >> 8);
        o[2] = (uint8_t)v;
        o += 3;
    }
    if (n - i >= 2) { /* 2 characters: one byte; 3: two */
        uint32_t a = B64DEC[s[i]], b = B64DEC[s[i + 1]];
        uint32_t c = n - i == 3 ? B64DEC[s[i + 2]] : 0;
        bad |= a | b | c;
        uint32_t v = (a << 18) | (b << 12) | (c << 6);
        *o++ = (uint8_t)(v >> 16);
        if (n - i == 3) *o++ = (uint8_t)(v >> 8);
    }
    if (bad & 0x100) return -1;
    return (long)(o - start);
}

/* The paths of a sluice.enc.fields value as the proxy writes it (["a","b"], no escapes, no
 * spaces, no duplicates); -1 for anything else. */
static int parse_fields_header(const uint8_t *v, size_t n, path_t *paths) {
    size_t i = 1;
    int np = 0;
    if (n < 2 || v[0] != '[' || v[n - 1] != ']') return -1;
    if (n == 2) return -1;
    for (;;) {
        if (i >= n || v[i] != '"') return -1;
        size_t s = ++i;
        while (i < n && v[i] != '"') {
            if (v[i] == '\\' || v[i] < 0x20) return -1;
            i++;
        }
        if (i >= n || i == s || i - s > 900 || np >= MAX_PATHS) return -1;
        path_t *p = &paths[np];
        p->full = v + s;
        p->full_len = i - s;
        p->parts = 0;
        size_t a = s;
        for (size_t k = s; k <= i; k++) {
            if (k == i || v[k] == '.') {
                if (p->parts >= MAX_PARTS) return -1;
                p->name[p->parts] = v + a;
                p->len[p->parts] = k - a;
                p->parts++;
                a = k + 1;
            }
        }
        for (int q = 0; q < np; q++)
            if (paths[q].full_len == p->full_len && !memcmp(paths[q].full, p->full, p->full_len))
                return -1;
        np++;
        i++;
        if (i < n && v[i] == ',') { i++; continue; }
        if (i == n - 1) break;
        return -1;
    }
    if (!utf8_ok(v, n)) return -1;
    return np;
}

long sb_open_fields(const uint8_t *in, size_t in_len, uint32_t count, const uint8_t *key,
                    const uint8_t *prefix, size_t prefix_len, const uint8_t *group3,
                    size_t group3_len, uint32_t group3_count, uint8_t *scratch,
                    size_t scratch_len, uint8_t *out, size_t out_cap, uint8_t *fates,
                    uint32_t *where, uint32_t *opened) {
    static __thread path_t paths[MAX_PATHS];
    static __thread record r;
    span_t spans[MAX_SPANS];
    cursor c = {in, in + in_len};
    uint8_t *o = out;
    uint8_t *limit = out + out_cap;
    long rc = 0;
    uint8_t digest[32];
    const uint8_t *last_fields = NULL; /* the sluice.enc.fields value `paths` was parsed from */
    int64_t last_fields_len = 0;
    int npaths = 0;
    size_t scratch_used = 0; /* how far the opened values in `scratch` reached */
    *opened = 0;
    gcm_t g = {0};
    if (scratch_len < prefix_len + 48) {
        rc = SB_SPACE;
        goto done;
    }
    if (gcm_new(&g, 0, key)) {
        rc = SB_CRYPTO;
        goto done;
    }
    gcm_prefix(&g, prefix, prefix_len);
    memcpy(scratch, prefix, prefix_len);
    for (uint32_t i = 0; i < count; i++) {
        const uint8_t *rec_start;
        size_t raw;
        if ((rc = next_record(&c, &r, &rec_start, &raw))) goto done;
        if ((size_t)(limit - o) < raw) { rc = SB_SPACE; goto done; }
        if (r.last_enc < 0) {
            memcpy(o, rec_start, raw);
            o += raw;
            fates[i] = 0;
            continue;
        }
        *where = i;
        int64_t start = r.last_enc;
        /* the group: `group3` (the proxy's headers before sluice.enc.fields: one in layout 3,
         * three in layout 2), then sluice.enc.fields */
        int64_t nc = (int64_t)group3_count;
        if (r.header_count - start != nc + 1 || r.hoff[start + nc] - r.hoff[start] != group3_len ||
            memcmp(r.headers + r.hoff[start], group3, group3_len) != 0 || r.value_len < 0) {
            rc = SB_SLOW;
            goto done;
        }
        const uint8_t *fname = NULL, *fval = NULL;
        int64_t fnlen = 0, fvlen = -1;
        cursor hc = {r.headers + r.hoff[start + nc], r.headers + r.hoff[start + nc + 1]};
        rd_blob(&hc, &fname, &fnlen);
        rd_blob(&hc, &fval, &fvlen);
        if (fnlen != (int64_t)(sizeof(H_FIELDS_NAME) - 1) ||
            memcmp(fname, H_FIELDS_NAME, sizeof(H_FIELDS_NAME) - 1) || fvlen < 0) {
            rc = SB_SLOW;
            goto done;
        }
        /* A batch's records list the same fields: parse the list once per distinct one
         * (`paths` points into the bytes of the record it was parsed from, equal to these). */
        if (!last_fields || fvlen != last_fields_len ||
            memcmp(fval, last_fields, (size_t)fvlen) != 0) {
            npaths = parse_fields_header(fval, (size_t)fvlen, paths);
            if (npaths < 0) { rc = SB_SLOW; goto done; }
            last_fields = fval;
            last_fields_len = fvlen;
        }
        int nspans = find_field_spans(r.value, (size_t)r.value_len, paths, npaths, spans);
        if (nspans < 0) { rc = SB_SLOW; goto done; }
        for (int q = 0; q < npaths; q++) { /* every listed field present, else tampered */
            int seen = 0;
            for (int a = 0; a < nspans; a++) seen |= spans[a].path == q;
            if (!seen) { rc = SB_SLOW; goto done; }
        }
        size_t aad_room = prefix_len + (size_t)(r.key_len > 0 ? r.key_len : 0) + 64 + 1024 +
                          (size_t)r.value_len;
        if (scratch_len < aad_room + (size_t)r.value_len) { rc = SB_SPACE; goto done; }
        if (scratch_used < aad_room + (size_t)r.value_len)
            scratch_used = aad_room + (size_t)r.value_len;
        /* digest: the producer's headers, F, the listed paths, the clear pieces */
        fields_digest(&r, start, paths, NULL, npaths, spans, nspans, digest);
        /* the new value goes after the AAD room of scratch */
        uint8_t *v = scratch + aad_room;
        uint8_t *vo = v;
        size_t pos = 0;
        for (int a = 0; a < nspans; a++) {
            const path_t *pp = &paths[spans[a].path];
            const uint8_t *lit = r.value + spans[a].start;
            size_t lit_len = spans[a].end - spans[a].start;
            if (lit_len < 16 || memcmp(lit, "\"sluice:enc:1:", 14) || lit[lit_len - 1] != '"') {
                rc = SB_SLOW;
                goto done;
            }
            memcpy(vo, r.value + pos, spans[a].start - pos);
            vo += spans[a].start - pos;
            uint8_t *aad = scratch;
            size_t alen = field_aad(aad, prefix, prefix_len, &r, digest, pp);
            uint8_t *sealed = aad + alen;
            long slen = unb64url(lit + 14, lit_len - 15, sealed);
            if (slen < NONCE + TAG) { rc = SB_SLOW; goto done; }
            size_t ct_len = (size_t)slen - NONCE - TAG;
            int bad = gcm_open(&g, sealed, aad, alen, sealed + NONCE, ct_len, vo);
            if (bad) { rc = bad > 0 ? SB_TAMPERED : SB_CRYPTO; goto done; }
            if (!utf8_ok(vo, ct_len)) { rc = SB_SLOW; goto done; }
            vo += ct_len;
            pos = spans[a].end;
        }
        memcpy(vo, r.value + pos, (size_t)r.value_len - pos);
        vo += (size_t)r.value_len - pos;
        size_t vlen = (size_t)(vo - v);
        o = emit(o, &r, v, vlen, NULL, 0, NULL, 0, start, NULL, 0, 0);
        fates[i] = 1;
        (*opened)++;
    }
    if (c.p != c.end) { rc = SB_MALFORMED; goto done; }
    rc = (long)(o - out);
done:
    /* as sb_open_values: a declined call leaves no opened field behind, in `out` (within
     * the input's size: opened records are shorter) or in `scratch` (the new values) */
    if (rc < 0) {
        OPENSSL_cleanse(out, out_cap < in_len ? out_cap : in_len);
        if (scratch_used) OPENSSL_cleanse(scratch, scratch_used);
    }
    gcm_done(&g, rc);
    return rc;
}
