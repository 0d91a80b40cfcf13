// The JavaScript SDK for Sluice filters: the module "sluice" that a filter imports.
//
// A filter registers one function: onRecord(fn), called once per record, or
// engine.processRecord(fn) (seed 002's batch-in-batch-out shape), called once per batch; an
// admin filter registers onAdmin(fn), called once per admin resource (with or without a
// record function). The
// C shim (sluice_js.c) hands each batch to run() below and reads back one normalised result
// per record: undefined = keep, null = drop, a string = reject with that reason, an object =
// the record's new key, value and headers (absent members: as they were). The shim compares
// the new bytes with the old ones, so returning the record unchanged is a keep.

const native = globalThis.__sluice_native;
delete globalThis.__sluice_native;

// A record's key, value or header value: bytes that stay in the host's input. text() decodes
// UTF-8, json() parses with the C SDK's strict parser (same rules and messages), array()
// copies the bytes into a Uint8Array. map(fn) maps over the text's characters (seed 001's
// record.value.map((char) => char.toUpperCase())) and returns an array of strings, which a
// record's new value may be.
export const RecordData = native.RecordData;
Object.assign(RecordData.prototype, {
  map(fn) {
    return Array.from(this.text(), fn);
  },
  toString() {
    return this.text();
  },
  [Symbol.iterator]() {
    return this.text()[Symbol.iterator]();
  },
});

class Rejection {
  constructor(reason) {
    this.reason = String(reason);
  }
}

/** Keep the record unchanged (the same as returning the record or nothing). */
export function keep() {
  return undefined;
}

/** Drop the record (the same as returning null). */
export function drop() {
  return null;
}

/** Reject the record: the producer gets INVALID_RECORD with this reason. */
export function reject(reason) {
  return new Rejection(reason);
}

/** The UTF-8 bytes of a string, as a Uint8Array (QuickJS has no TextEncoder). */
export function utf8(text) {
  return native.utf8(String(text));
}

/** Add n (default 1) to the per-batch counter `name`, reported to telemetry. */
export function count(name, n = 1) {
  native.count(String(name), n);
}

/** The filter's `config:` mapping from the proxy config (an object; {} without one). It is
 * set before the filter's top level runs, so a filter can read it there. */
export function config() {
  return native.config;
}

let recordHandler = null;
let batchHandler = null;
let adminHandler = null;

function register(kind, fn) {
  if (typeof fn !== "function") throw new TypeError(`${kind} needs a function`);
  if (recordHandler !== null || batchHandler !== null) {
    throw new Error("a filter registers one handler: onRecord or engine.processRecord");
  }
  if (kind === "onRecord") recordHandler = fn;
  else batchHandler = fn;
}

/** Register the per-record function: fn(record) returns the record's fate (may be async). */
export function onRecord(fn) {
  register("onRecord", fn);
}

/** Seed 002's engine: processRecord(fn) with fn([{header, records}]) returning a Map of
 * destination topic to [{header, records}] (or that array), or a Promise of either. */
export const engine = {
  processRecord(fn) {
    register("processRecord", fn);
  },
};

class AdminAnswer {
  constructor(decision, message) {
    this.decision = decision;
    this.message = String(message ?? "");
  }
}

/** Register the admin function (FILTER_ABI.md section 5): fn(request) once per admin resource
 * (a created topic, its partitions or its configs), returning allow(), deny(message),
 * {decision: "rewrite", partitions, configs, message} or nothing (allow); it may be async.
 * `sluice filter build` exports sluice_admin only for a filter.js that calls onAdmin. */
export function onAdmin(fn) {
  if (typeof fn !== "function") throw new TypeError("onAdmin needs a function");
  if (adminHandler !== null) throw new Error("a filter registers one onAdmin function");
  adminHandler = fn;
}

/** Admin: let the request through unchanged. */
export function allow(message) {
  return new AdminAnswer("allow", message);
}

/** Admin: refuse the resource; the client gets POLICY_VIOLATION with this message. */
export function deny(message) {
  return new AdminAnswer("deny", message);
}

const ADMIN_DECISIONS = ["allow", "deny", "rewrite"];

function adminAnswer(result) {
  if (result === undefined) return '{"decision":"allow"}';
  if (result === null || typeof result !== "object" || Array.isArray(result) ||
      !ADMIN_DECISIONS.includes(result.decision)) {
    throw new TypeError("an admin function returns allow(), deny(message), " +
                        "{decision: \"rewrite\", ...} or nothing");
  }
  return JSON.stringify(result);
}

