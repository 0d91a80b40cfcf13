"""Whole-value encryption of a whole records section in one native call (the fast path of
``builtin:encrypt``; crypto/batch_seal.c does the work, built at install by
crypto/batch_seal_build.py).

`seal_section` and `open_section` take and return Kafka's record encoding (the records section
of a batch, uncompressed), so no Python object is built per record. They write exactly what
the per-record reference path of crypto/record_filter.py writes for the same nonces (layout 3,
crypto/envelope.py); a hypothesis test holds the two together. `AVAILABLE` is False when the
module was not built: the filter then runs the reference path.
"""

from __future__ import annotations

import json
import struct
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

from sluice.crypto.envelope import NONCE_SIZE, TAG_SIZE, Header
from sluice.filters.native_io import may_lend

try:
    from sluice.crypto._batch_seal import ffi as _ffi  # type: ignore[import-not-found, unused-ignore]
    from sluice.crypto._batch_seal import lib as _lib  # type: ignore[import-not-found, unused-ignore]
    AVAILABLE: Final = True
except ImportError:  # not built: the reference path stands in
    _ffi = _lib = None
    AVAILABLE = False  # type: ignore[misc]

_MALFORMED: Final = -1
_SLOW: Final = -2
_TAMPERED: Final = -3
_CRYPTO: Final = -4
_SPACE: Final = -5
_PLAN: Final = -6
#: Per record, the most a sealed record grows besides the proxy's headers.
_GROWTH: Final = 1 + NONCE_SIZE + TAG_SIZE + 30
#: The fewest bytes a record takes: length, attributes, timestamp and offset deltas, key and
#: value lengths, header count (one varint byte each). Bounds the count a section can hold.
_MIN_RECORD: Final = 7
#: Buffers up to this size are kept per thread and reused (see `_space`).
_KEEP_BYTES: Final = 16 << 20
_local = threading.local()


def _space(slot: str, size: int) -> bytearray:
    """A buffer of at least `size` bytes whose contents are undefined, kept per thread for
    the next call: the native calls' scratch and output space. A fresh `bytearray` would be
    zero-filled (and its pages faulted in) on every batch, megabytes per 1 000-record batch
    in fields mode, only for the C code to overwrite what it uses. The C code writes every
    byte it reads; results leave as a copy of the bytes written, or as a view of the output
    buffer only where the caller said it consumes it before the next call (`_result`)."""
    buf: bytearray | None = getattr(_local, slot, None)
    if buf is not None and len(buf) >= size:
        return buf
    buf = bytearray(size)
    if size <= _KEEP_BYTES:
        setattr(_local, slot, buf)
    return buf


def _output(section: Any, size: int) -> bytearray:
    """The output buffer of a call over `section`: never the buffer `section` is a view of
    (the section a first filter lent, read by a second one), so two slots take turns."""
    buf = _space("out", size)
    if isinstance(section, memoryview) and section.obj is buf:
        return _space("out2", size)
    return buf


def _result(out: bytearray, n: int) -> bytes | memoryview:
    """The `n` bytes written to `out`: a view where the caller lends (native_io.lending:
    it consumes them before this thread's next call), else a copy."""
    if may_lend():
        return memoryview(out)[:n]
    return bytes(memoryview(out)[:n])


class NativeSealError(RuntimeError):
    """The native call failed for a reason that is not the data's (OpenSSL, buffer size, a
    field plan that is not the section's)."""


class Malformed(ValueError):
    """The section is not the records it claims to be."""


class Slow(Exception):
    """The section holds something the native path leaves to the reference path."""


class Tampered(Exception):
    """Record `index` failed authentication."""

    def __init__(self, index: int) -> None:
        super().__init__(f"record {index} failed authentication")
        self.index = index


@dataclass(frozen=True, slots=True)
class Scan:
    """What one pass over a section found (`sb_scan`)."""

    values: int
    encrypted: int
    #: Index of the first record with a ``sluice.enc`` header, and its header group as
    #: Kafka encodes it (from that header to the record's end), with how many headers.
    first: int
    group: bytes
    group_count: int
    #: (record index, header name) of the first header starting with the reserved prefix.
    reserved: tuple[int, str] | None


def _bound(count: int, size: int) -> None:
    """Malformed unless a section of `size` bytes can hold `count` records. The calls size
    their fate bytes, output room and plan by `count`: checked here, where they are made,
    rather than left to the caller's own tie of the count to the records present."""
    if not 0 <= count <= size // _MIN_RECORD:
        raise Malformed(f"{count} records cannot fit in {size} bytes")


