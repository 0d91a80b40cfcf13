"""Capture golden Kafka frames from real clients (a one-off tool; safe to run again).

    /work/venv/bin/python tests/codec/capture_golden.py [--out tests/codec/golden]

Starts Tansu on 127.0.0.1 (a free port) with its advertised address pointing at a small TCP
relay, so that every client connection, bootstrap or not, passes the relay. The relay splits
both directions into frames with sluice.codec.frames, pairs responses with their requests by
correlation id, and records them. It then drives:

- confluent-kafka (librdkafka): admin create topics, describe cluster, incremental alter
  configs, delete topic; produce with none/gzip/snappy/lz4/zstd, idempotent and not;
  consume in a group;
- kafka-python: create topic, produce (none, gzip), consume;
- aiokafka: produce (none, gzip, snappy, lz4, zstd; not idempotent), consume.

Frames go to one JSON Lines file per client (`<client>.jsonl`): one object per frame with
conn, dir ("request"/"response"), api_key, api_version, correlation_id, scenario and the frame
body (without the size prefix) as hex. To stay small, only the first few frames of each
(direction, api_key, api_version) are kept, plus every Produce request/response, every Fetch
response that carries records (up to 12) and every frame of the list-topics scenario.
All payloads are synthetic.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import defaultdict
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from sluice.codec.frames import FrameBuffer  # noqa: E402
from sluice.codec.headers import parse_request_header, read_correlation_id  # noqa: E402
from tests.harness.broker import tansu_binary  # noqa: E402
from tests.harness.ports import free_port, wait_for_port  # noqa: E402

KEEP_PER_GROUP = 3
KEEP_FETCH_WITH_RECORDS = 12
KEEP_SCENARIOS = {"confluent-admin-list-topics"}
CODECS = ["none", "gzip", "snappy", "lz4", "zstd"]
QUIET = {"log_level": 3}


class Recorder:
    """Thread-safe store of captured frames."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.frames: list[dict[str, Any]] = []
        self.scenario = "startup"

    def add(self, entry: dict[str, Any]) -> None:
        with self.lock:
            entry["scenario"] = self.scenario
            self.frames.append(entry)


class Relay:
    """Accepts on `port`, connects each client to the broker, records frames both ways."""

    def __init__(self, port: int, upstream: int, recorder: Recorder) -> None:
        self.port = port
        self.upstream = upstream
        self.recorder = recorder
        self.listener = socket.create_server(("127.0.0.1", port))
        self.conn_ids = 0
        self.stopping = False
        self.sockets: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self.stopping:
            try:
                client, _addr = self.listener.accept()
            except OSError:
                return
            server = socket.create_connection(("127.0.0.1", self.upstream))
            self.conn_ids += 1
            conn = self.conn_ids
            pending: dict[int, tuple[int, int]] = {}
            self.sockets += [client, server]
            threading.Thread(
                target=self._pump, args=(client, server, conn, True, pending), daemon=True
            ).start()
            threading.Thread(
                target=self._pump, args=(server, client, conn, False, pending), daemon=True
            ).start()

    def _pump(
        self,
        src: socket.socket,
        dst: socket.socket,
        conn: int,
        is_request: bool,
        pending: dict[int, tuple[int, int]],
    ) -> None:
        frames = FrameBuffer()
        while True:
            try:
                chunk = src.recv(65536)
            except OSError:
                chunk = b""
            if not chunk:
                for sock in (src, dst):
                    try:
                        sock.shutdown(socket.SHUT_RDWR)
                    except OSError:
                        pass
                return
            for body in frames.feed(chunk):
                self._record(bytes(body), conn, is_request, pending)
            try:
                dst.sendall(chunk)
            except OSError:
                return

    def _record(
        self, body: bytes, conn: int, is_request: bool, pending: dict[int, tuple[int, int]]
    ) -> None:
        if is_request:
            header = parse_request_header(body)
            pending[header.correlation_id] = (header.api_key, header.api_version)
            key, version, corr = header.api_key, header.api_version, header.correlation_id
        else:
            corr = read_correlation_id(body)
            key, version = pending.pop(corr, (-1, -1))
        self.recorder.add(
            {
                "conn": conn,
                "dir": "request" if is_request else "response",
                "api_key": key,
                "api_version": version,
                "correlation_id": corr,
                "frame": body.hex(),
            }
        )

    def close(self) -> None:
        self.stopping = True
        self.listener.close()
        for sock in self.sockets:
            try:
                sock.close()
            except OSError:
                pass


