"""A warning a client can repeat at will is logged once per interval, not once per attempt.

With the broker unreachable every new client connection fails its upstream connect; a client
reconnecting in a loop used to write one ``upstream_connect_failed`` line per attempt. Now the
first is logged and the repeats are counted into the next line (``suppressed``).
"""

from __future__ import annotations

import json
import time

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
