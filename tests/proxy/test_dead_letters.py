"""The dead-letter writer against a real broker: where letters land (Kafka's partitioner,
checked against librdkafka), one reused connection, reconnection, the byte bound, and what
shutdown does with letters still queued.

`broker` here is the session's Apache Kafka node (the module overrides the root fixture).
Connections are counted on `relayed_kafka` (tests/harness/kafka_relay.py), a Kafka node of this
folder's own that announces its listeners at counting TCP relays, so every connection the
writer opens passes one; the tests that inject broker answers or cut connections put their
own relay (`Relay`) on that announced port for a while.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from structlog.testing import capture_logs

from sluice.codec import entities
from sluice.codec.error_codes import ErrorCode
from sluice.codec.headers import RequestHeader, parse_request_header, response_header_bytes
from sluice.codec.messages import ApiKey, decode_request, encode_response
from sluice.proxy.net.upstream_client import UpstreamDialer
from sluice.proxy.telemetry.dead_letters import DeadLetterWriter, letter_size
from tests.e2e.clients import confluent_produce, create_topic, unique
from tests.harness.broker import TansuBroker
from tests.harness.kafka_broker import KafkaCluster
from tests.harness.kafka_endpoint import KafkaEndpoint
from tests.harness.kafka_relay import CountingRelay, RelayedKafka
from tests.harness.ports import free_port
from tests.proxy.dead_letter_helpers import config_for, consume_with_partitions, letters


@pytest.fixture(scope="module")
def broker(kafka_broker: KafkaCluster) -> KafkaEndpoint:
    return KafkaEndpoint(kafka_broker)


@pytest.fixture(scope="module")
def fronted(relayed_kafka: RelayedKafka) -> RelayedKafka:
    return relayed_kafka


def writer_for(
    bootstrap: str, max_queued_bytes: int = 64 << 20, delivery_timeout: float = 120.0
) -> DeadLetterWriter:
    return DeadLetterWriter(
        UpstreamDialer(config_for(bootstrap)),
        max_queued_bytes=max_queued_bytes,
        delivery_timeout=delivery_timeout,
    )


async def wait_produced(writer: DeadLetterWriter, count: int, timeout: float = 20) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while writer.produced + writer.failed < count and loop.time() < deadline:
        await asyncio.sleep(0.02)
    assert (writer.produced, writer.failed) == (count, 0), writer.stats()


@pytest.mark.kafka
def test_keyed_letters_land_where_kafka_clients_put_the_key(broker: TansuBroker) -> None:
    topic, twin = unique("dlq-keyed"), unique("dlq-twin")
    partitions = 5
    create_topic(broker.bootstrap, topic, partitions)
    create_topic(broker.bootstrap, twin, partitions)
    keyed = letters(topic, 60)
    keyless = letters(topic, 12, keyed=False)

    async def run() -> DeadLetterWriter:
        writer = writer_for(broker.bootstrap)
        writer.submit(keyed + keyless)  # one flush: keyless letters stick to one partition
        await wait_produced(writer, 72)
        assert writer.produce_requests == 1  # one leader: one Produce, a batch per partition
        await writer.close()
        return writer

    writer = asyncio.run(run())
    assert writer.stats() == {
        "produced": 72,
        "failed": 0,
        "dropped": 0,
        "lost_at_shutdown": 0,
        "queued": 0,
        "queued_bytes": 0,
    }
    # The golden truth: librdkafka's Java-compatible partitioner, same keys, same partition count.
    placed = confluent_produce(
        broker.bootstrap, twin, [(d.key, b"v") for d in keyed], partitioner="murmur2_random"
    )
    expected = {d.key: partition for d, (partition, _) in zip(keyed, placed, strict=True)}
    landed = consume_with_partitions(broker.bootstrap, topic, 72)
    assert len(landed) == 72
    keyed_landed = {key: partition for partition, key, _, _ in landed if key is not None}
    assert keyed_landed == expected
    assert len(set(expected.values())) == partitions
    assert len({partition for partition, key, _, _ in landed if key is None}) == 1
    by_key = {key: (value, headers) for _, key, value, headers in landed if key is not None}
    assert by_key[b"key-7"] == (
        keyed[7].value,
        [("sluice.filter", b"pii-mask"), ("sluice.reason", b"test")],
    )


@pytest.mark.kafka
def test_keyless_letters_move_on_between_flushes(broker: TansuBroker) -> None:
    topic = unique("dlq-keyless")
    create_topic(broker.bootstrap, topic, 3)

    async def run() -> None:
        writer = writer_for(broker.bootstrap)
        for round_ in range(3):
            writer.submit(letters(topic, 4, keyed=False))
            await wait_produced(writer, 4 * (round_ + 1))
        await writer.close()

    asyncio.run(run())
    landed = consume_with_partitions(broker.bootstrap, topic, 12)
    assert sorted(p for p, *_ in landed) == [0] * 4 + [1] * 4 + [2] * 4


@pytest.mark.kafka
def test_one_connection_is_reused_across_flushes_and_topics(fronted: RelayedKafka) -> None:
    relay = fronted.relays["PLAINTEXT"]
    topics = [unique("dlq-reuse"), unique("dlq-reuse")]
    for t in topics:
        create_topic(fronted.bootstrap(), t, 2)
    before = relay.connections

    async def run() -> DeadLetterWriter:
        writer = writer_for(fronted.bootstrap())
        for round_ in range(5):
            writer.submit(letters(topics[round_ % 2], 10))
            await wait_produced(writer, 10 * (round_ + 1))
        await writer.close()
        return writer

    writer = asyncio.run(run())
    assert writer.connections_opened == 1
    assert relay.connections - before == 1
    assert len(consume_with_partitions(fronted.bootstrap(), topics[0], 30)) == 30


def test_queue_is_bounded_in_bytes_and_shutdown_counts_what_is_left() -> None:
    # Nothing listens on this port: every letter stays queued until close().
    dead = f"127.0.0.1:{free_port()}"
    sample = letters("dlq-nowhere", 1, size=1000)[0]
    room = 10

    async def run() -> DeadLetterWriter:
        writer = writer_for(dead, max_queued_bytes=letter_size(sample) * room)
        writer.submit(letters("dlq-nowhere", 25, size=1000))
        assert (writer.queued, writer.dropped) == (room, 15)
        assert writer.queued_bytes == letter_size(sample) * room
        writer.submit(letters("dlq-nowhere", 1, size=0))  # smaller letters do not fit either
        assert writer.dropped == 16
        await asyncio.sleep(0.3)  # the writer keeps trying (and backing off) meanwhile
        await writer.close(timeout=0.2)
        return writer

    with capture_logs() as logs:
        writer = asyncio.run(run())
    assert writer.stats() == {
        "produced": 0,
        "failed": 0,
        "dropped": 16,
        "lost_at_shutdown": room,
        "queued": 0,
        "queued_bytes": 0,
    }
    lost = [e for e in logs if e["event"] == "dead_letters_lost_at_shutdown"]
    assert [e["count"] for e in lost] == [room]
    dropped = [e for e in logs if e["event"] == "dead_letter_dropped"]
    assert len(dropped) == 1  # one line for the flood, not one per letter
    assert not any("value-" in repr(e) for e in logs)  # payloads are never logged


def test_letters_out_of_delivery_time_count_as_failed() -> None:
    dead = f"127.0.0.1:{free_port()}"

    async def run() -> DeadLetterWriter:
        writer = writer_for(dead, delivery_timeout=0.3)
        writer.submit(letters("dlq-nowhere", 3))
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 10
        while writer.failed < 3 and loop.time() < deadline:
            await asyncio.sleep(0.05)
        await writer.close(timeout=0.1)
        return writer

    writer = asyncio.run(run())
    assert (writer.failed, writer.lost_at_shutdown, writer.queued_bytes) == (3, 0, 0)


@pytest.mark.kafka
def test_close_flushes_what_is_queued(broker: TansuBroker) -> None:
    topic = unique("dlq-close")
    create_topic(broker.bootstrap, topic, 2)

    async def run() -> DeadLetterWriter:
        writer = writer_for(broker.bootstrap)
        writer.submit(letters(topic, 40, size=200))
        await writer.close(timeout=15)  # nothing sent yet: close itself must flush
        writer.submit(letters(topic, 2))  # after close: counted, never silently kept
        return writer

    with capture_logs() as logs:
        writer = asyncio.run(run())
    assert (writer.produced, writer.failed, writer.lost_at_shutdown) == (40, 0, 2)
    assert [e["count"] for e in logs if e["event"] == "dead_letters_lost_at_shutdown"] == []
    assert len(consume_with_partitions(broker.bootstrap, topic, 40)) == 40


@pytest.mark.kafka
def test_a_refused_topic_fails_its_letters_only(broker: TansuBroker) -> None:
    good = unique("dlq-good")
    create_topic(broker.bootstrap, good, 1)

    async def run() -> DeadLetterWriter:
        writer = writer_for(broker.bootstrap)
        writer.submit(letters(good, 3) + letters("bad topic name!", 2))
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 15
        while writer.produced + writer.failed < 5 and loop.time() < deadline:
            await asyncio.sleep(0.05)
        await writer.close(timeout=1)
        return writer

    writer = asyncio.run(run())
    assert (writer.produced, writer.failed) == (3, 2), writer.stats()


class Relay:
    """An in-test relay on the port Kafka announces (the counting relay's, which steps aside):
    counts connections and Metadata/Produce requests, can cut every connection (a broker
    restart) and can answer the first `refuse_produces` Produce requests itself with
    NOT_LEADER_OR_FOLLOWER for every partition, as a broker does after a leader moved."""

    def __init__(self, target_port: int, port: int, refuse_produces: int = 0) -> None:
        self.target_port, self.port = target_port, port
        self.refusals_left = refuse_produces
        self.connections = 0
        self.metadata_requests = 0
        self.produce_requests = 0
        self._open: set[asyncio.StreamWriter] = set()

    def cut(self) -> None:
        for writer in self._open:
            writer.close()

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        self._open.add(writer)
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target_port)
        back = asyncio.create_task(self._pipe(up_reader, writer))
        try:
            while True:
                size = await reader.readexactly(4)
                body = await reader.readexactly(int.from_bytes(size, "big", signed=True))
                header = parse_request_header(body)
                self.metadata_requests += header.api_key == ApiKey.METADATA
                if header.api_key == ApiKey.PRODUCE:
                    self.produce_requests += 1
                    if self.refusals_left:
                        self.refusals_left -= 1
                        writer.write(self._not_leader(header, body))
                        continue
                up_writer.write(size + body)
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            self._open.discard(writer)
            back.cancel()
            up_writer.close()
            writer.close()

    @staticmethod
    def _not_leader(header: RequestHeader, body: bytes) -> bytes:
        request = decode_request(header.api_key, header.api_version, body[header.header_size :])
        not_leader = ErrorCode.NOT_LEADER_OR_FOLLOWER
        cls = entities.response_class(header.api_key, header.api_version)
        tcls = entities.element_class(cls, "responses")
        pcls = entities.element_class(tcls, "partition_responses")
        response = entities.build(
            cls,
            responses=tuple(
                entities.build(
                    tcls,
                    name=t.name,
                    partition_responses=tuple(
                        entities.build(pcls, index=p.index, error_code=not_leader)
                        for p in t.partition_data
                    ),
                )
                for t in request.topic_data
            ),
        )
        payload = response_header_bytes(
            header.correlation_id, header.api_key, header.api_version
        ) + encode_response(response)
        return len(payload).to_bytes(4, "big") + payload

    @staticmethod
    async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while data := await reader.read(65536):
                writer.write(data)
        except ConnectionError:
            pass


def in_place_of(fronted: RelayedKafka, **kwargs: Any) -> Relay:
    counting = fronted.relays["PLAINTEXT"]
    return Relay(counting.target_port, counting.port, **kwargs)


async def relayed(fronted: RelayedKafka, relay: Relay, scenario: Any) -> DeadLetterWriter:
    """Run `scenario(writer)` with `relay` in place of the counting relay, which comes back
    after."""
    counting = fronted.relays["PLAINTEXT"]
    counting.stop()
    server = await asyncio.start_server(relay.serve, "127.0.0.1", relay.port)
    try:
        writer = writer_for(fronted.bootstrap())
        await scenario(writer)
        await writer.close()
        return writer
    finally:
        server.close()
        relay.cut()
        fronted.relays["PLAINTEXT"] = CountingRelay(counting.target_port, counting.port).start()


@pytest.mark.kafka
def test_not_leader_refreshes_metadata_and_retries(fronted: RelayedKafka) -> None:
    topic = unique("dlq-moved")
    create_topic(fronted.bootstrap(), topic, 2)
    relay = in_place_of(fronted, refuse_produces=1)

    async def scenario(writer: DeadLetterWriter) -> None:
        writer.submit(letters(topic, 6))
        await wait_produced(writer, 6)

    writer = asyncio.run(relayed(fronted, relay, scenario))
    assert relay.produce_requests == 2  # refused once, then sent again
    assert relay.metadata_requests == 2  # the refusal dropped the cached leaders
    assert (writer.stats()["produced"], writer.connections_opened) == (6, 1)
    landed = consume_with_partitions(fronted.bootstrap(), topic, 6)
    assert sorted(key for _, key, _, _ in landed) == sorted(d.key for d in letters(topic, 6))


@pytest.mark.kafka
def test_a_broken_connection_is_dialled_again_after_a_back_off(fronted: RelayedKafka) -> None:
    topic = unique("dlq-reconnect")
    create_topic(fronted.bootstrap(), topic, 1)
    relay = in_place_of(fronted)

    async def scenario(writer: DeadLetterWriter) -> None:
        writer.submit(letters(topic, 5))
        await wait_produced(writer, 5)
        relay.cut()  # the broker side goes away, as in a broker restart
        writer.submit(letters(topic, 5))
        await wait_produced(writer, 10)

    writer = asyncio.run(relayed(fronted, relay, scenario))
    assert (writer.connections_opened, relay.connections) == (2, 2)
    assert len(consume_with_partitions(fronted.bootstrap(), topic, 10)) == 10
