"""Free TCP ports on 127.0.0.1 for test processes."""

from __future__ import annotations

from sluice.local_broker import free_port, free_port_block, port_is_free, wait_for_port

__all__ = ["free_port", "free_port_block", "port_is_free", "wait_for_port"]
