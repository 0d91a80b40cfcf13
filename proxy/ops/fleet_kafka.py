"""The fleet topic's Kafka IO on confluent-kafka: create, read from the start, write one record.

The filter fleet (fleet.py) and `sluice filter ...` use these. They run librdkafka's blocking
calls on one thread per client (`_Worker`), so the proxy's event loop never waits on the
cluster, and every call of one client is serialised (librdkafka's consumer must not be closed
while a `consume` runs). Connections are secured by the settings of
`proxy/net/kafka_settings.py` (the config file's `upstream_tls:` and `upstream_sasl:`).

The topic's partitions come from a Metadata request for all topics (a null topic list, never
an empty one, which Kafka answers with no topic). Errors are `FleetKafkaError`; an authentication or
authorisation failure is `FleetAccessError`, whose message names the user, the resource and
what to grant (docs/SECURITY.md, "The proxy's own connections"), and never a secret.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections.abc import Callable, Mapping
from typing import Any, Final, TypeVar

from confluent_kafka import (
    OFFSET_BEGINNING,
    Consumer,
    KafkaError,
    KafkaException,
    Message,
    Producer,
    TopicCollection,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient, NewTopic

from sluice.proxy.net.kafka_settings import describe

T = TypeVar("T")

#: Broker error codes that no retry will cure: wrong credentials or a missing ACL.
_ACCESS_ERRORS: Final = frozenset({
    KafkaError.TOPIC_AUTHORIZATION_FAILED,
    KafkaError.GROUP_AUTHORIZATION_FAILED,
    KafkaError.CLUSTER_AUTHORIZATION_FAILED,
    KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
    KafkaError.SASL_AUTHENTICATION_FAILED,
    KafkaError._AUTHENTICATION,
    KafkaError.TOPIC_AUTHORIZATION_FAILED,
})
_EXISTS: Final = KafkaError.TOPIC_ALREADY_EXISTS
#: Longest a reader's call may take (its own timeouts are at most 10 s).
CALL_DEADLINE_SECONDS: Final = 15.0
#: The group id confluent-kafka insists on. The fleet's readers assign partitions and never
#: join nor commit, but librdkafka still asks for the group's coordinator (FindCoordinator),
#: so the proxy's user needs Describe on this group (docs/SECURITY.md) and nothing more.
READER_GROUP: Final = "sluice-fleet-reader"
_UNKNOWN: Final = KafkaError.UNKNOWN_TOPIC_OR_PART


class FleetKafkaError(Exception):
    """The fleet topic could not be read or written (names the Kafka error, no secret)."""


class FleetAccessError(FleetKafkaError):
    """The cluster refused the proxy's user: bad credentials or a missing ACL."""


def _error(err: KafkaError, what: str, settings: Mapping[str, Any]) -> FleetKafkaError:
    text = f"{what}: {err.str()} ({err.name()}); connected {describe(settings)}"
    if err.code() in _ACCESS_ERRORS:
        return FleetAccessError(text + " — see docs/SECURITY.md, \"The proxy's own "
                                       "connections\", for the ACLs it needs")
    return FleetKafkaError(text)


def _from_exception(exc: KafkaException, what: str,
                    settings: Mapping[str, Any]) -> FleetKafkaError:
    err = exc.args[0] if exc.args else None
    if isinstance(err, KafkaError):
        return _error(err, what, settings)
    return FleetKafkaError(f"{what}: {exc}")


