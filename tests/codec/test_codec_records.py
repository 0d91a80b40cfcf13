"""Record batches: header preservation, byte-exact rebuilds, compression, CRC, and failure
modes (legacy magic, nonsense lengths, unknown codecs, truncated tails)."""

from __future__ import annotations

import dataclasses
import struct

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sluice.codec.compression import XERIAL_MAGIC
from sluice.codec.errors import CodecError, CorruptBatch, EncodeError, UnsupportedCompression
from sluice.codec.records import (
    HEADER_SIZE,
    BatchHeader,
    RawBatch,
    Record,
    build_batch,
    crc32c,
    decode_records,
    encode_records,
    parse_batch_header,
    split_batches,
    verify_crc,
)

CODECS = [0, 1, 2, 3, 4]


def make_header(**changes: object) -> BatchHeader:
    header = BatchHeader(
        base_offset=1234,
        batch_length=0,
        partition_leader_epoch=7,
        magic=2,
        crc=0,
        attributes=0,
        last_offset_delta=2,
        base_timestamp=1_700_000_000_000,
        max_timestamp=1_700_000_000_050,
        producer_id=4242,
        producer_epoch=3,
        base_sequence=17,
        record_count=0,
    )
    return dataclasses.replace(header, **changes)


def sample_records(n: int = 3) -> list[Record]:
    return [
        Record(
            offset_delta=i,
            timestamp_delta=i * 25,
            key=None if i % 2 else f"key-{i}".encode(),
            value=(f"synthetic value {i} " * 8).encode(),
            headers=[("trace", b"abc"), ("empty", None)] if i % 2 == 0 else [],
        )
        for i in range(n)
    ]


def one_batch(data: bytes) -> RawBatch:
    batches, tail = split_batches(data)
    assert len(batches) == 1
    assert len(tail) == 0
    return batches[0]


def test_crc32c_known_value() -> None:
    # RFC 3720 test vector: 32 bytes of zeros.
    assert crc32c(bytes(32)) == 0x8A9136AA
    assert crc32c(memoryview(b"123456789")) == 0xE3069283


@pytest.mark.parametrize("codec", CODECS)
def test_build_keeps_every_header_field(codec: int) -> None:
    attributes = codec | 0x10  # transactional
    header = make_header(attributes=attributes, last_offset_delta=9, max_timestamp=99)
    data = build_batch(header, sample_records())
    parsed = one_batch(data).header
    assert parsed.base_offset == 1234
    assert parsed.partition_leader_epoch == 7
    assert parsed.magic == 2
    assert parsed.attributes == attributes
    assert parsed.compression == codec
    assert parsed.is_transactional
    assert not parsed.is_control
    assert parsed.last_offset_delta == 9  # as given, not recomputed
    assert parsed.base_timestamp == 1_700_000_000_000
    assert parsed.max_timestamp == 99  # as given
    assert (parsed.producer_id, parsed.producer_epoch, parsed.base_sequence) == (4242, 3, 17)
    assert parsed.has_producer_id
    assert parsed.record_count == 3
    assert parsed.batch_length == len(data) - 12
    assert verify_crc(data)
    assert decode_records(one_batch(data)) == sample_records()


@pytest.mark.parametrize("codec", CODECS)
def test_unchanged_batch_rebuilds_byte_exact(codec: int) -> None:
    original = build_batch(make_header(attributes=codec), sample_records(20))
    batch = one_batch(original)
    assert build_batch(batch.header, decode_records(batch)) == original


@pytest.mark.parametrize("codec", [1, 2, 3, 4])
def test_changed_record_is_recompressed_with_same_codec(codec: int) -> None:
    original = build_batch(make_header(attributes=codec), sample_records(5))
    batch = one_batch(original)
    records = decode_records(batch)
    records[1].value = b"masked"
    rebuilt = build_batch(batch.header, records)
    assert rebuilt != original
    again = one_batch(rebuilt)
    assert again.header.compression == codec
    assert verify_crc(rebuilt)
    assert decode_records(again)[1].value == b"masked"


