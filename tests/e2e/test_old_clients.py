"""Clients that skip ApiVersions and send versions the codec does not decode (Sarama 1.22 and
segmentio/kafka-go 0.2 send CreateTopics v0 and DescribeConfigs v0): requests no path
inspects pass as their bytes whenever the broker serves the version; one a path must inspect
is refused. Frames are written by hand here, as those clients write them: the codec (kio,
Kafka 4.x schemas) has no v0 of either API. (tests/e2e/test_old_go_clients.py runs the two
real clients.)

Against Apache Kafka 3.9 (`kafka39_broker`), which still serves those versions, as the
brokers of these clients' users do; Kafka 4 removed CreateTopics v0-1 and DescribeConfigs v0
(KIP-896): through the proxy a client gets what it gets directly, the broker's own answer."""

from __future__ import annotations

import socket
import struct
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest
from confluent_kafka.admin import AdminClient

from tests.harness.kafka_broker import KAFKA_VERSION, KafkaCluster
from tests.harness.proxy import SluiceProxy
from tests.proxy.test_reload import wait_for

pytestmark = pytest.mark.kafka


def _string(text: str) -> bytes:
    raw = text.encode()
    return struct.pack(">h", len(raw)) + raw


def _frame(api_key: int, version: int, correlation_id: int, body: bytes) -> bytes:
    message = struct.pack(">hhi", api_key, version, correlation_id) + _string("sarama") + body
    return struct.pack(">i", len(message)) + message


def create_topics_v0(correlation_id: int, topic: str) -> bytes:
    # topics: [name, num_partitions, replication_factor, assignments[], configs[]], timeout
    body = struct.pack(">i", 1) + _string(topic) + struct.pack(">ihii", 1, 1, 0, 0)
    return _frame(19, 0, correlation_id, body + struct.pack(">i", 5000))


def describe_configs_v0(correlation_id: int, topic: str) -> bytes:
    # resources: [resource_type (2 = topic), resource_name, config_names (null: all)]
    body = struct.pack(">ib", 1, 2) + _string(topic) + struct.pack(">i", -1)
    return _frame(32, 0, correlation_id, body)


def call(bootstrap: str, frame: bytes) -> bytes | None:
    """The response (after its size), or None when the peer closed the connection."""
    host, port = bootstrap.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(frame)
        data = b""
        while len(data) < 4 or len(data) < 4 + struct.unpack(">i", data[:4])[0]:
            chunk = sock.recv(65536)
            if not chunk:
                return None
            data += chunk
        return data[4:]


def create_error(answer: bytes, topic: str) -> int:
    """error_code of the single topic in a CreateTopics v0 response."""
    (count,) = struct.unpack_from(">i", answer, 4)
    name_len = struct.unpack_from(">h", answer, 8)[0]
    assert count == 1 and answer[10 : 10 + name_len].decode() == topic
    return int(struct.unpack_from(">h", answer, 10 + name_len)[0])


def describe_error(answer: bytes) -> int:
    """error_code of the single resource in a DescribeConfigs v0 response."""
    (count,) = struct.unpack_from(">i", answer, 8)  # after correlation id, throttle_time_ms
    assert count == 1
    return int(struct.unpack_from(">h", answer, 12)[0])


def logged_refusal(proxy: SluiceProxy) -> None:
    """The proxy's log names the reason (its output is read by a thread: it may come just
    after the client saw the connection close)."""
    wait_for(lambda: any("must be inspected" in line for line in proxy.output), 10,
             "the refusal in the proxy's log")


def test_create_topics_and_describe_configs_v0_pass_through(
    kafka39_broker: KafkaCluster, start_proxy: Callable[..., SluiceProxy]
) -> None:
    broker, proxy = kafka39_broker, start_proxy(upstream=kafka39_broker.bootstrap)
    topic = f"old-client-{uuid.uuid4().hex[:8]}"
    created = call(proxy.bootstrap, create_topics_v0(41, topic))
    assert created is not None, "the proxy closed the connection on CreateTopics v0"
    assert struct.unpack_from(">i", created)[0] == 41
    assert create_error(created, topic) == 0
    # The same request again, directly: Kafka's TOPIC_ALREADY_EXISTS (36) shows it was created.
    again = call(broker.bootstrap, create_topics_v0(40, topic))
    assert again is not None and create_error(again, topic) == 36
    described = call(proxy.bootstrap, describe_configs_v0(42, topic))
    assert described is not None, "the proxy closed the connection on DescribeConfigs v0"
    assert describe_error(described) == 0
    assert b"cleanup.policy" in described  # every key of the topic, as Kafka answers v0
    direct = call(broker.bootstrap, describe_configs_v0(42, topic))
    assert described == direct  # relayed as the broker's own bytes


