"""Producing dead letters: records a filter failed on, sent to the filter's dead-letter topic.

Runs off the client data path in one background task per proxy, as a small Kafka producer:

* **Connections**: one per broker, opened by the `UpstreamDialer` (so `upstream_tls:` and
  `upstream_sasl:` apply) and reused for every flush; a broken one is dropped and dialled again
  after a back-off (100 ms doubling to 5 s). Metadata goes over a connection already open.
* **Partitioning**: Metadata is cached per topic (partition count, leader of each partition) for
  five minutes, and refreshed at once after NOT_LEADER/UNKNOWN_TOPIC-type errors. A keyed letter
  goes where Kafka's default partitioner puts the key (murmur2, `codec/partitioner.py`); keyless
  letters stick to one partition per flush, the next flush moving on (round-robin).
* **Requests**: one Produce per leader per flush, one batch per partition, acks=all, at most
  `_FLUSH_BYTES` of letters per flush so a batch stays under the broker's default message size.
  Retriable errors and unreachable brokers are retried until a letter has waited
  `delivery_timeout` (120 s, as the Java producer's delivery.timeout.ms); other broker errors
  count as failed at once.
* **Memory**: letters waiting (queued or being sent) are bounded in bytes
  (`dead_letters.max_queued_bytes`); a letter over the bound is dropped and counted.
* **Shutdown**: `close()` tries a final flush for `dead_letters.shutdown_timeout_seconds`; the
  letters still unsent then are counted as lost and logged (`dead_letters_lost_at_shutdown`).

Counters (`produced`, `failed`, `dropped`, `lost_at_shutdown`; `stats()`) are for metrics. Each
record carries headers naming the filter and the reason (set by the filter chain). Payloads are
never logged; failures never reach a client connection.
"""

from __future__ import annotations

import asyncio
import datetime
import itertools
import time
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from sluice.codec import entities, schemas
from sluice.codec.error_codes import ErrorCode
from sluice.codec.messages import ApiKey
from sluice.codec.partitioner import partition_for_key
from sluice.codec.records import BatchHeader, Record, build_batch
from sluice.proxy.contract import UpstreamError
from sluice.proxy.net.upstream_client import UpstreamConnection, UpstreamDialer
from sluice.proxy.ops.config import (
    DEFAULT_DEAD_LETTER_QUEUE_BYTES,
    DEFAULT_DEAD_LETTER_SHUTDOWN_TIMEOUT,
    ProxyConfig,
)
from sluice.proxy.telemetry.logs import log

if TYPE_CHECKING:
    from sluice.filters.chain import DeadLetter

Address = tuple[str, int]

_NETWORK_TIMEOUT = 15.0  # seconds to wait for the broker's answer
_PRODUCE_TIMEOUT = datetime.timedelta(seconds=10)  # Produce's own replication timeout
_FLUSH_BYTES = 900 * 1024  # under the broker's default message.max.bytes (1 MiB) per batch
_DELIVERY_TIMEOUT = 120.0  # seconds a letter may wait for the broker before it counts as failed
_METADATA_MAX_AGE = 300.0  # seconds, as the Java client's metadata.max.age.ms
_BACKOFF_FIRST, _BACKOFF_MAX = 0.1, 5.0
_BACKOFF_CLOSING = 0.5  # longest pause between attempts once close() waits for the queue
_LETTER_OVERHEAD = 64  # bytes held per letter besides its key, value and headers
_LOG_EVERY = 1.0  # seconds between two `dead_letter_dropped` lines under a flood


def letter_size(letter: DeadLetter) -> int:
    """Bytes a queued letter holds, as counted against `max_queued_bytes`."""
    size = _LETTER_OVERHEAD + len(letter.topic) + len(letter.key or b"") + len(letter.value or b"")
    for name, value in letter.headers:
        size += len(name) + len(value or b"")
    return size


@dataclass(slots=True)
class _Queued:
    letter: DeadLetter
    size: int
    queued_at: float  # time.monotonic() when submitted
    settled: bool = False  # produced, failed or requeued in the flush that took it


@dataclass(slots=True)
class _TopicMeta:
    partitions: int
    leaders: dict[int, int]  # partition -> leader node id (partitions with a leader only)
    fetched: float


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


def _retriable(code: Any) -> bool:
    # Decoded error codes are the codec's ErrorCode enum, which knows Kafka's retriable flag.
    return bool(getattr(code, "retriable", False))


