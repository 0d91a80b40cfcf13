"""`sluice demo`: the whole product in one command, on an embedded default.

Starts the bundled Tansu broker (or, with `--broker kafka`, Apache Kafka from the jars the
set-up installed) and the proxy with the shipped filters (pii-mask on produce,
pii-mask with keep-last-4 on fetch, topic-policy on admin, field encryption of card
numbers) and a transform writing the masked support tickets to a derived topic (its lag shown
until zero), sends realistic traffic with PII
from real clients (librdkafka and kafka-python), shows records as produced, as stored and as
consumed, tries a topic creation the policy denies, runs the Spark audit job over the
telemetry, and prints where the HTML report is. Every process it starts is stopped on exit,
also on Ctrl-C.
"""

from __future__ import annotations

import contextlib
import gc
import json
import os
import random
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from sluice.local_broker import TansuBroker, free_port_block, wait_for_port

BROKERS = ("tansu", "kafka")

DEMO_CONFIG = """\
# The demo's proxy config: the three shipped filters.
filters:
  - name: mask-payments
    module: builtin:pii-mask
    topics: ["payments.*", "users"]
    apply_to: [produce]
    config: {{mask: "*"}}
  - name: mask-support-view
    module: builtin:pii-mask
    topics: ["support.tickets"]
    apply_to: [fetch]
    config: {{keep_last: 4}}
  - name: topic-policy
    module: builtin:topic-policy
    topics: ["*"]
    apply_to: [admin]
    config:
      name_pattern: "^[a-z0-9._-]+$"
      partitions: {{min: 1, max: 12}}
      allowed_cleanup_policies: [delete, compact]
  - name: encrypt-cards
    module: builtin:encrypt
    topics: ["vault.cards"]
    apply_to: [produce, fetch]
    # The demo's clients do not authenticate: they are User:ANONYMOUS.
    config: {{key: cards, fields: [card], decrypt_for: ["User:ANONYMOUS"]}}
kms:
  type: local
  path: {keys}
telemetry:
  dir: {telemetry}
  rotate_seconds: 3600
  # Tags every telemetry file: the audit reads only what this key authenticates.
  key_file: {telemetry_key}
# A transform the proxy process runs too: the tickets, masked, in a derived topic.
transforms:
  - name: tickets-masked
    input: ["support.tickets"]
    output: support.tickets.masked
    filters:
      - name: mask-tickets
        module: builtin:pii-mask
        config: {{keep_last: 4}}
"""

FIRST = ["Ada", "Grace", "Alan", "Edsger", "Barbara", "Ken", "Margaret", "Linus"]
CARDS = ["4111 1111 1111 1111", "5500-0000-0000-0004", "3400 000000 00009"]


def _say(text: str) -> None:
    print(f"\n\033[1m==> {text}\033[0m" if sys.stdout.isatty() else f"\n==> {text}", flush=True)


def _show(label: str, value: bytes | None) -> None:
    text = (value or b"").decode("utf-8", "replace")
    print(f"    {label:<22} {text[:150]}", flush=True)


def payment(rng: random.Random, i: int) -> bytes:
    name = rng.choice(FIRST)
    doc = {
        "order": f"ord-{100000 + i}",
        "user_id": f"u{rng.randrange(1000, 9999)}",
        "email": f"{name.lower()}.{i}@example.com",
        "card": rng.choice(CARDS),
        "amount_eur": round(rng.uniform(3, 400), 2),
        "note": f"call me at +44 20 7946 {rng.randrange(1000, 9999)}",
    }
    return json.dumps(doc).encode()


def ticket(rng: random.Random, i: int) -> bytes:
    return (
        f"ticket {i}: customer {rng.choice(FIRST)} paid with {rng.choice(CARDS)}, "
        f"reach them at support{i}@example.org"
    ).encode()


