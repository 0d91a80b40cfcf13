"""Black-box tests for the holes of the proxy core listed in issue 11 (holes 1, 2, 3, 5, 7).

Each test drives a real `sluice serve` process in front of a real Tansu broker with raw frames
on plain sockets (or real clients), and judges the proxy only from outside: what a client
receives, when a connection is closed, the `/metrics` text and the process's resident memory.
Each reproduced its hole before the core redesign (the figures are in docs/PERFORMANCE.md,
"Holes of the proxy core"); they hold the redesigned core to it.

The bounds (memory growth, latency, series counts) are generous on purpose: the machine is
shared, and the holes overshoot them by an order of magnitude (figures in each test).
"""

from __future__ import annotations

import contextlib
import re
import select
import signal
import socket
import struct
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import wasmtime
import yaml

from sluice.codec.messages import ApiKey
from tests.e2e.clients import confluent_produce, create_topic, unique
from tests.harness.broker import TansuBroker
from tests.harness.ports import free_port
from tests.harness.proxy import SluiceProxy
from tests.harness.raw_kafka import (
    closed_by_peer,
    connect,
    correlation_id,
    exchange_one,
    fetch_frame,
    header_only_frame,
    metadata_frame,
    p99,
    process_rss,
    produce_frame,
    recv_frame,
    request_frame,
    sample_value,
    scrape,
    series,
)
from tests.harness.validating_relay import fetch_stored
from tests.proxy.test_reload import events, rewrite, wait_for

# Measures time: run alone, after the tests that run on two workers (scripts/dev.sh).
pytestmark = pytest.mark.serial

MiB = 1 << 20
MODULES = Path(__file__).resolve().parents[1] / "filters" / "modules"
ADDRESS = b"alice.smith@example.com"
MASKED = re.compile(rb"\*+@\*+\.\*+")


@pytest.fixture(scope="module")
def own_broker(broker: TansuBroker) -> TansuBroker:
    """The session's Kafka node. (On Tansu this module had a broker of its own, so that its
    hostile traffic could not disturb other tests; Kafka takes it without harm, and a second
    Kafka node would cost seconds of start-up and memory.)"""
    return broker


@contextlib.contextmanager
def serving(broker: TansuBroker, path: Path, config: dict[str, Any]) -> Iterator[SluiceProxy]:
    path.write_text(yaml.safe_dump(config), encoding="utf-8")
    with SluiceProxy(upstream=broker.bootstrap, config=path) as proxy:
        yield proxy


def pid_of(proxy: SluiceProxy) -> int:
    assert proxy.process is not None
    return proxy.process.pid


def fresh_topics(broker: TansuBroker, *prefixes: str) -> list[str]:
    """New one-partition topics, one per prefix."""
    names = [unique(prefix) for prefix in prefixes]
    for name in names:
        create_topic(broker.bootstrap, name)
    return names


def timed_requests(port: int, frames: list[bytes], pause: float = 0.0) -> list[float]:
    """Seconds each request took to be answered, sent one after the other on a new
    connection."""
    out = []
    with connect(port, timeout=30) as sock:
        for frame in frames:
            start = time.monotonic()
            sock.sendall(frame)
            body = recv_frame(sock)
            out.append(time.monotonic() - start)
            assert body is not None and correlation_id(body) == correlation_id(frame[8:])
            time.sleep(pause)
    return out


# ------------------------------------------------------------------ hole 1: hot reload window


