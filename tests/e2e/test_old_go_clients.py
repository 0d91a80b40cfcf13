"""Two old Go clients, as Debian ships them, through the proxy: Sarama 1.22.1 and
segmentio/kafka-go 0.2.1 (`tests/go_old/main.go`, built in GOPATH mode from the sources of
golang-github-shopify-sarama-dev and golang-github-segmentio-kafka-go-dev, which
`scripts/dev.sh install` installs; nothing downloaded). Neither sends ApiVersions first:
Sarama set to Kafka 0.10.2 sends CreateTopics v0 and DescribeConfigs v0 to the controller,
kafka-go 0.2 CreateTopics v0. The codec decodes neither version.

Against Apache Kafka 3.9, which serves both: through the proxy the admin calls work as they do
directly (issue 27's regression: the proxy closed the connection, "request api key 19 v0 was
not advertised"). Against Kafka 4.4, which removed both (KIP-896): the broker closes the
connection and the client reports the same error through the proxy as directly."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.clients import unique
from tests.harness.kafka_broker import KAFKA_VERSION, KafkaCluster
from tests.harness.proxy import SluiceProxy

pytestmark = pytest.mark.kafka

SOURCE = Path(__file__).resolve().parents[1] / "go_old"
GOPATH = Path("/usr/share/gocode")
PACKAGES = ("github.com/Shopify/sarama", "github.com/segmentio/kafka-go")


def go_binary() -> str | None:
    venv_go = Path(os.environ.get("VIRTUAL_ENV", "")) / "bin" / "go"
    return shutil.which("go") or (str(venv_go) if venv_go.is_file() else None)


@pytest.fixture(scope="module")
def oldclients(tmp_path_factory: pytest.TempPathFactory) -> Path:
    go = go_binary()
    if go is None:
        pytest.skip("no `go` on PATH")
    missing = [p for p in PACKAGES if not (GOPATH / "src" / p).is_dir()]
    if missing:
        pytest.skip(f"Debian's Go sources of {', '.join(missing)} are not installed "
                    "(bash scripts/dev.sh install)")
    binary = tmp_path_factory.mktemp("oldclients") / "oldclients"
    # GOPATH mode: the Debian packages are sources in /usr/share/gocode/src, not modules.
    env = dict(os.environ, GO111MODULE="off", GOPATH=str(GOPATH), GOTOOLCHAIN="local",
               GOFLAGS="")
    proc = subprocess.run([go, "build", "-o", str(binary), "main.go"], cwd=SOURCE, env=env,
                          capture_output=True, text=True, timeout=600, check=False)
    assert proc.returncode == 0, proc.stderr
    return binary


def run(binary: Path, mode: str, bootstrap: str, topic: str) -> dict[str, Any]:
    proc = subprocess.run([str(binary), mode, bootstrap, topic], capture_output=True,
                          text=True, timeout=90, check=False)
    assert proc.returncode == 0, proc.stderr
    result: dict[str, Any] = json.loads(proc.stdout)
    return result


def test_sarama_creates_and_describes_a_topic_through_the_proxy(
    kafka39_broker: KafkaCluster, oldclients: Path
) -> None:
    topic = unique("sarama-old")
    with SluiceProxy(upstream=kafka39_broker.bootstrap) as proxy:
        assert run(oldclients, "sarama-create", proxy.bootstrap, topic) == {"created": topic}
        through = run(oldclients, "sarama-describe", proxy.bootstrap, topic)
    direct = run(oldclients, "sarama-describe", kafka39_broker.bootstrap, topic)
    assert "error" not in through, through
    assert through["configs"]["cleanup.policy"] == "delete"
    assert through == direct
    # The topic is Kafka's: creating it again directly is the broker's own refusal.
    again = run(oldclients, "sarama-create", kafka39_broker.bootstrap, topic)
    assert "already exists" in again.get("error", ""), again


def test_kafka_go_creates_a_topic_through_the_proxy(
    kafka39_broker: KafkaCluster, oldclients: Path
) -> None:
    topic = unique("kafkago-old")
    with SluiceProxy(upstream=kafka39_broker.bootstrap) as proxy:
        assert run(oldclients, "kafkago-create", proxy.bootstrap, topic) == {"created": topic}
    described = run(oldclients, "sarama-describe", kafka39_broker.bootstrap, topic)
    assert described["configs"]["cleanup.policy"] == "delete"


def test_on_kafka_4_the_old_clients_fail_as_they_do_directly(
    kafka_broker: KafkaCluster, oldclients: Path
) -> None:
    if kafka_broker.version != KAFKA_VERSION:
        pytest.skip("the session's Kafka is not 4.x (SLUICE_E2E_BROKER=kafka39)")
    with SluiceProxy(upstream=kafka_broker.bootstrap) as proxy:
        for mode in ("sarama-create", "kafkago-create"):
            topic = unique("old-on-4")
            direct = run(oldclients, mode, kafka_broker.bootstrap, topic)
            through = run(oldclients, mode, proxy.bootstrap, topic)
            assert "error" in direct and "error" in through, (mode, direct, through)
            assert through == direct, mode
