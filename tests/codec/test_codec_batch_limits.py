"""What one batch may expand into (codec/batch_limits.py): decompression bombs of every codec,
declared record counts that lie, and the sizes the framing declares (issue 26, item 5)."""

from __future__ import annotations

import tracemalloc

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sluice.codec.batch_counts import expanded_size, expanded_size_of_batches
from sluice.codec.batch_limits import MIN_RECORD_SIZE, BatchLimits
from sluice.codec.compression import compress, declared_size, decompress
from sluice.codec.errors import BatchTooLarge, CorruptBatch
from sluice.codec.records import (
    HEADER_SIZE,
    NATIVE_CHECK,
    RawBatch,
    Record,
    check_batch,
    check_batch_python,
    check_section,
    check_section_python,
    crc32c,
    decode_records,
    encode_records,
    records_section,
    split_batches,
)
from tests.harness.hostile_batches import TINY_RECORD, batch, bomb, bomb_section, records_of

MiB = 1 << 20
CODECS = [1, 2, 3, 4]  # gzip, snappy, lz4, zstd
SMALL = BatchLimits(max_bytes=1 * MiB, max_records=1000)


def raw(data: bytes) -> RawBatch:
    (only,), tail = split_batches(data)
    assert not tail
    return only


@pytest.mark.parametrize("codec", [0, *CODECS])
def test_a_count_over_the_limit_is_refused_before_decompressing(codec: int) -> None:
    """1.5 million declared records: refused from the header, whatever the payload holds (the
    payload here is not even valid for the codec: nothing tried to read it)."""
    honest = raw(bomb(codec, 10 * MiB))
    with pytest.raises(BatchTooLarge, match="declares 1497965 records"):
        records_section(honest, BatchLimits())
    garbage = bytearray(honest.data[:HEADER_SIZE]) + b"\xff" * 64
    with pytest.raises(BatchTooLarge, match="max_batch_records"):
        records_section(raw(_with_length(garbage)), BatchLimits())


def _with_length(data: bytearray) -> bytes:
    data[8:12] = (len(data) - 12).to_bytes(4, "big")
    return bytes(data)


@pytest.mark.parametrize("codec", CODECS)
@pytest.mark.parametrize("variant", [True, False], ids=["xerial/sized", "raw/streamed"])
def test_a_lying_bomb_stops_at_the_byte_limit_without_allocating_its_output(
    codec: int, variant: bool
) -> None:
    """One record declared, 64 MiB inside: decompression stops at max_bytes (1 MiB here) and
    never holds more than a few times that (snappy raw or xerial; zstd with or without the
    content size in its frame header)."""
    section = bomb_section(64 * MiB)
    liar = raw(batch(codec, section, 1, xerial=variant, sized=variant))
    tracemalloc.start()
    try:
        with pytest.raises(BatchTooLarge, match="more than 1048576 bytes"):
            records_section(liar, SMALL)
        _current, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 12 * MiB, f"decompressing the bomb peaked at {peak / MiB:.1f} MiB"


@pytest.mark.parametrize("codec", [0, *CODECS])
def test_honest_batches_within_the_limits_decode(codec: int) -> None:
    section = records_of([b"value %d" % i for i in range(1000)])
    records = decode_records(raw(batch(codec, section, 1000)), SMALL)
    assert [r.value for r in records] == [b"value %d" % i for i in range(1000)]


@pytest.mark.parametrize("codec", [0, *CODECS])
def test_a_count_the_bytes_cannot_hold_is_corrupt(codec: int) -> None:
    """10 records declared in 21 bytes: a record takes at least 7, so nothing parses them."""
    with pytest.raises(CorruptBatch, match="declares 10 records in 21 bytes"):
        records_section(raw(batch(codec, TINY_RECORD * 3, 10)), SMALL)


@pytest.mark.parametrize("codec", [0, *CODECS])
def test_no_record_declared_with_records_inside_is_corrupt(codec: int) -> None:
    with pytest.raises(CorruptBatch, match="declares no record but holds 7 bytes"):
        records_section(raw(batch(codec, TINY_RECORD, 0)), SMALL)


@pytest.mark.parametrize("codec", [0, *CODECS])
def test_the_limits_are_what_the_caller_gives(codec: int) -> None:
    thousand = raw(bomb(codec, 1000 * MIN_RECORD_SIZE))
    assert len(records_section(thousand, SMALL)) == 7000
    with pytest.raises(BatchTooLarge):
        records_section(thousand, BatchLimits(max_records=999))
    if codec:
        with pytest.raises(BatchTooLarge):
            records_section(thousand, BatchLimits(max_bytes=6999))


def test_limits_must_be_positive() -> None:
    with pytest.raises(ValueError):
        BatchLimits(max_bytes=0)
    with pytest.raises(ValueError):
        BatchLimits(max_records=0)


