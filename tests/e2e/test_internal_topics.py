"""The proxy's own topics (fleet, Kafka telemetry, dead letters) are out of reach of clients.

Each test plays an ordinary client of a real `sluice serve` in front of Tansu, with raw frames
(tests/harness/raw_kafka.py) or real clients, and judges from outside: the answer's error
codes, and the topics as the broker itself shows them. Operators (`security.operators`)
authenticate with SCRAM through the proxy to Kafka's own SASL_PLAINTEXT listener.
"""

from __future__ import annotations

import datetime
import functools
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AclOperation, AdminClient, NewTopic, ResourceType

from sluice.codec import entities, schemas
from sluice.codec.headers import response_header_size
from sluice.codec.messages import ApiKey, decode_response
from sluice.codec.records import BatchHeader, Record, build_batch
from sluice.proxy.ops.config import ConfigFileError, ProxyConfig
from sluice.proxy.ops.config_load import load_config_file
from sluice.proxy.paths.topics import is_null_id
from tests.e2e.clients import QUIET, confluent_consume, confluent_produce, create_topic, unique
from tests.harness import raw_kafka as rk
from tests.harness.broker import TansuBroker
from tests.harness.kafka_admin import KafkaAdmin
from tests.harness.kafka_broker import KafkaCluster
from tests.harness.ports import free_port
from tests.harness.proxy import SluiceProxy
from tests.proxy.fleet_keys import operator, proxy_key
from tests.proxy.test_fleet import MASKED, fleet_args, produce_and_read, sluice
from tests.proxy.test_reload import events, wait_for

DENIED = 29  # TOPIC_AUTHORIZATION_FAILED


@pytest.fixture(scope="module")
def guarded(broker: TansuBroker, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """A proxy following a fleet topic and writing telemetry to a Kafka topic."""
    tmp = tmp_path_factory.mktemp("internal")
    fleet = unique("_sluice_filters")
    telemetry = unique("sluice-telemetry")
    metrics_port = free_port()
    data = unique("data")
    dead = unique("sluice-dlq")
    for topic in (telemetry, data, dead):
        create_topic(broker.bootstrap, topic)
    config = tmp / "sluice.yaml"
    config.write_text(yaml.safe_dump({
        "fleet": {"topic": fleet, "heartbeat_seconds": 1, "poll_seconds": 0.5,
                  "trusted_keys": [f"{operator().path}.pub", f"{proxy_key().path}.pub"],
                  "signing_key": proxy_key().path},
        "filters": [{"name": "json", "module": "builtin:json-validate", "topics": ["json-*"],
                     "apply_to": ["produce"], "on_error": "dead-letter",
                     "dead_letter_topic": dead}],
        "module_cache_dir": str(tmp / "modules"),
        "metrics": {"listen": f"127.0.0.1:{metrics_port}"},
        "telemetry": {"kafka": {"bootstrap": broker.bootstrap, "topic": telemetry,
                                "format": "json"}},
    }))
    proxy = SluiceProxy(upstream=broker.bootstrap, config=config).start()
    try:
        proc = sluice("filter", "deploy", "pii", "builtin:pii-mask", "--topics", data,
                      "--on", "produce", *fleet_args(broker, fleet))
        assert proc.returncode == 0, proc.stderr
        wait_for(functools.partial(binds, proxy, "pii"), 30, "fleet deploy")
        yield {"proxy": proxy, "fleet": fleet, "telemetry": telemetry, "data": data,
               "dead": dead, "port": proxy.port, "metrics": metrics_port}
    finally:
        proxy.stop()


def binds(proxy: SluiceProxy, name: str) -> bool:
    installed = events(proxy, "chain_installed")
    return bool(installed) and name in [f["name"] for f in installed[-1]["filters"]]


# ------------------------------------------------------------------ raw requests


def item(api: int, version: int, path: tuple[str, ...], **fields: Any) -> Any:
    """An entity of the element class at `path` of a request schema."""
    cls = schemas.request_schema(api, version)
    for name in path:
        cls = entities.element_class(cls, name)
    return entities.build(cls, **fields)


def call(port: int, api: int, version: int, **fields: Any) -> Any:
    """One request on a new connection; the decoded answer (the proxy must answer)."""
    body, _ = rk.exchange_one(port, rk.request_frame(api, version, 7, **fields))
    return decode_response(api, version, body[response_header_size(body, api, version):])


def metadata(port: int, topics: list[str] | None, version: int = 12,
             auto_create: bool = False) -> dict[str, Any]:
    named = None if topics is None else tuple(
        item(ApiKey.METADATA, version, ("topics",), name=t) for t in topics)
    answer = call(port, ApiKey.METADATA, version, topics=named,
                  allow_auto_topic_creation=auto_create)
    return {str(t.name): t for t in answer.topics}


def batch(key: bytes | None, value: bytes | None) -> bytes:
    now = int(time.time() * 1000)
    return build_batch(BatchHeader(0, 0, -1, 2, 0, 0, 0, now, now, -1, -1, -1, 1),
                       [Record(0, 0, key, value, [])])


def produce(port: int, records: dict[str, bytes], version: int = 9) -> dict[str, int]:
    """Produce one batch per topic (partition 0); error code per topic."""
    topics = tuple(
        item(ApiKey.PRODUCE, version, ("topic_data",), name=t, partition_data=(
            item(ApiKey.PRODUCE, version, ("topic_data", "partition_data"), index=0,
                 records=r),))
        for t, r in records.items())
    answer = call(port, ApiKey.PRODUCE, version, transactional_id=None, acks=-1,
                  timeout=datetime.timedelta(seconds=10), topic_data=topics)
    return {str(t.name): int(p.error_code) for t in answer.responses
            for p in t.partition_responses}


def high_watermark(bootstrap: str, topic: str) -> int:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": unique("g"), **QUIET})
    try:
        return int(consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=10)[1])
    finally:
        consumer.close()


