"""franz-go (github.com/twmb/franz-go, pinned by tests/go/go.mod and go.sum) through the Sluice
proxy in front of Apache Kafka: an idempotent producer and a consumer group, with and without
a filter bound. The test builds `tests/go` with `go build` (modules from the Go module proxy
the first time, then from the module cache); it is skipped when there is no `go`."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.clients import confluent_consume, create_topic, unique
from tests.harness.kafka_broker import KafkaCluster
from tests.harness.proxy import SluiceProxy

pytestmark = pytest.mark.kafka

SOURCE = Path(__file__).resolve().parents[1] / "go"
SECRET = "alice@example.com"
MASKING = """
filters:
  - name: mask-in
    module: builtin:pii-mask
    topics: ["gp.*"]
    apply_to: [produce]
  - name: mask-out
    module: builtin:pii-mask
    topics: ["gf.*"]
    apply_to: [fetch]
"""


@pytest.fixture(scope="module")
def franzprobe(tmp_path_factory: pytest.TempPathFactory) -> Path:
    go = shutil.which("go")
    if go is None:
        pytest.skip("no `go` on PATH")
    binary = tmp_path_factory.mktemp("franz-go") / "franzprobe"
    env = dict(os.environ, GOFLAGS="-mod=mod")
    proc = subprocess.run([go, "build", "-o", str(binary), "."], cwd=SOURCE, env=env,
                          capture_output=True, text=True, timeout=600, check=False)
    assert proc.returncode == 0, proc.stderr
    return binary


def run(binary: Path, mode: str, bootstrap: str, lines: list[str] | None = None,
        **flags: str | int) -> dict[str, Any]:
    args = [str(binary), mode, "-bootstrap", bootstrap]
    for name, value in flags.items():
        args += [f"-{name}", str(value)]
    proc = subprocess.run(args, input="".join(f"{v}\n" for v in lines or []),
                          capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr
    result: dict[str, Any] = json.loads(proc.stdout)
    return result


@pytest.fixture(scope="module")
def masking_proxy(
    kafka_broker: KafkaCluster, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[SluiceProxy]:
    cfg = tmp_path_factory.mktemp("go-masking") / "sluice.yaml"
    cfg.write_text(MASKING)
    with SluiceProxy(upstream=kafka_broker.bootstrap, config=cfg) as p:
        yield p


def test_franz_go_produces_and_consumes_through_the_proxy(
    kafka_broker: KafkaCluster, franzprobe: Path
) -> None:
    topic = unique("go.plain")
    create_topic(kafka_broker.bootstrap, topic)
    values = [f"franz-go {i}" for i in range(30)]
    with SluiceProxy(upstream=kafka_broker.bootstrap) as proxy:
        out = run(franzprobe, "produce", proxy.bootstrap, values, topic=topic)
        assert out["offsets"] == list(range(30))
        got = run(franzprobe, "consume", proxy.bootstrap, topic=topic, group=unique("go"),
                  count=30)
    assert got["values"] == values
    direct = confluent_consume(kafka_broker.bootstrap, topic, 30)
    assert [v.decode() for _, v in direct if v is not None] == values


def test_franz_go_records_pass_the_filters(
    kafka_broker: KafkaCluster, masking_proxy: SluiceProxy, franzprobe: Path
) -> None:
    produced, fetched = unique("gp.masked"), unique("gf.masked")
    for topic in (produced, fetched):
        create_topic(kafka_broker.bootstrap, topic)
    values = [f"go {i} mail {SECRET}" for i in range(5)]
    # produce filter: stored masked
    run(franzprobe, "produce", masking_proxy.bootstrap, values, topic=produced)
    stored = [v.decode() for _, v in confluent_consume(kafka_broker.bootstrap, produced, 5)
              if v is not None]
    assert len(stored) == 5 and not any(SECRET in v for v in stored), stored
    # fetch filter: stored in the clear (written directly), read masked through the proxy
    run(franzprobe, "produce", kafka_broker.bootstrap, values, topic=fetched)
    got = run(franzprobe, "consume", masking_proxy.bootstrap, topic=fetched,
              group=unique("go"), count=5)
    assert len(got["values"]) == 5 and not any(SECRET in v for v in got["values"]), got
    assert all("*****@*******.***" in v for v in got["values"]), got
