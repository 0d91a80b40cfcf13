// Example (seed 000, Sluice ABI): filters/examples/enrich ported to JavaScript, with the same
// decisions, values, reject reasons (the parser's messages included) and counters as the C
// original:
//
// - value not a JSON object   -> reject ("value is not a JSON object: <parser error>")
// - no top-level "user_id"    -> drop (counted as dropped_no_user_id)
// - no top-level "timestamp"  -> add "timestamp": the record's own timestamp as RFC 3339 UTC
//                                with milliseconds (a filter has no clock)
// - otherwise                 -> keep, byte for byte
//
// record.value.json() parses with the C SDK's strict parser, so a SyntaxError's message is the
// C original's. The new member is appended before the closing brace; the text is kept as is.
import { count, drop, onRecord, reject } from "sluice";

function digits(v, width) {
  return String(v).padStart(width, "0").slice(-width);
}

// Days since 1970-01-01 to a civil date (proleptic Gregorian), as the C original computes it.
function rfc3339(ms) {
  const secs = Math.floor(ms / 1000);
  const milli = ms - secs * 1000;
  const days = Math.floor(secs / 86400);
  const sod = secs - days * 86400;
  let z = days + 719468;
  const era = Math.floor(z / 146097);
  const doe = z - era * 146097;
  const yoe = Math.floor((doe - Math.floor(doe / 1460) + Math.floor(doe / 36524) -
                          Math.floor(doe / 146096)) / 365);
  const doy = doe - (365 * yoe + Math.floor(yoe / 4) - Math.floor(yoe / 100));
  const mp = Math.floor((5 * doy + 2) / 153);
  const d = doy - Math.floor((153 * mp + 2) / 5) + 1;
  const m = mp < 10 ? mp + 3 : mp - 9;
  const y = yoe + era * 400 + (m <= 2 ? 1 : 0);
  return `${digits(y, 4)}-${digits(m, 2)}-${digits(d, 2)}T${digits(Math.floor(sod / 3600), 2)}:` +
    `${digits(Math.floor(sod / 60) % 60, 2)}:${digits(sod % 60, 2)}.${digits(milli, 3)}Z`;
}

onRecord((record) => {
  if (record.value === null) return reject("value is not a JSON object: null value");
  let doc;
  try {
    doc = record.value.json();
  } catch (e) {
    return reject(`value is not a JSON object: ${e.message}`);
  }
  if (doc === null || typeof doc !== "object" || Array.isArray(doc)) {
    return reject("value is not a JSON object");
  }
  if (!Object.hasOwn(doc, "user_id")) {
    count("dropped_no_user_id");
    return drop();
  }
  if (Object.hasOwn(doc, "timestamp")) return; // keep
  const text = record.value.text();
  const close = text.lastIndexOf("}");
  count("timestamp_added");
  return {
    value: `${text.slice(0, close)},"timestamp":"${rfc3339(record.timestamp)}"${text.slice(close)}`,
  };
});