def values_since(bootstrap: str, topic: str, offset: int) -> list[bytes]:
    """The values of partition 0 of `topic` from `offset` to its current end."""
    end = high_watermark(bootstrap, topic)
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": unique("g"), **QUIET})
    out: list[bytes] = []
    try:
        consumer.assign([TopicPartition(topic, 0, offset)])
        deadline = time.monotonic() + 20
        while offset + len(out) < end and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is not None and not msg.error():
                out.append(msg.value() or b"")
    finally:
        consumer.close()
    assert offset + len(out) >= end, f"read {len(out)} of {end - offset} records"
    return out


def only_heartbeats_since(bootstrap: str, topic: str, offset: int) -> bool:
    """Whether the fleet topic gained nothing since `offset` but the proxy's own heartbeats
    (one a second: comparing high watermarks raced with them)."""
    return all(b'"type":"instance"' in value for value in values_since(bootstrap, topic, offset))


def broker_topics(broker: TansuBroker) -> set[str]:
    return set(AdminClient({"bootstrap.servers": broker.bootstrap, **QUIET})
               .list_topics(timeout=10).topics)


# ------------------------------------------------------------------ the attacks


def test_fleet_tombstone_and_forged_record_are_refused(guarded: Any, broker: TansuBroker
                                                       ) -> None:
    fleet, port = guarded["fleet"], guarded["port"]
    before = high_watermark(broker.bootstrap, fleet)
    forged = json.dumps({"format": 1, "name": "evil", "module": "builtin:pii-mask",
                         "topics": ["*"], "apply_to": ["produce", "fetch"]}).encode()
    assert produce(port, {fleet: batch(b"filter:pii", None)}) == {fleet: DENIED}
    assert produce(port, {fleet: batch(b"filter:evil", forged)}, version=3) == {fleet: DENIED}
    # A real producer gets the same answer.
    errors: list[KafkaError] = []
    producer = Producer({"bootstrap.servers": guarded["proxy"].bootstrap,
                         "message.timeout.ms": 10000, **QUIET})
    producer.produce(fleet, key=b"filter:pii", value=None,
                     on_delivery=lambda err, _msg: errors.append(err))
    producer.flush(20)
    assert [e.code() for e in errors] == [KafkaError.TOPIC_AUTHORIZATION_FAILED]
    assert only_heartbeats_since(broker.bootstrap, fleet, before)
    # Counted: the two raw Produce requests, and librdkafka's Metadata request (it learns
    # TOPIC_AUTHORIZATION_FAILED there and never sends the record).
    lines = rk.series(rk.scrape(guarded["metrics"]), "sluice_internal_topic_refusals_total")
    counts = {line.split('api="')[1].split('"')[0]: float(line.rsplit(" ", 1)[1])
              for line in lines}
    assert counts.get("produce", 0) >= 2 and counts.get("metadata", 0) >= 1, lines
    # The fleet's filter still masks: the proxy's own fleet consumer reads the broker directly.
    masked = produce_and_read(broker, guarded["proxy"], guarded["data"], "after")
    assert b"@example.com" not in masked and MASKED.search(masked), masked


def test_mixed_produce_refuses_only_the_internal_topic(guarded: Any, broker: TansuBroker
                                                       ) -> None:
    fleet, data, port = guarded["fleet"], guarded["data"], guarded["port"]
    before = high_watermark(broker.bootstrap, fleet)
    answer = produce(port, {fleet: batch(b"filter:pii", None),
                            data: batch(b"k", b"mixed a@example.com")})
    assert answer == {fleet: DENIED, data: 0}
    assert only_heartbeats_since(broker.bootstrap, fleet, before)
    stored = confluent_consume(broker.bootstrap, data, high_watermark(broker.bootstrap, data))
    assert stored[-1][1] is not None and b"a@example.com" not in stored[-1][1]


def fetch_request(version: int, topics: list[tuple[str | None, Any]]) -> dict[str, Any]:
    return dict(
        replica_id=-1, max_wait=datetime.timedelta(milliseconds=200), min_bytes=1,
        max_bytes=1 << 20, isolation_level=0, session_id=0, session_epoch=-1,
        topics=tuple(item(ApiKey.FETCH, version, ("topics",), topic=name, topic_id=tid,
                          partitions=(item(ApiKey.FETCH, version, ("topics", "partitions"),
                                           partition=0, fetch_offset=0, current_leader_epoch=-1,
                                           last_fetched_epoch=-1, log_start_offset=-1,
                                           partition_max_bytes=1 << 20),))
                     for name, tid in topics),
        forgotten_topics_data=(), rack_id="")


