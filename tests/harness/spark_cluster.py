"""A real Spark standalone cluster on 127.0.0.1 from the pyspark wheel: one master, one worker.

Started with the wheel's own ``bin/spark-class`` (``org.apache.spark.deploy.master.Master`` and
``...deploy.worker.Worker``), bound to loopback, work and log files under a temporary folder;
stopped by PID. ``driver_conf`` is what a driver on this machine needs to reach it.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from sluice.local_broker import free_port, wait_for_port


@dataclass
class SparkStandalone:
    workdir: Path
    cores: int = 2
    memory: str = "1g"
    port: int = 0
    processes: list[subprocess.Popen[bytes]] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"spark://127.0.0.1:{self.port}"

    @property
    def driver_conf(self) -> dict[str, str]:
        return {
            "spark.driver.host": "127.0.0.1",
            "spark.driver.bindAddress": "127.0.0.1",
            "spark.executor.memory": "512m",
            "spark.cores.max": str(self.cores),
            "spark.sql.shuffle.partitions": "4",
        }

    def _spawn(self, name: str, *args: str) -> subprocess.Popen[bytes]:
        import pyspark

        home = Path(pyspark.__file__).parent
        env = {
            **os.environ,
            "SPARK_HOME": str(home),
            "SPARK_LOCAL_IP": "127.0.0.1",
            "SPARK_LOCAL_DIRS": str(self.workdir / "local"),
            "SPARK_LOG_DIR": str(self.workdir / "logs"),
            "PYSPARK_PYTHON": sys.executable,
        }
        log = open(self.workdir / f"{name}.log", "wb")  # closed when the process ends
        proc = subprocess.Popen(
            [str(home / "bin" / "spark-class"), *args], env=env, stdout=log, stderr=log
        )
        self.processes.append(proc)
        return proc

    def log(self, name: str) -> str:
        path = self.workdir / f"{name}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def start(self, timeout: float = 120.0) -> SparkStandalone:
        (self.workdir / "local").mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self._spawn(
            "master", "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
            "--port", str(self.port), "--webui-port", str(free_port()),
        )
        try:
            wait_for_port(self.port, timeout=timeout)
            self._spawn(
                "worker", "org.apache.spark.deploy.worker.Worker", self.url, "--host",
                "127.0.0.1", "--cores", str(self.cores), "--memory", self.memory,
                "--webui-port", str(free_port()), "--work-dir", str(self.workdir / "work"),
            )
            deadline = time.monotonic() + timeout
            while "Successfully registered with master" not in self.log("worker"):
                if time.monotonic() > deadline or any(p.poll() is not None for p in self.processes):
                    raise RuntimeError(
                        "the Spark worker did not register:\n" + self.log("worker")[-3000:]
                    )
                time.sleep(0.2)
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        for proc in reversed(self.processes):
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(timeout=10)
        self.processes.clear()
