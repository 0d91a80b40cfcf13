// Example (seed 000, Sluice ABI): enrich JSON events with a timestamp and drop events without
// a user_id, written with the AssemblyScript SDK (the same filter as filters/examples/enrich
// in C).
//
// - value not a JSON object          -> reject ("value is not a JSON object: <parser error>")
// - no top-level "user_id"           -> drop
// - no top-level "timestamp"         -> add "timestamp": the record's own timestamp as
//                                       RFC 3339 UTC with milliseconds (a Wasm filter has no
//                                       clock; the record timestamp is what the producer set)
// - otherwise                        -> keep, byte for byte
// The original text is kept as it is; the new member is appended before the closing brace.
import { Decision, Filter, JSON_OBJECT, Json, Record, bytesOf, count, jsonError, register } from "sluice";
export * from "sluice/abi";

function floorDiv(a: i64, b: i64): i64 {
  const q = a / b;
  return (a % b != 0 && (a < 0) != (b < 0)) ? q - 1 : q;
}

function pad(v: i64, width: i32): string {
  let s = v.toString();
  while (s.length < width) s = "0" + s;
  return s;
}

/** Milliseconds since the epoch as RFC 3339 UTC with milliseconds. */
function rfc3339(ms: i64): string {
  const secs = floorDiv(ms, 1000);
  const milli = ms - secs * 1000;
  const days = floorDiv(secs, 86400);
  const sod = secs - days * 86400;
  // Days since 1970-01-01 to a civil date (proleptic Gregorian).
  const z = days + 719468;
  const era = floorDiv(z, 146097);
  const doe = z - era * 146097;
  const yoe = (doe - doe / 1460 + doe / 36524 - doe / 146096) / 365;
  const doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
  const mp = (5 * doy + 2) / 153;
  const d = doy - (153 * mp + 2) / 5 + 1;
  const m = mp < 10 ? mp + 3 : mp - 9;
  const y = yoe + era * 400 + (m <= 2 ? 1 : 0);
  return pad(y, 4) + "-" + pad(m, 2) + "-" + pad(d, 2) + "T" + pad(sod / 3600, 2) + ":"
    + pad((sod / 60) % 60, 2) + ":" + pad(sod % 60, 2) + "." + pad(milli, 3) + "Z";
}

class Enrich extends Filter {
  onRecord(rec: Record): Decision {
    if (!rec.hasValue) return Decision.reject("value is not a JSON object: null value");
    const doc = Json.parseBytes(rec.valuePtr, rec.valueLen);
    if (doc === null) return Decision.reject("value is not a JSON object: " + jsonError());
    if (doc.type != JSON_OBJECT) return Decision.reject("value is not a JSON object");
    if (doc.get("user_id") === null) {
      count("dropped_no_user_id", 1);
      return Decision.drop();
    }
    if (doc.get("timestamp") !== null) return Decision.keep();
    // The object has a member (user_id), so a comma goes before the new one.
    const n = rec.valueLength;
    let close = n - 1;
    while (close > 0 && rec.valueByte(close) != 125) close--;
    const middle = bytesOf(",\"timestamp\":\"" + rfc3339(rec.timestampMs) + "\"");
    const out = new Uint8Array(n + middle.length);
    memory.copy(out.dataStart, rec.valuePtr, <usize>close);
    memory.copy(out.dataStart + <usize>close, middle.dataStart, <usize>middle.length);
    memory.copy(out.dataStart + <usize>(close + middle.length), rec.valuePtr + <usize>close,
                <usize>(n - close));
    count("timestamp_added", 1);
    return rec.withValue(out);
  }
}

register(new Enrich());
