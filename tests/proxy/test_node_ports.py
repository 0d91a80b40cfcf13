"""A node port that is already taken is reported and the node moves to the next free port."""

from __future__ import annotations

import socket
import time
from collections.abc import Callable

from tests.e2e.clients import confluent_consume, confluent_produce, create_topic, unique
from tests.harness.proxy import SluiceProxy


def test_taken_node_port_is_reported_and_clients_still_get_through(
    start_proxy: Callable[..., SluiceProxy],
) -> None:
    proxy = start_proxy()
    squatter = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    squatter.bind(("127.0.0.1", proxy.port + 1))  # bound, not listening: connects are refused
    try:
        topic = unique("nodeport")
        create_topic(proxy.bootstrap, topic)
        sent = [(None, f"v{i}".encode()) for i in range(20)]
        confluent_produce(proxy.bootstrap, topic, sent)
        assert sorted(confluent_consume(proxy.bootstrap, topic, len(sent))) == sorted(sent)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and not any(
            "node_port_unavailable" in line for line in proxy.output
        ):
            time.sleep(0.1)
        lines = [line for line in proxy.output if "node_port_unavailable" in line]
        assert lines and f'"local_port": {proxy.port + 1}' in lines[0], lines
        assert any(f'"local_port": {proxy.port + 2}' in line for line in proxy.output)
    finally:
        squatter.close()
