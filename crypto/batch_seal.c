/* Whole-value record encryption over a Kafka records section, one call per batch.
 *
 * Compiled at install (crypto/batch_seal_build.py, cffi API mode) against OpenSSL's libcrypto:
 * AES-256-GCM through the EVP interface (which uses the CPU's AES and carry-less multiply
 * instructions) and SHA-256 for the record digest. The Python reference is
 * crypto/envelope.py + crypto/record_filter.py; the layout and the associated data written
 * here are exactly layout 2's (docs/ENCRYPTION.md), byte for byte.
 *
 * Input sections were checked by the codec before any filter sees them, but every length is
 * still bounds-checked here: a malformed section returns SB_MALFORMED, never reads past it.
 */
#include <stdint.h>
#include <string.h>
#include <openssl/evp.h>
#include <openssl/sha.h>

#define SB_MALFORMED (-1)  /* the section is not `count` well-formed records */
#define SB_SLOW (-2)       /* a record this code does not handle: use the reference path */
#define SB_TAMPERED (-3)   /* a record failed authentication (its index in *where) */
#define SB_CRYPTO (-4)     /* OpenSSL failed */
#define SB_SPACE (-5)      /* the output buffer is too small (a bug of the caller) */

#define NONCE 12
#define TAG 16

typedef struct {
    const uint8_t *p;
    const uint8_t *end;
} cursor;

