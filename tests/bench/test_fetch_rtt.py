"""bench/fetch_rtt.py: a round trip is timed to the last byte of its response, however the
response arrives in pieces, and the blocks' unmeasured fetches are left out."""

from __future__ import annotations

import socket
import struct
import threading
import time
import uuid
from collections.abc import Iterator

import pytest

from bench import fetch_rtt

_SIZE = struct.Struct(">i")


def _read_frame(conn: socket.socket) -> bytes | None:
    head = b""
    while len(head) < 4:
        got = conn.recv(4 - len(head))
        if not got:
            return None
        head += got
    (size,) = _SIZE.unpack(head)
    body = b""
    while len(body) < size:
        body += conn.recv(size - len(body))
    return body


@pytest.fixture
def slow_broker() -> Iterator[tuple[str, list[bytes]]]:
    """Answers each request with a 300 000-byte frame echoing its correlation id, sent in
    three pieces 20 ms apart; keeps the requests it read."""
    server = socket.create_server(("127.0.0.1", 0))
    requests: list[bytes] = []

    def serve() -> None:
        conn, _ = server.accept()
        with conn:
            while (body := _read_frame(conn)) is not None:
                requests.append(body)
                correlation = body[4:8]  # api key, version, then the correlation id
                response = _SIZE.pack(300_000) + correlation + bytes(300_000 - 4)
                for i in range(3):
                    conn.sendall(response[i * 100_001 : (i + 1) * 100_001 + (i == 2) * 10])
                    time.sleep(0.02 if i < 2 else 0)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    host, port = server.getsockname()
    try:
        yield f"{host}:{port}", requests
    finally:
        server.close()
        thread.join(5)


def test_round_trips_time_the_whole_response(slow_broker: tuple[str, list[bytes]]) -> None:
    bootstrap, requests = slow_broker
    times, size = fetch_rtt.round_trips(bootstrap, uuid.uuid4(), 3)
    assert size == 300_004
    assert len(times) == 3
    assert len(requests) == 3 + fetch_rtt.SKIP
    # Two 20 ms gaps between the pieces of every response: timed to its last byte.
    assert all(t >= 0.04 for t in times)
    api_key, version = struct.unpack_from(">hh", requests[0], 0)
    assert (api_key, version) == (1, fetch_rtt.FETCH_VERSION)
