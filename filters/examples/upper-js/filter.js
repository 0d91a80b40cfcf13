// Example (seeds 001/002): upper-case every record value, written with the JavaScript SDK.
//
// ASCII letters a-z become A-Z; other bytes (UTF-8 included) pass unchanged. Null values
// (tombstones) are kept as they are. Counts upper-cased records as "upper_cased". The same
// filter as filters/examples/upper-c (C), upper (Zig), upper-rust, upper-as and upper-go:
// `python -m sluice.filters.bench --only languages` runs them side by side.
import { count, onRecord } from "sluice";

onRecord((record) => {
  const value = record.value;
  if (value === null) return; // tombstones pass
  const text = value.text();
  // ASCII (valid UTF-8 with one character per byte): the engine's toUpperCase is exact, and far
  // faster than a loop in JavaScript.
  if (text.length === value.length && value.isText()) {
    const upper = text.toUpperCase();
    if (upper === text) return; // nothing to change: keep
    count("upper_cased");
    return { value: upper };
  }
  // Anything else (UTF-8 letters stay as they are, bytes that are not UTF-8 too): byte by byte.
  const bytes = value.array();
  let changed = false;
  for (let i = 0; i < bytes.length; i++) {
    if (bytes[i] >= 97 && bytes[i] <= 122) {
      bytes[i] -= 32;
      changed = true;
    }
  }
  if (!changed) return;
  count("upper_cased");
  return { value: bytes };
});