def test_reload_filters_a_fetch_already_in_flight(own_broker: TansuBroker, tmp_path: Path) -> None:
    topics = fresh_topics(own_broker, *["reload-window"] * 5)
    path = tmp_path / "sluice.yaml"

    def config(fetch_topics: list[str]) -> str:
        # A produce-only filter on another topic keeps pii-mask loaded from the start.
        filters: list[dict[str, Any]] = [
            {"name": "warm", "module": "builtin:pii-mask", "topics": ["warm-only"],
             "apply_to": ["produce"]}
        ]
        if fetch_topics:
            filters.append({"name": "pii-fetch", "module": "builtin:pii-mask",
                            "topics": fetch_topics, "apply_to": ["fetch"]})
        return yaml.safe_dump({"filters": filters})

    def reload(text: str) -> None:
        installed = len(events(proxy, "chain_installed"))
        rewrite(path, text)
        proxy.send_signal(signal.SIGHUP)
        wait_for(lambda: len(events(proxy, "chain_installed")) > installed, 10, "the reload")

    leaks = []
    with serving(own_broker, path, yaml.safe_load(config([]))) as proxy:
        for i, topic in enumerate(topics):
            if i:
                reload(config([]))  # no fetch filter again
            with connect(proxy.port, timeout=15) as sock:
                # The consumer long-polls an empty partition: the Fetch waits at the broker.
                sock.sendall(fetch_frame(1, topic, offset=0, max_wait_ms=4000))
                time.sleep(0.3)
                reload(config([topic]))
                # The record arrives after the filter is in force: it must come out masked.
                confluent_produce(own_broker.bootstrap, topic, [(None, b"mail " + ADDRESS)])
                body = recv_frame(sock)
                assert body is not None and correlation_id(body) == 1
                if ADDRESS in body:
                    leaks.append(topic)
                    continue
                if not MASKED.search(body):
                    # Answered empty: the next Fetch must carry the record, masked.
                    sock.sendall(fetch_frame(2, topic, offset=0, max_wait_ms=2000))
                    again = recv_frame(sock)
                    assert again is not None and ADDRESS not in again
                    assert MASKED.search(again), "the record never came back, masked or not"
    assert not leaks, f"{len(leaks)} of {len(topics)} in-flight Fetches showed the address"


def test_a_fetch_filtered_again_after_a_reload_dead_letters_once(
    own_broker: TansuBroker, tmp_path: Path
) -> None:
    """A Fetch response filtered, then held behind a slower one while a reload comes, is
    filtered again by the new chain before it is sent: its failed record must reach the
    dead-letter topic once, not once per processing."""
    slow_topic, trap_topic, dlq = fresh_topics(own_broker, "reload-slow", "reload-dl", "dlq")
    module = tmp_path / "sluice_upper.wasm"
    module.write_bytes(wasmtime.wat2wasm((MODULES / "sluice_upper.wat").read_text()))
    path = tmp_path / "sluice.yaml"
    timeout_ms = 4000

    def config(extra: bool) -> str:
        filters: list[dict[str, Any]] = [
            # "LOOP" runs into the call deadline: its response takes timeout_ms to filter.
            {"name": "slow", "module": str(module), "topics": [slow_topic],
             "apply_to": ["fetch"], "on_error": "pass", "timeout_ms": timeout_ms},
            # "TRAP" fails: the record is dead-lettered.
            {"name": "dl", "module": str(module), "topics": [trap_topic],
             "apply_to": ["fetch"], "on_error": "dead-letter", "dead_letter_topic": dlq},
        ]
        if extra:  # what the reload changes: a filter on another topic
            filters.append({"name": "other", "module": "builtin:pii-mask",
                            "topics": ["other-only"], "apply_to": ["produce"]})
        return yaml.safe_dump({"filters": filters})

    confluent_produce(own_broker.bootstrap, slow_topic, [(None, b"LOOP slow")])
    confluent_produce(own_broker.bootstrap, trap_topic, [(None, b"TRAP once")])
    with serving(own_broker, path, yaml.safe_load(config(False))) as proxy:
        with connect(proxy.port, timeout=30) as sock:
            # Pipelined: the second response is filtered at once and waits behind the first.
            sock.sendall(fetch_frame(1, slow_topic) + fetch_frame(2, trap_topic))
            time.sleep(0.5)
            installed = len(events(proxy, "chain_installed"))
            rewrite(path, config(True))
            proxy.send_signal(signal.SIGHUP)
            wait_for(lambda: len(events(proxy, "chain_installed")) > installed, 10, "the reload")
            # The reload came while both responses were still held (else nothing is re-run).
            ready, _, _ = select.select([sock], [], [], 0)
            assert not ready, "the first response was sent before the reload"
            answers = [recv_frame(sock), recv_frame(sock)]
            assert [correlation_id(a) for a in answers if a is not None] == [1, 2]

        def letters() -> list[bytes | None]:
            return [r.value for r in fetch_stored(own_broker.bootstrap, dlq, 1)[0]]

        wait_for(letters, 20, "the dead letter")
        time.sleep(2)  # a second letter, if any, is queued right after the first
    assert letters() == [b"TRAP once"], "the record was dead-lettered once per processing"


# ------------------------------------------------------------------ hole 2: back-pressure