def test_telemetry_topic_cannot_be_read(guarded: Any, broker: TansuBroker) -> None:
    telemetry, data, port = guarded["telemetry"], guarded["data"], guarded["port"]
    produce_and_read(broker, guarded["proxy"], data, "telemetry-source")
    # The proxy's own telemetry sink still writes (it connects to the broker directly).
    wait_for(lambda: high_watermark(broker.bootstrap, telemetry) > 0, 30, "telemetry")
    answer = call(port, ApiKey.FETCH, 12, **fetch_request(12, [(telemetry, None), (data, None)]))
    parts = {str(t.topic): t.partitions[0] for t in answer.responses}
    assert int(parts[telemetry].error_code) == DENIED and not parts[telemetry].records
    assert int(parts[data].error_code) == 0 and parts[data].records
    # By topic id (Fetch v13+), with the id learnt from the broker itself.
    direct = metadata(int(broker.bootstrap.rsplit(":", 1)[1]), [telemetry])
    topic_id = direct[telemetry].topic_id
    answer = call(port, ApiKey.FETCH, 13, **fetch_request(13, [(None, topic_id)]))
    assert [(t.topic_id, int(t.partitions[0].error_code), bool(t.partitions[0].records))
            for t in answer.responses] == [(topic_id, DENIED, False)]
    # ListOffsets, and a real consumer.
    answer = call(port, ApiKey.LIST_OFFSETS, 5, replica_id=-1, isolation_level=0, topics=(
        item(ApiKey.LIST_OFFSETS, 5, ("topics",), name=telemetry, partitions=(
            item(ApiKey.LIST_OFFSETS, 5, ("topics", "partitions"), partition_index=0,
                 timestamp=-1, current_leader_epoch=-1),)),))
    assert [int(p.error_code) for t in answer.topics for p in t.partitions] == [DENIED]
    consumer = Consumer({"bootstrap.servers": guarded["proxy"].bootstrap, "group.id": unique("g"),
                         "auto.offset.reset": "earliest", **QUIET})
    try:
        # librdkafka does not find the topic in Metadata: it never gets a record.
        consumer.assign([TopicPartition(telemetry, 0, 0)])
        deadline, records = time.monotonic() + 5, []
        while time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is not None and msg.error() is None:
                records.append(msg.value())
        assert records == []
    finally:
        consumer.close()


def test_metadata_does_not_offer_internal_topics(guarded: Any, broker: TansuBroker) -> None:
    fleet, telemetry, data, port = (guarded["fleet"], guarded["telemetry"], guarded["data"],
                                    guarded["port"])
    dead = guarded["dead"]
    assert {fleet, telemetry, dead} <= broker_topics(broker)
    listed = metadata(port, None)
    assert data in listed and not {fleet, telemetry, dead} & set(listed)
    named = metadata(port, [fleet, data], auto_create=True)
    assert int(named[fleet].error_code) == DENIED and not named[fleet].partitions
    assert int(named[data].error_code) == 0
    admin = AdminClient({"bootstrap.servers": guarded["proxy"].bootstrap, **QUIET})
    seen = set(admin.list_topics(timeout=10).topics)
    assert data in seen and not {fleet, telemetry, dead} & seen
    # Dead letters are the proxy's to write: a client cannot forge one.
    assert produce(port, {dead: batch(b"k", b"forged letter")}) == {dead: DENIED}
    # Auto-creating a name the proxy keeps for itself (here: the default fleet topic, which
    # this cluster does not have) creates nothing.
    if "_sluice_filters" not in broker_topics(broker):
        answer = metadata(port, ["_sluice_filters"], auto_create=True)
        assert int(answer["_sluice_filters"].error_code) == DENIED
        assert "_sluice_filters" not in broker_topics(broker)