@pytest.mark.parametrize("xerial", [True, False])
def test_snappy_framing_of_the_producer_is_kept(xerial: bool) -> None:
    header = make_header(attributes=2, snappy_xerial=xerial)
    data = build_batch(header, sample_records(4))
    assert (data[HEADER_SIZE : HEADER_SIZE + 8] == XERIAL_MAGIC) is xerial
    batch = one_batch(data)
    assert batch.header.snappy_xerial is xerial
    records = decode_records(batch)
    records[0].key = b"changed"
    rebuilt = build_batch(batch.header, records)
    assert (rebuilt[HEADER_SIZE : HEADER_SIZE + 8] == XERIAL_MAGIC) is xerial
    assert decode_records(one_batch(rebuilt))[0].key == b"changed"


@pytest.mark.parametrize("codec", CODECS)
def test_empty_record_list_gives_an_empty_batch(codec: int) -> None:
    header = make_header(attributes=codec | 0x10, base_offset=500, last_offset_delta=41)
    data = build_batch(header, [])
    assert len(data) == HEADER_SIZE
    parsed = one_batch(data).header
    assert (parsed.base_offset, parsed.last_offset_delta, parsed.record_count) == (500, 41, 0)
    assert parsed.next_offset == 542
    # Like Kafka's own empty batches: no payload, so no compression bits; other flags stay.
    assert parsed.compression == 0
    assert parsed.is_transactional
    assert verify_crc(data)
    assert decode_records(one_batch(data)) == []


def test_dropping_records_keeps_offset_deltas() -> None:
    records = sample_records(5)
    kept = [records[0], records[3]]
    data = build_batch(make_header(last_offset_delta=4), kept)
    decoded = decode_records(one_batch(data))
    assert [r.offset_delta for r in decoded] == [0, 3]
    assert one_batch(data).header.last_offset_delta == 4


def test_first_record_with_nonzero_timestamp_delta() -> None:
    # After the first record is dropped, the survivors keep their deltas to base_timestamp.
    records = sample_records(4)[1:]
    assert records[0].timestamp_delta != 0
    for codec in CODECS:
        data = build_batch(make_header(attributes=codec), records)
        assert decode_records(one_batch(data)) == records


def test_python_and_cython_encoders_agree() -> None:
    from sluice.codec import records as module

    records = [*sample_records(6), Record(7, -300, b"", b"", [("k", b"")])]
    assert bytes(module._encode_records_python(records)) == bytes(encode_records(records))


def test_log_append_time_batch_keeps_record_timestamp_deltas() -> None:
    records = sample_records(3)
    data = build_batch(make_header(attributes=0x08), records)
    batch = one_batch(data)
    assert batch.header.timestamp_type == 1
    assert decode_records(batch) == records
    assert build_batch(batch.header, decode_records(batch)) == data


def test_control_batch_flag_survives() -> None:
    control = [Record(0, 0, b"\x00\x00\x00\x01", b"\x00\x00\x00\x00\x00\x05", [])]
    data = build_batch(make_header(attributes=0x30, last_offset_delta=0), control)
    batch = one_batch(data)
    assert batch.header.is_control and batch.header.is_transactional
    assert build_batch(batch.header, decode_records(batch)) == data


def test_several_batches_and_partial_tail() -> None:
    first = build_batch(make_header(base_offset=0), sample_records(3))
    second = build_batch(make_header(base_offset=3, attributes=1), sample_records(2))
    third = build_batch(make_header(base_offset=5), sample_records(4))
    for cut in (1, 11, 12, 16, 17, 60, 61, len(third) - 1):
        stream = first + second + third[:cut]
        batches, tail = split_batches(stream)
        assert [bytes(b.data) for b in batches] == [first, second]
        assert bytes(tail) == third[:cut]
    batches, tail = split_batches(first + second + third)
    assert len(batches) == 3
    assert len(tail) == 0


def test_split_returns_views_not_copies() -> None:
    data = build_batch(make_header(), sample_records(2))
    batches, _tail = split_batches(data)
    assert isinstance(batches[0].data, memoryview)
    assert batches[0].data.obj is data


def test_empty_records_field() -> None:
    assert split_batches(b"") == ([], b"")