def test_on_kafka_4_the_client_gets_what_it_gets_directly(
    kafka_broker: KafkaCluster, start_proxy: Callable[..., SluiceProxy]
) -> None:
    """Kafka 4 removed CreateTopics v0 and DescribeConfigs v0 (KIP-896) and closes the
    connection on them (it has no response schema to answer in): through the proxy the same,
    and no topic is created."""
    if kafka_broker.version != KAFKA_VERSION:
        pytest.skip("the session's Kafka is not 4.x (SLUICE_E2E_BROKER=kafka39)")
    proxy = start_proxy(upstream=kafka_broker.bootstrap)
    topic = f"old-client-{uuid.uuid4().hex[:8]}"
    for frame in (create_topics_v0(51, topic), describe_configs_v0(52, topic)):
        assert call(kafka_broker.bootstrap, frame) is None
        assert call(proxy.bootstrap, frame) is None
    # Still nothing created.
    listed = AdminClient({"bootstrap.servers": kafka_broker.bootstrap}).list_topics(timeout=20)
    assert topic not in listed.topics


def test_v0_that_a_filter_must_inspect_is_refused(
    kafka39_broker: KafkaCluster, start_proxy: Callable[..., SluiceProxy], tmp_path: Path
) -> None:
    """With topic-policy bound on admin, CreateTopics must be inspected: v0 cannot be decoded,
    so the connection closes with the reason in the log, and no topic is created."""
    config = tmp_path / "sluice.yaml"
    config.write_text(
        "filters:\n"
        "  - name: policy\n"
        "    module: builtin:topic-policy\n"
        '    topics: ["*"]\n'
        "    apply_to: [admin]\n"
        "    config: {partitions: {min: 3, max: 12}}\n"
    )
    proxy = start_proxy(config=config, upstream=kafka39_broker.bootstrap)
    topic = f"old-client-{uuid.uuid4().hex[:8]}"
    assert call(proxy.bootstrap, create_topics_v0(43, topic)) is None
    logged_refusal(proxy)
    # Not created: directly, 3.9 creates it now (no TOPIC_ALREADY_EXISTS).
    direct = call(kafka39_broker.bootstrap, create_topics_v0(48, topic))
    assert direct is not None and create_error(direct, topic) == 0


def delete_topics_v0(correlation_id: int, topic: str) -> bytes:
    # topic_names: [string], timeout_ms
    body = struct.pack(">i", 1) + _string(topic) + struct.pack(">i", 5000)
    return _frame(20, 0, correlation_id, body)


def test_old_version_naming_the_proxys_own_topic_is_refused(
    kafka39_broker: KafkaCluster, start_proxy: Callable[..., SluiceProxy]
) -> None:
    """The proxy cannot decode DeleteTopics v0 or CreateTopics v0, and its bytes name the
    fleet topic: refused (connection closed), never relayed uninspected."""
    proxy = start_proxy(upstream=kafka39_broker.bootstrap)
    assert call(proxy.bootstrap, delete_topics_v0(44, "_sluice_filters")) is None
    assert call(proxy.bootstrap, create_topics_v0(45, "_sluice_filters")) is None
    logged_refusal(proxy)
    # An old DeleteTopics of an ordinary topic still passes as its bytes.
    topic = f"old-client-{uuid.uuid4().hex[:8]}"
    assert call(proxy.bootstrap, create_topics_v0(46, topic)) is not None
    deleted = call(proxy.bootstrap, delete_topics_v0(47, topic))
    assert deleted is not None and struct.unpack_from(">i", deleted)[0] == 47


def produce_v2(correlation_id: int, topic: str, message_set: bytes) -> bytes:
    # acks, timeout_ms, topics: [name, partitions: [index, message_set_size, message_set]]
    body = struct.pack(">hii", -1, 5000, 1) + _string(topic)
    body += struct.pack(">iii", 1, 0, len(message_set)) + message_set
    return _frame(0, 2, correlation_id, body)


def test_old_produce_to_an_internal_topic_is_refused(
    kafka39_broker: KafkaCluster, start_proxy: Callable[..., SluiceProxy], tmp_path: Path
) -> None:
    """Produce v2 (a magic-1 message set, as pre-0.11 clients write) is older than the codec
    decodes, and Produce is always inspected: refused (connection closed), and one of the
    proxy's own topics stays empty. The broker itself serves that version (shown directly on
    another topic)."""
    from tests.e2e.test_filter_failclosed import legacy_message_set

    internal, ordinary = (f"old-internal-{uuid.uuid4().hex[:8]}",
                          f"old-client-{uuid.uuid4().hex[:8]}")
    config = tmp_path / "sluice.yaml"
    config.write_text(f"security:\n  internal_topics: [{internal}]\n")
    for topic in (internal, ordinary):
        answer = call(kafka39_broker.bootstrap, create_topics_v0(40, topic))
        assert answer is not None and create_error(answer, topic) == 0
    proxy = start_proxy(config=config, upstream=kafka39_broker.bootstrap)
    message = legacy_message_set(b"forged fleet record")
    assert call(proxy.bootstrap, produce_v2(41, internal, message)) is None
    logged_refusal(proxy)
    assert call(kafka39_broker.bootstrap, produce_v2(42, ordinary, message)) is not None

    from confluent_kafka import Consumer, TopicPartition
    consumer = Consumer({"bootstrap.servers": kafka39_broker.bootstrap, "group.id": "old-hw"})
    try:
        ends = {t: consumer.get_watermark_offsets(TopicPartition(t, 0), timeout=10)[1]
                for t in (internal, ordinary)}
    finally:
        consumer.close()
    assert ends == {internal: 0, ordinary: 1}
