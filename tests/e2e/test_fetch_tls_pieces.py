"""A masked Fetch response read over TLS: the spliced response goes to the client as pieces
(views of the broker's frame around the filter's new batches, `codec/fetch_splice.py`) in one
`writelines`, and toward a TLS client the pieces under a TLS record are joined first
(`proxy/net/write_queue.py`, `tls_writes`). Real clients read it from a real `sluice serve`
in front of Apache Kafka, with builtin pii-mask bound to fetch on one topic:

- librdkafka (confluent-kafka, CRCs checked) and kafka-python, each over TLS to the proxy;
- the broker side plain, and Kafka's own SSL listener (the proxy as `admin`);
- each masked partition holds batches of small records (pieces joined before sealing) and of
  ~20 KiB ones (pieces over a TLS record, written as they are), some with PII (rewritten by
  the filter: new pieces), some without (kept: views of the broker's frame), uncompressed and
  lz4, so one response is many pieces in an order that matters;
- an unfiltered topic rides in the same Fetch requests (views of the frame only).

Every record must arrive once, in offset order per partition, masked exactly as the filter
masks the same records when called from Python (`load_filter(...).run_batch`), the unfiltered
ones byte for byte as produced; then a second round of records on the same connections (the
TLS stream must still be in step after the first), with no new client connection."""

from __future__ import annotations

import json
import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, cast

import pytest
import yaml
from confluent_kafka import Consumer, KafkaException, Producer
from confluent_kafka import TopicPartition as ConfluentPartition

from sluice.filters.config import load_filter_specs
from sluice.filters.context import FilterRecord, RecordContext
from sluice.filters.decisions import Action
from sluice.filters.runtime import LoadedFilter, load_filter
from tests.e2e.clients import QUIET, create_topic, unique
from tests.harness.kafka_broker import KafkaCluster
from tests.harness.ports import free_port
from tests.harness.proxy import SluiceProxy
from tests.harness.raw_kafka import sample_value, scrape
from tests.proxy.tls_certs import Pki, make_pki

MASKED_PARTITIONS = 3
CLEAR_PARTITIONS = 2
SMALL = 30  # records of ~150 bytes: a batch well under a TLS record (16 KiB)
LARGE = 4  # records of ~20 KiB: a batch well over one, lz4 or not
LARGE_NOTE = 20_000
#: One round's batches per partition, in order: (size, with PII), each produced once
#: uncompressed and once with lz4.
ROUND_ONE = [("small", True), ("small", False), ("small", True), ("large", True),
             ("small", False), ("large", False), ("small", True), ("large", True)]
ROUND_TWO = [("small", True), ("large", False), ("small", False), ("large", True)]
CODECS = ("none", "lz4")

Rec = tuple[bytes | None, bytes | None, list[tuple[str, bytes]]]
#: (topic, partition) -> offset -> record.
Records = dict[tuple[str, int], dict[int, Rec]]
#: What a client read: (topic, partition, offset, record), in the order it got them.
Got = tuple[str, int, int, Rec]


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pieces-pki"))


@dataclass
class Served:
    proxy: SluiceProxy
    metrics: int
    mask: LoadedFilter


@pytest.fixture(scope="module", params=["plain-broker", "tls-broker"])
def served(request: pytest.FixtureRequest, kafka_broker: KafkaCluster, pki: Pki,
           tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    """A proxy with a TLS listener and pii-mask on fetch for `tlsp-mask-*`, in front of the
    session's Kafka node through its PLAINTEXT or its SSL listener."""
    metrics = free_port()
    config: dict[str, Any] = {
        "metrics": {"listen": f"127.0.0.1:{metrics}"},
        "tls": {"cert": str(pki.server_cert), "key": str(pki.server_key)},
        "filters": [{"name": "mask", "module": "builtin:pii-mask", "topics": ["tlsp-mask-*"],
                     "apply_to": ["fetch"]}],
    }
    upstream = kafka_broker.bootstrap
    if request.param == "tls-broker":
        ssl = kafka_broker.client_config("SSL", "admin")
        config["upstream_tls"] = {"ca": ssl["ssl.ca.location"],
                                  "cert": ssl["ssl.certificate.location"],
                                  "key": ssl["ssl.key.location"]}
        upstream = kafka_broker.bootstrap_for("SSL")
    path = tmp_path_factory.mktemp("pieces") / "sluice.yaml"
    path.write_text(yaml.safe_dump(config), encoding="utf-8")
    # The filter as the proxy loads it from the same file, called from Python: the reference.
    (spec,) = load_filter_specs(path)
    mask = load_filter(spec)
    try:
        with SluiceProxy(upstream=upstream, config=path) as proxy:
            yield Served(proxy, metrics, mask)
    finally:
        mask.close()


# ------------------------------------------------------------------ the records


def words(rng: random.Random, size: int) -> str:
    """Lowercase words (no digits, no '@': nothing a detector looks for) of about `size`
    characters, varied enough that lz4 leaves a large batch over a TLS record."""
    out: list[str] = []
    n = 0
    while n < size:
        word = "".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(3, 9)))
        out.append(word)
        n += len(word) + 1
    return " ".join(out)


