"""Record-batch semantics of filtering one partition's records, for Produce and Fetch.

`filter_produce(chain, ctx, records)` and `filter_fetch(chain, ctx, records)` take the raw
``records`` bytes of one partition and return an outcome with the bytes to forward (the very
same object when nothing changed), a Kafka error code for the partition, per-record errors,
dead letters to produce, and per-filter stats for telemetry.

Produce (client -> broker):

- Fail closed: records the proxy cannot filter never reach a filtered topic. Legacy message
  format (magic < 2), more than one batch (Produce v3+ allows exactly one), a control batch
  from a client -> INVALID_RECORD (87), as Kafka's broker answers; an unknown compression codec
  -> UNSUPPORTED_COMPRESSION_TYPE (76); a truncated or corrupt batch, a bad CRC, or a declared
  record count that does not match the batch (not last_offset_delta + 1, more or fewer records
  than declared, more than its bytes can hold) -> CORRUPT_MESSAGE (2).
- Bounded work (`BatchLimits`, the proxy's `limits.max_batch_bytes` / `max_batch_records`): a
  batch declaring more records than allowed is refused from its header, decompression stops
  at the byte limit; either way MESSAGE_TOO_LARGE (10), as Kafka answers a batch over
  `max.message.bytes` (a Java producer splits such a batch and retries).
- A rewrite keeps the record count; every header field (compression codec, producer id and
  epoch, base sequence, transactional flag, timestamps) is kept; the CRC is recomputed.
- A drop is legal only in batches without a producer id: the kept records' offset deltas are
  renumbered 0..n-1, last_offset_delta = n-1, max_timestamp recomputed. In an idempotent or
  transactional batch a drop becomes a reject (dropping would break the producer's sequence
  numbers: the broker demands that the next batch continue at baseSequence + count).
- Any reject fails the whole partition with INVALID_RECORD and ``record_errors`` of
  ``(batch_index, "filter NAME: reason")`` (batch_index = the record's index in its batch);
  nothing of that partition is forwarded.
- When every record was dropped, ``records`` is None and ``all_dropped`` is True: the proxy
  must not forward the partition and answers it itself with error_code 0 (NONE), base_offset
  -1, log_append_time_ms -1, log_start_offset -1, so the producer completes its send.

Fetch (broker -> client):

- Every batch keeps base offset, last offset delta, max timestamp, producer id/epoch, base
  sequence, leader epoch and attributes; kept records keep their offset deltas (gaps are
  normal for consumers, as after compaction). A batch whose records were all removed stays as
  an empty batch, so consumers advance past it. Control batches, empty batches (no records
  section) and a truncated trailing batch pass through untouched. Changed batches get a fresh
  CRC (a guest's lz4 batch is recompressed at a higher acceleration, `lz4_frame.FAST_LEVEL`);
  unchanged batches keep their original bytes.
- A host filter's `PartitionError` (e.g. ``builtin:encrypt`` when its KMS is unreachable, or
  a stored record that fails authentication) fails the partition with the error's code and no
  records, on both paths; the failure is counted in that filter's stats (``errors``).
- Rejected records are removed like drops and counted (``rejected`` in the stats); there is
  no per-record error in a Fetch response, and failing the whole partition would stall the
  consumer on that offset forever.
- Fail closed: a batch the proxy cannot decode (bad CRC, unknown codec, corrupt records,
  legacy format, a declared count that does not match its records or exceeds its offset
  range, records in a batch declaring none) or that exceeds the batch limits fails the
  partition with CORRUPT_MESSAGE or UNSUPPORTED_COMPRESSION_TYPE and no records, rather than
  passing unfiltered records to the client. Only an empty batch as Kafka writes them (no
  records section) passes without a look.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Sequence
from dataclasses import dataclass, field
from itertools import accumulate
from typing import Final, cast

from sluice.codec.batch_limits import DEFAULT_BATCH_LIMITS, BatchLimits
from sluice.codec.compression import CODEC_LZ4, CODEC_NONE
from sluice.codec.error_codes import ErrorCode
from sluice.codec.errors import BatchTooLarge, CodecError, CorruptBatch, UnsupportedCompression
from sluice.codec.lz4_section import AVAILABLE as PENDING_AVAILABLE
from sluice.codec.lz4_section import PendingSection, SectionRefused, pending_section
from sluice.codec.records import (
    HEADER_SIZE,
    BatchHeader,
    RawBatch,
    Record,
    batch_around,
    build_batch,
    build_batch_from_section,
    check_batch,
    check_section,
    decode_records_from,
    decode_section,
    records_section,
    split_batches,
    verify_crc,
)
from sluice.filters.chain import (
    DROP,
    REJECT,
    DeadLetter,
    FilterChain,
    FilterStats,
    NativeChainResult,
)
from sluice.filters.context import RecordContext
from sluice.filters.decisions import PartitionError
from sluice.filters.effects import Effect, commit, deferred
from sluice.filters.native_io import Finish, end_lending, lend

NONE: Final = ErrorCode.NONE
CORRUPT_MESSAGE: Final = ErrorCode.CORRUPT_MESSAGE
UNSUPPORTED_COMPRESSION_TYPE: Final = ErrorCode.UNSUPPORTED_COMPRESSION_TYPE
INVALID_RECORD: Final = ErrorCode.INVALID_RECORD
MESSAGE_TOO_LARGE: Final = ErrorCode.MESSAGE_TOO_LARGE

_MAGIC_OFFSET: Final = 16
_MAX_ERROR_CHARS: Final = 1000

Buffer = bytes | bytearray | memoryview


@dataclass(slots=True)
class ProduceOutcome:
    """What to do with one partition of a Produce request.

    `records`: bytes to forward (the input object itself when unchanged), or None when the
    partition must not be forwarded: because of an error (`error_code` != 0) or because every
    record was dropped (`all_dropped`, answer success).
    """

    records: Buffer | None
    error_code: int = NONE
    error_message: str | None = None
    record_errors: list[tuple[int, str]] = field(default_factory=list)
    dead_letters: list[DeadLetter] = field(default_factory=list)
    stats: list[FilterStats] = field(default_factory=list)
    all_dropped: bool = False
    changed: bool = False
    #: Records in the input and in `records`, from the batch headers already parsed here
    #: (-1: not counted, the partition was not filtered).
    records_in: int = -1
    records_out: int = -1


class FetchOutcome:
    """What to hand the client for one partition of a Fetch response.

    `records`: the filtered bytes (the input object itself when unchanged; b"" with an error).
    `pieces`: the same bytes as the consecutive pieces the pipeline built them from (each
    batch as it was or as rebuilt, the truncated tail): a caller that writes them in order
    (the fetch path's splice, whose pieces the connection writes with one writev) takes them
    without `records` joining them first, which would copy every byte. `records` joins them
    on first read.
    """

    __slots__ = ("_pieces", "_records", "changed", "dead_letters", "error_code",
                 "error_message", "offsets", "record_errors", "records_in", "records_out",
                 "stats")

    def __init__(self, records: Buffer, error_code: int = NONE,
                 error_message: str | None = None, *, changed: bool = False,
                 records_in: int = -1,
                 offsets: tuple[int | None, int | None] | None = None) -> None:
        self._records: Buffer | None = records
        self._pieces: tuple[Buffer, ...] = (records,)
        self.error_code = error_code
        self.error_message = error_message
        self.record_errors: list[tuple[int, str]] = []
        self.dead_letters: list[DeadLetter] = []
        self.stats: list[FilterStats] = []
        self.changed = changed
        # The input's record count and (first, last) offsets, from the pipeline's split of
        # its batches (-1 / None: not split, e.g. refused before; telemetry counts them
        # itself); the output's record count likewise (-1: not counted).
        self.records_in = records_in
        self.records_out = -1
        self.offsets = offsets

    @property
    def records(self) -> Buffer:
        if self._records is None:
            self._records = b"".join(self._pieces)
        return self._records

    @records.setter
    def records(self, value: Buffer) -> None:
        self._records = value
        self._pieces = (value,)

    @property
    def pieces(self) -> tuple[Buffer, ...]:
        return self._pieces

    def set_pieces(self, pieces: Sequence[Buffer]) -> None:
        """The output as consecutive pieces (`records` joins them when read)."""
        self._pieces = tuple(pieces)
        self._records = self._pieces[0] if len(self._pieces) == 1 else None

    @property
    def size(self) -> int:
        """len(records), without joining the pieces."""
        return sum(len(p) for p in self._pieces)


def _merge(into: list[FilterStats], more: Sequence[FilterStats]) -> None:
    if not into and len(more) == 1:
        # The first batch through one filter (nearly every Produce): the chain made its
        # stats for this call alone, so they are taken rather than copied; only the detector
        # counts, which later batches add to, are copied (a filter's may be shared).
        first = more[0]
        first.detector_counts = dict(first.detector_counts)
        into.append(first)
        return
    by_name = {s.name: s for s in into}
    for st in more:
        acc = by_name.get(st.name)
        if acc is None:
            acc = FilterStats(st.name, st.sha256, signer=st.signer)
            by_name[st.name] = acc
            into.append(acc)
        acc.kept += st.kept
        acc.rewritten += st.rewritten
        acc.dropped += st.dropped
        acc.rejected += st.rejected
        acc.time_ns += st.time_ns
        acc.errors += st.errors
        acc.failure = acc.failure or st.failure
        for name, count in st.detector_counts.items():
            acc.detector_counts[name] = acc.detector_counts.get(name, 0) + count


def _legacy_magic(records: Buffer) -> int | None:
    if len(records) > _MAGIC_OFFSET:
        magic = records[_MAGIC_OFFSET]
        if magic != 2:
            return int(magic)
    return None


def _truncate(message: str) -> str:
    return message if len(message) <= _MAX_ERROR_CHARS else message[:_MAX_ERROR_CHARS] + "..."


def _open(batch: RawBatch, limits: BatchLimits, too_large: int,
          vetted: bool = False) -> tuple[Buffer | None, int, str]:
    """The batch's records section, decompressed, or (None, error code, message) when it
    cannot be filtered: an unknown codec, a bad CRC, a declared count or a decompressed size
    over `limits` (`too_large` is the code for that), a section too short for its count.

    Checked in that order, each before the work it saves: nothing is decompressed for a
    batch declaring more than `limits.max_records` records, and decompression stops at
    `limits.max_bytes`. Whether the section holds exactly its records is checked next, by
    the native path's check or by the decoding path's parse. `vetted`: the codec id and
    the CRC were checked already (`_unopenable`)."""
    refused = None if vetted else _unopenable(batch)
    if refused is not None:
        return None, *refused
    try:
        return records_section(batch, limits), NONE, ""
    except CodecError as exc:
        return None, *_refusal(exc, too_large)


def _unopenable(batch: RawBatch) -> tuple[int, str] | None:
    """What `_open` checks before the records: an unknown codec, a bad CRC."""
    if batch.header.compression > 4:
        return UNSUPPORTED_COMPRESSION_TYPE, (
            f"unsupported compression codec id {batch.header.compression}")
    if not verify_crc(batch.data):
        return CORRUPT_MESSAGE, "record batch CRC mismatch"
    return None


def _refusal(exc: CodecError, too_large: int) -> tuple[int, str]:
    """The partition's error code and message for a batch the codec refused to open or
    check (`too_large`: the code for a batch over the limits)."""
    if isinstance(exc, BatchTooLarge):
        return too_large, f"record batch too large: {exc}"
    if isinstance(exc, UnsupportedCompression):
        return UNSUPPORTED_COMPRESSION_TYPE, str(exc)
    return CORRUPT_MESSAGE, f"corrupt record batch: {exc}"


def _decode(batch: RawBatch, plain: Buffer) -> tuple[list[Record] | None, int, str]:
    """Records of `batch` parsed from its section, or (None, error code, message)."""
    try:
        return decode_records_from(batch, plain), NONE, ""
    except CodecError as exc:
        return None, CORRUPT_MESSAGE, f"corrupt record batch: {exc}"


def _check_input(batch: RawBatch, plain: Buffer, limits: BatchLimits) -> None:
    """CorruptBatch unless the section holds exactly the records the header declares (checked
    before any filter sees it: a filter reads as many records as declared, so extra records
    would pass it unseen); BatchTooLarge when its records carry more than
    `limits.max_headers` headers (before the decoding path builds an object for each)."""
    header = batch.header
    if header.compression == CODEC_NONE:
        # The records already sit behind their own header: no copy behind a neutral one.
        check_batch(batch.data, limits.max_headers)
    else:
        check_section(plain, header.record_count, header.attributes, limits.max_headers)


def _open_checked(batch: RawBatch, limits: BatchLimits,
                  too_large: int) -> tuple[Buffer | None, int, str]:
    """`_open`, then `_check_input` on what it opened: the section, or (None, error code,
    message) from the first check that refuses the batch, in their order."""
    header = batch.header
    compression = header.attributes & 7  # header.compression
    if compression > 4:
        return None, UNSUPPORTED_COMPRESSION_TYPE, (
            f"unsupported compression codec id {compression}")
    if not verify_crc(batch.data):
        return None, CORRUPT_MESSAGE, "record batch CRC mismatch"
    try:
        plain = records_section(batch, limits)
        if compression == CODEC_NONE:
            check_batch(batch.data, limits.max_headers)
        else:
            check_section(plain, header.record_count, header.attributes, limits.max_headers)
    except CodecError as exc:
        return None, *_refusal(exc, too_large)
    return plain, NONE, ""


def _input_problem(batch: RawBatch, plain: Buffer, limits: BatchLimits,
                   too_large: int) -> tuple[int, str] | None:
    """`_check_input` as (error code, message), or None when the section is fine."""
    try:
        _check_input(batch, plain, limits)
    except CodecError as exc:
        return _refusal(exc, too_large)
    return None


def _run_native(chain: FilterChain, ctx: RecordContext, batch: RawBatch,
                plain: Buffer | PendingSection,
                offset_base: int) -> tuple[NativeChainResult, Buffer | None] | None:
    """The chain over the batch's records section `plain` (checked by `_check_input`) without
    decoding it in Python, with the new batch when it was built here, or None when the batch
    needs the decoding path: a filter failed (that path applies the failure policy), or the
    final section is not exactly the records it claims to be (the codec's check).
    PartitionError from a host filter propagates (the caller fails the partition).

    An uncompressed new batch that the caller forwards as built (a fetch, or a produce
    without drops or rejects) is built here first and checked where its records sit, which
    saves `check_section`'s copy of the records behind a neutral header. A section only the
    proxy's own native code wrote (`NativeChainResult.trusted`, e.g. the encrypt filter's
    sealer over the checked input) is not checked again: the check guards against guests;
    such a section may be lent (`native_io.lending`, a view of the sealer's buffer), so its
    batch is built here, whatever the codec, before anything else runs on this thread.
    A `PendingSection` (lz4) is opened and checked by the filter that reads it:
    SectionRefused propagates (the caller fails the partition as `_open` would).
    A compressed batch is built from a guest's section where it lies in guest memory
    (`_finisher`), checked there first."""
    header = batch.header
    codec = header.attributes & 7  # header.compression, without the property's call
    built: Buffer | None = None
    lent = lend()
    try:
        result = chain.run_native(ctx, plain, header.record_count,
                                  offset_base=offset_base,
                                  timestamp_base=header.base_timestamp,
                                  finish=(None if codec == CODEC_NONE
                                          else _finisher(header)
                                          if ctx.direction == "fetch"
                                          else _finisher(header, fetch=False)))
        if result is None or not result.changed:
            return None if result is None else (result, None)
        if result.finished:
            return result, result.records  # checked and built where the guest left it
        as_built = ctx.direction == "fetch" or not (result.dropped or result.rejected)
        if result.trusted and result.count and as_built:
            built = build_batch_from_section(header, result.records, result.count,
                                             result.incompressible, result.tail)
        elif codec == CODEC_NONE and result.count and as_built:
            # A guest's section copied out behind room for the header: the batch is written
            # around it (no second copy of the records); else copied into a new batch.
            built = (batch_around(header, result.framed, result.count)
                     if result.framed is not None
                     else build_batch_from_section(header, result.records, result.count))
            if not result.trusted:
                check_batch(built)
        elif not result.trusted:
            check_section(result.records, result.count, header.attributes)
        if built is None and result.framed is None and isinstance(result.records, memoryview):
            # Possibly lent: the caller builds from it after this thread's next native
            # call. (With `built`, the callers never read `records` again; a framed view
            # is of a buffer the section was copied into, never lent.)
            result.records = bytes(result.records)
    except CodecError:
        return None
    finally:
        end_lending(lent)
    return result, built


def _finisher(header: BatchHeader, fetch: bool = True) -> Finish:
    """The `Finish` for a compressed batch: a guest's new section, checked where it lies,
    becomes the new batch (on fetch at the fetch path's acceleration, as `_run_fetch` builds
    it; on produce as `filter_produce` builds it), so the section is not copied out of guest
    memory first (~0.02 µs a record of a masked lz4 batch). A section the check refuses is
    declined: copied out as before, it is refused by `_run_native`'s own check (the decoding
    path then); so is one whose compression fails (the caller builds it again and raises as
    before), and on produce one that lost records (a drop renumbers the records, a reject
    fails the partition: `filter_produce` needs the section)."""

    def finish(section: memoryview, count: int) -> bytes | None:
        if not fetch and count != header.record_count:
            return None
        try:
            check_section(section, count, header.attributes)
        except CodecError:
            return None
        try:
            return build_batch_from_section(header, section, count, fast=fetch)
        except Exception:
            # The host's compression failed, not the guest's call: raised here, it would
            # count against the filter, drop its instance and run it again on the decoding
            # path. Declined, the section is copied out and `_run_fetch` builds the batch as
            # it did before the finish, raising there what it raises.
            return None

    return finish


def _refused(exc: PartitionError, chain: FilterChain, ctx: RecordContext) -> FilterStats:
    """Stats entry counting a PartitionError against the filter that raised it."""
    found = next((f for f in chain.filters_for(ctx.topic, ctx.direction, ctx.principal)
                  if f.name == exc.filter_name), None)
    return FilterStats(exc.filter_name or "?", found.sha256 if found else "", errors=1,
                       failure=exc.message, signer=found.spec.signer if found else None)


def _idempotent_drop(name: str) -> str:
    return (f"filter {name}: dropped a record of an idempotent or transactional batch (a "
            "drop would break its sequence numbers), so the batch is rejected")


def filter_produce(chain: FilterChain, ctx: RecordContext, records: Buffer, *,
                   allow_multiple_batches: bool = False,
                   limits: BatchLimits = DEFAULT_BATCH_LIMITS,
                   checked: bool = False) -> ProduceOutcome:
    """Filter one partition of a Produce request (see the module docstring); `limits` bounds
    what each batch may expand into; `checked`: the caller knows a filter applies."""
    if ctx.direction != "produce":
        raise ValueError("filter_produce needs a produce RecordContext")
    if not (checked or chain.applies(ctx.topic, "produce", ctx.principal)) or not len(records):
        return ProduceOutcome(records)

    def fail(code: int, message: str) -> ProduceOutcome:
        return ProduceOutcome(None, code, _truncate(message), changed=True)

    magic = _legacy_magic(records)
    if magic is not None:
        return fail(INVALID_RECORD, f"record batches with magic {magic} (legacy message format) "
                                    "cannot be filtered; the proxy accepts magic 2 only")
    try:
        batches, tail = split_batches(records)
    except CorruptBatch as exc:
        return fail(CORRUPT_MESSAGE, f"corrupt record batch: {exc}")
    if len(tail):
        return fail(CORRUPT_MESSAGE, "truncated record batch in a produce request")
    if not batches:
        return fail(CORRUPT_MESSAGE, "no record batch in a produce request")
    if len(batches) > 1 and not allow_multiple_batches:
        return fail(INVALID_RECORD, "produce requests with version 3 or above must contain "
                                    "exactly one record batch per partition")

    out = ProduceOutcome(records)
    out.records_in = (batches[0].header.record_count if len(batches) == 1
                      else sum(b.header.record_count for b in batches))
    records_out = 0
    rebuilt: list[Buffer] = []
    changed = False
    native = chain.native_for(ctx.topic, "produce", ctx.principal)
    # Asked only of an lz4 batch, the one kind it serves (a few calls per batch otherwise).
    pending_room = -1 if native and PENDING_AVAILABLE else 0
    for batch in batches:
        header = batch.header
        if header.is_control:
            return fail(INVALID_RECORD, "clients may not send control batches")
        if header.record_count <= 0 or header.last_offset_delta != header.record_count - 1:
            # Kafka's broker refuses these too (a client's batch covers offsets 0..count-1).
            return fail(CORRUPT_MESSAGE, f"corrupt record batch: it declares "
                                         f"{header.record_count} records with last offset "
                                         f"delta {header.last_offset_delta}")
        ran = None
        pending = None
        plain: Buffer | None = None
        if pending_room and (header.attributes & 7) == CODEC_LZ4:  # header.compression
            if pending_room < 0:
                pending_room = chain.pending_room(ctx.topic, "produce", ctx.principal)
        if pending_room > 0 and header.compression == CODEC_LZ4:
            # Decompressed into the guest's memory and checked there, as on fetch
            # (codec/lz4_section.py): no buffer of its own, no copy into the guest. The
            # checks and their order are `_open_checked`'s.
            refused_at = _unopenable(batch)
            if refused_at is not None:
                return fail(*refused_at)
            try:
                pending = pending_section(batch, limits, pending_room)
                if pending is not None:
                    ran = _run_native(chain, ctx, batch, pending, 0)
            except CodecError as exc:
                return fail(*_refusal(exc, MESSAGE_TOO_LARGE))
            except SectionRefused as exc:
                return fail(*_refusal(exc.error, MESSAGE_TOO_LARGE))
            except PartitionError as exc:
                refused = fail(exc.code, exc.message)
                refused.stats = [*out.stats, _refused(exc, chain, ctx)]
                return refused
        if ran is None:
            # Opened and checked before any filter, on either path (the decoding path builds
            # an object per header): `_open` and `_input_problem` in one call (issue 29).
            plain, code, message = _open_checked(batch, limits, MESSAGE_TOO_LARGE)
            if plain is None:
                return fail(code, message)
            if native and pending is None:  # (a pending batch that ran: the decoding path)
                try:
                    ran = _run_native(chain, ctx, batch, plain, 0)
                except PartitionError as exc:
                    refused = fail(exc.code, exc.message)
                    refused.stats = [*out.stats, _refused(exc, chain, ctx)]
                    return refused
        if ran is not None:
            nat, built = ran
            _merge(out.stats, nat.stats)
            errors: list[tuple[int, str]] = sorted(nat.rejected.items()) if nat.rejected else []
            if header.has_producer_id and nat.dropped:
                errors += [(i, _idempotent_drop(name)) for i, name in nat.dropped.items()]
                errors.sort()
            if errors:
                out.record_errors.extend(errors)
            elif not nat.changed:
                rebuilt.append(batch.data)
                records_out += header.record_count
            else:
                changed = True
                records_out += nat.count
                if nat.dropped and nat.count:
                    # Renumbering offset deltas and the max timestamp needs the records.
                    kept = decode_section(nat.records, nat.count)
                    rebuilt.append(_build_produce(header, kept, dropped=True))
                elif nat.count:
                    rebuilt.append(
                        built or build_batch_from_section(header, nat.records, nat.count))
            continue
        if plain is None:  # _open_checked returned it (`fail` otherwise)
            raise AssertionError("a batch reached the decoding path unopened")
        decoded, code, message = _decode(batch, plain)
        if decoded is None:
            return fail(code, message)
        try:
            result = chain.run_records(ctx, decoded, offset_base=0,
                                       timestamp_base=header.base_timestamp)
        except PartitionError as exc:
            refused = fail(exc.code, exc.message)
            refused.stats = [*out.stats, _refused(exc, chain, ctx)]
            return refused
        _merge(out.stats, result.stats)
        out.dead_letters.extend(result.dead_letters)
        errors = sorted(result.reasons.items())
        if header.has_producer_id:
            for i, fate in enumerate(result.fates):
                if fate == DROP:
                    errors.append((i, _idempotent_drop(result.by[i])))
            errors.sort()
        if errors:
            out.record_errors.extend(errors)
            continue
        if not result.changed:
            rebuilt.append(batch.data)
            records_out += header.record_count
            continue
        changed = True
        # The chain hands back the codec's own Record objects (or rewritten copies of them).
        kept = cast(list[Record], [r for r in result.records if r is not None])
        records_out += len(kept)
        if not kept:
            continue  # every record dropped: leave the batch out
        rebuilt.append(_build_produce(header, kept, dropped=len(kept) != len(decoded)))
    if out.record_errors:
        first = out.record_errors[0][1]
        more = len(out.record_errors) - 1
        suffix = f" (and {more} more record error{'s' if more > 1 else ''})" if more else ""
        out.records = None
        out.error_code = INVALID_RECORD
        out.error_message = _truncate(first + suffix)
        out.changed = True
        return out
    out.records_out = records_out
    if not changed:
        return out
    out.changed = True
    if not rebuilt:
        out.records = None
        out.all_dropped = True
        return out
    out.records = rebuilt[0] if len(rebuilt) == 1 else b"".join(rebuilt)
    if isinstance(out.records, memoryview):
        out.records = bytes(out.records)
    return out


def _build_produce(header: BatchHeader, kept: list[Record], dropped: bool) -> bytes:
    if not dropped:
        return build_batch(header, kept)
    # Records are ours (decoded here or rebuilt by the chain): renumbering them is safe.
    max_delta = kept[0].timestamp_delta
    for i, rec in enumerate(kept):
        rec.offset_delta = i
        if rec.timestamp_delta > max_delta:
            max_delta = rec.timestamp_delta
    new_header = BatchHeader(
        header.base_offset, header.batch_length, header.partition_leader_epoch, header.magic,
        header.crc, header.attributes, len(kept) - 1, header.base_timestamp,
        header.base_timestamp + max_delta, header.producer_id, header.producer_epoch,
        header.base_sequence, len(kept), header.snappy_xerial)
    return build_batch(new_header, kept)


def filter_fetch(chain: FilterChain, ctx: RecordContext, records: Buffer, *,
                 limits: BatchLimits = DEFAULT_BATCH_LIMITS,
                 checked: bool = False) -> FetchOutcome:
    """Filter one partition of a Fetch response (see the module docstring); `limits` bounds
    what each batch may expand into; `checked`: the caller knows a filter applies."""
    plan = plan_fetch(chain, ctx, records, checked=checked)
    if plan.outcome is not None:
        return plan.outcome
    return finish_fetch(plan, [run_fetch(chain, plan, 0, limits)])


#: No run of a split partition is cut below this many bytes (see `plan_fetch`).
RUN_MIN_BYTES: Final = 64 * 1024


class FetchPlan:
    """One partition of a Fetch response, split into its batches and cut into runs of
    consecutive batches (`runs` of them) that `run_fetch` may filter on different threads at
    once; `finish_fetch` joins the runs' results into what a serial pass gives. `outcome` is
    set instead when the partition needs no filtering or is refused before any batch is
    looked at (then there are no runs)."""

    __slots__ = ("batches", "ctx", "cuts", "native", "outcome", "pending", "records", "stop",
                 "tail")

    def __init__(self, ctx: RecordContext, records: Buffer, batches: list[RawBatch],
                 tail: Buffer, cuts: list[int], native: bool,
                 outcome: FetchOutcome | None = None, pending: int = 0) -> None:
        self.ctx = ctx
        self.records = records
        self.batches = batches
        self.tail = tail
        #: Run i is batches[cuts[i]:cuts[i + 1]].
        self.cuts = cuts
        self.native = native
        #: lz4 batches go to the filters as `PendingSection`s of at most this room (every
        #: filter a Sluice ABI module with the native entry point: decompressed into its
        #: memory; `FilterChain.pending_room`), 0: none.
        self.pending = pending
        self.outcome = outcome
        #: The first batch known to end the pass (it fails the partition): runs after it stop
        #: early, since their work is thrown away. Only ever lowered; a stale read costs work,
        #: never a different result (`finish_fetch` stops at the first failure by order).
        self.stop = len(batches)

    @property
    def runs(self) -> int:
        return len(self.cuts) - 1

    def stopped_at(self, index: int) -> None:
        if index < self.stop:
            self.stop = index


@dataclass(slots=True)
class FetchRun:
    """What `run_fetch` made of one run of batches: the pieces (each batch as it was or as
    rebuilt), whether any changed, the records kept, the filters' stats and dead letters, and
    the failure that ended it (error code, message, and the stats entry of a host filter's
    `PartitionError`). `effects`: the runtime's held counts and warnings (split runs only)."""

    parts: list[Buffer] = field(default_factory=list)
    changed: bool = False
    records_out: int = 0
    stats: list[FilterStats] = field(default_factory=list)
    dead_letters: list[DeadLetter] = field(default_factory=list)
    failure: tuple[int, str, FilterStats | None] | None = None
    abandoned: bool = False  # stopped because an earlier run failed the partition
    effects: list[Effect] | None = None


def plan_fetch(chain: FilterChain, ctx: RecordContext, records: Buffer, *,
               checked: bool = False, runs: int = 1) -> FetchPlan:
    """Split `records` into its batches and cut them into at most `runs` runs of consecutive
    batches of about equal bytes, none under `RUN_MIN_BYTES` (the runs go to other threads:
    each costs a thread's wake-up, and filtering 64 KiB takes some hundred µs even for the
    fastest filters, well above that). A run never splits a batch: a batch is what a filter
    sees in one call."""
    if ctx.direction != "fetch":
        raise ValueError("filter_fetch needs a fetch RecordContext")
    if not (checked or chain.applies(ctx.topic, "fetch", ctx.principal)) or not len(records):
        return FetchPlan(ctx, records, [], b"", [0], False, FetchOutcome(records))
    magic = _legacy_magic(records)
    if magic is not None:
        return FetchPlan(ctx, records, [], b"", [0], False, _failed(
            CORRUPT_MESSAGE, f"record batches with magic {magic} (legacy message format) "
                             "cannot be filtered"))
    try:
        batches, tail = split_batches(records)
    except CorruptBatch as exc:
        return FetchPlan(ctx, records, [], b"", [0], False,
                         _failed(CORRUPT_MESSAGE, f"corrupt record batch: {exc}"))
    native = chain.native_for(ctx.topic, "fetch", ctx.principal)
    pending = (chain.pending_room(ctx.topic, "fetch", ctx.principal)
               if native and PENDING_AVAILABLE else 0)
    return FetchPlan(ctx, records, batches, tail, _cuts(batches, runs), native,
                     pending=pending)


def _cuts(batches: list[RawBatch], runs: int) -> list[int]:
    """Where runs of `batches` start (and the end): up to `runs` runs of about equal bytes,
    each cut at the batch boundary nearest its share, none under RUN_MIN_BYTES unless it is
    the only one."""
    total = sum(len(b.data) for b in batches)
    runs = min(runs, len(batches), total // max(1, RUN_MIN_BYTES))
    if runs <= 1:
        return [0, len(batches)]
    # before[i]: the bytes of batches[:i], for the boundaries i = 1 .. len - 1.
    before = list(accumulate((len(b.data) for b in batches[:-1]), initial=0))
    cuts = [0]
    for j in range(1, runs):
        target = total * j // runs
        i = bisect_left(before, target, lo=cuts[-1] + 1)
        if i >= len(before) or (i - 1 > cuts[-1]
                                and target - before[i - 1] <= before[i] - target):
            i -= 1  # the boundary just before the share is nearer (or the only one left)
        if i <= cuts[-1]:
            break
        if before[i] - before[cuts[-1]] >= RUN_MIN_BYTES and total - before[i] >= RUN_MIN_BYTES:
            cuts.append(i)
    cuts.append(len(batches))
    return cuts


def _failed(code: int, message: str) -> FetchOutcome:
    return FetchOutcome(b"", code, _truncate(message), changed=True)


def run_fetch(chain: FilterChain, plan: FetchPlan, index: int,
              limits: BatchLimits = DEFAULT_BATCH_LIMITS, *,
              defer: bool = False) -> FetchRun:
    """Filter run `index` of `plan` (each batch within `limits`). With `defer`, the filter
    runtime's counts and warnings are held in the result (`filters/effects.py`) for
    `finish_fetch` to apply if a serial pass would have filtered these batches."""
    if not defer:
        return _run_fetch(chain, plan, index, limits)
    with deferred() as held:
        run = _run_fetch(chain, plan, index, limits)
    run.effects = held
    return run


def _run_fetch(chain: FilterChain, plan: FetchPlan, index: int,
               limits: BatchLimits) -> FetchRun:
    ctx = plan.ctx
    native = plan.native
    run = FetchRun()
    parts = run.parts
    records_out = 0

    def fail(at: int, code: int, message: str,
             refused: FilterStats | None = None) -> FetchRun:
        run.failure = (code, message, refused)
        run.records_out = records_out
        plan.stopped_at(at)
        return run

    for at in range(plan.cuts[index], plan.cuts[index + 1]):
        if at > plan.stop:
            run.abandoned = True
            return run
        batch = plan.batches[at]
        header = batch.header
        if header.is_control or (header.record_count == 0 and len(batch.data) == HEADER_SIZE):
            parts.append(batch.data)  # nothing in it a filter could see
            records_out += header.record_count
            continue
        if header.record_count > header.last_offset_delta + 1:
            # More records than offsets: no broker writes that (compaction leaves fewer).
            return fail(at, CORRUPT_MESSAGE, f"corrupt record batch: it declares "
                                             f"{header.record_count} records with last offset "
                                             f"delta {header.last_offset_delta}")
        pending = None
        vetted = False  # codec id and CRC checked already
        if plan.pending and header.compression == CODEC_LZ4 and header.record_count > 0:
            # Decompressed into the guest's memory and checked there (codec/lz4_section.py):
            # no buffer of its own, no copy into the guest.
            refused = _unopenable(batch)
            if refused is not None:
                return fail(at, *refused)
            vetted = True
            try:
                pending = pending_section(batch, limits, plan.pending)
            except CodecError as exc:
                return fail(at, *_refusal(exc, CORRUPT_MESSAGE))
        ran = None
        if pending is not None:
            try:
                ran = _run_native(chain, ctx, batch, pending, header.base_offset)
            except SectionRefused as exc:
                return fail(at, *_refusal(exc.error, CORRUPT_MESSAGE))
            except PartitionError as exc:
                return fail(at, exc.code, exc.message, _refused(exc, chain, ctx))
        if ran is None:  # not pending, or the decoding path (which opens the batch itself)
            plain, code, message = _open(batch, limits, CORRUPT_MESSAGE, vetted)
            if plain is None:
                return fail(at, code, message)
            if header.record_count == 0:
                parts.append(batch.data)  # a compressed empty section (_open refuses the rest)
                continue
            problem = _input_problem(batch, plain, limits, CORRUPT_MESSAGE)
            if problem is not None:
                return fail(at, *problem)
            if native and pending is None:
                try:
                    ran = _run_native(chain, ctx, batch, plain, header.base_offset)
                except PartitionError as exc:
                    return fail(at, exc.code, exc.message, _refused(exc, chain, ctx))
        if ran is not None:
            nat, built = ran
            _merge(run.stats, nat.stats)
            if nat.changed:
                run.changed = True
                # A guest's section (the proxy's own filters' is `built`): lz4 at a higher
                # acceleration (codec/lz4_frame.py), the same format for the consumer, since
                # the recompression is the host's largest share of a masked fetch.
                parts.append(built or build_batch_from_section(header, nat.records, nat.count,
                                                               fast=True))
                records_out += nat.count
            else:
                parts.append(batch.data)
                records_out += header.record_count
            continue
        if plain is None:  # _open returned it (`fail` otherwise)
            raise AssertionError("a batch reached the decoding path unopened")
        decoded, code, message = _decode(batch, plain)
        if decoded is None:
            return fail(at, code, message)
        try:
            result = chain.run_records(ctx, decoded, offset_base=header.base_offset,
                                       timestamp_base=header.base_timestamp)
        except PartitionError as exc:
            return fail(at, exc.code, exc.message, _refused(exc, chain, ctx))
        _merge(run.stats, result.stats)
        run.dead_letters.extend(result.dead_letters)
        if not result.changed:
            parts.append(batch.data)
            records_out += header.record_count
            continue
        run.changed = True
        kept = cast(list[Record], [r for r, fate in zip(result.records, result.fates, strict=True)
                                   if fate not in (DROP, REJECT) and r is not None])
        parts.append(build_batch(header, kept, fast=True))  # as the native path builds it
        records_out += len(kept)
    run.records_out = records_out
    return run


def finish_fetch(plan: FetchPlan, runs: Sequence[FetchRun]) -> FetchOutcome:
    """The partition's outcome from its runs' results, in order: what one pass over every
    batch gives. The first failure by order decides (with the stats of the batches before it,
    as a serial pass, which stops there); the runs after it are dropped with their held
    effects, and the held effects of the others are applied in order."""
    if plan.outcome is not None:
        return plan.outcome
    batches = plan.batches
    # Counted here once, for telemetry (paths/fetch.py), from the split the filters need.
    out = FetchOutcome(plan.records, records_in=sum(b.header.record_count for b in batches),
                       offsets=(batches[0].header.base_offset, batches[-1].header.last_offset)
                       if batches else (None, None))
    parts: list[Buffer] = []
    changed = False
    records_out = 0
    for run in runs:
        if run.abandoned:
            # Only a run after a failed one stops early, and the failure returned first.
            raise AssertionError("a run was abandoned though no earlier run failed")
        if run.effects:
            commit(run.effects)
        if len(runs) == 1:
            out.stats = run.stats  # merged batch by batch already
        else:
            _merge(out.stats, run.stats)
        out.dead_letters.extend(run.dead_letters)
        if run.failure is not None:
            code, message, refused = run.failure
            # As a serial pass: no records, no dead letters; the stats only when a filter
            # refused the partition (counted against it).
            refused_fetch = _failed(code, message)
            if refused is not None:
                refused_fetch.stats = [*out.stats, refused]
            return refused_fetch
        parts.extend(run.parts)
        changed = changed or run.changed
        records_out += run.records_out
    out.records_out = records_out
    if not changed:
        return out
    out.changed = True
    if len(plan.tail):
        parts.append(plan.tail)
    # Joined only if someone reads `records` (the splice hands the pieces on as they are).
    out.set_pieces(parts)
    return out


__all__ = [
    "CORRUPT_MESSAGE",
    "INVALID_RECORD",
    "NONE",
    "RUN_MIN_BYTES",
    "UNSUPPORTED_COMPRESSION_TYPE",
    "FetchOutcome",
    "FetchPlan",
    "FetchRun",
    "ProduceOutcome",
    "filter_fetch",
    "filter_produce",
    "finish_fetch",
    "plan_fetch",
    "run_fetch",
]
