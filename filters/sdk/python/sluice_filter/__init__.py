"""The Python SDK for Sluice filters (Sluice ABI v1 layouts, world sluice:filter@1.0.0).

A filter is one Python file (``filter.py``) that registers a function over one record;
`sluice filter build` bundles it with CPython into a WebAssembly component (componentize-py):

    import sluice_filter as sluice

    @sluice.on_record
    def upper(rec: sluice.Record) -> sluice.Decision:
        if rec.value is None:
            return sluice.keep()
        return rec.with_value(rec.value.upper())

The callback returns `keep()`, `drop()`, `reject(reason)` or a rewrite (`rec.with_value`,
`rec.with_key`, `rec.with_headers`, `rewrite(key, value, headers)`); ``None`` means keep.
`config()` is the filter's ``config:`` mapping (a dict; ``{}`` when absent); `on_init`
registers a function that checks it once per instance (raise ValueError to refuse the load).
`count(name, n)` adds to a detector counter. An exception in the callback fails the batch
(the filter's ``on_error`` decides), with its type and message as the error. An admin filter
registers `on_admin` (one admin resource as a dict in; `allow()`, `deny(message)`, a rewrite
dict or None out).

Both entry points of the world call the same callback: ``filter`` (the host's decoded batch)
and ``filter-records`` (Kafka's own record encoding, the fast path: kept records are copied
verbatim). This module has no other imports than the standard library's ``struct``, so its
codec also runs (and is tested) outside Wasm.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Callable
from typing import Any

__all__ = [
    "ABI_VERSION", "Decision", "Record", "config", "count", "drop", "keep", "on_init",
    "on_record", "reject", "rewrite",
]

ABI_VERSION = 1
_KEEP, _REWRITE, _DROP, _REJECT = 0, 1, 2, 3
Header = tuple[str, "bytes | None"]


class Decision:
    """What happens to one record (build it with keep/drop/reject/rewrite)."""

    __slots__ = ("headers", "key", "kind", "reason", "value")

    def __init__(self, kind: int, key: bytes | None = None, value: bytes | None = None,
                 headers: list[Header] | None = None, reason: str = "") -> None:
        self.kind = kind
        self.key = key
        self.value = value
        self.headers = headers
        self.reason = reason


_KEEP_DECISION = Decision(_KEEP)
_DROP_DECISION = Decision(_DROP)


def keep() -> Decision:
    return _KEEP_DECISION


def drop() -> Decision:
    return _DROP_DECISION


def reject(reason: str) -> Decision:
    return Decision(_REJECT, reason=reason)


def rewrite(key: bytes | None, value: bytes | None, headers: list[Header]) -> Decision:
    """Replace key, value and headers as a whole."""
    return Decision(_REWRITE, key, value, list(headers))


class Record:
    """One record and its context. `offset`: the offset delta on produce, the absolute
    offset on fetch. `key`/`value` are None when null; header values too."""

    __slots__ = ("client_id", "direction", "headers", "index", "key", "offset", "partition",
                 "principal", "timestamp_ms", "topic", "value")

    def __init__(self, direction: str, topic: str, partition: int, client_id: str,
                 principal: str, index: int, offset: int, timestamp_ms: int,
                 key: bytes | None, value: bytes | None, headers: list[Header]) -> None:
        self.direction = direction
        self.topic = topic
        self.partition = partition
        self.client_id = client_id
        self.principal = principal
        self.index = index
        self.offset = offset
        self.timestamp_ms = timestamp_ms
        self.key = key
        self.value = value
        self.headers = headers

    def header(self, name: str) -> bytes | None:
        """The value of the first header called `name` (None when absent or null)."""
        for k, v in self.headers:
            if k == name:
                return v
        return None

    def with_value(self, value: bytes | None) -> Decision:
        return Decision(_REWRITE, self.key, value, self.headers)

    def with_key(self, key: bytes | None) -> Decision:
        return Decision(_REWRITE, key, self.value, self.headers)

    def with_headers(self, headers: list[Header]) -> Decision:
        return Decision(_REWRITE, self.key, self.value, list(headers))


_on_record: Callable[[Record], Decision | None] | None = None
_on_init: Callable[[dict[str, Any]], None] | None = None
_on_admin: Callable[[dict[str, Any]], dict[str, Any] | None] | None = None
_config: dict[str, Any] = {}
_counts: dict[str, int] = {}


def on_record(fn: Callable[[Record], Decision | None]) -> Callable[[Record], Decision | None]:
    """Register the filter's per-record function (decorator)."""
    global _on_record
    _on_record = fn
    return fn


def on_init(fn: Callable[[dict[str, Any]], None]) -> Callable[[dict[str, Any]], None]:
    """Register a function called once per instance with the config (decorator)."""
    global _on_init
    _on_init = fn
    return fn


