"""Raw Kafka requests over a plain socket, built with sluice.codec.

The hostile-input, bypass, fault and soak tests (and the benchmarks) need to send frames that
no well-behaved client would: versions a client would never pick, legacy batches, frames cut at
every byte, several requests written before reading. Everything here is built from the codec's
public functions (kio schemas, ``request_header_bytes``, ``build_batch``), never from
hand-written per-version layouts.
"""

from __future__ import annotations

import datetime
import socket
import struct
import time
import uuid
import zlib
from collections.abc import Sequence
from typing import Any

from sluice.codec import entities
from sluice.codec.headers import request_header_bytes, response_header_size
from sluice.codec.messages import decode_response, encode_request
from sluice.codec.records import BatchHeader, Record, build_batch, decode_records, split_batches
from sluice.codec.schemas import request_schema

_SIZE = struct.Struct(">i")


def frame(body: bytes) -> bytes:
    return _SIZE.pack(len(body)) + body


def request_bytes(
    api_key: int, version: int, entity: Any, correlation_id: int, client_id: str | None = "raw"
) -> bytes:
    """A whole request frame (size prefix, header, body) for a kio request entity."""
    head = request_header_bytes(api_key, version, correlation_id, client_id)
    return frame(head + encode_request(entity))


def raw_request(
    api_key: int, version: int, body: bytes, correlation_id: int, client_id: str | None = "raw"
) -> bytes:
    """A whole request frame around an arbitrary body (which may be garbage)."""
    return frame(request_header_bytes(api_key, version, correlation_id, client_id) + body)


# ---------------------------------------------------------------- entities
def api_versions_request(version: int = 3) -> Any:
    cls = request_schema(18, version)
    return entities.build(cls, client_software_name="sluice-raw", client_software_version="1.0")


def metadata_request(version: int, topics: list[str] | None) -> Any:
    """Metadata for `topics` (None: every topic)."""
    cls = request_schema(3, version)
    tcls = entities.element_class(cls, "topics")
    items = None if topics is None else tuple(entities.build(tcls, name=t) for t in topics)
    return entities.build(cls, topics=items, allow_auto_topic_creation=False)


def batch(
    values: Sequence[bytes | None],
    *,
    compression: int = 0,
    producer_id: int = -1,
    producer_epoch: int = -1,
    base_sequence: int = -1,
    timestamp_ms: int | None = None,
    keys: Sequence[bytes | None] | None = None,
) -> bytes:
    """One magic-2 record batch holding `values` (offset deltas 0..n-1)."""
    ts = int(time.time() * 1000) if timestamp_ms is None else timestamp_ms
    keys = keys or [None] * len(values)
    records = [Record(i, 0, k, v, []) for i, (k, v) in enumerate(zip(keys, values, strict=True))]
    header = BatchHeader(
        0,
        0,
        -1,
        2,
        0,
        compression & 0x7,
        len(values) - 1,
        ts,
        ts,
        producer_id,
        producer_epoch,
        base_sequence,
        len(values),
    )
    return build_batch(header, records)


def produce_request(
    version: int,
    parts: Sequence[tuple[str | uuid.UUID, int, bytes]],
    acks: int = -1,
    timeout_ms: int = 10_000,
) -> Any:
    """A Produce request: (topic name or topic id, partition, records bytes) per partition."""
    cls = request_schema(0, version)
    tcls = entities.element_class(cls, "topic_data")
    pcls = entities.element_class(tcls, "partition_data")
    by_topic: dict[str | uuid.UUID, list[Any]] = {}
    for topic, index, records in parts:
        by_topic.setdefault(topic, []).append(entities.build(pcls, index=index, records=records))
    topics = []
    for topic, plist in by_topic.items():
        key = "topic_id" if isinstance(topic, uuid.UUID) else "name"
        topics.append(entities.build(tcls, **{key: topic, "partition_data": tuple(plist)}))
    return entities.build(
        cls,
        transactional_id=None,
        acks=acks,
        timeout=datetime.timedelta(milliseconds=timeout_ms),
        topic_data=tuple(topics),
    )


def legacy_message_set(values: list[bytes], magic: int) -> bytes:
    """A magic 0 or 1 message set (the pre-0.11 format), which the proxy must never pass."""
    out = b""
    for offset, value in enumerate(values):
        body = struct.pack(">bb", magic, 0)
        if magic == 1:
            body += struct.pack(">q", int(time.time() * 1000))
        body += struct.pack(">i", -1) + struct.pack(">i", len(value)) + value
        message = struct.pack(">I", zlib.crc32(body)) + body
        out += struct.pack(">qi", offset, len(message)) + message
    return out


