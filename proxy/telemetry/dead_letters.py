"""Producing dead letters: records a filter failed on, sent to the filter's dead-letter topic.

Runs off the client data path in one background task per proxy. Each record carries headers
naming the filter and the reason (set by the filter chain). Failures are counted and logged
(without payloads), never raised into a client connection.
"""

from __future__ import annotations

import asyncio
import datetime
import time
import typing
from collections import defaultdict
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, Protocol

from sluice.codec.messages import ApiKey
from sluice.codec.records import BatchHeader, Record, build_batch
from sluice.proxy.net.upstream_client import UpstreamConnection, UpstreamError
from sluice.proxy.ops.config import ProxyConfig
from sluice.proxy.telemetry.logs import log

if TYPE_CHECKING:
    from sluice.filters.chain import DeadLetter


class _Upstream(Protocol):
    """Where dead letters go: the proxy's config and its TLS settings towards brokers."""

    config: ProxyConfig

    def upstream_tls_args(self, host: str) -> dict[str, Any]: ...

_QUEUE_LIMIT = 100_000
_NETWORK_TIMEOUT = 15.0  # seconds to wait for the broker's answer
_PRODUCE_TIMEOUT = datetime.timedelta(seconds=10)  # Produce's own replication timeout


def _optional_tuple_element(cls: type[Any], field_name: str) -> type[Any]:
    """Element class of a nullable array field (Metadata's `topics` is
    `tuple[MetadataRequestTopic, ...] | None`, which entities.element_class does not unwrap)."""
    for arg in typing.get_args(typing.get_type_hints(cls)[field_name]):
        if typing.get_origin(arg) is tuple:
            return typing.cast(type[Any], typing.get_args(arg)[0])
    from sluice.codec import entities

    return entities.element_class(cls, field_name)


def _batch(letters: list[DeadLetter]) -> bytes:
    now = int(time.time() * 1000)
    records = [
        Record(offset_delta=i, timestamp_delta=0, key=d.key, value=d.value, headers=list(d.headers))
        for i, d in enumerate(letters)
    ]
    header = BatchHeader(
        base_offset=0,
        batch_length=0,
        partition_leader_epoch=-1,
        magic=2,
        crc=0,
        attributes=0,
        last_offset_delta=len(records) - 1,
        base_timestamp=now,
        max_timestamp=now,
        producer_id=-1,
        producer_epoch=-1,
        base_sequence=-1,
        record_count=len(records),
    )
    return build_batch(header, records)


class DeadLetterWriter:
    def __init__(self, server: _Upstream) -> None:
        self._server = server
        self._queue: asyncio.Queue[DeadLetter] | None = None
        self._task: asyncio.Task[None] | None = None
        self.produced = 0
        self.failed = 0
        self.dropped = 0

    def submit(self, letters: Iterable[DeadLetter]) -> None:
        if self._queue is None:
            self._queue = asyncio.Queue(_QUEUE_LIMIT)
            self._task = asyncio.get_running_loop().create_task(self._run())
        for letter in letters:
            try:
                self._queue.put_nowait(letter)
            except asyncio.QueueFull:
                self.dropped += 1
                log.error("dead_letter_queue_full", topic=letter.topic, dropped=self.dropped)

    async def _run(self) -> None:
        assert self._queue is not None
        while True:
            first = await self._queue.get()
            pending = [first]
            while not self._queue.empty() and len(pending) < 1000:
                pending.append(self._queue.get_nowait())
            by_topic: dict[str, list[DeadLetter]] = defaultdict(list)
            for letter in pending:
                by_topic[letter.topic].append(letter)
            for topic, letters in by_topic.items():
                try:
                    await self._produce(topic, letters)
                    self.produced += len(letters)
                except asyncio.CancelledError:
                    raise
                except Exception as exc:
                    # Whatever goes wrong, this task must live on for the next dead letters.
                    self.failed += len(letters)
                    log.error(
                        "dead_letter_failed", topic=topic, records=len(letters), error=repr(exc)
                    )

    async def _produce(self, topic: str, letters: list[DeadLetter]) -> None:
        server = self._server
        host, port = server.config.upstream[0]
        conn = await UpstreamConnection.open(host, port, **server.upstream_tls_args(host))
        try:
            leader = await self._leader(conn, topic)
        finally:
            await conn.close()
        conn = await UpstreamConnection.open(*leader, **server.upstream_tls_args(leader[0]))
        try:
            version = conn.pick_version(ApiKey.PRODUCE, ceiling=12)
            response = await conn.request(
                ApiKey.PRODUCE,
                version,
                _NETWORK_TIMEOUT,
                transactional_id=None,
                acks=-1,
                timeout=_PRODUCE_TIMEOUT,
                topic_data=(self._topic_data(version, topic, _batch(letters)),),
            )
        finally:
            await conn.close()
        for t in response.responses:
            for p in t.partition_responses:
                if int(p.error_code) != 0:
                    raise UpstreamError(f"broker error {int(p.error_code)} producing to {topic}")

    @staticmethod
    def _topic_data(version: int, topic: str, records: bytes) -> Any:
        from sluice.codec import entities, schemas

        cls = schemas.request_schema(ApiKey.PRODUCE, version)
        tcls = entities.element_class(cls, "topic_data")
        pcls = entities.element_class(tcls, "partition_data")
        return entities.build(
            tcls, name=topic, partition_data=(entities.build(pcls, index=0, records=records),)
        )

    @staticmethod
    async def _leader(conn: UpstreamConnection, topic: str) -> tuple[str, int]:
        from sluice.codec import entities, schemas

        version = conn.pick_version(ApiKey.METADATA, ceiling=12)
        cls = schemas.request_schema(ApiKey.METADATA, version)
        tcls = _optional_tuple_element(cls, "topics")
        response = await conn.request(
            ApiKey.METADATA,
            version,
            topics=(entities.build(tcls, name=topic),),
            allow_auto_topic_creation=True,
        )
        brokers = {int(b.node_id): (b.host, int(b.port)) for b in response.brokers}
        for t in response.topics:
            for p in t.partitions:
                if int(p.partition_index) == 0 and int(p.leader_id) in brokers:
                    return brokers[int(p.leader_id)]
        raise UpstreamError(
            f"dead-letter topic {topic!r} has no leader for partition 0 (does it exist?)"
        )

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except (asyncio.CancelledError, Exception):
                pass
