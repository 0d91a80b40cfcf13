"""`sluice transform run` as a subprocess for tests: start, wait until running, kill."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from sluice.filters.config import BUILTIN_DIR

UPPER_WASM = BUILTIN_DIR.parent / "examples" / "upper" / "upper.wasm"


def write_config(directory: Path, name: str, inputs: list[str], output: str, *,
                 guarantee: str = "auto", batch_records: int = 200, extra: str = "") -> Path:
    path = directory / f"{name}.yaml"
    path.write_text(
        "transforms:\n"
        f"  - name: {name}\n"
        f"    input: {inputs!r}\n"
        f"    output: {output}\n"
        f"    guarantee: {guarantee}\n"
        f"    batch_records: {batch_records}\n"
        f"    filters: [{{name: upper, module: {UPPER_WASM}}}]\n" + extra)
    return path


@dataclass
class TransformProcess:
    config: Path
    bootstrap: str
    args: list[str] = field(default_factory=list)
    process: subprocess.Popen[bytes] | None = None
    log_path: Path | None = None

    def start(self, timeout: float = 60.0) -> TransformProcess:
        fd, name = tempfile.mkstemp(prefix="sluice-transform-", suffix=".log")
        os.close(fd)
        self.log_path = Path(name)
        with self.log_path.open("wb") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "sluice", "transform", "run", str(self.config),
                 "--bootstrap", self.bootstrap, *self.args],
                stdout=log, stderr=subprocess.STDOUT)
        self.wait_for("transforms_running", timeout)
        return self

    def output(self) -> str:
        assert self.log_path is not None
        return self.log_path.read_text(errors="replace")

    def wait_for(self, text: str, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if text in self.output():
                return
            if self.process is not None and self.process.poll() is not None:
                raise AssertionError(f"transform exited ({self.process.returncode}):\n"
                                     f"{self.output()[-3000:]}")
            time.sleep(0.1)
        raise AssertionError(f"no {text!r} after {timeout}s:\n{self.output()[-3000:]}")

    def kill9(self) -> None:
        assert self.process is not None
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(10)

    def stop(self) -> int | None:
        proc, self.process = self.process, None
        code = None
        if proc is not None:
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(30)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(10)
            code = proc.returncode
        if self.log_path is not None:
            self.log_path.unlink(missing_ok=True)
        return code