@pytest.mark.parametrize("magic", [0, 1, 3])
def test_legacy_or_unknown_magic_rejected(magic: int) -> None:
    data = bytearray(build_batch(make_header(), sample_records(2)))
    data[16] = magic
    with pytest.raises(CorruptBatch, match="magic"):
        split_batches(bytes(data))
    with pytest.raises(CorruptBatch, match="magic"):
        parse_batch_header(bytes(data))


def test_legacy_magic_in_partial_tail_rejected() -> None:
    data = bytearray(build_batch(make_header(), sample_records(2)))
    data[16] = 1
    with pytest.raises(CorruptBatch):
        split_batches(bytes(data[:30]))


@pytest.mark.parametrize("length", [-1, 0, 48])
def test_nonsense_batch_length_rejected(length: int) -> None:
    data = bytearray(build_batch(make_header(), sample_records(2)))
    struct.pack_into(">i", data, 8, length)
    with pytest.raises(CorruptBatch, match="length"):
        split_batches(bytes(data))


@pytest.mark.parametrize("codec", [5, 6, 7])
def test_unknown_compression_id_rejected(codec: int) -> None:
    data = build_batch(make_header(), sample_records(2))
    patched = bytearray(data)
    struct.pack_into(">h", patched, 21, codec)
    batch = one_batch(bytes(patched))
    assert batch.header.compression == codec
    with pytest.raises(UnsupportedCompression):
        decode_records(batch)
    with pytest.raises(UnsupportedCompression):
        build_batch(batch.header, sample_records(1))


def test_verify_crc_detects_any_flipped_byte_after_the_crc() -> None:
    data = build_batch(make_header(attributes=0), sample_records(2))
    assert verify_crc(data)
    for pos in (21, 40, 60, len(data) - 1):
        broken = bytearray(data)
        broken[pos] ^= 0x01
        assert not verify_crc(bytes(broken))
    # The partition leader epoch is outside the CRC on purpose (the broker assigns it).
    epoch_changed = bytearray(data)
    epoch_changed[12] ^= 0x01
    assert verify_crc(bytes(epoch_changed))
    assert not verify_crc(data[:-1])
    assert not verify_crc(b"\x00" * 10)


def test_corrupt_compressed_payload_is_corrupt_batch() -> None:
    for codec in (1, 2, 3, 4):
        data = bytearray(build_batch(make_header(attributes=codec), sample_records(3)))
        data[HEADER_SIZE + 2 :] = b"\xff" * (len(data) - HEADER_SIZE - 2)
        with pytest.raises(CorruptBatch):
            decode_records(one_batch(bytes(data)))


def test_record_count_mismatch_is_corrupt_batch() -> None:
    data = bytearray(build_batch(make_header(), sample_records(3)))
    struct.pack_into(">i", data, 57, 5)
    with pytest.raises(CorruptBatch):
        decode_records(one_batch(bytes(data)))
    struct.pack_into(">i", data, 57, -1)
    with pytest.raises(CorruptBatch):
        decode_records(one_batch(bytes(data)))


def test_bad_record_values_raise_encode_error() -> None:
    with pytest.raises(EncodeError):
        build_batch(make_header(), [Record(0, 0, "not bytes", None, [])])
    with pytest.raises(EncodeError):
        build_batch(make_header(base_offset=2**70), sample_records(1))


# --- property tests --------------------------------------------------------------------

