"""Three Apache Kafka brokers behind `sluice serve --workers 2`, and the leader killed under load.

Partitions led by different nodes are each reached through their own proxy port, and both
workers give every node the same port. Idempotent confluent-kafka producers (acks=all) and a
consumer run through the proxy against a topic with replication factor 3 and
`min.insync.replicas=2`; the leader of partition 0 is killed with SIGKILL, the clients carry on
with the new leader, the node restarts and rejoins, and the proxy logs the cluster's change
(`brokers_changed`: the node gone, then back). A fresh consumer through the proxy then reads
everything back: no acknowledged record is lost and none is duplicated (each record carries a
unique id). The figures (records produced, acknowledged, read back, duplicates, longest stall)
are printed as one `three_broker_figures` JSON line.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import socket
import threading
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from prometheus_client.parser import text_string_to_metric_families

from sluice.codec.headers import response_header_size
from sluice.codec.messages import ApiKey, decode_response
from tests.e2e.clients import QUIET, unique
from tests.harness.kafka_broker import KafkaCluster
from tests.harness.ports import free_port_block
from tests.harness.proxy import SluiceProxy
from tests.harness.raw_kafka import metadata_frame, recv_frame
from tests.proxy.test_reload import events, wait_for

pytestmark = [pytest.mark.kafka, pytest.mark.serial]

PARTITIONS = 3
RUN_SECONDS = 24.0  # producing, in all
KILL_AT = 5.0  # seconds into the run
RATE = 250  # records per second offered by the producer


def leaders(bootstrap: str, topic: str) -> dict[int, int]:
    admin = AdminClient({"bootstrap.servers": bootstrap, **QUIET})
    meta = admin.list_topics(topic, timeout=10).topics[topic]
    return {p: part.leader for p, part in meta.partitions.items()}


def proxy_broker_map(port: int) -> dict[int, tuple[str, int]]:
    """Node id -> (host, port) as one new connection to the proxy's bootstrap port sees it."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(metadata_frame(7, [], version=4))
        frame = recv_frame(sock)
    assert frame is not None
    body = frame[response_header_size(frame, ApiKey.METADATA, 4):]
    response = decode_response(ApiKey.METADATA, 4, body)
    return {int(b.node_id): (str(b.host), int(b.port)) for b in response.brokers}


def connections_total(metrics_port: int) -> float:
    with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5) as r:
        text = r.read().decode()
    return sum(s.value for f in text_string_to_metric_families(text) for s in f.samples
               if s.name == "sluice_connections_total")


@dataclass
class Load:
    """An idempotent producer and a live consumer, both through the proxy, in threads."""

    bootstrap: str
    topic: str
    stop_producing: threading.Event = field(default_factory=threading.Event)
    stop_consuming: threading.Event = field(default_factory=threading.Event)
    produced: int = 0
    acked: dict[int, float] = field(default_factory=dict)  # record id -> ack time
    acked_partition: dict[int, int] = field(default_factory=dict)
    failed: list[str] = field(default_factory=list)
    consumed: list[tuple[float, int, int]] = field(default_factory=list)  # time, partition, id
    errors: list[str] = field(default_factory=list)

    def produce(self) -> None:
        producer = Producer({"bootstrap.servers": self.bootstrap, "enable.idempotence": True,
                             "acks": "all", "linger.ms": 5, "message.timeout.ms": 120_000,
                             "error_cb": lambda e: self.errors.append(str(e)), **QUIET})

        def done(err: Any, msg: Any) -> None:
            rid = int(msg.key())
            if err is not None:
                self.failed.append(str(err))
            else:
                self.acked[rid] = time.monotonic()
                self.acked_partition[rid] = int(msg.partition())

        rid = 0
        interval = 1.0 / RATE
        next_at = time.monotonic()
        while not self.stop_producing.is_set():
            producer.produce(self.topic, key=str(rid).encode(),
                             value=json.dumps({"id": rid}).encode(), partition=rid % PARTITIONS,
                             on_delivery=done)
            rid += 1
            self.produced = rid
            producer.poll(0)
            next_at += interval
            pause = next_at - time.monotonic()
            if pause > 0:
                time.sleep(pause)
        remaining = producer.flush(150)
        assert remaining == 0, f"{remaining} records never acknowledged nor failed"

    def consume(self) -> None:
        consumer = Consumer({"bootstrap.servers": self.bootstrap, "group.id": unique("live"),
                             "enable.auto.commit": False, **QUIET})
        consumer.assign([TopicPartition(self.topic, p, OFFSET_BEGINNING)
                         for p in range(PARTITIONS)])
        try:
            while not self.stop_consuming.is_set():
                for msg in consumer.consume(500, 0.2):
                    if msg.error() is None:
                        self.consumed.append((time.monotonic(), int(msg.partition() or 0),
                                              int(msg.key())))
        finally:
            consumer.close()


