"""Record batches, magic v2 (Kafka's DefaultRecordBatch layout).

    baseOffset i64 | batchLength i32 | partitionLeaderEpoch i32 | magic i8 (=2) | crc u32 |
    attributes i16 | lastOffsetDelta i32 | baseTimestamp i64 | maxTimestamp i64 |
    producerId i64 | producerEpoch i16 | baseSequence i32 | recordCount i32 | records...

batchLength counts from partitionLeaderEpoch to the end; the CRC32C covers attributes to the
end. With compression, everything after recordCount is one compressed blob.

Per-record parsing and encoding use aiokafka's Cython record module (several times faster than
pure Python); batch headers, compression and CRCs are handled here so that every header field
survives a rebuild exactly as the caller gives it. A pure-Python encoder covers the two cases
aiokafka's builder cannot express (a first record with a non-zero timestamp delta, non-zero
record attributes).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any

import crc32c as _crc32c_buffers
from aiokafka.record._crecords.default_records import (
    DefaultRecordBatch as _CyBatch,
)
from aiokafka.record._crecords.default_records import (
    DefaultRecordBatchBuilder as _CyBuilder,
)

from .batch_limits import (
    DEFAULT_BATCH_LIMITS,
    DEFAULT_MAX_BATCH_HEADERS,
    BatchLimits,
    check_count,
    check_section_size,
    headers_too_many,
)
from .compression import CODEC_NONE, CODEC_SNAPPY, compress, decompress, is_xerial
from .errors import CorruptBatch, EncodeError, UnsupportedCompression

try:  # the native record check (codec/record_check.c), built at install
    from sluice.codec._record_check import (  # type: ignore[import-not-found, unused-ignore]
        ffi as _rc_ffi,
    )
    from sluice.codec._record_check import (  # type: ignore[import-not-found, unused-ignore]
        lib as _rc_lib,
    )

    # A module built from an older record_check.c (before `scripts/dev.sh install` rebuilt
    # it) takes no header limit: not used, rather than called with the wrong arguments.
    NATIVE_CHECK = len(_rc_ffi.typeof(_rc_lib.rc_check_section).args) == 5
except ImportError:  # not built: aiokafka's reader gives the same verdicts
    _rc_ffi = _rc_lib = None
    NATIVE_CHECK = False

__all__ = [
    "HEADER_SIZE",
    "BatchHeader",
    "RawBatch",
    "Record",
    "RecordList",
    "batch_around",
    "build_batch",
    "build_batch_from_section",
    "check_batch",
    "check_batch_python",
    "check_section",
    "check_section_python",
    "crc32c",
    "decode_records",
    "decode_records_from",
    "decode_section",
    "parse_batch_header",
    "records_section",
    "split_batches",
    "verify_crc",
]

# Offsets into a batch.
_LENGTH_END = 12  # baseOffset + batchLength
_MAGIC_OFFSET = 16
_CRC_OFFSET = 17
_ATTRIBUTES_OFFSET = 21
HEADER_SIZE = 61
_MIN_BATCH_LENGTH = HEADER_SIZE - _LENGTH_END

_HEADER = struct.Struct(">qiibIhiqqqhii")
_AFTER_CRC = struct.Struct(">hiqqqhii")
_BEFORE_CRC = struct.Struct(">qiibI")
_OFFSET_AND_LENGTH = struct.Struct(">qi")
_COUNT = struct.Struct(">i")

_COMPRESSION_MASK = 0x07
_TIMESTAMP_TYPE_MASK = 0x08
_TRANSACTIONAL_MASK = 0x10
_CONTROL_MASK = 0x20
_MAX_CODEC = 4

Buffer = bytes | bytearray | memoryview


def crc32c(data: Buffer) -> int:
    """CRC-32C (Castagnoli) of `data`, read in place: the crc32c module (SSE 4.2) takes any
    buffer, where google_crc32c took only bytes and a view of a frame was copied first (a
    megabyte per batch on the filtered paths)."""
    return int(_crc32c_buffers.crc32c(data))


@dataclass(slots=True)
class Record:
    """One record of a batch; offsets and timestamps relative to the batch header."""

    offset_delta: int
    timestamp_delta: int
    key: bytes | None
    value: bytes | None
    headers: list[tuple[str, bytes | None]]
    attributes: int = 0


@dataclass(slots=True)
class BatchHeader:
    """The 61-byte header of a v2 record batch.

    snappy_xerial records how a snappy batch was framed (True: xerial, as Java producers
    write; False: raw, as librdkafka writes) so that a rebuild keeps the producer's choice;
    None when not snappy or not known (a rebuild then uses xerial).
    """

    base_offset: int
    batch_length: int
    partition_leader_epoch: int
    magic: int
    crc: int
    attributes: int
    last_offset_delta: int
    base_timestamp: int
    max_timestamp: int
    producer_id: int
    producer_epoch: int
    base_sequence: int
    record_count: int
    snappy_xerial: bool | None = None

    @property
    def compression(self) -> int:
        """0 none, 1 gzip, 2 snappy, 3 lz4, 4 zstd (5-7 are invalid)."""
        return self.attributes & _COMPRESSION_MASK

    @property
    def timestamp_type(self) -> int:
        """0 CreateTime, 1 LogAppendTime."""
        return 1 if self.attributes & _TIMESTAMP_TYPE_MASK else 0

    @property
    def is_transactional(self) -> bool:
        return bool(self.attributes & _TRANSACTIONAL_MASK)

    @property
    def is_control(self) -> bool:
        return bool(self.attributes & _CONTROL_MASK)

    @property
    def has_producer_id(self) -> bool:
        return self.producer_id >= 0

    @property
    def last_offset(self) -> int:
        return self.base_offset + self.last_offset_delta

    @property
    def next_offset(self) -> int:
        """Offset a consumer continues from after this batch."""
        return self.base_offset + self.last_offset_delta + 1


@dataclass(slots=True)
class RawBatch:
    """A whole batch: its parsed header and its bytes (a view into the input when possible)."""

    header: BatchHeader
    data: bytes | memoryview


class RecordList(list[Record]):
    """The list `decode_records` returns. It remembers the batch's original records section so
    that `build_batch` can reuse the producer's compressed bytes when the records are
    unchanged (compressors are not deterministic across libraries and levels)."""

    __slots__ = ("_codec", "_payload", "_plain")

    def __init__(self, records: list[Record], codec: int, payload: Buffer, plain: Buffer):
        super().__init__(records)
        self._codec = codec
        self._payload = payload
        self._plain = plain


def parse_batch_header(data: Buffer) -> BatchHeader:
    """Parse the 61-byte header at the start of `data`."""
    try:
        fields = _HEADER.unpack_from(data, 0)
    except struct.error:
        raise CorruptBatch(f"batch header needs {HEADER_SIZE} bytes, got {len(data)}") from None
    header = BatchHeader(*fields)
    if header.magic != 2:
        raise CorruptBatch(f"unsupported record batch magic {header.magic} (legacy format)")
    if header.compression == CODEC_SNAPPY and len(data) >= HEADER_SIZE + 8:
        header.snappy_xerial = is_xerial(data[HEADER_SIZE : HEADER_SIZE + 8])
    return header


def split_batches(records: Buffer) -> tuple[list[RawBatch], bytes | memoryview]:
    """Split a records field into whole batches plus the partial tail (possibly empty).

    A Fetch response may end with a batch cut short by the fetch size limit; that tail is
    returned untouched as the second element. Batches are views of `records` (no copy).
    Raises CorruptBatch on a legacy magic byte or a batch length shorter than a header.
    """
    view = memoryview(records)
    if view.ndim != 1 or view.itemsize != 1:
        view = view.cast("B")
    total = len(view)
    pos = 0
    batches: list[RawBatch] = []
    while total - pos >= _LENGTH_END:
        _base, length = _OFFSET_AND_LENGTH.unpack_from(view, pos)
        if length < _MIN_BATCH_LENGTH:
            raise CorruptBatch(f"batch at byte {pos} declares length {length}")
        if total - pos > _MAGIC_OFFSET and view[pos + _MAGIC_OFFSET] != 2:
            raise CorruptBatch(
                f"unsupported record batch magic {view[pos + _MAGIC_OFFSET]} (legacy format)"
            )
        end = pos + _LENGTH_END + length
        if end > total:
            break
        data = view[pos:end]
        batches.append(RawBatch(parse_batch_header(data), data))
        pos = end
    return batches, view[pos:]


def verify_crc(batch: Buffer) -> bool:
    """Whether the CRC32C stored in a whole batch matches its contents."""
    if len(batch) < HEADER_SIZE:
        return False
    (_base, length) = _OFFSET_AND_LENGTH.unpack_from(batch, 0)
    end = _LENGTH_END + length
    if length < _MIN_BATCH_LENGTH or end > len(batch):
        return False
    (stored,) = struct.unpack_from(">I", batch, _CRC_OFFSET)
    return crc32c(memoryview(batch)[_ATTRIBUTES_OFFSET:end]) == stored


def records_section(batch: RawBatch, limits: BatchLimits = DEFAULT_BATCH_LIMITS) -> Buffer:
    """The batch's records section, decompressed (Kafka's record encoding, no header).

    Checked before the work, against `limits`: a declared record count above
    `limits.max_records` is `BatchTooLarge` from the header alone; decompression stops at
    `limits.max_bytes` (`BatchTooLarge`); a section too short for its declared count (a record
    takes at least 7 bytes), or holding bytes while declaring no record, is `CorruptBatch`
    (checked on the wire bytes first when uncompressed). Whether the section holds exactly
    its records is for `check_section` / `decode_section` to say."""
    header = batch.header
    codec = header.compression
    if codec > _MAX_CODEC:
        raise UnsupportedCompression(f"compression codec id {codec}")
    data = batch.data
    if len(data) < HEADER_SIZE:
        raise CorruptBatch("batch shorter than its header")
    count = header.record_count
    check_count(count, limits)
    payload = data[HEADER_SIZE:]
    if codec == CODEC_NONE:
        check_section_size(count, len(payload))
        return payload
    plain = decompress(codec, payload, limits.max_bytes)
    check_section_size(count, len(plain))
    return plain


def _neutral_batch(plain: Buffer, count: int, attributes: int) -> bytes:
    # A copy of the batch whose header is neutralised for aiokafka: base offset and base
    # timestamp 0 (so it reports deltas), no compression (already undone) and CreateTime (for
    # LogAppendTime it would report maxTimestamp instead of each record's delta).
    neutral = _HEADER.pack(
        0,
        _MIN_BATCH_LENGTH + len(plain),
        -1,
        2,
        0,
        attributes & ~(_COMPRESSION_MASK | _TIMESTAMP_TYPE_MASK),
        max(count - 1, 0),
        0,
        0,
        -1,
        -1,
        -1,
        count,
    )
    return b"".join((neutral, plain))


def decode_section(plain: Buffer, count: int, attributes: int = 0) -> list[Record]:
    """Parse exactly `count` records from an uncompressed records section (CorruptBatch when
    it holds anything else: fewer or more records, bad lengths, trailing bytes)."""
    try:
        return [
            Record(r.offset, r.timestamp, r.key, r.value, r.headers)
            for r in _CyBatch(_neutral_batch(plain, count, attributes))
        ]
    except Exception as exc:  # aiokafka's CorruptRecordException, UnicodeDecodeError, ...
        raise CorruptBatch(f"undecodable records: {exc}") from exc


# Why the native check rejected a section (codec/record_check.c's RC_* codes).
_NATIVE_REASONS = {
    -1: "a field runs past the end of the records",
    -2: "a varint longer than ten bytes",
    -3: "a negative header count",
    -4: "a negative header key length",
    -5: "a header key that is not UTF-8",
    -6: "a record whose bytes differ from its declared length",
    -7: "bytes after the last declared record",
}
_RC_HEADERS = -8  # more headers than max_headers: refused as too large, not as corrupt
_INT32_MIN = -(2**31)
_INT32_MAX = 2**31 - 1


#: Where the native check writes the failing record's index when its caller does not read it
#: (`_native_check` on success): shared by every thread, so read only from a call's own.
_SCRATCH_WHERE = _rc_ffi.new("int64_t *") if NATIVE_CHECK else None


def _native_check(data: Buffer, start: int, count: int, max_headers: int) -> tuple[int, int]:
    # One C call walks every record from `start`: (0, count) or (RC_* code, failing record).
    # A section that passes (nearly all) needs no index of its own: the shared scratch cell
    # takes it and the try/finally gives the buffer back (a `with` block and an
    # `ffi.new` cost ~0.7 µs a call, two calls per filtered batch). A failure is checked
    # again with a cell of its own, whose index no other thread can overwrite.
    buf = _rc_ffi.from_buffer("uint8_t[]", data)
    try:  # given back before any error leaves
        rc = _rc_lib.rc_check_section(buf + start, len(buf) - start, count, max_headers,
                                      _SCRATCH_WHERE)
        if not rc:
            return 0, count
        where = _rc_ffi.new("int64_t *")
        rc = _rc_lib.rc_check_section(buf + start, len(buf) - start, count, max_headers, where)
    finally:
        _rc_ffi.release(buf)
    return int(rc), int(where[0])


def _native_reject(rc: int, where: int) -> CorruptBatch:
    # Only reached if the native check and aiokafka's reader ever disagreed (the tests hold
    # them to the same verdicts): the native reason, since the reference gave none.
    reason = _NATIVE_REASONS.get(rc, f"check code {rc}")
    return CorruptBatch(f"undecodable records: record {where}: {reason}")


def _read_all(batch: Any, max_headers: int | None) -> None:
    # aiokafka's reader over every record; with `max_headers`, their headers are counted.
    # The reader holds an export of the buffer it reads (a request's memoryview, maybe): it
    # is let go before any error leaves, since this frame, kept by the error's traceback in a
    # reference cycle, must export nothing (CPython 3.11's collector, gh-77894).
    budget = max_headers
    failure: Exception | None = None
    try:
        for record in batch:
            if budget is not None:
                budget -= len(record.headers)
                if budget < 0:
                    break
    except Exception as exc:
        failure = exc
    del batch
    if failure is not None:
        raise CorruptBatch(f"undecodable records: {failure}") from failure
    if budget is not None and budget < 0:
        raise headers_too_many(max_headers or 0)


def check_section_python(plain: Buffer, count: int, attributes: int = 0,
                         max_headers: int | None = DEFAULT_MAX_BATCH_HEADERS) -> None:
    """`check_section` through aiokafka's record reader: the reference the native check is
    held to, and the path when the native module is not built."""
    _read_all(_CyBatch(_neutral_batch(plain, count, attributes)), max_headers)


def check_batch_python(data: Buffer,
                       max_headers: int | None = DEFAULT_MAX_BATCH_HEADERS) -> None:
    """`check_batch` through aiokafka's record reader (see `check_section_python`)."""
    if len(data) < HEADER_SIZE:
        raise CorruptBatch(f"batch header needs {HEADER_SIZE} bytes, got {len(data)}")
    if data[_ATTRIBUTES_OFFSET + 1] & _COMPRESSION_MASK:
        raise ValueError("check_batch needs an uncompressed batch (use check_section)")
    _read_all(_CyBatch(data), max_headers)