def synthetic_records(tag: str, n: int) -> list[tuple[bytes | None, bytes | None]]:
    """Synthetic keys/values: repetitive enough to compress, never real data."""
    out: list[tuple[bytes | None, bytes | None]] = []
    for i in range(n):
        key = None if i % 5 == 4 else f"{tag}-key-{i}".encode()
        value = None if i == 7 else (f"{tag} synthetic payload {i} " * 4).encode()
        out.append((key, value))
    return out


def drive_confluent(bootstrap: str, recorder: Recorder) -> None:
    from confluent_kafka import Consumer, Producer
    from confluent_kafka.admin import (
        AdminClient,
        AlterConfigOpType,
        ConfigEntry,
        ConfigResource,
        NewTopic,
        ResourceType,
    )

    admin = AdminClient({"bootstrap.servers": bootstrap, **QUIET})
    recorder.scenario = "confluent-admin-create"
    topics = [f"golden-ck-{c}" for c in CODECS] + ["golden-ck-admin"]
    for fut in admin.create_topics([NewTopic(t, 1, 1) for t in topics]).values():
        fut.result(15)
    # An all-topics Metadata request: librdkafka (v9+) leaves the 4-byte placeholder of the
    # topic count in the body, which decodes with 3 trailing bytes.
    recorder.scenario = "confluent-admin-list-topics"
    admin.list_topics(timeout=15)
    recorder.scenario = "confluent-admin-describe-cluster"
    admin.describe_cluster().result(15)
    recorder.scenario = "confluent-admin-incremental-alter"
    resource = ConfigResource(
        ResourceType.TOPIC,
        "golden-ck-admin",
        incremental_configs=[
            ConfigEntry("retention.ms", "3600000", incremental_operation=AlterConfigOpType.SET)
        ],
    )
    for fut in admin.incremental_alter_configs([resource]).values():
        fut.result(15)
    recorder.scenario = "confluent-admin-delete"
    for fut in admin.delete_topics(["golden-ck-admin"]).values():
        fut.result(15)

    for codec in CODECS:
        for idempotent in (False, True):
            recorder.scenario = f"confluent-produce-{codec}-{'idem' if idempotent else 'plain'}"
            producer = Producer(
                {
                    "bootstrap.servers": bootstrap,
                    "compression.type": codec,
                    "enable.idempotence": idempotent,
                    "linger.ms": 20,
                    **QUIET,
                }
            )
            for i, (key, value) in enumerate(synthetic_records(f"ck-{codec}", 12)):
                headers: list[tuple[str, str | bytes | None]] | None = (
                    [("seq", str(i).encode()), ("nullable", None)] if i % 3 == 0 else None
                )
                producer.produce(f"golden-ck-{codec}", key=key, value=value, headers=headers)
            assert producer.flush(30) == 0

    recorder.scenario = "confluent-consume"
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"golden-{uuid.uuid4().hex[:6]}",
            "auto.offset.reset": "earliest",
            "session.timeout.ms": 6000,
            **QUIET,
        }
    )
    consumer.subscribe([f"golden-ck-{c}" for c in CODECS])
    want = 24 * len(CODECS)
    got = 0
    deadline = time.monotonic() + 40
    while got < want and time.monotonic() < deadline:
        msg = consumer.poll(0.5)
        if msg is not None and msg.error() is None:
            got += 1
    consumer.close()
    print(f"confluent consumed {got}/{want}")


def drive_kafka_python(bootstrap: str, recorder: Recorder) -> None:
    from kafka import KafkaConsumer, KafkaProducer
    from kafka.admin import KafkaAdminClient, NewTopic

    recorder.scenario = "kafka-python-admin-create"
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    admin.create_topics([NewTopic("golden-kp", 1, 1)])
    admin.close()
    for codec in ("none", "gzip"):
        recorder.scenario = f"kafka-python-produce-{codec}"
        producer = KafkaProducer(
            bootstrap_servers=bootstrap,
            compression_type=None if codec == "none" else codec,
            linger_ms=20,
        )
        for key, value in synthetic_records(f"kp-{codec}", 10):
            producer.send("golden-kp", key=key, value=value, headers=[("h", b"1")])
        producer.flush(30)
        producer.close()
    recorder.scenario = "kafka-python-consume"
    consumer = KafkaConsumer(
        "golden-kp",
        bootstrap_servers=bootstrap,
        group_id=f"golden-kp-{uuid.uuid4().hex[:6]}",
        auto_offset_reset="earliest",
        session_timeout_ms=6000,
        consumer_timeout_ms=15000,
    )
    got = 0
    for _msg in consumer:
        got += 1
        if got >= 20:
            break
    consumer.close()
    print(f"kafka-python consumed {got}/20")