def read_back(bootstrap: str, topic: str, direct: str) -> list[int]:
    """Every record id in the topic, through the proxy, by a fresh consumer."""
    ends = {}
    probe = Consumer({"bootstrap.servers": direct, "group.id": unique("ends"), **QUIET})
    for p in range(PARTITIONS):
        ends[p] = probe.get_watermark_offsets(TopicPartition(topic, p), timeout=20)[1]
    probe.close()
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": unique("readback"),
                         "enable.auto.commit": False, **QUIET})
    consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(PARTITIONS)])
    ids: list[int] = []
    at = {p: 0 for p in range(PARTITIONS)}
    deadline = time.monotonic() + 90
    try:
        while any(at[p] < ends[p] for p in at) and time.monotonic() < deadline:
            for msg in consumer.consume(1000, 0.5):
                if msg.error() is None:
                    ids.append(int(msg.key()))
                    at[int(msg.partition() or 0)] = int(msg.offset() or 0) + 1
    finally:
        consumer.close()
    assert all(at[p] >= ends[p] for p in at), f"read back stopped at {at}, ends {ends}"
    return ids


def membership(proxy: SluiceProxy, gone: int | None = None, back: int | None = None) -> bool:
    """Whether a worker logged `brokers_changed` with node `gone` gone (or `back` back). The
    proxy learns from the Metadata its clients receive; one more Metadata request (as any
    client makes after an error or every few minutes) gives it the chance."""
    for _attempt in range(3):  # a connection relayed to the dead broker is closed: next one
        with contextlib.suppress(OSError, AssertionError):
            proxy_broker_map(proxy.port)
            break
    for e in events(proxy, "brokers_changed"):
        if gone is not None and gone in e["gone"]:
            return True
        if back is not None and back in e["added"] and e["gone"] == [] and \
                len(e["brokers"]) > len(e["added"]):
            return True
    return False


def longest_gap(times: list[float]) -> float:
    times = sorted(times)
    return max((b - a for a, b in itertools.pairwise(times)), default=0.0)


@pytest.fixture
def cluster(kafka_cluster: KafkaCluster) -> Iterator[KafkaCluster]:
    yield kafka_cluster
    for node in kafka_cluster.node_list:  # a failed test must not leave a node down
        if not node.running():
            kafka_cluster.restart(node.node_id)


