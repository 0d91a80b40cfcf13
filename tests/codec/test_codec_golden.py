"""Golden frames captured from real clients (confluent-kafka/librdkafka, kafka-python,
aiokafka) talking to Tansu; see capture_golden.py for how they were recorded.

Every frame must parse (header + body), re-encode to an equal message, and every record batch
in Produce requests and Fetch responses must verify its CRC and rebuild byte for byte.
"""

from __future__ import annotations

import json
import random
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from sluice.codec.errors import CodecError
from sluice.codec.frames import FrameBuffer, frame
from sluice.codec.headers import (
    parse_request_header,
    read_correlation_id,
    request_header_bytes,
    response_header_bytes,
    response_header_size,
)
from sluice.codec.messages import (
    decode_request,
    decode_response,
    encode_request,
    encode_response,
)
from sluice.codec.records import (
    HEADER_SIZE,
    RawBatch,
    build_batch,
    decode_records,
    split_batches,
    verify_crc,
)

GOLDEN = Path(__file__).parent / "golden"
CLIENTS = ["confluent", "kafka_python", "aiokafka"]


@dataclass(frozen=True)
class Golden:
    client: str
    conn: int
    direction: str
    api_key: int
    api_version: int
    correlation_id: int
    scenario: str
    body: bytes

    @property
    def name(self) -> str:
        return f"{self.client}:{self.scenario}:{self.direction}:{self.api_key}v{self.api_version}"


def load(client: str) -> list[Golden]:
    out = []
    with (GOLDEN / f"{client}.jsonl").open() as fh:
        for line in fh:
            raw = json.loads(line)
            out.append(
                Golden(
                    client,
                    raw["conn"],
                    raw["dir"],
                    raw["api_key"],
                    raw["api_version"],
                    raw["correlation_id"],
                    raw["scenario"],
                    bytes.fromhex(raw["frame"]),
                )
            )
    return out


ALL = [g for client in CLIENTS for g in load(client)]
REQUESTS = [g for g in ALL if g.direction == "request"]
RESPONSES = [g for g in ALL if g.direction == "response" and g.api_key >= 0]


def _body_of_request(g: Golden) -> memoryview:
    header = parse_request_header(g.body)
    return memoryview(g.body)[header.header_size :]


def _body_of_response(g: Golden) -> memoryview:
    size = response_header_size(g.body, g.api_key, g.api_version)
    return memoryview(g.body)[size:]


def test_golden_files_are_small_and_cover_the_clients() -> None:
    total = sum(p.stat().st_size for p in GOLDEN.glob("*.jsonl"))
    assert total < 1_000_000
    for client in CLIENTS:
        keys = {g.api_key for g in ALL if g.client == client}
        assert {0, 1, 3, 18}.issubset(keys), client


@pytest.mark.parametrize("g", REQUESTS, ids=lambda g: g.name)
def test_request_headers_and_bodies(g: Golden) -> None:
    header = parse_request_header(g.body)
    assert (header.api_key, header.api_version, header.correlation_id) == (
        g.api_key,
        g.api_version,
        g.correlation_id,
    )
    assert read_correlation_id(g.body[4:]) == g.correlation_id
    assert header.client_id
    # The header we would write for the same values is the one the client wrote.
    rebuilt = request_header_bytes(
        header.api_key, header.api_version, header.correlation_id, header.client_id
    )
    assert rebuilt == g.body[: header.header_size]
    entity = decode_request(g.api_key, g.api_version, g.body[header.header_size :])
    assert decode_request(g.api_key, g.api_version, encode_request(entity)) == entity


@pytest.mark.parametrize("g", RESPONSES, ids=lambda g: g.name)
def test_response_headers_and_bodies(g: Golden) -> None:
    assert read_correlation_id(g.body) == g.correlation_id
    size = response_header_size(g.body, g.api_key, g.api_version)
    assert g.body[:size] == response_header_bytes(g.correlation_id, g.api_key, g.api_version)
    entity = decode_response(g.api_key, g.api_version, g.body[size:])
    assert decode_response(g.api_key, g.api_version, encode_response(entity)) == entity


def test_api_versions_responses_use_header_v0() -> None:
    api_versions = [g for g in RESPONSES if g.api_key == 18]
    assert {g.api_version for g in api_versions} >= {0, 3, 4}
    for g in api_versions:
        assert response_header_size(g.body, 18, g.api_version) == 4
        body = decode_response(18, g.api_version, g.body[4:])
        assert body.error_code == 0
        assert any(k.api_key == 0 for k in body.api_keys)
        if g.api_version >= 3:
            # Read with a v1 header the first body byte would be taken for a tag count.
            with pytest.raises(Exception):  # noqa: B017
                decode_response(18, g.api_version, g.body[5:])


def test_librdkafka_all_topics_metadata_request_quirk() -> None:
    (g,) = [
        g
        for g in REQUESTS
        if g.scenario == "confluent-admin-list-topics" and g.api_key == 3 and g.api_version >= 9
    ]
    body = bytes(_body_of_request(g))
    # The unfinalised 4-byte count placeholder: compact null + 3 stray zero bytes.
    assert body[:4] == b"\x00\x00\x00\x00"
    request = decode_request(3, g.api_version, body)
    assert request.topics is None
    assert request.allow_auto_topic_creation is True
    assert request.include_topic_authorized_operations is False