class Flooder(threading.Thread):
    """Writes the same pipelined frames over and over on one connection and never reads.

    Each frame gets its own correlation id. A send that blocks for a second (the proxy stopped
    reading: back-pressure) is retried until `stop` is set."""

    def __init__(self, port: int, frame: bytes, limit: int) -> None:
        super().__init__(daemon=True)
        self.sock = connect(port)
        self.sock.settimeout(1.0)
        self.frame = bytearray(frame)
        self.limit = limit
        self.sent = 0
        self.blocked = 0
        self.stop = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        batch = 64
        try:
            while not self.stop.is_set() and self.sent < self.limit:
                chunk = bytearray()
                for i in range(batch):
                    struct.pack_into(">i", self.frame, 8, (self.sent + i) & 0x7FFFFFFF)
                    chunk += self.frame
                view = memoryview(chunk)
                while view and not self.stop.is_set():
                    try:
                        n = self.sock.send(view)
                    except TimeoutError:
                        self.blocked += 1
                        continue
                    view = view[n:]
                self.sent += batch
        except OSError as exc:  # the proxy may close a connection that never reads
            self.error = exc

    def close(self) -> None:
        self.stop.set()
        self.join(10)
        self.sock.close()


def flood_and_measure(
    proxy: SluiceProxy, frame: bytes, seconds: float, limit: int
) -> tuple[int, list[float], Flooder]:
    """Flood one connection for `seconds`; (peak RSS growth, other client's Metadata latencies)."""
    pid = pid_of(proxy)
    # Warm: the other client's path is not measured cold.
    timed_requests(proxy.port, [metadata_frame(n) for n in range(3)])
    base = process_rss(pid)
    peak = base
    flooder = Flooder(proxy.port, frame, limit)
    flooder.start()
    latencies: list[float] = []
    try:
        end = time.monotonic() + seconds
        next_probe = time.monotonic() + 1.0
        while time.monotonic() < end:
            peak = max(peak, process_rss(pid))
            if time.monotonic() >= next_probe:
                latencies += timed_requests(proxy.port, [metadata_frame(1)])
                next_probe = time.monotonic() + 0.5
            time.sleep(0.1)
        peak = max(peak, process_rss(pid))
    finally:
        flooder.close()
    return peak - base, latencies, flooder


# The other client must be served while the flood lasts: before back-pressure its Metadata
# waited up to 1.9 s (issue 11). During the flood the proxy, the broker and the flooder keep
# both cores of the test machine busy, so its answers take what the scheduler gives three
# busy processes (80-200 ms seen on a quiet machine, 307 ms once under load): this bounds
# starvation, not speed, which bench/ measures.
SERVED_WITHIN_S = 1.0


def flood_summary(flooder: Flooder, growth: int, latencies: list[float]) -> str:
    slowest = max(latencies, default=0.0)
    return (f"sent {flooder.sent} requests (sends blocked {flooder.blocked} s), RSS growth "
            f"{growth / MiB:.1f} MiB, other client's Metadata at most {slowest * 1000:.0f} ms"
            + (f", then the connection failed: {flooder.error}" if flooder.error else ""))


def test_client_that_never_reads_local_answers(own_broker: TansuBroker, tmp_path: Path) -> None:
    (topic,) = fresh_topics(own_broker, "bp-local")
    config = {"filters": [{"name": "json", "module": "builtin:json-validate", "topics": [topic],
                           "apply_to": ["produce"]}]}
    # 100 records that are not JSON: the filter rejects them all, and the proxy answers the
    # Produce itself, with one error message per record (8.5 KiB of answer per 1.9 KiB asked).
    frame = produce_frame(1, topic, [b"not json %d" % i for i in range(100)])
    with serving(own_broker, tmp_path / "sluice.yaml", config) as proxy:
        body, _ = exchange_one(proxy.port, frame)
        assert b"json-validate" in body  # answered by the proxy: the filter refused them
        growth, latencies, flooder = flood_and_measure(proxy, frame, 12, 10**7)
    summary = flood_summary(flooder, growth, latencies)
    # Well-formed requests: the proxy may stop reading them, never drop the connection.
    assert flooder.error is None, summary
    assert growth < 16 * MiB, summary
    assert latencies and max(latencies) < SERVED_WITHIN_S, summary


def test_client_that_never_reads_broker_answers(own_broker: TansuBroker, tmp_path: Path) -> None:
    with serving(own_broker, tmp_path / "sluice.yaml", {}) as proxy:
        growth, latencies, flooder = flood_and_measure(proxy, metadata_frame(1), 12, 10**7)
    summary = flood_summary(flooder, growth, latencies)
    # Well-formed requests: the proxy may stop reading them, never drop the connection.
    assert flooder.error is None, summary
    assert growth < 16 * MiB, summary
    assert latencies and max(latencies) < SERVED_WITHIN_S, summary


