// sluice: the AssemblyScript (TypeScript) SDK for Sluice Wasm filters (Sluice Wasm ABI v1).
//
// A filter is ONE file, `filter.ts`, that subclasses Filter, registers an instance and
// re-exports the ABI:
//
//     import { Decision, Filter, Record, register } from "sluice";
//     export * from "sluice/abi";
//
//     class Upper extends Filter {
//       onRecord(rec: Record): Decision { ... }
//     }
//     register(new Upper());
//
// `sluice/abi` exports sluice_abi_version, sluice_alloc, sluice_init, sluice_filter,
// sluice_filter_records (the host's fast path over Kafka's own record encoding: kept records
// are copied verbatim, one call per batch) and sluice_last_error; admin filters also write
// `export * from "sluice/admin"` (sluice_admin, which calls Filter.onAdmin).
//
// Record bytes stay in the host's input: `rec.value()` copies them into a Uint8Array,
// `rec.valueString()` decodes them, and `rec.valueLength` / `rec.valueByte(i)` read them in
// place. Build with `sluice filter build DIR` (asc --runtime minimal -O3): the SDK collects
// garbage once per call, before the host's input arrives, so a batch never pauses for it.

// ------------------------------------------------------------------------------------------
// Public types
// ------------------------------------------------------------------------------------------

export const ABI_VERSION: i32 = 1;
export const PRODUCE: u8 = 0;
export const FETCH: u8 = 1;

export const KEEP: u8 = 0;
export const REWRITE: u8 = 1;
export const DROP: u8 = 2;
export const REJECT: u8 = 3;

/** A header for a rewrite: the key is never null, the value may be. */
export class Header {
  constructor(public key: string, public value: Uint8Array | null) {}
}

/** What becomes of a record. Build one with the static methods or Record.withValue/withKey. */
export class Decision {
  kind: u8 = KEEP;
  reason: string = "";
  // Rewrite: the new key and value (len < 0: null) ...
  keyPtr: usize = 0;
  keyLen: i32 = -1;
  valuePtr: usize = 0;
  valueLen: i32 = -1;
  // ... and either the record's own headers (headerStart/headerCount index the batch's
  // header table) or new ones.
  headerStart: i32 = 0;
  headerCount: i32 = 0;
  headers: Header[] | null = null;
  // Keep rewritten bytes alive until the output is written.
  keyHold: Uint8Array | null = null;
  valueHold: Uint8Array | null = null;

  static keep(): Decision {
    return KEEP_DECISION;
  }

  static drop(): Decision {
    return DROP_DECISION;
  }

  /** Refuse the record: the producer gets INVALID_RECORD with this reason. */
  static reject(reason: string): Decision {
    const d = new Decision();
    d.kind = REJECT;
    d.reason = reason;
    return d;
  }

  /** A new key, value and headers (offset, timestamp and attributes are kept). */
  static rewrite(key: Uint8Array | null, value: Uint8Array | null, headers: Header[]): Decision {
    const d = new Decision();
    d.kind = REWRITE;
    d.setKey(key);
    d.setValue(value);
    d.headers = headers;
    return d;
  }

  setKey(b: Uint8Array | null): void {
    this.keyHold = b;
    if (b === null) { this.keyPtr = 0; this.keyLen = -1; return; }
    this.keyPtr = b.dataStart;
    this.keyLen = b.length;
  }

  setValue(b: Uint8Array | null): void {
    this.valueHold = b;
    if (b === null) { this.valuePtr = 0; this.valueLen = -1; return; }
    this.valuePtr = b.dataStart;
    this.valueLen = b.length;
  }
}

const KEEP_DECISION = new Decision();
const DROP_DECISION = new Decision();
DROP_DECISION.kind = DROP;

/** One record and its context; the SDK reuses one object for every record of a batch. */
@final
export class Record {
  direction: u8 = PRODUCE;
  topic: string = "";
  partition: i32 = 0;
  clientId: string = "";
  principal: string = "";
  /** Position in the batch. */
  index: u32 = 0;
  /** Produce: offset delta within the batch; fetch: absolute offset. */
  offset: i64 = 0;
  timestampMs: i64 = 0;
  /** @internal where the key and value bytes are (len < 0: null); use the methods below. */
  keyPtr: usize = 0;
  keyLen: i32 = -1;
  valuePtr: usize = 0;
  valueLen: i32 = -1;
  headerStart: i32 = 0;
  headerCount: i32 = 0;

