"""What Tansu hid: the protocols only Apache Kafka speaks, through the proxy, with and without a
fetch filter bound to the topic (issue 27, item 6).

- the KIP-848 consumer group protocol (ConsumerGroupHeartbeat), `group.protocol=consumer` in
  librdkafka: records read through the proxy are what a direct read gives, and masked when a
  fetch filter applies;
- KIP-932 share groups (ShareGroupHeartbeat, ShareFetch, ShareAcknowledge) with
  confluent-kafka's ShareConsumer: unfiltered they work as direct; with a fetch filter in
  force the proxy refuses ShareFetch, so no record ever reaches the client unfiltered;
- DescribeTopicPartitions (KIP-966): the same answer through the proxy as direct;
- Fetch v13+ (topics named by id): masked by a fetch filter like a Fetch by name.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaException, ShareConsumer
from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource

from bench import wire
from sluice.codec import entities
from sluice.codec.messages import ApiKey, codec_version_range
from sluice.codec.records import decode_records, split_batches
from sluice.codec.schemas import request_schema
from tests.e2e.clients import QUIET, confluent_produce, create_topic, unique
from tests.harness.broker import TansuBroker
from tests.harness.proxy import SluiceProxy

SECRET = b"mail alice@example.com today"
MASKED = b"mail *****@*******.*** today"
CONFIG = """
filters:
  - name: mask-out
    module: builtin:pii-mask
    topics: ["np-*"]
    apply_to: [fetch]