@contextlib.contextmanager
def proxy_process(config: Path, upstream: str, log_path: Path) -> Iterator[str]:
    # The proxy puts broker nodes on the ports after the bootstrap port: keep a few free.
    port = free_port_block(9)
    listen = f"127.0.0.1:{port}"
    log = log_path.open("w")
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "sluice",
            "serve",
            "--listen",
            listen,
            "--upstream",
            upstream,
            "--config",
            str(config),
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        env=dict(os.environ, SLUICE_LOG_FORMAT="json"),
    )
    try:
        deadline = time.monotonic() + 60
        while "listening" not in log_path.read_text():
            if proc.poll() is not None:
                raise RuntimeError(f"the proxy exited:\n{log_path.read_text()[-2000:]}")
            if time.monotonic() > deadline:
                raise RuntimeError("the proxy did not start within 60 s")
            time.sleep(0.1)
        wait_for_port(port)
        yield listen
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        log.close()


def _consume(bootstrap: str, topic: str, count: int, group: str | None = None) -> list[Any]:
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": group or f"demo-peek-{uuid.uuid4().hex[:6]}",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": group is not None,
            "session.timeout.ms": 6000,
            "client.id": "analytics-dashboard" if group else "sluice-demo",
            "log_level": 3,
        }
    )
    try:
        if group:
            consumer.subscribe([topic])
        else:
            parts = consumer.list_topics(topic, timeout=10).topics[topic].partitions
            consumer.assign([TopicPartition(topic, p, 0) for p in parts])
        out: list[Any] = []
        deadline = time.monotonic() + 60
        while len(out) < count and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is not None and not msg.error():
                out.append(msg)
        return out
    finally:
        consumer.close()


@contextlib.contextmanager
def demo_broker(kind: str) -> Iterator[str]:
    """The demo's broker, started and stopped: its bootstrap address. Tansu (the default,
    up in a fraction of a second) or one Apache Kafka node, whose PLAINTEXT listener the demo
    uses (its clients are User:ANONYMOUS, as with Tansu)."""
    if kind == "tansu":
        _say("Starting the bundled Tansu broker (sha256-verified) on 127.0.0.1")
        with TansuBroker() as tansu:
            yield tansu.bootstrap
        return
    if kind != "kafka":
        raise ValueError(f"unknown broker {kind!r} (one of {', '.join(BROKERS)})")
    from sluice.kafka_broker import KAFKA_VERSION, KafkaCluster

    _say(f"Starting Apache Kafka {KAFKA_VERSION} (one KRaft node, from its jars) on 127.0.0.1")
    with KafkaCluster(nodes=1) as kafka:
        print(f"    started in {kafka.start_seconds:.1f} s")
        yield kafka.bootstrap