  get hasKey(): bool { return this.keyLen >= 0; }
  get hasValue(): bool { return this.valueLen >= 0; }
  /** Value length in bytes (0 for a null value). */
  get valueLength(): i32 { return max(this.valueLen, 0); }
  /** Byte `i` of the value, read in place (0 <= i < valueLength). */
  @inline valueByte(i: i32): u8 { return load<u8>(this.valuePtr + <usize>i); }

  key(): Uint8Array | null { return copyBytes(this.keyPtr, this.keyLen); }
  value(): Uint8Array | null { return copyBytes(this.valuePtr, this.valueLen); }
  keyString(): string | null { return decodeBytes(this.keyPtr, this.keyLen); }
  valueString(): string | null { return decodeBytes(this.valuePtr, this.valueLen); }

  headerName(i: i32): string {
    const h = this.headerStart + i;
    return decodeBytes(headerPtr(h, 0), headerLen(h, 0)) || "";
  }

  headerValue(i: i32): Uint8Array | null {
    const h = this.headerStart + i;
    return copyBytes(headerPtr(h, 1), headerLen(h, 1));
  }

  /** Value of the first header called `name`, as a string (null when absent or null). */
  header(name: string): string | null {
    const want = String.UTF8.encode(name);
    const wantLen = want.byteLength;
    for (let i = 0; i < this.headerCount; i++) {
      const h = this.headerStart + i;
      if (headerLen(h, 0) == wantLen
          && memory.compare(headerPtr(h, 0), changetype<usize>(want), wantLen) == 0) {
        return decodeBytes(headerPtr(h, 1), headerLen(h, 1));
      }
    }
    return null;
  }

  /** Same key and headers, new value. */
  withValue(value: Uint8Array | null): Decision {
    const d = this.rewriteSame();
    d.setValue(value);
    return d;
  }

  /** Same value and headers, new key. */
  withKey(key: Uint8Array | null): Decision {
    const d = this.rewriteSame();
    d.setKey(key);
    return d;
  }

  private rewriteSame(): Decision {
    const d = new Decision();
    d.kind = REWRITE;
    d.keyPtr = this.keyPtr;
    d.keyLen = this.keyLen;
    d.valuePtr = this.valuePtr;
    d.valueLen = this.valueLen;
    d.headerStart = this.headerStart;
    d.headerCount = this.headerCount;
    return d;
  }
}

/** The functions a filter author writes (override what you need). */
export class Filter {
  /** Once per instance with the `config:` mapping (null without one). Return an error
   *  message to refuse the configuration (the proxy does not start), or null. */
  configure(config: Json | null): string | null { return null; }

  /** Once per record. Call fail("why") and return any decision to fail the whole batch
   *  (the filter's on_error policy applies); prefer Decision.reject for a bad record. */
  onRecord(rec: Record): Decision { return Decision.keep(); }

  /** Admin filters (`export * from "sluice/admin"`): one resource request as JSON in, the
   *  answer as JSON out (FILTER_ABI.md section 5); null fails the request. */
  onAdmin(request: string): string | null {
    fail("this filter does not handle admin requests");
    return null;
  }
}

let registered: Filter = new Filter();

/** Register the filter instance the ABI calls (once, at the top level of filter.ts). */
export function register(filter: Filter): void {
  registered = filter;
}

/** @internal */
export function currentFilter(): Filter { return registered; }

// ------------------------------------------------------------------------------------------
// Counters, errors, failure
// ------------------------------------------------------------------------------------------

const MAX_COUNTERS = 32;
const counterNames: string[] = [];
const counterValues: u32[] = [];

/** Add `n` to the detector counter `name` for this batch (reported to the host's telemetry). */
export function count(name: string, n: u32 = 1): void {
  for (let i = 0; i < counterNames.length; i++) {
    if (counterNames[i] == name) {
      counterValues[i] += n;
      return;
    }
  }
  if (counterNames.length < MAX_COUNTERS) {
    counterNames.push(name);
    counterValues.push(n);
  }
}

let errorMessage: string = "";
let failed: bool = false;

/** Set the message the host reads through sluice_last_error. */
export function setError(message: string): void {
  errorMessage = message;
}

/** Fail the current batch (or configuration, or admin request) with this message. */
export function fail(message: string): void {
  if (errorMessage.length == 0) errorMessage = message;
  failed = true;
}

/** @internal */
export function beginCall(): void {
  errorMessage = "";
  failed = false;
  counterNames.length = 0;
  counterValues.length = 0;
}

