"""Faults around a running proxy: a broker killed and restarted under load, a slow broker,
clients that vanish mid-request, and a telemetry sink whose directory stops being writable.

Documented behaviour (docs/PERFORMANCE.md, "Faults"):

- Broker killed: the proxy keeps running. Sessions whose upstream connection died are closed
  (clients reconnect); new connections while the broker is down are closed after the failed
  upstream connect (``upstream_connect_failed``). Once the broker listens again, clients
  recover through the same proxy. With S3 storage (moto's S3 server) every acknowledged record
  survives the restart exactly once, filtered.
- Slow broker (answers delayed by 5 s): the proxy sets no deadline of its own on upstream
  answers (the client's request timeout decides); a slow connection never delays other
  connections.
- A client that disconnects mid-request: its session and upstream connection are closed, its
  late response is discarded; no file descriptor or session is left behind.
- Telemetry directory unwritable: events are dropped and counted, a rate-limited warning is
  logged, client traffic is unaffected; once writable again the sink resumes and writes a
  ``telemetry_dropped`` event into the data.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import shutil
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
from confluent_kafka import Producer

from bench import wire
from tests.e2e.clients import QUIET, confluent_consume, confluent_produce, create_topic, unique
from tests.harness.broker import TansuBroker
from tests.harness.moto import AWS_ENV, MotoServer
from tests.harness.ports import free_port
from tests.harness.proxy import SluiceProxy

MASK_CONFIG = """
filters:
  - name: mask
    module: builtin:pii-mask
    topics: ["ft-*"]
    apply_to: [produce]