# ------------------------------------------------------------------ hole 3: hostile headers


@pytest.mark.parametrize(
    ("api_key", "version"),
    [(ApiKey.METADATA, 999), (ApiKey.PRODUCE, 77), (4242, 0)],
    ids=["metadata-v999", "produce-v77", "key-4242"],
)
def test_unadvertised_version_closes_the_connection(
    own_broker: TansuBroker, tmp_path: Path, api_key: int, version: int
) -> None:
    with serving(own_broker, tmp_path / "sluice.yaml", {}) as proxy, connect(proxy.port) as sock:
        sock.sendall(header_only_frame(api_key, version, 7))
        assert closed_by_peer(sock, within=5), "the connection stayed open"
        # The proxy itself is fine: a new connection is served.
        body, _ = exchange_one(proxy.port, metadata_frame(1))
        assert correlation_id(body) == 1


def list_offsets_v0_frame(correlation_id: int, topic: str) -> bytes:
    """ListOffsets v0, written by hand (the codec knows v1+ only): Tansu advertises and answers
    v0; the proxy advertises v1+ only."""
    name = topic.encode()
    body = struct.pack(">hhih", ApiKey.LIST_OFFSETS, 0, correlation_id, -1)
    body += struct.pack(">iih", -1, 1, len(name)) + name  # replica id, one topic
    body += struct.pack(">iiqi", 1, 0, -1, 1)  # one partition: 0, latest, one offset
    return struct.pack(">i", len(body)) + body


def test_version_the_broker_answers_and_no_path_inspects_is_relayed(
    tansu_broker: TansuBroker, tmp_path: Path
) -> None:
    """Not advertised (the codec has no ListOffsets v0), but no path inspects ListOffsets:
    its bytes pass, as an older client that skips ApiVersions needs (Kafka 3.x serves v0).

    On Tansu: Kafka 4 removed ListOffsets v0 (KIP-896) and closes the connection itself; Tansu
    still answers it, as Kafka 3.x does."""
    own_broker = tansu_broker
    (topic,) = fresh_topics(own_broker, "lo-v0")
    direct, _ = exchange_one(own_broker.port, list_offsets_v0_frame(3, topic))
    assert correlation_id(direct) == 3  # the broker itself answers it
    with serving(own_broker, tmp_path / "sluice.yaml", {}) as proxy:
        relayed, _ = exchange_one(proxy.port, list_offsets_v0_frame(3, topic))
        assert relayed == direct
        # Clients that keep to the advertised versions are served as before.
        body, _ = exchange_one(proxy.port, metadata_frame(1))
        assert correlation_id(body) == 1