def test_leader_killed_under_load_loses_and_duplicates_nothing(
    cluster: KafkaCluster, tmp_path: Path
) -> None:
    topic = unique("three")
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap, **QUIET})
    for fut in admin.create_topics([NewTopic(topic, PARTITIONS, 3, config={
            "min.insync.replicas": "2"})]).values():
        fut.result(30)
    led = wait_for(lambda: (lambda m: m if len(set(m.values())) == 3 else None)(
        leaders(cluster.bootstrap, topic)), 30, "a leader per partition")
    assert set(led.values()) == set(cluster.node_ids), led  # each node leads one partition

    metrics_port = free_port_block(2)
    config = tmp_path / "sluice.yaml"
    config.write_text(f"metrics:\n  listen: 127.0.0.1:{metrics_port}\n")
    proxy = SluiceProxy(upstream=cluster.bootstrap, config=config,
                        extra_args=["--workers", "2"])
    proxy.start(timeout=60)
    try:
        # Both workers answer with one node -> port map: each node its own proxy port.
        maps = [proxy_broker_map(proxy.port) for _ in range(16)]
        assert all(m == maps[0] for m in maps), maps
        ports = {node: port for node, (_host, port) in maps[0].items()}
        assert sorted(ports) == cluster.node_ids
        assert len(set(ports.values())) == 3 and proxy.port not in ports.values()
        assert all(0 < port - proxy.port <= 8 for port in ports.values())
        per_worker = [connections_total(metrics_port), connections_total(metrics_port + 1)]
        assert all(n > 0 for n in per_worker), per_worker

        load = Load(proxy.bootstrap, topic)
        threads = [threading.Thread(target=load.produce, name="producer"),
                   threading.Thread(target=load.consume, name="consumer")]
        began = time.monotonic()
        for t in threads:
            t.start()
        time.sleep(KILL_AT)
        victim = leaders(cluster.bootstrap, topic)[0]
        killed_at = time.monotonic()
        cluster.kill(victim)
        wait_for(lambda: membership(proxy, gone=victim), 40, f"the proxy seeing node {victim} gone")
        new_leader = wait_for(lambda: (lambda x: x if x not in (victim, -1) else None)(
            leaders(cluster.bootstrap, topic)[0]), 30, "a new leader for partition 0")
        # Producer and consumer carry on with partition 0's new leader.
        wait_for(lambda: any(t > killed_at and load.acked_partition[i] == 0
                             for i, t in list(load.acked.items())), 40,
                 "acknowledgements from the new leader")
        restarted_at = time.monotonic()
        restart_seconds = cluster.restart(victim)
        wait_for(lambda: membership(proxy, back=victim), 60, f"the proxy seeing node {victim} back")
        time.sleep(max(0.0, RUN_SECONDS - (time.monotonic() - began)))
        load.stop_producing.set()
        threads[0].join(180)
        caught_up = wait_for(lambda: len({i for _t, _p, i in load.consumed}) >= len(load.acked),
                             60, "the live consumer caught up")
        load.stop_consuming.set()
        threads[1].join(30)
        assert caught_up

        ids = read_back(proxy.bootstrap, topic, cluster.bootstrap)
        acked = set(load.acked)
        figures = {
            "produced": load.produced,
            "acknowledged": len(acked),
            "failed": len(load.failed),
            "read_back": len(ids),
            "duplicates": len(ids) - len(set(ids)),
            "acknowledged_lost": len(acked - set(ids)),
            "longest_ack_gap_s": round(longest_gap(list(load.acked.values())), 2),
            "longest_consume_gap_s": round(longest_gap([t for t, _p, _i in load.consumed]), 2),
            "killed_node": victim,
            "new_leader": new_leader,
            "restart_s": round(restart_seconds, 1),
            "kill_to_restart_s": round(restarted_at - killed_at, 1),
            "consumed_live_after_kill_p0": sum(1 for t, p, _i in load.consumed
                                               if p == 0 and t > killed_at),
        }
        print("three_broker_figures " + json.dumps(figures))
        assert figures["acknowledged_lost"] == 0, figures
        assert figures["duplicates"] == 0, figures
        assert figures["failed"] == 0, (figures, load.failed[:3])
        assert figures["acknowledged"] == figures["produced"], figures
        assert figures["consumed_live_after_kill_p0"] > 0, figures
        assert cluster.node(victim).running()
        assert leaders(cluster.bootstrap, topic)  # the cluster answers with all nodes again
    finally:
        proxy.stop()
    assert "Traceback" not in "".join(proxy.output)
