/* The host's SHA-256 pass for guests with the `host_sha256` capability (docs/FILTER_ABI.md):
 * after a successful sluice_filter_records call, the guest's request slot names a table of
 * hash requests in its memory; each asks for the lowercase hex SHA-256 of two spans of guest
 * memory (prefix, then data: a salt and a field) written over a placeholder of 64 '0' bytes
 * inside the output's records section. One call per batch hashes them all, with OpenSSL's
 * SHA-256 compression (SHA-NI where the CPU has it; OpenSSL picks at run time).
 *
 * Compiled at install (filters/host_sha256_build.py, cffi API mode, against libcrypto). The
 * table is the guest's, so nothing in it is trusted: every check happens before the first
 * byte is written, and a failed check leaves guest memory as it was and returns a negative
 * code (the host then redoes the batch through sluice_filter, where the guest hashes itself).
 */
#include <stdint.h>
#include <string.h>
#include <openssl/sha.h>
/* HS_PORTABLE: built as on any other CPU, without the SHA-NI lanes (a test builds it so). */
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__)) && !defined(HS_PORTABLE)
#include <cpuid.h>
#include <immintrin.h>
#define HS_SHANI 1
#endif

#define HS_SLOT (-1)        /* the request slot lies outside guest memory */
#define HS_TABLE (-2)       /* the table lies outside guest memory */
#define HS_COUNT (-3)       /* more entries than HS_MAX_ENTRIES or HS_PER_RECORD a record */
#define HS_OUTPUT (-4)      /* the output has no records section to write into */
#define HS_OVERLAP (-5)     /* the table overlaps the records section */
#define HS_SPAN (-6)        /* a span lies outside guest memory or inside the records section */
#define HS_TARGET (-7)      /* a digest's place is outside the records section or out of order */
#define HS_PLACEHOLDER (-8) /* a digest's place does not hold 64 '0' bytes */
#define HS_BUDGET (-9)      /* the spans add up to more than HS_MAX_BYTES */

#define HS_MAX_ENTRIES (1u << 20)
/* Entries per record of the batch: the pass runs outside the guest's deadline, which grows by
 * RECORD_BUDGET_US (100 us) a record (abi_sluice.py); one entry costs one compression (~60 ns
 * with its checks) whatever its length, so without this a one-record batch could ask for 1M of
 * them (~60 ms outside a 100 ms deadline). builtin:rules asks at most one per hash rule
 * (MAX_RULES: 64) per record. */
#define HS_PER_RECORD 64u
#define HS_MAX_BYTES (4u << 20)
#define HS_ENTRY 20 /* u32 prefix_ptr, prefix_len, data_ptr, data_len, out_ptr */

static inline uint32_t rd32(const uint8_t *p) {
    uint32_t v;
    memcpy(&v, p, 4); /* little-endian, as Wasm memory is (x86-64, arm64) */
    return v;
}

/* Whether [at, at + n) lies inside [0, size) (64-bit sums: no wrap). */
static inline int inside(uint64_t at, uint64_t n, uint64_t size) { return at <= size && n <= size - at; }

/* Whether [a, a + an) and [b, b + bn) share a byte. */
static inline int overlaps(uint64_t a, uint64_t an, uint64_t b, uint64_t bn) {
    return an && bn && a < b + bn && b < a + an;
}

static const char HEX[] = "0123456789abcdef";

static void put_hex(const uint32_t h[8], uint8_t *out) {
    for (int i = 0; i < 8; i++)
        for (int k = 0; k < 4; k++) {
            uint8_t b = (uint8_t)(h[i] >> (24 - 8 * k));
            out[8 * i + 2 * k] = (uint8_t)HEX[b >> 4];
            out[8 * i + 2 * k + 1] = (uint8_t)HEX[b & 15];
        }
}

/* The prefix's whole 64-byte blocks compressed (state in c->h), its remaining bytes in tail. */
typedef struct {
    SHA256_CTX c;
    const uint8_t *ptr;
    uint32_t len;
    uint32_t tail_len;
    uint8_t tmpl[64]; /* the tail, then zeros: the start of every one-block message */
} prefix_state;

