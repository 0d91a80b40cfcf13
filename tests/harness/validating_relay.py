"""A TCP relay between the proxy and a broker that checks every produced batch like Apache Kafka.

Tansu stores batches that Apache Kafka's broker would refuse (wrong CRC, a record count that
does not match the last offset delta, several batches per partition, sequence gaps). So the
filter tests run Tansu with ``--advertised-listener-url`` pointing at this relay: every
connection after bootstrap (the proxy's, the proxy's own dead-letter producer, direct clients)
passes through it, and every Produce request is decoded with ``sluice.codec`` and validated the
way Kafka's ``LogValidator`` and ``ProducerAppendInfo`` do. Violations are recorded, not
enforced: the bytes are relayed unchanged, and tests assert that the list stays empty.

Checks per partition of a Produce request (v3+): exactly one whole batch and no trailing bytes,
magic 2, base offset 0, CRC32C valid, a known compression codec, no control batch,
``record_count == last_offset_delta + 1``, records that decode to exactly ``record_count``
entries with offset deltas 0..n-1 in order, ``max_timestamp`` equal to the largest record
timestamp (CreateTime), a producer id when the batch is transactional. Per (producer id,
topic, partition): within an epoch the next batch must start at the previous batch's
``base_sequence + record_count`` (a retry of one of the last five batches is a duplicate and
fine), a new epoch starts at sequence 0, an older epoch is fenced.

In front of Apache Kafka (`RelayedKafka`), whose advertised listener cannot point at the relay,
the relay rewrites every broker endpoint in the responses (Metadata, FindCoordinator,
DescribeCluster, KIP-951 node endpoints) to its own address, so that every connection after
bootstrap still passes through it. There the relay's checks name a bad batch early and clearly;
Kafka refuses it on its own as well.
"""

from __future__ import annotations

import asyncio
import datetime
import socket
import struct
import threading
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from sluice.codec.compression import decompress
from sluice.codec.endpoints import carries_endpoints, rewrite_endpoints
from sluice.codec.errors import CodecError
from sluice.codec.frames import FrameBuffer
from sluice.codec.headers import parse_request_header, response_header_size
from sluice.codec.messages import ApiKey, decode_request, decode_response, encode_response
from sluice.codec.records import (
    HEADER_SIZE,
    BatchHeader,
    RawBatch,
    decode_records,
    split_batches,
    verify_crc,
)

_RECENT_BATCHES = 5  # Kafka keeps the metadata of the last five batches per producer
_MAGIC_OFFSET = 16


@dataclass(frozen=True, slots=True)
class Violation:
    topic: str
    partition: int
    message: str

    def __str__(self) -> str:
        return f"{self.topic}[{self.partition}]: {self.message}"


@dataclass(frozen=True, slots=True)
class SeenBatch:
    """A batch the relay forwarded to the broker (for tests that inspect what was sent)."""

    topic: str
    partition: int
    header: BatchHeader
    api_version: int


@dataclass(frozen=True, slots=True)
class BrokerAnswer:
    """The broker's answer for one partition of a Produce request the relay forwarded."""

    topic: str
    partition: int
    error_code: int
    base_offset: int


@dataclass(slots=True)
class _ProducerState:
    epoch: int
    last_seq: int
    recent: deque[tuple[int, int]] = field(default_factory=lambda: deque(maxlen=_RECENT_BATCHES))


def _read_varint(buf: bytes | memoryview, pos: int) -> tuple[int, int]:
    shift = 0
    raw = 0
    while True:
        if pos >= len(buf):
            raise ValueError("varint runs past the end of the records")
        byte = buf[pos]
        pos += 1
        raw |= (byte & 0x7F) << shift
        if not byte & 0x80:
            break
        shift += 7
        if shift > 63:
            raise ValueError("varint too long")
    return (raw >> 1) ^ -(raw & 1), pos


