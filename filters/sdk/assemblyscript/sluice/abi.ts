// sluice/abi: the Sluice Wasm ABI v1 exports. A filter re-exports them with
// `export * from "sluice/abi";` (do not call these yourself). FILTER_ABI.md has the layouts.
import {
  ABI_VERSION, DROP, Decision, FETCH, Json, KEEP, PRODUCE, REJECT, REWRITE, Record,
  addHeader, beginCall, counterCount, counterName, counterValue, currentFilter, fail,
  hasFailed, headerLen, headerPtr, lastError, resetHeaders,
} from "./index";

// Buffers of the previous call: the host reads an output before its next call, and the next
// call always starts with sluice_alloc, which frees them.
let inputBuf: usize = 0;
let outputBuf: usize = 0;
let errorBuf: ArrayBuffer = new ArrayBuffer(0);
let initialised: bool = false;
const decisions: Decision[] = [];

function pack(ptr: usize, len: usize): i64 {
  return (<i64>ptr << 32) | <i64>len;
}

export function sluice_abi_version(): i32 {
  return ABI_VERSION;
}

export function sluice_alloc(size: i32): i32 {
  if (inputBuf) heap.free(inputBuf);
  if (outputBuf) heap.free(outputBuf);
  inputBuf = outputBuf = 0;
  decisions.length = 0;
  // Nothing of the previous call is referenced from the stack here: collect now, never
  // inside a batch.
  __collect();
  inputBuf = heap.alloc(<usize>max(size, 1));
  return <i32>inputBuf;
}

export function sluice_last_error(): i64 {
  errorBuf = String.UTF8.encode(lastError());
  return pack(changetype<usize>(errorBuf), <usize>errorBuf.byteLength);
}

function failWith(message: string): i64 {
  fail(message);
  return -1;
}

export function sluice_init(ptr: i32, len: i32): i32 {
  beginCall();
  let config: Json | null = null;
  if (len > 0) {
    config = Json.parseBytes(<usize>ptr, len);
    if (config === null) {
      fail("configuration is not valid JSON");
      return 1;
    }
  }
  const err = currentFilter().configure(config);
  if (err !== null) {
    fail(err.length ? err : "configuration rejected by the filter");
    return 1;
  }
  initialised = true;
  return 0;
}

function ensureInit(): bool {
  if (initialised) return true;
  const err = currentFilter().configure(null);
  if (err !== null) {
    fail(err.length ? err : "filter needs a configuration");
    return false;
  }
  initialised = true;
  return true;
}

class Reader {
  ok: bool = true;
  constructor(public p: usize, public end: usize) {}

  @inline left(): usize { return this.end - this.p; }

  u8(): u8 {
    if (this.p >= this.end) { this.ok = false; return 0; }
    return load<u8>(this.p++);
  }

  u32(): u32 {
    if (this.left() < 4) { this.ok = false; return 0; }
    const v = load<u32>(this.p);
    this.p += 4;
    return v;
  }

  i64(): i64 {
    if (this.left() < 8) { this.ok = false; return 0; }
    const v = load<i64>(this.p);
    this.p += 8;
    return v;
  }

  /** Where `n` bytes for a length just read start (-1 = null where nullable); sets lastLen. */
  lastLen: i32 = -1;
  take(n: i64, nullable: bool): usize {
    this.lastLen = -1;
    if (!this.ok) return 0;
    if (n < 0) {
      if (!nullable || n != -1) this.ok = false;
      return 0;
    }
    if (<i64>this.left() < n) { this.ok = false; return 0; }
    const at = this.p;
    this.p += <usize>n;
    this.lastLen = <i32>n;
    return at;
  }

  bytes(nullable: bool): usize {
    return this.take(<i64><i32>this.u32(), nullable);
  }

  varlong(): i64 {
    let v: u64 = 0;
    for (let shift: u64 = 0; shift < 64; shift += 7) {
      if (this.p >= this.end) break;
      const b = load<u8>(this.p++);
      v |= (<u64>(b & 0x7f)) << shift;
      if (!(b & 0x80)) return <i64>(v >>> 1) ^ -(<i64>(v & 1));
    }
    this.ok = false;
    return 0;
  }

  /** Kafka's varint fields are 32-bit; anything wider is a malformed record. */
  varint(): i32 {
    const v = this.varlong();
    if (v < <i64>i32.MIN_VALUE || v > <i64>i32.MAX_VALUE) this.ok = false;
    return this.ok ? <i32>v : 0;
  }

