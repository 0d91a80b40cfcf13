"""Micro-benchmark of the codec work on the filtered produce and fetch paths (no broker, no
network, one thread): what each step costs per Produce request or per record batch.

    python -m bench.bench_codec_paths [--records 1000] [--rounds 7] [--only fetch]

Rows (µs per call, median of the rounds, thread CPU time):

- Produce request with one partition holding one batch of `--records` ~200-byte records
  (workload 1's shape) and with one record (workload 3's): kio's decode, then kio's
  re-encode after replacing the records (what the proxy does today), against
  `scan_produce_request` + `splice_produce_records` (codec/produce_splice.py);
- Produce response (v10, one partition): kio's decode against `scan_produce_offsets`;
- Fetch response (v12 and v16, what librdkafka and the Java client read) with one filtered
  topic (one partition, one batch of `--records` records) and one unfiltered topic (one
  partition, the same batch): the fetch path's codec work around the filter, kio's decode +
  re-encode + header copy (the path before) against `scan_fetch_response` +
  `splice_fetch_records` (codec/fetch_splice.py), and the whole path with builtin:pii-mask
  (`filter_fetch` on the filtered partition included);
- the record-batch steps of one filtered batch, uncompressed and lz4: `split_batches`,
  `verify_crc`, `records_section`, `check_section`, `check_batch` (uncompressed only),
  `build_batch_from_section`, and the whole `filter_produce` / `filter_fetch` with
  builtin:pii-mask (µs per batch and per record).
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import statistics
import time
import uuid
from collections.abc import Callable
from functools import partial
from typing import Any

from kio.schema.errors import ErrorCode

from bench.workload import json_records
from sluice.codec.fetch_splice import scan_fetch_response, splice_fetch_records
from sluice.codec.messages import decode_request, decode_response, encode_request, encode_response
from sluice.codec.produce_offsets import scan_produce_offsets
from sluice.codec.produce_splice import scan_produce_request, splice_produce_records
from sluice.codec.records import (
    BatchHeader,
    Record,
    build_batch,
    build_batch_from_section,
    check_batch,
    check_section,
    records_section,
    split_batches,
    verify_crc,
)
from sluice.codec.schemas import request_schema, response_schema
from sluice.filters.chain import FilterChain
from sluice.filters.config import FilterSpec
from sluice.filters.context import RecordContext
from sluice.filters.pipeline import filter_fetch, filter_produce

VERSION = 10  # what librdkafka 2.x sends (golden frames)


def per_call_us(fn: Callable[[], Any], rounds: int) -> float:
    """Median over `rounds` of the thread CPU µs per call, each round at least MIN_SECONDS."""
    min_seconds = MIN_SECONDS
    fn()
    calls = 1
    while True:
        start = time.thread_time()
        for _ in range(calls):
            fn()
        if time.thread_time() - start >= min_seconds:
            break
        calls *= 2
    samples = []
    for _ in range(rounds):
        start = time.thread_time()
        for _ in range(calls):
            fn()
        samples.append((time.thread_time() - start) / calls * 1e6)
    return statistics.median(samples)


def _element(cls: type[Any], name: str) -> type[Any]:
    from dataclasses import fields

    from kio.serial._introspect import classify_field

    (fld,) = (f for f in fields(cls) if f.name == name)
    found: type[Any] = classify_field(fld).type_
    return found


def produce_request(records: bytes) -> Any:
    cls = request_schema(0, VERSION)
    tcls = _element(cls, "topic_data")
    pcls = _element(tcls, "partition_data")
    part = pcls(index=0, records=records)
    return cls(
        transactional_id=None,
        acks=-1,
        timeout=datetime.timedelta(seconds=30),
        topic_data=(tcls(name="bench-0123abcd", partition_data=(part,)),),
    )


def produce_response() -> bytes:
    cls = response_schema(0, VERSION)
    tcls = _element(cls, "responses")
    pcls = _element(tcls, "partition_responses")
    part = pcls(
        index=0,
        error_code=ErrorCode(0),
        base_offset=123456,
        log_append_time=datetime.datetime.fromtimestamp(0, datetime.UTC),
        log_start_offset=0,
        record_errors=(),
        error_message=None,
    )
    return encode_response(
        cls(
            responses=(tcls(name="bench-0123abcd", partition_responses=(part,)),),
            throttle_time=datetime.timedelta(0),
        )
    )


def batch(values: list[bytes], codec: int) -> bytes:
    records = [Record(i, 0, None, v, []) for i, v in enumerate(values)]
    n = len(records)
    header = BatchHeader(0, 0, -1, 2, 0, codec, n - 1, 1_700_000_000_000, 1_700_000_000_000,
                         -1, -1, -1, n)  # fmt: skip
    return build_batch(header, records)


MIN_SECONDS = 0.05  # of thread CPU per round; --min-seconds changes it


def request_rows(values: list[bytes], rounds: int) -> list[tuple[str, float]]:
    rows = []
    for label, vals in ((f"{len(values)} records", values), ("1 record", values[:1])):
        raw = batch(vals, 0)
        body = encode_request(produce_request(raw))
        new = bytes(reversed(raw))  # same size, other bytes: stands for the masked batch

        def kio_path(body: bytes = body, new: bytes = new) -> bytes:
            req = decode_request(0, VERSION, body)
            topic = req.topic_data[0]
            part = dataclasses.replace(topic.partition_data[0], records=new)
            topic = dataclasses.replace(topic, partition_data=(part,))
            return encode_request(dataclasses.replace(req, topic_data=(topic,)))

        def splice_path(body: bytes = body, new: bytes = new) -> bytes:
            layout = scan_produce_request(VERSION, body)
            return splice_produce_records(body, layout, {(0, 0): new})

        assert kio_path() == splice_path()
        rows += [
            (f"Produce request, {label}: kio decode", per_call_us(
                partial(decode_request, 0, VERSION, body), rounds)),
            (f"Produce request, {label}: kio decode + re-encode", per_call_us(kio_path, rounds)),
            (f"Produce request, {label}: scan", per_call_us(
                partial(scan_produce_request, VERSION, body), rounds)),
            (f"Produce request, {label}: scan + splice", per_call_us(splice_path, rounds)),
        ]  # fmt: skip
    response = produce_response()
    rows += [
        ("Produce response v10: kio decode", per_call_us(
            lambda: decode_response(0, VERSION, response), rounds)),
        ("Produce response v10: scan_produce_offsets", per_call_us(
            lambda: scan_produce_offsets(VERSION, response), rounds)),
    ]  # fmt: skip
    return rows


def fetch_response(version: int, records: bytes) -> bytes:
    """A Fetch response: topic "bench" (filtered) and "other" (not), one partition each."""
    cls = response_schema(1, version)
    tcls = _element(cls, "responses")
    pcls = _element(tcls, "partitions")
    part = pcls(
        partition_index=0, error_code=ErrorCode(0), high_watermark=1_000_000,
        last_stable_offset=1_000_000, log_start_offset=0, aborted_transactions=None,
        records=records,
    )  # fmt: skip
    key = "topic_id" if version >= 13 else "topic"
    ids = {"bench": uuid.UUID(int=1), "other": uuid.UUID(int=2)}
    topics = tuple(
        tcls(**{key: ids[name] if version >= 13 else name, "partitions": (part,)})
        for name in ("bench", "other")
    )
    return encode_response(
        cls(throttle_time=datetime.timedelta(0), error_code=ErrorCode(0), session_id=7,
            responses=topics)
    )  # fmt: skip


def fetch_rows(values: list[bytes], rounds: int) -> list[tuple[str, float]]:
    rows = []
    raw = batch(values, 0)
    spec = FilterSpec(name="mask", module="builtin:pii-mask", config={}, topics=("bench",),
                      apply_to=frozenset({"fetch"}))  # fmt: skip
    chain = FilterChain.from_specs([spec])
    ctx = RecordContext("bench", 0, "fetch", "bench")
    header = b"\x00\x00\x00\x2a\x00"  # correlation id + empty tags (response header v1)
    try:
        for version in (12, 16):
            frame = header + fetch_response(version, raw)
            size = len(header)

            def kio_path(
                frame: bytes = frame, size: int = size, version: int = version, mask: bool = False
            ) -> bytes:
                response = decode_response(1, version, memoryview(frame)[size:])
                topics = list(response.responses)
                topic = topics[0]
                part = topic.partitions[0]
                new = filter_fetch(chain, ctx, part.records).records if mask else part.records
                part = dataclasses.replace(part, records=bytes(new))
                topics[0] = dataclasses.replace(topic, partitions=(part,))
                out = encode_response(dataclasses.replace(response, responses=tuple(topics)))
                return bytes(frame[:size]) + out

            def splice_path(
                frame: bytes = frame, size: int = size, version: int = version, mask: bool = False
            ) -> bytes:
                layout = scan_fetch_response(version, frame, size)
                blob = layout.topics[0].partitions[0].records
                assert blob is not None
                new = filter_fetch(chain, ctx, blob).records if mask else blob
                return splice_fetch_records(frame, layout, {(0, 0): new})

            assert kio_path(mask=True) == splice_path(mask=True)
            label = f"Fetch response v{version}, 2 topics x {len(values)} records"
            rows += [
                (f"{label}: kio decode + re-encode", per_call_us(kio_path, rounds)),
                (f"{label}: scan + splice", per_call_us(splice_path, rounds)),
                (f"{label}: kio path with pii-mask",
                 per_call_us(partial(kio_path, mask=True), rounds)),
                (f"{label}: splice path with pii-mask",
                 per_call_us(partial(splice_path, mask=True), rounds)),
            ]  # fmt: skip
    finally:
        chain.close()
    return rows


def batch_rows(values: list[bytes], rounds: int) -> list[tuple[str, float]]:
    rows = []
    n = len(values)
    specs = {
        d: FilterSpec(name="mask", module="builtin:pii-mask", config={}, topics=("bench",),
                      apply_to=frozenset({d}))
        for d in ("produce", "fetch")
    }  # fmt: skip
    chains = {d: FilterChain.from_specs([s]) for d, s in specs.items()}
    produce_ctx = RecordContext("bench", 0, "produce", "bench")
    fetch_ctx = RecordContext("bench", 0, "fetch", "bench")
    try:
        for codec, name in ((0, "none"), (3, "lz4")):
            raw = batch(values, codec)
            (b,), _ = split_batches(raw)
            plain = records_section(b)
            view = memoryview(raw)
            steps: list[tuple[str, Callable[[], Any]]] = [
                ("split_batches", partial(split_batches, raw)),
                ("verify_crc", partial(verify_crc, view)),
                ("records_section", partial(records_section, b)),
                ("check_section", partial(check_section, plain, n)),
                ("check_batch (in place)", partial(check_batch, raw)),
                ("build_batch_from_section",
                 partial(build_batch_from_section, b.header, plain, n)),
                ("filter_produce pii-mask",
                 partial(filter_produce, chains["produce"], produce_ctx, view)),
                ("filter_fetch pii-mask",
                 partial(filter_fetch, chains["fetch"], fetch_ctx, view)),
            ]  # fmt: skip
            if codec:
                steps = [s for s in steps if not s[0].startswith("check_batch")]
            for step, fn in steps:
                rows.append((f"batch of {n}, {name}: {step}", per_call_us(fn, rounds)))
    finally:
        for chain in chains.values():
            chain.close()
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--records", type=int, default=1000, help="records per batch")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--min-seconds", type=float, default=0.05, help="thread CPU per round")
    ap.add_argument("--only", choices=("produce", "fetch", "batch"), help="one group of rows")
    args = ap.parse_args(argv)
    global MIN_SECONDS
    MIN_SECONDS = args.min_seconds
    values = json_records(args.records)
    groups = {"produce": request_rows, "fetch": fetch_rows, "batch": batch_rows}
    rows = [
        row
        for name, make in groups.items()
        if args.only in (None, name)
        for row in make(values, args.rounds)
    ]
    print(f"~200-byte JSON records; thread CPU µs per call, median of {args.rounds} rounds")
    print()
    print("| step | µs/call | µs/record |")
    print("|---|---:|---:|")
    for name, us in rows:
        per_record = f"{us / args.records:.3f}" if name.startswith("batch") else ""
        print(f"| {name} | {us:.1f} | {per_record} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
