"""Micro-measurements of the codec's hot paths (the numbers quoted in docs/CODEC.md).

    /work/venv/bin/python tests/codec/bench_codec.py

One process, one core; each figure is the median of five timed runs. Real client messages
come from the golden frames; records are synthetic.
"""

from __future__ import annotations

import dataclasses
import json
import os
import statistics
import time
import uuid
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

from kio.serial import entity_reader

from sluice.codec import guard
from sluice.codec.frames import FrameBuffer, frame
from sluice.codec.headers import (
    parse_request_header,
    peek_request_header,
    read_correlation_id,
    response_header_size,
)
from sluice.codec.messages import decode_request, decode_response, encode_request, encode_response
from sluice.codec.records import BatchHeader, Record, build_batch, decode_records, split_batches
from sluice.codec.schemas import request_schema, response_schema

GOLDEN = Path(__file__).parent / "golden"
CODEC_NAMES = ["none", "gzip", "snappy", "lz4", "zstd"]


def rate(fn: Callable[[], Any], units: int = 1, seconds: float = 0.3) -> float:
    """Median units per second of fn() over five runs."""
    n = 1
    while True:
        start = time.perf_counter()
        for _ in range(n):
            fn()
        if time.perf_counter() - start > seconds / 4:
            break
        n *= 2
    results = []
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(n):
            fn()
        results.append(n * units / (time.perf_counter() - start))
    return statistics.median(results)


def report(label: str, per_second: float, unit: str = "/s") -> None:
    print(f"  {label:66s} {per_second:>12,.0f} {unit}")


def golden(client: str, direction: str, api_key: int, min_size: int = 0) -> bytes:
    with (GOLDEN / f"{client}.jsonl").open() as fh:
        for line in fh:
            raw = json.loads(line)
            body = bytes.fromhex(raw["frame"])
            if raw["dir"] == direction and raw["api_key"] == api_key and len(body) >= min_size:
                return body
    raise LookupError((client, direction, api_key))


def synthetic_records(n: int = 100, size: int = 200) -> list[Record]:
    return [
        Record(i, i, f"key-{i}".encode(), os.urandom(size // 4) * 4, [("h", b"v")])
        for i in range(n)
    ]


def batch_header(codec: int) -> BatchHeader:
    return BatchHeader(
        0, 0, -1, 2, 0, codec, 99, 1_700_000_000_000, 1_700_000_000_099, -1, -1, -1, 100
    )


def bench_framing() -> None:
    print("framing and headers")
    produce = golden("confluent", "request", 0)
    fetch = golden("confluent", "response", 1, min_size=1000)
    fb = FrameBuffer()
    one = frame(b"x" * 200)
    many = one * 80
    split = frame(produce)
    half = len(split) // 2

    def two_chunks() -> None:
        fb.feed(split[:half])
        fb.feed(split[half:])

    report("FrameBuffer.feed, 80 frames of 200 B per 16 KiB chunk", rate(lambda: fb.feed(many), 80))
    report("FrameBuffer.feed, one frame per chunk", rate(lambda: fb.feed(one)))
    report(f"FrameBuffer.feed, {len(produce)} B frame split over 2 chunks", rate(two_chunks))
    report(
        "parse_request_header (Produce v10, librdkafka)",
        rate(lambda: parse_request_header(produce)),
    )
    report("peek_request_header", rate(lambda: peek_request_header(produce)))
    report("read_correlation_id", rate(lambda: read_correlation_id(fetch)))
    report("response_header_size (Fetch v16)", rate(lambda: response_header_size(fetch, 1, 16)))


def bench_messages() -> None:
    print("kio messages (decode = array-size guard + kio's compiled reader)")
    produce = golden("confluent", "request", 0)
    hdr = parse_request_header(produce)
    version = hdr.api_version
    body = produce[hdr.header_size :]
    entity = decode_request(0, version, body)
    topic = entity.topic_data[0]
    part = topic.partition_data[0]
    blob = build_batch(batch_header(0), synthetic_records(80, 200))
    big = dataclasses.replace(
        entity,
        topic_data=(
            dataclasses.replace(topic, partition_data=(dataclasses.replace(part, records=blob),)),
        ),
    )
    schema = request_schema(0, version)
    reader = entity_reader(schema)
    for label, ent in (("golden", entity), ("16 KiB records", big)):
        raw = encode_request(ent)
        name = f"Produce v{version} request, {label} ({len(raw)} B)"
        report(f"{name}: decode", rate(partial(decode_request, 0, version, raw)))
        report("  of which kio reader alone", rate(partial(reader, raw, 0)))
        report("  of which guard alone", rate(partial(guard.check_body, schema, raw)))
        report(f"{name}: encode", rate(partial(encode_request, ent)))

    meta = golden("confluent", "response", 3, min_size=200)
    size = response_header_size(meta, 3, 12)
    small = decode_response(3, 12, meta[size:])
    template = small.topics[0]
    topics = tuple(
        dataclasses.replace(
            template,
            name=f"topic-{i:03d}",
            topic_id=uuid.UUID(int=i + 1),
            partitions=tuple(
                dataclasses.replace(template.partitions[0], partition_index=p) for p in range(6)
            ),
        )
        for i in range(50)
    )
    large = dataclasses.replace(small, topics=topics)
    mschema = response_schema(3, 12)
    mreader = entity_reader(mschema)
    for label, ent in (("golden", small), ("50 topics x 6 partitions", large)):
        raw = encode_response(ent)
        name = f"Metadata v12 response, {label} ({len(raw)} B)"
        report(f"{name}: decode", rate(partial(decode_response, 3, 12, raw)))
        report("  of which kio reader alone", rate(partial(mreader, raw, 0)))
        report("  of which guard alone", rate(partial(guard.check_body, mschema, raw)))
        report(f"{name}: encode", rate(partial(encode_response, ent)))


def bench_records() -> None:
    print("record batches: 100 records, 200 B values (records per second)")
    records = synthetic_records()
    for codec, name in enumerate(CODEC_NAMES):
        data = build_batch(batch_header(codec), records)

        def parse(data: bytes = data) -> None:
            (batch,), _ = split_batches(data)
            decode_records(batch)

        def unchanged(data: bytes = data) -> None:
            (batch,), _ = split_batches(data)
            build_batch(batch.header, decode_records(batch))

        def modified(data: bytes = data) -> None:
            (batch,), _ = split_batches(data)
            recs = decode_records(batch)
            recs[0].value = b"masked"
            build_batch(batch.header, recs)

        label = f"{name} ({len(data)} B)"
        report(f"{label}: split + decode", rate(parse, 100), "rec/s")
        report(f"{label}: split + decode + rebuild unchanged", rate(unchanged, 100), "rec/s")
        report(f"{label}: split + decode + modify one + rebuild", rate(modified, 100), "rec/s")


def main() -> None:
    bench_framing()
    bench_messages()
    bench_records()


if __name__ == "__main__":
    main()