def check_section(plain: Buffer, count: int, attributes: int = 0,
                  max_headers: int = DEFAULT_MAX_BATCH_HEADERS) -> None:
    """Raise CorruptBatch unless `plain` is exactly `count` well-formed records, and
    BatchTooLarge when they carry more than `max_headers` headers between them (checked
    before `decode_section` would build an object for each).

    Checks every record as `decode_section` parses it but keeps nothing: one native call
    per section (codec/record_check.c, a few ns per record), or aiokafka's reader when the
    native module is not built; both give the same verdict on any input."""
    if not NATIVE_CHECK:
        check_section_python(plain, count, attributes, max_headers)
        return
    if not _INT32_MIN <= count <= _INT32_MAX:
        raise CorruptBatch(f"undecodable records: record count {count} out of range")
    rc, where = _native_check(plain, 0, count, max_headers)
    if rc == _RC_HEADERS:
        raise headers_too_many(max_headers)  # the reference would build every header
    if rc:
        # A reject is rare: the reference says why in the words the decoding path uses, so a
        # client sees the same message whichever path refused its batch.
        check_section_python(plain, count, attributes, max_headers)
        raise _native_reject(rc, where)


def check_batch(data: Buffer, max_headers: int = DEFAULT_MAX_BATCH_HEADERS) -> None:
    """Raise CorruptBatch unless the whole uncompressed batch `data` holds exactly its
    record_count well-formed records (and nothing after them).

    The same check as `check_section`, made on the batch bytes where they are: no copy of the
    records behind a neutral header. `data` must be exactly one batch; the CRC is not looked
    at (see `verify_crc`). A compressed batch raises ValueError: its records are not in it as
    they are."""
    if not NATIVE_CHECK:
        check_batch_python(data, max_headers)
        return
    if len(data) < HEADER_SIZE:
        raise CorruptBatch(f"batch header needs {HEADER_SIZE} bytes, got {len(data)}")
    if data[_ATTRIBUTES_OFFSET + 1] & _COMPRESSION_MASK:
        raise ValueError("check_batch needs an uncompressed batch (use check_section)")
    rc, where = _native_check(data, HEADER_SIZE, _COUNT.unpack_from(data, HEADER_SIZE - 4)[0],
                              max_headers)
    if rc == _RC_HEADERS:
        raise headers_too_many(max_headers)
    if rc:  # the reference's words for it (see check_section)
        check_batch_python(data, max_headers)
        raise _native_reject(rc, where)