  vbytes(nullable: bool): usize {
    return this.take(<i64>this.varint(), nullable);
  }
}

/** The fields both batch entry points start with; false (error set) on a foreign version. */
function readContext(r: Reader, rec: Record): bool {
  const version = r.u32();
  if (r.ok && version != <u32>ABI_VERSION) {
    fail("unsupported input version");
    return false;
  }
  rec.direction = r.u8() == 1 ? FETCH : PRODUCE;
  let at = r.bytes(false);
  rec.topic = String.UTF8.decodeUnsafe(at, <usize>max(r.lastLen, 0));
  rec.partition = <i32>r.u32();
  at = r.bytes(false);
  rec.clientId = String.UTF8.decodeUnsafe(at, <usize>max(r.lastLen, 0));
  at = r.bytes(false);
  rec.principal = String.UTF8.decodeUnsafe(at, <usize>max(r.lastLen, 0));
  return true;
}

class Writer {
  constructor(public p: usize) {}

  u8(v: u8): void { store<u8>(this.p++, v); }
  u32(v: u32): void { store<u32>(this.p, v); this.p += 4; }

  bytes(ptr: usize, len: i32): void {
    if (len < 0) { this.u32(0xffffffff); return; }
    this.u32(<u32>len);
    memory.copy(this.p, ptr, <usize>len);
    this.p += <usize>len;
  }

  str(s: string): void {
    const b = String.UTF8.encode(s);
    this.bytes(changetype<usize>(b), b.byteLength);
  }

  varlong(v: i64): void {
    let z = <u64>((v << 1) ^ (v >> 63));
    while (z > 0x7f) {
      store<u8>(this.p++, <u8>((z & 0x7f) | 0x80));
      z >>>= 7;
    }
    store<u8>(this.p++, <u8>z);
  }

  vbytes(ptr: usize, len: i32): void {
    if (len < 0) { this.varlong(-1); return; }
    this.varlong(<i64>len);
    memory.copy(this.p, ptr, <usize>len);
    this.p += <usize>len;
  }
}

function vsize(v: i64): usize {
  let z = <u64>((v << 1) ^ (v >> 63));
  let n: usize = 1;
  while (z > 0x7f) { z >>>= 7; n++; }
  return n;
}

function blen(len: i32): usize { return 4 + <usize>max(len, 0); }
function vblen(len: i32): usize { return len < 0 ? 1 : vsize(<i64>len) + <usize>len; }

function utf8Size(s: string): usize { return <usize>String.UTF8.byteLength(s); }

function countersSize(): usize {
  let n: usize = 4;
  for (let i = 0; i < counterCount(); i++) n += 8 + utf8Size(counterName(i));
  return n;
}

function writeCounters(w: Writer): void {
  w.u32(<u32>counterCount());
  for (let i = 0; i < counterCount(); i++) {
    w.str(counterName(i));
    w.u32(counterValue(i));
  }
}

function callFilter(rec: Record): Decision | null {
  const d = currentFilter().onRecord(rec);
  if (hasFailed()) {
    if (lastError().length == 0) fail("filter error");
    return null;
  }
  return d;
}

function headerCountOf(d: Decision): i32 {
  const hs = d.headers;
  return hs !== null ? hs.length : d.headerCount;
}

/** Size of a rewrite's headers in the sluice_filter layout (fixed) or Kafka's (varint). */
function headersSize(d: Decision, varint: bool): usize {
  let n: usize = 0;
  const hs = d.headers;
  if (hs !== null) {
    for (let i = 0; i < hs.length; i++) {
      const k = <i32>utf8Size(hs[i].key);
      const v = hs[i].value;
      const vl = v === null ? -1 : v.length;
      n += varint ? vblen(k) + vblen(vl) : blen(k) + blen(vl);
    }
  } else {
    for (let i = d.headerStart; i < d.headerStart + d.headerCount; i++) {
      n += varint ? vblen(headerLen(i, 0)) + vblen(headerLen(i, 1))
        : blen(headerLen(i, 0)) + blen(headerLen(i, 1));
    }
  }
  return n;
}

