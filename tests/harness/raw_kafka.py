"""Raw Kafka frames over TCP, and what a black-box test can see of a proxy process.

Black-box tests of the proxy's core (tests/e2e/test_core_holes.py) talk to it the way a
misbehaving client would: whole request frames written on a plain socket, pipelined or not,
read back or not. They judge the proxy only from outside: its answers, when it closes a
connection, its `/metrics` text and the resident memory of its process.
"""

from __future__ import annotations

import datetime
import re
import socket
import struct
import time
import urllib.request
from typing import Any

import psutil

from sluice.codec import entities, schemas
from sluice.codec.headers import request_header_bytes
from sluice.codec.messages import ApiKey, encode_request
from sluice.codec.records import BatchHeader, Record, build_batch

_SIZE = struct.Struct(">i")


def request_frame(
    api_key: int, version: int, correlation_id: int, client_id: str = "hole-test", **fields: Any
) -> bytes:
    """A whole request frame (size prefix included); fields the version lacks are ignored and
    required ones not given get neutral values."""
    body = request_header_bytes(api_key, version, correlation_id, client_id)
    body += encode_request(entities.build(schemas.request_schema(api_key, version), **fields))
    return _SIZE.pack(len(body)) + body


def header_only_frame(api_key: int, version: int, correlation_id: int) -> bytes:
    """A request frame holding only a v1 header (null client id): all an unknown (api key,
    version) pair needs to reach the proxy's routing."""
    body = struct.pack(">hhih", api_key, version, correlation_id, -1)
    return _SIZE.pack(len(body)) + body


def metadata_frame(correlation_id: int, topics: list[str] | None = None, version: int = 4) -> bytes:
    """Metadata for `topics` (none by default: the cheapest request the broker answers)."""
    cls = schemas.request_schema(ApiKey.METADATA, version)
    tcls = entities.element_class(cls, "topics")
    return request_frame(
        ApiKey.METADATA,
        version,
        correlation_id,
        topics=tuple(entities.build(tcls, name=t) for t in topics or ()),
        allow_auto_topic_creation=False,
    )


def fetch_frame(
    correlation_id: int,
    topic: str,
    offset: int = 0,
    max_wait_ms: int = 500,
    partition_max_bytes: int = 1 << 20,
    version: int = 12,
) -> bytes:
    """Fetch partition 0 of `topic` by name (v4..v12 name topics; v13+ use ids)."""
    cls = schemas.request_schema(ApiKey.FETCH, version)
    tcls = entities.element_class(cls, "topics")
    pcls = entities.element_class(tcls, "partitions")
    part = entities.build(
        pcls,
        partition=0,
        current_leader_epoch=-1,
        fetch_offset=offset,
        last_fetched_epoch=-1,
        log_start_offset=-1,
        partition_max_bytes=partition_max_bytes,
    )
    return request_frame(
        ApiKey.FETCH,
        version,
        correlation_id,
        replica_id=-1,
        max_wait=datetime.timedelta(milliseconds=max_wait_ms),
        min_bytes=1,
        max_bytes=64 << 20,
        isolation_level=0,
        session_id=0,
        session_epoch=-1,
        topics=(entities.build(tcls, topic=topic, partitions=(part,)),),
        forgotten_topics_data=(),
        rack_id="",
    )


def records_batch(values: list[bytes], codec: int = 0) -> bytes:
    """One non-idempotent magic-2 batch holding `values`, compressed with `codec`."""
    now = int(time.time() * 1000)
    n = len(values)
    return build_batch(
        BatchHeader(0, 0, -1, 2, 0, codec, n - 1, now, now, -1, -1, -1, n),
        [Record(0, i, None, v, []) for i, v in enumerate(values)],
    )


def produce_frame(
    correlation_id: int, topic: str, values: list[bytes], acks: int = -1, version: int = 9,
    codec: int = 0,
) -> bytes:
    """Produce `values` as one batch (compressed with `codec`) to partition 0 of `topic`."""
    cls = schemas.request_schema(ApiKey.PRODUCE, version)
    tcls = entities.element_class(cls, "topic_data")
    pcls = entities.element_class(tcls, "partition_data")
    part = entities.build(pcls, index=0, records=records_batch(values, codec))
    return request_frame(
        ApiKey.PRODUCE,
        version,
        correlation_id,
        transactional_id=None,
        acks=acks,
        timeout=datetime.timedelta(seconds=10),
        topic_data=(entities.build(tcls, name=topic, partition_data=(part,)),),
    )


def recv_exact(sock: socket.socket, n: int) -> bytes | None:
    """Exactly `n` bytes, or None if the peer closes first."""
    chunks = []
    while n:
        chunk = sock.recv(min(n, 1 << 20))
        if not chunk:
            return None
        chunks.append(chunk)
        n -= len(chunk)
    return b"".join(chunks)


def recv_frame(sock: socket.socket) -> bytes | None:
    """One response frame body (correlation id first), or None if the peer closed."""
    head = recv_exact(sock, 4)
    if head is None:
        return None
    (size,) = _SIZE.unpack(head)
    return recv_exact(sock, size)


def correlation_id(body: bytes) -> int:
    return int(_SIZE.unpack_from(body, 0)[0])


def closed_by_peer(sock: socket.socket, within: float) -> bool:
    """True if the peer closes `sock` within `within` seconds (whatever it sends first)."""
    deadline = time.monotonic() + within
    try:
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            sock.settimeout(left)
            if not sock.recv(65536):
                return True
    except TimeoutError:
        return False
    except ConnectionError:
        return True


def connect(port: int, timeout: float = 10.0) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def exchange_one(port: int, frame: bytes, timeout: float = 10.0) -> tuple[bytes, float]:
    """Send one request on a new connection; (response body, seconds from send to answer)."""
    with connect(port, timeout) as sock:
        start = time.monotonic()
        sock.sendall(frame)
        body = recv_frame(sock)
        elapsed = time.monotonic() - start
    assert body is not None, "the proxy closed the connection instead of answering"
    return body, elapsed


# ------------------------------------------------------------------ the process from outside


def process_rss(pid: int) -> int:
    """Resident bytes of a process and its children (`sluice serve --workers` forks)."""
    proc = psutil.Process(pid)
    total = proc.memory_info().rss
    for child in proc.children(recursive=True):
        try:
            total += child.memory_info().rss
        except psutil.NoSuchProcess:
            pass
    return total


def scrape(metrics_port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10) as resp:
        return str(resp.read().decode("utf-8"))


def series(text: str, name: str) -> list[str]:
    """The sample lines of metric `name` (exactly that name, any labels)."""
    pattern = re.compile(rf"^{re.escape(name)}(\{{|\s)")
    return [line for line in text.splitlines() if pattern.match(line)]


def sample_value(text: str, name: str) -> float:
    """Sum of the samples of metric `name` (0 when it has none)."""
    return sum(float(line.rsplit(" ", 1)[1]) for line in series(text, name))


def p99(samples: list[float]) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]