values = st.lists(st.binary(max_size=40) | st.none(), min_size=1, max_size=40)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(values=values, codec=st.sampled_from([0, *CODECS]), delta=st.integers(-5, 5))
def test_a_declared_count_that_does_not_match_the_records_is_corrupt(
    values: list[bytes | None], codec: int, delta: int
) -> None:
    """Fewer or more records than declared: decode_records and check_section refuse both."""
    declared = len(values) + delta
    if declared < 1:
        declared = len(values) + 1
    data = raw(batch(codec, records_of(values), declared))
    if declared == len(values):
        assert len(decode_records(data, SMALL)) == len(values)
        return
    with pytest.raises(CorruptBatch):
        decode_records(data, SMALL)
    try:
        plain = records_section(data, SMALL)
    except CorruptBatch:
        return  # the count did not even fit the bytes
    with pytest.raises(CorruptBatch):
        check_section(plain, declared)


@settings(max_examples=100, deadline=None)
@given(data=st.binary(max_size=100_000), codec=st.sampled_from([0, *CODECS]),
       xerial=st.booleans(), stored=st.booleans())
def test_declared_sizes_are_exact_where_the_codec_holds_the_stream_to_them(
    data: bytes, codec: int, xerial: bool, stored: bool
) -> None:
    payload = compress(codec, data, xerial, incompressible=stored)
    size = declared_size(codec, payload)
    if codec in (0, 2):
        assert size == len(data) == len(decompress(codec, payload))
    elif codec == 3:
        # A bound from the block headers, which decompress holds the frame to: exact for
        # stored blocks, at most a block (64 KiB) over for compressed ones.
        assert size is not None and len(data) <= size <= len(data) + 64 * 1024
        assert size == len(data) or not stored
        assert len(decompress(codec, payload)) == len(data)
    else:
        assert size is None


@pytest.mark.parametrize("codec", [1, 4])
def test_small_bombs_of_codecs_without_a_binding_size_have_no_expanded_size(codec: int) -> None:
    """What the inline decision reads (paths/base.job_size): a 1 KB zstd bomb is not small."""
    data = bomb(codec, 10 * MiB)
    assert expanded_size(data) is None