static void prefix_init(prefix_state *s, const uint8_t *p, uint32_t n) {
    SHA256_Init(&s->c);
    uint32_t at = 0;
    for (; n - at >= 64; at += 64) SHA256_Transform(&s->c, p + at);
    s->ptr = p;
    s->len = n;
    s->tail_len = n - at;
    memset(s->tmpl, 0, 64);
    memcpy(s->tmpl, p + at, s->tail_len);
}

/* The hex SHA-256 of prefix || data[0..n) into out[0..64). */
static void digest(const prefix_state *s, const uint8_t *data, uint32_t n, uint8_t *out) {
    SHA256_CTX c = s->c;
    uint8_t block[128];
    uint64_t bits = ((uint64_t)s->len + n) * 8u;
    uint32_t fill = s->tail_len;
    memcpy(block, s->ptr + (s->len - s->tail_len), fill);
    while (fill + n >= 64) {
        uint32_t take = 64 - fill;
        memcpy(block + fill, data, take);
        SHA256_Transform(&c, block);
        data += take;
        n -= take;
        fill = 0;
    }
    memcpy(block + fill, data, n);
    fill += n;
    block[fill++] = 0x80;
    uint32_t last = fill <= 56 ? 56 : 120;
    memset(block + fill, 0, last - fill);
    for (int i = 0; i < 8; i++) block[last + i] = (uint8_t)(bits >> (56 - 8 * i));
    SHA256_Transform(&c, block);
    if (last == 120) SHA256_Transform(&c, block + 64);
    put_hex(c.h, out);
}

/* Where the CPU has the SHA extensions (x86-64 SHA-NI, checked once with cpuid), the final
 * block of four requests at a time goes through them directly: the instructions' latency leaves
 * room for independent messages (one: ~45 ns a block here, four side by side: ~20 ns each), and
 * a call into OpenSSL per block cost more than the block. Everything else (a long prefix's midstate, a data span over one block) uses OpenSSL. */
#ifdef HS_SHANI
static const uint32_t K256[64] = {
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
    0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
    0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
    0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
    0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
    0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
    0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2};

static int shani_ok = -1;
static int level_cap = -1; /* -1: not capped (hs_set_level), the CPU's default path */
static int default_cap = 2;

/* 0: no SHA extensions; 1: SHA-NI; 2: SHA-NI, and AVX-512 (F, BW, VL, VBMI) with the OS saving
 * its registers (XCR0: SSE, AVX, opmask and both ZMM halves), for hash_wide. By default
 * hash_wide runs on AMD CPUs only: on an Intel Xeon its 512-bit instructions made the whole
 * native call slower, not just the pass (builtin:rules on the bench batch: ~136 against ~101
 * µs a batch with the SHA-NI path, thread CPU, load ~5; why was not measured: the machine's VM
 * exposes no performance counters); on Zen 4 it was the faster path. hs_set_level(2) still
 * forces it where the CPU can run it (tests), hs_reset_level goes back to the default. Hygon's
 * Zen-based CPUs (not measured) take the SHA-NI lanes by default too. */
