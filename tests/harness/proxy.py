"""A `sluice serve` subprocess, started through the public command-line contract."""

from __future__ import annotations

import os
import queue
import signal
import subprocess
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path

from tests.harness.ports import free_port_block


@dataclass
class SluiceProxy:
    upstream: str
    config: Path | None = None
    extra_args: list[str] = field(default_factory=list)
    port: int = 0
    #: Extra environment and working directory of the process (bench/baseline.py runs
    #: another source tree this way).
    env: dict[str, str] = field(default_factory=dict)
    cwd: Path | None = None
    process: subprocess.Popen[str] | None = None
    output: list[str] = field(default_factory=list)
    _reader: threading.Thread | None = None

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self, timeout: float = 30.0) -> SluiceProxy:
        if not self.port:
            self.port = free_port_block(9)
        cmd = [
            sys.executable,
            "-m",
            "sluice",
            "serve",
            "--listen",
            self.bootstrap,
            "--upstream",
            self.upstream,
            *self.extra_args,
        ]
        if self.config is not None:
            cmd += ["--config", str(self.config)]
        env = dict(os.environ, SLUICE_LOG_FORMAT="json", **self.env)
        self.process = subprocess.Popen(
            cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
            cwd=self.cwd,
        )
        ready: queue.Queue[bool] = queue.Queue()

        def pump() -> None:
            assert self.process is not None and self.process.stdout is not None
            for line in self.process.stdout:
                self.output.append(line)
                if "listening" in line:
                    ready.put(True)
            ready.put(False)

        self._reader = threading.Thread(target=pump, daemon=True)
        self._reader.start()
        try:
            ok = ready.get(timeout=timeout)
        except queue.Empty:
            ok = False
        if not ok:
            self.stop()
            raise RuntimeError("sluice serve did not become ready:\n" + "".join(self.output[-50:]))
        return self

    def send_signal(self, sig: int) -> None:
        assert self.process is not None
        self.process.send_signal(sig)

    def stop(self) -> int | None:
        proc, self.process = self.process, None
        if proc is None:
            return None
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=5)
        if self._reader is not None:
            self._reader.join(timeout=5)
        return proc.returncode

    def __enter__(self) -> SluiceProxy:
        return self.start()

    def __exit__(self, exc_type: object, *_exc: object) -> None:
        self.stop()
        if exc_type is not None:
            # pytest shows it under the failure: why the proxy closed a connection, say.
            print("sluice serve's last lines:\n" + "".join(self.output[-40:]))