_records = st.lists(
    st.builds(
        Record,
        offset_delta=st.integers(min_value=0, max_value=2**31 - 1),
        timestamp_delta=st.integers(min_value=-(2**40), max_value=2**40),
        key=st.none() | st.binary(max_size=40),
        value=st.none() | st.binary(max_size=300),
        headers=st.lists(
            st.tuples(st.text(max_size=10), st.none() | st.binary(max_size=20)), max_size=3
        ),
    ),
    max_size=12,
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    records=_records,
    codec=st.sampled_from(CODECS),
    xerial=st.booleans(),
    base_offset=st.integers(min_value=0, max_value=2**62),
    epoch=st.integers(min_value=-1, max_value=2**31 - 1),
)
def test_build_decode_round_trip(
    records: list[Record], codec: int, xerial: bool, base_offset: int, epoch: int
) -> None:
    header = make_header(
        attributes=codec,
        base_offset=base_offset,
        partition_leader_epoch=epoch,
        snappy_xerial=xerial if codec == 2 else None,
        last_offset_delta=max((r.offset_delta for r in records), default=0),
    )
    data = build_batch(header, records)
    assert verify_crc(data)
    batch = one_batch(data)
    assert batch.header.base_offset == base_offset
    assert batch.header.partition_leader_epoch == epoch
    decoded = decode_records(batch)
    assert decoded == records
    assert build_batch(batch.header, decoded) == data


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.binary(max_size=400))
def test_random_bytes_raise_only_codec_errors(data: bytes) -> None:
    try:
        batches, _tail = split_batches(data)
        for batch in batches:
            verify_crc(batch.data)
            decode_records(batch)
    except CodecError:
        pass


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    codec=st.sampled_from(CODECS),
    cut=st.integers(min_value=0, max_value=2000),
    flips=st.lists(
        st.tuples(st.integers(min_value=0, max_value=2000), st.integers(0, 255)), max_size=4
    ),
)
def test_truncated_or_mutated_batches_raise_only_codec_errors(
    codec: int, cut: int, flips: list[tuple[int, int]]
) -> None:
    data = bytearray(build_batch(make_header(attributes=codec), sample_records(6)))
    for pos, value in flips:
        data[pos % len(data)] = value
    data = data[: cut % (len(data) + 1)]
    try:
        batches, tail = split_batches(bytes(data))
        for batch in batches:
            decode_records(batch)
        assert len(tail) <= len(data)
    except CodecError:
        pass


@settings(max_examples=200, deadline=None)
@given(
    values=st.lists(st.one_of(st.none(), st.binary(max_size=60)), max_size=8),
    base_offset=st.integers(0, 2**40),
    epoch=st.integers(-1, 2**31 - 1),
    producer=st.sampled_from([(-1, -1, -1), (5, 0, 0), (2**40, 3, 2**31 - 1)]),
    transactional=st.booleans(),
    log_append=st.booleans(),
    base_ts=st.integers(0, 2**42),
)
def test_batch_around_writes_the_batch_build_batch_from_section_writes(
    values: list[bytes | None], base_offset: int, epoch: int,
    producer: tuple[int, int, int], transactional: bool, log_append: bool, base_ts: int,
) -> None:
    # A filter's new section is copied once, behind room for the header (native_io's
    # `framed`); the batch written around it in place is byte for byte the copied one.
    from sluice.codec.records import batch_around, build_batch_from_section

    records = [Record(i, i * 3, None, v, [("h", v)]) for i, v in enumerate(values)]
    section = bytes(encode_records(records))
    n = len(records)
    attributes = (0x10 if transactional else 0) | (0x08 if log_append else 0)
    pid, pepoch, seq = producer
    header = BatchHeader(base_offset, 0, epoch, 2, 0, attributes, max(n - 1, 0), base_ts,
                         base_ts + 3 * max(n - 1, 0), pid, pepoch, seq, n)
    framed = bytearray(HEADER_SIZE) + section
    view = memoryview(framed)[HEADER_SIZE:]  # as native_io hands it out: a view is alive
    built = batch_around(header, framed, n)
    assert built is framed
    assert bytes(built) == build_batch_from_section(header, section, n)
    assert bytes(view) == section
    assert verify_crc(built)


def test_batch_around_refuses_what_it_cannot_write() -> None:
    from sluice.codec.records import batch_around

    lz4 = BatchHeader(0, 0, -1, 2, 0, 3, 0, 0, 0, -1, -1, -1, 1)
    with pytest.raises(ValueError, match="uncompressed"):
        batch_around(lz4, bytearray(HEADER_SIZE + 8), 1)
    plain = BatchHeader(0, 0, -1, 2, 0, 0, 0, 0, 0, -1, -1, -1, 1)
    with pytest.raises(ValueError, match="spare bytes"):
        batch_around(plain, bytearray(10), 1)
