"""Bad input and faults through the proxy, against Apache Kafka (issue 27, "Bad input and faults").

- A wrong SASL password (PLAIN or SCRAM-SHA-512), spoken in raw frames through the proxy to
  Kafka's SASL_PLAINTEXT listener: the client gets Kafka's own SaslAuthenticate answer
  (SASL_AUTHENTICATION_FAILED, Kafka's message) and then the connection closes.
- An ACL denial on paths the proxy decodes (a produce filter and a fetch filter bound to the
  topic): the client gets Kafka's TOPIC_AUTHORIZATION_FAILED, never a filter's error or data.
- Nothing in the clear in the proxy's log (debug level): no password, no record payload, also
  for records a filter rejects.
- A broker that goes away mid-request (its process frozen with a Produce and a long-poll Fetch
  in flight, then killed): the proxy closes those connections within seconds, which every Kafka
  client takes as a retriable network error, never a hang; a new connection while it is down
  is closed too; after the restart the same proxy serves again. librdkafka's producer reports
  a retriable error within its message timeout and then delivers through the same proxy.
  (A Kafka node of this module's own: the session's one is shared.)
"""

from __future__ import annotations

import signal
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import KafkaError, Producer
from confluent_kafka.admin import AdminClient, NewTopic

from sluice.codec.headers import response_header_size
from sluice.codec.messages import ApiKey, decode_response
from sluice.proxy.net.upstream_sasl import ScramClient
from tests.e2e.clients import QUIET, unique, wait_for_leaders
from tests.harness import raw_kafka as rk
from tests.harness.kafka_broker import KafkaCluster
from tests.harness.proxy import SluiceProxy

pytestmark = pytest.mark.kafka

SASL_AUTHENTICATION_FAILED = 58
TOPIC_AUTHORIZATION_FAILED = 29
CONFIG = """
filters:
  - name: mask-in
    module: builtin:pii-mask
    topics: ["bad-*"]
    apply_to: [produce]
  - name: json-only
    module: builtin:json-validate
    topics: ["bad-json-*"]
    apply_to: [produce]
  - name: mask-out
    module: builtin:pii-mask
    topics: ["bad-*"]
    apply_to: [fetch]
"""


class Raw:
    """One raw connection through the proxy: numbered requests, decoded answers."""

    def __init__(self, port: int) -> None:
        self.sock = rk.connect(port)
        self.corr = 0

    def call(self, api_key: int, version: int, **fields: Any) -> Any:
        self.corr += 1
        self.sock.sendall(rk.request_frame(api_key, version, self.corr, **fields))
        return self.read(api_key, version)

    def read(self, api_key: int, version: int) -> Any:
        body = rk.recv_frame(self.sock)
        assert body is not None, "the connection closed instead of answering"
        return decode_response(api_key, version, body[response_header_size(body, api_key,
                                                                               version):])

    def authenticate(self, mechanism: str, user: str, password: str) -> Any:
        """ApiVersions, SaslHandshake v1, SaslAuthenticate v2 until done; the last answer."""
        self.call(ApiKey.API_VERSIONS, 3, client_software_name="raw",
                  client_software_version="1")
        assert int(self.call(ApiKey.SASL_HANDSHAKE, 1, mechanism=mechanism).error_code) == 0
        if mechanism == "PLAIN":
            token = b"\x00" + user.encode() + b"\x00" + password.encode()
            return self.call(ApiKey.SASL_AUTHENTICATE, 2, auth_bytes=token)
        scram = ScramClient(mechanism, user, password)
        first = self.call(ApiKey.SASL_AUTHENTICATE, 2, auth_bytes=scram.first())
        assert int(first.error_code) == 0
        final = scram.step(bytes(first.auth_bytes))
        return self.call(ApiKey.SASL_AUTHENTICATE, 2, auth_bytes=final)

    def close(self) -> None:
        self.sock.close()


@pytest.fixture(scope="module")
def sasl_proxy(kafka_broker: KafkaCluster,
               tmp_path_factory: pytest.TempPathFactory) -> Iterator[SluiceProxy]:
    config = tmp_path_factory.mktemp("bad-input") / "sluice.yaml"
    config.write_text(CONFIG)
    with SluiceProxy(upstream=kafka_broker.bootstrap_for("SASL_PLAINTEXT"), config=config,
                     extra_args=["--log-level", "debug"]) as proxy:
        yield proxy