function isThenable(v) {
  return v !== null && typeof v === "object" && typeof v.then === "function";
}

function normalise(result, rec) {
  if (result === undefined || result === rec) return undefined;
  if (result === null) return null;
  if (result instanceof Rejection) return result.reason;
  if (typeof result !== "object") {
    throw new TypeError(
      `a filter returns a record, null, reject(reason) or nothing, not a ${typeof result}`);
  }
  return result;
}

function runRecords(records) {
  const n = records.length;
  const out = new Array(n);
  let pending = null;
  for (let i = 0; i < n; i++) {
    const r = recordHandler(records[i]);
    if (isThenable(r)) {
      (pending ??= []).push(i);
      out[i] = r;
    } else {
      out[i] = normalise(r, records[i]);
    }
  }
  if (pending === null) return out;
  return Promise.all(pending.map((i) => out[i])).then((values) => {
    pending.forEach((i, k) => {
      out[i] = normalise(values[k], records[i]);
    });
    return out;
  });
}

function batchOutput(result, header, records) {
  let batches;
  if (result instanceof Map) {
    if (result.size !== 1) {
      throw new Error("processRecord must return one destination: a filter cannot route " +
                      `records to other topics (got ${result.size})`);
    }
    batches = [...result.values()][0];
  } else {
    batches = result;
  }
  if (!Array.isArray(batches)) {
    throw new TypeError("processRecord must return a Map of topic to [{header, records}], " +
                        "or [{header, records}]");
  }
  const outs = [];
  for (const b of batches) {
    if (b === null || typeof b !== "object" || !Array.isArray(b.records)) {
      throw new TypeError("each returned batch must be {header, records: [...]}");
    }
    for (const r of b.records) outs.push(r);
  }
  return Promise.all(outs).then((resolved) => matchRecords(resolved, records));
}

// Output records find their input record by identity or by `offset` (a spread copy
// {...record, value} keeps it); objects without one are matched by position when the batch
// kept its length. Input records nothing matched are dropped.
function matchRecords(outs, records) {
  const n = records.length;
  const result = new Array(n).fill(null);
  const taken = new Array(n).fill(false);
  const byOffset = new Map();
  for (let i = 0; i < n; i++) byOffset.set(records[i].offset, i);
  const positional = outs.length === n;
  for (let k = 0; k < outs.length; k++) {
    const o = outs[k];
    let i;
    if (o !== null && typeof o === "object" && !(o instanceof Rejection) &&
        byOffset.has(o.offset)) {
      i = byOffset.get(o.offset);
    } else if (positional) {
      i = k;
    } else {
      throw new Error("processRecord returned a record that is none of the batch's: " +
                      "a filter cannot add records (keep `offset`, e.g. {...record, value})");
    }
    if (taken[i]) throw new Error(`processRecord returned record ${i} twice`);
    taken[i] = true;
    result[i] = normalise(o, records[i]);
  }
  return result;
}

function runBatch(ctx, records) {
  const header = {
    topic: ctx.topic,
    partition: ctx.partition,
    direction: ctx.direction,
    clientId: ctx.clientId,
    principal: ctx.principal,
    baseOffset: ctx.baseOffset,
    baseTimestamp: ctx.baseTimestamp,
    recordCount: records.length,
  };
  const result = batchHandler([{ header, records }]);
  return isThenable(result)
    ? result.then((r) => batchOutput(r, header, records))
    : batchOutput(result, header, records);
}

// Called by the shim: once with the config, then once per batch.
globalThis.__sluice_driver = {
  ready() {
    if (recordHandler === null && batchHandler === null && adminHandler === null) {
      throw new Error("the filter registers no handler: call onRecord(fn), " +
                      "engine.processRecord(fn) or onAdmin(fn)");
    }
  },
  // ctx is also the records' prototype: topic, partition, direction, clientId, principal.
  // A filter with only an admin function keeps every record.
  run(ctx, records) {
    if (recordHandler !== null) return runRecords(records);
    if (batchHandler !== null) return runBatch(ctx, records);
    return new Array(records.length);
  },
  // One admin resource: the request's JSON text in, the answer's JSON text out (or a
  // promise of it).
  admin(text) {
    if (adminHandler === null) throw new Error("this filter does not handle admin requests");
    const result = adminHandler(JSON.parse(text));
    return isThenable(result) ? result.then(adminAnswer) : adminAnswer(result);
  },
  recordPrototype: {
    /** The value of the last header called `name` (a RecordData or null), or undefined. */
    header(name) {
      let found;
      for (const h of this.headers) if (h.key === name) found = h.value;
      return found;
    },
  },
};
