/*
 * Example (seed 000, in-place ABI): the Redpanda-style `transform_record`, runnable unmodified
 * by Sluice (the in-place ABI is chosen when the module exports transform_record).
 *
 *   int64_t transform_record(uint8_t *payload, int32_t payload_len, uint8_t *key, int32_t key_len)
 *
 * The host copies the value (and key) into our memory; we edit the value in place and return
 * its new length, which can never exceed the original. So instead of the seed's added
 * timestamp (which grows the record and needs a clock this sandbox does not have) this
 * module keeps the rest of the seed's contract:
 *   - the value must be a JSON object, else -1 (an error: the filter's on_error applies);
 *   - no top-level "user_id" member -> -2 (drop);
 *   - otherwise the JSON is minified in place (insignificant whitespace removed) and the new
 *     length returned.
 * No SDK: the scanner below is a small, self-contained structural JSON check.
 */
#include <stddef.h>
#include <stdint.h>

static int is_ws(uint8_t c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

__attribute__((export_name("transform_record")))
int64_t transform_record(uint8_t *payload, int32_t payload_len, uint8_t *key, int32_t key_len) {
    (void)key;
    (void)key_len;
    static const char want[] = "user_id";
    uint8_t stack[64]; /* open brackets */
    int depth = 0, expect_key = 0, has_user_id = 0, seen_root = 0;
    int32_t w = 0;
    int32_t r = 0;
    while (r < payload_len) {
        uint8_t c = payload[r];
        if (is_ws(c)) {
            r++;
            continue;
        }
        if (seen_root && depth == 0) return -1; /* trailing data after the object */
        if (c == '"') {
            int32_t start = r++;
            while (r < payload_len && payload[r] != '"') {
                if (payload[r] < 0x20) return -1;
                r += payload[r] == '\\' ? 2 : 1;
            }
            if (r >= payload_len) return -1;
            r++;
            int32_t len = r - start;
            if (depth == 1 && expect_key && len == 9) {
                int same = 1;
                for (int i = 0; i < 7; i++) same &= payload[start + 1 + i] == (uint8_t)want[i];
                has_user_id |= same;
            }
            expect_key = 0;
            for (int32_t i = 0; i < len; i++) payload[w++] = payload[start + i];
            continue;
        }
        if (c == '{' || c == '[') {
            if (depth == 0 && (c != '{' || seen_root)) return -1;
            if (depth == (int)sizeof stack) return -1;
            stack[depth++] = c;
            seen_root = 1;
            expect_key = c == '{';
        } else if (c == '}' || c == ']') {
            if (depth == 0 || stack[depth - 1] != (c == '}' ? '{' : '[')) return -1;
            depth--;
            expect_key = 0;
        } else if (c == ',') {
            if (depth == 0) return -1;
            expect_key = stack[depth - 1] == '{';
        } else if (c == ':') {
            expect_key = 0;
        } else if (depth == 0) {
            return -1; /* a scalar at the top level is not an object */
        }
        payload[w++] = c;
        r++;
    }
    if (!seen_root || depth != 0) return -1;
    if (!has_user_id) return -2;
    return w;
}