def group(rng: random.Random, tag: str, size: str, pii: bool) -> list[Rec]:
    """One batch's records: PII in the value, and in the key and a header of some."""
    count, note = (SMALL, 80) if size == "small" else (LARGE, LARGE_NOTE)
    recs: list[Rec] = []
    for i in range(count):
        doc = f'{{"seq": "{tag}-{i}", "note": "{words(rng, note)}"'
        key: bytes | None = f"{tag}-{i}".encode()
        headers: list[tuple[str, bytes]] = [("src", b"e2e")]
        if pii:
            doc += f', "email": "user{i}.{tag}@example.com", "phone": "+1 415-555-01{i % 90 + 10}"'
            if i % 3 == 0:
                key = f"user{i}.{tag}@example.org".encode()
                headers.append(("contact", f"ops.{tag}@example.net".encode()))
        if i % 7 == 6:
            key = None
        recs.append((key, (doc + "}").encode(), headers))
    return recs


def produce_round(bootstrap: str, topics: dict[str, int], kinds: list[tuple[str, bool]],
                  seed: int) -> Records:
    """Each kind of batch, uncompressed then lz4, to every partition of `topics` (a flush
    after each: one batch a partition); returns the records by offset, as delivered."""
    rng = random.Random(seed)
    placed: Records = {}
    for codec in CODECS:
        producer = Producer({"bootstrap.servers": bootstrap, "compression.type": codec,
                             "linger.ms": 1000, **QUIET})
        for n, (size, pii) in enumerate(kinds):
            for topic, partitions in topics.items():
                for partition in range(partitions):
                    for rec in group(rng, f"{seed}{codec}{n}p{partition}", size, pii):
                        produce_one(producer, topic, partition, rec, placed)
            # flush() sends at once whatever linger.ms would hold: one batch a partition.
            assert producer.flush(30) == 0
    return placed


def produce_one(producer: Producer, topic: str, partition: int, rec: Rec,
                placed: Records) -> None:
    def delivered(err: Any, msg: Any) -> None:
        assert err is None, err
        placed.setdefault((topic, partition), {})[msg.offset()] = rec

    key, value, headers = rec
    sent: list[tuple[str, str | bytes | None]] = list(headers)
    producer.produce(topic, value=value, key=key, partition=partition, headers=sent,
                     on_delivery=delivered)


def masked_by(mask: LoadedFilter, placed: Records) -> Records:
    """What pii-mask makes of each masked partition's records, called from Python."""
    out: Records = {}
    for (topic, partition), by_offset in placed.items():
        offsets = sorted(by_offset)
        result = mask.run_batch(
            RecordContext(topic, partition, "fetch"),
            [FilterRecord(o - offsets[0], 0, by_offset[o][0], by_offset[o][1],
                          list(by_offset[o][2])) for o in offsets])
        assert result.failure is None, result.failure
        mine = out[(topic, partition)] = {}
        for offset, decision in zip(offsets, result.decisions, strict=True):
            assert decision.action in (Action.KEEP, Action.REWRITE), decision
            if decision.action is Action.KEEP:
                mine[offset] = by_offset[offset]
            else:
                headers = cast(list[tuple[str, bytes]], list(decision.headers or []))
                mine[offset] = (decision.key, decision.value, headers)
    return out


# ------------------------------------------------------------------ the clients


class Reader(Protocol):
    """A consumer assigned every partition of the topics from offset 0, kept open between
    reads (so the second read is on the same connections). Paused while a round is
    produced, so that its first Fetch responses bring the whole round: many pieces each."""

    def read(self, count: int) -> list[Got]:
        """Resume, and the next `count` records (fewer once nothing came for 20 s)."""

    def pause(self) -> None: ...

    def close(self) -> None: ...


class LibrdkafkaReader:
    def __init__(self, bootstrap: str, ca: Path, topics: dict[str, int]) -> None:
        self.consumer = Consumer({
            "bootstrap.servers": bootstrap, "security.protocol": "SSL",
            "ssl.ca.location": str(ca), "group.id": unique("pieces"),
            "enable.auto.commit": False, "check.crcs": True, **QUIET})
        self.consumer.assign([ConfluentPartition(t, p, 0)
                              for t, n in topics.items() for p in range(n)])

    def pause(self) -> None:
        self.consumer.pause(self.consumer.assignment())

    def read(self, count: int) -> list[Got]:
        self.consumer.resume(self.consumer.assignment())
        got: list[Got] = []
        idle = 0
        while len(got) < count and idle < 40:
            batch = self.consumer.consume(1000, 0.5)
            idle = 0 if batch else idle + 1
            for msg in batch:
                if msg.error():
                    raise KafkaException(msg.error())
                topic, partition, offset = msg.topic(), msg.partition(), msg.offset()
                assert topic is not None and partition is not None and offset is not None
                headers = cast(list[tuple[str, bytes]], msg.headers() or [])
                got.append((topic, partition, offset, (msg.key(), msg.value(), headers)))
        return got

    def close(self) -> None:
        self.consumer.close()


