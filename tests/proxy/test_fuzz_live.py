"""A live `sluice serve` under malformed frames while a well-behaved client keeps working.

Hostile connections send random bytes, huge or negative declared sizes, truncated headers,
valid headers followed by garbage bodies (Produce, Metadata, ApiVersions, every version the
proxy advertises), frames split at every byte, and connections that vanish mid-frame. Meanwhile
a confluent-kafka producer and consumer on other connections must see every record
acknowledged and delivered, the proxy process must stay up, each refused connection must leave
a structured log line, and no connection may end in an unexpected exception.
"""

from __future__ import annotations

import json
import random
import socket
import struct
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

from bench import wire
from sluice.codec.messages import codec_version_range, encode_request
from tests.e2e.clients import QUIET, create_topic, unique
from tests.harness.broker import TansuBroker
from tests.harness.proxy import SluiceProxy

CONFIG = """
filters:
  - name: mask
    module: builtin:pii-mask
    topics: ["fz-*"]
    apply_to: [produce, fetch]
"""


@pytest.fixture(scope="module")
def fuzz_target(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[TansuBroker, SluiceProxy]]:
    # A private broker: garbage bodies of requests the proxy only relays reach it too.
    cfg: Path = tmp_path_factory.mktemp("fuzz") / "sluice.yaml"
    cfg.write_text(CONFIG)
    with TansuBroker() as broker, SluiceProxy(upstream=broker.bootstrap, config=cfg) as proxy:
        yield broker, proxy


