// Example (seeds 001/002): upper-case every record value, written with the AssemblyScript SDK.
//
// ASCII letters a-z become A-Z; other bytes (UTF-8 included) pass unchanged. Null values
// (tombstones) are kept as they are. Counts upper-cased records as "upper_cased". The same
// filter as filters/examples/upper (Zig) and upper-rust (Rust).
import { Decision, Filter, Record, count, register } from "sluice";
export * from "sluice/abi";

class Upper extends Filter {
  onRecord(rec: Record): Decision {
    const n = rec.valueLength;
    let lower = false;
    for (let i = 0; i < n; i++) {
      const c = rec.valueByte(i);
      if (c >= 97 && c <= 122) { lower = true; break; }
    }
    if (!lower) return Decision.keep();
    const out = new Uint8Array(n);
    const dst = out.dataStart;
    for (let i = 0; i < n; i++) {
      const c = rec.valueByte(i);
      store<u8>(dst + <usize>i, c >= 97 && c <= 122 ? c - 32 : c);
    }
    count("upper_cased", 1);
    return rec.withValue(out);
  }
}

register(new Upper());
