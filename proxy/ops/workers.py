"""`sluice serve --workers N`: N proxy processes sharing the listening ports.

The parent parses the config once, forks N workers and supervises them. Every worker binds the
bootstrap port and each per-node port with SO_REUSEPORT, so the kernel spreads new connections
over them; a connection then stays with the worker that accepted it. All workers give a broker
node the same local port because ports come from `proxy.node_ports` or, without it, from the
shared node -> port table the parent creates before forking (`net/node_ports.py`, PortTable).

The parent prints the single ``listening`` line once every worker has opened its listeners,
forwards SIGTERM/SIGINT (stop) and SIGHUP (reload filters) to the workers, and exits when they
have exited. If a worker dies on its own, the parent stops the others and exits non-zero, so
that the service manager (systemd, Kubernetes) restarts the whole proxy.
"""

from __future__ import annotations

import os
import select
import shutil
import signal
import socket
import sys
import tempfile
import time
from typing import Any

from sluice.proxy.net.node_ports import PortTable
from sluice.proxy.ops.app import run
from sluice.proxy.ops.config import ConfigFileError, ProxyConfig
from sluice.proxy.telemetry.logs import log

READY_TIMEOUT = 60.0
STOP_TIMEOUT = 15.0


def _die_with_parent() -> None:
    # A worker left behind by a SIGKILLed parent would keep the ports; Linux can stop it.
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        pr_set_pdeathsig = 1
        libc.prctl(pr_set_pdeathsig, signal.SIGTERM)
    except (OSError, AttributeError):
        pass


def _run_worker(config: ProxyConfig, index: int, ready_fd: int) -> int:
    _die_with_parent()
    config.worker_index = index
    try:
        return run(config, ready_fd=ready_fd)
    except ConfigFileError as exc:
        print(f"sluice serve: worker {index}: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"sluice serve: worker {index}: {exc.strerror or exc}", file=sys.stderr)
        return 1


class Supervisor:
    def __init__(self, config: ProxyConfig) -> None:
        self.config = config
        self.children: dict[int, int] = {}  # pid -> worker index
        self.stopping = False
        self.exit_code = 0
        self._table_dir: str | None = None

    # ---------------------------------------------------------------- start
    def start(self) -> int:
        """Fork the workers and wait until all are ready; returns 0, or an exit code."""
        read_fd, write_fd = os.pipe()
        if not self.config.node_port_table:
            # Every worker must map a broker node to the same local port.
            self._table_dir = tempfile.mkdtemp(prefix="sluice-ports-")
            self.config.node_port_table = str(PortTable.create(self._table_dir).path)
        for index in range(self.config.workers):
            pid = os.fork()
            if pid == 0:
                os.close(read_fd)
                code = 1
                try:
                    code = _run_worker(self.config, index, write_fd)
                finally:
                    sys.stdout.flush()
                    sys.stderr.flush()
                    os._exit(code)
            self.children[pid] = index
        os.close(write_fd)
        self._install_signals()
        try:
            return self._await_ready(read_fd)
        finally:
            os.close(read_fd)

    def _await_ready(self, read_fd: int) -> int:
        ready: set[int] = set()
        buffered = b""
        deadline = time.monotonic() + READY_TIMEOUT
        while len(ready) < len(self.children):
            if self.stopping or self._reap():
                return self.wait()
            if time.monotonic() > deadline:
                log.error("workers_not_ready", ready=len(ready), workers=len(self.children))
                self.stop()
                self.wait()
                return 1
            readable, _, _ = select.select([read_fd], [], [], 0.1)
            if readable:
                chunk = os.read(read_fd, 4096)
                buffered += chunk
                *lines, buffered = buffered.split(b"\n")
                ready.update(int(line) for line in lines if line.strip())
        return 0

    # ---------------------------------------------------------------- signals
    def _install_signals(self) -> None:
        signal.signal(signal.SIGTERM, self._on_stop_signal)
        signal.signal(signal.SIGINT, self._on_stop_signal)
        signal.signal(signal.SIGHUP, self._on_hup)

    def _on_stop_signal(self, signum: int, frame: Any) -> None:
        self.stop()

    def _on_hup(self, signum: int, frame: Any) -> None:
        self._signal_all(signal.SIGHUP)

    def _signal_all(self, sig: int) -> None:
        for pid in list(self.children):
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass

    def stop(self) -> None:
        self.stopping = True
        self._signal_all(signal.SIGTERM)

    def cleanup(self) -> None:
        if self._table_dir is not None:
            shutil.rmtree(self._table_dir, ignore_errors=True)

    # ---------------------------------------------------------------- exits
    def _reap(self) -> bool:
        """Collect exited workers; True if one exited while not stopping (a failure)."""
        failed = False
        while self.children:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                self.children.clear()
                break
            if pid == 0:
                break
            index = self.children.pop(pid, None)
            code = os.waitstatus_to_exitcode(status)
            if code != 0:
                self.exit_code = self.exit_code or (code if code > 0 else 1)
            if not self.stopping:
                log.error("worker_exited", worker=index, pid=pid, code=code)
                self.exit_code = self.exit_code or 1
                failed = True
        if failed:
            self.stop()
        return failed

    def wait(self) -> int:
        """Until every worker has exited (SIGKILL after STOP_TIMEOUT once stopping)."""
        stop_deadline: float | None = None
        while self.children:
            self._reap()
            if not self.children:
                break
            if self.stopping:
                if stop_deadline is None:
                    stop_deadline = time.monotonic() + STOP_TIMEOUT
                elif time.monotonic() > stop_deadline:
                    log.error("workers_killed", pids=sorted(self.children))
                    self._signal_all(signal.SIGKILL)
                    stop_deadline = time.monotonic() + STOP_TIMEOUT
            time.sleep(0.1)
        return self.exit_code


def supervise(config: ProxyConfig) -> int:
    """Run `config.workers` worker processes until they stop; returns the exit code."""
    if not hasattr(socket, "SO_REUSEPORT"):
        print("sluice serve: --workers needs SO_REUSEPORT (Linux or BSD)", file=sys.stderr)
        return 2
    supervisor = Supervisor(config)
    code = supervisor.start()
    if code != 0 or not supervisor.children:
        supervisor.cleanup()
        return code or supervisor.exit_code
    host, port = config.listen
    log.info(
        "listening",
        listen=f"{host}:{port}",
        upstream=",".join(f"{h}:{p}" for h, p in config.upstream),
        workers=config.workers,
        pids=sorted(supervisor.children),
    )
    code = supervisor.wait()
    log.info("stopped", workers=config.workers, code=code)
    supervisor.cleanup()
    return code
