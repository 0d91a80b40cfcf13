"""Hostile record batches for black-box tests and the bomb bench: decompression bombs of every
codec and batches whose declared record count lies, written as raw frames to a proxy or
straight to the broker (Tansu stores what Kafka's broker would refuse).

A bomb's records are Kafka's smallest: 7 bytes each (length, attributes, timestamp delta,
offset delta, null key, null value, no headers), all alike, so the section compresses to
almost nothing (10 MiB of them: 976 bytes of zstd, 15 KB of gzip).
"""

from __future__ import annotations

import datetime
import time

from sluice.codec import entities, schemas
from sluice.codec.compression import CODEC_NONE, compress
from sluice.codec.messages import ApiKey
from sluice.codec.records import (
    BatchHeader,
    Record,
    build_batch_from_section,
    crc32c,
    encode_records,
)
from tests.harness.raw_kafka import request_frame

#: Kafka's smallest record: length 6, attributes 0, timestamp delta 0, offset delta 0,
#: key -1 (null), value -1 (null), 0 headers.
TINY_RECORD = b"\x0c\x00\x00\x00\x01\x01\x00"

MiB = 1 << 20


def bomb_section(size: int = 10 * MiB) -> bytes:
    """An uncompressed records section of `size` bytes of 7-byte records."""
    return TINY_RECORD * (size // len(TINY_RECORD))


def batch(
    codec: int,
    section: bytes,
    count: int,
    *,
    last_offset_delta: int | None = None,
    xerial: bool = True,
) -> bytes:
    """A magic-2 batch whose header declares `count` records around `section`, compressed with
    `codec` (the section is compressed even when `count` is 0, unlike `build_batch`)."""
    now = int(time.time() * 1000)
    lod = count - 1 if last_offset_delta is None else last_offset_delta
    header = BatchHeader(0, 0, -1, 2, 0, codec, max(lod, 0), now, now, -1, -1, -1, count,
                         None if xerial else False)
    if count:
        return build_batch_from_section(header, section, count)
    # build_batch_from_section writes an empty batch for count 0: build this one uncompressed
    # around the compressed payload, then set the codec, the count 0 and the CRC by hand.
    payload = section if codec == CODEC_NONE else compress(codec, section, xerial)
    header.attributes = CODEC_NONE
    out = bytearray(build_batch_from_section(header, payload, 1))
    out[21:23] = codec.to_bytes(2, "big")
    out[57:61] = (0).to_bytes(4, "big")
    out[17:21] = crc32c(bytes(out[21:])).to_bytes(4, "big")
    return bytes(out)


def bomb(codec: int, size: int = 10 * MiB) -> bytes:
    """A batch of `size` bytes of 7-byte records, honestly declared, compressed with `codec`."""
    section = bomb_section(size)
    return batch(codec, section, len(section) // len(TINY_RECORD))


def lying_bomb(codec: int, size: int = 10 * MiB, declared: int = 1) -> bytes:
    """A batch that declares `declared` records but decompresses to `size` bytes of them."""
    return batch(codec, bomb_section(size), declared)


def records_of(values: list[bytes | None]) -> bytes:
    """An uncompressed records section holding `values` (null keys, no headers)."""
    return bytes(encode_records([Record(i, 0, None, v, []) for i, v in enumerate(values)]))


def produce_records_frame(
    correlation_id: int, topic: str, records: bytes, acks: int = -1, version: int = 9
) -> bytes:
    """A Produce request putting the raw `records` bytes into partition 0 of `topic`."""
    cls = schemas.request_schema(ApiKey.PRODUCE, version)
    tcls = entities.element_class(cls, "topic_data")
    pcls = entities.element_class(tcls, "partition_data")
    part = entities.build(pcls, index=0, records=records)
    return request_frame(
        ApiKey.PRODUCE,
        version,
        correlation_id,
        transactional_id=None,
        acks=acks,
        timeout=datetime.timedelta(seconds=10),
        topic_data=(entities.build(tcls, name=topic, partition_data=(part,)),),
    )