def decode_records(batch: RawBatch, limits: BatchLimits = DEFAULT_BATCH_LIMITS) -> RecordList:
    """Decompress and parse the records of a batch (`records_section` checks `limits` first,
    so at most `limits.max_records` Record objects are ever built for one batch)."""
    return decode_records_from(batch, records_section(batch, limits))


def decode_records_from(batch: RawBatch, plain: Buffer) -> RecordList:
    """Parse the records of `batch` from its records section `plain` (what `records_section`
    returned for it, so that a caller that checked the section decompresses it once)."""
    header = batch.header
    records = decode_section(plain, header.record_count, header.attributes)
    return RecordList(records, header.compression, batch.data[HEADER_SIZE:], plain)


def _encode_records_cython(records: list[Record]) -> Buffer | None:
    builder = _CyBuilder(2, 0, 0, -1, -1, -1, 2**31 - 1)
    append = builder.append
    for r in records:
        if r.attributes:
            return None
        append(r.offset_delta, r.timestamp_delta, r.key, r.value, r.headers)
    return memoryview(builder.build())[HEADER_SIZE:]


def _varint(value: int, out: bytearray) -> None:
    value = (value << 1) ^ (value >> 63)  # zigzag
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)


def _encode_records_python(records: list[Record]) -> bytes:
    out = bytearray()
    body = bytearray()
    for r in records:
        body.clear()
        body.append(r.attributes & 0xFF)
        _varint(r.timestamp_delta, body)
        _varint(r.offset_delta, body)
        for blob in (r.key, r.value):
            if blob is None:
                body.append(1)  # zigzag(-1)
            else:
                _varint(len(blob), body)
                body += blob
        _varint(len(r.headers), body)
        for h_key, h_value in r.headers:
            raw_key = h_key.encode("utf-8")
            _varint(len(raw_key), body)
            body += raw_key
            if h_value is None:
                body.append(1)
            else:
                _varint(len(h_value), body)
                body += h_value
        _varint(len(body), out)
        out += body
    return bytes(out)


