"""Black-box tests of hostile batches (issue 26, item 5, and the record_count-0 finding).

A real `sluice serve` with builtin:pii-mask on produce and fetch, in front of a real Tansu,
driven with raw frames. Bombs are batches of Kafka's smallest records (7 bytes each): 10 MiB
of them is 976 bytes of zstd. Hostile stored batches are written straight to Tansu, which
keeps what Kafka's broker would refuse, and then fetched through the proxy.

Before the limits (measured with bench/bench_bombs.py on the shared 2-core machine), one
10 MiB bomb cost the proxy ~10 s of CPU, +800-950 MiB of RSS and a 67 MB answer on produce
(Metadata of another client waited 10-20 s), and ~4.7 s and +800 MiB on every fetch. The
bounds below are an order of magnitude under that and generous for a loaded machine.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from confluent_kafka import KafkaException

from sluice.codec.compression import CODEC_NAMES
from sluice.codec.error_codes import ErrorCode
from sluice.codec.messages import ApiKey
from tests.e2e.clients import confluent_consume, create_topic, unique
from tests.harness.broker import TansuBroker
from tests.harness.hostile_batches import (
    MiB,
    ProcessWatch,
    batch,
    bomb,
    bomb_section,
    decode_answer,
    first_partition,
    produce_records_frame,
    records_of,
)
from tests.harness.ports import free_port
from tests.harness.proxy import SluiceProxy
from tests.harness.raw_kafka import (
    connect,
    exchange_one,
    fetch_frame,
    produce_frame,
    recv_frame,
    scrape,
    series,
)

# Measures CPU, memory and latency of the proxy process: run alone.
pytestmark = pytest.mark.serial

CODECS = [1, 2, 3, 4]
ADDRESS = b"mail alice.smith@example.com"
MAX_CPU_S = 1.0
MAX_RSS_GROWTH_MIB = 64
MAX_METADATA_S = 1.0


@pytest.fixture(scope="module")
def own_broker() -> Iterator[TansuBroker]:
    """A broker of this module's own: the bombs stored here must not reach other tests."""
    with TansuBroker() as b:
        yield b