/** @internal */
export function hasFailed(): bool { return failed; }
/** @internal */
export function lastError(): string { return errorMessage; }
/** @internal */
export function counterCount(): i32 { return counterNames.length; }
/** @internal */
export function counterName(i: i32): string { return counterNames[i]; }
/** @internal */
export function counterValue(i: i32): u32 { return counterValues[i]; }

// ------------------------------------------------------------------------------------------
// Bytes helpers and the batch's header table (4 x i32 per header: key ptr/len, value ptr/len)
// ------------------------------------------------------------------------------------------

function copyBytes(ptr: usize, len: i32): Uint8Array | null {
  if (len < 0) return null;
  const out = new Uint8Array(len);
  memory.copy(out.dataStart, ptr, <usize>len);
  return out;
}

function decodeBytes(ptr: usize, len: i32): string | null {
  if (len < 0) return null;
  return String.UTF8.decodeUnsafe(ptr, <usize>len);
}

/** UTF-8 bytes of a string, as a Uint8Array (e.g. for withValue). */
export function bytesOf(s: string): Uint8Array {
  return Uint8Array.wrap(String.UTF8.encode(s));
}

let headerTable: usize = 0;
let headerCap: i32 = 0;
let headerUsed: i32 = 0;

/** @internal */
export function resetHeaders(): void { headerUsed = 0; }
/** @internal */
export function headersUsed(): i32 { return headerUsed; }

/** @internal Append a header; returns its index. */
export function addHeader(kptr: usize, klen: i32, vptr: usize, vlen: i32): i32 {
  if (headerUsed == headerCap) {
    headerCap = headerCap ? headerCap * 2 : 64;
    headerTable = headerTable ? heap.realloc(headerTable, <usize>headerCap * 16) : heap.alloc(<usize>headerCap * 16);
  }
  const at = headerTable + <usize>headerUsed * 16;
  store<u32>(at, <u32>kptr);
  store<i32>(at, klen, 4);
  store<u32>(at, <u32>vptr, 8);
  store<i32>(at, vlen, 12);
  return headerUsed++;
}

/** @internal Address of the key (part 0) or value (part 1) of header `i` of the batch table. */
export function headerPtr(i: i32, part: i32): usize {
  return <usize>load<u32>(headerTable + <usize>i * 16 + <usize>part * 8);
}

/** @internal */
export function headerLen(i: i32, part: i32): i32 {
  return load<i32>(headerTable + <usize>i * 16 + <usize>part * 8, 4);
}

// ------------------------------------------------------------------------------------------
// JSON (RFC 8259, strict, UTF-8 checked, depth-limited): the same rules and messages as the C
// SDK's parser.
// ------------------------------------------------------------------------------------------

export const JSON_NULL: u8 = 0;
export const JSON_FALSE: u8 = 1;
export const JSON_TRUE: u8 = 2;
export const JSON_NUMBER: u8 = 3;
export const JSON_STRING: u8 = 4;
export const JSON_ARRAY: u8 = 5;
export const JSON_OBJECT: u8 = 6;

/** A parsed JSON value: `str` holds a string's text or a number's text. */
export class Json {
  type: u8 = JSON_NULL;
  str: string = "";
  keys: string[] = [];
  items: Json[] = [];

  /** Member of an object by name (the last duplicate wins), or null. */
  get(name: string): Json | null {
    if (this.type != JSON_OBJECT) return null;
    for (let i = this.keys.length - 1; i >= 0; i--) {
      if (this.keys[i] == name) return this.items[i];
    }
    return null;
  }

  /** The string value, or null when this is not a string. */
  asString(): string | null {
    return this.type == JSON_STRING ? this.str : null;
  }

  /** Parse one JSON text held in `len` bytes at `ptr`; null on error (see jsonError). */
  static parseBytes(ptr: usize, len: i32): Json | null {
    const p = new JsonParser(ptr, ptr + <usize>max(len, 0));
    const v = p.value();
    if (v !== null) {
      p.ws();
      if (p.p != p.end) {
        p.error = "trailing characters after JSON value";
        jsonErrorText = p.error;
        jsonErrorOffset = <i32>(p.p - ptr);
        return null;
      }
      return v;
    }
    jsonErrorText = p.error;
    jsonErrorOffset = <i32>(p.p - ptr);
    return null;
  }

  static parse(text: string): Json | null {
    const buf = String.UTF8.encode(text);
    return Json.parseBytes(changetype<usize>(buf), buf.byteLength);
  }

  static parseArray(data: Uint8Array): Json | null {
    return Json.parseBytes(data.dataStart, data.length);
  }
}

let jsonErrorText: string = "";
let jsonErrorOffset: i32 = 0;

