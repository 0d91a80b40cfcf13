"""Hostile record batches for black-box tests and the bomb bench: decompression bombs of every
codec and batches whose declared record count lies, written as raw frames to a proxy or
straight to the broker (Tansu stores what Kafka's broker would refuse).

A bomb's records are Kafka's smallest: 7 bytes each (length, attributes, timestamp delta,
offset delta, null key, null value, no headers), all alike, so the section compresses to
almost nothing (10 MiB of them: 976 bytes of zstd, 15 KB of gzip).
"""

from __future__ import annotations

import datetime
import threading
import time
from typing import Any

import cramjam
import psutil

from sluice.codec import entities, schemas
from sluice.codec.compression import CODEC_NONE, CODEC_ZSTD, compress
from sluice.codec.headers import response_header_size
from sluice.codec.messages import ApiKey, decode_response
from sluice.codec.records import (
    BatchHeader,
    Record,
    build_batch_from_section,
    crc32c,
    encode_records,
)
from tests.harness.raw_kafka import connect, metadata_frame, recv_frame, request_frame

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
    sized: bool = True,
) -> bytes:
    """A magic-2 batch whose header declares `count` records around `section`, compressed with
    `codec` whatever the count (`build_batch` writes no payload for 0 records). zstd frames
    declare their content size unless `sized` is False (a streaming compressor's frame, as
    Java's zstd-jni writes)."""
    if codec == CODEC_NONE:
        payload = section
    elif codec == CODEC_ZSTD and not sized:
        streaming = cramjam.zstd.Compressor(level=3)
        streaming.compress(section)
        payload = bytes(streaming.finish())
    else:
        payload = bytes(compress(codec, section, xerial))
    now = int(time.time() * 1000)
    lod = count - 1 if last_offset_delta is None else last_offset_delta
    header = BatchHeader(0, 0, -1, 2, 0, CODEC_NONE, max(lod, 0), now, now, -1, -1, -1, 1)
    # Built around the payload as if uncompressed, then the codec, the count and the CRC are
    # set by hand: the header says exactly what the caller asks, however untrue.
    out = bytearray(build_batch_from_section(header, payload, 1))
    out[21:23] = codec.to_bytes(2, "big")
    out[57:61] = count.to_bytes(4, "big", signed=True)
    out[17:21] = crc32c(bytes(out[21:])).to_bytes(4, "big")
    return bytes(out)


def bomb(codec: int, size: int = 10 * MiB) -> bytes:
    """A batch of `size` bytes of 7-byte records, honestly declared, compressed with `codec`."""
    section = bomb_section(size)
    return batch(codec, section, len(section) // len(TINY_RECORD))


def lying_bomb(codec: int, size: int = 10 * MiB, declared: int = 1, sized: bool = True) -> bytes:
    """A batch that declares `declared` records but decompresses to `size` bytes of them."""
    return batch(codec, bomb_section(size), declared, sized=sized)


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


def decode_answer(api_key: int, version: int, body: bytes) -> Any:
    """A response body (correlation id first, as `recv_frame` returns it), decoded."""
    return decode_response(api_key, version, body[response_header_size(body, api_key, version):])


def first_partition(api_key: int, version: int, body: bytes) -> Any:
    """The first partition of the first topic of a Produce or Fetch answer."""
    topic = decode_answer(api_key, version, body).responses[0]
    return (topic.partition_responses if api_key == ApiKey.PRODUCE else topic.partitions)[0]


class ProcessWatch(threading.Thread):
    """While running: a process's peak RSS (sampled every 5 ms) and CPU seconds, and the
    slowest answer to a Metadata request sent every 20 ms on a connection of its own to
    `port` (another client's view of the proxy while something else is processed)."""

    def __init__(self, pid: int, port: int) -> None:
        super().__init__(daemon=True)
        self.proc = psutil.Process(pid)
        self.port = port
        self.base_rss = self.peak_rss = self.proc.memory_info().rss
        self.base_cpu = self._cpu()
        self.slowest = 0.0
        self.answers = 0
        self._done = threading.Event()

    def _cpu(self) -> float:
        times = self.proc.cpu_times()
        return float(times.user + times.system)

    def run(self) -> None:
        sampler = threading.Thread(target=self._sample, daemon=True)
        sampler.start()
        with connect(self.port, timeout=60) as sock:
            n = 1
            while not self._done.is_set():
                start = time.monotonic()
                sock.sendall(metadata_frame(n))
                if recv_frame(sock) is None:
                    break
                self.slowest = max(self.slowest, time.monotonic() - start)
                self.answers += 1
                n += 1
                time.sleep(0.02)
        sampler.join()

    def _sample(self) -> None:
        while not self._done.is_set():
            self.peak_rss = max(self.peak_rss, self.proc.memory_info().rss)
            time.sleep(0.005)

    def finish(self) -> dict[str, float]:
        """Stop watching: CPU seconds spent and RSS growth (MiB) since the start, and the
        slowest Metadata answer (seconds)."""
        time.sleep(0.05)
        cpu = self._cpu() - self.base_cpu
        self._done.set()
        self.join(30)
        return {"cpu_s": round(cpu, 3),
                "rss_growth_mib": round((self.peak_rss - self.base_rss) / MiB, 1),
                "metadata_slowest_s": round(self.slowest, 3)}
