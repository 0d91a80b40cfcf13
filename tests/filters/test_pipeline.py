"""Record-batch semantics of filtering: Produce and Fetch, every codec, fail-closed cases.

Every batch the pipeline emits is checked the way Apache Kafka's broker/consumer would:
CRC32C, record count = last offset delta + 1 (produce), consecutive offset deltas (produce),
max timestamp, and unchanged header fields.
"""

from __future__ import annotations

import struct
from collections.abc import Callable

import pytest

from sluice.codec.compression import CODEC_NAMES
from sluice.codec.records import (
    BatchHeader,
    Record,
    build_batch,
    decode_records,
    split_batches,
    verify_crc,
)
from sluice.filters.chain import FilterChain
from sluice.filters.context import RecordContext
from sluice.filters.pipeline import (
    CORRUPT_MESSAGE,
    INVALID_RECORD,
    UNSUPPORTED_COMPRESSION_TYPE,
    filter_fetch,
    filter_produce,
)

PRODUCE = RecordContext("orders", 0, "produce", "app", None)
FETCH = RecordContext("orders", 0, "fetch", "app", None)
CODECS = list(range(len(CODEC_NAMES)))
MakeChain = Callable[..., FilterChain]


def batch(values: list[bytes | None], *, codec: int = 0, producer_id: int = -1,
          producer_epoch: int = -1, base_sequence: int = -1, transactional: bool = False,
          control: bool = False, base_offset: int = 0, base_ts: int = 1_700_000_000_000,
          leader_epoch: int = -1) -> bytes:
    records = [Record(i, i * 10, f"k{i}".encode(), v, [("h", str(i).encode())])
               for i, v in enumerate(values)]
    attrs = codec | (0x10 if transactional else 0) | (0x20 if control else 0)
    n = len(records)
    header = BatchHeader(base_offset, 0, leader_epoch, 2, 0, attrs, max(n - 1, 0), base_ts,
                         base_ts + 10 * max(n - 1, 0), producer_id, producer_epoch,
                         base_sequence, n)
    return build_batch(header, records)


def one(records: bytes) -> tuple[BatchHeader, list[Record]]:
    (b,), tail = split_batches(records)
    assert len(tail) == 0
    assert verify_crc(b.data)
    return b.header, list(decode_records(b))


def assert_valid_produce_batch(data: bytes) -> None:
    header, records = one(data)
    assert header.base_offset == 0
    assert header.record_count == len(records) == header.last_offset_delta + 1
    assert [r.offset_delta for r in records] == list(range(len(records)))
    assert header.max_timestamp == header.base_timestamp + max(r.timestamp_delta
                                                               for r in records)


@pytest.fixture
def upper(make_chain: MakeChain) -> FilterChain:
    return make_chain("sluice_upper", name="upper")


# -- produce -----------------------------------------------------------------------------


@pytest.mark.parametrize("codec", CODECS)
@pytest.mark.parametrize("idempotent", [False, True])
def test_produce_rewrite_keeps_header_and_codec(upper: FilterChain, codec: int,
                                                idempotent: bool) -> None:
    pid = dict(producer_id=4000, producer_epoch=3, base_sequence=17) if idempotent else {}
    raw = batch([b"alpha", b"BETA", b"gamma"], codec=codec, **pid)  # type: ignore[arg-type]
    out = filter_produce(upper, PRODUCE, raw)
    assert out.error_code == 0 and out.changed and out.records is not None
    assert_valid_produce_batch(bytes(out.records))
    before, _ = one(raw)
    after, records = one(bytes(out.records))
    assert [r.value for r in records] == [b"ALPHA", b"BETA", b"GAMMA"]
    assert [r.key for r in records] == [b"k0", b"k1", b"k2"]
    assert [r.headers for r in records] == [[("h", b"0")], [("h", b"1")], [("h", b"2")]]
    assert after.compression == codec
    for field in ("producer_id", "producer_epoch", "base_sequence", "attributes",
                  "base_timestamp", "max_timestamp", "last_offset_delta", "record_count",
                  "partition_leader_epoch"):
        assert getattr(after, field) == getattr(before, field), field
    (st,) = out.stats
    assert (st.name, st.kept, st.rewritten, st.detector_counts) == ("upper", 1, 2, {"upper": 2})


