"""After bootstrap, no client connection reaches the broker except through the proxy."""

from __future__ import annotations

import os
import time

import psutil
from confluent_kafka import Consumer, Producer
from confluent_kafka.admin import AdminClient

from tests.e2e.clients import QUIET, create_topic, kafka_python_consume, unique
from tests.harness.broker import TansuBroker
from tests.harness.proxy import SluiceProxy


def _owners_of_connections_to(port: int) -> dict[int, int]:
    """pid -> number of established TCP connections whose remote end is 127.0.0.1:port."""
    owners: dict[int, int] = {}
    for conn in psutil.net_connections(kind="tcp"):
        if conn.status == psutil.CONN_ESTABLISHED and conn.raddr and conn.raddr.port == port:
            owners[conn.pid or -1] = owners.get(conn.pid or -1, 0) + 1
    return owners


def test_clients_only_reach_the_broker_through_the_proxy(broker: TansuBroker) -> None:
    # The session's Kafka node: other proxies of the session (other processes) may hold
    # connections to it too, never this process, where the clients live.
    with SluiceProxy(upstream=broker.bootstrap) as proxy:
        assert proxy.process is not None
        topic = unique("bypass")
        create_topic(proxy.bootstrap, topic, partitions=3)
        producer = Producer({"bootstrap.servers": proxy.bootstrap, **QUIET})
        consumer = Consumer(
            {
                "bootstrap.servers": proxy.bootstrap,
                "group.id": unique("g"),
                "auto.offset.reset": "earliest",
                "session.timeout.ms": 6000,
                **QUIET,
            }
        )
        admin = AdminClient({"bootstrap.servers": proxy.bootstrap, **QUIET})
        try:
            for i in range(100):
                producer.produce(topic, value=f"v{i}".encode())
            assert producer.flush(20) == 0
            consumer.subscribe([topic])
            seen = 0
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                msg = consumer.poll(0.5)
                if msg is not None and not msg.error():
                    seen += 1
                if seen >= 100:
                    break
            assert seen == 100
            admin.describe_cluster().result(10)
            assert (
                len(kafka_python_consume(proxy.bootstrap, topic, 100, group=None, timeout=20))
                == 100
            )

            broker_port = int(broker.bootstrap.rsplit(":", 1)[1])
            owners = _owners_of_connections_to(broker_port)
            # The proxy holds the upstream connections for all of these clients...
            assert owners.get(proxy.process.pid, 0) > 0, owners
            # ...and not this test process where the clients live.
            assert os.getpid() not in owners, owners
            proxy_ports = range(
                int(proxy.bootstrap.rsplit(":", 1)[1]), int(proxy.bootstrap.rsplit(":", 1)[1]) + 9
            )
            mine = [
                c
                for c in psutil.Process(os.getpid()).net_connections(kind="tcp")
                if c.status == psutil.CONN_ESTABLISHED and c.raddr
            ]
            # This process (where the clients live) talks to the proxy's ports, never to the
            # broker's. Other tests' clients in this process may hold sockets elsewhere.
            assert any(c.raddr.port in proxy_ports for c in mine), mine
            assert not [c for c in mine if c.raddr.port == broker_port], mine
        finally:
            consumer.close()
            producer.flush(5)
