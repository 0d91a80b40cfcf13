"""Running one transform in a thread: a consumer-group member that reads its input partitions,
runs the filter chain per partition batch and writes the output topic.

Two guarantees (docs/TRANSFORMS.md has the contract and the measurements):

* **exactly-once**: one transactional producer per assigned input partition (transactional id
  ``<group>.<topic>.<partition>``). Each batch is one transaction holding the output records,
  the dead letters and the input offset (AddOffsetsToTxn/TxnOffsetCommit); it commits or
  aborts as a whole. Whoever gets the partition next initialises the same transactional id,
  which fences the previous owner and aborts its open transaction.
* **at-least-once**: one idempotent producer; a batch's records are flushed, then its input
  offsets are committed. A crash between the two re-processes that batch: the duplicate
  window is one consume batch (at most ``batch_records`` records, over all the partitions the
  crashed process owned) per crash or failed offset commit.

Batches never span a rebalance: the loop is synchronous, so a partition is revoked only
between batches, after their commit.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any, Final, cast

from confluent_kafka import (
    TIMESTAMP_NOT_AVAILABLE,
    Consumer,
    KafkaError,
    KafkaException,
    Message,
    Producer,
    TopicPartition,
)

from sluice.filters.chain import FilterChain
from sluice.filters.context import Header
from sluice.proxy import telemetry
from sluice.proxy.telemetry.logs import log
from sluice.transforms.config import TransformSpec
from sluice.transforms.process import BatchOutcome, InputRecord, process_batch
from sluice.transforms.progress import PartitionProgress, TransformStatus

EXACTLY_ONCE: Final = "exactly-once"
AT_LEAST_ONCE: Final = "at-least-once"
_TIMEOUT: Final = 30.0  # seconds for a flush, a transaction step or a commit
_POLL: Final = 0.2
_LAG_EVERY: Final = 0.25
_TOPIC_RETRY: Final = 2.0  # seconds between checks for a missing topic
_ERR_PARTITION_EOF: Final = KafkaError._PARTITION_EOF


class TransformError(RuntimeError):
    """A transform cannot start (missing topic, broker unreachable, ...)."""


@dataclass(slots=True)
class _Deliveries:
    """Delivery reports of one batch: output offsets per partition, and failures."""

    output: str
    ranges: dict[int, list[int]] = field(default_factory=dict)  # partition -> [first, last, n]
    errors: list[str] = field(default_factory=list)

    def __call__(self, err: KafkaError | None, msg: Message) -> None:
        if err is not None:
            self.errors.append(f"{msg.topic()}: {err.str()}")
            return
        partition, offset = msg.partition(), msg.offset()
        if msg.topic() != self.output or partition is None or offset is None:
            return
        slot = self.ranges.get(partition)
        if slot is None:
            self.ranges[partition] = [offset, offset, 1]
        else:
            slot[0] = min(slot[0], offset)
            slot[1] = max(slot[1], offset)
            slot[2] += 1

    def outputs(self) -> list[dict[str, int]]:
        return [{"partition": p, "offset_first": r[0], "offset_last": r[1], "records": r[2]}
                for p, r in sorted(self.ranges.items())]


def client_settings(spec: TransformSpec, bootstrap: str) -> dict[str, Any]:
    """Settings shared by the transform's consumer and producers."""
    return {"bootstrap.servers": bootstrap, "client.id": f"sluice-transform-{spec.name}",
            **spec.client_config}


def broker_supports_transactions(spec: TransformSpec, bootstrap: str,
                                 timeout: float = 10.0) -> bool:
    """Whether the broker completes InitProducerId for a transactional id (``auto``)."""
    producer = Producer({**client_settings(spec, bootstrap),
                         "transactional.id": f"{spec.group}.probe"})
    try:
        producer.init_transactions(timeout)
        return True
    except KafkaException as exc:
        log.warning("transform_transactions_unavailable", transform=spec.name,
                    error=exc.args[0].str())
        return False
    finally:
        producer.flush(1)