/** Why the last parse failed, and where (byte offset). */
export function jsonError(): string { return jsonErrorText; }
export function jsonErrorAt(): i32 { return jsonErrorOffset; }

const JSON_MAX_DEPTH = 64;

/** Length of the valid UTF-8 sequence at p (1..4), or 0 if invalid. */
export function utf8Len(p: usize, end: usize): i32 {
  const c = load<u8>(p);
  if (c < 0x80) return 1;
  let n: i32;
  let cp: u32;
  if (c >= 0xc2 && c <= 0xdf) { n = 2; cp = c & 0x1f; }
  else if (c >= 0xe0 && c <= 0xef) { n = 3; cp = c & 0x0f; }
  else if (c >= 0xf0 && c <= 0xf4) { n = 4; cp = c & 0x07; }
  else return 0;
  if (<i32>(end - p) < n) return 0;
  for (let i = 1; i < n; i++) {
    const b = load<u8>(p + <usize>i);
    if ((b & 0xc0) != 0x80) return 0;
    cp = (cp << 6) | (b & 0x3f);
  }
  if ((n == 3 && cp < 0x800) || (n == 4 && (cp < 0x10000 || cp > 0x10ffff))) return 0;
  if (cp >= 0xd800 && cp <= 0xdfff) return 0;
  return n;
}

function hexDigit(c: u8): i32 {
  if (c >= 48 && c <= 57) return c - 48;
  if (c >= 97 && c <= 102) return c - 87;
  if (c >= 65 && c <= 70) return c - 55;
  return -1;
}

function isDigit(c: u8): bool { return c >= 48 && c <= 57; }

class JsonParser {
  error: string = "";
  depth: i32 = 0;
  constructor(public p: usize, public end: usize) {}

  @inline at(): u8 { return load<u8>(this.p); }

  ws(): void {
    while (this.p < this.end) {
      const c = this.at();
      if (c != 32 && c != 9 && c != 10 && c != 13) break;
      this.p++;
    }
  }

  hex4(at: usize): i32 {
    if (at + 4 > this.end) return -1;
    let v = 0;
    for (let i: usize = 0; i < 4; i++) {
      const h = hexDigit(load<u8>(at + i));
      if (h < 0) return -1;
      v = (v << 4) | h;
    }
    return v;
  }

  putUtf8(out: u8[], cp: u32): void {
    if (cp < 0x80) out.push(<u8>cp);
    else if (cp < 0x800) { out.push(<u8>(0xc0 | (cp >> 6))); out.push(<u8>(0x80 | (cp & 0x3f))); }
    else if (cp < 0x10000) {
      out.push(<u8>(0xe0 | (cp >> 12))); out.push(<u8>(0x80 | ((cp >> 6) & 0x3f)));
      out.push(<u8>(0x80 | (cp & 0x3f)));
    } else {
      out.push(<u8>(0xf0 | (cp >> 18))); out.push(<u8>(0x80 | ((cp >> 12) & 0x3f)));
      out.push(<u8>(0x80 | ((cp >> 6) & 0x3f))); out.push(<u8>(0x80 | (cp & 0x3f)));
    }
  }

  /** At the opening quote; null on error. */
  string(): string | null {
    this.p++;
    const out: u8[] = [];
    for (;;) {
      if (this.p >= this.end) { this.error = "unterminated string"; return null; }
      const c = this.at();
      if (c == 34) {
        this.p++;
        return String.UTF8.decodeUnsafe(out.dataStart, <usize>out.length);
      }
      if (c < 0x20) { this.error = "control character in string"; return null; }
      if (c == 92) {
        if (this.end - this.p < 2) { this.error = "bad escape"; return null; }
        const e = load<u8>(this.p + 1);
        let lit: i32 = -1;
        if (e == 34) lit = 34;
        else if (e == 92) lit = 92;
        else if (e == 47) lit = 47;
        else if (e == 98) lit = 8;
        else if (e == 102) lit = 12;
        else if (e == 110) lit = 10;
        else if (e == 114) lit = 13;
        else if (e == 116) lit = 9;
        else if (e != 117) { this.error = "bad escape"; return null; }
        if (lit >= 0) { out.push(<u8>lit); this.p += 2; continue; }
        let cp = this.hex4(this.p + 2);
        if (cp < 0) { this.error = "bad \\u escape"; return null; }
        this.p += 6;
        if (cp >= 0xd800 && cp <= 0xdbff) {
          // A high surrogate must be followed by a low one.
          let lo = -1;
          if (this.end - this.p >= 6 && this.at() == 92 && load<u8>(this.p + 1) == 117) {
            lo = this.hex4(this.p + 2);
          }
          if (lo >= 0xdc00 && lo <= 0xdfff) {
            this.p += 6;
            cp = 0x10000 + ((cp - 0xd800) << 10) + (lo - 0xdc00);
          } else {
            cp = 0xfffd; // lone surrogate: UTF-8 cannot hold it
          }
        } else if (cp >= 0xdc00 && cp <= 0xdfff) {
          cp = 0xfffd;
        }
        this.putUtf8(out, <u32>cp);
        continue;
      }
      const n = utf8Len(this.p, this.end);
      if (n == 0) { this.error = "invalid UTF-8"; return null; }
      for (let i = 0; i < n; i++) out.push(load<u8>(this.p + <usize>i));
      this.p += <usize>n;
    }
    return null; // not reached: the loop only ends by returning
  }