def _walk_records(plain: bytes | memoryview) -> list[tuple[int, int]]:
    """(offset_delta, timestamp_delta) of each record, parsed independently of sluice.codec.

    Like Kafka's DefaultRecordBatch iterator, the records section must be consumed exactly:
    leftover bytes or a record running past the end are errors.
    """
    out: list[tuple[int, int]] = []
    pos = 0
    while pos < len(plain):
        length, pos = _read_varint(plain, pos)
        end = pos + length
        if length < 0 or end > len(plain):
            raise ValueError(f"record {len(out)} declares {length} bytes past the end")
        _attributes = plain[pos]
        ts_delta, p = _read_varint(plain, pos + 1)
        off_delta, p = _read_varint(plain, p)
        if p > end:
            raise ValueError(f"record {len(out)} header runs past its length")
        out.append((off_delta, ts_delta))
        pos = end
    return out


class BatchValidator:
    """Kafka's broker-side checks of Produce requests, with per-producer sequence state."""

    def __init__(self) -> None:
        self.violations: list[Violation] = []
        self.batches: list[SeenBatch] = []
        self.answers: list[BrokerAnswer] = []
        self.topics_seen: set[str] = set()  # every topic named in a forwarded Produce
        self.produce_requests = 0
        self._producers: dict[tuple[int, str, int], _ProducerState] = {}
        self._lock = threading.Lock()

    # Called from the relay thread; tests read the lists from theirs.
    def check_produce(self, api_version: int, body: bytes | memoryview) -> None:
        try:
            request = decode_request(ApiKey.PRODUCE, api_version, body)
        except CodecError as exc:
            self._fail("?", -1, f"Produce v{api_version} request does not decode: {exc}")
            return
        with self._lock:
            self.produce_requests += 1
        for topic in request.topic_data:
            name = getattr(topic, "name", None) or str(getattr(topic, "topic_id", "?"))
            with self._lock:
                self.topics_seen.add(name)
            for part in topic.partition_data:
                self._check_partition(api_version, name, int(part.index), part.records)

    def _fail(self, topic: str, partition: int, message: str) -> None:
        with self._lock:
            self.violations.append(Violation(topic, partition, message))

    def _check_partition(
        self, api_version: int, topic: str, partition: int, records: bytes | None
    ) -> None:
        if not records:
            self._fail(topic, partition, "partition without records")
            return
        if len(records) > _MAGIC_OFFSET and records[_MAGIC_OFFSET] != 2:
            self._fail(topic, partition, f"magic {records[_MAGIC_OFFSET]} (Kafka 3+ wants 2)")
            return
        try:
            batches, tail = split_batches(records)
        except CodecError as exc:
            self._fail(topic, partition, f"records do not split into batches: {exc}")
            return
        if len(tail):
            self._fail(topic, partition, f"{len(tail)} trailing bytes after the last batch")
        if api_version >= 3 and len(batches) != 1:
            self._fail(
                topic, partition, f"{len(batches)} batches (Produce v3+ needs exactly one)"
            )
        for batch in batches:
            if self._check_batch(topic, partition, batch):
                with self._lock:
                    self.batches.append(SeenBatch(topic, partition, batch.header, api_version))

    def _check_batch(self, topic: str, partition: int, batch: RawBatch) -> bool:
        h = batch.header
        before = len(self.violations)

        def fail(message: str) -> None:
            self._fail(topic, partition, message)

        if h.magic != 2:
            fail(f"magic {h.magic}")
            return False
        if h.base_offset != 0:
            fail(f"base offset {h.base_offset} (a producer must send 0)")
        if not verify_crc(batch.data):
            fail("CRC32C mismatch")
        if h.is_control:
            fail("control batch from a client")
        if h.is_transactional and not h.has_producer_id:
            fail("transactional batch without a producer id")
        if h.record_count != h.last_offset_delta + 1:
            fail(
                f"record count {h.record_count} != last offset delta {h.last_offset_delta} + 1 "
                "(Inconsistent batch offset range)"
            )
        if h.compression > 4:
            fail(f"unknown compression codec {h.compression}")
            return False
        try:
            plain = decompress(h.compression, batch.data[HEADER_SIZE:])
            walked = _walk_records(plain)
            decoded = decode_records(batch)
        except (CodecError, ValueError, IndexError) as exc:
            fail(f"records do not decode: {exc}")
            return False
        if len(walked) != h.record_count or len(decoded) != h.record_count:
            fail(f"batch declares {h.record_count} records but holds {len(walked)}")
        deltas = [d for d, _ts in walked]
        if deltas != list(range(len(walked))):
            fail(f"offset deltas {deltas[:10]}... are not 0..n-1 in order")
        if walked and h.timestamp_type == 0:
            newest = h.base_timestamp + max(ts for _d, ts in walked)
            if h.max_timestamp != newest:
                fail(f"max timestamp {h.max_timestamp} != newest record timestamp {newest}")
        if h.has_producer_id and (h.base_sequence < 0 or h.producer_epoch < 0):
            fail(
                f"producer id {h.producer_id} with epoch {h.producer_epoch} and base sequence "
                f"{h.base_sequence} (an idempotent batch needs both)"
            )
        elif h.has_producer_id:
            self._check_sequence(topic, partition, h)
        return len(self.violations) == before

    def _check_sequence(self, topic: str, partition: int, h: BatchHeader) -> None:
        key = (h.producer_id, topic, partition)
        first, last = h.base_sequence, h.base_sequence + h.last_offset_delta
        with self._lock:
            state = self._producers.get(key)
            if state is None:
                # Kafka accepts any first sequence from a producer id it has no state for.
                self._producers[key] = _ProducerState(h.producer_epoch, last)
                self._producers[key].recent.append((first, last))
                return
            if h.producer_epoch == state.epoch and (first, last) in state.recent:
                return  # a retry of a batch the broker already has: answered as a duplicate
            if h.producer_epoch < state.epoch:
                message = f"producer {h.producer_id} epoch {h.producer_epoch} is fenced"
            elif h.producer_epoch > state.epoch:
                message = "" if first == 0 else (
                    f"producer {h.producer_id} new epoch {h.producer_epoch} starts at sequence "
                    f"{first}, not 0 (OUT_OF_ORDER_SEQUENCE_NUMBER)"
                )
            else:
                message = "" if first == state.last_seq + 1 else (
                    f"producer {h.producer_id} epoch {h.producer_epoch}: sequence {first} after "
                    f"{state.last_seq} (OUT_OF_ORDER_SEQUENCE_NUMBER)"
                )
            if message:
                self.violations.append(Violation(topic, partition, message))
                return
            if h.producer_epoch > state.epoch:
                state.epoch = h.producer_epoch
                state.recent.clear()
            state.last_seq = last
            state.recent.append((first, last))

    def check_frame(self, frame: bytes | memoryview) -> tuple[int, int] | None:
        """Check one request frame body (without its size prefix) if it is a Produce; returns
        (correlation id, version) of a Produce, so that its response can be noted."""
        try:
            header = parse_request_header(frame)
        except CodecError:
            return None  # not ours to judge; the broker answers garbage itself
        if header.api_key != ApiKey.PRODUCE:
            return None
        self.check_produce(header.api_version, frame[header.header_size :])
        return header.correlation_id, header.api_version

    def note_response(self, api_version: int, frame: bytes | memoryview) -> None:
        """Record the broker's per-partition answers to a forwarded Produce."""
        try:
            response = produce_response(api_version, bytes(frame))
        except CodecError as exc:
            self._fail("?", -1, f"Produce v{api_version} response does not decode: {exc}")
            return
        with self._lock:
            for topic in response.responses:
                name = getattr(topic, "name", None) or str(getattr(topic, "topic_id", "?"))
                for p in topic.partition_responses:
                    self.answers.append(
                        BrokerAnswer(name, int(p.index), int(p.error_code), int(p.base_offset))
                    )

    def answers_for(self, topic: str) -> list[BrokerAnswer]:
        with self._lock:
            return [a for a in self.answers if a.topic == topic]

    def snapshot(self) -> list[Violation]:
        with self._lock:
            return list(self.violations)

    def batches_for(self, topic: str) -> list[SeenBatch]:
        with self._lock:
            return [b for b in self.batches if b.topic == topic]