class DeadLetterWriter:
    """Produces dead letters in the background; `submit` never blocks (event-loop thread)."""

    def __init__(
        self,
        dialer: UpstreamDialer,
        *,
        max_queued_bytes: int = DEFAULT_DEAD_LETTER_QUEUE_BYTES,
        shutdown_timeout: float = DEFAULT_DEAD_LETTER_SHUTDOWN_TIMEOUT,
        delivery_timeout: float = _DELIVERY_TIMEOUT,
    ) -> None:
        self._dialer = dialer
        self.delivery_timeout = delivery_timeout
        self.max_queued_bytes = max_queued_bytes
        self.shutdown_timeout = shutdown_timeout
        self._queue: deque[_Queued] = deque()
        self._held_bytes = 0  # queued or being sent
        self._inflight = 0  # letters taken from the queue and not yet resolved
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._closing = False
        self._close_requested = asyncio.Event()  # cuts a back-off short for the final flush
        self._closed = False
        self._conns: dict[Address, UpstreamConnection] = {}
        self._brokers: dict[int, Address] = {}
        self._topics: dict[str, _TopicMeta] = {}
        self._round_robin: dict[str, itertools.count[int]] = {}
        self._backoff = 0.0
        self._drop_logged = 0.0
        self.produced = 0
        self.failed = 0
        self.dropped = 0
        self.lost_at_shutdown = 0
        self.connections_opened = 0
        self.produce_requests = 0

    @classmethod
    def from_config(cls, config: ProxyConfig) -> DeadLetterWriter:
        """A writer that dials as `config` says, bounded as its `dead_letters:` section says."""
        return cls(
            UpstreamDialer(config),
            max_queued_bytes=config.dead_letters.max_queued_bytes,
            shutdown_timeout=config.dead_letters.shutdown_timeout,
        )

    # ------------------------------------------------------------------ the caller's side
    @property
    def queued(self) -> int:
        """Letters accepted and not yet produced, failed or lost."""
        return len(self._queue) + self._inflight

    @property
    def queued_bytes(self) -> int:
        return self._held_bytes

    def stats(self) -> dict[str, int]:
        return {
            "produced": self.produced,
            "failed": self.failed,
            "dropped": self.dropped,
            "lost_at_shutdown": self.lost_at_shutdown,
            "queued": self.queued,
            "queued_bytes": self._held_bytes,
        }

    def submit(self, letters: Iterable[DeadLetter]) -> None:
        """Queue letters for the broker; over `max_queued_bytes` a letter is dropped (counted).

        Call from the event loop's thread; it never waits."""
        accepted = 0
        now = time.monotonic()
        for letter in letters:
            size = letter_size(letter)
            if self._closing:
                self.lost_at_shutdown += 1
                continue
            if self._held_bytes + size > self.max_queued_bytes:
                self._dropped(letter.topic, size)
                continue
            self._queue.append(_Queued(letter, size, now))
            self._held_bytes += size
            accepted += 1
        if accepted:
            if self._task is None:
                self._task = asyncio.get_running_loop().create_task(self._run())
            self._wake.set()

    def _dropped(self, topic: str, size: int) -> None:
        self.dropped += 1
        now = time.monotonic()
        if now - self._drop_logged >= _LOG_EVERY:
            self._drop_logged = now
            log.error(
                "dead_letter_dropped",
                reason="queue_full",
                topic=topic,
                letter_bytes=size,
                queued_bytes=self._held_bytes,
                max_queued_bytes=self.max_queued_bytes,
                dropped_total=self.dropped,
            )

    async def close(self, timeout: float | None = None) -> None:
        """Flush what is queued for at most `timeout` seconds (default: the configured
        shutdown timeout), then count and log what is left, and close the connections."""
        if self._closed:
            return
        self._closing = True
        self._close_requested.set()
        self._wake.set()
        task = self._task
        if task is not None:
            wait = self.shutdown_timeout if timeout is None else timeout
            try:
                await asyncio.wait_for(asyncio.shield(task), wait)
            except TimeoutError:
                pass
            except Exception:  # the task logs its own failures; counting below still holds
                pass
            if not task.done():
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
        lost = self.queued
        self._queue.clear()
        self._inflight = 0
        self._held_bytes = 0
        self.lost_at_shutdown += lost
        if self.lost_at_shutdown:
            log.error(
                "dead_letters_lost_at_shutdown",
                count=self.lost_at_shutdown,
                produced=self.produced,
                failed=self.failed,
                dropped=self.dropped,
            )
        for conn in self._conns.values():
            await conn.close()
        self._conns.clear()
        self._closed = True

    # ------------------------------------------------------------------ the background task
    async def _run(self) -> None:
        while True:
            if not self._queue:
                if self._closing:
                    return
                self._wake.clear()
                await self._wake.wait()
                continue
            if self._backoff:
                await self._pause()
            items = self._take()
            try:
                retry = await self._flush(items)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                # Whatever goes wrong, this task must live on for the next dead letters.
                unsettled = [i for i in items if not i.settled]
                log.error("dead_letter_failed", records=len(unsettled), error=repr(exc))
                self._resolve(unsettled, failed=True)
                retry = False
            self._backoff = (
                min(_BACKOFF_MAX, max(_BACKOFF_FIRST, self._backoff * 2)) if retry else 0.0
            )

    async def _pause(self) -> None:
        """Back off after a failed attempt; close() ends the pause for one more try, and the
        pauses after it are short so the final flush fits its timeout."""
        if self._closing:
            await asyncio.sleep(min(self._backoff, _BACKOFF_CLOSING))
            return
        try:
            await asyncio.wait_for(self._close_requested.wait(), self._backoff)
        except TimeoutError:
            pass

    def _take(self) -> list[_Queued]:
        items: list[_Queued] = []
        size = 0
        while self._queue and (not items or size + self._queue[0].size <= _FLUSH_BYTES):
            item = self._queue.popleft()
            item.settled = False
            items.append(item)
            size += item.size
        self._inflight += len(items)
        return items

    def _resolve(self, items: list[_Queued], failed: bool) -> None:
        for item in items:
            item.settled = True
        self._inflight -= len(items)
        self._held_bytes -= sum(i.size for i in items)
        if failed:
            self.failed += len(items)
        else:
            self.produced += len(items)

    def _requeue(self, items: list[_Queued], reason: str) -> None:
        """Put letters back at the front (order kept), or fail those out of time."""
        self._inflight -= len(items)
        again: list[_Queued] = []
        expired = time.monotonic() - self.delivery_timeout
        for item in items:
            item.settled = True
            if item.queued_at <= expired:
                self._held_bytes -= item.size
                self.failed += 1
            else:
                again.append(item)
        if len(again) < len(items):
            log.error(
                "dead_letter_failed",
                topic=items[0].letter.topic,
                records=len(items) - len(again),
                waited_seconds=self.delivery_timeout,
                error=reason,
            )
        self._queue.extendleft(reversed(again))

    async def _flush(self, items: list[_Queued]) -> bool:
        """Send `items`, one Produce per leader; True if some must be retried (back off)."""
        try:
            refused = await self._ensure_metadata({i.letter.topic for i in items})
        except (TimeoutError, OSError, UpstreamError) as exc:
            log.warning(
                "dead_letter_broker_unreachable",
                broker="bootstrap" if not self._conns else "any",
                records=len(items),
                error=repr(exc),
            )
            self._requeue(items, f"metadata: {exc!r}")
            return True
        retry = False
        plan: dict[int, dict[str, dict[int, list[_Queued]]]] = {}
        sticky: dict[str, int] = {}
        for topic, code in refused.items():
            gone = [i for i in items if i.letter.topic == topic]
            log.error(
                "dead_letter_failed",
                topic=topic,
                records=len(gone),
                error=f"metadata: broker error {code} ({_code_name(code)})",
            )
            self._resolve(gone, failed=True)
        for item in items:
            if item.letter.topic in refused:
                continue
            place = self._place(item, sticky)
            if place is None:
                self._requeue([item], f"no leader known for a partition of {item.letter.topic!r}")
                retry = True
                continue
            leader, partition = place
            plan.setdefault(leader, {}).setdefault(item.letter.topic, {}).setdefault(
                partition, []
            ).append(item)
        for leader, topics in plan.items():
            retry |= await self._send(leader, topics)
        return retry

    def _place(self, item: _Queued, sticky: dict[str, int]) -> tuple[int, int] | None:
        """(leader node, partition) for a letter, or None while the topic is not ready."""
        topic = item.letter.topic
        meta = self._topics.get(topic)
        if meta is None or meta.partitions <= 0:
            return None
        if item.letter.key is not None:
            partition = partition_for_key(item.letter.key, meta.partitions)
        else:
            partition = sticky.get(topic, -1)
            if partition < 0:
                available = sorted(meta.leaders) or list(range(meta.partitions))
                turn = next(self._round_robin.setdefault(topic, itertools.count()))
                partition = sticky[topic] = available[turn % len(available)]
        leader = meta.leaders.get(partition)
        if leader is None or leader not in self._brokers:
            self._topics.pop(topic, None)  # ask again next time
            return None
        return leader, partition

    async def _send(self, leader: int, topics: dict[str, dict[int, list[_Queued]]]) -> bool:
        everything = [i for parts in topics.values() for items in parts.values() for i in items]
        address = self._brokers[leader]
        try:
            conn = await self._connection(address)
            version = conn.pick_version(ApiKey.PRODUCE, ceiling=12)
            self.produce_requests += 1
            response = await conn.request(
                ApiKey.PRODUCE,
                version,
                _NETWORK_TIMEOUT,
                transactional_id=None,
                acks=-1,
                timeout=_PRODUCE_TIMEOUT,
                topic_data=self._topic_data(version, topics),
            )
        except (TimeoutError, OSError, UpstreamError) as exc:
            await self._drop_connection(address)
            log.warning(
                "dead_letter_broker_unreachable",
                broker="{}:{}".format(*address),
                records=len(everything),
                error=repr(exc),
            )
            self._requeue(everything, repr(exc))
            return True
        answered: set[tuple[str, int]] = set()
        retry = False
        for t in response.responses:
            for p in t.partition_responses:
                key = (str(t.name), int(p.index))
                items = topics.get(key[0], {}).get(key[1])
                if items is None or key in answered:
                    continue
                answered.add(key)
                code = p.error_code
                if int(code) == 0:
                    self._resolve(items, failed=False)
                elif _retriable(code):
                    self._topics.pop(key[0], None)  # leaders may have moved: ask again
                    self._requeue(items, f"broker error {int(code)}")
                    retry = True
                else:
                    log.error(
                        "dead_letter_failed",
                        topic=key[0],
                        partition=key[1],
                        records=len(items),
                        error=f"broker error {int(code)}",
                    )
                    self._resolve(items, failed=True)
        for topic, parts in topics.items():
            for partition, items in parts.items():
                if (topic, partition) not in answered:
                    self._requeue(items, "no answer for the partition")
                    retry = True
        return retry

    @staticmethod
    def _topic_data(version: int, topics: dict[str, dict[int, list[_Queued]]]) -> tuple[Any, ...]:
        cls = schemas.request_schema(ApiKey.PRODUCE, version)
        tcls = entities.element_class(cls, "topic_data")
        pcls = entities.element_class(tcls, "partition_data")
        return tuple(
            entities.build(
                tcls,
                name=topic,
                partition_data=tuple(
                    entities.build(pcls, index=p, records=_batch([i.letter for i in items]))
                    for p, items in parts.items()
                ),
            )
            for topic, parts in topics.items()
        )

    # ------------------------------------------------------------------ connections, metadata
    async def _connection(self, address: Address) -> UpstreamConnection:
        conn = self._conns.get(address)
        if conn is not None and not conn.closed and not conn.expired:
            return conn
        if conn is not None:
            await self._drop_connection(address)
        conn = await self._dialer.connect(*address)
        self.connections_opened += 1
        self._conns[address] = conn
        return conn

    async def _any_connection(self) -> UpstreamConnection:
        for address, conn in list(self._conns.items()):
            if not conn.closed and not conn.expired:
                return conn
            await self._drop_connection(address)
        conn = await self._dialer.connect()
        self.connections_opened += 1
        self._conns[conn.address] = conn
        return conn

    async def _drop_connection(self, address: Address) -> None:
        conn = self._conns.pop(address, None)
        if conn is not None:
            await conn.close()

    async def _ensure_metadata(self, topics: set[str]) -> dict[str, int]:
        """Refresh the cache for `topics` where missing or old; returns the topics the broker
        refused with a non-retriable error (e.g. TOPIC_AUTHORIZATION_FAILED), by error code."""
        now = time.monotonic()
        stale = sorted(
            t
            for t in topics
            if t not in self._topics or now - self._topics[t].fetched > _METADATA_MAX_AGE
        )
        if not stale:
            return {}
        conn = await self._any_connection()
        try:
            response = await self._metadata(conn, stale)
        except (TimeoutError, OSError, UpstreamError):
            await self._drop_connection(conn.address)
            raise
        self._brokers.update(
            {int(b.node_id): (str(b.host), int(b.port)) for b in response.brokers}
        )
        refused: dict[str, int] = {}
        for t in response.topics:
            name = str(t.name)
            if int(t.error_code) != 0:
                # Retriable (LEADER_NOT_AVAILABLE just after auto-creation...): no entry, so
                # the letters are requeued and the topic asked for again.
                self._topics.pop(name, None)
                if not _retriable(t.error_code):
                    refused[name] = int(t.error_code)
                continue
            leaders = {
                int(p.partition_index): int(p.leader_id)
                for p in t.partitions
                if int(p.leader_id) >= 0
            }
            self._topics[name] = _TopicMeta(len(t.partitions), leaders, now)
        return refused

    @staticmethod
    async def _metadata(conn: UpstreamConnection, topics: list[str]) -> Any:
        version = conn.pick_version(ApiKey.METADATA, ceiling=12)
        cls = schemas.request_schema(ApiKey.METADATA, version)
        tcls = entities.element_class(cls, "topics")
        return await conn.request(
            ApiKey.METADATA,
            version,
            _NETWORK_TIMEOUT,
            topics=tuple(entities.build(tcls, name=t) for t in topics),
            allow_auto_topic_creation=True,
        )


def _code_name(code: int) -> str:
    """TOPIC_AUTHORIZATION_FAILED for 29: what the operator looks up (a missing ACL...)."""
    try:
        return ErrorCode(code).name
    except ValueError:
        return "unknown error code"