def test_admin_apis_on_the_fleet_topic_are_refused(guarded: Any, broker: TansuBroker) -> None:
    fleet, port = guarded["fleet"], guarded["port"]
    before = high_watermark(broker.bootstrap, fleet)
    K = ApiKey

    def topic_codes(answer: Any, field: str = "topics", parts: str = "partitions",
                    error: str = "error_code") -> list[int]:
        return [int(getattr(p, error)) for t in getattr(answer, field) for p in getattr(t, parts)]

    answer = call(port, K.DELETE_TOPICS, 4, topic_names=(fleet,),
                  timeout=datetime.timedelta(seconds=5))
    assert [(r.name, int(r.error_code)) for r in answer.responses] == [(fleet, DENIED)]
    answer = call(port, K.DELETE_TOPICS, 6, topics=(
        item(K.DELETE_TOPICS, 6, ("topics",), name=fleet),), timeout=datetime.timedelta(seconds=5))
    assert [int(r.error_code) for r in answer.responses] == [DENIED]
    answer = call(port, K.DELETE_RECORDS, 2, topics=(
        item(K.DELETE_RECORDS, 2, ("topics",), name=fleet, partitions=(
            item(K.DELETE_RECORDS, 2, ("topics", "partitions"), partition_index=0,
                 offset=-1),)),), timeout=datetime.timedelta(seconds=5))
    assert topic_codes(answer) == [DENIED]
    answer = call(port, K.CREATE_PARTITIONS, 3, topics=(
        item(K.CREATE_PARTITIONS, 3, ("topics",), name=fleet, count=4, assignments=None),),
        timeout=datetime.timedelta(seconds=5), validate_only=False)
    assert [int(r.error_code) for r in answer.results] == [DENIED]
    answer = call(port, K.CREATE_TOPICS, 5, topics=(
        item(K.CREATE_TOPICS, 5, ("topics",), name=fleet, num_partitions=1,
             replication_factor=1),), timeout=datetime.timedelta(seconds=5))
    assert [int(r.error_code) for r in answer.topics] == [DENIED]
    for api, version in ((K.INCREMENTAL_ALTER_CONFIGS, 1), (K.ALTER_CONFIGS, 1)):
        extra = {"config_operation": 0} if api == K.INCREMENTAL_ALTER_CONFIGS else {}
        answer = call(port, api, version, validate_only=False, resources=(
            item(api, version, ("resources",), resource_type=2, resource_name=fleet, configs=(
                item(api, version, ("resources", "configs"), name="cleanup.policy",
                     value="delete", **extra),)),))
        assert [int(r.error_code) for r in answer.responses] == [DENIED]
    answer = call(port, K.DESCRIBE_CONFIGS, 4, resources=(
        item(K.DESCRIBE_CONFIGS, 4, ("resources",), resource_type=2, resource_name=fleet,
             configuration_keys=None),))
    assert [int(r.error_code) for r in answer.results] == [DENIED]
    # Offsets and transactions naming the topic.
    answer = call(port, K.OFFSET_COMMIT, 8, group_id="g", generation_id_or_member_epoch=-1,
                  member_id="", topics=(item(K.OFFSET_COMMIT, 8, ("topics",), name=fleet,
                  partitions=(item(K.OFFSET_COMMIT, 8, ("topics", "partitions"),
                                   partition_index=0, committed_offset=0),)),))
    assert topic_codes(answer) == [DENIED]
    answer = call(port, K.OFFSET_FETCH, 7, group_id="g", topics=(
        item(K.OFFSET_FETCH, 7, ("topics",), name=fleet, partition_indexes=(0,)),))
    assert topic_codes(answer) == [DENIED]
    answer = call(port, K.OFFSET_FETCH, 8, groups=(item(K.OFFSET_FETCH, 8, ("groups",),
                  group_id="g", topics=(item(K.OFFSET_FETCH, 8, ("groups", "topics"),
                                             name=fleet, partition_indexes=(0,)),)),))
    assert [int(p.error_code) for g in answer.groups for t in g.topics
            for p in t.partitions] == [DENIED]
    answer = call(port, K.OFFSET_DELETE, 0, group_id="g", topics=(
        item(K.OFFSET_DELETE, 0, ("topics",), name=fleet, partitions=(
            item(K.OFFSET_DELETE, 0, ("topics", "partitions"), partition_index=0),)),))
    assert topic_codes(answer) == [DENIED]
    answer = call(port, K.TXN_OFFSET_COMMIT, 3, transactional_id="t", group_id="g",
                  producer_id=1, producer_epoch=0, topics=(
                      item(K.TXN_OFFSET_COMMIT, 3, ("topics",), name=fleet, partitions=(
                          item(K.TXN_OFFSET_COMMIT, 3, ("topics", "partitions"),
                               partition_index=0, committed_offset=0),)),))
    assert topic_codes(answer) == [DENIED]
    answer = call(port, K.ADD_PARTITIONS_TO_TXN, 3, v3_and_below_transactional_id="t",
                  v3_and_below_producer_id=1, v3_and_below_producer_epoch=0,
                  v3_and_below_topics=(item(K.ADD_PARTITIONS_TO_TXN, 3, ("v3_and_below_topics",),
                                            name=fleet, partitions=(0,)),))
    assert topic_codes(answer, "results_by_topic_v3_and_below", "results_by_partition",
                       "partition_error_code") == [DENIED]
    answer = call(port, K.ELECT_LEADERS, 2, election_type=0, topic_partitions=(
        item(K.ELECT_LEADERS, 2, ("topic_partitions",), topic=fleet, partitions=(0,)),),
        timeout=datetime.timedelta(seconds=5))
    assert topic_codes(answer, "replica_election_results", "partition_result") == [DENIED]
    answer = call(port, K.ALTER_PARTITION_REASSIGNMENTS, 0, timeout=datetime.timedelta(seconds=5),
                  topics=(item(K.ALTER_PARTITION_REASSIGNMENTS, 0, ("topics",), name=fleet,
                               partitions=(item(K.ALTER_PARTITION_REASSIGNMENTS, 0,
                                                ("topics", "partitions"), partition_index=0,
                                                replicas=(1,)),)),))
    assert topic_codes(answer, "responses") == [DENIED]
    answer = call(port, K.DESCRIBE_PRODUCERS, 0, topics=(
        item(K.DESCRIBE_PRODUCERS, 0, ("topics",), name=fleet, partition_indexes=(0,)),))
    assert topic_codes(answer) == [DENIED]
    answer = call(port, K.OFFSET_FOR_LEADER_EPOCH, 4, replica_id=-1, topics=(
        item(K.OFFSET_FOR_LEADER_EPOCH, 4, ("topics",), topic=fleet, partitions=(
            item(K.OFFSET_FOR_LEADER_EPOCH, 4, ("topics", "partitions"), partition=0,
                 current_leader_epoch=-1, leader_epoch=0),)),))
    assert topic_codes(answer) == [DENIED]
    # Nothing happened to the topic: what it gained meanwhile is the proxy's own heartbeats
    # (one a second), never anything of the requests above.
    assert fleet in broker_topics(broker)
    assert only_heartbeats_since(broker.bootstrap, fleet, before)


