// SDK probe for tests/filters/test_native_path.py: the Zig probe (probe_zig) in JavaScript,
// command for command: each record value is a command ("keep", "drop", "count", "ctx", "fail",
// "reject", "key"); anything else is rewritten to prefix + value + "@" + topic with the headers
// replaced by one null header "h".
import { config, count, onRecord, reject, utf8 } from "sluice";

if (config().refuse === true) throw new Error("RefusedOnPurpose");
const prefix = typeof config().prefix === "string" ? config().prefix : "";
const prefixBytes = utf8(prefix);

function concat(...parts) {
  const out = new Uint8Array(parts.reduce((n, p) => n + p.length, 0));
  let at = 0;
  for (const p of parts) {
    out.set(p, at);
    at += p.length;
  }
  return out;
}

onRecord((record) => {
  const v = record.value;
  if (v === null) return null;
  switch (v.text()) {
    case "fail":
      throw new Error("AskedToFail");
    case "reject":
      return reject("no");
    case "key":
      return { key: null };
    case "keep":
      return record;
    case "drop":
      return null;
    case "count":
      count("a", 2);
      count("b", 1);
      return undefined;
    case "ctx":
      return {
        value: [record.topic, record.partition, record.clientId, record.principal,
                record.direction === "fetch" ? 1 : 0, record.offset, record.timestamp,
                prefix].join("|"),
      };
  }
  count("seen", 1);
  return {
    key: record.key,
    value: concat(prefixBytes, v.array(), utf8("@" + record.topic)),
    headers: [["h", null]],
  };
});
