"""Free TCP ports on 127.0.0.1 for test processes."""

from __future__ import annotations

import socket

from sluice.local_broker import free_port, wait_for_port

__all__ = ["free_port", "free_port_block", "port_is_free", "wait_for_port"]


def port_is_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def free_port_block(size: int) -> int:
    """A port P such that P .. P+size-1 are all free right now (the proxy uses P+1.. for nodes)."""
    for _ in range(200):
        base = free_port()
        if base + size < 65535 and all(port_is_free(base + i) for i in range(size)):
            return base
    raise RuntimeError(f"no block of {size} free ports found")
