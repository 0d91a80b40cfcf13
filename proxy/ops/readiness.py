"""How a worker of `sluice serve --workers N` tells its supervisor it is serving."""

from __future__ import annotations

import os

from sluice.proxy.telemetry.logs import log


def notify_ready(fd: int, index: int, instance: str) -> None:
    """Called by a worker once its listeners are open."""
    log.info("worker_ready", worker=index, instance=instance, pid=os.getpid())
    os.write(fd, f"{index}\n".encode())
    os.close(fd)