def admin_create(kafka: KafkaCluster, topic: str) -> None:
    client = AdminClient({**kafka.client_config("SASL_PLAINTEXT", "admin", "SCRAM-SHA-512"),
                          **QUIET})
    for fut in client.create_topics([NewTopic(topic, 1, 1)]).values():
        fut.result(20)
    wait_for_leaders(kafka.bootstrap, topic)


@pytest.mark.parametrize("mechanism", ["PLAIN", "SCRAM-SHA-512"])
def test_a_wrong_password_gets_kafkas_error_and_the_connection_closes(
    kafka_broker: KafkaCluster, sasl_proxy: SluiceProxy, mechanism: str
) -> None:
    wrong = "wrong-" + unique("pw")
    raw = Raw(sasl_proxy.port)
    try:
        answer = raw.authenticate(mechanism, "bob", wrong)
        assert int(answer.error_code) == SASL_AUTHENTICATION_FAILED
        # Kafka's own words (the proxy makes up none): PLAIN "Invalid username or password",
        # SCRAM "... invalid credentials with SASL mechanism SCRAM-SHA-512".
        message = str(answer.error_message)
        assert "Authentication failed" in message, message
        assert wrong not in message
        assert rk.closed_by_peer(raw.sock, 10), "the connection stayed open after the failure"
    finally:
        raw.close()
    # The right password on a new connection works: the failure was the password's.
    good = Raw(sasl_proxy.port)
    try:
        answer = good.authenticate(mechanism, "bob", kafka_broker.password("bob"))
        assert int(answer.error_code) == 0
    finally:
        good.close()


def test_acl_denials_on_filtered_paths_are_kafkas_error_codes(
    kafka_broker: KafkaCluster, sasl_proxy: SluiceProxy
) -> None:
    """bob has no ACL at all: Kafka refuses his produce and fetch of a topic both filters
    are bound to, and the proxy passes Kafka's code on for each."""
    topic = unique("bad-denied")
    admin_create(kafka_broker, topic)
    raw = Raw(sasl_proxy.port)
    try:
        assert int(raw.authenticate("SCRAM-SHA-512", "bob",
                                    kafka_broker.password("bob")).error_code) == 0
        raw.corr += 1
        raw.sock.sendall(rk.produce_frame(raw.corr, topic, [b'{"mail": "x@example.com"}']))
        produced = raw.read(ApiKey.PRODUCE, 9)
        [[code]] = [[int(p.error_code) for p in t.partition_responses]
                    for t in produced.responses]
        assert code == TOPIC_AUTHORIZATION_FAILED
        raw.corr += 1
        raw.sock.sendall(rk.fetch_frame(raw.corr, topic))
        fetched = raw.read(ApiKey.FETCH, 12)
        [[(code, records)]] = [[(int(p.error_code), p.records) for p in t.partitions]
                               for t in fetched.responses]
        assert code == TOPIC_AUTHORIZATION_FAILED and not records
    finally:
        raw.close()


def test_no_password_or_payload_in_the_log(
    kafka_broker: KafkaCluster, sasl_proxy: SluiceProxy
) -> None:
    """The proxy logs at debug level; records pass, are masked, or are rejected by a filter."""
    plain, masked = unique("bad-clear"), unique("bad-json")
    for topic in (plain, masked):
        admin_create(kafka_broker, topic)
    marker = unique("payload-marker")
    conf = kafka_broker.client_config("SASL_PLAINTEXT", "admin", "SCRAM-SHA-512")
    conf["bootstrap.servers"] = sasl_proxy.bootstrap
    errors: list[Any] = []
    producer = Producer({**conf, **QUIET, "message.send.max.retries": 0})
    producer.produce(plain, value=f"{marker} kept, mail bob@example.com".encode(),
                     on_delivery=lambda err, _m: errors.append(err))
    producer.produce(masked, value=f"{marker} not json".encode(),
                     on_delivery=lambda err, _m: errors.append(err))
    producer.flush(30)
    assert sorted(str(e.code()) if e else "ok" for e in errors) == sorted(
        ["ok", str(KafkaError.INVALID_RECORD)]), errors
    wrong = "wrong-" + unique("pw")
    bad = Raw(sasl_proxy.port)
    try:
        bad.authenticate("PLAIN", "alice", wrong)
    finally:
        bad.close()
    time.sleep(0.5)  # let the proxy's last lines reach its output
    output = "".join(sasl_proxy.output)
    assert "json-only" in output  # the rejection was logged, only without the record
    for secret in (marker, "bob@example.com", wrong, kafka_broker.password("admin"),
                   kafka_broker.password("alice")):
        assert secret not in output, f"{secret!r} in the proxy's log"