def _check(rc: int) -> int:
    if rc >= 0:
        return rc
    if rc == _MALFORMED:
        raise Malformed("malformed records section")
    if rc == _SLOW:
        raise Slow()
    if rc == _PLAN:
        raise NativeSealError("the field plan does not match the section")
    raise NativeSealError("OpenSSL failed" if rc == _CRYPTO else f"native error {rc}")


def encode_headers(headers: Sequence[Header]) -> bytes:
    """`headers` in Kafka's record encoding (zigzag varint lengths, -1 for a null value)."""
    out = bytearray()
    for name, value in headers:
        raw = name.encode()
        _varint(len(raw), out)
        out += raw
        if value is None:
            out.append(1)
        else:
            _varint(len(value), out)
            out += value
    return bytes(out)


def decode_headers(raw: bytes, count: int) -> list[Header]:
    """The inverse of `encode_headers` (for one record's proxy group)."""
    out: list[Header] = []
    pos = 0
    for _ in range(count):
        n, pos = _read_varint(raw, pos)
        name = raw[pos:pos + n].decode()
        pos += n
        n, pos = _read_varint(raw, pos)
        if n < 0:
            out.append((name, None))
        else:
            out.append((name, raw[pos:pos + n]))
            pos += n
    if pos != len(raw):
        raise Malformed("header group has trailing bytes")
    return out


def _varint(value: int, out: bytearray) -> None:
    value = (value << 1) ^ (value >> 63)
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)