class TransformRunner:
    """One transform in one thread. `start()`, then `stop()`; `status` is safe to read."""

    def __init__(self, spec: TransformSpec, chain: FilterChain, bootstrap: str, guarantee: str,
                 *, sink: telemetry.TelemetrySink | None = None,
                 info: telemetry.ProxyInfo | None = None,
                 session_timeout_ms: int = 6000) -> None:
        if guarantee not in (EXACTLY_ONCE, AT_LEAST_ONCE):
            raise ValueError(f"guarantee must be resolved, got {guarantee!r}")
        self.spec = spec
        self.chain = chain
        self.bootstrap = bootstrap
        self.guarantee = guarantee
        self.sink = sink
        self.info = info or telemetry.proxy_info()
        self.status = TransformStatus(spec.name, guarantee=guarantee)
        self._session_timeout_ms = session_timeout_ms
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._consumer: Consumer | None = None
        self._producer: Producer | None = None  # at-least-once
        self._txn: dict[tuple[str, int], Producer] = {}  # exactly-once, per input partition
        self._fenced: set[tuple[str, int]] = set()
        self._committed: dict[tuple[str, int], int] = {}
        self._input_counts: dict[str, int] = {}
        self._output_count = 0
        self._client_id = f"sluice-transform:{spec.name}"

    # ------------------------------------------------------------------ lifecycle
    def check_topics(self, timeout: float = 10.0) -> None:
        """Learn partition counts; TransformError names a missing topic."""
        probe = Consumer({**client_settings(self.spec, self.bootstrap),
                          "group.id": self.spec.group})
        try:
            for topic in (*self.spec.inputs, self.spec.output):
                try:
                    meta = probe.list_topics(topic, timeout=timeout)
                except KafkaException as exc:
                    raise TransformError(f"transform {self.spec.name}: cannot reach the broker "
                                         f"at {self.bootstrap}: {exc.args[0].str()}") from None
                info = meta.topics.get(topic)
                if info is None or info.error is not None or not info.partitions:
                    raise TransformError(f"transform {self.spec.name}: topic {topic!r} does not "
                                         "exist (create it first)")
                if topic == self.spec.output:
                    self._output_count = len(info.partitions)
                else:
                    self._input_counts[topic] = len(info.partitions)
        finally:
            probe.close()

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name=f"transform-{self.spec.name}",
                                        daemon=True)
        self._thread.start()

    def request_stop(self) -> None:
        """Ask the loop to finish its current batch and leave the group."""
        self._stop.set()

    def stop(self, timeout: float = 30.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)

    # ------------------------------------------------------------------ the loop
    def _run(self) -> None:
        try:
            if not self._output_count and not self._wait_for_topics():
                return
            self._consumer = Consumer({
                # Defaults `client_config` may change ...
                "session.timeout.ms": self._session_timeout_ms,
                "heartbeat.interval.ms": max(100, self._session_timeout_ms // 4),
                "auto.offset.reset": "earliest",
                **client_settings(self.spec, self.bootstrap),
                # ... and what the runner owns (config.py refuses these in client_config).
                "group.id": self.spec.group,
                "enable.auto.commit": False,
                "enable.auto.offset.store": False,
                "isolation.level": "read_committed",
            })
            if self.guarantee == AT_LEAST_ONCE:
                self._producer = Producer({**client_settings(self.spec, self.bootstrap),
                                           "enable.idempotence": True, "linger.ms": 5})
            self._consumer.subscribe(list(self.spec.inputs), on_assign=self._on_assign,
                                     on_revoke=self._on_revoke, on_lost=self._on_revoke)
            self.status.update(state="running")
            log.info("transform_started", transform=self.spec.name, guarantee=self.guarantee,
                     group=self.spec.group, inputs=list(self.spec.inputs),
                     output=self.spec.output)
            last_lag = 0.0
            while not self._stop.is_set():
                messages = self._consumer.consume(self.spec.batch_records, _POLL)
                if messages:
                    self._handle(messages)
                now = time.monotonic()
                if now - last_lag >= _LAG_EVERY:
                    if not messages:
                        self._commit_past_markers()
                    self._update_lag()
                    last_lag = now
            self.status.update(state="stopped")
        except Exception as exc:
            log.error("transform_failed", transform=self.spec.name, error=repr(exc))
            self.status.update(state="failed", error=str(exc))
        finally:
            self._close()

    def _wait_for_topics(self) -> bool:
        """Check the topics until they exist (`sluice serve` starts before they may be
        created); False when asked to stop first."""
        warned = False
        while not self._stop.is_set():
            try:
                self.check_topics()
                return True
            except TransformError as exc:
                if not warned:
                    log.warning("transform_waiting", transform=self.spec.name, reason=str(exc))
                    warned = True
                self.status.update(state="waiting", error=str(exc))
            self._stop.wait(_TOPIC_RETRY)
        self.status.update(state="stopped")
        return False

    def _close(self) -> None:
        for producer in self._txn.values():
            producer.flush(5)
        self._txn.clear()
        if self._producer is not None:
            self._producer.flush(10)
        if self._consumer is not None:
            self._consumer.close()

    # ------------------------------------------------------------------ rebalances
    def _on_assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        log.info("transform_assigned", transform=self.spec.name,
                 partitions=[f"{tp.topic}[{tp.partition}]" for tp in partitions])
        if self.guarantee != EXACTLY_ONCE:
            return
        for tp in partitions:
            key = (tp.topic, tp.partition)
            if key in self._txn:
                continue
            producer = Producer({**client_settings(self.spec, self.bootstrap),
                                 "transactional.id": self.spec.transactional_id(*key),
                                 "linger.ms": 5})
            # Fences the partition's previous owner and aborts its open transaction.
            producer.init_transactions(_TIMEOUT)
            self._txn[key] = producer
            if key in self._fenced:
                self._fenced.discard(key)
                consumer.resume([TopicPartition(*key)])

    def _on_revoke(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        log.info("transform_revoked", transform=self.spec.name,
                 partitions=[f"{tp.topic}[{tp.partition}]" for tp in partitions])
        for tp in partitions:
            key = (tp.topic, tp.partition)
            self._committed.pop(key, None)
            producer = self._txn.pop(key, None)
            if producer is not None:
                producer.flush(5)

    # ------------------------------------------------------------------ batches
    def _handle(self, messages: list[Message]) -> None:
        batches: dict[tuple[str, int], list[InputRecord]] = {}
        for m in messages:
            err = m.error()
            if err is not None:
                if err.code() != _ERR_PARTITION_EOF:
                    log.warning("transform_consume_error", transform=self.spec.name,
                                error=err.str())
                continue
            ts_type, ts = m.timestamp()
            # A consumed message always has topic, partition and offset; headers are a list.
            key = (cast(str, m.topic()), cast(int, m.partition()))
            headers = cast(list[Header], m.headers() or [])
            batches.setdefault(key, []).append(InputRecord(
                cast(int, m.offset()), None if ts_type == TIMESTAMP_NOT_AVAILABLE else ts,
                m.key(), m.value(), list(headers)))
        if self.guarantee == EXACTLY_ONCE:
            for key, records in batches.items():
                if key not in self._fenced:
                    self._transaction(key, records, self._process(key, records))
        else:
            self._at_least_once(batches)

    def _process(self, key: tuple[str, int], records: list[InputRecord]) -> BatchOutcome:
        topic, partition = key
        return process_batch(self.chain, self._client_id, topic, partition, records,
                             input_partitions=self._input_counts.get(topic, 0),
                             output_partitions=self._output_count)

    def _produce(self, producer: Producer, outcome: BatchOutcome,
                 deliveries: _Deliveries) -> None:
        for o in outcome.outputs:
            self._send(producer, topic=self.spec.output, value=o.value, key=o.key,
                       partition=o.partition, timestamp=o.timestamp or 0, headers=o.headers,
                       on_delivery=deliveries)
        for d in outcome.dead_letters:
            self._send(producer, topic=d.topic, value=d.value, key=d.key, headers=d.headers,
                       on_delivery=deliveries)

    @staticmethod
    def _send(producer: Producer, **record: Any) -> None:
        while True:
            try:
                producer.produce(**record)
                return
            except BufferError:
                producer.poll(0.05)  # the local queue is full: let deliveries drain it

    def _transaction(self, key: tuple[str, int], records: list[InputRecord],
                     outcome: BatchOutcome) -> None:
        producer = self._txn.get(key)
        if producer is None or self._consumer is None:
            return
        deliveries = _Deliveries(self.spec.output)
        topic, partition = key
        next_offset = records[-1].offset + 1
        if not outcome.outputs and not outcome.dead_letters:
            self._commit_nothing_written(key, records, outcome)
            return
        try:
            producer.begin_transaction()
            self._produce(producer, outcome, deliveries)
            producer.flush(_TIMEOUT)
            if deliveries.errors:
                raise _WriteFailed("; ".join(deliveries.errors[:3]))
            producer.send_offsets_to_transaction(
                [TopicPartition(topic, partition, next_offset)],
                self._consumer.consumer_group_metadata(), _TIMEOUT)
            producer.commit_transaction(_TIMEOUT)
        except (KafkaException, _WriteFailed) as exc:
            self._transaction_failed(key, producer, records[0].offset, exc)
            return
        self.status.add(transactions_committed=1)
        self._done(key, records, outcome, deliveries, self.spec.transactional_id(*key))

    def _commit_nothing_written(self, key: tuple[str, int], records: list[InputRecord],
                                outcome: BatchOutcome) -> None:
        # The chain wrote nothing (all dropped or rejected): there is no output to make atomic
        # with the offset, and the bundled broker silently drops the offsets of a transaction
        # that wrote no record (measured: tests/transforms/test_broker_transactions.py), so
        # the offset is committed on its own.
        assert self._consumer is not None
        try:
            self._consumer.commit(offsets=[TopicPartition(key[0], key[1],
                                                          records[-1].offset + 1)],
                                  asynchronous=False)
        except KafkaException as exc:
            log.warning("transform_commit_failed", transform=self.spec.name,
                        error=exc.args[0].str())
            self.status.add(retries=1)
            self._consumer.seek(TopicPartition(key[0], key[1], records[0].offset))
            return
        self._done(key, records, outcome, _Deliveries(self.spec.output), None)

    def _transaction_failed(self, key: tuple[str, int], producer: Producer, first: int,
                            exc: Exception) -> None:
        assert self._consumer is not None
        error = exc.args[0] if exc.args and isinstance(exc.args[0], KafkaError) else None
        text = error.str() if error is not None else str(exc)
        if error is not None and error.fatal():
            # Fenced: another process owns this partition now; leave it to that one.
            log.warning("transform_fenced", transform=self.spec.name, topic=key[0],
                        partition=key[1], error=text)
            self._fenced.add(key)
            self._txn.pop(key, None)
            self._consumer.pause([TopicPartition(*key)])
            return
        try:
            producer.abort_transaction(_TIMEOUT)
        except KafkaException as abort_exc:
            log.warning("transform_abort_failed", transform=self.spec.name,
                        error=abort_exc.args[0].str())
        self.status.add(transactions_aborted=1, retries=1)
        log.warning("transform_transaction_aborted", transform=self.spec.name, topic=key[0],
                    partition=key[1], error=text)
        # Read the batch again: nothing of it was committed.
        self._consumer.seek(TopicPartition(key[0], key[1], first))

    def _at_least_once(self, batches: dict[tuple[str, int], list[InputRecord]]) -> None:
        assert self._producer is not None and self._consumer is not None
        done: list[tuple[tuple[str, int], list[InputRecord], BatchOutcome, _Deliveries]] = []
        for key, records in batches.items():
            outcome = self._process(key, records)
            part = _Deliveries(self.spec.output)
            self._produce(self._producer, outcome, part)
            done.append((key, records, outcome, part))
        self._producer.flush(_TIMEOUT)
        failed = [e for _k, _r, _o, d in done for e in d.errors]
        if failed or len(self._producer) > 0:
            # Not all written: commit nothing and read these batches again.
            log.warning("transform_write_failed", transform=self.spec.name,
                        error="; ".join(failed[:3]) or "flush timed out")
            for key, records, _o, _d in done:
                self._consumer.seek(TopicPartition(key[0], key[1], records[0].offset))
            self.status.add(retries=len(done))
            return
        offsets = [TopicPartition(k[0], k[1], r[-1].offset + 1) for k, r, _o, _d in done]
        try:
            self._consumer.commit(offsets=offsets, asynchronous=False)
        except KafkaException as exc:
            # Written but not committed: whoever reads these partitions next repeats them
            # (the at-least-once window).
            log.warning("transform_commit_failed", transform=self.spec.name,
                        error=exc.args[0].str())
            return
        for key, records, outcome, part in done:
            self._done(key, records, outcome, part, None)

    def _done(self, key: tuple[str, int], records: list[InputRecord], outcome: BatchOutcome,
              deliveries: _Deliveries, transactional_id: str | None) -> None:
        self._committed[key] = records[-1].offset + 1
        self.status.add(records_in=len(records), records_out=len(outcome.outputs),
                        dropped=outcome.dropped, rejected=len(outcome.rejected),
                        dead_letters=len(outcome.dead_letters), batches=1)
        if self.sink is None:
            return
        self.sink.emit(telemetry.transform_batch_event(
            self.info, transform=self.spec.name, guarantee=self.guarantee,
            group=self.spec.group, input_topic=key[0], input_partition=key[1],
            input_offset_first=records[0].offset, input_offset_last=records[-1].offset,
            output_topic=self.spec.output, outputs=deliveries.outputs(),
            records_in=len(records), records_out=len(outcome.outputs),
            filters=telemetry.filter_entries(cast(list[Any], outcome.stats)),
            reject_reasons=telemetry.reject_reason_counts(outcome.rejected),
            dropped=outcome.dropped, dead_letters=len(outcome.dead_letters),
            transactional_id=transactional_id))

    # ------------------------------------------------------------------ lag
    def _commit_past_markers(self) -> None:
        """Idle: commit the position of a partition whose position is past what its batches
        committed. That happens only over records no batch delivers: transaction markers and
        aborted records at the end of the input, which Apache Kafka's log end counts, so
        without this the group's committed offset stays 1-2 short and `sluice transform lag`
        never reads 0. Nothing is open at this point (batches are handled synchronously), so
        no transaction's offsets are overtaken."""
        consumer = self._consumer
        if consumer is None:
            return
        assigned = [tp for tp in consumer.assignment()
                    if (tp.topic, tp.partition) not in self._fenced]
        if not assigned:
            return
        ahead = [tp for tp in consumer.position(assigned)
                 if (done := self._committed.get((tp.topic, tp.partition))) is not None
                 and tp.offset > done]
        if not ahead:
            return
        try:
            consumer.commit(offsets=ahead, asynchronous=False)
        except KafkaException as exc:
            log.warning("transform_commit_failed", transform=self.spec.name,
                        error=exc.args[0].str())
            return
        for tp in ahead:
            self._committed[(tp.topic, tp.partition)] = tp.offset

    def _update_lag(self) -> None:
        consumer = self._consumer
        if consumer is None:
            return
        progress: list[PartitionProgress] = []
        assigned = consumer.assignment()
        positions = {(tp.topic, tp.partition): tp.offset
                     for tp in consumer.position(assigned)} if assigned else {}
        for tp in assigned:
            key = (tp.topic, tp.partition)
            committed = self._committed.get(key)
            if committed is None:
                # Nothing committed by this process yet: where the group made it start.
                pos = positions.get(key, -1)
                committed = pos if pos >= 0 else None
            _low, high = consumer.get_watermark_offsets(tp, cached=True)
            high_known = high if high >= 0 else None
            # The position also steps over transaction markers at the end of the input, which
            # the high watermark counts but no batch ever commits past.
            done = max(committed if committed is not None else -1, positions.get(key, -1))
            lag = max(0, high_known - done) if high_known is not None and done >= 0 else None
            progress.append(PartitionProgress(tp.topic, tp.partition, committed, high_known,
                                              lag))
        self.status.set_partitions(progress)


class _WriteFailed(Exception):
    """A record of the batch was not delivered (the transaction is aborted)."""