def test_framer_on_captured_streams_with_random_chunking() -> None:
    rng = random.Random(1234)
    for client in CLIENTS:
        for direction in ("request", "response"):
            bodies = [g.body for g in ALL if g.client == client and g.direction == direction]
            stream = b"".join(frame(b) for b in bodies)
            fb = FrameBuffer()
            got: list[bytes] = []
            pos = 0
            while pos < len(stream):
                step = rng.choice([1, 3, 7, 64, 1000, 20000])
                got.extend(bytes(f) for f in fb.feed(stream[pos : pos + step]))
                pos += step
            assert got == bodies
            assert fb.pending == 0


def _record_fields() -> Iterator[tuple[Golden, Any]]:
    for g in ALL:
        if g.direction == "request" and g.api_key == 0:
            produce = decode_request(0, g.api_version, _body_of_request(g))
            for topic in produce.topic_data:
                for part in topic.partition_data:
                    yield g, part.records
        elif g.direction == "response" and g.api_key == 1:
            fetch = decode_response(1, g.api_version, _body_of_response(g))
            for topic in fetch.responses:
                for part in topic.partitions:
                    if part.records:
                        yield g, part.records


RECORD_FIELDS = list(_record_fields())
BATCHES: list[tuple[Golden, RawBatch]] = []
for _g, _records in RECORD_FIELDS:
    _batches, _tail = split_batches(_records)
    assert len(_tail) == 0, _g.name
    BATCHES.extend((_g, b) for b in _batches)


def test_golden_batches_cover_every_codec_and_producer_kind() -> None:
    seen = {(g.client, g.api_key, b.header.compression) for g, b in BATCHES}
    for client in ("confluent", "aiokafka"):
        for api_key in (0, 1):
            for codec in range(5):
                assert (client, api_key, codec) in seen
    assert any(b.header.has_producer_id for g, b in BATCHES if g.client == "confluent")
    assert any(not b.header.has_producer_id for g, b in BATCHES if g.client == "confluent")
    snappy_framing = {
        g.client: b.header.snappy_xerial for g, b in BATCHES if b.header.compression == 2
    }
    assert snappy_framing == {"confluent": False, "aiokafka": True}


@pytest.mark.parametrize(
    ("g", "batch"), BATCHES, ids=[f"{g.name}:codec{b.header.compression}" for g, b in BATCHES]
)
def test_golden_batch_verifies_and_rebuilds_byte_exact(g: Golden, batch: RawBatch) -> None:
    assert verify_crc(batch.data)
    records = decode_records(batch)
    assert len(records) == batch.header.record_count > 0
    assert records[-1].offset_delta == batch.header.last_offset_delta
    for r in records:
        assert r.value is None or r.value.startswith((b"ck-", b"kp-", b"aio-"))
    assert build_batch(batch.header, records) == bytes(batch.data)
    # Forced recompression (a plain list carries no memory of the original bytes) must
    # give a batch with the same header fields and records.
    rebuilt = build_batch(batch.header, list(records))
    assert verify_crc(rebuilt)
    again = split_batches(rebuilt)[0][0]
    assert again.header.compression == batch.header.compression
    assert again.header.snappy_xerial == batch.header.snappy_xerial
    assert bytes(again.data[:HEADER_SIZE])[21:] == bytes(batch.data[:HEADER_SIZE])[21:]
    assert decode_records(again) == records


def test_fetch_records_cut_short_leave_a_tail() -> None:
    fetch_fields = [r for g, r in RECORD_FIELDS if g.api_key == 1]
    assert fetch_fields
    for records in fetch_fields:
        whole, _ = split_batches(records)
        for cut in (1, 30, len(records) // 2, len(records) - 1):
            batches, tail = split_batches(records[:cut])
            assert len(batches) + (1 if len(tail) else 0) <= len(whole)
            assert [bytes(b.data) for b in batches] == [
                bytes(b.data) for b in whole[: len(batches)]
            ]
            assert bytes(tail) == bytes(records[sum(len(b.data) for b in batches) : cut])


def test_golden_produce_header_offsets_follow_kafka_rules() -> None:
    for g, batch in BATCHES:
        if g.api_key != 0:
            continue
        assert batch.header.base_offset == 0
        assert batch.header.record_count == batch.header.last_offset_delta + 1
        assert struct.unpack_from(">b", batch.data, 16)[0] == 2


def _has_strict_prefixes(g: Golden) -> bool:
    # The librdkafka all-topics Metadata request is left out: its first 4 bytes are by
    # themselves a valid (canonical) all-topics request. Empty bodies have no prefixes.
    if g.scenario == "confluent-admin-list-topics" and g.api_key == 3:
        return False
    body = _body_of_request(g) if g.direction == "request" else _body_of_response(g)
    return len(body) > 0


_PREFIX_CASES = [g for g in REQUESTS + RESPONSES if _has_strict_prefixes(g)]


@pytest.mark.parametrize("g", _PREFIX_CASES, ids=lambda g: g.name)
def test_every_strict_prefix_of_a_golden_body_is_refused(g: Golden) -> None:
    if g.direction == "request":
        body = bytes(_body_of_request(g))
        decode = decode_request
    else:
        body = bytes(_body_of_response(g))
        decode = decode_response
    step = max(1, len(body) // 40)
    for cut in [*range(0, len(body), step), len(body) - 1]:
        with pytest.raises(CodecError):
            decode(g.api_key, g.api_version, body[:cut])
