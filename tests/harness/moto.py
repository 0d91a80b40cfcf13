"""moto's server mode on 127.0.0.1: the AWS endpoint the tests use for S3 and KMS."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.harness.ports import free_port, wait_for_port

#: Credentials moto accepts; set in the environment of a test process that calls AWS.
AWS_ENV = {
    "AWS_ACCESS_KEY_ID": "test",
    "AWS_SECRET_ACCESS_KEY": "test",
    "AWS_REGION": "us-east-1",
    "AWS_DEFAULT_REGION": "us-east-1",
}


class MotoServer:
    """`moto_server` started on a free port; `endpoint` is its URL. Stop it with `stop()`
    (tests use that to make the AWS service unreachable)."""

    def __init__(self) -> None:
        server = shutil.which("moto_server") or str(Path(sys.executable).parent / "moto_server")
        if not Path(server).exists():
            pytest.skip("moto_server not installed (pip install 'moto[server]==5.2.5')")
        self.port = free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self.process: subprocess.Popen[bytes] | None = subprocess.Popen(
            [server, "-H", "127.0.0.1", "-p", str(self.port)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            env={**os.environ, **AWS_ENV})
        wait_for_port(self.port, timeout=30)

    def stop(self) -> None:
        proc, self.process = self.process, None
        if proc is None:
            return
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=5)

    def __enter__(self) -> MotoServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
