"""The produce host-share micro-benchmark runs the produce path's real job and splice on a
masked request and times the guest's call apart from it (no timing asserted beyond its
sign)."""

from __future__ import annotations

from typing import Any

from bench import bench_produce_host
from bench.workload import json_records
from sluice.codec.compression import CODEC_LZ4
from sluice.codec.headers import parse_request_header
from sluice.codec.messages import ApiKey, decode_request
from sluice.codec.records import decode_records, split_batches
from sluice.filters.chain import FilterChain
from sluice.filters.config import FilterSpec


def _through_the_job(frame: bytes) -> tuple[bytes, Any]:
    """What the produce path's job under pii-mask sends for `frame`, and its decoded request."""
    spec = FilterSpec(name="mask-pii", module="builtin:pii-mask", config={},
                      topics=("bench-*",), apply_to=frozenset({"produce"}))
    chain = FilterChain.from_specs([spec])
    try:
        done = bench_produce_host.whole(chain, frame)
    finally:
        chain.close()
    sent = b"".join(done)  # the pieces the connection writes
    header = parse_request_header(sent)
    return sent, decode_request(ApiKey.PRODUCE, bench_produce_host.VERSION,
                                sent[header.header_size:])


def test_the_job_it_times_masks_the_request() -> None:
    values = json_records(50)
    frame = bench_produce_host.produce_frame([bench_produce_host.produce_batch(values)])
    assert frame.count(b"@example.com") == 50
    sent, request = _through_the_job(frame)
    assert b"@example.com" not in sent
    assert request.topic_data[0].name == bench_produce_host.TOPIC


def test_the_job_and_the_guest_are_both_measured() -> None:
    whole, guest = bench_produce_host.measure(400, 1)
    assert whole > guest > 0


def test_a_workload_2_request_is_lz4_and_masked_too() -> None:
    values = json_records(50)
    frame = bench_produce_host.produce_frame(
        [bench_produce_host.produce_batch(values, lz4=True)] * 2)
    _sent, request = _through_the_job(frame)
    parts = request.topic_data[0].partition_data
    assert len(parts) == 2
    for part in parts:
        (batch,), _rest = split_batches(part.records)
        assert batch.header.compression == CODEC_LZ4
        values = [r.value for r in decode_records(batch)]
        assert len(values) == 50 and all(b"@example.com" not in v for v in values)