def fetch_request(
    version: int,
    topic: str | uuid.UUID,
    partition: int,
    offset: int,
    max_bytes: int = 1 << 20,
    max_wait_ms: int = 100,
) -> Any:
    """A Fetch of one partition by topic name (v12-) or topic id (v13+)."""
    cls = request_schema(1, version)
    tcls = entities.element_class(cls, "topics")
    pcls = entities.element_class(tcls, "partitions")
    part = entities.build(
        pcls, partition=partition, fetch_offset=offset, partition_max_bytes=max_bytes
    )
    key = "topic_id" if isinstance(topic, uuid.UUID) else "topic"
    return entities.build(
        cls,
        replica_id=-1,
        max_wait=datetime.timedelta(milliseconds=max_wait_ms),
        min_bytes=1,
        max_bytes=max_bytes,
        isolation_level=0,
        session_id=0,
        session_epoch=-1,
        topics=(entities.build(tcls, **{key: topic, "partitions": (part,)}),),
        forgotten_topics_data=(),
        rack_id="",
    )


_RETRIABLE_FETCH_ERRORS = frozenset({3, 5, 6})


def read_partition(
    bootstrap: str, topic: str, partition: int = 0, version: int = 12
) -> list[Record]:
    """Every record of one partition, read with raw Fetch requests (no client library)."""
    out: list[Record] = []
    offset = 0
    empty = 0
    # Apache Kafka answers a topic created a moment ago with a retriable error until its
    # leader is known everywhere (NOT_LEADER_OR_FOLLOWER, UNKNOWN_TOPIC_OR_PARTITION,
    # LEADER_NOT_AVAILABLE): retry those for a while.
    settle_until = time.monotonic() + 10.0
    with RawConnection(bootstrap) as conn:
        while True:
            response = conn.call(1, version, fetch_request(version, topic, partition, offset))
            (t,) = response.responses
            (p,) = t.partitions
            code = int(p.error_code)
            if code in _RETRIABLE_FETCH_ERRORS and time.monotonic() < settle_until:
                time.sleep(0.1)
                continue
            if code:
                raise RuntimeError(f"fetch {topic}/{partition}: error {code}")
            batches, _tail = split_batches(p.records or b"")
            if not batches:
                if offset >= int(p.high_watermark):
                    return out
                # Tansu's S3 storage answers some offsets below the high watermark with no
                # records for a while, and leaves offset gaps after a restart: retry, then
                # step over the gap.
                empty += 1
                if empty > 20:
                    offset += 1
                    empty = 0
                else:
                    time.sleep(0.05)
                continue
            empty = 0
            for b in batches:
                if b.header.is_control:
                    continue
                base = b.header.base_offset
                # A fetch may answer with a batch that starts before the requested offset.
                out.extend(r for r in decode_records(b) if base + r.offset_delta >= offset)
            last = batches[-1].header
            offset = last.base_offset + last.last_offset_delta + 1


# ---------------------------------------------------------------- connection
class RawConnection:
    """A blocking socket speaking Kafka framing; responses are matched by correlation id."""

    def __init__(self, bootstrap: str, timeout: float = 10.0) -> None:
        host, port = bootstrap.rsplit(":", 1)
        self.sock = socket.create_connection((host, int(port)), timeout=timeout)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._next = 1
        self._buf = b""

    def next_id(self) -> int:
        cid = self._next
        self._next += 1
        return cid

    def send_raw(self, data: bytes) -> None:
        self.sock.sendall(data)

    def send(self, api_key: int, version: int, entity: Any) -> int:
        cid = self.next_id()
        self.sock.sendall(request_bytes(api_key, version, entity, cid))
        return cid

    def read_frame(self) -> bytes:
        """The next response frame body; ConnectionError if the peer closed."""
        while True:
            if len(self._buf) >= 4:
                (size,) = _SIZE.unpack_from(self._buf, 0)
                if len(self._buf) >= 4 + size:
                    body, self._buf = self._buf[4 : 4 + size], self._buf[4 + size :]
                    return body
            chunk = self.sock.recv(1 << 16)
            if not chunk:
                raise ConnectionError("connection closed by peer")
            self._buf += chunk

    def read_response(self, api_key: int, version: int) -> tuple[int, Any]:
        """(correlation id, decoded body) of the next response."""
        body = self.read_frame()
        (cid,) = _SIZE.unpack_from(body, 0)
        size = response_header_size(body, api_key, version)
        return cid, decode_response(api_key, version, body[size:])

    def call(self, api_key: int, version: int, entity: Any) -> Any:
        cid = self.send(api_key, version, entity)
        got, response = self.read_response(api_key, version)
        if got != cid:
            raise AssertionError(f"correlation id {got} answers request {cid}")
        return response

    def closed_by_peer(self, wait: float = 5.0) -> bool:
        """Whether the peer closes the connection within `wait` seconds (drains any data)."""
        self.sock.settimeout(wait)
        deadline = time.monotonic() + wait
        try:
            while time.monotonic() < deadline:
                if not self.sock.recv(1 << 16):
                    return True
        except (ConnectionResetError, BrokenPipeError):
            return True
        except TimeoutError:
            return False
        return False

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass

    def __enter__(self) -> RawConnection:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