static int have_shani(void) {
    int have = __atomic_load_n(&shani_ok, __ATOMIC_ACQUIRE);
    if (have < 0) {
        unsigned a, b, c, d;
        int ok = __get_cpuid(1, &a, &b, &c, &d) && (c & (1u << 9)) && (c & (1u << 19)); /* SSSE3, SSE4.1 */
        int osxsave = ok && (c & (1u << 27));
        ok = ok && __get_cpuid_count(7, 0, &a, &b, &c, &d) && (b & (1u << 29));           /* SHA */
        int vl = ok && osxsave && (b & (1u << 16)) && (b & (1u << 30)) && (b & (1u << 31)) /* F, BW, VL */
                 && (c & (1u << 1));                                                     /* VBMI */
        if (vl) {
            unsigned lo, hi;
            __asm__("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
            vl = (lo & 0xe6u) == 0xe6u;
        }
        unsigned vendor[4] = {0};
        __get_cpuid(0, &vendor[3], &vendor[0], &vendor[2], &vendor[1]); /* EBX, EDX, ECX */
        if (memcmp(vendor, "AuthenticAMD", 12) != 0) __atomic_store_n(&default_cap, 1, __ATOMIC_RELAXED);
        /* Stored last, with release: the pass runs on several threads without the GIL, and a
         * thread that sees shani_ok set must see default_cap as well. Two threads may both
         * work it out the first time; they store the same values. */
        have = ok ? 1 + vl : 0;
        __atomic_store_n(&shani_ok, have, __ATOMIC_RELEASE);
    }
    int cap = __atomic_load_n(&level_cap, __ATOMIC_RELAXED);
    if (cap < 0) cap = __atomic_load_n(&default_cap, __ATOMIC_RELAXED);
    return have < cap ? have : cap;
}

#define SHANI __attribute__((target("sha,sse4.1,ssse3")))
/* Where AVX-512 is usable (hash_wide): its 32 vector registers hold the four lanes' states and
 * schedules that spill to the stack with 16, and its masked 64-byte loads and byte permutes
 * build each block and write each hex digest in a few instructions (the SHA instructions are
 * the same). */
#define SHANI_WIDE __attribute__((target("sha,sse4.1,ssse3,avx2,avx512f,avx512vl,avx512bw,avx512vbmi")))

/* Two messages' states in the instructions' order: abef = (A, B, E, F), cdgh = (C, D, G, H),
 * A in the top lane. */
SHANI static inline void to_lanes(const uint32_t h[8], __m128i *abef, __m128i *cdgh) {
    __m128i abcd = _mm_shuffle_epi32(_mm_loadu_si128((const __m128i *)h), 0xB1);       /* B A D C */
    __m128i efgh = _mm_shuffle_epi32(_mm_loadu_si128((const __m128i *)(h + 4)), 0x1B); /* H G F E */
    *abef = _mm_alignr_epi8(abcd, efgh, 8);
    *cdgh = _mm_blend_epi16(efgh, abcd, 0xF0);
}

/* 16 digest bytes as 32 lowercase hex digits at out. */
SHANI static inline void hex16(__m128i bytes, uint8_t *out) {
    const __m128i digits = _mm_setr_epi8('0', '1', '2', '3', '4', '5', '6', '7', '8', '9', 'a', 'b',
                                         'c', 'd', 'e', 'f');
    const __m128i low4 = _mm_set1_epi8(15);
    __m128i hi = _mm_shuffle_epi8(digits, _mm_and_si128(_mm_srli_epi16(bytes, 4), low4));
    __m128i lo = _mm_shuffle_epi8(digits, _mm_and_si128(bytes, low4));
    _mm_storeu_si128((__m128i *)out, _mm_unpacklo_epi8(hi, lo));
    _mm_storeu_si128((__m128i *)(out + 16), _mm_unpackhi_epi8(hi, lo));
}

#ifndef LANES
#define LANES 4
#endif

/* The 64 rounds of each lane over its block blk[j] (`swapped`: its words already in the CPU's
 * byte order, else big-endian as the message has them), from the start states (abef, cdgh) to
 * the states before the start is added back. Inlined into final_blocks and final_blocks_wide,
 * compiled for each target; the block's words are loaded in the first groups' rounds (all
 * loaded first, the AVX-512 build ran ~0.3 us a 100-request pass slower). */
SHANI static inline __attribute__((always_inline)) void rounds(__m128i abef[LANES], __m128i cdgh[LANES],
                                                              const uint8_t (*blk)[64], int swapped) {
    __m128i m[LANES][4];
#pragma GCC unroll 16
    for (int g = 0; g < 16; g++) {
        /* Unrolled too: as a loop, the lanes' states and schedules went through the stack
         * every round (a store and a reload around each pair of sha256rnds2). */
#pragma GCC unroll 8
        for (int j = 0; j < LANES; j++) {
            __m128i *w = m[j];
            if (g < 4) {
                w[g] = _mm_loadu_si128((const __m128i *)(blk[j] + 16 * g));
                if (!swapped)
                    w[g] = _mm_shuffle_epi8(w[g], _mm_set_epi64x(0x0c0d0e0f08090a0bLL, 0x0405060700010203LL));
            } else { /* W[4g..4g+3] from the four groups before it */
                __m128i t = _mm_sha256msg1_epu32(w[g % 4], w[(g + 1) % 4]);
                t = _mm_add_epi32(t, _mm_alignr_epi8(w[(g + 3) % 4], w[(g + 2) % 4], 4));
                w[g % 4] = _mm_sha256msg2_epu32(t, w[(g + 3) % 4]);
            }
            __m128i wk = _mm_add_epi32(w[g % 4], _mm_loadu_si128((const __m128i *)(K256 + 4 * g)));
            cdgh[j] = _mm_sha256rnds2_epu32(cdgh[j], abef[j], wk);
            abef[j] = _mm_sha256rnds2_epu32(abef[j], cdgh[j], _mm_shuffle_epi32(wk, 0x0E));
        }
    }
}

/* The final blocks blk[j] compressed onto the states h[j]; their hex digests to out[j]. */
SHANI static void final_blocks(uint32_t h[LANES][8], uint8_t blk[LANES][64], uint8_t *const out[LANES]) {
    const __m128i be = _mm_set_epi64x(0x0c0d0e0f08090a0bLL, 0x0405060700010203LL);
    __m128i abef[LANES], cdgh[LANES];
    for (int j = 0; j < LANES; j++) to_lanes(h[j], &abef[j], &cdgh[j]);
    rounds(abef, cdgh, (const uint8_t (*)[64])blk, 0);
    for (int j = 0; j < LANES; j++) {
        __m128i abef0, cdgh0; /* the start state again: fewer registers than keeping it */
        to_lanes(h[j], &abef0, &cdgh0);
        __m128i s0 = _mm_shuffle_epi32(_mm_add_epi32(abef[j], abef0), 0x1B); /* A B E F */
        __m128i s1 = _mm_shuffle_epi32(_mm_add_epi32(cdgh[j], cdgh0), 0xB1); /* G H C D */
        hex16(_mm_shuffle_epi8(_mm_blend_epi16(s0, s1, 0xF0), be), out[j]);
        hex16(_mm_shuffle_epi8(_mm_alignr_epi8(s1, s0, 8), be), out[j] + 32);
    }
}

/* The same with AVX-512: the blocks come already byte-swapped (block_wide), the start states
 * already in the lanes' order (st[j]: abef, cdgh; to_lanes once per salt, not twice a lane), and
 * each digest is written as hex by one byte permute of the two state vectors (each byte
 * twice, in the digest's order) and a nibble look-up. */
SHANI_WIDE static void final_blocks_wide(const __m128i st[LANES][2], const uint8_t blk[LANES][64],
                                         uint8_t *const out[LANES]) {
    __m128i abef[LANES], cdgh[LANES];
    for (int j = 0; j < LANES; j++) {
        abef[j] = st[j][0];
        cdgh[j] = st[j][1];
    }
    rounds(abef, cdgh, blk, 1);
    /* Byte 2i and 2i+1 of the hex: digest byte i; in (abef, cdgh) as little-endian words, A at
     * byte 12, B 8, E 4, F 0, and C, D, G, H at 28, 24, 20, 16. */
    const __m512i pick = _mm512_set_epi8(
        16, 16, 17, 17, 18, 18, 19, 19, 20, 20, 21, 21, 22, 22, 23, 23,  /* H, G */
        0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7,                  /* F, E */
        24, 24, 25, 25, 26, 26, 27, 27, 28, 28, 29, 29, 30, 30, 31, 31,  /* D, C */
        8, 8, 9, 9, 10, 10, 11, 11, 12, 12, 13, 13, 14, 14, 15, 15);     /* B, A */
    const __m512i digits = _mm512_broadcast_i32x4(_mm_setr_epi8(
        '0', '1', '2', '3', '4', '5', '6', '7', '8', '9', 'a', 'b', 'c', 'd', 'e', 'f'));
    for (int j = 0; j < LANES; j++) {
        __m256i both = _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_add_epi32(abef[j], st[j][0])),
                                               _mm_add_epi32(cdgh[j], st[j][1]), 1);
        __m512i twice = _mm512_permutexvar_epi8(pick, _mm512_castsi256_si512(both));
        /* even bytes: the high nibble (the 16-bit shift brings it down), odd: the low one */
        __m512i nib = _mm512_and_si512(_mm512_mask_mov_epi8(twice, 0x5555555555555555ull,
                                                            _mm512_srli_epi16(twice, 4)),
                                       _mm512_set1_epi8(15));
        _mm512_storeu_si512(out[j], _mm512_shuffle_epi8(digits, nib));
    }
}
#endif

