"""The things a benchmark can point clients at: the broker directly, a plain TCP relay, or
Sluice with a given config. Each target is a context manager yielding a `Target`: the bootstrap
address and the pid of the process in the middle (None for direct), for CPU accounting, and
for Sluice the lines it has printed so far (the same list keeps growing until it stops).

Sluice is started only through its command line (``python -m sluice serve``, the contract
in sluice/cli_serve.py), never through the proxy's modules, so the benchmark measures whatever
the proxy's internals look like; extra arguments (``--workers N``, thread-pool options) are
passed through unchanged.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import tempfile
import textwrap
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psutil

from bench import baseline, cpu_clock
from sluice.local_broker import wait_for_port
from tests.harness.proxy import SluiceProxy


@dataclass(frozen=True)
class Target:
    bootstrap: str
    pid: int | None
    output: list[str] | None = None


@contextlib.contextmanager
def direct(broker_bootstrap: str) -> Iterator[Target]:
    yield Target(broker_bootstrap, None)


@contextlib.contextmanager
def sluice(
    broker_bootstrap: str,
    config_text: str | None = None,
    args: list[str] | None = None,
    source: baseline.Source | None = None,
) -> Iterator[Target]:
    """`sluice serve` from this checkout, or from `source` (another source tree)."""
    cfg_path: Path | None = None
    if config_text is not None:
        fd, name = tempfile.mkstemp(prefix="sluice-bench-", suffix=".yaml")
        os.write(fd, config_text.encode())
        os.close(fd)
        cfg_path = Path(name)
    proxy = SluiceProxy(upstream=broker_bootstrap, config=cfg_path, extra_args=list(args or []),
                        env=dict(source.env) if source else {},
                        cwd=source.cwd if source else None)
    proxy.start()
    try:
        assert proxy.process is not None
        # Measure the steady state: the proxy prepares its codec for a few seconds after
        # start-up (proxy/ops/warmup.py), which would land in the first phase's CPU and time.
        deadline = time.monotonic() + 60
        while not any('"codec_warmed"' in line for line in proxy.output):
            if time.monotonic() > deadline:
                raise RuntimeError("sluice serve did not finish its codec warm-up in 60 s")
            time.sleep(0.05)
        yield Target(proxy.bootstrap, proxy.process.pid, proxy.output)
    finally:
        proxy.stop()
        if cfg_path is not None:
            cfg_path.unlink(missing_ok=True)


def cpu_seconds(pid: int | None) -> float:
    """User + system CPU seconds of a process and all its children so far (a `sluice serve
    --workers N` parent forks N workers), 0.0 for no process: from their CPU clocks, in
    nanoseconds (bench/cpu_clock.py), not psutil's 10 ms ticks."""
    return cpu_clock.cpu_seconds(pid)


def listener_pid(address: str) -> int | None:
    """The pid of the process listening on `address` ("host:port", this machine), None if
    none is found: lets a harness count the broker's CPU as it counts the middle's."""
    port = int(address.rsplit(":", 1)[1])
    for conn in psutil.net_connections(kind="tcp"):
        if conn.status == psutil.CONN_LISTEN and conn.laddr and conn.laddr.port == port:
            return conn.pid
    return None


def pin(pid: int, cpus: set[int]) -> int:
    """Restrict a process, every thread it has, and its children's, to `cpus` (what `taskset
    -a -p` does): Linux applies an affinity per thread, and a thread started later inherits
    its creator's. Returns the number of threads pinned."""
    pinned = 0
    proc = psutil.Process(pid)
    for p in (proc, *proc.children(recursive=True)):
        try:
            tids = [t.id for t in p.threads()]
        except psutil.NoSuchProcess:
            continue
        for tid in tids:
            with contextlib.suppress(ProcessLookupError):
                os.sched_setaffinity(tid, cpus)
                pinned += 1
    return pinned


def parse_cpus(text: str) -> set[int]:
    """A CPU list as taskset writes it ("1", "0,2", "0-3") as a set of CPU numbers; every
    number must be a CPU this process may run on."""
    cpus: set[int] = set()
    for part in text.split(","):
        lo, dash, hi = part.strip().partition("-")
        if not lo.isdigit() or (dash and not hi.isdigit()):
            raise ValueError(f"{text!r}: expected CPU numbers such as 1, 0,2 or 0-3")
        cpus.update(range(int(lo), int(hi or lo) + 1))
    allowed = os.sched_getaffinity(0)
    if not cpus <= allowed:
        raise ValueError(
            f"{text!r}: CPU {min(cpus - allowed)} is not one of this machine's "
            f"({','.join(map(str, sorted(allowed)))})"
        )
    return cpus


def haproxy_available() -> bool:
    return shutil.which("haproxy") is not None


@contextlib.contextmanager
def haproxy_relay(broker_bootstrap: str, port: int) -> Iterator[Target]:
    """HAProxy in TCP mode on `port` in front of the broker: the cost of any extra hop.

    The broker must advertise `port` (TansuBroker(advertised_port=port)), or clients would go
    around the relay after bootstrap.
    """
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
        yield Target(f"127.0.0.1:{port}", proc.pid)
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        os.unlink(name)
