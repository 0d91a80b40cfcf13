/* The native record check of codec/records.py (`check_batch`, `check_section`): walks an
 * uncompressed records section and says whether it holds exactly `count` well-formed v2
 * records, with the acceptance of aiokafka's record reader, which the Python fallback uses:
 *
 *   - every varint is read as aiokafka reads it: at most ten bytes (a tenth byte with its
 *     continuation bit set is an error), zigzag-decoded to a signed 64-bit value, with the
 *     record's attributes read as a varint too;
 *   - a key, value or header value of length >= 0 must fit in the section; a negative length
 *     is null; a header key's length must be >= 0 and its bytes well-formed UTF-8 (Python's
 *     strict decoder: no surrogates, no overlong forms, nothing above U+10FFFF);
 *   - a negative header count is an error; each record must span exactly its declared length;
 *   - after `count` records (none when count <= 0) no byte may remain;
 *   - the records hold at most `max_headers` headers between them (limits.max_batch_headers:
 *     the decoding path builds an object per header, so a few hundred bytes of zstd holding
 *     one record with millions of empty headers must be refused before it is decoded; the
 *     aiokafka reader has no such bound, the Python fallback counts them).
 *
 * Unlike the reader it mirrors, every byte read is bounds-checked first (aiokafka reads a
 * varint's continuation bytes past the end of its buffer; it then rejects the batch anyway,
 * so the verdicts agree). Returns 0 when the section is accepted, otherwise a negative
 * RC_* code, with the failing record's index in *where. */

#include <stddef.h>
#include <stdint.h>

#define RC_OK 0
#define RC_TRUNCATED -1     /* a field runs past the end of the section */
#define RC_VARINT -2        /* a varint longer than ten bytes */
#define RC_HEADER_COUNT -3  /* a negative header count */
#define RC_HEADER_KEY -4    /* a negative header key length */
#define RC_UTF8 -5          /* a header key that is not UTF-8 */
#define RC_LENGTH -6        /* a record's bytes differ from its declared length */
#define RC_TRAILING -7      /* bytes after the last declared record */
#define RC_HEADERS -8       /* more headers than max_headers in the section */

/* One varint at *pos, as aiokafka decodes it (value bits past 64 are dropped). */
static inline int rc_varint(const uint8_t *buf, size_t len, size_t *pos, int64_t *out)
{
    size_t p = *pos;
    /* One byte, the common case (a record's attributes, deltas, key length): no loop. */
    if (p < len && !(buf[p] & 0x80)) {
        uint8_t byte = buf[p];
        *out = (int64_t)(byte >> 1) ^ -(int64_t)(byte & 1);
        *pos = p + 1;
        return RC_OK;
    }
    /* Two bytes (a record's length, a value's length under 8 KiB). */
    if (p + 2 <= len && !(buf[p + 1] & 0x80)) {
        uint64_t two = (uint64_t)(buf[p] & 0x7f) | (uint64_t)buf[p + 1] << 7;
        *out = (int64_t)(two >> 1) ^ -(int64_t)(two & 1);
        *pos = p + 2;
        return RC_OK;
    }
    uint64_t value = 0;
    unsigned shift = 0;
    for (;;) {
        if (p >= len)
            return RC_TRUNCATED;
        uint8_t byte = buf[p++];
        if (byte & 0x80) {
            value |= (uint64_t)(byte & 0x7f) << shift;
            shift += 7;
            if (shift > 63)
                return RC_VARINT;
        } else {
            value |= (uint64_t)byte << shift;
            break;
        }
    }
    *out = (int64_t)(value >> 1) ^ -(int64_t)(value & 1);
    *pos = p;
    return RC_OK;
}

/* Skips a nullable blob (length varint, then the bytes when the length is >= 0). */
static inline int rc_blob(const uint8_t *buf, size_t len, size_t *pos)
{
    int64_t n;
    int rc = rc_varint(buf, len, pos, &n);
    if (rc)
        return rc;
    if (n >= 0) {
        if ((uint64_t)n > len - *pos)
            return RC_TRUNCATED;
        *pos += (size_t)n;
    }
    return RC_OK;
}

/* Well-formed UTF-8 (Unicode's table 3-7), what Python's strict decoder accepts. */
static int rc_utf8(const uint8_t *s, size_t n)
{
    size_t i = 0;
    while (i < n) {
        uint8_t c = s[i];
        if (c < 0x80) {
            i++;
            continue;
        }
        size_t need;
        uint8_t lo = 0x80, hi = 0xBF;
        if (c >= 0xC2 && c <= 0xDF) {
            need = 1;
        } else if (c >= 0xE0 && c <= 0xEF) {
            need = 2;
            if (c == 0xE0)
                lo = 0xA0;
            else if (c == 0xED)
                hi = 0x9F;
        } else if (c >= 0xF0 && c <= 0xF4) {
            need = 3;
            if (c == 0xF0)
                lo = 0x90;
            else if (c == 0xF4)
                hi = 0x8F;
        } else {
            return 0;
        }
        if (need > n - i - 1)
            return 0;
        if (s[i + 1] < lo || s[i + 1] > hi)
            return 0;
        for (size_t k = 2; k <= need; k++)
            if ((s[i + k] & 0xC0) != 0x80)
                return 0;
        i += need + 1;
    }
    return 1;
}

long rc_check_section(const uint8_t *buf, size_t len, int64_t count, int64_t max_headers,
                      int64_t *where)
{
    size_t pos = 0;
    int64_t budget = max_headers;
    int rc;
    for (int64_t index = 0; index < count; index++) {
        int64_t length, scratch, headers;
        *where = index;
        if ((rc = rc_varint(buf, len, &pos, &length)))
            return rc;
        size_t start = pos;
        /* Where the next record starts, if this one spans its declared length: the walk goes
         * on from there rather than from where this record's fields ended (the same place
         * once the length is checked below), so the next record's reads do not wait for the
         * reads of this record's value (a load ~200 bytes on, which missed the cache). */
        size_t next = start + (size_t)length;
        /* attributes, timestamp delta, offset delta */
        for (int k = 0; k < 3; k++)
            if ((rc = rc_varint(buf, len, &pos, &scratch)))
                return rc;
        if ((rc = rc_blob(buf, len, &pos)) || (rc = rc_blob(buf, len, &pos)))
            return rc;
        if ((rc = rc_varint(buf, len, &pos, &headers)))
            return rc;
        if (headers < 0)
            return RC_HEADER_COUNT;
        for (; headers > 0; headers--) {
            int64_t key_len;
            /* counted as they are walked (the declared count may lie) */
            if (budget-- <= 0)
                return RC_HEADERS;
            if ((rc = rc_varint(buf, len, &pos, &key_len)))
                return rc;
            if (key_len < 0)
                return RC_HEADER_KEY;
            if ((uint64_t)key_len > len - pos)
                return RC_TRUNCATED;
            if (!rc_utf8(buf + pos, (size_t)key_len))
                return RC_UTF8;
            pos += (size_t)key_len;
            if ((rc = rc_blob(buf, len, &pos)))
                return rc;
        }
        if (length < 0 || pos != next)
            return RC_LENGTH;
        pos = next;
    }
    *where = count > 0 ? count : 0;
    return pos == len ? RC_OK : RC_TRAILING;
}
