"""`sluice serve` operations flags: --advertised-host, and --workers argument checks."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable

from confluent_kafka.admin import AdminClient

from tests.e2e.clients import QUIET
from tests.harness.proxy import SluiceProxy

StartProxy = Callable[..., SluiceProxy]


def test_advertised_host_flag_is_what_metadata_returns(start_proxy: StartProxy) -> None:
    proxy = start_proxy(extra_args=["--advertised-host", "localhost"])
    admin = AdminClient({"bootstrap.servers": proxy.bootstrap, **QUIET})
    brokers = admin.list_topics(timeout=10).brokers
    assert brokers and {b.host for b in brokers.values()} == {"localhost"}
    assert all(proxy.port < b.port <= proxy.port + 8 for b in brokers.values())


def test_workers_argument_errors() -> None:
    def serve(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "sluice", "serve", "--upstream", "127.0.0.1:9", *args],
            capture_output=True,
            text=True,
            timeout=30,
        )

    zero = serve("--listen", "127.0.0.1:19999", "--workers", "0")
    assert zero.returncode == 2 and "--workers 0: must be at least 1" in zero.stderr
    any_port = serve("--listen", "127.0.0.1:0", "--workers", "2")
    assert any_port.returncode == 2 and "fixed --listen port" in any_port.stderr
