/* libFuzzer target over crypto/batch_seal.c's parsers, built with ASan and UBSan (see
 * fuzz/README.md): the fields-mode JSON scan and record digest, the fields opener (seeded with
 * sections the proxy sealed, opened with their real data key, AAD prefix and header group),
 * the planning call of the fields sealer and its seal call handed a plan one word off, and
 * both header-group scans. The first input byte picks the target and the record count;
 * every length is from the input. */
#include "../crypto/batch_seal.c"
#include <stdlib.h>
static const uint8_t PACKED[] = {4,0,0,0,'c','a','r','d',6,0,0,0,'"','c','a','r','d','"',
                                 3,0,0,0,'a','.','b',5,0,0,0,'"','a','.','b','"'};
static uint8_t KEY[32], PREFIX[4096], GROUP[4096];
static uint32_t PREFIX_LEN, GROUP_LEN, GROUP_N;
int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    const char *path = getenv("BATCH_SEAL_FUZZ_CTX"); /* written by batch_seal_seeds.py */
    FILE *f = fopen(path ? path : "fuzz/corpus/batch_seal.ctx", "rb");
    if (!f) abort();
    if (fread(KEY, 1, 32, f) != 32 || fread(&PREFIX_LEN, 4, 1, f) != 1 ||
        fread(PREFIX, 1, PREFIX_LEN, f) != PREFIX_LEN || fread(&GROUP_LEN, 4, 1, f) != 1 ||
        fread(&GROUP_N, 4, 1, f) != 1 || fread(GROUP, 1, GROUP_LEN, f) != GROUP_LEN) abort();
    fclose(f);
    return 0;
}
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 2) return 0;
    uint8_t mode = data[0];
    const uint8_t *d = data + 1;
    size_t n = size - 1;
    /* a private copy so ASan sees reads past the end */
    uint8_t *in = malloc(n ? n : 1);
    memcpy(in, d, n);
    static path_t paths[MAX_PATHS];
    parse_paths(PACKED, sizeof PACKED, 2, paths);
    span_t spans[MAX_SPANS];
    uint8_t key[32] = {1};
    size_t cap = 4 * n + 65536;
    uint8_t *out = malloc(cap), *scratch = malloc(cap);
    uint8_t fates[64];
    uint32_t where = 0, opened = 0, records = 0, seals = 0;
    if (mode % 3 == 0) {
        int ns = find_field_spans(in, n, paths, 2, spans);
        if (ns > 0) { record r; memset(&r, 0, sizeof r); r.value = in; r.value_len = (int64_t)n;
            uint8_t dg[32]; fields_digest(&r, 0, paths, NULL, 2, spans, ns, dg); }
    } else if (mode % 3 == 1) {
        uint32_t count = (mode >> 2) % 8 + 1;
        sb_open_fields(in, n, count, KEY, PREFIX, PREFIX_LEN, GROUP, GROUP_LEN, GROUP_N,
                       scratch, cap, out, cap, fates, &where, &opened);
    } else {
        uint32_t count = (mode >> 2) % 8 + 1;
        uint32_t plan[4096];
        long used = sb_seal_fields(in, n, count, key, NULL, 0, NULL, 0, PACKED, sizeof PACKED, 2,
                                   NULL, 0, 0, 256, NULL, 0, NULL, 0, fates, &records, &seals,
                                   plan, 4096);
        if (used > 0 && n >= 4) {
            /* the seal call handed that plan with one word moved by the input's last four
             * bytes: a plan that is not the section's is refused (SB_PLAN), never read by */
            static uint8_t nonces[NONCE * 4096];
            uint32_t delta;
            memcpy(&delta, in + n - 4, 4);
            plan[(size_t)(mode >> 5) % (size_t)used] += delta;
            sb_seal_fields(in, n, count, key, nonces, sizeof nonces, PREFIX, PREFIX_LEN, PACKED,
                           sizeof PACKED, 2, GROUP, GROUP_LEN, GROUP_N, 256, scratch, cap, out,
                           cap, fates, &records, &seals, plan, (size_t)used);
        }
        uint32_t first = 0, gc = 0, enc = 0, vals = 0; size_t go = 0, gl = 0, no = 0, nl = 0;
        int64_t at = 0;
        sb_first_group(in, n, count, &first, &go, &gl, &gc);
        sb_scan(in, n, count, (const uint8_t *)"sluice.enc", 10, &first, &go, &gl, &gc, &enc,
                &vals, &at, &no, &nl);
    }
    free(in); free(out); free(scratch);
    return 0;
}
