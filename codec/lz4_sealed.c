/* An LZ4 frame for a records section whose values do not compress (sealed whole values) but
 * whose records all end with the same bytes (the proxy's header group): codec/compression.py,
 * `lz4_sealed_frame`.
 *
 * LZ4 finds nothing in ciphertext; what it found in a sealed section was the header group
 * every record repeats (~30 % of a 200-byte record's stored bytes). Searching for it costs
 * 0.2-0.4 us a record; here the records are walked (a varint length each) and a record that
 * ends with `pat` has those bytes written as an LZ4 match of the previous record's: a copy
 * and a few bytes of sequence per record, and the compression LZ4 had.
 *
 * The frame: the descriptor Kafka's Java producer writes (independent blocks of at most
 * 64 KiB, no checksums), blocks cut every 64 KiB of input, the end mark. Within a block a
 * match refers only to an earlier occurrence in the same block (blocks are independent),
 * ends at least 5 bytes before the block's end and starts at least 12 before it (the LZ4
 * block format's last-literals and last-match rules); everything else is literals. A block
 * that would not be smaller that way is stored (the block size's high bit). Any input is
 * encoded correctly: a section that does not parse as records simply gets no matches after
 * the point where it stops parsing. Returns the frame's length, or -1 when `cap` is too
 * small (`lz4_sealed_bound`). */

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#define LS_BLOCK (64u * 1024u)
#define LS_LAST_LITERALS 5u
#define LS_MFLIMIT 12u
#define LS_MIN_MATCH 4u

static void ls_le32(uint8_t *p, uint32_t v)
{
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
    p[2] = (uint8_t)(v >> 16);
    p[3] = (uint8_t)(v >> 24);
}

/* The end of the record starting at `pos` (its varint length, then that many bytes), or 0
 * when it does not parse or runs past `len`. */
static size_t ls_record_end(const uint8_t *src, size_t len, size_t pos)
{
    uint64_t value = 0;
    unsigned shift = 0;
    for (;;) {
        if (pos >= len || shift > 63)
            return 0;
        uint8_t byte = src[pos++];
        value |= (uint64_t)(byte & 0x7f) << shift;
        shift += 7;
        if (!(byte & 0x80))
            break;
    }
    int64_t size = (int64_t)(value >> 1) ^ -(int64_t)(value & 1);
    if (size <= 0 || (uint64_t)size > len - pos)
        return 0;
    return pos + (size_t)size;
}

static uint8_t *ls_length(uint8_t *o, size_t rest)
{
    while (rest >= 255) {
        *o++ = 255;
        rest -= 255;
    }
    *o++ = (uint8_t)rest;
    return o;
}

/* One sequence: literals src[anchor..start), then (when mlen) a match of `mlen` bytes at
 * `offset` back. */
static uint8_t *ls_sequence(uint8_t *o, const uint8_t *lit, size_t nlit, size_t offset,
                            size_t mlen)
{
    size_t mcode = mlen ? mlen - LS_MIN_MATCH : 0;
    uint8_t *token = o++;
    *token = (uint8_t)(((nlit < 15 ? nlit : 15) << 4) | (mcode < 15 ? mcode : 15));
    if (nlit >= 15)
        o = ls_length(o, nlit - 15);
    memcpy(o, lit, nlit);
    o += nlit;
    if (mlen) {
        *o++ = (uint8_t)offset;
        *o++ = (uint8_t)(offset >> 8);
        if (mcode >= 15)
            o = ls_length(o, mcode - 15);
    }
    return o;
}

/* Most bytes `lz4_sealed_frame` writes for `len` bytes of input. */
size_t lz4_sealed_bound(size_t len)
{
    size_t blocks = len / LS_BLOCK + 1;
    return 7 + len + blocks * (4 + LS_BLOCK / 255 + 16) + 4;
}

long lz4_sealed_frame(const uint8_t *src, size_t len, const uint8_t *pat, size_t m,
                      uint8_t *out, size_t cap)
{
    static const uint8_t header[7] = {0x04, 0x22, 0x4d, 0x18, 0x60, 0x40, 0x82};
    if (cap < lz4_sealed_bound(len))
        return -1;
    memcpy(out, header, 7);
    size_t o = 7;
    size_t rec = 0;       /* the next record to look at */
    int parsing = m >= LS_MIN_MATCH;
    size_t cand = 0;      /* the next occurrence of `pat` at a record's end, if have_cand */
    int have_cand = 0;
    for (size_t bs = 0; bs < len; bs += LS_BLOCK) {
        size_t be = len - bs > LS_BLOCK ? bs + LS_BLOCK : len;
        uint8_t *block = out + o + 4;
        uint8_t *w = block;
        size_t anchor = bs;
        int have_prev = 0;
        size_t prev = 0;
        for (;;) {
            while (!have_cand && parsing) {
                size_t end = ls_record_end(src, len, rec);
                if (!end) {
                    parsing = 0;
                    break;
                }
                if (end - rec >= m && memcmp(src + end - m, pat, m) == 0) {
                    cand = end - m;
                    have_cand = 1;
                }
                rec = end;
            }
            if (!have_cand || cand + m > be)
                break;  /* the next occurrence is in a later block (or there is none) */
            if (cand >= bs) {
                if (have_prev && cand >= anchor && cand + m + LS_LAST_LITERALS <= be
                        && cand + LS_MFLIMIT <= be) {
                    w = ls_sequence(w, src + anchor, cand - anchor, cand - prev, m);
                    anchor = cand + m;
                }
                have_prev = 1;
                prev = cand;
            }
            have_cand = 0;
        }
        w = ls_sequence(w, src + anchor, be - anchor, 0, 0);
        size_t n = (size_t)(w - block);
        if (n >= be - bs) {  /* nothing gained: a stored block */
            memcpy(block, src + bs, be - bs);
            ls_le32(out + o, (uint32_t)(be - bs) | 0x80000000u);
            o += 4 + (be - bs);
        } else {
            ls_le32(out + o, (uint32_t)n);
            o += 4 + n;
        }
    }
    ls_le32(out + o, 0);
    return (long)(o + 4);
}