function writeHeaders(w: Writer, d: Decision, varint: bool): void {
  const hs = d.headers;
  if (hs !== null) {
    for (let i = 0; i < hs.length; i++) {
      const k = String.UTF8.encode(hs[i].key);
      const v = hs[i].value;
      const vp: usize = v === null ? 0 : v.dataStart;
      const vl = v === null ? -1 : v.length;
      if (varint) {
        w.vbytes(changetype<usize>(k), k.byteLength);
        w.vbytes(vp, vl);
      } else {
        w.bytes(changetype<usize>(k), k.byteLength);
        w.bytes(vp, vl);
      }
    }
    return;
  }
  for (let i = d.headerStart; i < d.headerStart + d.headerCount; i++) {
    if (varint) {
      w.vbytes(headerPtr(i, 0), headerLen(i, 0));
      w.vbytes(headerPtr(i, 1), headerLen(i, 1));
    } else {
      w.bytes(headerPtr(i, 0), headerLen(i, 0));
      w.bytes(headerPtr(i, 1), headerLen(i, 1));
    }
  }
}

const rec = new Record();

export function sluice_filter(ptr: i32, len: i32): i64 {
  beginCall();
  resetHeaders();
  if (!ensureInit()) return -1;
  const r = new Reader(<usize>ptr, <usize>ptr + <usize>len);
  if (!readContext(r, rec)) return -1;
  const count = r.u32();
  if (!r.ok || <usize>count > r.left() / 28 + 1) return failWith("malformed batch header");
  let size: usize = 4;
  for (let i: u32 = 0; i < count; i++) {
    rec.index = i;
    rec.offset = r.i64();
    rec.timestampMs = r.i64();
    rec.keyPtr = r.bytes(true);
    rec.keyLen = r.lastLen;
    rec.valuePtr = r.bytes(true);
    rec.valueLen = r.lastLen;
    const hc = r.u32();
    if (!r.ok || <usize>hc > r.left() / 8) return failWith("malformed record");
    rec.headerStart = -1;
    for (let h: u32 = 0; h < hc; h++) {
      const kp = r.bytes(false);
      const kl = r.lastLen;
      const vp = r.bytes(true);
      const at = addHeader(kp, kl, vp, r.lastLen);
      if (h == 0) rec.headerStart = at;
    }
    if (rec.headerStart < 0) rec.headerStart = 0;
    rec.headerCount = <i32>hc;
    if (!r.ok) return failWith("malformed header");
    const d = callFilter(rec);
    if (d === null) return -1;
    decisions.push(d);
    size += 1;
    if (d.kind == REWRITE) {
      size += blen(d.keyLen) + blen(d.valueLen) + 4 + headersSize(d, false);
    } else if (d.kind == REJECT) {
      size += 4 + utf8Size(d.reason);
    }
  }
  size += countersSize();
  outputBuf = heap.alloc(size);
  const w = new Writer(outputBuf);
  w.u32(count);
  for (let i = 0; i < decisions.length; i++) {
    const d = decisions[i];
    w.u8(d.kind);
    if (d.kind == REWRITE) {
      w.bytes(d.keyPtr, d.keyLen);
      w.bytes(d.valuePtr, d.valueLen);
      w.u32(<u32>headerCountOf(d));
      writeHeaders(w, d, false);
    } else if (d.kind == REJECT) {
      w.str(d.reason);
    }
  }
  writeCounters(w);
  return pack(outputBuf, w.p - outputBuf);
}

// Per record of a sluice_filter_records call, 24 bytes: raw ptr u32, raw len u32,
// timestampDelta i64, offsetDelta i32, attributes u8.
let nativeTable: usize = 0;
let nativeCap: u32 = 0;

function rewriteBody(d: Decision, at: usize): usize {
  return 1 + vsize(load<i64>(at, 8)) + vsize(<i64>load<i32>(at, 16)) + vblen(d.keyLen)
    + vblen(d.valueLen) + vsize(<i64>headerCountOf(d)) + headersSize(d, true);
}

