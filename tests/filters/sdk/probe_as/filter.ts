// SDK probe for tests/filters/sdk/test_sdk_abi.py and tests/filters/test_native_path.py: the
// Zig probe (probe_zig) in AssemblyScript, command for command: each record value is a command
// ("keep", "drop", "count", "ctx", "fail", "reject", "key"); anything else is rewritten to
// prefix + value + "@" + topic with the headers replaced by one null header "h".
import { Decision, Filter, Header, JSON_TRUE, Json, Record, bytesOf, count, fail, register } from "sluice";
export * from "sluice/abi";
export * from "sluice/admin";

class Probe extends Filter {
  prefix: string = "";

  configure(config: Json | null): string | null {
    if (config === null) return null;
    const refuse = config.get("refuse");
    if (refuse !== null && refuse.type == JSON_TRUE) return "RefusedOnPurpose";
    const p = config.get("prefix");
    if (p !== null && p.asString() !== null) this.prefix = p.str;
    return null;
  }

  onRecord(rec: Record): Decision {
    const text = rec.valueString();
    if (text === null) return Decision.drop();
    const v = text;
    if (v == "fail") { fail("AskedToFail"); return Decision.keep(); }
    if (v == "reject") return Decision.reject("no");
    if (v == "key") return rec.withKey(null);
    if (v == "keep") return Decision.keep();
    if (v == "drop") return Decision.drop();
    if (v == "count") {
      count("a", 2);
      count("b", 1);
      return Decision.keep();
    }
    if (v == "ctx") {
      return rec.withValue(bytesOf(rec.topic + "|" + rec.partition.toString() + "|" + rec.clientId
        + "|" + rec.principal + "|" + rec.direction.toString() + "|" + rec.offset.toString()
        + "|" + rec.timestampMs.toString() + "|" + this.prefix));
    }
    count("seen", 1);
    const p = bytesOf(this.prefix);
    const t = bytesOf("@" + rec.topic);
    const out = new Uint8Array(p.length + rec.valueLength + t.length);
    out.set(p, 0);
    memory.copy(out.dataStart + <usize>p.length, rec.valuePtr, <usize>rec.valueLength);
    out.set(t, p.length + rec.valueLength);
    return Decision.rewrite(rec.key(), out, [new Header("h", null)]);
  }

  onAdmin(request: string): string | null {
    const req = Json.parse(request);
    let name: Json | null = null;
    if (req !== null) name = req.get("name");
    if (name === null || name.asString() === null) {
      fail("MissingField");
      return null;
    }
    if (name.str.startsWith("tmp")) return "{\"decision\":\"deny\",\"message\":\"no tmp topics\"}";
    return "{\"decision\":\"allow\",\"message\":\"\"}";
  }
}

register(new Probe());
