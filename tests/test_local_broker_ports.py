"""Ports picked for brokers and proxies started later (sluice/local_broker.py)."""

from __future__ import annotations

import socket

from sluice.local_broker import _ephemeral_floor, free_port, free_port_block, port_is_free


def test_picked_ports_are_free_and_below_the_ephemeral_range() -> None:
    # A port the kernel may hand an outgoing connection before the picker binds it (a
    # proxy's node ports are bound on the first Metadata answer) is never picked.
    floor = _ephemeral_floor()
    for _ in range(50):
        base = free_port_block(9)
        assert base + 9 <= floor
        assert all(port_is_free(base + i) for i in range(9))
        assert free_port() < floor


def test_a_bound_port_is_not_free() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", free_port()))
        assert not port_is_free(sock.getsockname()[1])
