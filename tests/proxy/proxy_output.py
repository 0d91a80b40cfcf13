"""Waiting for a running proxy's log lines (its stdout is read by a background thread)."""

from __future__ import annotations

import time

from tests.harness.proxy import SluiceProxy


def wait_for_output(proxy: SluiceProxy, *texts: str, timeout: float = 10.0) -> bool:
    """True once some line of the proxy's output contains every one of `texts`."""
    deadline = time.monotonic() + timeout
    while True:
        if any(all(t in line for t in texts) for line in list(proxy.output)):
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