def on_admin(fn: Callable[[dict[str, Any]], dict[str, Any] | None]
             ) -> Callable[[dict[str, Any]], dict[str, Any] | None]:
    """Register the admin function (decorator; docs/FILTER_ABI.md section 5): called once per
    admin resource with the request as a dict, it returns `allow()`, `deny(message)`, a dict
    ``{"decision": "rewrite", ...}`` or None (allow). `sluice filter build` gives only a
    filter.py that uses ``on_admin`` the world's admin export."""
    global _on_admin
    _on_admin = fn
    return fn


def allow(message: str = "") -> dict[str, Any]:
    """Admin: let the resource through unchanged."""
    return {"decision": "allow", "message": message}


def deny(message: str) -> dict[str, Any]:
    """Admin: refuse the resource; the client gets POLICY_VIOLATION with this message."""
    return {"decision": "deny", "message": str(message)}


def config() -> dict[str, Any]:
    """The filter's ``config:`` mapping."""
    return _config


def count(name: str, n: int = 1) -> None:
    """Add `n` to the detector counter `name` (reported per batch)."""
    _counts[name] = _counts.get(name, 0) + n


# -- entry points (called by the component's world class) ----------------------------------

def init(config_json: str) -> None:
    global _config
    parsed = json.loads(config_json) if config_json else {}
    _config = parsed if isinstance(parsed, dict) else {}
    if _on_record is None and _on_admin is None:
        raise ValueError("filter.py registers no @sluice_filter.on_record (or on_admin) "
                         "function")
    if _on_init is not None:
        _on_init(_config)


_U32 = struct.Struct("<I")
_I32 = struct.Struct("<i")
_HEAD_NATIVE = struct.Struct("<qqI")
_REC = struct.Struct("<qq")
_DIRECTIONS = ("produce", "fetch")


class _Reader:
    __slots__ = ("buf", "pos")

    def __init__(self, buf: bytes) -> None:
        self.buf = buf
        self.pos = 0

    def u32(self) -> int:
        (v,) = _U32.unpack_from(self.buf, self.pos)
        self.pos += 4
        return int(v)

    def i32(self) -> int:
        (v,) = _I32.unpack_from(self.buf, self.pos)
        self.pos += 4
        return int(v)

    def text(self) -> str:
        n = self.u32()
        s = self.buf[self.pos:self.pos + n].decode("utf-8")
        self.pos += n
        return s

    def nullable(self) -> bytes | None:
        n = self.i32()
        if n < 0:
            return None
        b = self.buf[self.pos:self.pos + n]
        self.pos += n
        return b


def _context(r: _Reader) -> tuple[str, str, int, str, str]:
    version = r.u32()
    if version != ABI_VERSION:
        raise ValueError(f"input version {version}, this SDK reads {ABI_VERSION}")
    direction = _DIRECTIONS[r.buf[r.pos]]
    r.pos += 1
    topic = r.text()
    partition = r.i32()
    return direction, topic, partition, r.text(), r.text()


def admin(request_json: str) -> str:
    """One admin resource: the request's JSON in, the answer's JSON out."""
    if _on_admin is None:
        raise ValueError("this filter does not handle admin requests")
    answer = _on_admin(json.loads(request_json))
    if answer is None:
        return '{"decision":"allow"}'
    if not isinstance(answer, dict) or answer.get("decision") not in ("allow", "deny",
                                                                      "rewrite"):
        raise TypeError("an admin function returns allow(), deny(message), "
                        '{"decision": "rewrite", ...} or None')
    return json.dumps(answer, separators=(",", ":"))


def _call(rec: Record) -> Decision:
    if _on_record is None:  # a filter with only an admin function keeps every record
        return _KEEP_DECISION
    d = _on_record(rec)
    if d is None:
        return _KEEP_DECISION
    if not isinstance(d, Decision):
        raise TypeError(f"on_record returned {type(d).__name__}, expected a Decision")
    return d


def _nullable_out(v: bytes | None) -> bytes:
    return b"\xff\xff\xff\xff" if v is None else _I32.pack(len(v)) + bytes(v)


def _str_out(s: str) -> bytes:
    b = s.encode("utf-8")
    return _U32.pack(len(b)) + b


def _counters_out() -> bytes:
    parts = [_U32.pack(len(_counts))]
    for name, n in _counts.items():
        parts.append(_str_out(name))
        parts.append(_U32.pack(n & 0xFFFFFFFF))
    _counts.clear()
    return b"".join(parts)