def drive_aiokafka(bootstrap: str, recorder: Recorder) -> None:
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

    async def run() -> int:
        for codec in CODECS:
            recorder.scenario = f"aiokafka-produce-{codec}"
            producer = AIOKafkaProducer(
                bootstrap_servers=bootstrap,
                compression_type=None if codec == "none" else codec,
                linger_ms=20,
            )
            await producer.start()
            try:
                futures = [
                    await producer.send("golden-aio", key=k, value=v, headers=[("h", b"x")])
                    for k, v in synthetic_records(f"aio-{codec}", 10)
                ]
                await asyncio.gather(*futures)
            finally:
                await producer.stop()
        recorder.scenario = "aiokafka-consume"
        consumer = AIOKafkaConsumer(
            "golden-aio",
            bootstrap_servers=bootstrap,
            group_id=f"golden-aio-{uuid.uuid4().hex[:6]}",
            auto_offset_reset="earliest",
            session_timeout_ms=6000,
        )
        await consumer.start()
        got = 0
        try:
            deadline = time.monotonic() + 30
            while got < 50 and time.monotonic() < deadline:
                batch = await consumer.getmany(timeout_ms=500)
                got += sum(len(v) for v in batch.values())
        finally:
            await consumer.stop()
        return got

    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap, **QUIET})
    recorder.scenario = "aiokafka-setup"
    for fut in admin.create_topics([NewTopic("golden-aio", 1, 1)]).values():
        fut.result(15)
    print(f"aiokafka consumed {asyncio.run(run())}/50")


def select(frames: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Keep the interesting frames: see the module docstring."""
    kept: list[dict[str, Any]] = []
    per_group: dict[tuple[str, int, int], int] = defaultdict(int)
    fetch_with_records = 0
    for entry in frames:
        key = entry["api_key"]
        group = (entry["dir"], key, entry["api_version"])
        if key == 0 or entry["scenario"] in KEEP_SCENARIOS:
            kept.append(entry)
            continue
        if key == 1 and entry["dir"] == "response" and len(entry["frame"]) > 600:
            if fetch_with_records < KEEP_FETCH_WITH_RECORDS:
                fetch_with_records += 1
                kept.append(entry)
            continue
        if per_group[group] < KEEP_PER_GROUP:
            per_group[group] += 1
            kept.append(entry)
    return kept


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default=str(Path(__file__).parent / "golden"))
    parser.add_argument(
        "--clients", default="confluent,kafka_python,aiokafka", help="comma-separated"
    )
    parser.add_argument("--all", action="store_true", help="keep every frame (for analysis)")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    drivers = {
        "confluent": drive_confluent,
        "kafka_python": drive_kafka_python,
        "aiokafka": drive_aiokafka,
    }
    for name in args.clients.split(","):
        broker_port, relay_port = free_port(), free_port()
        recorder = Recorder()
        relay = Relay(relay_port, broker_port, recorder)
        log = tempfile.NamedTemporaryFile(prefix="tansu-golden-", suffix=".log", delete=False)
        proc = subprocess.Popen(
            [
                str(tansu_binary()),
                "broker",
                "--listener-url",
                f"tcp://127.0.0.1:{broker_port}",
                "--advertised-listener-url",
                f"tcp://127.0.0.1:{relay_port}",
                "--storage-engine",
                "memory://tansu/",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=dict(os.environ, RUST_LOG="warn"),
        )
        try:
            wait_for_port(broker_port, timeout=15)
            drivers[name](f"127.0.0.1:{relay_port}", recorder)
            time.sleep(0.5)
        finally:
            relay.close()
            proc.terminate()
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=5)
            log.close()
            os.unlink(log.name)
        with recorder.lock:
            kept = list(recorder.frames) if args.all else select(recorder.frames)
        path = out / f"{name}.jsonl"
        with path.open("w") as fh:
            for entry in kept:
                fh.write(json.dumps(entry, sort_keys=True) + "\n")
        print(f"{name}: {len(recorder.frames)} frames seen, {len(kept)} kept -> {path}")


if __name__ == "__main__":
    main()