export function sluice_filter_records(ptr: i32, len: i32): i64 {
  beginCall();
  resetHeaders();
  if (!ensureInit()) return -1;
  const r = new Reader(<usize>ptr, <usize>ptr + <usize>len);
  if (!readContext(r, rec)) return -1;
  const offsetBase = r.i64();
  const timestampBase = r.i64();
  const count = r.u32();
  // The smallest Kafka record is 7 bytes (length and six one-byte fields).
  if (!r.ok || <usize>count > r.left() / 7 + 1) return failWith("malformed batch header");
  if (count > nativeCap) {
    if (nativeTable) heap.free(nativeTable);
    nativeCap = max(count, 64);
    nativeTable = heap.alloc(<usize>nativeCap * 24);
  }
  let changed: u32 = 0;
  let rejects: u32 = 0;
  let recordsSize: usize = 0;
  let rejectsSize: usize = 0;
  const body = new Reader(0, 0);
  for (let i: u32 = 0; i < count; i++) {
    const start = r.p;
    const n = r.varint();
    if (!r.ok || n < 0 || r.left() < <usize>n) return failWith("malformed record");
    body.p = r.p;
    body.end = r.p + <usize>n;
    body.ok = true;
    r.p += <usize>n;
    const at = nativeTable + <usize>i * 24;
    store<u32>(at, <u32>start);
    store<u32>(at, <u32>(r.p - start), 4);
    const attributes = body.u8();
    const timestampDelta = body.varlong();
    const offsetDelta = body.varint();
    store<i64>(at, timestampDelta, 8);
    store<i32>(at, offsetDelta, 16);
    store<u8>(at, attributes, 20);
    rec.index = i;
    rec.offset = offsetBase + <i64>offsetDelta;
    rec.timestampMs = timestampBase + timestampDelta;
    rec.keyPtr = body.vbytes(true);
    rec.keyLen = body.lastLen;
    rec.valuePtr = body.vbytes(true);
    rec.valueLen = body.lastLen;
    const hc = body.varint();
    if (!body.ok || hc < 0 || <usize>hc > body.left() / 2) return failWith("malformed record");
    rec.headerStart = 0;
    for (let h = 0; h < hc; h++) {
      const kp = body.vbytes(false);
      const kl = max(body.lastLen, 0);
      const vp = body.vbytes(true);
      const idx = addHeader(kp, kl, vp, body.lastLen);
      if (h == 0) rec.headerStart = idx;
    }
    rec.headerCount = hc;
    if (!body.ok || body.p != body.end) return failWith("malformed record");
    const d = callFilter(rec);
    if (d === null) return -1;
    decisions.push(d);
    if (d.kind == KEEP) {
      recordsSize += <usize>load<u32>(at, 4);
    } else if (d.kind == REWRITE) {
      const b = rewriteBody(d, at);
      recordsSize += vsize(<i64>b) + b;
      changed++;
    } else if (d.kind == DROP) {
      changed++;
    } else {
      rejectsSize += 8 + utf8Size(d.reason);
      changed++;
      rejects++;
    }
  }
  if (r.p != r.end) return failWith("malformed batch: bytes after the last record");
  if (recordsSize > 0x7fffffff) return failWith("output too large");
  const size: usize = <usize>12 + <usize>count + (changed ? recordsSize : <usize>0)
    + rejectsSize + countersSize();
  outputBuf = heap.alloc(size);
  const w = new Writer(outputBuf);
  w.u32(count);
  for (let i = 0; i < decisions.length; i++) w.u8(decisions[i].kind);
  if (!changed) {
    w.u32(0xffffffff); // -1: the records section is unchanged
  } else {
    w.u32(<u32>recordsSize);
    for (let i = 0; i < decisions.length; i++) {
      const d = decisions[i];
      const at = nativeTable + <usize>i * 24;
      if (d.kind == KEEP) {
        const rawLen = <usize>load<u32>(at, 4);
        memory.copy(w.p, <usize>load<u32>(at), rawLen);
        w.p += rawLen;
      } else if (d.kind == REWRITE) {
        w.varlong(<i64>rewriteBody(d, at));
        w.u8(load<u8>(at, 20));
        w.varlong(load<i64>(at, 8));
        w.varlong(<i64>load<i32>(at, 16));
        w.vbytes(d.keyPtr, d.keyLen);
        w.vbytes(d.valuePtr, d.valueLen);
        w.varlong(<i64>headerCountOf(d));
        writeHeaders(w, d, true);
      }
    }
  }
  w.u32(rejects);
  for (let i = 0; i < decisions.length; i++) {
    if (decisions[i].kind != REJECT) continue;
    w.u32(<u32>i);
    w.str(decisions[i].reason);
  }
  writeCounters(w);
  return pack(outputBuf, w.p - outputBuf);
}