/* Caps the code path (0 OpenSSL, 1 SHA-NI, 2 SHA-NI with AVX-512: hash_wide) so tests reach
 * every path this CPU can run; returns the path then in use. Defined on every CPU (0 where the lanes are
 * not compiled: the module declares it, so a missing one fails the build), and a cap below 0
 * is 0 (hs_run takes any non-zero path for SHA-NI). */
int hs_set_level(int cap) {
#ifdef HS_SHANI
    __atomic_store_n(&level_cap, cap < 0 ? 0 : cap, __ATOMIC_RELAXED);
    return have_shani();
#else
    (void)cap;
    return 0;
#endif
}

/* Back to the CPU's default path (no cap: see have_shani); returns the path then in use. */
int hs_reset_level(void) {
#ifdef HS_SHANI
    __atomic_store_n(&level_cap, -1, __ATOMIC_RELAXED);
    return have_shani();
#else
    return 0;
#endif
}

/* Whether prefix tail || data || padding fits one block; if so, that block into blk. `room`:
 * whether the 64 bytes from data - s->tail_len lie inside guest memory. The variable-length
 * copies and the memset were three libc calls an entry; with room, the block is made in
 * registers from the prefix's template (tail, then zeros: s->tmpl) and those 64 bytes, each
 * byte chosen by comparing its index with the tail's and the message's ends. */