def test_more_apis_and_keys_on_the_internal_topics_are_refused(guarded: Any,
                                                              broker: TansuBroker) -> None:
    """The next tries after the admin APIs: DescribeTopicPartitions, batched
    AddPartitionsToTxn (v4+, several transactions), writing the telemetry topic, and a
    `policy:` tombstone or forged policy through the proxy (the policy_admins bypass)."""
    fleet, telemetry, data, port = (guarded["fleet"], guarded["telemetry"], guarded["data"],
                                    guarded["port"])
    K = ApiKey
    before = high_watermark(broker.bootstrap, fleet)
    answer = call(port, K.DESCRIBE_TOPIC_PARTITIONS, 0, response_partition_limit=100,
                  cursor=None, topics=tuple(item(K.DESCRIBE_TOPIC_PARTITIONS, 0, ("topics",),
                                                 name=t) for t in (fleet, telemetry)))
    assert sorted((str(t.name), int(t.error_code), len(t.partitions))
                  for t in answer.topics) == sorted([(fleet, DENIED, 0), (telemetry, DENIED, 0)])
    for version in (4, 5):
        answer = call(port, K.ADD_PARTITIONS_TO_TXN, version, transactions=tuple(
            item(K.ADD_PARTITIONS_TO_TXN, version, ("transactions",), transactional_id=tid,
                 producer_id=1, producer_epoch=0, verify_only=False, topics=(
                     item(K.ADD_PARTITIONS_TO_TXN, version, ("transactions", "topics"),
                          name=topic, partitions=(0,)),))
            for tid, topic in (("t1", fleet), ("t2", telemetry))))
        codes = sorted((str(t.name), int(p.partition_error_code))
                       for r in answer.results_by_transaction for t in r.topic_results
                       for p in t.results_by_partition)
        assert codes == sorted([(fleet, DENIED), (telemetry, DENIED)]), (version, codes)
    telemetry_before = high_watermark(broker.bootstrap, telemetry)
    forged_row = json.dumps({"type": "record_batch", "principal": "User:victim",
                             "bytes": 5 * 10**12}).encode()
    assert produce(port, {telemetry: batch(None, forged_row)}) == {telemetry: DENIED}
    topic = "crm"
    assert produce(port, {fleet: batch(f"policy:{topic}".encode(), None)}) == {fleet: DENIED}
    forged = json.dumps({"format": 1, "type": "policy", "topic": topic,
                         "value": json.dumps({"filters": []}), "set_by": "User:admin"}).encode()
    assert produce(port, {fleet: batch(f"policy:{topic}".encode(), forged),
                          data: batch(b"k", b"v")}) == {fleet: DENIED, data: 0}
    assert only_heartbeats_since(broker.bootstrap, fleet, before)
    assert all(forged_row not in v
               for v in values_since(broker.bootstrap, telemetry, telemetry_before))


def test_acks_0_all_topics_metadata_and_topic_ids_do_not_reach_the_internal_topics(
        guarded: Any, broker: TansuBroker) -> None:
    """A Produce with acks=0 (no answer is due: the proxy must still drop it), Metadata v0's
    empty list (all topics), and DeleteTopics naming the fleet topic by id only."""
    fleet, telemetry, dead, port = (guarded["fleet"], guarded["telemetry"], guarded["dead"],
                                    guarded["port"])
    before = high_watermark(broker.bootstrap, fleet)
    tombstone = rk.request_frame(
        ApiKey.PRODUCE, 9, 5, transactional_id=None, acks=0,
        timeout=datetime.timedelta(seconds=10), topic_data=(
            item(ApiKey.PRODUCE, 9, ("topic_data",), name=fleet, partition_data=(
                item(ApiKey.PRODUCE, 9, ("topic_data", "partition_data"), index=0,
                     records=batch(b"filter:pii", None)),)),))
    with rk.connect(port) as sock:
        sock.sendall(tombstone)
        sock.sendall(rk.metadata_frame(6, None, version=0))
        body = rk.recv_frame(sock)  # the next answer is Metadata's: the Produce has none
    assert body is not None and rk.correlation_id(body) == 6
    answer = decode_response(ApiKey.METADATA, 0, body[response_header_size(
        body, ApiKey.METADATA, 0):])
    listed = {str(t.name) for t in answer.topics}
    assert guarded["data"] in listed and not {fleet, telemetry, dead} & listed
    direct = metadata(int(broker.bootstrap.rsplit(":", 1)[1]), [fleet])
    answer = call(port, ApiKey.DELETE_TOPICS, 6, timeout=datetime.timedelta(seconds=5),
                  topics=(item(ApiKey.DELETE_TOPICS, 6, ("topics",), name=None,
                               topic_id=direct[fleet].topic_id),))
    assert [int(r.error_code) for r in answer.responses] == [DENIED]
    assert fleet in broker_topics(broker)
    assert only_heartbeats_since(broker.bootstrap, fleet, before)
    # The fleet's filter still masks.
    masked = produce_and_read(broker, guarded["proxy"], guarded["data"], "acks0")
    assert b"@example.com" not in masked and MASKED.search(masked), masked