# ------------------------------------------------------------------ a broker that goes away


@pytest.fixture(scope="module")
def lone_kafka() -> Iterator[KafkaCluster]:
    with KafkaCluster(nodes=1) as cluster:
        yield cluster


@pytest.fixture
def lone_proxy(lone_kafka: KafkaCluster, tmp_path: Path) -> Iterator[SluiceProxy]:
    config = tmp_path / "sluice.yaml"
    config.write_text(CONFIG)
    with SluiceProxy(upstream=lone_kafka.bootstrap, config=config) as proxy:
        yield proxy


def ready_raw(port: int) -> Raw:
    raw = Raw(port)
    raw.call(ApiKey.API_VERSIONS, 3, client_software_name="raw", client_software_version="1")
    return raw


@pytest.mark.serial
def test_a_broker_gone_mid_request_closes_the_clients_connection_promptly(
    lone_kafka: KafkaCluster, lone_proxy: SluiceProxy
) -> None:
    topic = unique("bad-gone")
    client = AdminClient({"bootstrap.servers": lone_kafka.bootstrap, **QUIET})
    for fut in client.create_topics([NewTopic(topic, 1, 1)]).values():
        fut.result(20)
    wait_for_leaders(lone_kafka.bootstrap, topic)
    producing, fetching = ready_raw(lone_proxy.port), ready_raw(lone_proxy.port)
    node = lone_kafka.node_list[0]
    assert node.process is not None
    producer = Producer({"bootstrap.servers": lone_proxy.bootstrap, **QUIET,
                         "message.timeout.ms": 8000, "enable.idempotence": True,
                         "reconnect.backoff.max.ms": 500})
    reports: list[tuple[float, Any]] = []
    try:
        producer.produce(topic, b"before")
        assert producer.flush(20) == 0
        node.process.send_signal(signal.SIGSTOP)  # requests now wait, unanswered
        producing.corr += 1
        producing.sock.sendall(rk.produce_frame(producing.corr, topic, [b"in flight"]))
        fetching.corr += 1
        fetching.sock.sendall(rk.fetch_frame(fetching.corr, topic, offset=1,
                                             max_wait_ms=30_000))
        producer.produce(topic, b"during",
                         on_delivery=lambda err, _m: reports.append((time.monotonic(), err)))
        producer.poll(0.5)
        killed_at = time.monotonic()
        lone_kafka.kill(node.node_id)  # SIGKILL: its sockets close, its requests die
        for raw in (producing, fetching):
            assert rk.closed_by_peer(raw.sock, 10), "a request hung after the broker died"
        closed_after = time.monotonic() - killed_at
        # A new connection while the broker is down is closed too, not left waiting.
        with socket.create_connection(("127.0.0.1", lone_proxy.port), timeout=10) as fresh:
            fresh.sendall(rk.request_frame(ApiKey.API_VERSIONS, 3, 1,
                                           client_software_name="raw",
                                           client_software_version="1"))
            assert rk.closed_by_peer(fresh, 15)
        deadline = time.monotonic() + 30
        while not reports and time.monotonic() < deadline:
            producer.poll(0.2)
        assert reports, "librdkafka got no delivery report: the produce hung"
        reported_at, err = reports[0]
        assert err is not None and reported_at - killed_at < 8 + 5
        # Retriable by nature: the record timed out or its connection went; nothing fatal.
        assert err.code() in (KafkaError._MSG_TIMED_OUT, KafkaError._TRANSPORT,
                              KafkaError.REQUEST_TIMED_OUT), err
        assert not err.fatal()
        lone_kafka.restart(node.node_id)
        wait_for_leaders(lone_kafka.bootstrap, topic)
        delivered: list[Any] = []
        producer.produce(topic, b"after", on_delivery=lambda e, _m: delivered.append(e))
        producer.flush(60)
        assert delivered == [None], delivered  # the same client, through the same proxy
    finally:
        producing.close()
        fetching.close()
        if node.running():
            node.process.send_signal(signal.SIGCONT)  # if a step failed before the kill
        else:
            lone_kafka.restart(node.node_id)
    print(f"in-flight requests closed {closed_after:.2f} s after the broker died")
    assert lone_proxy.process is not None and lone_proxy.process.poll() is None