static inline int one_block(const prefix_state *s, const uint8_t *data, uint32_t n, int room,
                            uint8_t blk[64]) {
    uint32_t fill = s->tail_len + n;
    if (fill > 55) return 0;
#ifdef HS_SHANI
    if (room) {
        const uint8_t *src = data - s->tail_len; /* block byte i is src[i] for tail_len <= i < fill */
        const __m128i hi = _mm_set1_epi8((char)fill), lo = _mm_set1_epi8((char)(s->tail_len - 1));
#pragma GCC unroll 4
        for (int q = 0; q < 4; q++) {
            __m128i idx = _mm_add_epi8(_mm_setr_epi8(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                                       _mm_set1_epi8((char)(16 * q)));
            /* tail_len <= idx < fill (every value below 64: signed compares are fine) */
            __m128i take = _mm_and_si128(_mm_cmpgt_epi8(hi, idx), _mm_cmpgt_epi8(idx, lo));
            __m128i v = _mm_or_si128(_mm_loadu_si128((const __m128i *)(s->tmpl + 16 * q)),
                                     _mm_and_si128(_mm_loadu_si128((const __m128i *)(src + 16 * q)), take));
            _mm_storeu_si128((__m128i *)(blk + 16 * q), v);
        }
    } else
#endif
    {
        memset(blk, 0, 64);
        memcpy(blk, s->ptr + (s->len - s->tail_len), s->tail_len);
        memcpy(blk + s->tail_len, data, n);
    }
    blk[fill] = 0x80;
    uint64_t bits = __builtin_bswap64(((uint64_t)s->len + n) * 8u); /* big-endian */
    memcpy(blk + 56, &bits, 8);
    return 1;
}

/* The placeholder a digest replaces: 64 '0' bytes (compared inline: memcmp was a call; on
 * x86-64 16 bytes a load, where eight 8-byte loads showed as a third of hs_run's own time). */
static inline int is_placeholder(const uint8_t *p) {
#ifdef HS_SHANI
    const __m128i zeros = _mm_set1_epi8('0');
    __m128i same = _mm_and_si128(
        _mm_and_si128(_mm_cmpeq_epi8(_mm_loadu_si128((const __m128i *)p), zeros),
                      _mm_cmpeq_epi8(_mm_loadu_si128((const __m128i *)(p + 16)), zeros)),
        _mm_and_si128(_mm_cmpeq_epi8(_mm_loadu_si128((const __m128i *)(p + 32)), zeros),
                      _mm_cmpeq_epi8(_mm_loadu_si128((const __m128i *)(p + 48)), zeros)));
    return _mm_movemask_epi8(same) == 0xffff;
#else
    uint64_t diff = 0;
    for (int i = 0; i < 64; i += 8) {
        uint64_t w;
        memcpy(&w, p + i, 8);
        diff |= w ^ 0x3030303030303030ull;
    }
    return diff == 0;
#endif
}

#ifdef HS_SHANI
/* hs_run's hashing where AVX-512 is usable (every check passed). A request whose salt tail,
 * field and padding fit one block has it built by one masked 64-byte load of the field's bytes
 * (the masked-off bytes are neither read nor faulted on, so no bounds case), or-ed into the
 * salt's template, its 0x80 and length set by masked broadcasts and all of it byte-swapped by
 * one shuffle; the salt's start state is put in the lanes' order once. */
SHANI_WIDE static void hash_wide(uint8_t *mem, const uint8_t *table, uint32_t count) {
    const __m512i be = _mm512_broadcast_i32x4(_mm_set_epi64x(0x0c0d0e0f08090a0bLL, 0x0405060700010203LL));
    prefix_state ps;
    int have = 0, waiting = 0;
    __m128i start[2] = {_mm_setzero_si128(), _mm_setzero_si128()}, st[LANES][2];
    __m512i tmpl = _mm512_setzero_si512();
    uint8_t blocks[LANES][64] __attribute__((aligned(64)));
    uint8_t *dst[LANES];
    for (uint32_t i = 0; i < count; i++) {
        const uint8_t *e = table + (uint64_t)i * HS_ENTRY;
        uint32_t pp = rd32(e), pn = rd32(e + 4), dp = rd32(e + 8), dn = rd32(e + 12), op = rd32(e + 16);
        if (!have || ps.ptr != mem + pp || ps.len != pn) {
            prefix_init(&ps, mem + pp, pn);
            to_lanes(ps.c.h, &start[0], &start[1]);
            tmpl = _mm512_loadu_si512(ps.tmpl);
            have = 1;
        }
        uint32_t tail = ps.tail_len, fill = tail + dn;
        if (fill > 55) {
            digest(&ps, mem + dp, dn, mem + op);
            continue;
        }
        __mmask64 take = (((__mmask64)1 << fill) - 1) & ~(((__mmask64)1 << tail) - 1);
        __m512i v = _mm512_or_si512(tmpl, _mm512_maskz_loadu_epi8(take, (const void *)((uintptr_t)(mem + dp) - tail)));
        v = _mm512_mask_set1_epi8(v, (__mmask64)1 << fill, (char)0x80);
        v = _mm512_mask_set1_epi64(v, 0x80, (long long)__builtin_bswap64(((uint64_t)pn + dn) * 8u));
        _mm512_store_si512((void *)blocks[waiting], _mm512_shuffle_epi8(v, be));
        st[waiting][0] = start[0];
        st[waiting][1] = start[1];
        dst[waiting] = mem + op;
        if (++waiting == LANES) {
            final_blocks_wide(st, blocks, dst);
            waiting = 0;
        }
    }
    if (waiting) { /* the last few: the spare lanes redo the first */
        for (int j = waiting; j < LANES; j++) {
            st[j][0] = st[0][0];
            st[j][1] = st[0][1];
            memcpy(blocks[j], blocks[0], 64);
            dst[j] = dst[0];
        }
        final_blocks_wide(st, blocks, dst);
    }
}
#endif

/* Runs the requests the slot at `slot` names; `out_ptr`/`out_len`: the call's output (its
 * result), `records`: the input's record count. The number of digests written, or an HS_
 * code (nothing written). */
long hs_run(uintptr_t mem_addr, uint64_t mem_size, uint32_t slot, uint32_t out_ptr, uint32_t out_len,
            uint32_t records) {
    uint8_t *mem = (uint8_t *)mem_addr; /* an integer: cffi converts one faster than a pointer */
    if (!inside(slot, 8, mem_size)) return HS_SLOT;
    uint32_t table = rd32(mem + slot), count = rd32(mem + slot + 4);
    if (count == 0) return 0;
    if (count > HS_MAX_ENTRIES || count > (uint64_t)records * HS_PER_RECORD) return HS_COUNT;
    uint64_t table_len = (uint64_t)count * HS_ENTRY;
    if (!inside(table, table_len, mem_size)) return HS_TABLE;
    /* The records section: after u32 record_count, the fates and i32 records_len. */
    if (!inside(out_ptr, out_len, mem_size) || out_len < 8u) return HS_OUTPUT;
    if (rd32(mem + out_ptr) != records || (uint64_t)records + 8u > out_len) return HS_OUTPUT;
    uint64_t sec = (uint64_t)out_ptr + 8u + records;
    uint32_t sec_len = rd32(mem + out_ptr + 4u + records);
    if (sec_len > 0x7fffffffu || !inside(sec, sec_len, (uint64_t)out_ptr + out_len)) return HS_OUTPUT;
    if (overlaps(table, table_len, sec, sec_len) || overlaps(slot, 8, sec, sec_len)) return HS_OVERLAP;
    /* Every entry checked before any is written. */
    uint64_t bytes = 0, next = sec;
    for (uint32_t i = 0; i < count; i++) {
        const uint8_t *e = mem + table + (uint64_t)i * HS_ENTRY;
        uint32_t pp = rd32(e), pn = rd32(e + 4), dp = rd32(e + 8), dn = rd32(e + 12), op = rd32(e + 16);
        if (!inside(pp, pn, mem_size) || !inside(dp, dn, mem_size) ||
            overlaps(pp, pn, sec, sec_len) || overlaps(dp, dn, sec, sec_len))
            return HS_SPAN;
        bytes += (uint64_t)pn + dn;
        if (bytes > HS_MAX_BYTES) return HS_BUDGET;
        if (op < next || !inside(op, 64, sec + sec_len)) return HS_TARGET;
        if (!is_placeholder(mem + op)) return HS_PLACEHOLDER;
        next = (uint64_t)op + 64u;
    }
    /* A batch's requests share one salt or a few: a salt's midstate is kept while it repeats. */
#ifdef HS_SHANI
    int fast = have_shani(), waiting = 0;
    if (fast > 1) {
        hash_wide(mem, mem + table, count);
        return (long)count;
    }
#endif
    prefix_state ps;
    int have = 0;
#ifdef HS_SHANI
    uint8_t blocks[LANES][64];
    uint32_t states[LANES][8];
    uint8_t *dst[LANES];
#endif
    for (uint32_t i = 0; i < count; i++) {
        const uint8_t *e = mem + table + (uint64_t)i * HS_ENTRY;
        uint32_t pp = rd32(e), pn = rd32(e + 4), dp = rd32(e + 8), dn = rd32(e + 12), op = rd32(e + 16);
        if (!have || ps.ptr != mem + pp || ps.len != pn) {
            prefix_init(&ps, mem + pp, pn);
            have = 1;
        }
#ifdef HS_SHANI
        if (fast && one_block(&ps, mem + dp, dn, dp >= ps.tail_len && inside(dp - ps.tail_len, 64, mem_size),
                              blocks[waiting])) {
            memcpy(states[waiting], ps.c.h, 32);
            dst[waiting] = mem + op;
            if (++waiting == LANES) {
                final_blocks(states, blocks, dst);
                waiting = 0;
            }
            continue;
        }
#endif
        digest(&ps, mem + dp, dn, mem + op);
    }
#ifdef HS_SHANI
    if (waiting) { /* the last few: the spare lanes redo the first */
        for (int j = waiting; j < LANES; j++) {
            memcpy(states[j], states[0], 32);
            memcpy(blocks[j], blocks[0], 64);
            dst[j] = dst[0];
        }
        final_blocks(states, blocks, dst);
    }
#endif
    return (long)count;
}