def _read_varint(raw: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if pos >= len(raw) or shift > 63:
            raise Malformed("truncated varint in a header group")
        b = raw[pos]
        pos += 1
        value |= (b & 0x7F) << shift
        if not b & 0x80:
            return (value >> 1) ^ -(value & 1), pos
        shift += 7


def scan(section: Any, count: int, reserved: str = "") -> Scan:
    """One pass over `section` (`count` records): see `Scan`."""
    ffi, lib = _ffi, _lib
    # Each call gives `section`'s buffer back on the way out, an exception's too: a frame kept
    # by a traceback in a reference cycle with a memoryview still exported from it crashes
    # CPython 3.11's collector (gh-77894; filters/native_call.py).
    with ffi.from_buffer(section) as src:
        res = reserved.encode()
        outs = getattr(_local, "scan_outs", None)
        if outs is None:
            # The call's out-parameters, kept per thread: read right after each call, so one set
            # serves every scan on this thread (nine allocations fewer per batch).
            outs = _local.scan_outs = tuple(ffi.new(t) for t in (
                "uint32_t *", "size_t *", "size_t *", "uint32_t *", "uint32_t *", "uint32_t *",
                "int64_t *", "size_t *", "size_t *"))
        first, goff, glen, gcount, encrypted, values, at, noff, nlen = outs
        rc = _check(lib.sb_scan(src, len(src), count, res, len(res), first, goff, glen, gcount,
                                encrypted, values, at, noff, nlen))
        group = b""
        if rc == 0:
            group = bytes(ffi.buffer(src)[goff[0]:goff[0] + glen[0]])
        found = None
        if at[0] >= 0:
            name = bytes(ffi.buffer(src)[noff[0]:noff[0] + nlen[0]]).decode("utf-8", "replace")
            found = (int(at[0]), name)
        return Scan(int(values[0]), int(encrypted[0]), int(first[0]) if rc == 0 else -1, group,
                    int(gcount[0]) if rc == 0 else 0, found)


def first_group(section: Any, count: int) -> Scan:
    """`scan` for a reader who opens the section: the first record with a ``sluice.enc``
    header and its group, the parse stopping there (`encrypted` is 1 when one was found, else
    0; `values` and `reserved` are not looked for). The opener reads every record anyway."""
    ffi, lib = _ffi, _lib
    with ffi.from_buffer(section) as src:
        outs = getattr(_local, "first_outs", None)
        if outs is None:
            outs = _local.first_outs = tuple(ffi.new(t) for t in (
                "uint32_t *", "size_t *", "size_t *", "uint32_t *"))
        first, goff, glen, gcount = outs
        if _check(lib.sb_first_group(src, len(src), count, first, goff, glen, gcount)):
            return Scan(0, 0, -1, b"", 0, None)
        group = bytes(ffi.buffer(src)[goff[0]:goff[0] + glen[0]])
        return Scan(0, 1, int(first[0]), group, int(gcount[0]), None)


def seal_section(section: Any, count: int, key: bytes, nonces: Any, prefix: bytes,
                 ours: Sequence[Header] = (), *, group: bytes | None = None,
                 group_count: int = 0) -> tuple[bytes | memoryview, bytes, int]:
    """(new section, fate byte per record: 0 kept (a tombstone), 1 sealed, records sealed).
    `nonces` (any buffer, e.g. `fresh_nonces`) holds 12 bytes per record with a value, used
    in order; `prefix` is the batch's
    AAD prefix (`aad_prefix_v2`, layout 3), `ours` the proxy's headers appended to each
    sealed record, or `group` the same already encoded (`encode_headers`) with
    `group_count` headers."""
    ffi, lib = _ffi, _lib
    with ffi.from_buffer(section) as src:
        _bound(count, len(src))
        if group is None:
            group, group_count = encode_headers(ours), len(ours)
        cap = len(src) + count * (len(group) + _GROWTH)
        out = _output(section, cap)
        fates = bytearray(count)
        scratch = _space("scratch", len(prefix) + 64 + len(src) + TAG_SIZE)
        sealed = ffi.new("uint32_t *")
        n = _check(lib.sb_seal_values(src, len(src), count, key, ffi.from_buffer(nonces),
                                      len(nonces), prefix, len(prefix), group, len(group),
                                      group_count,
                                      ffi.from_buffer(scratch), len(scratch), ffi.from_buffer(out),
                                      cap, ffi.from_buffer(fates), sealed))
        return _result(out, n), bytes(fates), int(sealed[0])


def open_section(section: Any, count: int, key: bytes, prefix: bytes, group: bytes,
                 group_count: int) -> tuple[bytes | memoryview, bytes]:
    """(new section, fate byte per record: 0 kept (not encrypted), 1 opened). Every encrypted
    record must carry exactly `group` (else `Slow`); `Tampered` names the first record that
    fails authentication."""
    ffi, lib = _ffi, _lib
    with ffi.from_buffer(section) as src:
        _bound(count, len(src))
        out = _output(section, len(src))
        fates = bytearray(count)
        scratch = _space("scratch", len(prefix) + 64 + len(src))
        where = ffi.new("uint32_t *")
        n = lib.sb_open_values(src, len(src), count, key, prefix, len(prefix), group, len(group),
                               group_count, ffi.from_buffer(scratch), len(scratch),
                               ffi.from_buffer(out), len(out), ffi.from_buffer(fates), where)
        if n == _TAMPERED:
            raise Tampered(int(where[0]))
        n = _check(n)
        return _result(out, n), bytes(fates)


def fast_iv() -> bool:
    """Whether the native calls hand each message's nonce to OpenSSL without
    EVP_CipherInit_ex (a known-answer check decides once per process; crypto/batch_seal.c,
    `gcm_fast_iv`)."""
    return bool(_lib.sb_fast_iv())


def own_gcm() -> bool:
    """Whether the native calls run AES-256-GCM in crypto/batch_seal.c's own AES-NI and
    PCLMULQDQ code (x86-64, after a known-answer check against OpenSSL's EVP at the first
    call) rather than through EVP. The same bytes either way."""
    return bool(_lib.sb_own_gcm())


def allow_own_gcm(allow: bool) -> bool:
    """Allows or forbids `own_gcm` for the calls that follow (tests run both); returns the
    previous setting."""
    return bool(_lib.sb_allow_own_gcm(1 if allow else 0))


def fresh_nonces(n: int) -> memoryview:
    """`n` bytes from OpenSSL's CSPRNG (`sb_nonces`: RAND_bytes, one call for a batch's
    nonces), in this thread's nonce buffer: valid until this thread's next call here, so
    the caller hands them to a seal call at once. Fresh bytes on every call; the buffer is
    reused only to spare an allocation per batch. NativeSealError if the generator fails."""
    buf = _space("nonces", n)
    _check(_lib.sb_nonces(_ffi.from_buffer(buf), n))
    return memoryview(buf)[:n]


def pack_paths(paths: Sequence[str]) -> bytes:
    """Fields-mode paths for `plan_fields` / `seal_fields`: each as u32 LE length + UTF-8, then
    u32 LE length + the path as a JSON string (as ``sluice.enc.fields`` lists it)."""
    out = bytearray()
    for path in paths:
        raw = path.encode()
        as_json = json.dumps(path, ensure_ascii=False).encode()
        out += struct.pack("<I", len(raw)) + raw + struct.pack("<I", len(as_json)) + as_json
    return bytes(out)


@dataclass(frozen=True, slots=True)
class FieldPlan:
    """What `plan_fields` found in one section: how many fields `seal_fields` seals, and
    where they are (per record: u32 count, then start, end and path index of each field), so
    `seal_fields` does not scan the JSON documents a second time."""

    seals: int
    spans: bytes


def plan_fields(section: Any, count: int, packed: bytes, npaths: int, max_seals: int
                ) -> FieldPlan:
    """The fields `seal_fields` would seal in `section` (`Slow` when a value is not a JSON
    object the native scanner accepts, or a record holds more than `max_seals`)."""
    ffi, lib = _ffi, _lib
    with ffi.from_buffer(section) as src:
        _bound(count, len(src))
        records = ffi.new("uint32_t *")
        seals = ffi.new("uint32_t *")
        # Fields never overlap and each takes at least 4 bytes of its document ("":0): the
        # spans fit in this many words.
        words = 1 + count + 3 * (len(src) // 4 + count)
        plan = _space("plan", 4 * words)
        used = _check(lib.sb_seal_fields(src, len(src), count, b"", b"", 0, b"", 0, packed,
                                         len(packed), npaths, b"", 0, 0, max_seals, ffi.NULL, 0,
                                         ffi.NULL, 0, ffi.NULL, records, seals,
                                         ffi.cast("uint32_t *", ffi.from_buffer(plan)), words))
        return FieldPlan(int(seals[0]), bytes(memoryview(plan)[:4 * used]))


def seal_fields(section: Any, count: int, key: bytes, nonces: Any, prefix: bytes,
                packed: bytes, npaths: int, ours: Sequence[Header], max_seals: int,
                plan: FieldPlan | None = None) -> tuple[bytes | memoryview, bytes, int, int]:
    """Fields mode: (new section, fate per record, records sealed, fields sealed). `ours` are
    the proxy's headers but ``sluice.enc.fields``, which each sealed record also gets. `plan`
    is `plan_fields`'s answer for this very section (without it each value is scanned; the
    C code checks each span against its record, NativeSealError if one does not fit)."""
    ffi, lib = _ffi, _lib
    with ffi.from_buffer(section) as src:
        _bound(count, len(src))
        group = encode_headers(ours)
        cap = 2 * len(src) + count * (len(group) + len(packed) + 128) + 64 * len(nonces) + 4096
        out = _output(section, cap)
        fates = bytearray(count)
        scratch = _space("scratch", len(prefix) + 4 * len(src) + 64 * 256 + 4096)
        records = ffi.new("uint32_t *")
        seals = ffi.new("uint32_t *")
        spans = (ffi.NULL if plan is None
                 else ffi.cast("uint32_t *", ffi.from_buffer(plan.spans)))
        n = _check(lib.sb_seal_fields(src, len(src), count, key, ffi.from_buffer(nonces),
                                      len(nonces), prefix, len(prefix), packed, len(packed),
                                      npaths, group, len(group),
                                      len(ours), max_seals, ffi.from_buffer(scratch), len(scratch),
                                      ffi.from_buffer(out), cap, ffi.from_buffer(fates), records,
                                      seals, spans, 0 if plan is None else len(plan.spans) // 4))
        return _result(out, n), bytes(fates), int(records[0]), int(seals[0])


def open_fields(section: Any, count: int, key: bytes, prefix: bytes, group3: bytes,
                group3_count: int) -> tuple[bytes | memoryview, bytes, int]:
    """Fields mode: (new section, fate per record, records opened). Every encrypted record's
    group must be exactly `group3` (the proxy's headers before ``sluice.enc.fields``,
    encoded as `encode_headers` does, `group3_count` of them: one in layout 3, three in
    layout 2, else `Slow`) and a ``sluice.enc.fields`` header; `Tampered` names the first
    record that fails authentication."""
    ffi, lib = _ffi, _lib
    with ffi.from_buffer(section) as src:
        _bound(count, len(src))
        out = _output(section, len(src))
        fates = bytearray(count)
        scratch = _space("scratch", len(prefix) + 2 * len(src) + 4096)
        where = ffi.new("uint32_t *")
        opened = ffi.new("uint32_t *")
        n = lib.sb_open_fields(src, len(src), count, key, prefix, len(prefix), group3, len(group3),
                               group3_count, ffi.from_buffer(scratch), len(scratch),
                               ffi.from_buffer(out), len(out), ffi.from_buffer(fates), where,
                               opened)
        if n == _TAMPERED:
            raise Tampered(int(where[0]))
        n = _check(n)
        return _result(out, n), bytes(fates), int(opened[0])