def run_demo(out_dir: Path, records: int, skip_audit: bool, broker_kind: str = "tansu") -> int:
    from confluent_kafka import KafkaException, Producer
    from confluent_kafka.admin import AdminClient, NewTopic

    out_dir = out_dir.resolve()
    out_dir.mkdir(parents=True, exist_ok=True)
    telemetry_dir = out_dir / "telemetry"
    config_path = out_dir / "sluice-demo.yaml"
    telemetry_key = out_dir / "telemetry.key"
    if not telemetry_key.exists():
        # As `sluice telemetry keygen` makes it; kept across demo runs so that the telemetry
        # of an earlier run still verifies.
        from sluice.telemetry_schema.integrity import new_key, write_key

        write_key(telemetry_key, new_key())
    config_path.write_text(DEMO_CONFIG.format(telemetry=json.dumps(str(telemetry_dir)),
                                              keys=json.dumps(str(out_dir / "keys.json")),
                                              telemetry_key=json.dumps(str(telemetry_key))))
    rng = random.Random(2026)

    with demo_broker(broker_kind) as bootstrap:
        print(f"    broker at {bootstrap}")
        _say(
            "Starting the Sluice proxy: pii-mask (produce), keep-last-4 mask (fetch), "
            "topic-policy (admin), encrypt-cards (produce and fetch)"
        )
        print(f"    config: {config_path}")
        with proxy_process(config_path, bootstrap, out_dir / "proxy.log") as proxy:
            print(f"    clients bootstrap at {proxy}   (proxy log: {out_dir / 'proxy.log'})")
            admin = AdminClient(
                {"bootstrap.servers": proxy, "client.id": "platform-admin", "log_level": 3}
            )
            topics = [
                NewTopic("payments.orders", 3, 1),
                NewTopic("users", 1, 1),
                NewTopic("support.tickets", 1, 1),
                NewTopic("support.tickets.masked", 1, 1),
                NewTopic("vault.cards", 1, 1),
            ]
            for fut in admin.create_topics(topics).values():
                fut.result(20)
            print("    created payments.orders (3 partitions), users, support.tickets, "
                  "support.tickets.masked", "vault.cards")

            _say(
                f"Producing {records} payment events with librdkafka (idempotent, zstd) "
                "as 'checkout-service'"
            )
            producer = Producer(
                {
                    "bootstrap.servers": proxy,
                    "client.id": "checkout-service",
                    "enable.idempotence": True,
                    "compression.type": "zstd",
                    "linger.ms": 5,
                    "log_level": 3,
                }
            )
            sent = [payment(rng, i) for i in range(records)]
            # The key and a header carry personal data too: pii-mask masks the value, the key
            # and every header value.
            for value in sent:
                producer.produce("payments.orders", value=value,
                                 key=json.loads(value)["email"].encode(),
                                 headers=[("customer-phone",
                                           f"+44 20 7946 {rng.randrange(1000, 9999)}".encode())])
            assert producer.flush(60) == 0
            _show("as produced:", sent[0])
            _show("key, as produced:", json.loads(sent[0])["email"].encode())

            _say("Producing user profiles with kafka-python as 'crm-sync'")
            from kafka import KafkaProducer

            kp = KafkaProducer(
                bootstrap_servers=proxy, client_id="crm-sync", compression_type="gzip"
            )
            for i in range(records // 5):
                kp.send(
                    "users",
                    key=f"user-{i}".encode(),
                    value=json.dumps(
                        {
                            "user_id": f"u{i}",
                            "email": f"person{i}@example.net",
                            "ssn": "123-45-6789" if i % 2 else "none",
                            "ip": f"10.1.{i % 250}.7",
                        }
                    ).encode(),
                )
            kp.flush(30)
            kp.close()

            _say("Producing support tickets as 'helpdesk' (stored as is, masked when read)")
            helpdesk = Producer(
                {"bootstrap.servers": proxy, "client.id": "helpdesk", "log_level": 3}
            )
            tickets = [ticket(rng, i) for i in range(records // 5)]
            for value in tickets:
                helpdesk.produce("support.tickets", value=value)
            assert helpdesk.flush(30) == 0

            _say("The transform 'tickets-masked' (run by the proxy process) writes "
                 "support.tickets.masked")
            _follow_transform(config_path, bootstrap)
            derived = _consume(bootstrap, "support.tickets.masked", 1)
            _show("support.tickets.masked:", derived[0].value() if derived else None)

            _say("What the broker stored (read directly, around the proxy, for this demo only): "
                 "pii-mask masked the value, the key and the header")
            stored = _consume(bootstrap, "payments.orders", 1)
            _show("payments.orders:", stored[0].value() if stored else None)
            _show("key, stored:", stored[0].key() if stored else None)
            for name, header in (stored[0].headers() or []) if stored else []:
                _show(f"header {name}, stored:", header)
            stored_ticket = _consume(bootstrap, "support.tickets", 1)
            _show("support.tickets:", stored_ticket[0].value() if stored_ticket else None)

            _say("Card numbers encrypted by the proxy (builtin:encrypt, field 'card', AES-256-GCM "
                 f"under key 'cards' of the keyring {out_dir / 'keys.json'})")
            card_doc = json.dumps({"order": "ord-900001", "card": CARDS[0],
                                   "amount_eur": 42.5}).encode()
            cards = Producer({"bootstrap.servers": proxy, "client.id": "checkout-service",
                              "enable.idempotence": True, "log_level": 3})
            cards.produce("vault.cards", key=b"ord-900001", value=card_doc)
            assert cards.flush(30) == 0
            _show("cards, produced:", card_doc)
            stored_card = _consume(bootstrap, "vault.cards", 1)
            _show("cards, stored:", stored_card[0].value() if stored_card else None)
            read_card = _consume(proxy, "vault.cards", 1)
            _show("cards, allowed reader:", read_card[0].value() if read_card else None)
            print("    a principal outside decrypt_for reads exactly the stored form, with its "
                  "sluice.enc headers")

            _say("What a consumer group 'analytics' reads through the proxy")
            consumed = _consume(proxy, "payments.orders", records, group="analytics")
            print(f"    consumed {len(consumed)} of {records} payment events")
            _show("payments.orders:", consumed[0].value() if consumed else None)
            via = _consume(proxy, "support.tickets", 1)
            _show("support.tickets:", via[0].value() if via else None)

            _say("Trying to create topics the policy forbids")
            bad = [
                NewTopic("Payments_ARCHIVE", 3, 1),
                NewTopic("payments.firehose", 64, 1),
                NewTopic("payments.refunds", 3, 1),
            ]
            for name, fut in admin.create_topics(bad).items():
                try:
                    fut.result(20)
                    print(f"    {name}: created")
                except KafkaException as exc:  # carries the broker's (or policy's) message
                    err = exc.args[0]
                    print(f"    {name}: refused: {err.str()}")
            # librdkafka clients live until collected; stop them before the proxy goes away.
            del admin, producer, helpdesk, cards
            gc.collect()
        print("    proxy stopped (telemetry flushed)")

    if skip_audit:
        print(f"\nTelemetry is in {telemetry_dir}")
        return 0
    _say("Running the PySpark audit and billing job over the telemetry (local mode)")
    from sluice.spark_audit.job import run_audit

    result = run_audit(str(telemetry_dir), str(out_dir / "report"),
                       telemetry_keys=[str(out_dir / "telemetry.key")])
    print(f"    {result.events} telemetry events -> reports in {result.out}")
    checked = result.integrity
    print(f"    telemetry verified with key {', '.join(checked['keys'])}: "
          f"{checked['accepted'].get('files', 0)} files authenticated, "
          f"{checked['refused_total']} refused")
    for name, paths in sorted(result.reports.items()):
        print(f"    {name:<12} {paths.get('csv', '')}")
    _say(f"Done. Open the HTML report: {result.html}")
    return 0


def _follow_transform(config_path: Path, bootstrap: str, timeout: float = 90.0) -> None:
    """Print the transform's lag (as `sluice transform list` reads it) until it is zero."""
    from sluice.transforms.config import load_transform_specs
    from sluice.transforms.listing import transform_lag

    spec = load_transform_specs(config_path)[0]
    deadline = time.monotonic() + timeout
    last: int | None = -1
    while time.monotonic() < deadline:
        rows = transform_lag(spec, bootstrap)
        lag = None if any(r.lag is None for r in rows) else sum(r.lag or 0 for r in rows)
        if lag != last:
            print(f"    {spec.name} lag: {'-' if lag is None else lag}")
            last = lag
        if lag == 0 and all(r.committed for r in rows):
            return
        time.sleep(0.5)
    print(f"    {spec.name} did not catch up within {timeout:.0f} s")


def demo_banner() -> str:
    return textwrap.dedent(
        """\
        Sluice demo: a local broker, the proxy with the shipped Wasm filters and record
        encryption, real clients, a denied topic, and the audit report. Ctrl-C stops
        everything it started."""
    )