"""
PII = "mail carol@example.com"
MASKED_PII = "mail *****@*******.***"


def _write_config(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


# ------------------------------------------------------------------ broker restart
@contextlib.contextmanager
def moto_s3(bucket: str) -> Iterator[dict[str, str]]:
    """moto's S3 server on 127.0.0.1 with `bucket` created; yields Tansu's environment."""
    boto3 = pytest.importorskip("boto3", reason="pip install 'moto[server]==5.2.5'")
    with MotoServer() as server:
        env = {"AWS_ENDPOINT": server.endpoint, **AWS_ENV, "AWS_ALLOW_HTTP": "true"}
        s3 = boto3.client(
            "s3",
            endpoint_url=server.endpoint,
            aws_access_key_id=AWS_ENV["AWS_ACCESS_KEY_ID"],
            aws_secret_access_key=AWS_ENV["AWS_SECRET_ACCESS_KEY"],
            region_name=AWS_ENV["AWS_REGION"],
        )
        s3.create_bucket(Bucket=bucket)
        yield env


def _kill(broker: TansuBroker, sig: int = signal.SIGKILL) -> None:
    proc, broker.process = broker.process, None
    assert proc is not None
    proc.send_signal(sig)
    proc.wait(timeout=30)


def _produce_through_restart(
    broker: TansuBroker,
    bootstrap: str,
    topic: str,
    seconds: float,
    down_at: float,
    down_for: float,
    sig: int = signal.SIGKILL,
) -> tuple[list[str], list[str]]:
    """Produce numbered records for `seconds`; kill the broker at `down_at` for `down_for`.
    Returns (acknowledged values, delivery errors)."""
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "enable.idempotence": True,
            "linger.ms": 5,
            "message.timeout.ms": 60000,
            "reconnect.backoff.max.ms": 500,
            **QUIET,
        }
    )
    acked: list[str] = []
    errors: list[str] = []

    def done(err: Any, msg: Any) -> None:
        if err is not None:
            errors.append(str(err))
        else:
            acked.append(msg.value().decode())

    start = time.monotonic()
    killed = restarted = False
    i = 0
    while time.monotonic() - start < seconds:
        now = time.monotonic() - start
        if not killed and now >= down_at:
            _kill(broker, sig)
            killed = True
        if killed and not restarted and now >= down_at + down_for:
            broker.start()
            restarted = True
        producer.produce(topic, value=f"id-{i:06d} {PII}".encode(), on_delivery=done)
        i += 1
        producer.poll(0.004)
    assert killed and restarted
    left = producer.flush(90)
    assert left == 0, f"{left} records neither delivered nor failed"
    return acked, errors


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["stopped", "killed"])
def test_broker_restart_with_s3_storage_keeps_every_acknowledged_record(
    tmp_path: Path, sig: int
) -> None:
    """Tansu on moto's S3 server is stopped (SIGTERM) or killed (SIGKILL) under load and
    restarted on the same port; the proxy is never restarted."""
    with moto_s3("tansu") as env:
        broker = TansuBroker(port=free_port(), storage="s3://tansu/", extra_env=env)
        cfg = _write_config(tmp_path / "sluice.yaml", MASK_CONFIG)
        with broker, SluiceProxy(upstream=broker.bootstrap, config=cfg) as proxy:
            assert proxy.process is not None
            topic = unique("ft")
            create_topic(proxy.bootstrap, topic, partitions=2)
            acked, errors = _produce_through_restart(
                broker, proxy.bootstrap, topic, seconds=9, down_at=3, down_for=2, sig=sig
            )
            assert proxy.process.poll() is None, "the proxy must not need a restart"
            assert not errors, errors[:3]
            assert len(acked) > 200
            stored = collections.Counter(
                r.value.decode()
                for p in (0, 1)
                for r in wire.read_partition(broker.bootstrap, topic, p)
                if r.value is not None
            )
            assert not [v for v in stored if "carol@example.com" in v], "unfiltered record stored"
            expected = collections.Counter(v.replace(PII, MASKED_PII) for v in acked)
            missing = expected - stored
            duplicated = {v: n for v, n in stored.items() if n > 1}
            assert not duplicated, f"stored more than once: {list(duplicated.items())[:3]}"
            assert set(stored) <= set(expected), "records stored that nobody saw acknowledged"
            if sig == signal.SIGKILL:
                # Tansu 0.6's S3 engine itself loses acknowledged records when killed
                # mid-write, with or without the proxy in front (docs/PERFORMANCE.md, Faults):
                # what it had in flight, one batch per partition (24 of 1 921 records once,
                # ids 625-660). Lost records must be such runs, not spread over the load. The
                # proxy's own zero-loss proof is on Apache Kafka:
                # tests/e2e/test_kafka_three_brokers.py.
                ids = sorted(int(v.split()[0].removeprefix("id-")) for v in missing)
                runs = sum(1 for i, n in enumerate(ids) if i == 0 or n > ids[i - 1] + 40)
                assert runs <= 2, f"{len(missing)} lost in {runs} runs: {ids[:20]}"
            else:
                assert not missing, f"{len(missing)} acknowledged records lost: {list(missing)[:3]}"
                # Consumers through the same (never restarted) proxy read them all.
                got = confluent_consume(proxy.bootstrap, topic, len(acked), timeout=60)
                assert len(got) == len(acked)


def test_broker_restart_with_memory_storage_recovers_service(
    tmp_path: Path, start_proxy: Any
) -> None:
    """Memory storage loses what it held (the broker's own doing); the proxy, never
    restarted, serves correct filtered traffic again once the broker is back."""
    broker = TansuBroker(port=free_port())
    with broker:
        cfg = _write_config(tmp_path / "sluice.yaml", MASK_CONFIG)
        proxy = start_proxy(config=cfg, upstream=broker.bootstrap)
        before = unique("ft-before")
        create_topic(proxy.bootstrap, before)
        confluent_produce(proxy.bootstrap, before, [(None, PII.encode())] * 20)
        _kill(broker)
        with wire.RawConnection(proxy.bootstrap) as conn:
            # While the broker is down a new connection is closed, not left hanging.
            conn.send(18, 3, wire.api_versions_request(3))
            assert conn.closed_by_peer(wait=10)
        broker.start()
        after = unique("ft-after")
        deadline = time.monotonic() + 30
        while True:
            try:
                create_topic(proxy.bootstrap, after)
                break
            except Exception:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.5)
        confluent_produce(proxy.bootstrap, after, [(None, PII.encode())] * 50)
        stored = [r.value for r in wire.read_partition(broker.bootstrap, after)]
        assert stored == [MASKED_PII.encode()] * 50
        assert proxy.process is not None and proxy.process.poll() is None
        assert any("upstream_connect_failed" in line for line in proxy.output)


# ------------------------------------------------------------------ slow broker
class DelayRelay:
    """A TCP relay in front of the broker that delays the broker's answers on connections
    whose first request carries `marker` in its client id, and relays the others at once."""

    def __init__(self, target_port: int, delay: float, marker: bytes = b"slow-client") -> None:
        self.target_port = target_port
        self.delay = delay
        self.marker = marker
        self.port = free_port()
        self.connections = 0
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._server: asyncio.Server | None = None

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._server = self._loop.run_until_complete(
            asyncio.start_server(self._handle, "127.0.0.1", self.port)
        )
        self._ready.set()
        self._loop.run_forever()

    async def _handle(self, cr: asyncio.StreamReader, cw: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            ur, uw = await asyncio.open_connection("127.0.0.1", self.target_port)
        except OSError:
            cw.close()
            return
        slow = asyncio.Event()

        async def up() -> None:
            first = True
            while data := await cr.read(65536):
                if first and self.marker in data:
                    slow.set()
                first = False
                uw.write(data)
                await uw.drain()

        async def down() -> None:
            while data := await ur.read(65536):
                if slow.is_set():
                    await asyncio.sleep(self.delay)
                cw.write(data)
                await cw.drain()

        tasks = [asyncio.ensure_future(up()), asyncio.ensure_future(down())]
        with contextlib.suppress(Exception):
            await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        for t in tasks:
            t.cancel()
        uw.close()
        cw.close()

    def __enter__(self) -> DelayRelay:
        self._thread.start()
        self._ready.wait(10)
        return self

    def __exit__(self, *exc: object) -> None:
        async def stop() -> None:
            if self._server is not None:
                self._server.close()

        asyncio.run_coroutine_threadsafe(stop(), self._loop).result(5)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)


def _fds(proxy: SluiceProxy) -> int:
    assert proxy.process is not None
    return psutil.Process(proxy.process.pid).num_fds()


def _settle_fds(proxy: SluiceProxy, baseline: int, timeout: float = 15) -> int:
    deadline = time.monotonic() + timeout
    now = _fds(proxy)
    while now > baseline + 2 and time.monotonic() < deadline:
        time.sleep(0.2)
        now = _fds(proxy)
    return now


@pytest.fixture
def slow_setup(tmp_path: Path) -> Iterator[tuple[TansuBroker, DelayRelay, SluiceProxy]]:
    broker_port = free_port()
    with DelayRelay(broker_port, delay=5.0) as relay:
        broker = TansuBroker(port=broker_port, advertised_port=relay.port)
        with broker, SluiceProxy(upstream=f"127.0.0.1:{relay.port}") as proxy:
            yield broker, relay, proxy


def _slow_metadata(bootstrap: str, topic: str) -> float:
    """Seconds for one Metadata answer on a connection the relay slows down."""
    with wire.RawConnection(bootstrap, timeout=30) as conn:
        request = wire.metadata_request(12, [topic])
        started = time.monotonic()
        conn.send_raw(wire.request_bytes(3, 12, request, 1, client_id="slow-client"))
        conn.read_response(3, 12)
        return time.monotonic() - started


def test_slow_broker_connection_does_not_stall_others(
    slow_setup: tuple[TansuBroker, DelayRelay, SluiceProxy],
) -> None:
    _broker, relay, proxy = slow_setup
    topic = unique("slow")
    create_topic(proxy.bootstrap, topic)
    results: list[float] = []
    slow_threads = [
        threading.Thread(target=lambda: results.append(_slow_metadata(proxy.bootstrap, topic)))
        for _ in range(4)
    ]
    for t in slow_threads:
        t.start()
    time.sleep(0.3)
    started = time.monotonic()
    offsets = confluent_produce(proxy.bootstrap, topic, [(None, b"fast")] * 200)
    fast = time.monotonic() - started
    for t in slow_threads:
        t.join(30)
    assert len(offsets) == 200
    assert len(results) == 4 and min(results) >= relay.delay * 0.9, results
    assert fast < relay.delay, f"other connections waited for the slow broker: {fast:.2f}s"


def test_clients_vanishing_mid_request_leave_nothing_behind(
    slow_setup: tuple[TansuBroker, DelayRelay, SluiceProxy],
) -> None:
    _broker, relay, proxy = slow_setup
    topic = unique("vanish")
    create_topic(proxy.bootstrap, topic)
    with wire.RawConnection(proxy.bootstrap) as conn:
        conn.call(18, 3, wire.api_versions_request(3))
    time.sleep(0.5)
    baseline = _fds(proxy)
    frame = wire.request_bytes(
        3, 12, wire.metadata_request(12, [topic]), 1, client_id="slow-client"
    )
    produce = wire.request_bytes(
        0,
        9,
        wire.produce_request(9, [(topic, 0, wire.batch([b"gone"]))]),
        2,
        client_id="slow-client",
    )
    for i in range(30):
        with wire.RawConnection(proxy.bootstrap) as conn:
            conn.send_raw(frame + (produce if i % 2 else b""))
            # Closed before the (delayed) answers arrive.
    peak = _fds(proxy)
    time.sleep(relay.delay + 1)
    settled = _settle_fds(proxy, baseline)
    assert settled <= baseline + 2, (baseline, peak, settled)
    # The proxy still serves, and logged no unexpected failure.
    assert len(confluent_produce(proxy.bootstrap, topic, [(None, b"after")] * 10)) == 10
    assert proxy.process is not None and proxy.process.poll() is None
    assert not [line for line in proxy.output if "connection_failed" in line or "Traceback" in line]


# ------------------------------------------------------------------ telemetry sink
def test_unwritable_telemetry_dir_drops_events_but_not_traffic(
    broker: TansuBroker, start_proxy: Any, tmp_path: Path
) -> None:
    tdir = tmp_path / "telemetry"
    cfg = _write_config(
        tmp_path / "sluice.yaml",
        MASK_CONFIG + f"telemetry:\n  dir: {tdir}\n  format: jsonl\n  rotate_seconds: 1\n",
    )
    proxy = start_proxy(config=cfg)
    topic = unique("ft-tel")
    create_topic(proxy.bootstrap, topic)
    confluent_produce(proxy.bootstrap, topic, [(None, PII.encode())] * 20)
    # Wait for the open file to be rotated away (rotate_seconds: 1), so that the failure hits
    # the creation of the next file. (Removing the directory under an open file loses the
    # events already written to it without counting them: see docs/PERFORMANCE.md, Faults.)
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        time.sleep(0.5)
        if not list(tdir.glob("*.tmp")) and list(tdir.glob("*.jsonl")):
            break
    # The directory turns into a file: every write fails (even for root, unlike chmod).
    shutil.rmtree(tdir)
    tdir.write_text("not a directory")
    started = time.monotonic()
    for _ in range(5):
        confluent_produce(proxy.bootstrap, topic, [(None, PII.encode())] * 20)
    elapsed = time.monotonic() - started
    assert elapsed < 20, f"traffic stalled behind the failing sink: {elapsed:.1f}s"
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and not any(
        "telemetry sink error" in line for line in proxy.output
    ):
        time.sleep(0.2)
    warnings = [json.loads(line) for line in proxy.output if "telemetry sink error" in line]
    assert warnings and warnings[0]["level"] == "warning"
    assert len(warnings) <= 3, "the warning is rate limited"
    # Writable again: the sink resumes and records the gap in the data itself.
    tdir.unlink()
    tdir.mkdir()
    confluent_produce(proxy.bootstrap, topic, [(None, PII.encode())] * 20)
    deadline = time.monotonic() + 20
    events: list[dict[str, Any]] = []
    while time.monotonic() < deadline:
        events = [
            json.loads(line)
            for f in tdir.glob("*.jsonl*")
            for line in f.read_text().splitlines()
            if line.strip()
        ]
        if any(e.get("type") == "telemetry_dropped" for e in events):
            break
        time.sleep(0.5)
    gaps = [e for e in events if e.get("type") == "telemetry_dropped"]
    assert gaps and gaps[0]["dropped"] > 0, [e.get("type") for e in events]
    assert proxy.process is not None and proxy.process.poll() is None
    stored = [r.value for r in wire.read_partition(broker.bootstrap, topic)]
    assert stored == [MASKED_PII.encode()] * 140
