// {{NAME}}: a Sluice Wasm filter (Sluice ABI v1, JavaScript SDK on QuickJS-ng).
//
// The function given to onRecord runs once per record and returns what becomes of it:
//
//   the record, or nothing        pass it on unchanged
//   { value }                     pass it on with a new value (string, Uint8Array, ...);
//   { key, value, headers }       ... members left out stay as they were
//   null (or drop())              silently remove it
//   reject("why")                 refuse it (the producer gets INVALID_RECORD)
//   throw new Error("why")        fail the whole batch (the on_error policy applies)
//
// record.key, record.value and header values are RecordData (text(), json(), array(),
// length) or null; they are valid during the call only.
//
// This starter rejects records without a value, drops records whose "x-drop" header is "yes",
// tags the rest by appending the configured suffix to the value, and counts what it did.
import { config, count, onRecord, reject, utf8 } from "sluice";

const suffix = utf8(config().suffix ?? " [checked]"); // from the config: {"suffix": "..."}

onRecord((record) => {
  if (record.value === null || record.value.length === 0) {
    count("rejected_empty");
    return reject("{{NAME}}: a record needs a value");
  }
  if (record.header("x-drop")?.text() === "yes") {
    count("dropped");
    return null;
  }
  const value = record.value.array();
  const out = new Uint8Array(value.length + suffix.length);
  out.set(value);
  out.set(suffix, value.length);
  count("tagged");
  return { value: out };
});