class ValidatingRelay:
    """Relays 127.0.0.1:`port` to the broker at 127.0.0.1:`target_port`, validating Produce.

    Bind first (`port` is known after construction), start the broker advertising that port,
    then `start()`. Runs its own event loop in a daemon thread.
    """

    def __init__(self, target_port: int = 0, rewrite_addresses: bool = False) -> None:
        self.target_port = target_port
        # True in front of a broker that advertises itself: its endpoints become the relay's.
        self.rewrite_addresses = rewrite_addresses
        self.validator = BatchValidator()
        self.connections = 0
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind(("127.0.0.1", 0))
        self.port = int(self._sock.getsockname()[1])
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._stopped: asyncio.Event | None = None
        self._ready = threading.Event()

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def violations(self) -> list[Violation]:
        return self.validator.snapshot()

    def assert_clean(self) -> None:
        found = self.violations
        assert not found, "batches Apache Kafka would refuse:\n" + "\n".join(map(str, found))

    def start(self) -> ValidatingRelay:
        if not self.target_port:
            raise ValueError("target_port must be set before start()")
        self._thread = threading.Thread(target=self._run, name="validating-relay", daemon=True)
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("validating relay did not start")
        return self

    def stop(self) -> None:
        loop, thread = self._loop, self._thread
        if loop is not None and self._stopped is not None and thread is not None:
            loop.call_soon_threadsafe(self._stopped.set)
            thread.join(10)
        self._thread = None
        self._sock.close()

    def __enter__(self) -> ValidatingRelay:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _run(self) -> None:
        asyncio.run(self._main())

    async def _main(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stopped = asyncio.Event()
        tasks: set[asyncio.Task[None]] = set()

        async def on_client(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            task = asyncio.current_task()
            assert task is not None
            tasks.add(task)
            try:
                await self._relay(reader, writer)
            finally:
                tasks.discard(task)

        server = await asyncio.start_server(on_client, sock=self._sock)
        self._ready.set()
        await self._stopped.wait()
        server.close()
        for task in list(tasks):
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _relay(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target_port)
        except OSError:
            writer.close()
            return

        produces: dict[int, int] = {}  # correlation id -> Produce version awaiting an answer
        # correlation id -> (api key, version) of a request whose response carries endpoints
        addressed: dict[int, tuple[int, int]] = {}

        async def requests() -> None:
            frames = FrameBuffer()
            while data := await reader.read(256 * 1024):
                for body in frames.feed(data):
                    produce = self.validator.check_frame(bytes(body))
                    if produce is not None:
                        produces[produce[0]] = produce[1]
                    if self.rewrite_addresses:
                        self._note_addressed(bytes(body), addressed)
                up_writer.write(data)
                await up_writer.drain()

        async def responses() -> None:
            frames = FrameBuffer()
            while data := await up_reader.read(256 * 1024):
                out = bytearray()
                for body in frames.feed(data):
                    (correlation_id,) = struct.unpack_from(">i", body)
                    version = produces.pop(correlation_id, None)
                    if version is not None:
                        self.validator.note_response(version, body)
                    request = addressed.pop(correlation_id, None)
                    frame = bytes(body) if request is None else self._rewritten(request, body)
                    out += struct.pack(">i", len(frame)) + frame
                if not self.rewrite_addresses:
                    out = bytearray(data)  # byte for byte, partial frames included
                if out:
                    writer.write(out)
                    await writer.drain()

        pumps = [asyncio.create_task(requests()), asyncio.create_task(responses())]
        try:
            await asyncio.wait(pumps, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in pumps:
                task.cancel()
            await asyncio.gather(*pumps, return_exceptions=True)
            for w in (writer, up_writer):
                w.close()

    @staticmethod
    def _note_addressed(frame: bytes, addressed: dict[int, tuple[int, int]]) -> None:
        try:
            header = parse_request_header(frame)
        except CodecError:
            return
        if carries_endpoints(header.api_key, header.api_version):
            addressed[header.correlation_id] = (header.api_key, header.api_version)

    def _rewritten(self, request: tuple[int, int], frame: bytes | memoryview) -> bytes:
        """The response with every broker endpoint pointing at this relay (one broker behind)."""
        api_key, version = request
        size = response_header_size(frame, api_key, version)
        response = decode_response(api_key, version, frame[size:])

        def here(node_id: int, host: str, port: int) -> tuple[str, int]:
            return "127.0.0.1", self.port

        rewritten = rewrite_endpoints(response, api_key, version, here)
        if rewritten is response:
            return bytes(frame)
        return bytes(frame[:size]) + encode_response(rewritten)


def produce_frame(
    correlation_id: int,
    version: int,
    parts: Mapping[tuple[str, int], bytes],
    acks: int = -1,
    client_id: str = "relay-test",
) -> bytes:
    """A whole Produce request frame (size prefix included): `parts` maps (topic, partition)
    to the records bytes sent as they are, topics in first-seen order."""
    from sluice.codec import entities, schemas
    from sluice.codec.headers import request_header_bytes
    from sluice.codec.messages import encode_request

    cls = schemas.request_schema(ApiKey.PRODUCE, version)
    tcls = entities.element_class(cls, "topic_data")
    pcls = entities.element_class(tcls, "partition_data")
    by_topic: dict[str, list[Any]] = {}
    for (topic, partition), records in parts.items():
        by_topic.setdefault(topic, []).append(
            entities.build(pcls, index=partition, records=records)
        )
    request: Any = entities.build(
        cls,
        transactional_id=None,
        acks=acks,
        timeout=datetime.timedelta(seconds=10),
        topic_data=tuple(
            entities.build(tcls, name=topic, partition_data=tuple(ps))
            for topic, ps in by_topic.items()
        ),
    )
    body = request_header_bytes(ApiKey.PRODUCE, version, correlation_id, client_id)
    body += encode_request(request)
    return struct.pack(">i", len(body)) + body


class RelayedKafka:
    """The session's Apache Kafka node behind a ValidatingRelay that rewrites the node's
    endpoints to its own: every connection after bootstrap passes through the relay, and Kafka
    checks the forwarded batches itself as well. The relay is this object's; the node is
    shared with the session (unique topic names)."""

    def __init__(self, kafka_port: int) -> None:
        self.relay = ValidatingRelay(target_port=kafka_port, rewrite_addresses=True)

    @property
    def bootstrap(self) -> str:
        """The relay's address: use it as the proxy's upstream and for direct clients."""
        return self.relay.address

    def start(self) -> RelayedKafka:
        self.relay.start()
        return self

    def stop(self) -> None:
        self.relay.stop()

    def __enter__(self) -> RelayedKafka:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


class RelayedBroker:
    """A Tansu broker that advertises a ValidatingRelay: every connection after bootstrap (and
    bootstrap too, through `bootstrap`) passes through the relay."""

    def __init__(self) -> None:
        from tests.harness.broker import TansuBroker
        from tests.harness.ports import free_port

        self.relay = ValidatingRelay()
        self.broker = TansuBroker(port=free_port(), advertised_port=self.relay.port)
        self.relay.target_port = self.broker.port

    @property
    def bootstrap(self) -> str:
        """The relay's address: use it as the proxy's upstream and for direct clients."""
        return self.relay.address

    def start(self) -> RelayedBroker:
        self.relay.start()
        try:
            self.broker.start()
        except Exception:
            self.relay.stop()
            raise
        return self

    def stop(self) -> None:
        self.broker.stop()
        self.relay.stop()

    def __enter__(self) -> RelayedBroker:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def exchange(
    address: str, frames: list[bytes], timeout: float = 15.0, replies: int | None = None
) -> list[bytes]:
    """Send whole request frames over one plain TCP connection; return the response bodies
    (without size prefix). By default one request, one response, in turn; with `replies`,
    all frames are sent first and that many responses read (for acks=0 requests, which get
    none). A closed connection ends the list early."""
    host, port = address.rsplit(":", 1)
    out: list[bytes] = []
    with socket.create_connection((host, int(port)), timeout=timeout) as sock:
        if replies is not None:
            sock.sendall(b"".join(frames))
        for frame in frames if replies is None else range(replies):
            if isinstance(frame, bytes):
                sock.sendall(frame)
            size_bytes = _recv_exact(sock, 4)
            if size_bytes is None:
                return out
            (size,) = struct.unpack(">i", size_bytes)
            body = _recv_exact(sock, size)
            if body is None:
                return out
            out.append(body)
    return out


def _recv_exact(sock: socket.socket, n: int) -> bytes | None:
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            return None
        buf += chunk
    return bytes(buf)


def produce_response(version: int, body: bytes) -> Any:
    """Decode a Produce response body (header included) of `version`."""
    from sluice.codec.headers import response_header_size
    from sluice.codec.messages import decode_response

    size = response_header_size(body, ApiKey.PRODUCE, version)
    return decode_response(ApiKey.PRODUCE, version, body[size:])


@dataclass(frozen=True, slots=True)
class StoredRecord:
    offset: int
    key: bytes | None
    value: bytes | None
    headers: list[tuple[str, bytes | None]]


def fetch_batches(
    address: str, topic: str, partition: int, offset: int, version: int = 11
) -> list[RawBatch]:
    """The whole batches of one raw Fetch of `topic`[`partition`] from `offset` (the broker may
    include batches that start before it). CRCs are checked (as the Java consumer does)."""
    from sluice.codec import entities, schemas
    from sluice.codec.headers import request_header_bytes, response_header_size
    from sluice.codec.messages import decode_response, encode_request

    cls = schemas.request_schema(ApiKey.FETCH, version)
    tcls = entities.element_class(cls, "topics")
    pcls = entities.element_class(tcls, "partitions")
    request = entities.build(
        cls,
        replica_id=-1,
        max_wait=datetime.timedelta(milliseconds=200),
        min_bytes=1,
        max_bytes=64 * 1024 * 1024,
        isolation_level=0,
        session_id=0,
        session_epoch=-1,
        topics=(
            entities.build(
                tcls,
                topic=topic,
                partitions=(
                    entities.build(
                        pcls,
                        partition=partition,
                        current_leader_epoch=-1,
                        fetch_offset=offset,
                        log_start_offset=-1,
                        partition_max_bytes=16 * 1024 * 1024,
                    ),
                ),
            ),
        ),
        rack_id="",
    )
    body = request_header_bytes(ApiKey.FETCH, version, 1, "relay-test") + encode_request(request)
    (raw,) = exchange(address, [struct.pack(">i", len(body)) + body])
    size = response_header_size(raw, ApiKey.FETCH, version)
    response = decode_response(ApiKey.FETCH, version, raw[size:])
    found = [p for t in response.responses for p in t.partitions]
    if not found:
        return []  # Tansu answers an empty partition with no partition at all
    part = found[0]
    if int(part.error_code) != 0:
        raise RuntimeError(f"fetch {topic}[{partition}]@{offset}: error {part.error_code}")
    batches, _tail = split_batches(part.records or b"")
    for batch in batches:
        if not verify_crc(batch.data):
            raise RuntimeError(f"fetch {topic}[{partition}]: batch at {batch.header.base_offset} "
                               "has a wrong CRC")
    return batches


def fetch_stored(address: str, topic: str, partitions: int) -> dict[int, list[StoredRecord]]:
    """Every record stored in `topic`'s partitions, read with raw Fetch requests from offset
    0 until the broker returns no more batches (one short wait at the end of each partition;
    no reliance on ListOffsets, whose high watermark Tansu reports per batch, not per record)."""
    out: dict[int, list[StoredRecord]] = {}
    for partition in range(partitions):
        records: list[StoredRecord] = []
        offset = 0
        while True:
            batches = [
                b
                for b in fetch_batches(address, topic, partition, offset)
                if b.header.next_offset > offset
            ]
            if not batches:
                break
            for batch in batches:
                if batch.header.is_control:
                    continue
                for r in decode_records(batch):
                    at = batch.header.base_offset + r.offset_delta
                    if at >= offset:
                        records.append(StoredRecord(at, r.key, r.value, list(r.headers)))
            offset = batches[-1].header.next_offset
        out[partition] = records
    return out


Relayed = RelayedKafka | RelayedBroker


def relayed(broker: object) -> Relayed:
    """A validating relay in front of the e2e `broker` fixture's node: the session's Kafka node
    (`KafkaEndpoint`), or a Tansu of its own advertising the relay (SLUICE_E2E_BROKER=tansu)."""
    from tests.harness.kafka_endpoint import KafkaEndpoint

    if isinstance(broker, KafkaEndpoint):
        return RelayedKafka(broker.port)
    return RelayedBroker()
