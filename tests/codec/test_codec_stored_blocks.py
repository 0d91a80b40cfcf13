"""Frames for sections that do not compress (`compression.lz4_stored_frame` and
`lz4_sealed_frame`, which writes the tail every record repeats as LZ4 matches): golden bytes,
decoding by cramjam, python-lz4 and liblz4's reference command-line tool and by the proxy's
own decompressor, and their use for batches of sealed records (whole values keep the
producer's codec; zstd, gzip, snappy and fields mode still compress)."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import cramjam
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sluice.codec.compression import (
    CODEC_LZ4,
    CODEC_ZSTD,
    LZ4_SEALED_NATIVE,
    compress,
    decompress,
    lz4_sealed_frame,
    lz4_stored_frame,
)
from sluice.codec.records import (
    BatchHeader,
    Record,
    build_batch,
    build_batch_from_section,
    encode_records,
    records_section,
    split_batches,
)
from sluice.crypto.kms import KmsSettings
from sluice.filters.chain import FilterChain
from sluice.filters.config import FilterSpec
from sluice.filters.context import RecordContext
from sluice.filters.pipeline import filter_fetch, filter_produce

KIB = 1024
PRODUCE = RecordContext("payments", 0, "produce", principal="User:app")
FETCH = RecordContext("payments", 0, "fetch", principal="User:billing")


def _xxh32(data: bytes, seed: int = 0) -> int:
    """xxHash32 of fewer than 16 bytes (the LZ4 frame descriptor's checksum), from its
    specification: independent of the constant the writer holds."""
    p1, p2, p3, p4, p5, mask = 2654435761, 2246822519, 3266489917, 668265263, 374761393, 2**32 - 1

    def rotl(x: int, r: int) -> int:
        return ((x << r) | (x >> (32 - r))) & mask

    assert len(data) < 16
    h = (seed + p5 + len(data)) & mask
    i = 0
    while i + 4 <= len(data):
        h = rotl((h + int.from_bytes(data[i:i + 4], "little") * p3) & mask, 17) * p4 & mask
        i += 4
    for byte in data[i:]:
        h = rotl((h + byte * p5) & mask, 11) * p1 & mask
    h ^= h >> 15
    h = h * p2 & mask
    h ^= h >> 13
    h = h * p3 & mask
    return h ^ (h >> 16)


def lz4_blocks(frame: bytes) -> list[tuple[bool, int]]:
    """(stored, size) of every block of an LZ4 frame without a content size or dictionary."""
    pos, out = 7, []
    checksum = 4 if frame[4] & 0x10 else 0
    while True:
        word = int.from_bytes(frame[pos:pos + 4], "little")
        pos += 4
        if word == 0:
            assert pos == len(frame)
            return out
        size = word & 0x7FFFFFFF
        out.append((bool(word & 0x80000000), size))
        pos += size + checksum


def test_golden_lz4_stored_frame() -> None:
    assert bytes(lz4_stored_frame(b"abc")).hex() == (
        "04224d18" "6040" "82"  # magic, FLG, BD (64 KiB blocks), header checksum
        "03000080" "616263"  # a stored block of 3 bytes
        "00000000")  # end mark
    assert (_xxh32(b"\x60\x40") >> 8) & 0xFF == 0x82
    # The descriptor Kafka's Java producer (KafkaLZ4BlockOutputStream) writes.
    assert bytes(lz4_stored_frame(b"x"))[4:7] == bytes.fromhex("604082")


SIZES = st.one_of(
    st.integers(0, 300),
    st.sampled_from([64 * KIB - 1, 64 * KIB, 64 * KIB + 1, 128 * KIB, 128 * KIB + 1,
                     200 * KIB + 17]))


def _tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        pytest.skip(f"the {name} command (liblz4 / libzstd reference tool) is not installed")
    return path


@settings(max_examples=25, deadline=None)
@given(size=SIZES, seed=st.binary(min_size=1, max_size=8))
def test_stored_frames_decode_everywhere(size: int, seed: bytes) -> None:
    data = (seed * (size // len(seed) + 1))[:size]  # compressible on purpose: still stored
    lz4 = bytes(lz4_stored_frame(data))
    blocks = lz4_blocks(lz4)
    assert all(stored and 0 < n <= 64 * KIB for stored, n in blocks)
    assert sum(n for _, n in blocks) == size
    assert len(lz4) == size + 7 + 4 * len(blocks) + 4
    assert bytes(cramjam.lz4.decompress(lz4)) == data
    assert bytes(decompress(CODEC_LZ4, lz4)) == data


@pytest.mark.parametrize("size", [1, 64 * KIB + 5, 300 * KIB])
def test_reference_tools_decode_stored_frames(size: int) -> None:
    """liblz4's own command-line decoder reads the frames (checking the header checksum)."""
    data = os.urandom(size)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "frame"
        path.write_bytes(bytes(lz4_stored_frame(data)))
        out = subprocess.run([_tool("lz4"), "-d", "-c", str(path)], capture_output=True,
                             check=True, timeout=30)
    assert out.stdout == data


def _varint(n: int) -> bytes:
    n = (n << 1) ^ (n >> 63)
    out = bytearray()
    while n >= 0x80:
        out.append(n & 0x7F | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def section_of(bodies: list[bytes]) -> bytes:
    """Records as the walk of lz4_sealed.c reads them: a zigzag varint length, the body."""
    return b"".join(_varint(len(b)) + b for b in bodies)


needs_native = pytest.mark.skipif(not LZ4_SEALED_NATIVE, reason="codec/lz4_sealed.c not built")


@needs_native
def test_golden_lz4_sealed_frame() -> None:
    tail = b"TAILTAILTAIL"
    section = section_of([b"a" + tail, b"b" + tail, b"c" + tail])
    frame = bytes(lz4_sealed_frame(section, tail))
    # Three 14-byte records (length 13 as a zigzag varint, a byte, the tail). The first
    # record's tail has nothing before it to match; the second's matches it 14 bytes back;
    # the third's would end less than 5 bytes before the block's end: literals.
    assert frame.hex() == (
        "04224d18" "604082"  # Kafka's descriptor: independent 64 KiB blocks, no checksums
        "23000000"  # one compressed block of 35 bytes
        "f8" "01"  # token: 15 + 1 literals, match length 4 + 8
        "1a61" + tail.hex() + "1a62"  # the literals: record 1, the start of record 2
        "0e00"  # the match's offset: 14 back
        "e0" "1a63" + tail.hex()  # the last literals: record 3
        + "00000000")  # end mark
    assert bytes(cramjam.lz4.decompress(frame)) == section


@needs_native
@settings(max_examples=60, deadline=None)
@given(bodies=st.lists(st.binary(max_size=300), max_size=60),
       tail=st.binary(min_size=4, max_size=120), ending=st.lists(st.booleans(), max_size=60),
       garbage=st.binary(max_size=40), big=st.integers(0, 3))
def test_lz4_sealed_frames_decode_to_their_input(
        bodies: list[bytes], tail: bytes, ending: list[bool], garbage: bytes, big: int) -> None:
    """Any input, records or not, some ending with the tail and some not, over block
    boundaries: cramjam, python-lz4 and the proxy's decompressor give it back."""
    import lz4.frame

    bodies = [b + tail if (ending[i] if i < len(ending) else True) else b
              for i, b in enumerate(bodies)]
    bodies += [b"\x00" * 30_000 + tail] * big  # records across 64 KiB blocks
    section = section_of(bodies) + garbage
    frame = bytes(lz4_sealed_frame(section, tail))
    assert bytes(cramjam.lz4.decompress(frame)) == section
    assert lz4.frame.decompress(frame) == section
    assert bytes(decompress(CODEC_LZ4, frame)) == section
    assert len(frame) <= len(lz4_stored_frame(section))


@needs_native
def test_lz4_sealed_frames_match_every_repeated_tail_and_liblz4_reads_them() -> None:
    tail = os.urandom(90)
    section = section_of([os.urandom(230) + tail for _ in range(1000)])  # ~330 KB, 6 blocks
    frame = bytes(lz4_sealed_frame(section, tail))
    # Each record but the first of each block writes its tail as a 4-byte sequence.
    assert len(frame) < len(section) - 900 * 80
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "frame"
        path.write_bytes(frame)
        out = subprocess.run([_tool("lz4"), "-d", "-c", str(path)], capture_output=True,
                             check=True, timeout=30)
    assert out.stdout == section


def test_incompressible_keeps_gzip_snappy_and_zstd_compressing() -> None:
    data = b"abc" * 10_000
    for codec in (1, 2, 4):
        assert compress(codec, data, incompressible=True) == compress(codec, data)
    assert compress(0, data, incompressible=True) is data


def _header(codec: int, count: int) -> BatchHeader:
    return BatchHeader(0, 0, 0, 2, 0, codec, count - 1, 1_700_000_000_000,
                       1_700_000_000_000 + count - 1, 1000, 0, 0, count)


@pytest.mark.parametrize("codec", [CODEC_LZ4, CODEC_ZSTD])
def test_batch_from_section_keeps_its_codec(codec: int) -> None:
    recs = [Record(i, i, b"k%d" % i, os.urandom(200), [], 0) for i in range(50)]
    section = encode_records(recs)
    batch = build_batch_from_section(_header(codec, 50), section, 50, incompressible=True)
    (raw,), _ = split_batches(batch)
    assert raw.header.compression == codec
    payload = batch[61:]
    if codec == CODEC_LZ4:
        assert payload == bytes(lz4_stored_frame(section))
    else:  # zstd compresses as usual: its search finds what repeats
        assert payload == bytes(compress(CODEC_ZSTD, section))
    assert bytes(records_section(raw)) == bytes(section)


def _chain(tmp: str, **extra: object) -> FilterChain:
    spec = FilterSpec(name="enc", module="builtin:encrypt", topics=("payments",),
                      apply_to=frozenset({"produce", "fetch"}),
                      kms=KmsSettings("local", path=str(Path(tmp) / "keys.json")),
                      config={"key": "payments", "decrypt_for": ["User:billing"], **extra})
    return FilterChain.from_specs([spec])


@pytest.mark.parametrize("codec", [CODEC_LZ4, CODEC_ZSTD])
def test_sealed_whole_values_are_stored_blocks_of_the_producers_codec(codec: int) -> None:
    recs = [Record(i, i, b"k%d" % i, b'{"card": "4111 %05d", "n": "x"}' % i, [], 0)
            for i in range(300)]
    produced = build_batch(_header(codec, 300), recs)
    with tempfile.TemporaryDirectory() as tmp:
        chain = _chain(tmp)
        try:
            out = filter_produce(chain, PRODUCE,
                                 produced)
            stored = bytes(out.records or b"")
            (raw,), _ = split_batches(stored)
            assert raw.header.compression == codec
            section = bytes(records_section(raw))
            payload = stored[61:]
            if codec == CODEC_LZ4:
                assert payload[4:7] == bytes.fromhex("604082")
                assert bytes(cramjam.lz4.decompress(payload)) == section
                if LZ4_SEALED_NATIVE:  # the header group of each record is a match
                    assert len(payload) < 0.8 * len(lz4_stored_frame(section))
                else:
                    assert payload == bytes(lz4_stored_frame(section))
            else:  # zstd compresses as usual, finding the repeated header groups
                assert bytes(decompress(CODEC_ZSTD, payload)) == section
                assert len(payload) < 0.8 * len(section)
            assert b"4111" not in payload
            back = filter_fetch(chain, FETCH,
                                stored)
            assert back.error_code == 0 and bytes(back.records) == produced
        finally:
            chain.close()


def test_fields_mode_still_compresses() -> None:
    recs = [Record(i, i, b"k%d" % i, b'{"card": "4111 %05d", "name": "Holder"}' % i, [], 0)
            for i in range(300)]
    produced = build_batch(_header(CODEC_LZ4, 300), recs)
    with tempfile.TemporaryDirectory() as tmp:
        chain = _chain(tmp, fields=["card"])
        try:
            out = filter_produce(chain, PRODUCE,
                                 produced)
        finally:
            chain.close()
    stored = bytes(out.records or b"")
    (raw,), _ = split_batches(stored)
    assert not any(s for s, _ in lz4_blocks(stored[61:]))
    assert len(stored) - 61 < len(bytes(records_section(raw))) // 2