def test_produce_by_topic_id_to_the_fleet_topic_is_refused(guarded: Any,
                                                           broker: TansuBroker) -> None:
    """Produce v13 names topics by id only (KIP-516): a tombstone for the fleet's filter sent
    to the fleet topic's id (learnt from the broker) is refused; the client topic beside it
    is stored, masked."""
    fleet, data, port = guarded["fleet"], guarded["data"], guarded["port"]
    ids = metadata(int(broker.bootstrap.rsplit(":", 1)[1]), [fleet, data])
    before = high_watermark(broker.bootstrap, fleet)
    topics = tuple(
        item(ApiKey.PRODUCE, 13, ("topic_data",), topic_id=ids[t].topic_id, partition_data=(
            item(ApiKey.PRODUCE, 13, ("topic_data", "partition_data"), index=0, records=r),))
        for t, r in ((fleet, batch(b"filter:pii", None)),
                     (data, batch(b"k", b"by id b@example.com"))))
    answer = call(port, ApiKey.PRODUCE, 13, transactional_id=None, acks=-1,
                  timeout=datetime.timedelta(seconds=10), topic_data=topics)
    codes = {t.topic_id: int(p.error_code) for t in answer.responses
             for p in t.partition_responses}
    assert codes == {ids[fleet].topic_id: DENIED, ids[data].topic_id: 0}
    assert only_heartbeats_since(broker.bootstrap, fleet, before)
    stored = confluent_consume(broker.bootstrap, data, high_watermark(broker.bootstrap, data))
    assert stored[-1][1] is not None and b"b@example.com" not in stored[-1][1]
    masked = produce_and_read(broker, guarded["proxy"], data, "by-id")
    assert b"@example.com" not in masked and MASKED.search(masked), masked


def test_metadata_by_topic_id_and_listing_cursors_do_not_offer_internal_topics(
        guarded: Any, broker: TansuBroker) -> None:
    """Metadata v12 naming the fleet topic by id only (and DeleteTopics v6), and
    DescribeTopicPartitions listing every topic from a cursor set on the fleet topic: neither
    answer describes it, and a refusal gives away neither the name of an id nor the id of a
    name, as Kafka's own refusals do not."""
    fleet, telemetry, dead, port = (guarded["fleet"], guarded["telemetry"], guarded["dead"],
                                    guarded["port"])
    K = ApiKey
    direct = metadata(int(broker.bootstrap.rsplit(":", 1)[1]), [fleet])
    answer = call(port, K.METADATA, 12, allow_auto_topic_creation=False, topics=(
        item(K.METADATA, 12, ("topics",), name=None, topic_id=direct[fleet].topic_id),))
    # As Kafka answers an id the client may not describe: the error, the id, no name.
    described = [(t.name, t.topic_id, int(t.error_code), len(t.partitions))
                 for t in answer.topics]
    assert described == [(None, direct[fleet].topic_id, DENIED, 0)], described
    # Named by name, the answer does not give its id away (Kafka answers the null id).
    named = metadata(port, [fleet])
    assert int(named[fleet].error_code) == DENIED and is_null_id(named[fleet].topic_id)
    answer = call(port, K.DELETE_TOPICS, 6, timeout=datetime.timedelta(seconds=5), topics=(
        item(K.DELETE_TOPICS, 6, ("topics",), name=None, topic_id=direct[fleet].topic_id),))
    assert [(r.name, int(r.error_code)) for r in answer.responses] == [(None, DENIED)]
    answer = call(port, K.DESCRIBE_TOPIC_PARTITIONS, 0, response_partition_limit=1000,
                  topics=(), cursor=item(K.DESCRIBE_TOPIC_PARTITIONS, 0, ("cursor",),
                                         topic_name=fleet, partition_index=0))
    listed = {str(t.name) for t in answer.topics}
    assert not {fleet, telemetry, dead} & listed, listed


def test_mixed_delete_topics_deletes_only_the_client_topic(guarded: Any, broker: TansuBroker
                                                           ) -> None:
    fleet, port = guarded["fleet"], guarded["port"]
    scratch = unique("scratch")
    create_topic(broker.bootstrap, scratch)
    admin = AdminClient({"bootstrap.servers": guarded["proxy"].bootstrap, **QUIET})
    futures = admin.delete_topics([fleet, scratch], operation_timeout=10)
    futures[scratch].result(20)
    with pytest.raises(KafkaException) as err:
        futures[fleet].result(20)
    assert err.value.args[0].code() == KafkaError.TOPIC_AUTHORIZATION_FAILED
    wait_for(lambda: scratch not in broker_topics(broker), 20, "scratch deleted")
    assert fleet in broker_topics(broker)
    # Mixed DescribeConfigs: the client's topic is described, the fleet topic refused.
    answer = call(port, ApiKey.DESCRIBE_CONFIGS, 4, resources=tuple(
        item(ApiKey.DESCRIBE_CONFIGS, 4, ("resources",), resource_type=2, resource_name=t,
             configuration_keys=None) for t in (fleet, guarded["data"])))
    assert {str(r.resource_name): int(r.error_code) for r in answer.results} == {
        fleet: DENIED, guarded["data"]: 0}