  number(): Json | null {
    const start = this.p;
    let p = this.p;
    const e = this.end;
    if (p < e && load<u8>(p) == 45) p++;
    if (p >= e) { this.error = "bad number"; return null; }
    if (load<u8>(p) == 48) p++;
    else if (isDigit(load<u8>(p))) { while (p < e && isDigit(load<u8>(p))) p++; }
    else { this.error = "bad number"; return null; }
    if (p < e && load<u8>(p) == 46) {
      p++;
      if (p >= e || !isDigit(load<u8>(p))) { this.error = "bad number"; return null; }
      while (p < e && isDigit(load<u8>(p))) p++;
    }
    if (p < e && (load<u8>(p) == 101 || load<u8>(p) == 69)) {
      p++;
      if (p < e && (load<u8>(p) == 43 || load<u8>(p) == 45)) p++;
      if (p >= e || !isDigit(load<u8>(p))) { this.error = "bad number"; return null; }
      while (p < e && isDigit(load<u8>(p))) p++;
    }
    this.p = p;
    const node = new Json();
    node.type = JSON_NUMBER;
    node.str = String.UTF8.decodeUnsafe(start, p - start);
    return node;
  }

  literal(lit: string, type: u8): Json | null {
    const n = <usize>lit.length;
    if (this.end - this.p < n) { this.error = "unexpected token"; return null; }
    for (let i: usize = 0; i < n; i++) {
      if (load<u8>(this.p + i) != <u8>lit.charCodeAt(<i32>i)) {
        this.error = "unexpected token";
        return null;
      }
    }
    this.p += n;
    const node = new Json();
    node.type = type;
    return node;
  }

  value(): Json | null {
    this.ws();
    if (this.p >= this.end) { this.error = "unexpected end of input"; return null; }
    const c = this.at();
    if (c == 123 || c == 91) {
      if (++this.depth > JSON_MAX_DEPTH) { this.error = "nesting too deep"; return null; }
      const object = c == 123;
      const close: u8 = object ? 125 : 93;
      const node = new Json();
      node.type = object ? JSON_OBJECT : JSON_ARRAY;
      this.p++;
      this.ws();
      if (this.p < this.end && this.at() == close) {
        this.p++;
        this.depth--;
        return node;
      }
      // (A `break` out of `for (;;)` here made asc 0.28 drop the code after the loop.)
      let more = true;
      while (more) {
        this.ws();
        let key = "";
        if (object) {
          if (this.p >= this.end || this.at() != 34) { this.error = "expected member name"; return null; }
          const k = this.string();
          if (k === null) return null;
          key = k;
          this.ws();
          if (this.p >= this.end || this.at() != 58) { this.error = "expected ':'"; return null; }
          this.p++;
        }
        const child = this.value();
        if (child === null) return null;
        node.keys.push(key);
        node.items.push(child);
        this.ws();
        if (this.p >= this.end) { this.error = "unexpected end of input"; return null; }
        const sep = this.at();
        if (sep != 44 && sep != close) {
          this.error = object ? "expected ',' or '}'" : "expected ',' or ']'";
          return null;
        }
        this.p++;
        more = sep == 44;
      }
      this.depth--;
      return node;
    }
    if (c == 34) {
      const s = this.string();
      if (s === null) return null;
      const node = new Json();
      node.type = JSON_STRING;
      node.str = s;
      return node;
    }
    if (c == 45 || isDigit(c)) return this.number();
    if (c == 116) return this.literal("true", JSON_TRUE);
    if (c == 102) return this.literal("false", JSON_FALSE);
    if (c == 110) return this.literal("null", JSON_NULL);
    this.error = "unexpected character";
    return null;
  }
}