def test_unknown_versions_keep_metrics_and_memory_bounded(
    own_broker: TansuBroker, tmp_path: Path
) -> None:
    port = free_port()
    config = {"metrics": {"listen": f"127.0.0.1:{port}"}}
    with serving(own_broker, tmp_path / "sluice.yaml", config) as proxy:
        exchange_one(proxy.port, metadata_frame(1))
        base = process_rss(pid_of(proxy))
        pair = 0
        for _ in range(600):
            frames = []
            for _ in range(200):
                pair += 1
                # Versions no API has, on real and made-up API keys: every pair is new.
                frames.append(header_only_frame(pair % 400, 1000 + pair // 400, pair))
            with connect(proxy.port) as sock:
                sock.sendall(b"".join(frames))
                closed_by_peer(sock, within=2)
        growth = process_rss(pid_of(proxy)) - base
        text = scrape(port)
        count = len(series(text, "sluice_requests_total"))
        assert proxy.process is not None and proxy.process.poll() is None
    summary = f"{pair} headers: {count} sluice_requests_total series, RSS +{growth / MiB:.1f} MiB"
    assert count < 500, summary
    assert growth < 32 * MiB, summary


# ------------------------------------------------------------------ hole 5: a slow filter


class Spinner(threading.Thread):
    """Produces 'LOOP' records to the slow filter's topic, one request after the other."""

    def __init__(self, port: int, topic: str) -> None:
        super().__init__(daemon=True)
        self.port, self.topic = port, topic
        self.stop = threading.Event()
        self.answered = 0

    def run(self) -> None:
        with connect(self.port, timeout=30) as sock:
            n = 0
            while not self.stop.is_set():
                n += 1
                sock.sendall(produce_frame(n, self.topic, [b"LOOP spin"]))
                body = recv_frame(sock)
                assert body is not None
                self.answered += 1


def quick_produces(topic: str, count: int) -> list[bytes]:
    return [produce_frame(n, topic, [b"quick %d" % n]) for n in range(1, count + 1)]


def test_slow_filter_does_not_stall_other_topics(own_broker: TansuBroker, tmp_path: Path) -> None:
    slow, quick = fresh_topics(own_broker, "slow", "quick")
    module = tmp_path / "sluice_upper.wasm"
    # The hand-written test filter: a value starting with "LOOP" never returns (its CPU
    # deadline, 300 ms here, stops it; on_error pass lets the record through).
    module.write_bytes(wasmtime.wat2wasm((MODULES / "sluice_upper.wat").read_text()))
    config = {"filters": [{"name": "spin", "module": str(module), "topics": [slow],
                           "apply_to": ["produce"], "timeout_ms": 300, "on_error": "pass"}]}
    with serving(own_broker, tmp_path / "sluice.yaml", config) as proxy:
        idle = timed_requests(proxy.port, quick_produces(quick, 10), pause=0.02)
        spinner = Spinner(proxy.port, slow)
        spinner.start()
        try:
            wait_for(lambda: spinner.answered >= 1, 10, "the slow filter's first answer")
            busy = timed_requests(proxy.port, quick_produces(quick, 40), pause=0.02)
        finally:
            spinner.stop.set()
            spinner.join(15)
        assert spinner.answered >= 3, "the slow topic was not kept busy"
    summary = (f"quick-topic produce p99 {p99(busy) * 1000:.0f} ms while the filter spins "
               f"({p99(idle) * 1000:.0f} ms idle)")
    assert p99(busy) < 0.1, summary


def jobs_where(text: str, where: str) -> float:
    (line,) = [x for x in series(text, "sluice_filter_jobs_total") if f'where="{where}"' in x]
    return float(line.rsplit(" ", 1)[1])


def test_small_fast_jobs_run_inline_until_a_record_is_slow(
    own_broker: TansuBroker, tmp_path: Path
) -> None:
    """One-record batches of a filter that proved fast run on the loop (the thread hop costs
    more than the filter); a slow record sends its topic back to the pool, where a filter
    that keeps spinning stays, so it stalls the loop once at most."""
    topic, quick = fresh_topics(own_broker, "inline", "quick")
    module = tmp_path / "sluice_upper.wasm"
    module.write_bytes(wasmtime.wat2wasm((MODULES / "sluice_upper.wat").read_text()))
    port = free_port()
    config = {
        "metrics": {"listen": f"127.0.0.1:{port}"},
        "filters": [{"name": "spin", "module": str(module), "topics": [topic],
                     "apply_to": ["produce"], "timeout_ms": 300, "on_error": "pass"}],
    }
    with serving(own_broker, tmp_path / "sluice.yaml", config) as proxy:
        # Fast one-record batches until their kind has run inline a while. A run that a busy
        # core made slow costs the kind two fast runs of its learning: on a loaded machine 30
        # were once not enough (9 inline), so up to 120 are sent, 30 at a time.
        for first in range(1, 121, 30):
            fast = [produce_frame(n, topic, [b"fast %d" % n]) for n in range(first, first + 30)]
            timed_requests(proxy.port, fast)
            text = scrape(port)
            inline_before, pool_before = jobs_where(text, "inline"), jobs_where(text, "pool")
            if inline_before >= 10:
                break
        assert inline_before >= 10, f"{inline_before} inline, {pool_before} in the pool"
        spinner = Spinner(proxy.port, topic)
        spinner.start()
        try:
            wait_for(lambda: spinner.answered >= 1, 10, "the slow filter's first answer")
            busy = timed_requests(proxy.port, quick_produces(quick, 40), pause=0.02)
        finally:
            spinner.stop.set()
            spinner.join(15)
        text = scrape(port)
        assert spinner.answered >= 3, "the slow topic was not kept busy"
        assert jobs_where(text, "inline") <= inline_before + 1, "a slow kind kept running inline"
        assert jobs_where(text, "pool") >= pool_before + 2
    assert p99(busy) < 0.1, f"quick-topic p99 {p99(busy) * 1000:.0f} ms while the filter spins"


@pytest.mark.parametrize("threads", [0, 2])
def test_pipelined_requests_reach_the_broker_in_order_around_an_inline_filter_job(
    own_broker: TansuBroker, tmp_path: Path, threads: int
) -> None:
    """Requests before a filtered one, sent in the same write, reach the broker first, also
    when the filter job runs on the loop (no filter threads, or a small job of a fast kind):
    a job finished inline must not overtake the forwarding of earlier requests."""
    filtered, plain = fresh_topics(own_broker, "inline-order", "plain")
    config = {
        "proxy": {"filter_threads": threads},
        "filters": [{"name": "pii", "module": "builtin:pii-mask", "topics": [filtered],
                     "apply_to": ["produce"]}],
    }
    with serving(own_broker, tmp_path / "sluice.yaml", config) as proxy:
        # Teach the placement that this kind is fast (with threads), then pipeline.
        timed_requests(proxy.port, [produce_frame(n, filtered, [ADDRESS]) for n in range(1, 21)])
        with connect(proxy.port, timeout=15) as sock:
            frames = []
            for n in range(100, 160, 3):
                frames += [produce_frame(n, plain, [b"a"]), produce_frame(n + 1, plain, [b"b"]),
                           produce_frame(n + 2, filtered, [ADDRESS])]
            sock.sendall(b"".join(frames))
            got = [correlation_id(recv_frame(sock) or b"") for _ in frames]
    assert got == [correlation_id(f[8:]) for f in frames]


# ------------------------------------------------------------------ hole 7: smaller ones


def test_half_close_still_gets_every_response(own_broker: TansuBroker, tmp_path: Path) -> None:
    (topic,) = fresh_topics(own_broker, "half-close")
    with serving(own_broker, tmp_path / "sluice.yaml", {}) as proxy, \
            connect(proxy.port, timeout=15) as sock:
        frames = [metadata_frame(n) for n in range(1, 21)]
        frames.append(fetch_frame(21, topic, max_wait_ms=300))  # answered only after 300 ms
        sock.sendall(b"".join(frames))
        sock.shutdown(socket.SHUT_WR)
        got = []
        while (body := recv_frame(sock)) is not None:
            got.append(correlation_id(body))
    assert got == list(range(1, 22)), f"{len(got)} of 21 responses arrived"


def test_sasl_handshake_v0_closes_the_connection(own_broker: TansuBroker, tmp_path: Path) -> None:
    port = free_port()
    config = {"metrics": {"listen": f"127.0.0.1:{port}"}}
    with serving(own_broker, tmp_path / "sluice.yaml", config) as proxy:
        before = sample_value(scrape(port), "sluice_protocol_violations_total")
        with connect(proxy.port) as sock:
            sock.sendall(request_frame(ApiKey.SASL_HANDSHAKE, 0, 5, mechanism="PLAIN"))
            body = recv_frame(sock)
            # After a v0 handshake the client would send bare tokens: the proxy closes.
            closed = closed_by_peer(sock, within=3)
        after = sample_value(scrape(port), "sluice_protocol_violations_total")
    assert body is None or correlation_id(body) == 5
    assert closed, "the connection stayed open after a SaslHandshake v0"
    assert after == before + 1, "not counted as a protocol violation"


def test_reset_connections_leak_no_slot(own_broker: TansuBroker, tmp_path: Path) -> None:
    """Hole 7's slot leak, as far as it shows from outside: clients that reset their connection
    right after connecting (RST, often before the proxy has set the socket up) must give their
    `max_connections` slot back. (The leak the review found needs `setsockopt`, `Session()` or
    `peer_principal` to raise; a reset is the one way a client can try to make that happen.)"""
    limit = 4
    config = {"limits": {"max_connections": limit}}
    with serving(own_broker, tmp_path / "sluice.yaml", config) as proxy:
        linger_reset = struct.pack("ii", 1, 0)
        for _ in range(300):
            sock = socket.socket()
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, linger_reset)
            sock.connect(("127.0.0.1", proxy.port))
            sock.close()  # RST at once
        # Every slot frees (asynchronously): `limit` well-behaved clients are then all served.
        served = _served_together(proxy.port, limit, within=10)
    assert served == limit, f"only {served} of {limit} connections admitted after the resets"


def _served_together(port: int, count: int, within: float) -> int:
    deadline = time.monotonic() + within
    best = 0
    while time.monotonic() < deadline:
        socks = [connect(port) for _ in range(count)]
        try:
            served = sum(_answers(s) for s in socks)
        finally:
            for s in socks:
                s.close()
        best = max(best, served)
        if best == count:
            break
        time.sleep(0.2)
    return best


def _answers(sock: socket.socket) -> bool:
    sock.settimeout(5)
    try:
        sock.sendall(metadata_frame(1))
        return recv_frame(sock) is not None
    except OSError:
        return False