# ------------------------------------------------------------------ operators


# `ops` is made for this module (a SCRAM user of the session's Kafka node, removed after);
# `alice` is one of the node's users. Passwords: filled in by `sasl_broker`.
USERS: dict[str, str] = {"ops": "ops-Pa55word-1"}


def sasl(user: str) -> dict[str, Any]:
    return {"security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "SCRAM-SHA-512",
            "sasl.username": user, "sasl.password": USERS[user], **QUIET}


@pytest.fixture(scope="module")
def sasl_broker(kafka_broker: KafkaCluster) -> Iterator[KafkaCluster]:
    USERS["alice"] = kafka_broker.password("alice")
    admin = KafkaAdmin(kafka_broker)
    admin.add_scram_user("ops", USERS["ops"])
    try:
        yield kafka_broker
    finally:
        admin.remove_scram_user("ops")


def test_operators_reach_internal_topics(sasl_broker: KafkaCluster, tmp_path: Path) -> None:
    """Kafka lets both ops and alice use the topic (ACLs below): only the proxy keeps alice
    out, because it is internal and she is no operator."""
    internal = unique("audit-mirror")
    config = tmp_path / "sluice.yaml"
    config.write_text(yaml.safe_dump({"security": {"operators": ["User:ops"],
                                                   "internal_topics": [internal]}}))
    admin = KafkaAdmin(sasl_broker)
    grants = [b for user in ("ops", "alice")
              for b in admin.grant(f"User:{user}", ResourceType.TOPIC, internal, AclOperation.ALL)]
    # librdkafka looks up a group coordinator even for a consumer that assigns itself.
    grants += admin.grant("User:ops", ResourceType.GROUP, "assign-", AclOperation.READ,
                          prefixed=True)
    try:
        direct = sasl_broker.bootstrap_for("SASL_PLAINTEXT")
        with SluiceProxy(upstream=direct, config=config) as proxy:
            operators_and_others(proxy, internal, direct)
    finally:
        admin.revoke(grants)


def operators_and_others(proxy: SluiceProxy, internal: str, direct: str) -> None:
    deadline = time.monotonic() + 20
    while True:  # the new user and ACLs reach the broker through its metadata log
        ops = AdminClient({"bootstrap.servers": proxy.bootstrap, **sasl("ops")})
        try:
            for fut in ops.create_topics([NewTopic(internal, 1, 1)]).values():
                fut.result(20)
            break
        except KafkaException:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.3)
    assert internal in ops.list_topics(timeout=10).topics
    alice = AdminClient({"bootstrap.servers": proxy.bootstrap, **sasl("alice")})
    assert internal not in alice.list_topics(timeout=10).topics
    results: dict[str, list[Any]] = {"ops": [], "alice": [], "alice-direct": []}
    for user, bootstrap in (("ops", proxy.bootstrap), ("alice", proxy.bootstrap),
                            ("alice-direct", direct)):
        producer = Producer({"bootstrap.servers": bootstrap, "message.timeout.ms": 10000,
                             **sasl(user.removesuffix("-direct"))})
        producer.produce(internal, value=user.encode(),
                         on_delivery=lambda err, _m, u=user: results[u].append(err))
        producer.flush(20)
    assert results["ops"] == [None]
    assert [e.code() for e in results["alice"]] == [KafkaError.TOPIC_AUTHORIZATION_FAILED]
    assert results["alice-direct"] == [None]  # Kafka itself would let her
    stored = confluent_consume(proxy.bootstrap, internal, 2, **sasl("ops"))
    assert [v for _k, v in stored] == [b"ops", b"alice-direct"]


# ------------------------------------------------------------------ configuration


@pytest.mark.parametrize(("text", "message"), [
    ("security:\n  operators: User:ops\n", ":2: security.operators: must be a list"),
    ("security:\n  operators:\n    - ops\n", ":3: security.operators[0]: must be a principal"),
    ("security:\n  operators:\n    - User:ops-*\n", ":3: security.operators[0]: must name one"),
    ("security:\n  internal_topics:\n    - a b\n",
     ":3: security.internal_topics[0]: must be a Kafka topic name"),
    ("security:\n  operator: [User:ops]\n", ":2: security.operator: unknown key"),
])
def test_security_section_errors_name_line_and_field(tmp_path: Path, text: str,
                                                     message: str) -> None:
    path = tmp_path / "sluice.yaml"
    path.write_text(text)
    with pytest.raises(ConfigFileError) as err:
        load_config_file(path, ProxyConfig(listen=("127.0.0.1", 0), upstream=[("h", 1)]))
    assert message in str(err.value) and str(path) in str(err.value)




# ------------------------------------------------------------------ auto-creation and topic policy