def encode_records(records: list[Record]) -> Buffer:
    """The uncompressed records section for `records` (no batch header)."""
    if not records:
        return b""
    try:
        if records[0].timestamp_delta == 0:
            plain = _encode_records_cython(records)
            if plain is not None:
                return plain
        return _encode_records_python(records)
    except (TypeError, ValueError, OverflowError, AttributeError, UnicodeEncodeError) as exc:
        raise EncodeError(f"cannot encode records: {exc!r}") from exc


def build_batch(header: BatchHeader, records: list[Record], fast: bool = False) -> bytes:
    """Encode a whole v2 batch.

    Keeps every header field as given (base offset, leader epoch, attributes, last offset
    delta, base/max timestamp, producer id/epoch, base sequence); writes record_count =
    len(records), the batch length and a fresh CRC32C. Records are compressed with the
    header's codec, except that an empty record list is written as Kafka writes empty batches:
    no payload and the compression bits cleared. When `records` is a `RecordList` from
    `decode_records` whose encoding is unchanged, the original compressed bytes are reused,
    so an unchanged batch is rebuilt byte for byte. `fast`: as `build_batch_from_section`.
    """
    codec = header.compression
    if codec > _MAX_CODEC:
        raise UnsupportedCompression(f"compression codec id {codec}")
    plain = encode_records(records)
    if records and codec != CODEC_NONE and isinstance(records, RecordList) and (
            records._codec == codec and records._plain == plain):
        return _assemble(header, header.attributes, records._payload, len(records))
    return build_batch_from_section(header, plain, len(records), fast=fast)