class WellBehaved(threading.Thread):
    """Produces numbered records through the proxy and consumes them back, until stopped."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        super().__init__(daemon=True)
        self.bootstrap = bootstrap
        self.topic = topic
        self.stop = threading.Event()
        self.acked: list[bytes] = []
        self.errors: list[str] = []
        self.consumed: list[bytes] = []

    def run(self) -> None:
        producer = Producer(
            {
                "bootstrap.servers": self.bootstrap,
                "linger.ms": 2,
                "enable.idempotence": True,
                **QUIET,
            }
        )

        def done(err: Any, msg: Any) -> None:
            if err is not None:
                self.errors.append(str(err))
            else:
                self.acked.append(msg.value())

        i = 0
        while not self.stop.is_set():
            producer.produce(
                self.topic, value=f"rec-{i} mail bob@example.com".encode(), on_delivery=done
            )
            i += 1
            producer.poll(0.005)
        if producer.flush(30):
            self.errors.append("records left unflushed")
        consumer = Consumer(
            {"bootstrap.servers": self.bootstrap, "group.id": unique("fz"), **QUIET}
        )
        try:
            consumer.assign([TopicPartition(self.topic, 0, 0)])
            deadline = time.monotonic() + 30
            while len(self.consumed) < len(self.acked) and time.monotonic() < deadline:
                for msg in consumer.consume(500, 0.5):
                    if msg.error():
                        self.errors.append(str(msg.error()))
                    else:
                        self.consumed.append(msg.value() or b"")
        finally:
            consumer.close()


def _hostile(bootstrap: str, data: bytes, linger: float = 0.0) -> None:
    """Send `data` on a fresh connection, read whatever comes back for a moment, close."""
    host, port = bootstrap.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=5) as sock:
        try:
            sock.sendall(data)
            if linger:
                sock.settimeout(linger)
                while sock.recv(65536):
                    pass
        except OSError:
            pass  # the proxy may close first: that is a fine outcome


def _advertised(bootstrap: str) -> dict[int, range]:
    with wire.RawConnection(bootstrap) as conn:
        response = conn.call(18, 3, wire.api_versions_request(3))
    return {
        int(e.api_key): range(int(e.min_version), int(e.max_version) + 1) for e in response.api_keys
    }


def _log_events(proxy: SluiceProxy) -> list[dict[str, Any]]:
    events = []
    for line in proxy.output:
        try:
            events.append(json.loads(line))
        except ValueError:
            continue
    return events


def test_hostile_connections_never_hurt_others(
    fuzz_target: tuple[TansuBroker, SluiceProxy],
) -> None:
    broker, proxy = fuzz_target
    assert proxy.process is not None
    topic = unique("fz")
    create_topic(proxy.bootstrap, topic, partitions=1)
    versions = _advertised(proxy.bootstrap)
    good = WellBehaved(proxy.bootstrap, topic)
    good.start()
    rng = random.Random(20261121)
    sent = 0
    try:
        # Random bytes, some starting with a plausible size prefix.
        for _ in range(60):
            blob = rng.randbytes(rng.randrange(1, 3000))
            if rng.random() < 0.5:
                blob = struct.pack(">i", len(blob)) + blob
            _hostile(proxy.bootstrap, blob)
            sent += 1
        # Huge, negative and oversized declared sizes: refused from the 4-byte prefix alone.
        for size in (0x7FFFFFFF, -1, -(2**31), 100 * 1024 * 1024 + 1, 2**30):
            _hostile(proxy.bootstrap, struct.pack(">i", size) + b"\x00" * 64, linger=2)
            sent += 1
        # Truncated headers: frames shorter than a request header, and empty frames.
        header = wire.request_bytes(18, 3, wire.api_versions_request(3), 1)[4:]
        for cut in range(0, 10):
            _hostile(proxy.bootstrap, struct.pack(">i", cut) + header[:cut], linger=0.5)
            sent += 1
        # A valid header with a garbage body, for every advertised version.
        for key in (0, 3, 18):
            for version in versions[key]:
                for _ in range(3):
                    body = rng.randbytes(rng.randrange(0, 200))
                    _hostile(proxy.bootstrap, wire.raw_request(key, version, body, 9), linger=0.3)
                    sent += 1
        # A valid Produce whose records are garbage, and one with a huge declared array count.
        produce = encode_request(wire.produce_request(9, [(topic, 0, wire.batch([b"x"]))]))
        for _ in range(20):
            cut = rng.randrange(8, len(produce))
            body = produce[:cut] + rng.randbytes(rng.randrange(1, 60))
            _hostile(proxy.bootstrap, wire.raw_request(0, 9, body, 9), linger=0.3)
            sent += 1
        flexible_produce = encode_request(wire.produce_request(11, [(topic, 0, b"")]))
        # transactional_id (compact null: 1 byte), acks, timeout, then the topic array count.
        huge = flexible_produce[:7] + b"\xff\xff\xff\xff\x0f" + b"\x00" * 8
        _hostile(proxy.bootstrap, wire.raw_request(0, 11, huge, 9), linger=1)
        # Connections that vanish mid-frame.
        for cut in (1, 3, 4, 12, 40):
            frame = wire.request_bytes(
                0, 9, wire.produce_request(9, [(topic, 0, wire.batch([b"y"]))]), 3
            )
            _hostile(proxy.bootstrap, frame[:cut])
            sent += 1
        # A small valid request split at every byte still gets its answer.
        frame = wire.request_bytes(18, 3, wire.api_versions_request(3), 77)
        with wire.RawConnection(proxy.bootstrap) as conn:
            for i in range(len(frame)):
                conn.send_raw(frame[i : i + 1])
                time.sleep(0.002)
            cid, response = conn.read_response(18, 3)
            assert cid == 77 and int(response.error_code) == 0
        assert proxy.process.poll() is None, "the proxy died"
        time.sleep(1)
    finally:
        good.stop.set()
        good.join(90)
    assert not good.is_alive()
    assert proxy.process.poll() is None, "the proxy died"
    assert not good.errors, good.errors[:5]
    assert len(good.acked) > 50, "the well-behaved producer made progress during the attack"
    masked = [v.replace(b"bob@example.com", b"***@*******.***") for v in good.acked]
    assert sorted(good.consumed) == sorted(masked), "every acknowledged record, masked, once"

    events = _log_events(proxy)
    violations = [e for e in events if e.get("event") == "connection_closed_protocol_violation"]
    assert len(violations) >= 20, len(violations)
    assert all(
        e.get("reason") and e.get("conn") and e.get("level") == "warning" for e in violations
    )
    assert not [e for e in events if e.get("event") == "connection_failed"], "unexpected exceptions"
    assert not [line for line in proxy.output if "Traceback" in line]
    assert sent > 100
    # The broker behind survived too (its own problem otherwise, but the test needs it).
    assert broker.process is not None and broker.process.poll() is None


def test_every_garbage_produce_version_fails_closed(
    fuzz_target: tuple[TansuBroker, SluiceProxy],
) -> None:
    """Garbage in a Produce to a filtered topic never reaches the broker as records."""
    broker, proxy = fuzz_target
    topic = unique("fz-closed")
    create_topic(proxy.bootstrap, topic, partitions=1)
    low, high = codec_version_range(0) or (0, 0)
    rng = random.Random(7)
    for version in range(low, high + 1):
        body = encode_request(
            wire.produce_request(version, [(topic, 0, wire.batch([b"mail bob@example.com"]))])
        )
        for _ in range(5):
            data = bytearray(body)
            for _ in range(rng.randrange(1, 6)):
                data[rng.randrange(len(data))] = rng.randrange(256)
            _hostile(proxy.bootstrap, wire.raw_request(0, version, bytes(data), 5), linger=0.3)
    assert proxy.process is not None and proxy.process.poll() is None
    stored = [r.value for r in wire.read_partition(broker.bootstrap, topic)]
    assert all(v is None or b"bob@example.com" not in v for v in stored), stored


# ------------------------------------------------------------------ hostile Wasm modules
MODULES = Path(__file__).resolve().parent.parent / "filters" / "modules"
HUGE_MEMORY_WAT = """
(module
  (memory (export "memory") 60000)
  (func (export "sluice_abi_version") (result i32) (i32.const 1))
  (func (export "sluice_alloc") (param i32) (result i32) (i32.const 1024))
  (func (export "sluice_filter") (param i32 i32) (result i64) (i64.const -1)))
