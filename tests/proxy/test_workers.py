"""`sluice serve --workers N`: processes sharing the ports, one `listening` line, signals."""

from __future__ import annotations

import json
import os
import signal
import socket
import struct
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from sluice.codec.headers import request_header_bytes
from tests.e2e.clients import confluent_consume, confluent_produce, create_topic, unique
from tests.harness.ports import free_port_block
from tests.harness.proxy import SluiceProxy
from tests.proxy.proxy_output import wait_for_output

StartProxy = Callable[..., SluiceProxy]


def events(proxy: SluiceProxy, name: str) -> list[dict[str, object]]:
    out = []
    for line in proxy.output:
        try:
            event = json.loads(line)
        except json.JSONDecodeError:
            continue
        if event.get("event") == name:
            out.append(event)
    return out


def connections_total(port: int) -> float:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        text = resp.read().decode()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "sluice_connections_total":
                return float(sample.value)
    raise AssertionError("sluice_connections_total missing")


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_two_workers_share_the_ports(start_proxy: StartProxy, tmp_path: Path) -> None:
    metrics_port = free_port_block(2)
    config = tmp_path / "sluice.yaml"
    config.write_text(f"metrics:\n  listen: 127.0.0.1:{metrics_port}\n")
    proxy = start_proxy(config=config, extra_args=["--workers", "2"])
    time.sleep(0.3)  # let any stray second `listening` line arrive
    assert len([line for line in proxy.output if "listening" in line]) == 1
    ready = events(proxy, "worker_ready")
    pids = {int(str(e["pid"])) for e in ready}
    assert len(ready) == 2 and len(pids) == 2
    assert proxy.process is not None and proxy.process.pid not in pids

    topic = unique("workers")
    create_topic(proxy.bootstrap, topic, partitions=2)
    sent = [(f"k{i}".encode(), f"v{i}".encode()) for i in range(200)]
    confluent_produce(proxy.bootstrap, topic, sent)
    assert sorted(confluent_consume(proxy.bootstrap, topic, 200)) == sorted(sent)
    # Both workers learnt the node and gave it the same port (clients used it above).
    learnt = {(e["node"], e["local_port"]) for e in events(proxy, "broker_learned")}
    assert len(learnt) == 1

    # The kernel spreads new connections over both workers.
    body = request_header_bytes(18, 0, 1, "workers-test")
    for _ in range(24):
        with socket.create_connection(("127.0.0.1", proxy.port), timeout=5) as sock:
            sock.sendall(struct.pack(">i", len(body)) + body)
            assert len(sock.recv(4)) == 4
    per_worker = [connections_total(metrics_port), connections_total(metrics_port + 1)]
    assert all(n > 0 for n in per_worker), per_worker
    assert sum(per_worker) >= 24

    assert proxy.stop() == 0
    deadline = time.monotonic() + 5
    while any(alive(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(alive(pid) for pid in pids)
    assert len(events(proxy, "stopping")) == 2  # each worker shut down cleanly


def test_a_dying_worker_stops_the_proxy(start_proxy: StartProxy) -> None:
    proxy = start_proxy(extra_args=["--workers", "2"])
    pids = [int(str(e["pid"])) for e in events(proxy, "worker_ready")]
    os.kill(pids[0], signal.SIGKILL)
    assert proxy.process is not None
    assert proxy.process.wait(timeout=20) != 0
    assert wait_for_output(proxy, '"worker_exited"')
    assert not alive(pids[1]) or _reaped_soon(pids[1])


def _reaped_soon(pid: int) -> bool:
    deadline = time.monotonic() + 5
    while alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    return not alive(pid)


def test_sighup_reaches_every_worker(start_proxy: StartProxy, tmp_path: Path) -> None:
    config = tmp_path / "sluice.yaml"
    config.write_text(
        "filters:\n  - name: mask\n    module: builtin:pii-mask\n    topics: [hup-*]\n"
        "    apply_to: [produce]\n"
    )
    proxy = start_proxy(config=config, extra_args=["--workers", "2"])
    instances = {str(e["instance"]) for e in events(proxy, "worker_ready")}
    assert len(instances) == 2
    proxy.send_signal(signal.SIGHUP)
    deadline = time.monotonic() + 20
    reloaded: set[str] = set()
    while reloaded != instances and time.monotonic() < deadline:
        reloaded = {
            str(e["instance"]) for e in events(proxy, "chain_installed") if e["trigger"] == "sighup"
        }
        time.sleep(0.1)
    assert reloaded == instances
    assert proxy.process is not None and proxy.process.poll() is None  # SIGHUP did not stop it
