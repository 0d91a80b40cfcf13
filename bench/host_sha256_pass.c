/* The host's SHA-256 pass (filters/host_sha256.c) alone, on the layout of
 * `python -m sluice.filters.bench --only builtins`: 100 requests, salt "pepper", each field an
 * e-mail ("user<i>@example.com") inside a 200-byte JSON record, each digest over a placeholder
 * in the output's records section. Prints the pass's thread CPU time (its placeholders reset
 * between runs; that reset timed alone and taken off). Not built by the install; by hand:
 *
 *     gcc -O2 -Wno-deprecated-declarations bench/host_sha256_pass.c -o /tmp/hs_pass -lcrypto
 *     /tmp/hs_pass [level: 0 OpenSSL, 1 SHA-NI, 2 SHA-NI with AVX-512] [runs]
 *     perf record -o /tmp/hs.data /tmp/hs_pass 2 300000   # where the time goes
 *
 * -DHS_SOURCE='"path/to/host_sha256.c"' times another version of the pass (A/B by hand).
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#ifndef HS_SOURCE
#define HS_SOURCE "../filters/host_sha256.c"
#endif
#include HS_SOURCE

#define MEM_SIZE (1u << 20)
#define REQUESTS 100
enum { SLOT = 0x100, SALT = 0x1000, TABLE = 0x8000, INPUT = 0x10000, OUTPUT = 0x40000 };

static uint8_t *mem;
static uint32_t digest_at[REQUESTS];

static double thread_seconds(void) {
    struct timespec t;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static void put32(uint32_t at, uint32_t v) { memcpy(mem + at, &v, 4); }

static void reset(void) {
    for (int i = 0; i < REQUESTS; i++) memset(mem + digest_at[i], '0', 64);
}

int main(int argc, char **argv) {
    int level = argc > 1 ? atoi(argv[1]) : 2;
    long runs = argc > 2 ? atol(argv[2]) : 200000;
    mem = aligned_alloc(4096, MEM_SIZE);
    memset(mem, 0, MEM_SIZE);
    memcpy(mem + SALT, "pepper", 6);
    /* the input's records, and each e-mail's place in them */
    uint32_t field[REQUESTS], field_len[REQUESTS], at = INPUT;
    for (int i = 0; i < REQUESTS; i++) {
        char v[320], note[121];
        memset(note, 'x', 120);
        note[120] = 0;
        int n = snprintf(v, sizeof v, "{\"user_id\": %d, \"email\": \"user%d@example.com\", "
                         "\"amount\": 12.5, \"note\": \"%s\"}", i, i, note);
        if (n < 200) memset(v + n, ' ', 200 - (size_t)n); /* json.dumps(...)[:200].ljust(200) */
        memcpy(mem + at, v, 200);
        const char *e = strstr(v, "user"), *q = strchr(e, '"');
        field[i] = at + (uint32_t)(e - v);
        field_len[i] = (uint32_t)(q - e);
        at += 230; /* about a record's framing between values */
    }
    /* the output: u32 count, the fates, i32 records_len, the section with a placeholder a record */
    uint32_t sec = OUTPUT + 8 + REQUESTS, p = sec;
    for (int i = 0; i < REQUESTS; i++) {
        digest_at[i] = p + 40;
        p += 40 + 64 + 80;
    }
    uint32_t out_len = 8 + REQUESTS + (p - sec);
    put32(OUTPUT, REQUESTS);
    put32(OUTPUT + 4 + REQUESTS, p - sec);
    for (int i = 0; i < REQUESTS; i++) {
        uint32_t e = TABLE + 20 * (uint32_t)i;
        put32(e, SALT), put32(e + 4, 6), put32(e + 8, field[i]), put32(e + 12, field_len[i]);
        put32(e + 16, digest_at[i]);
    }
    put32(SLOT, TABLE);
    put32(SLOT + 4, REQUESTS);

    printf("code path %d\n", hs_set_level(level));
    reset();
    long done = hs_run((uintptr_t)mem, MEM_SIZE, SLOT, OUTPUT, out_len, REQUESTS);
    uint8_t md[32];
    SHA256_CTX c;
    SHA256_Init(&c);
    SHA256_Update(&c, "pepper", 6);
    SHA256_Update(&c, mem + field[REQUESTS - 1], field_len[REQUESTS - 1]);
    SHA256_Final(md, &c);
    char want[65];
    for (int i = 0; i < 32; i++) snprintf(want + 2 * i, 3, "%02x", md[i]);
    if (done != REQUESTS || memcmp(want, mem + digest_at[REQUESTS - 1], 64) != 0) {
        fprintf(stderr, "wrong result (%ld)\n", done);
        return 1;
    }
    for (int rep = 0; rep < 5; rep++) {
        double t0 = thread_seconds();
        for (long k = 0; k < runs; k++) {
            reset();
            __asm__ volatile("" ::"r"(mem) : "memory");
        }
        double t1 = thread_seconds();
        for (long k = 0; k < runs; k++) {
            reset();
            hs_run((uintptr_t)mem, MEM_SIZE, SLOT, OUTPUT, out_len, REQUESTS);
        }
        double t2 = thread_seconds();
        printf("pass %.3f us (reset %.3f us)\n", ((t2 - t1) - (t1 - t0)) / (double)runs * 1e6,
               (t1 - t0) / (double)runs * 1e6);
    }
    return 0;
}