def filter_batch(batch: bytes) -> bytes:
    """``sluice_filter``'s layouts: the decoded batch in, decisions out."""
    _counts.clear()
    r = _Reader(batch)
    direction, topic, partition, client_id, principal = _context(r)
    n = r.u32()
    out = [_U32.pack(n)]
    for i in range(n):
        offset, ts = _REC.unpack_from(batch, r.pos)
        r.pos += 16
        key = r.nullable()
        value = r.nullable()
        headers: list[Header] = []
        for _ in range(r.u32()):
            hk = r.text()
            headers.append((hk, r.nullable()))
        d = _call(Record(direction, topic, partition, client_id, principal, i, offset, ts,
                         key, value, headers))
        kind = d.kind
        out.append(bytes((kind,)))
        if kind == _REWRITE:
            hs = d.headers or []
            out.append(_nullable_out(d.key) + _nullable_out(d.value) + _U32.pack(len(hs)))
            for hk, hv in hs:
                out.append(_str_out(hk) + _nullable_out(hv))
        elif kind == _REJECT:
            out.append(_str_out(d.reason[:500]))
    out.append(_counters_out())
    return b"".join(out)


# -- Kafka's record encoding (zigzag varints) ------------------------------------------------

def _varint(buf: bytes, pos: int) -> tuple[int, int]:
    shift = 0
    raw = 0
    while True:
        b = buf[pos]
        pos += 1
        raw |= (b & 0x7F) << shift
        if b < 0x80:
            break
        shift += 7
        if shift > 63:
            raise ValueError("varint too long")
    return (raw >> 1) ^ -(raw & 1), pos


def _put_varint(out: bytearray, v: int) -> None:
    raw = ((v << 1) ^ (v >> 63)) & 0xFFFFFFFFFFFFFFFF
    while raw >= 0x80:
        out.append((raw & 0x7F) | 0x80)
        raw >>= 7
    out.append(raw)


def _put_bytes(out: bytearray, v: bytes | None) -> None:
    if v is None:
        _put_varint(out, -1)
    else:
        _put_varint(out, len(v))
        out += v


def _encode_record(attributes: int, ts_delta: int, off_delta: int, key: bytes | None,
                   value: bytes | None, headers: list[Header]) -> bytes:
    body = bytearray((attributes,))
    _put_varint(body, ts_delta)
    _put_varint(body, off_delta)
    _put_bytes(body, key)
    _put_bytes(body, value)
    _put_varint(body, len(headers))
    for hk, hv in headers:
        _put_bytes(body, hk.encode("utf-8"))
        _put_bytes(body, hv)
    out = bytearray()
    _put_varint(out, len(body))
    return bytes(out + body)


def _field(buf: bytes, pos: int) -> tuple[bytes | None, int]:
    n, pos = _varint(buf, pos)
    if n < 0:
        return None, pos
    end = pos + n
    if end > len(buf):
        raise ValueError("record field past the end of the section")
    return buf[pos:end], end


def filter_records(batch: bytes) -> bytes:
    """``sluice_filter_records``' layouts: the records section in Kafka's encoding."""
    _counts.clear()
    r = _Reader(batch)
    direction, topic, partition, client_id, principal = _context(r)
    offset_base, ts_base, n = _HEAD_NATIVE.unpack_from(batch, r.pos)
    pos = r.pos + _HEAD_NATIVE.size
    fates = bytearray(n)
    section: list[bytes] = []
    rejects: list[bytes] = []
    changed = False
    for i in range(n):
        length, body = _varint(batch, pos)
        end = body + length
        if length < 1 or end > len(batch):
            raise ValueError(f"record {i}: length {length} past the end of the section")
        attributes = batch[body]
        ts_delta, p = _varint(batch, body + 1)
        off_delta, p = _varint(batch, p)
        key, p = _field(batch, p)
        value, p = _field(batch, p)
        hcount, p = _varint(batch, p)
        if hcount < 0:
            raise ValueError(f"record {i}: negative header count")
        headers: list[Header] = []
        for _ in range(hcount):
            hk, p = _field(batch, p)
            if hk is None:
                raise ValueError(f"record {i}: null header key")
            hv, p = _field(batch, p)
            headers.append((hk.decode("utf-8"), hv))
        if p != end:
            raise ValueError(f"record {i}: {end - p} bytes after its headers")
        d = _call(Record(direction, topic, partition, client_id, principal, i,
                         offset_base + off_delta, ts_base + ts_delta, key, value, headers))
        kind = d.kind
        fates[i] = kind
        if kind == _KEEP:
            section.append(batch[pos:end])
        elif kind == _REWRITE:
            changed = True
            section.append(_encode_record(attributes, ts_delta, off_delta, d.key, d.value,
                                          d.headers or []))
        else:
            changed = True
            if kind == _REJECT:
                rejects.append(_U32.pack(i) + _str_out(d.reason[:500]))
        pos = end
    if pos != len(batch):
        raise ValueError(f"{len(batch) - pos} bytes after the last record")
    out = [_U32.pack(n), bytes(fates)]
    if changed:
        new_section = b"".join(section)
        out.append(_I32.pack(len(new_section)))
        out.append(new_section)
    else:
        out.append(_I32.pack(-1))
    out.append(_U32.pack(len(rejects)))
    out.extend(rejects)
    out.append(_counters_out())
    return b"".join(out)