static int rd_varint(cursor *c, int64_t *out) {
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
static int rd_blob(cursor *c, const uint8_t **data, int64_t *len) {
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
    if (rd_varint(c, &len) || len < 0 || len > c->end - c->p) return -1;
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

/* record_digest of crypto/envelope.py over the first `n` headers of `r`. */
static void headers_digest(const record *r, int64_t n, uint8_t *out) {
    SHA256_CTX h;
    uint8_t len4[4];
    SHA256_Init(&h);
    be32(len4, (uint32_t)n);
    SHA256_Update(&h, len4, 4);
    for (int64_t i = 0; i < n; i++) {
        cursor c = {r->headers + r->hoff[i], r->headers + r->hoff[i + 1]};
        const uint8_t *name, *val;
        int64_t nlen, vlen;
        rd_blob(&c, &name, &nlen);
        rd_blob(&c, &val, &vlen);
        be32(len4, (uint32_t)nlen);
        SHA256_Update(&h, len4, 4);
        SHA256_Update(&h, name, (size_t)nlen);
        if (vlen < 0) {
            SHA256_Update(&h, "\x00", 1);
        } else {
            uint8_t tag5[5] = {1};
            be32(tag5 + 1, (uint32_t)vlen);
            SHA256_Update(&h, tag5, 5);
            if (vlen) SHA256_Update(&h, val, (size_t)vlen);
        }
    }
    SHA256_Final(out, &h);
}

/* aad_for(prefix, key, "", digest): written into `aad` (room for prefix + key + 48). */
static size_t build_aad(uint8_t *aad, const uint8_t *prefix, size_t prefix_len,
                        const record *r, const uint8_t *digest) {
    uint8_t *o = aad;
    memcpy(o, prefix, prefix_len);
    o += prefix_len;
    if (r->key_len < 0) {
        be32(o, 1);
        o[4] = 0;
        o += 5;
    } else {
        be32(o, (uint32_t)r->key_len + 1);
        o[4] = 1;
        memcpy(o + 5, r->key, (size_t)r->key_len);
        o += 5 + r->key_len;
    }
    be32(o, 32);
    memcpy(o + 4, digest, 32);
    o += 36;
    be32(o, 0);
    o += 4;
    return (size_t)(o - aad);
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
    memcpy(o, v2, v2_len);
    o += v2_len;
    memcpy(o, v3, v3_len);
    o += v3_len;
    o = wr_varint(o, keep + extra_count);
    memcpy(o, r->headers, hbytes);
    o += hbytes;
    if (extra_len) memcpy(o, extra, extra_len);
    return o + extra_len;
}

/* Upper bound of the bytes written for one record beyond its input bytes. */
#define SLACK(extra_len, prefix_len) ((extra_len) + 1 + NONCE + TAG + 30)

long sb_seal_values(const uint8_t *in, size_t in_len, uint32_t count, const uint8_t *key,
                    const uint8_t *nonces, const uint8_t *prefix, size_t prefix_len,
                    const uint8_t *ours, size_t ours_len, uint32_t ours_count,
                    uint8_t *scratch, size_t scratch_len, uint8_t *out, size_t out_cap,
                    uint8_t *fates, uint32_t *sealed) {
    cursor c = {in, in + in_len};
    uint8_t *o = out;
    uint8_t *limit = out + out_cap;
    long rc = 0;
    static __thread record r;
    uint8_t digest[32];
    EVP_CIPHER_CTX *ctx = EVP_CIPHER_CTX_new();
    if (!ctx || EVP_EncryptInit_ex(ctx, EVP_aes_256_gcm(), NULL, key, NULL) != 1) {
        rc = SB_CRYPTO;
        goto done;
    }
    *sealed = 0;
    for (uint32_t i = 0; i < count; i++) {
        const uint8_t *rec_start = c.p;
        int p = parse_record(&c, &r);
        if (p) {
            rc = p == -2 ? SB_SLOW : SB_MALFORMED;
            goto done;
        }
        size_t raw = (size_t)(c.p - rec_start);
        if (r.value_len < 0) { /* a tombstone stays as it is */
            if ((size_t)(limit - o) < raw) { rc = SB_SPACE; goto done; }
            memcpy(o, rec_start, raw);
            o += raw;
            fates[i] = 0;
            continue;
        }
        if ((size_t)(limit - o) < raw + SLACK(ours_len, prefix_len) ||
            scratch_len < prefix_len + (size_t)(r.key_len > 0 ? r.key_len : 0) + 48 ||
            scratch_len - prefix_len - 48 - (size_t)(r.key_len > 0 ? r.key_len : 0)
                < (size_t)r.value_len + TAG) {
            rc = SB_SPACE;
            goto done;
        }
        headers_digest(&r, r.header_count, digest);
        size_t aad_len = build_aad(scratch, prefix, prefix_len, &r, digest);
        uint8_t *ct = scratch + aad_len;
        const uint8_t *nonce = nonces + (size_t)(*sealed) * NONCE;
        int n1 = 0, n2 = 0;
        if (EVP_EncryptInit_ex(ctx, NULL, NULL, NULL, nonce) != 1 ||
            EVP_EncryptUpdate(ctx, NULL, &n1, scratch, (int)aad_len) != 1 ||
            EVP_EncryptUpdate(ctx, ct, &n1, r.value, (int)r.value_len) != 1 ||
            EVP_EncryptFinal_ex(ctx, ct + n1, &n2) != 1 ||
            EVP_CIPHER_CTX_ctrl(ctx, EVP_CTRL_GCM_GET_TAG, TAG, ct + n1 + n2) != 1) {
            rc = SB_CRYPTO;
            goto done;
        }
        o = emit(o, &r, (const uint8_t *)"\x01", 1, nonce, NONCE, ct,
                 (size_t)(n1 + n2) + TAG, r.header_count, ours, ours_len, ours_count);
        fates[i] = 1;
        (*sealed)++;
    }
    if (c.p != c.end) {
        rc = SB_MALFORMED;
        goto done;
    }
    rc = (long)(o - out);
done:
    EVP_CIPHER_CTX_free(ctx);
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
    uint8_t digest[32];
    EVP_CIPHER_CTX *ctx = EVP_CIPHER_CTX_new();
    if (!ctx || EVP_DecryptInit_ex(ctx, EVP_aes_256_gcm(), NULL, key, NULL) != 1) {
        rc = SB_CRYPTO;
        goto done;
    }
    for (uint32_t i = 0; i < count; i++) {
        const uint8_t *rec_start = c.p;
        int p = parse_record(&c, &r);
        if (p) {
            rc = p == -2 ? SB_SLOW : SB_MALFORMED;
            goto done;
        }
        size_t raw = (size_t)(c.p - rec_start);
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
        if (scratch_len < prefix_len + (size_t)(r.key_len > 0 ? r.key_len : 0) + 48 + ct_len) {
            rc = SB_SPACE;
            goto done;
        }
        headers_digest(&r, start, digest);
        size_t aad_len = build_aad(scratch, prefix, prefix_len, &r, digest);
        uint8_t *pt = scratch + aad_len;
        const uint8_t *nonce = r.value + 1;
        const uint8_t *ct = nonce + NONCE;
        int n1 = 0, n2 = 0;
        if (EVP_DecryptInit_ex(ctx, NULL, NULL, NULL, nonce) != 1 ||
            EVP_DecryptUpdate(ctx, NULL, &n1, scratch, (int)aad_len) != 1 ||
            EVP_DecryptUpdate(ctx, pt, &n1, ct, (int)ct_len) != 1 ||
            EVP_CIPHER_CTX_ctrl(ctx, EVP_CTRL_GCM_SET_TAG, TAG, (void *)(ct + ct_len)) != 1) {
            rc = SB_CRYPTO;
            goto done;
        }
        if (EVP_DecryptFinal_ex(ctx, pt + n1, &n2) != 1) {
            rc = SB_TAMPERED;
            goto done;
        }
        o = emit(o, &r, pt, (size_t)(n1 + n2), NULL, 0, NULL, 0, start, NULL, 0, 0);
        fates[i] = 1;
    }
    if (c.p != c.end) {
        rc = SB_MALFORMED;
        goto done;
    }
    rc = (long)(o - out);
done:
    EVP_CIPHER_CTX_free(ctx);
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
                const uint8_t *name;
                int64_t nlen;
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