def _policed(upstream: str, tmp_path_factory: pytest.TempPathFactory) -> SluiceProxy:
    """A proxy whose topic policy allows only lower-case names with dashes."""
    config = tmp_path_factory.mktemp("policy") / "sluice.yaml"
    config.write_text(yaml.safe_dump({"filters": [{
        "name": "topic-policy", "module": "builtin:topic-policy", "topics": ["*"],
        "apply_to": ["admin"], "config": {"name_pattern": "^[a-z0-9-]+$"}}]}))
    return SluiceProxy(upstream=upstream, config=config)


@pytest.fixture(scope="module")
def policed(broker: TansuBroker, tmp_path_factory: pytest.TempPathFactory) -> Iterator[SluiceProxy]:
    with _policed(broker.bootstrap, tmp_path_factory) as proxy:
        yield proxy


@pytest.fixture(scope="module")
def policed_tansu(
    tansu_broker: TansuBroker, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[SluiceProxy]:
    """The same proxy in front of Tansu, which auto-creates a topic on the Metadata request
    that names it (answering error 0 at once) and on a Produce to it: the tests of the
    auto-creation rewrite need a broker that creates on every path. Apache Kafka (KRaft)
    creates only on Metadata, and its first answer for a new topic is
    UNKNOWN_TOPIC_OR_PARTITION, directly as through the proxy (tests/e2e/test_auto_creation.py)."""
    with _policed(tansu_broker.bootstrap, tmp_path_factory) as proxy:
        yield proxy


def test_metadata_auto_creation_obeys_the_topic_policy(policed_tansu: SluiceProxy,
                                                       tansu_broker: TansuBroker) -> None:
    policed, broker = policed_tansu, tansu_broker
    allowed, forbidden = unique("fine"), unique("Not_Allowed")
    answer = metadata(policed.port, [forbidden], version=9, auto_create=True)
    assert int(answer[forbidden].error_code) == 3  # UNKNOWN_TOPIC_OR_PARTITION
    assert forbidden not in broker_topics(broker)
    answer = metadata(policed.port, [allowed], version=9, auto_create=True)
    assert int(answer[allowed].error_code) == 0 and allowed in broker_topics(broker)
    # v0-3 cannot turn auto-creation off: the proxy closes rather than let the broker create.
    with rk.connect(policed.port) as sock:
        sock.sendall(rk.metadata_frame(9, [forbidden], version=3))
        assert rk.closed_by_peer(sock, 10)
    assert forbidden not in broker_topics(broker)


def test_producer_auto_creation_obeys_the_topic_policy(policed: SluiceProxy,
                                                       broker: TansuBroker) -> None:
    forbidden = unique("Not_Allowed")
    errors: list[Any] = []
    producer = Producer({"bootstrap.servers": policed.bootstrap, "message.timeout.ms": 3000,
                         "allow.auto.create.topics": True, **QUIET})
    producer.produce(forbidden, value=b"x", on_delivery=lambda err, _m: errors.append(err))
    producer.flush(15)
    assert len(errors) == 1 and errors[0] is not None
    assert forbidden not in broker_topics(broker)
    allowed = unique("fine")
    [(_partition, offset)] = confluent_produce(policed.bootstrap, allowed, [(None, b"y")])
    assert offset == 0
    assert allowed in broker_topics(broker)


def stored_records(broker: TansuBroker, topic: str) -> bytes:
    """What the broker holds in partition 0 of `topic` (Tansu keeps records produced to a
    topic it does not list)."""
    port = int(broker.bootstrap.rsplit(":", 1)[1])
    answer = call(port, ApiKey.FETCH, 12, **fetch_request(12, [(topic, None)]))
    return b"".join(bytes(p.records or b"") for t in answer.responses for p in t.partitions)


def test_produce_to_a_missing_topic_obeys_the_topic_policy(policed_tansu: SluiceProxy,
                                                          tansu_broker: TansuBroker) -> None:
    policed, broker = policed_tansu, tansu_broker
    forbidden, allowed, existing = unique("Not_Allowed"), unique("fine"), unique("Old_Name")
    create_topic(broker.bootstrap, existing)  # made by the cluster's admins: not the policy's
    answer = produce(policed.port, {forbidden: batch(None, b"phantom"),
                                    existing: batch(None, b"kept")})
    assert answer == {forbidden: 3, existing: 0}  # UNKNOWN_TOPIC_OR_PARTITION
    assert b"phantom" not in stored_records(broker, forbidden)
    assert b"kept" in stored_records(broker, existing)
    assert produce(policed.port, {allowed: batch(None, b"ok")}) == {allowed: 0}


def test_create_topics_with_admin_filters_and_an_internal_name(policed: SluiceProxy,
                                                               broker: TansuBroker) -> None:
    """The internal topic is answered by the proxy, the others still meet the topic policy."""
    allowed, forbidden = unique("fine"), unique("Not_Allowed")
    answer = call(policed.port, ApiKey.CREATE_TOPICS, 5, timeout=datetime.timedelta(seconds=5),
                  topics=tuple(item(ApiKey.CREATE_TOPICS, 5, ("topics",), name=t,
                                    num_partitions=1, replication_factor=1)
                               for t in ("_sluice_filters", allowed, forbidden)))
    codes = {str(t.name): int(t.error_code) for t in answer.topics}
    assert codes == {"_sluice_filters": DENIED, allowed: 0, forbidden: 44}  # POLICY_VIOLATION
    topics = broker_topics(broker)
    assert allowed in topics and forbidden not in topics