class _Worker:
    """One thread for one librdkafka client; `run` awaits a blocking call on it."""

    def __init__(self, name: str) -> None:
        self._pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix=name)
        #: A call did not come back: the client is abandoned (closed when it does).
        self.stuck = False
        #: The last error librdkafka reported through `error_cb` (e.g. SASL refused).
        self.last_error: KafkaError | None = None

    def on_error(self, err: KafkaError) -> None:
        self.last_error = err

    async def run(self, fn: Callable[..., T], *args: Any,
                  deadline: float = CALL_DEADLINE_SECONDS) -> T:
        """`fn(*args)` on the client's thread. A call that outlives every timeout it was given
        (a broker that never answers: Tansu, a Fetch for a topic just deleted) is given up
        on, so the follower opens a fresh client instead of waiting forever."""
        future = asyncio.get_running_loop().run_in_executor(self._pool, fn, *args)
        try:
            return await asyncio.wait_for(asyncio.shield(future), deadline)
        except TimeoutError:
            self.stuck = True
            raise FleetKafkaError(f"the Kafka client got no answer in {deadline:.0f} s") from None

    def shutdown(self) -> None:
        self._pool.shutdown(wait=False)

    def close_later(self, close: Callable[[], Any]) -> None:
        """Close a stuck client on its own thread once its call returns, without waiting."""
        self._pool.submit(close)
        self._pool.shutdown(wait=False)


def _base(bootstrap: str, settings: Mapping[str, Any], client_id: str,
          worker: _Worker) -> dict[str, Any]:
    return {"bootstrap.servers": bootstrap, "client.id": client_id, **settings,
            # librdkafka would print every failed connect on stderr; errors reach the caller.
            "log_level": 0, "error_cb": worker.on_error}


def _fatal_client_error(worker: _Worker, what: str, settings: Mapping[str, Any]) -> None:
    """Raise what `error_cb` saw if it is an authentication failure (retrying cannot help)."""
    err = worker.last_error
    if err is not None and err.code() in _ACCESS_ERRORS:
        raise _error(err, what, settings)


def _partitions(client: Any, topic: str, timeout: float, worker: _Worker,
                settings: Mapping[str, Any], serve: bool = False) -> list[int] | None:
    """The topic's partition ids (None: no such topic).

    From a Metadata request for all topics (librdkafka sends a null list, which Kafka answers
    with every topic the user may describe; an empty list would get none): naming the topic
    instead could have a broker auto-create it, and Tansu never answers one for a topic just
    deleted. `serve`: the client may be polled (nothing assigned) to learn why it failed."""
    try:
        metadata = client.list_topics(timeout=timeout)
    except KafkaException as exc:
        if serve:
            # librdkafka reports a refused SASL exchange through error_cb, served by poll.
            client.poll(0.1)
        _fatal_client_error(worker, f"fleet topic {topic!r}", settings)
        raise _from_exception(exc, f"metadata of fleet topic {topic!r}", settings) from None
    entry = metadata.topics.get(topic)
    if entry is None:
        return None
    if entry.error is not None:
        if entry.error.code() == _UNKNOWN:
            return None
        raise _error(entry.error, f"fleet topic {topic!r}", settings)
    if not entry.partitions:
        return None
    return sorted(entry.partitions)