@pytest.mark.parametrize("codec", CODECS)
def test_produce_drop_renumbers_non_idempotent_batch(upper: FilterChain, codec: int) -> None:
    raw = batch([b"DROP 0", b"one", b"DROP 2", b"three", b"DROP 4"], codec=codec)
    out = filter_produce(upper, PRODUCE, raw)
    assert out.error_code == 0 and out.records is not None
    assert_valid_produce_batch(bytes(out.records))
    header, records = one(bytes(out.records))
    assert [r.value for r in records] == [b"ONE", b"THREE"]
    assert [r.offset_delta for r in records] == [0, 1]
    assert header.last_offset_delta == 1 and header.record_count == 2
    assert header.max_timestamp == header.base_timestamp + 30  # record "three" had delta 30
    assert header.compression == codec
    assert out.stats[0].dropped == 3


@pytest.mark.parametrize("codec", CODECS)
@pytest.mark.parametrize("transactional", [False, True])
def test_produce_drop_in_idempotent_batch_becomes_reject(upper: FilterChain, codec: int,
                                                         transactional: bool) -> None:
    raw = batch([b"ok", b"DROP me", b"fine"], codec=codec, producer_id=7, producer_epoch=0,
                base_sequence=0, transactional=transactional)
    out = filter_produce(upper, PRODUCE, raw)
    assert out.records is None and not out.all_dropped
    assert out.error_code == INVALID_RECORD
    assert len(out.record_errors) == 1
    index, message = out.record_errors[0]
    assert index == 1
    assert message.startswith("filter upper: dropped a record of an idempotent or "
                              "transactional batch")
    assert out.error_message == message


def test_produce_reject_fails_partition_with_record_errors(upper: FilterChain) -> None:
    raw = batch([b"REJECT a", b"ok", b"REJECT b"], producer_id=1, producer_epoch=0,
                base_sequence=0)
    out = filter_produce(upper, PRODUCE, raw)
    assert out.records is None and out.error_code == INVALID_RECORD
    assert out.record_errors == [(0, "filter upper: marker REJECT"),
                                 (2, "filter upper: marker REJECT")]
    assert out.error_message == "filter upper: marker REJECT (and 1 more record error)"
    assert out.stats[0].rejected == 2


@pytest.mark.parametrize("codec", CODECS)
def test_produce_every_record_dropped(upper: FilterChain, codec: int) -> None:
    out = filter_produce(upper, PRODUCE, batch([b"DROP", b"DROP too"], codec=codec))
    assert out.records is None and out.all_dropped and out.error_code == 0
    assert out.record_errors == [] and out.stats[0].dropped == 2


def test_produce_unchanged_returns_the_same_object(upper: FilterChain) -> None:
    raw = batch([b"ALL UPPER", None], codec=1)
    out = filter_produce(upper, PRODUCE, raw)
    assert out.records is raw and not out.changed and out.error_code == 0
    assert out.stats[0].kept == 2


def test_produce_to_unfiltered_topic_is_not_even_decoded(upper: FilterChain,
                                                          make_chain: MakeChain) -> None:
    chain = make_chain("sluice_upper", topics=("payments.*",))
    garbage = b"\x00not a batch at all"
    out = filter_produce(chain, PRODUCE, garbage)
    assert out.records is garbage and out.stats == []


def test_produce_failure_policy_reject_and_dead_letter(make_chain: MakeChain) -> None:
    chain = make_chain("sluice_upper", name="dl", on_error="dead-letter",
                       dead_letter_topic="orders.dlq")
    out = filter_produce(chain, PRODUCE, batch([b"a", b"TRAP"]))
    assert out.error_code == INVALID_RECORD and out.records is None
    assert [i for i, _ in out.record_errors] == [0, 1]
    assert [d.topic for d in out.dead_letters] == ["orders.dlq", "orders.dlq"]
    assert out.dead_letters[1].value == b"TRAP"
    assert out.stats[0].errors == 2


