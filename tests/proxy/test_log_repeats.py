"""A warning a client can repeat at will is logged once per interval, not once per attempt.

With the broker unreachable every new client connection fails its upstream connect; a client
reconnecting in a loop used to write one ``upstream_connect_failed`` line per attempt. A
partition a filter blocks logged ``filter_partition_error`` per batch. Now the first is logged
and the repeats are counted into the next line (``suppressed``).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path

from tests.harness import raw_kafka
from tests.harness.ports import free_port
from tests.harness.proxy import SluiceProxy


def test_unreachable_broker_is_logged_once_for_many_connections() -> None:
    dead = free_port()  # nothing listens there
    with SluiceProxy(upstream=f"127.0.0.1:{dead}") as proxy:  # logs JSON lines (no tty)
        for i in range(30):
            with raw_kafka.connect(proxy.port) as sock:
                sock.sendall(raw_kafka.metadata_frame(i))
                assert raw_kafka.closed_by_peer(sock, within=10)
        time.sleep(0.5)  # the proxy's log lines reach its output
        lines = [json.loads(ln) for ln in proxy.output
                 if ln.startswith("{") and "upstream_connect_failed" in ln]
        assert proxy.process is not None and proxy.process.poll() is None
    assert len(lines) == 1, lines
    assert lines[0]["upstream"] == f"127.0.0.1:{dead}" and lines[0]["suppressed"] == 0


def test_a_blocked_topic_is_logged_once_for_many_produces(
        tmp_path: Path, start_proxy: Callable[..., SluiceProxy]) -> None:
    # One unreadable policy once wrote 6 178 warnings in seconds: builtin:block fails every
    # batch of its topic and clients retry at once.
    cfg = tmp_path / "sluice.yaml"
    cfg.write_text(json.dumps({"filters": [{
        "name": "closed", "module": "builtin:block", "topics": ["closed-*"],
        "apply_to": ["produce"], "config": {"reason": "closed for the test"}}]}))
    proxy = start_proxy(config=cfg)
    with raw_kafka.connect(proxy.port) as sock:
        for i in range(40):
            sock.sendall(raw_kafka.produce_frame(i, "closed-topic", [b"x"]))
            body = raw_kafka.recv_frame(sock)
            assert body is not None and raw_kafka.correlation_id(body) == i
    time.sleep(0.5)
    lines = [json.loads(ln) for ln in proxy.output
             if ln.startswith("{") and "filter_partition_error" in ln]
    assert len(lines) == 1, lines
    assert lines[0]["topic"] == "closed-topic" and lines[0]["suppressed"] == 0
