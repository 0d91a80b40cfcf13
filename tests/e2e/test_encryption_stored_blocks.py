"""Sealed batches written without compressing, end to end: whole values sealed by
builtin:encrypt keep the producer's codec (lz4, zstd), lz4 written as literals with each
record's header group a match, zstd compressed as usual (docs/ENCRYPTION.md, *Stored blocks*).
Apache Kafka's broker accepts them (its LogValidator decompresses every compressed batch a
producer sends), and every client reads them straight from the broker:
librdkafka (confluent-kafka), kafka-python (python-lz4; lz4 only), aiokafka (cramjam)
and the Java client (lz4); through the proxy the allowed reader gets the produced values.
The stored batches are read raw from the broker to check their codec and their frames.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import cramjam
import pytest
import yaml
from confluent_kafka import Producer

from sluice.codec.compression import lz4_stored_frame
from sluice.codec.records import HEADER_SIZE, RawBatch, records_section
from tests.e2e.clients import (
    QUIET,
    aiokafka_consume,
    confluent_consume,
    create_topic,
    kafka_python_consume,
    unique,
)
from tests.harness.kafka_tools import ClientProbe
from tests.harness.proxy import SluiceProxy
from tests.harness.validating_relay import fetch_batches

CODECS = {"lz4": 3, "zstd": 4}
COUNT = 300


@pytest.fixture(scope="module")
def proxy(broker: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[SluiceProxy]:
    folder = tmp_path_factory.mktemp("stored-blocks")
    path = folder / "sluice.yaml"
    path.write_text(yaml.safe_dump({
        "filters": [{"name": "enc", "module": "builtin:encrypt", "topics": ["sb-*"],
                     "apply_to": ["produce", "fetch"],
                     "config": {"key": "k", "decrypt_for": ["User:ANONYMOUS"]}}],
        "kms": {"type": "local", "path": str(folder / "keys.json")}}))
    with SluiceProxy(upstream=broker.bootstrap, config=path) as p:
        yield p


def values_of(tag: str) -> list[bytes]:
    return [json.dumps({"card": f"4111-{tag}-{i:05d}", "name": f"Holder {i}"}).encode()
            for i in range(COUNT)]


def stored_batches(bootstrap: str, topic: str) -> list[RawBatch]:
    batches: list[RawBatch] = []
    while sum(b.header.record_count for b in batches) < COUNT:
        got = fetch_batches(bootstrap, topic, 0, batches[-1].header.last_offset + 1
                            if batches else 0)
        assert got, f"the broker holds fewer than {COUNT} records of {topic}"
        batches.extend(got)
    return batches


def assert_stored_blocks(batches: list[RawBatch], codec: int) -> None:
    """Every stored batch keeps the producer's codec and holds its sealed records in frames
    written as lz4 literals and header-group matches, or compressed by zstd as usual; no
    plaintext anywhere."""
    payloads = literals = 0
    for batch in batches:
        assert batch.header.compression == codec
        section = bytes(records_section(batch))
        payload = bytes(batch.data[HEADER_SIZE:])
        if codec == 3:
            # Kafka's descriptor; each record's header group a match of the one before
            # (codec/lz4_sealed.c), the ciphertext literals.
            assert payload[4:7] == bytes.fromhex("604082")
            assert bytes(cramjam.lz4.decompress(payload)) == section
            # Every record but the first and the last has its header group (~90 bytes here)
            # written as a match: the first has nothing before it, the last ends the block,
            # where LZ4 allows only literals. The Java producer sends its first record alone.
            literal = len(lz4_stored_frame(section))
            assert len(payload) <= literal - 64 * max(0, batch.header.record_count - 2)
            payloads += len(payload)
            literals += literal
        else:  # zstd searches as usual and finds the repeated header groups
            assert bytes(cramjam.zstd.decompress(payload)) == section
            payloads += len(payload)
            literals += len(section)  # a batch of one record has nothing to find
        assert b"4111-" not in section and b"Holder" not in section
        assert b"sluice.enc" in section
    assert payloads < 0.8 * literals


@pytest.mark.parametrize("name", sorted(CODECS))
def test_python_clients_read_stored_blocks_from_the_broker(
        broker: Any, proxy: SluiceProxy, name: str) -> None:
    codec = CODECS[name]
    topic = unique(f"sb-{name}")
    create_topic(broker.bootstrap, topic, partitions=1)
    values = values_of(name)
    producer = Producer({"bootstrap.servers": proxy.bootstrap, "enable.idempotence": True,
                         "compression.type": name, "linger.ms": 5,
                         "batch.num.messages": 50, **QUIET})
    for i, value in enumerate(values):
        producer.produce(topic, key=b"k%d" % i, value=value)
    assert producer.flush(60) == 0
    assert_stored_blocks(stored_batches(broker.bootstrap, topic), codec)
    # Straight from the broker: every client decompresses the stored frames (ciphertext).
    direct = confluent_consume(broker.bootstrap, topic, COUNT)
    assert len(direct) == COUNT and all(v not in values for _k, v in direct)
    if name == "lz4":  # kafka-python reads zstd only through `zstandard`, not installed
        assert kafka_python_consume(broker.bootstrap, topic, COUNT, None) == direct
    assert aiokafka_consume(broker.bootstrap, topic, COUNT, None) == direct
    # Through the proxy the allowed reader gets what was produced.
    assert [v for _k, v in confluent_consume(proxy.bootstrap, topic, COUNT)] == values


def test_java_producer_and_consumer_with_stored_lz4_blocks(
        broker: Any, proxy: SluiceProxy, probe: ClientProbe) -> None:
    """The Java producer's LZ4 batches (Kafka's own KafkaLZ4BlockOutputStream frames) are
    sealed and stored in frames written without searching; the Java consumer reads them from
    the broker (checking CRCs and decompressing every record) and, through the proxy, in the
    clear."""
    topic = unique("sb-java")
    create_topic(broker.bootstrap, topic, partitions=1)
    values = [v.decode() for v in values_of("java")]
    sent = probe.run("produce", proxy.bootstrap, lines=values, topic=topic, idempotent=True,
                     compression="lz4")
    assert sent["offsets"] == list(range(COUNT))
    assert_stored_blocks(stored_batches(broker.bootstrap, topic), 3)
    direct = probe.run("consume", broker.bootstrap, topic=topic, group=unique("sb-direct"),
                       count=COUNT, no_values=True)
    assert direct["offsets"] == list(range(COUNT))  # every record decompressed, CRCs checked
    plain = probe.run("consume", proxy.bootstrap, topic=topic, group=unique("sb-proxy"),
                      count=COUNT)
    assert plain["values"] == values