"""
COUNT = 20


@pytest.fixture(scope="module")
def masking_proxy(broker: TansuBroker, tmp_path_factory: pytest.TempPathFactory
                  ) -> Iterator[SluiceProxy]:
    cfg = tmp_path_factory.mktemp("new-protocols") / "sluice.yaml"
    cfg.write_text(CONFIG)
    with SluiceProxy(upstream=broker.bootstrap, config=cfg) as proxy:
        yield proxy


@pytest.fixture
def topic(broker: TansuBroker) -> str:
    """A topic the fetch filter covers, holding COUNT records with an e-mail address."""
    name = unique("np")
    create_topic(broker.bootstrap, name, partitions=2)
    confluent_produce(broker.bootstrap, name,
                      [(f"k{i}".encode(), SECRET + b" %d" % i) for i in range(COUNT)])
    return name


def read_with_group_protocol(bootstrap: str, topic: str, count: int) -> list[bytes]:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": unique("kip848"),
                         "group.protocol": "consumer", "auto.offset.reset": "earliest",
                         "enable.auto.commit": False, **QUIET})
    out: list[bytes] = []
    try:
        consumer.subscribe([topic])
        deadline = time.monotonic() + 40
        while len(out) < count and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is None or msg.error():
                continue
            out.append(msg.value() or b"")
    finally:
        consumer.close()
    return sorted(out)


@pytest.mark.parametrize("filtered", [False, True], ids=["no-filter", "fetch-mask"])
def test_kip848_consumer_group_protocol_through_the_proxy(
    broker: TansuBroker, shared_proxy: SluiceProxy, masking_proxy: SluiceProxy, topic: str,
    filtered: bool,
) -> None:
    direct = read_with_group_protocol(broker.bootstrap, topic, COUNT)
    assert len(direct) == COUNT and all(SECRET in v for v in direct)
    via = read_with_group_protocol(
        (masking_proxy if filtered else shared_proxy).bootstrap, topic, COUNT)
    if filtered:
        assert via == sorted(MASKED + b" %d" % i for i in range(COUNT))
    else:
        assert via == direct


def share_group(bootstrap: str) -> str:
    """A share group that starts at the earliest offset (share groups start at the latest)."""
    group = unique("share")
    admin = AdminClient({"bootstrap.servers": bootstrap, **QUIET})
    resource = ConfigResource(ConfigResource.Type.GROUP, group, incremental_configs=[
        ConfigEntry("share.auto.offset.reset", "earliest",
                    incremental_operation=AlterConfigOpType.SET)])
    for future in admin.incremental_alter_configs([resource]).values():
        future.result(20)
    return group


def share_read(bootstrap: str, group: str, topic: str, count: int, timeout: float
               ) -> tuple[list[bytes], list[str]]:
    consumer = ShareConsumer({"bootstrap.servers": bootstrap, "group.id": group, **QUIET})
    out: list[bytes] = []
    errors: list[str] = []
    try:
        consumer.subscribe([topic])
        deadline = time.monotonic() + timeout
        while len(out) < count and time.monotonic() < deadline:
            try:
                polled: Any = consumer.poll(0.5)
            except KafkaException as exc:
                errors.append(str(exc))
                continue
            for msg in polled:  # a Messages container, empty when nothing came
                if msg.error():
                    errors.append(str(msg.error()))
                    continue
                out.append(msg.value() or b"")
    finally:
        consumer.close()
    return sorted(out), errors


def test_share_consumer_unfiltered_reads_like_direct(
    broker: TansuBroker, shared_proxy: SluiceProxy, topic: str
) -> None:
    got, errors = share_read(shared_proxy.bootstrap, share_group(broker.bootstrap), topic,
                             COUNT, 60)
    assert got == sorted(SECRET + b" %d" % i for i in range(COUNT)), errors


def test_share_consumer_gets_nothing_unfiltered_when_a_fetch_filter_applies(
    broker: TansuBroker, masking_proxy: SluiceProxy, topic: str
) -> None:
    group = share_group(broker.bootstrap)
    got, _errors = share_read(masking_proxy.bootstrap, group, topic, COUNT, 15)
    assert not [v for v in got if b"alice@example.com" in v], got
    # The proxy does not advertise ShareFetch while fetch filters are on.
    with wire.RawConnection(masking_proxy.bootstrap) as conn:
        advertised = {int(k.api_key) for k in
                      conn.call(18, 3, wire.api_versions_request(3)).api_keys}
    assert int(ApiKey.SHARE_FETCH) not in advertised
    with wire.RawConnection(broker.bootstrap) as conn:
        direct = {int(k.api_key) for k in conn.call(18, 3, wire.api_versions_request(3)).api_keys}
    assert int(ApiKey.SHARE_FETCH) in direct, "control: Kafka 4.4 serves share groups"


def describe_topic_partitions(address: str, topic: str, version: int) -> Any:
    cls = request_schema(int(ApiKey.DESCRIBE_TOPIC_PARTITIONS), version)
    tcls = entities.element_class(cls, "topics")
    request = entities.build(cls, topics=(entities.build(tcls, name=topic),),
                             response_partition_limit=2000, cursor=None)
    with wire.RawConnection(address) as conn:
        return conn.call(int(ApiKey.DESCRIBE_TOPIC_PARTITIONS), version, request)


@pytest.mark.parametrize("filtered", [False, True], ids=["no-filter", "fetch-mask"])
def test_describe_topic_partitions_answers_as_direct(
    broker: TansuBroker, shared_proxy: SluiceProxy, masking_proxy: SluiceProxy, topic: str,
    filtered: bool,
) -> None:
    version = 0
    direct = describe_topic_partitions(broker.bootstrap, topic, version)
    via = describe_topic_partitions(
        (masking_proxy if filtered else shared_proxy).bootstrap, topic, version)
    (d,), (v,) = direct.topics, via.topics
    assert int(v.error_code) == 0 and v.name == topic and v.topic_id == d.topic_id
    assert [(int(p.partition_index), int(p.leader_id)) for p in v.partitions] == [
        (int(p.partition_index), int(p.leader_id)) for p in d.partitions]


def test_fetch_by_topic_id_is_masked(broker: TansuBroker, masking_proxy: SluiceProxy,
                                     topic: str) -> None:
    high = (codec_version_range(1) or (0, 0))[1]
    assert high >= 13
    with wire.RawConnection(broker.bootstrap) as conn:
        (meta,) = conn.call(3, 12, wire.metadata_request(12, [topic])).topics
    topic_id: uuid.UUID = meta.topic_id
    assert topic_id.int != 0

    def values(address: str) -> list[bytes]:
        out: list[bytes] = []
        with wire.RawConnection(address) as conn:
            for partition in (0, 1):
                response = conn.call(1, high, wire.fetch_request(high, topic_id, partition, 0))
                (t,) = response.responses
                assert t.topic_id == topic_id
                (p,) = t.partitions
                assert int(p.error_code) == 0
                batches, _tail = split_batches(p.records or b"")
                out += [r.value or b"" for b in batches for r in decode_records(b)]
        return sorted(out)

    direct, via = values(broker.bootstrap), values(masking_proxy.bootstrap)
    assert len(direct) == COUNT and all(SECRET in v for v in direct)
    assert via == sorted(MASKED + b" %d" % i for i in range(COUNT))