class KafkaPythonReader:
    def __init__(self, bootstrap: str, ca: Path, topics: dict[str, int]) -> None:
        from kafka import KafkaConsumer, TopicPartition

        self.consumer = KafkaConsumer(
            bootstrap_servers=bootstrap, security_protocol="SSL", ssl_cafile=str(ca),
            enable_auto_commit=False, check_crcs=True)
        self.consumer.assign([TopicPartition(t, p) for t, n in topics.items() for p in range(n)])
        self.consumer.seek_to_beginning()

    def pause(self) -> None:
        self.consumer.pause(*self.consumer.assignment())

    def read(self, count: int) -> list[Got]:
        self.consumer.resume(*self.consumer.assignment())
        got: list[Got] = []
        idle = 0
        while len(got) < count and idle < 40:
            polled = self.consumer.poll(timeout_ms=500, max_records=1000)
            idle = 0 if polled else idle + 1
            for msgs in polled.values():
                got.extend((m.topic, m.partition, m.offset, (m.key, m.value, list(m.headers)))
                           for m in msgs)
        return got

    def close(self) -> None:
        self.consumer.close()


READERS: dict[str, Callable[[str, Path, dict[str, int]], Reader]] = {
    "librdkafka": LibrdkafkaReader,
    "kafka-python": KafkaPythonReader,
}


# ------------------------------------------------------------------ the test


def check_round(got: list[Got], want: Records, start: dict[tuple[str, int], int]) -> None:
    """Every wanted record once, each partition's in offset order from `start` on, and each
    equal to what is wanted (key, value and headers)."""
    by_partition: dict[tuple[str, int], list[tuple[int, Rec]]] = {}
    for topic, partition, offset, rec in got:
        by_partition.setdefault((topic, partition), []).append((offset, rec))
    assert set(by_partition) == set(want)
    for where, records in by_partition.items():
        offsets = [offset for offset, _rec in records]
        assert offsets == sorted(want[where]), f"{where}: offsets missing, repeated or unordered"
        assert offsets[0] == start.get(where, 0)
        for offset, rec in records:
            assert rec == want[where][offset], f"{where} offset {offset} differs"


@pytest.mark.parametrize("client", sorted(READERS))
def test_a_tls_client_reads_masked_pieces_in_order_twice(
        client: str, served: Served, kafka_broker: KafkaCluster, pki: Pki) -> None:
    masked, clear = unique("tlsp-mask"), unique("tlsp-clear")
    topics = {masked: MASKED_PARTITIONS, clear: CLEAR_PARTITIONS}
    for topic, partitions in topics.items():
        create_topic(kafka_broker.bootstrap, topic, partitions=partitions)
    connections = 0.0
    start: dict[tuple[str, int], int] = {}
    reader = READERS[client](served.proxy.bootstrap, pki.ca, topics)
    try:
        for n, kinds in enumerate((ROUND_ONE, ROUND_TWO)):
            reader.pause()
            placed = produce_round(kafka_broker.bootstrap, topics, kinds, seed=n)
            want = {**masked_by(served.mask, {w: r for w, r in placed.items() if w[0] == masked}),
                    **{w: r for w, r in placed.items() if w[0] == clear}}
            changed = [len(r[o][1] or b"") for w, r in want.items() for o in r
                       if r[o] != placed[w][o]]
            # Not vacuous: the filter rewrote small and large records of the masked topic.
            assert min(changed) < 1000 and max(changed) > LARGE_NOTE
            got = reader.read(sum(len(r) for r in placed.values()))
            check_round(got, want, start)
            total = scrape(served.metrics)
            if n == 0:
                connections = sample_value(total, "sluice_connections_total")
            else:
                # The second round came over the connections of the first.
                assert sample_value(total, "sluice_connections_total") == connections
            start = {w: max(r) + 1 for w, r in placed.items()}
    finally:
        reader.close()
    # Nothing went wrong on the proxy's side of either connection.
    complaints = logged(served.proxy, {"error", "warning"})
    assert not complaints, complaints[:3]


def logged(proxy: SluiceProxy, levels: set[str]) -> list[dict[str, Any]]:
    """The proxy's log events (JSON lines) at `levels`."""
    out = []
    for line in list(proxy.output):
        try:
            event = json.loads(line)
        except ValueError:
            continue
        if isinstance(event, dict) and event.get("level") in levels:
            out.append(event)
    return out
