"""The things a benchmark can point clients at: the broker directly, a plain TCP relay, or
Sluice with a given config. Each target is a context manager yielding a bootstrap address."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import tempfile
import textwrap
from collections.abc import Iterator
from pathlib import Path

from tests.harness.ports import free_port, wait_for_port
from tests.harness.proxy import SluiceProxy


@contextlib.contextmanager
def direct(broker_bootstrap: str) -> Iterator[str]:
    yield broker_bootstrap


@contextlib.contextmanager
def sluice(
    broker_bootstrap: str, config_text: str | None = None, args: list[str] | None = None
) -> Iterator[str]:
    cfg_path: Path | None = None
    if config_text is not None:
        fd, name = tempfile.mkstemp(prefix="sluice-bench-", suffix=".yaml")
        os.write(fd, config_text.encode())
        os.close(fd)
        cfg_path = Path(name)
    proxy = SluiceProxy(upstream=broker_bootstrap, config=cfg_path, extra_args=list(args or []))
    proxy.start()
    try:
        yield proxy.bootstrap
    finally:
        proxy.stop()
        if cfg_path is not None:
            cfg_path.unlink(missing_ok=True)


def haproxy_available() -> bool:
    return shutil.which("haproxy") is not None


@contextlib.contextmanager
def haproxy_relay(broker_bootstrap: str) -> Iterator[str]:
    """HAProxy in TCP mode in front of the broker: the cost of any extra hop.

    Tansu advertises its own address, so after bootstrap the clients would go around a plain
    relay; the broker is therefore restarted by the caller with the relay's address advertised
    (see bench_proxy.py), and this relay simply forwards one port to it.
    """
    port = free_port()
    host, bport = broker_bootstrap.rsplit(":", 1)
    cfg = textwrap.dedent(
        f"""
        global
            maxconn 4096
        defaults
            mode tcp
            timeout connect 5s
            timeout client 60s
            timeout server 60s
        listen kafka
            bind 127.0.0.1:{port}
            server broker {host}:{bport}
        """
    )
    fd, name = tempfile.mkstemp(prefix="haproxy-bench-", suffix=".cfg")
    os.write(fd, cfg.encode())
    os.close(fd)
    proc = subprocess.Popen(
        ["haproxy", "-f", name, "-db"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        wait_for_port(port)
        yield f"127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        os.unlink(name)