class FleetAdmin:
    """Creates the fleet topic (compacted, one partition, the brokers' replication factor)."""

    def __init__(self, bootstrap: str, settings: Mapping[str, Any], client_id: str) -> None:
        self.settings = dict(settings)
        self._worker = _Worker("fleet-admin")
        self._admin = AdminClient(_base(bootstrap, settings, client_id, self._worker))

    async def ensure_topic(self, topic: str, configs: Mapping[str, str],
                           timeout: float) -> bool:
        try:
            return await self._worker.run(self._ensure, topic, dict(configs), timeout,
                                          deadline=2 * timeout + 15)
        finally:
            self._worker.shutdown()

    def _exists(self, topic: str, timeout: float) -> bool:
        # DescribeTopics, not `list_topics(topic)`: librdkafka's Metadata request for a named
        # topic lets a broker with auto.create.topics.enable create it, uncompacted.
        future = self._admin.describe_topics(TopicCollection([topic]),
                                             request_timeout=timeout)[topic]
        try:
            future.result(timeout=timeout + 5)
        except KafkaException as exc:
            err = exc.args[0] if exc.args else None
            if isinstance(err, KafkaError) and err.code() == _UNKNOWN:
                return False
            self._admin.poll(0.1)  # error_cb learns why (a refused SASL exchange)
            _fatal_client_error(self._worker, f"fleet topic {topic!r}", self.settings)
            raise _from_exception(exc, f"fleet topic {topic!r}", self.settings) from None
        except concurrent.futures.TimeoutError:
            raise FleetKafkaError(f"fleet topic {topic!r}: no answer in "
                                  f"{timeout:.0f} s") from None
        return True

    def _ensure(self, topic: str, configs: dict[str, str], timeout: float) -> bool:
        if self._exists(topic, timeout):
            return False
        future = self._admin.create_topics(
            [NewTopic(topic, num_partitions=1, replication_factor=-1, config=configs)],
            request_timeout=timeout)[topic]
        try:
            future.result(timeout=timeout + 5)
        except KafkaException as exc:
            err = exc.args[0] if exc.args else None
            if isinstance(err, KafkaError) and err.code() == _EXISTS:
                return False  # another proxy or deploy won the race
            raise _from_exception(exc, f"cannot create fleet topic {topic!r}",
                                  self.settings) from None
        except concurrent.futures.TimeoutError:
            raise FleetKafkaError(f"cannot create fleet topic {topic!r}: no answer in "
                                  f"{timeout:.0f} s") from None
        return True


class FleetReader:
    """Reads every partition of the fleet topic from its beginning (no consumer group)."""

    def __init__(self, bootstrap: str, topic: str, settings: Mapping[str, Any],
                 client_id: str, wait_ms: int, max_record_bytes: int) -> None:
        self.topic = topic
        self.settings = dict(settings)
        self._worker = _Worker("fleet-read")
        fetch_max = max_record_bytes * 4
        self._consumer = Consumer({
            **_base(bootstrap, settings, client_id, self._worker),
            "group.id": READER_GROUP,
            "enable.auto.commit": False, "enable.auto.offset.store": False,
            "auto.offset.reset": "earliest", "fetch.wait.max.ms": wait_ms,
            "max.partition.fetch.bytes": max_record_bytes * 2, "fetch.max.bytes": fetch_max,
            "receive.message.max.bytes": fetch_max + 65536,
        })
        self.partitions: list[int] = []
        self._seen: dict[int, int] = {}

    async def assign_all(self, timeout: float = 10.0) -> list[int] | None:
        """Assign every partition from its beginning; None when the topic does not exist."""
        return await self._worker.run(self._assign_all, timeout)

    def _assign_all(self, timeout: float) -> list[int] | None:
        parts = _partitions(self._consumer, self.topic, timeout, self._worker, self.settings,
                            serve=not self.partitions)
        if parts is None:
            return None
        self._consumer.assign([TopicPartition(self.topic, p, OFFSET_BEGINNING) for p in parts])
        self.partitions = parts
        self._seen = {}
        return parts

    async def exists(self, timeout: float = 10.0) -> bool:
        parts = await self._worker.run(_partitions, self._consumer, self.topic, timeout,
                                       self._worker, self.settings)
        return parts is not None

    async def offsets(self, timeout: float = 10.0) -> tuple[dict[int, int], dict[int, int]]:
        """(first offset, end offset) by partition, asked of the leaders now."""
        return await self._worker.run(self._offsets, timeout)

    def _offsets(self, timeout: float) -> tuple[dict[int, int], dict[int, int]]:
        begin: dict[int, int] = {}
        end: dict[int, int] = {}
        for p in self.partitions:
            try:
                low, high = self._consumer.get_watermark_offsets(
                    TopicPartition(self.topic, p), timeout=timeout, cached=False)
            except KafkaException as exc:
                _fatal_client_error(self._worker, f"fleet topic {self.topic!r}", self.settings)
                raise _from_exception(exc, f"offsets of fleet topic {self.topic!r} "
                                           f"partition {p}", self.settings) from None
            begin[p], end[p] = int(low), int(high)
        return begin, end

    async def poll(self, timeout_ms: int) -> list[tuple[bytes | None, bytes | None, int, int]]:
        """The records fetched within `timeout_ms`: (key, value, partition, offset)."""
        messages = await self._worker.run(self._consume, timeout_ms / 1000)
        records = []
        for m in messages:
            err = m.error()
            if err is not None:
                if err.code() == KafkaError._PARTITION_EOF:
                    continue
                raise _error(err, f"reading fleet topic {self.topic!r}", self.settings)
            partition, offset = int(m.partition() or 0), int(m.offset() or 0)
            self._seen[partition] = max(self._seen.get(partition, 0), offset + 1)
            records.append((m.key(), m.value(), partition, offset))
        return records

    def _consume(self, timeout: float) -> list[Message]:
        messages: list[Message] = self._consumer.consume(num_messages=500, timeout=timeout)
        if not messages:
            _fatal_client_error(self._worker, f"fleet topic {self.topic!r}", self.settings)
        return messages

    async def caught_up(self, end: Mapping[int, int]) -> bool:
        """Whether every partition has been read up to `end` (compaction may leave gaps)."""
        positions = await self._worker.run(
            self._consumer.position, [TopicPartition(self.topic, p) for p in end])
        for tp in positions:
            at = max(int(tp.offset), self._seen.get(tp.partition, -1))
            if at < end[tp.partition]:
                return False
        return True

    async def close(self) -> None:
        if self._worker.stuck:
            self._worker.close_later(self._consumer.close)
            return
        try:
            await self._worker.run(self._consumer.close)
        finally:
            self._worker.shutdown()


