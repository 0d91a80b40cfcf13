"""Connection limits: max_connections, idle_timeout_seconds, max_frame_size, and their config
errors."""

from __future__ import annotations

import socket
import struct
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from sluice.codec.batch_limits import BatchLimits
from sluice.codec.headers import request_header_bytes
from sluice.proxy.ops.config_load import ConfigFileError, build_config
from sluice.proxy.ops.limits import IdleReaper
from tests.e2e.clients import confluent_consume, confluent_produce, create_topic, unique
from tests.harness.proxy import SluiceProxy
from tests.proxy.proxy_output import wait_for_output

StartProxy = Callable[..., SluiceProxy]


def config_file(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "sluice.yaml"
    path.write_text(text)
    return path


def api_versions_frame(correlation_id: int = 1) -> bytes:
    body = request_header_bytes(18, 0, correlation_id, "limits-test")
    return struct.pack(">i", len(body)) + body


def closed_by_peer(sock: socket.socket, within: float) -> bool:
    """True if the peer closes `sock` within `within` seconds (reads until EOF)."""
    sock.settimeout(within)
    try:
        while sock.recv(65536):
            pass
    except TimeoutError:
        return False
    except ConnectionError:
        return True
    return True


def answered(sock: socket.socket) -> bool:
    sock.settimeout(5)
    sock.sendall(api_versions_frame())
    try:
        return len(sock.recv(4)) == 4
    except (TimeoutError, ConnectionError):
        return False


# ------------------------------------------------------------------ config


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("limits:\n  max_connections: -1\n", "sluice.yaml:2: limits.max_connections: must be"),
        ("limits:\n  idle_timeout_seconds: soon\n", "sluice.yaml:2: limits.idle_timeout_seconds"),
        ("limits:\n  max_frame_size: 10\n", "sluice.yaml:2: limits.max_frame_size: must be"),
        ("limits:\n\n  max_conections: 5\n", "sluice.yaml:3: limits.max_conections: unknown key"),
        ("limits: 5\n", "sluice.yaml:1: limits: must be a mapping"),
        ("limits:\n  max_batch_bytes: 512\n", "sluice.yaml:2: limits.max_batch_bytes: must be"),
        ("limits:\n  max_batch_records: 0\n",
         "sluice.yaml:2: limits.max_batch_records: must be an integer >= 1, got 0"),
        ("limits:\n\n\n  max_batch_records: many\n", "sluice.yaml:4: limits.max_batch_records"),
        ("limits:\n  max_batch_headers: -1\n",
         "sluice.yaml:2: limits.max_batch_headers: must be an integer >= 0, got -1"),
    ],
)
def test_limits_config_errors_name_file_line_field(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(ConfigFileError) as err:
        build_config(("127.0.0.1", 9092), [("127.0.0.1", 9093)], config_file(tmp_path, text))
    assert message in str(err.value)


def test_limits_config_values(tmp_path: Path) -> None:
    text = "limits:\n  max_connections: 3\n  idle_timeout_seconds: 2.5\n  max_frame_size: 4096\n"
    config = build_config(("127.0.0.1", 9092), [("127.0.0.1", 9093)], config_file(tmp_path, text))
    assert (config.max_connections, config.idle_timeout, config.max_frame_size) == (3, 2.5, 4096)
    assert config.batch_limits == BatchLimits()  # 32 MiB, 100 000 records
    assert (config.batch_limits.max_bytes, config.batch_limits.max_records) == (32 << 20, 100_000)


def test_batch_limits_config_values(tmp_path: Path) -> None:
    text = ("limits:\n  max_batch_bytes: 1048576\n  max_batch_records: 500\n"
            "  max_batch_headers: 7\n")
    config = build_config(("127.0.0.1", 9092), [("127.0.0.1", 9093)], config_file(tmp_path, text))
    assert config.batch_limits == BatchLimits(max_bytes=1 << 20, max_records=500, max_headers=7)
    assert BatchLimits().max_headers == 200_000


# ------------------------------------------------------------------ idle reaper (unit)


@dataclass
class _Stats:
    bytes_in: int = 0
    bytes_out: int = 0


@dataclass(eq=False)
class _FakeSession:
    stats: _Stats = field(default_factory=_Stats)
    busy: bool = False
    bytes_waiting: int = 0
    closed: list[str] = field(default_factory=list)

    def close(self, reason: str, **fields: Any) -> None:
        self.closed.append(reason)


def test_idle_reaper_closes_only_quiet_idle_sessions() -> None:
    quiet, chatty, waiting = _FakeSession(), _FakeSession(), _FakeSession(busy=True)
    sessions: list[Any] = [quiet, chatty, waiting]
    reaped: list[Any] = []
    reaper = IdleReaper(10, lambda: sessions, reaped.append)
    assert reaper.sweep(0) == []
    for now in (4, 8):
        chatty.stats.bytes_in += 10
        assert reaper.sweep(now) == []
    chatty.stats.bytes_out += 1
    assert reaper.sweep(11) == [quiet]  # 11 s without a byte
    assert quiet.closed == ["idle_timeout"] and reaped == [quiet]
    assert chatty.closed == [] and waiting.closed == []  # traffic / a request in flight
    assert reaper.sweep(30) == [chatty]  # chatty went quiet at 11


# ------------------------------------------------------------------ through the proxy


def test_max_connections(start_proxy: StartProxy, tmp_path: Path) -> None:
    proxy = start_proxy(config=config_file(tmp_path, "limits:\n  max_connections: 2\n"))
    first = socket.create_connection(("127.0.0.1", proxy.port))
    second = socket.create_connection(("127.0.0.1", proxy.port))
    try:
        assert answered(first) and answered(second)
        with socket.create_connection(("127.0.0.1", proxy.port)) as third:
            assert closed_by_peer(third, within=5)
        assert wait_for_output(proxy, "connection_rejected", "max_connections")
        first.close()
        deadline = time.monotonic() + 5
        admitted = False
        while not admitted and time.monotonic() < deadline:  # the slot frees asynchronously
            with socket.create_connection(("127.0.0.1", proxy.port)) as again:
                admitted = answered(again)
            time.sleep(0.05)
        assert admitted
    finally:
        first.close()
        second.close()


def test_idle_connections_are_closed_busy_ones_kept(
    start_proxy: StartProxy, tmp_path: Path
) -> None:
    proxy = start_proxy(config=config_file(tmp_path, "limits:\n  idle_timeout_seconds: 1\n"))
    with (
        socket.create_connection(("127.0.0.1", proxy.port)) as idle,
        socket.create_connection(("127.0.0.1", proxy.port)) as busy,
    ):
        assert answered(idle)
        started = time.monotonic()
        while time.monotonic() - started < 3:
            assert answered(busy)
            time.sleep(0.3)
        assert closed_by_peer(idle, within=2)
        assert answered(busy)
    assert wait_for_output(proxy, "idle_timeout")
    # Real clients keep working: their connections carry traffic or reconnect.
    topic = unique("idle")
    create_topic(proxy.bootstrap, topic)
    sent = [(b"k", b"v")]
    confluent_produce(proxy.bootstrap, topic, sent)
    assert confluent_consume(proxy.bootstrap, topic, 1) == sent


def test_max_frame_size(start_proxy: StartProxy, tmp_path: Path) -> None:
    proxy = start_proxy(config=config_file(tmp_path, "limits:\n  max_frame_size: 2048\n"))
    with socket.create_connection(("127.0.0.1", proxy.port)) as ok:
        assert answered(ok)
    with socket.create_connection(("127.0.0.1", proxy.port)) as big:
        big.sendall(struct.pack(">i", 1_000_000) + b"\x00" * 16)
        assert closed_by_peer(big, within=5)
    assert wait_for_output(proxy, "frame too large")
