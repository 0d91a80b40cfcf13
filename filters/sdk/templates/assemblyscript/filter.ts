// {{NAME}}: a Sluice Wasm filter (Sluice ABI v1, AssemblyScript SDK).
//
// onRecord runs once per record and returns what becomes of it:
//   Decision.keep()                      pass it on unchanged
//   rec.withValue(bytes)                 pass it on with a new value (rec.withKey: new key)
//   Decision.rewrite(key, value, hdrs)   ... or a new key, value and headers
//   Decision.drop()                      silently remove it
//   Decision.reject("why")               refuse it (the producer gets INVALID_RECORD)
//   fail("why")                          fail the whole batch (the on_error policy applies)
// The record's bytes stay in the host's input: rec.value() copies them, rec.valueByte(i)
// reads one in place.
//
// This starter rejects records without a value, drops records whose "x-drop" header is "yes",
// tags the rest by appending the configured suffix to the value, and counts what it did.
import { Decision, Filter, Json, Record, bytesOf, count, register } from "sluice";
export * from "sluice/abi";

class Starter extends Filter {
  suffix: Uint8Array = bytesOf(" [checked]"); // from the config: {"suffix": "..."}

  configure(config: Json | null): string | null {
    if (config !== null) {
      const s = config.get("suffix");
      if (s !== null && s.asString() !== null) this.suffix = bytesOf(s.str);
    }
    return null; // an error message here refuses the configuration
  }

  onRecord(rec: Record): Decision {
    if (rec.valueLength == 0) {
      count("rejected_empty", 1);
      return Decision.reject("{{NAME}}: a record needs a value");
    }
    const drop = rec.header("x-drop");
    if (drop !== null && drop == "yes") {
      count("dropped", 1);
      return Decision.drop();
    }
    const n = rec.valueLength;
    const out = new Uint8Array(n + this.suffix.length);
    memory.copy(out.dataStart, rec.valuePtr, <usize>n);
    out.set(this.suffix, n);
    count("tagged", 1);
    return rec.withValue(out);
  }
}

register(new Starter());