def test_produce_failure_policy_pass(make_chain: MakeChain) -> None:
    chain = make_chain("sluice_upper", on_error="pass")
    raw = batch([b"a", b"TRAP"])
    out = filter_produce(chain, PRODUCE, raw)
    assert out.records is raw and out.error_code == 0 and out.stats[0].errors == 2


def _with_attributes(raw: bytes, attributes: int) -> bytes:
    from sluice.codec.records import crc32c

    data = bytearray(raw)
    struct.pack_into(">h", data, 21, attributes)
    struct.pack_into(">I", data, 17, crc32c(bytes(data[21:])))
    return bytes(data)


@pytest.mark.parametrize(("mangle", "code", "text"), [
    (lambda b: b[:16] + b"\x01" + b[17:], INVALID_RECORD, "magic 1"),
    (lambda b: _with_attributes(b, 5), UNSUPPORTED_COMPRESSION_TYPE, "codec id 5"),
    (lambda b: b[:-1] + bytes([b[-1] ^ 1]), CORRUPT_MESSAGE, "CRC mismatch"),
    (lambda b: b[:-3], CORRUPT_MESSAGE, "truncated record batch"),
    (lambda b: b + b, INVALID_RECORD, "exactly one record batch"),
    (lambda b: b[:8] + struct.pack(">i", 3) + b[12:], CORRUPT_MESSAGE, "corrupt record batch"),
])
def test_produce_fails_closed(upper: FilterChain, mangle, code: int, text: str) -> None:
    out = filter_produce(upper, PRODUCE, mangle(batch([b"a", b"b"])))
    assert out.records is None and out.error_code == code
    assert out.error_message is not None and text in out.error_message


def test_produce_corrupt_compressed_payload(upper: FilterChain) -> None:
    raw = bytearray(batch([b"a" * 100], codec=4))
    raw[70] ^= 0xFF
    from sluice.codec.records import crc32c
    struct.pack_into(">I", raw, 17, crc32c(bytes(raw[21:])))
    out = filter_produce(upper, PRODUCE, bytes(raw))
    assert out.error_code == CORRUPT_MESSAGE and out.records is None


def test_produce_control_batch_from_a_client_is_refused(upper: FilterChain) -> None:
    raw = batch([b"\x00\x00\x00\x00\x00\x00"], control=True, transactional=True,
                producer_id=1, producer_epoch=0, base_sequence=0)
    out = filter_produce(upper, PRODUCE, raw)
    assert out.error_code == INVALID_RECORD and "control" in (out.error_message or "")


def test_direction_must_match(upper: FilterChain) -> None:
    with pytest.raises(ValueError):
        filter_produce(upper, FETCH, b"")
    with pytest.raises(ValueError):
        filter_fetch(upper, PRODUCE, b"")


# -- fetch -------------------------------------------------------------------------------


@pytest.mark.parametrize("codec", CODECS)
def test_fetch_drop_keeps_batch_boundaries(upper: FilterChain, codec: int) -> None:
    first = batch([b"a", b"DROP", b"c"], codec=codec, base_offset=100, leader_epoch=5,
                  producer_id=9, producer_epoch=1, base_sequence=40)
    second = batch([b"DROP", b"DROP"], codec=codec, base_offset=103)
    out = filter_fetch(upper, FETCH, first + second)
    assert out.error_code == 0 and out.changed
    (b1, b2), tail = split_batches(out.records)
    assert len(tail) == 0 and verify_crc(b1.data) and verify_crc(b2.data)
    orig1, _ = one(first)
    # Header fields survive, record count shrinks, offsets keep their deltas.
    for field in ("base_offset", "last_offset_delta", "partition_leader_epoch", "producer_id",
                  "producer_epoch", "base_sequence", "base_timestamp", "max_timestamp",
                  "attributes"):
        assert getattr(b1.header, field) == getattr(orig1, field)
    recs = decode_records(b1)
    assert [(r.offset_delta, r.value) for r in recs] == [(0, b"A"), (2, b"C")]
    # The all-dropped batch stays as an empty batch with its offsets.
    assert (b2.header.base_offset, b2.header.last_offset_delta) == (103, 1)
    assert b2.header.record_count == 0 and list(decode_records(b2)) == []
    assert b2.header.next_offset == 105
    assert out.stats[0].dropped == 3