class FleetWriter:
    """Writes records to the fleet topic with acks=all; one librdkafka producer."""

    def __init__(self, bootstrap: str, settings: Mapping[str, Any], client_id: str,
                 max_record_bytes: int) -> None:
        self.settings = dict(settings)
        self._worker = _Worker("fleet-write")
        self._producer = Producer({
            **_base(bootstrap, settings, client_id, self._worker),
            "acks": "all", "compression.type": "gzip", "linger.ms": 0,
            "message.max.bytes": max_record_bytes + 65536,
        })

    async def send(self, topic: str, key: bytes, value: bytes | None,
                   timeout: float) -> tuple[int, int]:
        """Write one record (None = tombstone) and wait for the acknowledgement."""
        return await self._worker.run(self._send, topic, key, value, timeout,
                                      deadline=timeout + 10)

    def _send(self, topic: str, key: bytes, value: bytes | None,
              timeout: float) -> tuple[int, int]:
        outcome: list[tuple[KafkaError | None, Message]] = []
        try:
            self._producer.produce(topic, key=key, value=value,
                                   on_delivery=lambda err, msg: outcome.append((err, msg)))
        except KafkaException as exc:
            raise _from_exception(exc, f"writing fleet topic {topic!r}", self.settings) from None
        except BufferError:
            raise FleetKafkaError(f"writing fleet topic {topic!r}: the producer queue is "
                                  "full") from None
        self._producer.flush(timeout)
        if not outcome:
            _fatal_client_error(self._worker, f"writing fleet topic {topic!r}", self.settings)
            # Drop the record rather than let it go out late, after the caller gave up.
            self._producer.purge(in_queue=True, in_flight=False)
            self._producer.flush(0)
            raise FleetKafkaError(f"writing fleet topic {topic!r}: no acknowledgement in "
                                  f"{timeout:.0f} s")
        err, msg = outcome[0]
        if err is not None:
            raise _error(err, f"writing fleet topic {topic!r}", self.settings)
        return int(msg.partition() or 0), int(msg.offset() or 0)

    async def close(self, timeout: float = 5.0) -> None:
        try:
            await self._worker.run(self._producer.flush, timeout, deadline=timeout + 10)
        finally:
            self._worker.shutdown()