"""


def _module_file(tmp_path: Path, kind: str) -> Path:
    import wasmtime

    path = tmp_path / f"{kind}.wasm"
    if kind == "not-wasm":
        path.write_bytes(random.Random(1).randbytes(4096))
    elif kind == "huge-file":
        # A valid preamble, then 32 MiB the parser has to reject.
        path.write_bytes(b"\0asm\x01\0\0\0" + b"\x0b" * (32 << 20))
    elif kind == "huge-memory":
        path.write_bytes(wasmtime.wat2wasm(HUGE_MEMORY_WAT))
    else:
        path.write_bytes(wasmtime.wat2wasm((MODULES / f"{kind}.wat").read_text()))
    return path


@pytest.mark.parametrize(
    ("kind", "expected"),
    [
        ("not-wasm", "not a valid Wasm module"),
        ("huge-file", "not a valid Wasm module"),
        ("huge-memory", "instantiation failed"),
        ("forbidden_import", "open_socket"),
        ("wasi_fs_import", "path_open"),
        ("start_loop", "instantiation failed"),
        ("abi_v2", "filter 'bad'"),
    ],
)
def test_bad_module_in_the_config_stops_serve_with_a_clear_message(
    tmp_path: Path, kind: str, expected: str
) -> None:
    import subprocess
    import sys

    module = _module_file(tmp_path, kind)
    cfg = tmp_path / "sluice.yaml"
    cfg.write_text(
        "filters:\n"
        "  - name: bad\n"
        f"    module: {module}\n"
        '    topics: ["*"]\n'
        "    apply_to: [produce]\n"
        "    timeout_ms: 50\n"
    )
    started = time.monotonic()
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "sluice",
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--upstream",
            "127.0.0.1:9",
            "--config",
            str(cfg),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    output = done.stdout + done.stderr
    assert done.returncode == 2, output
    assert "Traceback" not in output, output
    assert expected in done.stderr, done.stderr
    assert "sluice.yaml" in done.stderr or str(module) in done.stderr, done.stderr
    assert time.monotonic() - started < 60


@pytest.fixture(scope="module")
def misbehaving(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[TansuBroker, SluiceProxy]]:
    tmp = tmp_path_factory.mktemp("wasm")
    module = _module_file(tmp, "sluice_upper")
    cfg = tmp / "sluice.yaml"
    cfg.write_text(
        "filters:\n"
        "  - name: upper\n"
        f"    module: {module}\n"
        '    topics: ["wr-*"]\n'
        "    apply_to: [produce]\n"
        "    timeout_ms: 200\n"
        "    max_memory_mb: 16\n"
    )
    with TansuBroker() as broker, SluiceProxy(upstream=broker.bootstrap, config=cfg) as proxy:
        yield broker, proxy


@pytest.mark.parametrize("marker", [b"LOOP", b"TRAP", b"GROW", b"BADOUT", b"ERROR"])
def test_misbehaving_module_is_contained(
    misbehaving: tuple[TansuBroker, SluiceProxy], marker: bytes
) -> None:
    """A guest that loops, traps, exhausts its memory or writes garbage fails that partition
    (INVALID_RECORD, on_error: reject) within its deadline; the proxy and the next batch are
    fine."""
    broker, proxy = misbehaving
    topic = unique("wr")
    create_topic(proxy.bootstrap, topic)
    with wire.RawConnection(proxy.bootstrap, timeout=30) as conn:
        started = time.monotonic()
        bad = conn.call(0, 9, wire.produce_request(9, [(topic, 0, wire.batch([b"ok", marker]))]))
        elapsed = time.monotonic() - started
        good = conn.call(0, 9, wire.produce_request(9, [(topic, 0, wire.batch([b"fine"]))]))
    codes = [int(p.error_code) for t in bad.responses for p in t.partition_responses]
    assert codes == [87], codes
    assert elapsed < 5, f"the guest was not stopped in time: {elapsed:.1f}s"
    assert [int(p.error_code) for t in good.responses for p in t.partition_responses] == [0]
    assert [r.value for r in wire.read_partition(broker.bootstrap, topic)] == [b"FINE"]
    assert proxy.process is not None and proxy.process.poll() is None