def test_fetch_rejects_are_removed_and_counted(upper: FilterChain) -> None:
    out = filter_fetch(upper, FETCH, batch([b"REJECT", b"ok"], base_offset=10))
    header, records = one(bytes(out.records))
    assert [(r.offset_delta, r.value) for r in records] == [(1, b"OK")]
    assert (header.base_offset, header.last_offset_delta) == (10, 1)
    assert out.stats[0].rejected == 1 and out.error_code == 0 and out.record_errors == []


def test_fetch_unchanged_batches_keep_their_bytes(upper: FilterChain) -> None:
    keep = batch([b"UPPER"], codec=1, base_offset=0)
    change = batch([b"lower"], codec=1, base_offset=1)
    out = filter_fetch(upper, FETCH, keep + change)
    assert bytes(out.records).startswith(keep)
    untouched = batch([b"A", b"B"], codec=3)
    same = filter_fetch(upper, FETCH, untouched)
    assert same.records is untouched and not same.changed


def test_fetch_control_batch_and_truncated_tail_pass_untouched(upper: FilterChain) -> None:
    data = batch([b"x"], base_offset=0)
    marker = batch([b"\x00\x00\x00\x00\x00\x00"], control=True, transactional=True,
                   base_offset=1, producer_id=5, producer_epoch=0, base_sequence=-1)
    more = batch([b"y"], base_offset=2)
    partial = batch([b"z" * 50], base_offset=3)[:40]
    out = filter_fetch(upper, FETCH, data + marker + more + partial)
    assert out.error_code == 0
    raw = bytes(out.records)
    (b1, b2, b3), tail = split_batches(raw)
    assert bytes(b2.data) == marker
    assert bytes(tail) == partial
    assert [r.value for r in decode_records(b1)] == [b"X"]
    assert [r.value for r in decode_records(b3)] == [b"Y"]


def test_fetch_only_a_truncated_batch(upper: FilterChain) -> None:
    partial = batch([b"z"])[:30]
    out = filter_fetch(upper, FETCH, partial)
    assert out.records is partial and out.error_code == 0


def test_fetch_fails_closed_on_corruption(upper: FilterChain) -> None:
    raw = batch([b"a"])
    bad = raw[:-1] + bytes([raw[-1] ^ 1])
    out = filter_fetch(upper, FETCH, bad)
    assert out.error_code == CORRUPT_MESSAGE and out.records == b""
    legacy = raw[:16] + b"\x01" + raw[17:]
    assert filter_fetch(upper, FETCH, legacy).error_code == CORRUPT_MESSAGE
    out = filter_fetch(upper, FETCH, _with_attributes(raw, 6))
    assert out.error_code == UNSUPPORTED_COMPRESSION_TYPE and out.records == b""


def test_fetch_offsets_reach_the_guest_as_absolute(make_chain: MakeChain) -> None:
    chain = make_chain("sluice_upper")
    raw = batch([b"CFGLEN"], base_offset=500)
    out = filter_fetch(chain, FETCH, raw)
    assert out.stats[0].detector_counts["cfglen"] == 2  # "{}"


def test_stats_add_up_across_batches(upper: FilterChain) -> None:
    raw = batch([b"a", b"DROP"], base_offset=0) + batch([b"b", b"KEEP"], base_offset=2)
    out = filter_fetch(upper, FETCH, raw)
    (st,) = out.stats
    assert (st.kept, st.rewritten, st.dropped, st.detector_counts) == (1, 2, 1, {"upper": 2})
    assert st.time_ns > 0