def build_batch_from_section(header: BatchHeader, plain: Buffer, count: int,
                             incompressible: bool = False, tail: bytes = b"",
                             fast: bool = False) -> bytes:
    """Encode a whole v2 batch around an uncompressed records section of `count` records.

    The header is kept as `build_batch` keeps it; the section is compressed with its codec
    (an empty section makes an empty batch without compression bits, as Kafka writes them);
    `incompressible`: lz4 without a search (see `compression.compress`), writing `tail`,
    the bytes every record ends with, as matches; `fast`: lz4 at a higher acceleration
    (`compression.compress`).
    """
    codec = header.compression
    if codec > _MAX_CODEC:
        raise UnsupportedCompression(f"compression codec id {codec}")
    attributes = header.attributes
    payload: Buffer
    if not count:
        attributes &= ~_COMPRESSION_MASK
        payload = b""
    elif codec == CODEC_NONE:
        payload = plain
    else:
        payload = compress(codec, plain, header.snappy_xerial is not False, incompressible,
                           tail, fast)
    return _assemble(header, attributes, payload, count)


def batch_around(header: BatchHeader, framed: bytearray, count: int) -> bytearray:
    """`build_batch_from_section(header, framed[HEADER_SIZE:], count)` for an uncompressed
    batch, written in place: `framed` holds the records section behind HEADER_SIZE spare
    bytes (a filter's output copied out once, `native_io.NativeOutput.framed`), the header is
    packed into those bytes and the CRC computed where the records sit, so the section is not
    copied into a new buffer. Returns `framed`, now the whole batch. ValueError for a
    compressed header or a buffer shorter than a header."""
    if header.compression != CODEC_NONE:
        raise ValueError("batch_around writes uncompressed batches only")
    size = len(framed) - HEADER_SIZE
    if size < 0:
        raise ValueError(f"batch_around needs {HEADER_SIZE} spare bytes, got {len(framed)}")
    attributes = header.attributes if count else header.attributes & ~_COMPRESSION_MASK
    try:
        _AFTER_CRC.pack_into(
            framed,
            _ATTRIBUTES_OFFSET,
            attributes,
            header.last_offset_delta,
            header.base_timestamp,
            header.max_timestamp,
            header.producer_id,
            header.producer_epoch,
            header.base_sequence,
            count,
        )
        crc = _crc32c_buffers.crc32c(memoryview(framed)[_ATTRIBUTES_OFFSET:])
        _BEFORE_CRC.pack_into(
            framed,
            0,
            header.base_offset,
            _MIN_BATCH_LENGTH + size,
            header.partition_leader_epoch,
            2,
            crc,
        )
    except struct.error as exc:
        raise EncodeError(f"batch header field out of range: {exc}") from exc
    return framed


def _assemble(header: BatchHeader, attributes: int, payload: Buffer, count: int) -> bytes:
    try:
        after_crc = _AFTER_CRC.pack(
            attributes,
            header.last_offset_delta,
            header.base_timestamp,
            header.max_timestamp,
            header.producer_id,
            header.producer_epoch,
            header.base_sequence,
            count,
        )
        crc = _crc32c_buffers.crc32c(payload, _crc32c_buffers.crc32c(after_crc))
        before_crc = _BEFORE_CRC.pack(
            header.base_offset,
            _MIN_BATCH_LENGTH + len(payload),
            header.partition_leader_epoch,
            2,
            crc,
        )
    except struct.error as exc:
        raise EncodeError(f"batch header field out of range: {exc}") from exc
    return b"".join((before_crc, after_crc, payload))
