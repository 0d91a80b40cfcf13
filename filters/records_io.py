"""Byte layout of the Sluice Wasm ABI v1: the batch the host writes, the decisions it reads back.

All integers little-endian. ``str`` = u32 length + UTF-8 bytes; ``bytes?`` = i32 length
(-1 = null) + bytes.

Input (host -> guest), one per ``sluice_filter`` call::

    u32 version (=1) | u8 direction (0 produce, 1 fetch) | str topic | i32 partition |
    str client_id | str principal | u32 record_count |
    per record: i64 offset | i64 timestamp_ms | bytes? key | bytes? value |
                u32 header_count | per header: str key, bytes? value

Output (guest -> host)::

    u32 record_count (= input) | per record: u8 decision (0 keep, 1 rewrite, 2 drop, 3 reject)
      rewrite: bytes? key | bytes? value | u32 header_count | headers (as in the input)
      reject:  str reason
    u32 detector_count | per detector: str name | u32 count
    (the detector section may be omitted entirely when there are none)

`decode_filter_output` never raises anything but `AbiError`, whatever the bytes.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from typing import Final

from sluice.filters.context import DIRECTION_CODE, Header, RecordContext, RecordLike
from sluice.filters.decisions import DROP, KEEP, Action, Decision

ABI_VERSION: Final = 1
MAX_REASON_CHARS: Final = 500
#: Detector entries one output may hold, and the bytes of one detector name: the counts go
#: into every telemetry event of the batch, so a guest must not make those events as large as
#: its memory (filters report a few counters: pii-mask eleven, builtin:rules three).
MAX_DETECTORS: Final = 256
MAX_DETECTOR_NAME_BYTES: Final = 256

_U32 = struct.Struct("<I")
_I32 = struct.Struct("<i")
_QQI = struct.Struct("<qqi")
_HEAD = struct.Struct("<IB")
_NULL = _I32.pack(-1)
_NO_HEADERS = _U32.pack(0)


class AbiError(ValueError):
    """Output bytes that do not follow the ABI (the filter's failure policy applies)."""


def _str(value: str | None) -> bytes:
    raw = (value or "").encode("utf-8", "surrogateescape")
    return _U32.pack(len(raw)) + raw


def encode_filter_input(ctx: RecordContext, records: Sequence[RecordLike],
                        offset_base: int = 0, timestamp_base: int = 0) -> bytes:
    """The ``sluice_filter`` input for `records`.

    The i64 offset is ``offset_base + offset_delta`` (produce: pass 0, so the guest sees the
    delta; fetch: the batch's base offset, so it sees the absolute offset); the timestamp is
    ``timestamp_base + timestamp_delta`` (the batch's base timestamp).
    """
    parts: list[bytes] = [
        _HEAD.pack(ABI_VERSION, DIRECTION_CODE[ctx.direction]),
        _str(ctx.topic),
        _I32.pack(ctx.partition),
        _str(ctx.client_id),
        _str(ctx.principal),
        _U32.pack(len(records)),
    ]
    append = parts.append
    pack_qqi = _QQI.pack
    pack_i = _I32.pack
    pack_u = _U32.pack
    null = _NULL
    no_headers = _NO_HEADERS
    for rec in records:
        # Offset, timestamp and the key length go out in one pack: the loop is the hot path.
        key = rec.key
        if key is None:
            append(pack_qqi(offset_base + rec.offset_delta,
                            timestamp_base + rec.timestamp_delta, -1))
        else:
            append(pack_qqi(offset_base + rec.offset_delta,
                            timestamp_base + rec.timestamp_delta, len(key)))
            append(key)
        value = rec.value
        if value is None:
            append(null)
        else:
            append(pack_i(len(value)))
            append(value)
        headers = rec.headers
        if not headers:
            append(no_headers)
            continue
        append(pack_u(len(headers)))
        for hkey, hval in headers:
            raw = hkey.encode("utf-8", "surrogateescape")
            append(pack_u(len(raw)))
            append(raw)
            if hval is None:
                append(null)
            else:
                append(pack_i(len(hval)))
                append(hval)
    return b"".join(parts)


def encode_filter_output(decisions: Sequence[Decision],
                         detector_counts: dict[str, int] | None = None) -> bytes:
    """The output layout for `decisions` (for tests, tools and a host-side reference guest)."""
    parts: list[bytes] = [_U32.pack(len(decisions))]
    for d in decisions:
        parts.append(bytes((int(d.action),)))
        if d.action is Action.REWRITE:
            parts.append(_nullable(d.key))
            parts.append(_nullable(d.value))
            headers = d.headers or []
            parts.append(_U32.pack(len(headers)))
            for hkey, hval in headers:
                parts.append(_str(hkey))
                parts.append(_nullable(hval))
        elif d.action is Action.REJECT:
            parts.append(_str(d.reason or ""))
    counts = detector_counts or {}
    parts.append(_U32.pack(len(counts)))
    for name, count in counts.items():
        parts.append(_str(name))
        parts.append(_U32.pack(count))
    return b"".join(parts)


def _nullable(value: bytes | None) -> bytes:
    return _NULL if value is None else _I32.pack(len(value)) + value


class _Reader:
    """Bounds-checked cursor over an output buffer. Labels are formatted only on error."""

    __slots__ = ("buf", "end", "pos")

    def __init__(self, buf: bytes) -> None:
        self.buf = buf
        self.pos = 0
        self.end = len(buf)

    def fail(self, what: str, index: int, problem: str = "truncated") -> AbiError:
        label = what if index < 0 else f"{what} of record {index}"
        if problem == "truncated":
            return AbiError(f"output truncated reading {label} at byte {self.pos}")
        return AbiError(f"{problem} for {label}" if problem.startswith("negative")
                        else f"{label} {problem}")

    def u32(self, what: str, index: int = -1) -> int:
        pos = self.pos
        if pos + 4 > self.end:
            raise self.fail(what, index)
        self.pos = pos + 4
        return int(_U32.unpack_from(self.buf, pos)[0])

    def raw(self, n: int, what: str, index: int = -1) -> bytes:
        pos = self.pos
        if pos + n > self.end:
            raise self.fail(what, index)
        self.pos = pos + n
        return self.buf[pos:pos + n]

    def nullable(self, what: str, index: int = -1) -> bytes | None:
        pos = self.pos
        if pos + 4 > self.end:
            raise self.fail(what, index)
        n = _I32.unpack_from(self.buf, pos)[0]
        self.pos = pos + 4
        if n == -1:
            return None
        if n < 0:
            raise self.fail(what, index, f"negative length {n}")
        return self.raw(n, what, index)

    def text(self, what: str, index: int = -1) -> str:
        raw = self.raw(self.u32(what, index), what, index)
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            raise self.fail(what, index, "is not valid UTF-8") from None


def decode_filter_output(buf: bytes,
                         expected_records: int) -> tuple[list[Decision], dict[str, int]]:
    """Parse a ``sluice_filter`` output: (one Decision per record, detector counts).

    Raises AbiError when the bytes do not follow the layout, the record count differs from
    `expected_records`, or bytes are left over.
    """
    r = _Reader(buf)
    count = r.u32("record_count")
    if count != expected_records:
        raise AbiError(f"output has {count} decisions for {expected_records} records")
    start = r.pos
    if count and r.end - start >= count and buf.count(0, start, start + count) == count:
        # Every record kept (the common case for many batches): n zero decision bytes.
        r.pos = start + count
        decisions = [KEEP] * count
    else:
        decisions = _decode_decisions(r, count)
    detectors: dict[str, int] = {}
    if r.pos == r.end:
        return decisions, detectors
    nd = r.u32("detector_count")
    if nd * 8 > r.end - r.pos:
        raise AbiError(f"detector count {nd} exceeds the output size")
    if nd > MAX_DETECTORS:
        raise AbiError(f"detector count {nd} is over the limit of {MAX_DETECTORS}")
    for _ in range(nd):
        name = r.text("detector name")
        if len(name.encode()) > MAX_DETECTOR_NAME_BYTES:
            raise AbiError(f"a detector name is over the limit of {MAX_DETECTOR_NAME_BYTES} bytes")
        detectors[name] = detectors.get(name, 0) + r.u32("detector count")
    if r.pos != r.end:
        raise AbiError(f"{r.end - r.pos} unexpected bytes after the output")
    return decisions, detectors


def _decode_decisions(r: _Reader, count: int) -> list[Decision]:
    buf = r.buf
    end = r.end
    decisions: list[Decision] = []
    append = decisions.append
    for i in range(count):
        # keep and drop inline; the reader's checked helpers for everything with fields.
        pos = r.pos
        if pos >= end:
            raise AbiError(f"output truncated reading decision of record {i} at byte {pos}")
        action = buf[pos]
        r.pos = pos + 1
        if action == 0:
            append(KEEP)
        elif action == 2:
            append(DROP)
        elif action == 1:
            key = r.nullable("key", i)
            value = r.nullable("value", i)
            nh = r.u32("header count", i)
            # Each header takes at least 8 bytes: refuse absurd counts before looping.
            if nh * 8 > r.end - r.pos:
                raise AbiError(f"header count {nh} of record {i} exceeds the output size")
            headers: list[Header] = []
            for _ in range(nh):
                hkey = r.text("header key", i)
                headers.append((hkey, r.nullable("header value", i)))
            append(Decision(Action.REWRITE, key=key, value=value, headers=headers))
        elif action == 3:
            reason = r.text("reject reason", i)
            if len(reason) > MAX_REASON_CHARS:
                reason = reason[:MAX_REASON_CHARS] + "..."
            append(Decision(Action.REJECT, reason=reason or "rejected by filter"))
        else:
            raise AbiError(f"unknown decision {action} for record {i}")
    return decisions