@pytest.fixture(scope="module")
def proxy(
    own_broker: TansuBroker, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[SluiceProxy]:
    config = {
        # Decompression stops at 8 MiB here (32 MiB by default): the configured limit holds.
        "limits": {"max_batch_bytes": 8 * MiB},
        "filters": [{"name": "pii", "module": "builtin:pii-mask", "topics": ["hostile-*"],
                     "apply_to": ["produce", "fetch"]}],
    }
    path = tmp_path_factory.mktemp("hostile") / "sluice.yaml"
    path.write_text(yaml.safe_dump(config), encoding="utf-8")
    with SluiceProxy(upstream=own_broker.bootstrap, config=path) as running:
        yield running


def fresh_topic(broker: TansuBroker, prefix: str) -> str:
    name = unique(f"hostile-{prefix}")
    create_topic(broker.bootstrap, name)
    return name


def broker_port(broker: TansuBroker) -> int:
    return int(broker.bootstrap.rsplit(":", 1)[1])


def store(broker: TansuBroker, topic: str, records: bytes) -> None:
    """Write `records` straight to Tansu (no proxy), which accepts them."""
    body, _ = exchange_one(broker_port(broker), produce_records_frame(1, topic, records))
    assert first_partition(ApiKey.PRODUCE, 9, body).error_code == 0


@contextlib.contextmanager
def watched(proxy: SluiceProxy) -> Iterator[dict[str, Any]]:
    """The proxy's CPU, RSS growth and another client's slowest Metadata during the block."""
    assert proxy.process is not None
    watch = ProcessWatch(proxy.process.pid, proxy.port)
    watch.start()
    figures: dict[str, Any] = {}
    try:
        yield figures
    finally:
        figures.update(watch.finish())
        figures["metadata_answers"] = watch.answers


def assert_bounded(figures: dict[str, Any]) -> None:
    assert figures["cpu_s"] < MAX_CPU_S, figures
    assert figures["rss_growth_mib"] < MAX_RSS_GROWTH_MIB, figures
    assert figures["metadata_slowest_s"] < MAX_METADATA_S, figures
    assert figures["metadata_answers"] >= 1, figures


def warm_up(proxy: SluiceProxy, topic: str) -> None:
    """One-record batches until the placement runs this kind (produce, its filters) inline: the
    bomb that follows is small on the wire, so before the limits it ran on the event loop."""
    with connect(proxy.port) as sock:
        for n in range(1, 13):
            sock.sendall(produce_frame(n, topic, [b"warm-up %d" % n]))
            assert recv_frame(sock) is not None


@pytest.mark.parametrize("codec", CODECS, ids=[CODEC_NAMES[c] for c in CODECS])
def test_a_produced_bomb_costs_one_partition_error(
    own_broker: TansuBroker, proxy: SluiceProxy, codec: int
) -> None:
    topic = fresh_topic(own_broker, f"bomb-{CODEC_NAMES[codec]}")
    warm_up(proxy, topic)
    frame = produce_records_frame(99, topic, bomb(codec, 10 * MiB))
    with watched(proxy) as figures:
        body, seconds = exchange_one(proxy.port, frame, timeout=60)
    part = first_partition(ApiKey.PRODUCE, 9, body)
    assert part.error_code == ErrorCode.MESSAGE_TOO_LARGE, part
    assert "max_batch_records" in (part.error_message or "")
    assert part.record_errors == ()
    assert len(body) < 1024, f"a {len(body)}-byte answer"
    assert seconds < 1.0, f"answered in {seconds:.2f} s"
    assert_bounded(figures)


@pytest.mark.parametrize("codec", CODECS, ids=[CODEC_NAMES[c] for c in CODECS])
def test_a_lying_bomb_stops_at_the_configured_byte_limit(
    own_broker: TansuBroker, proxy: SluiceProxy, codec: int
) -> None:
    """One record declared, 64 MiB of records inside: decompression stops at 8 MiB (zstd as
    a streamed frame, which does not declare its size up front)."""
    topic = fresh_topic(own_broker, f"liar-{CODEC_NAMES[codec]}")
    warm_up(proxy, topic)
    liar = batch(codec, bomb_section(64 * MiB), 1, sized=False)
    frame = produce_records_frame(99, topic, liar)
    with watched(proxy) as figures:
        body, _ = exchange_one(proxy.port, frame, timeout=60)
    part = first_partition(ApiKey.PRODUCE, 9, body)
    assert part.error_code == ErrorCode.MESSAGE_TOO_LARGE, part
    assert "more than 8388608 bytes" in (part.error_message or "")
    assert_bounded(figures)


@pytest.mark.parametrize("codec", CODECS, ids=[CODEC_NAMES[c] for c in CODECS])
def test_a_stored_bomb_costs_one_partition_error_on_fetch(
    own_broker: TansuBroker, proxy: SluiceProxy, codec: int
) -> None:
    topic = fresh_topic(own_broker, f"stored-{CODEC_NAMES[codec]}")
    store(own_broker, topic, bomb(codec, 10 * MiB))
    frame = fetch_frame(7, topic, max_wait_ms=100, partition_max_bytes=64 * MiB)
    with watched(proxy) as figures:
        body, seconds = exchange_one(proxy.port, frame, timeout=60)
    part = first_partition(ApiKey.FETCH, 12, body)
    assert part.error_code == ErrorCode.CORRUPT_MESSAGE, part
    assert part.records is None
    assert len(body) < 1024 and seconds < 1.0
    assert_bounded(figures)


@pytest.mark.parametrize("codec", [0, *CODECS], ids=[CODEC_NAMES[c] for c in [0, *CODECS]])
def test_a_batch_declaring_no_record_with_one_inside_is_never_fetched_unmasked(
    own_broker: TansuBroker, proxy: SluiceProxy, codec: int
) -> None:
    topic = fresh_topic(own_broker, f"count0-{CODEC_NAMES[codec]}")
    # Tansu serves a count-0 batch after another one, when it covers an offset (delta 1).
    store(own_broker, topic, batch(0, records_of([b"before"]), 1))
    store(own_broker, topic, batch(codec, records_of([ADDRESS]), 0, last_offset_delta=1))
    direct, _ = exchange_one(broker_port(own_broker), fetch_frame(7, topic, max_wait_ms=100))
    assert ADDRESS in direct or codec, "Tansu no longer serves the hostile batch"
    body, _ = exchange_one(proxy.port, fetch_frame(7, topic, max_wait_ms=100))
    part = first_partition(ApiKey.FETCH, 12, body)
    assert ADDRESS not in body
    assert (part.error_code, part.records) == (ErrorCode.CORRUPT_MESSAGE, None)
    # A real consumer through the proxy does not get the address either (librdkafka reports
    # the partition error, or sees nothing).
    try:
        consumed = confluent_consume(proxy.bootstrap, topic, 1, timeout=3)
    except KafkaException:
        consumed = []
    assert all(ADDRESS not in (value or b"") for _key, value in consumed)


def test_a_stored_batch_with_more_records_than_offsets_gets_a_partition_error(
    own_broker: TansuBroker, proxy: SluiceProxy
) -> None:
    """Two records in a batch covering one offset: no broker writes that, and consumers would
    give both the same offset. Before, pii-mask masked them and the proxy relayed the batch."""
    topic = fresh_topic(own_broker, "crowded")
    store(own_broker, topic, batch(0, records_of([ADDRESS, ADDRESS]), 2, last_offset_delta=0))
    direct, _ = exchange_one(broker_port(own_broker), fetch_frame(7, topic, max_wait_ms=100))
    assert ADDRESS in direct, "Tansu no longer serves the hostile batch"
    body, _ = exchange_one(proxy.port, fetch_frame(7, topic, max_wait_ms=100))
    assert ADDRESS not in body
    part = first_partition(ApiKey.FETCH, 12, body)
    assert (part.error_code, part.records) == (ErrorCode.CORRUPT_MESSAGE, None)


@pytest.mark.parametrize("codec", [0, 4], ids=["none", "zstd"])
def test_a_produced_batch_whose_offsets_do_not_match_its_count_is_corrupt(
    own_broker: TansuBroker, proxy: SluiceProxy, codec: int
) -> None:
    """Two records whose batch says it covers six offsets: Kafka's broker refuses that, Tansu
    stores it; before, the proxy masked the records and forwarded the batch."""
    topic = fresh_topic(own_broker, f"offsets-{CODEC_NAMES[codec]}")
    records = batch(codec, records_of([ADDRESS, ADDRESS]), 2, last_offset_delta=5)
    body, _ = exchange_one(proxy.port, produce_records_frame(5, topic, records))
    part = first_partition(ApiKey.PRODUCE, 9, body)
    assert part.error_code == ErrorCode.CORRUPT_MESSAGE, part
    assert "last offset delta 5" in (part.error_message or "")
    direct, _ = exchange_one(broker_port(own_broker), fetch_frame(7, topic, max_wait_ms=100))
    stored = decode_answer(ApiKey.FETCH, 12, direct).responses[0].partitions[0]
    assert not stored.records, "the broker stored a record of the refused batch"


def jobs_where(metrics_port: int, where: str) -> float:
    (line,) = [x for x in series(scrape(metrics_port), "sluice_filter_jobs_total")
               if f'where="{where}"' in x]
    return float(line.rsplit(" ", 1)[1])


def test_a_small_compressed_batch_never_runs_on_the_event_loop(
    own_broker: TansuBroker, tmp_path: Path
) -> None:
    """A kind that earned inline runs with one-record batches keeps them; a 1 KB zstd batch of
    the same kind goes to the pool, whatever it holds: before, a bomb like this ran inline
    and froze every connection of the proxy while it was decoded."""
    topic = fresh_topic(own_broker, "placement")
    metrics = free_port()
    config = {
        "metrics": {"listen": f"127.0.0.1:{metrics}"},
        "filters": [{"name": "pii", "module": "builtin:pii-mask", "topics": ["hostile-*"],
                     "apply_to": ["produce"]}],
    }
    path = tmp_path / "sluice.yaml"
    path.write_text(yaml.safe_dump(config), encoding="utf-8")
    with SluiceProxy(upstream=own_broker.bootstrap, config=path) as proxy:
        warm_up(proxy, topic)
        # A run over 0.5 ms of CPU (a cold thread, the codec's warm-up just after start) sets
        # the kind back by 4x as many fast runs (net/job_placement.py): warm until it is inline.
        with connect(proxy.port) as sock:
            for n in range(13, 213):
                if jobs_where(metrics, "inline") >= 2:
                    break
                sock.sendall(produce_frame(n, topic, [b"warm-up %d" % n]))
                assert recv_frame(sock) is not None
        inline, pool = jobs_where(metrics, "inline"), jobs_where(metrics, "pool")
        assert inline >= 2, f"the kind never ran inline ({inline} inline, {pool} in the pool)"
        liar = batch(4, bomb_section(64 * MiB), 1)
        small = batch(4, records_of([ADDRESS]), 1)
        assert len(liar) < 16 * 1024
        with watched(proxy) as figures:
            for n, records in enumerate((liar, small, small), start=50):
                exchange_one(proxy.port, produce_records_frame(n, topic, records))
        assert jobs_where(metrics, "inline") == inline
        assert jobs_where(metrics, "pool") == pool + 3
    assert_bounded(figures)


def test_an_answer_lists_at_most_100_record_errors(
    own_broker: TansuBroker, tmp_path: Path
) -> None:
    """2 000 records a filter rejects, each with its own reason: one partition error whose
    message counts them, and 100 record errors, not 2 000 (Kafka's own answers list every
    record; a batch at the record limit would make megabytes of them)."""
    topic = fresh_topic(own_broker, "rejects")
    config = {"filters": [{"name": "json", "module": "builtin:json-validate",
                           "topics": ["hostile-*"], "apply_to": ["produce"]}]}
    path = tmp_path / "sluice.yaml"
    path.write_text(yaml.safe_dump(config), encoding="utf-8")
    values = [b"not json %d" % i for i in range(2000)]
    with SluiceProxy(upstream=own_broker.bootstrap, config=path) as proxy:
        body, _ = exchange_one(proxy.port, produce_frame(3, topic, values))
    part = first_partition(ApiKey.PRODUCE, 9, body)
    assert part.error_code == ErrorCode.INVALID_RECORD
    assert [e.batch_index for e in part.record_errors] == list(range(100))
    assert "and 1999 more record errors" in (part.error_message or "")
    assert len(body) < 20_000, f"a {len(body)}-byte answer"


def _varint(n: int) -> bytes:
    zigzag, out = (n << 1) ^ (n >> 63), bytearray()
    while True:
        low, zigzag = zigzag & 0x7F, zigzag >> 7
        out.append(low | (0x80 if zigzag else 0))
        if not zigzag:
            return bytes(out)


def header_bomb(headers: int) -> bytes:
    """One record (null key and value) carrying `headers` empty headers (2 bytes each): a few
    hundred bytes of zstd that the decoding path would turn into millions of Python objects."""
    body = b"\x00" + _varint(0) + _varint(0) + _varint(-1) + _varint(-1) + _varint(headers)
    body += b"\x00\x01" * headers
    return batch(4, _varint(len(body)) + body, 1)


def test_a_header_bomb_costs_one_partition_error(
    own_broker: TansuBroker, proxy: SluiceProxy
) -> None:
    """One declared record with 3 million headers (638 bytes on the wire, 6 MB inflated,
    within max_batch_records and max_batch_bytes): before limits.max_batch_headers it cost
    the proxy +280 MiB of memory on produce (a header object each on the decoding path)."""
    topic = fresh_topic(own_broker, "headers")
    warm_up(proxy, topic)
    with watched(proxy) as figures:
        body, _ = exchange_one(proxy.port, produce_records_frame(99, topic, header_bomb(3_000_000)),
                               timeout=60)
    part = first_partition(ApiKey.PRODUCE, 9, body)
    assert part.error_code == ErrorCode.MESSAGE_TOO_LARGE, part
    assert "max_batch_headers" in (part.error_message or "")
    assert_bounded(figures)
    stored = fresh_topic(own_broker, "headers-stored")
    store(own_broker, stored, header_bomb(3_000_000))
    frame = fetch_frame(7, stored, max_wait_ms=100, partition_max_bytes=64 * MiB)
    with watched(proxy) as figures:
        body, _ = exchange_one(proxy.port, frame, timeout=60)
    part = first_partition(ApiKey.FETCH, 12, body)
    assert (part.error_code, part.records) == (ErrorCode.CORRUPT_MESSAGE, None), part
    assert_bounded(figures)