def test_an_lz4_bomb_declares_what_it_holds() -> None:
    """An LZ4 bomb's expanded size is bounded from its block headers: never less than what it
    decompresses to, so it is never small (paths/base.job_size). Its blocks compress over
    64:1, more than one a KiB of payload: it gets no size at all (unbounded, the pool)."""
    data = bomb(3, 10 * MiB)
    size = expanded_size(data)
    assert size is None or size >= HEADER_SIZE + len(bomb_section(10 * MiB))
    section = bomb_section(300_000)
    size = expanded_size(batch(3, section, len(section) // len(TINY_RECORD)))
    assert size is None or size >= HEADER_SIZE + len(section)


def test_an_lz4_frame_is_held_to_its_block_headers(monkeypatch: pytest.MonkeyPatch) -> None:
    """decompress refuses a frame yielding more than its bound (the size `declared_size`
    gives the inline decision): with the bound lowered by one byte, the honest frame is
    corrupt; a frame of more blocks than `declared_size` walks gets no size at all."""
    from sluice.codec import compression

    section = bomb_section(300_000)
    payload = compress(3, section, incompressible=True)
    assert declared_size(3, payload) == len(section)
    walk = compression._lz4_output_bound
    monkeypatch.setattr(compression, "_lz4_output_bound",
                        lambda p, m=None: (walk(p, m) or 1) - 1)
    with pytest.raises(CorruptBatch, match="more than its block headers allow"):
        decompress(3, payload)
    monkeypatch.undo()
    assert bytes(decompress(3, payload)) == section
    many = compression.lz4_stored_frame(b"x" * 300)
    # 300 stored blocks of one byte each: a frame the event loop does not walk.
    tiny = many[:7] + b"".join(b"\x01\x00\x00\x80x" for _ in range(300)) + bytes(4)
    assert bytes(decompress(3, tiny)) == b"x" * 300
    assert declared_size(3, tiny) is None
    # 200 stored blocks of one byte: fewer than the cap, but more than one a KiB of payload.
    assert declared_size(3, tiny[:7] + b"\x01\x00\x00\x80x" * 200 + bytes(4)) is None
    kib_blocks = b"\x00\x04\x00\x80" + b"x" * 1024
    assert declared_size(3, tiny[:7] + kib_blocks * 200 + bytes(4)) == 200 * 1024


def test_expanded_size_of_uncompressed_and_snappy_batches() -> None:
    plain = raw(bomb(0, 7000))
    assert expanded_size(plain.data) == len(plain.data)
    for xerial in (True, False):
        snappy = bomb(2, 10 * MiB) if xerial else batch(2, bomb_section(10 * MiB), 1,
                                                         xerial=False)
        assert expanded_size(snappy) == HEADER_SIZE + len(bomb_section(10 * MiB))
    assert expanded_size(b"") == 0


@pytest.mark.parametrize("codec", [3, 4], ids=["lz4", "zstd"])
def test_a_frame_declaring_more_than_the_limit_is_refused_before_decompressing(
    codec: int,
) -> None:
    """zstd writes the content size in its frame header (cramjam, librdkafka), LZ4 may: a
    declaration over the limit is refused with nothing decompressed (the decoders hold a frame
    to what it declares, so it is too large if true and corrupt if not)."""
    payload = bytes(compress(codec, bomb_section(64 * MiB)))
    if codec == 3:
        # Declare the content size (FLG bit 3, 8 bytes after BD); the header checksum is not
        # recomputed: a decoder would refuse the frame, the limit must refuse it first.
        payload = payload[:4] + bytes([payload[4] | 0x08, payload[5]]) + (
            (64 * MiB).to_bytes(8, "little")) + payload[6:]
    tracemalloc.start()
    try:
        with pytest.raises(BatchTooLarge, match="more than 1048576 bytes"):
            decompress(codec, payload, 1 * MiB)
        _current, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 256 * 1024, f"refusing the frame allocated {peak} bytes"
    # Within the limit the same frame decompresses (zstd: the declaration is honest).
    if codec == 4:
        assert len(decompress(codec, payload, 64 * MiB)) == len(bomb_section(64 * MiB))


def _with_headers(per_record: list[int]) -> bytes:
    return bytes(encode_records([Record(i, 0, None, b"v", [("h", b"x")] * n)
                                 for i, n in enumerate(per_record)]))


@pytest.mark.parametrize("per_record", [[5], [2, 3], [0, 5, 0], [1, 1, 1, 1, 1]])
def test_headers_over_the_limit_are_refused_by_both_checks(per_record: list[int]) -> None:
    """All records' headers together count (5 here): at the limit the section passes, one
    under it is BatchTooLarge naming limits.max_batch_headers, natively and in the reference."""
    plain = _with_headers(per_record)
    count = len(per_record)
    assert NATIVE_CHECK
    for check in (check_section, check_section_python):
        check(plain, count, 0, 5)
        with pytest.raises(BatchTooLarge, match="max_batch_headers"):
            check(plain, count, 0, 4)
    data = raw(batch(0, plain, count))
    for whole in (check_batch, check_batch_python):
        whole(data.data, 5)
        with pytest.raises(BatchTooLarge, match="max_batch_headers"):
            whole(data.data, 4)


def test_a_corrupt_section_stays_corrupt_under_the_header_limit() -> None:
    """A header count the bytes cannot hold, below the limit: corrupt, not too large."""
    plain = bytearray(_with_headers([3]))
    plain[-1:] = b""  # the last header value cut short
    for check in (check_section, check_section_python):
        with pytest.raises(CorruptBatch) as err:
            check(bytes(plain), 1, 0, 100)
        assert not isinstance(err.value, BatchTooLarge)


@settings(max_examples=300, deadline=None)
@given(
    patches=st.lists(st.tuples(st.integers(0, 22), st.integers(0, 255)), max_size=4),
    cut=st.integers(-80, 0),
    extra=st.binary(max_size=70),
)
def test_expanded_size_agrees_with_the_batch_list(
    patches: list[tuple[int, int]], cut: int, extra: bytes
) -> None:
    # Header bytes (length, magic, attributes) changed, the blob cut short or followed by
    # more bytes: the short way for one uncompressed batch answers as the batch list does.
    blob = bytearray(raw(bomb(0, 300)).data)
    for at, value in patches:
        blob[at] = value
    data = bytes(blob[: len(blob) + cut] if cut else blob) + extra
    assert expanded_size(data) == expanded_size_of_batches(data)


def _lz4_batch(frame: bytes) -> bytes:
    """A one-record batch whose payload is the LZ4 frame `frame` as given."""
    out = bytearray(batch(0, frame, 1))
    out[21:23] = (3).to_bytes(2, "big")
    out[17:21] = crc32c(bytes(out[21:])).to_bytes(4, "big")
    return bytes(out)


def test_lz4_block_walks_for_the_inline_decision_are_bounded_by_the_bytes() -> None:
    """`expanded_size` runs on the event loop for every filtered Produce frame up to 1 MiB
    (paths/base.job_size). An empty stored block is 4 bytes, so 900 batches of 256 of them
    fit in 1 MiB and had the loop walk 230 000 block headers in Python (~60 ms a request on
    a loaded 2-core machine). A frame is now walked for at most one block per KiB of its
    payload; past that it gets no size and its job goes to the pool."""
    empty_block = (0x80000000).to_bytes(4, "little")
    frame = b"\x04\x22\x4d\x18\x60\x40\x82" + empty_block * 256 + bytes(4)
    assert bytes(decompress(3, frame)) == b""
    blob = _lz4_batch(frame) * 900
    assert len(blob) < MiB
    assert expanded_size(blob) is None
    # What producers write keeps its size: 64 KiB of records per block.
    section = records_of([b'{"n": %d, "user": "u%d@example.com"}' % (i, i)
                          for i in range(10_000)])
    size = expanded_size(batch(3, section, 10_000))
    assert size is not None and size >= HEADER_SIZE + len(section)
