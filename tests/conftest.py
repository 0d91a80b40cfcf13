"""Shared fixtures: one real Tansu broker per test session, and proxies in front of it; Apache
Kafka (one node, and a three-node cluster) for the tests that need the real broker.

`broker` is Tansu here; tests/e2e and tests/transforms override it with the session's Kafka
node (tests/harness/kafka_endpoint.py), and `start_proxy`, `proxy` and `shared_proxy` follow
the override because pytest resolves fixtures from the test's folder."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from hypothesis import settings

from tests.harness import kafka39_smoke
from tests.harness.broker import TansuBroker
from tests.harness.kafka_broker import KAFKA39_VERSION, ORDINARY_USERS, PROXY_USER, KafkaCluster
from tests.harness.kafka_endpoint import session_kafka_version
from tests.harness.proxy import SluiceProxy
from tests.harness.session_builds import session_module_cache

# Hypothesis' per-example deadline (200 ms by default) is a timing assertion: on CI's two cores,
# shared by parallel workers, an example that passes can still exceed it (a sealed value's
# flipped-byte test did, at load ~9). Timing goals live in bench/, so no test has one.
settings.register_profile("sluice", deadline=None)
settings.load_profile("sluice")

# Ordinary users the session's Kafka node has besides alice and bob (sluice-proxy: the user of
# the proxy's own connections, tests/e2e/test_kafka_own_connections.py).
E2E_USERS = ("app", "billing-eu", PROXY_USER)


@pytest.fixture(scope="session", autouse=True)
def _module_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Filters loaded with the default cache, here and in the proxies the tests start, use the
    session's compiled-module cache (tests/harness/session_builds.py), not the user's
    ~/.cache/sluice: each module is compiled once per session, on any machine."""
    before = os.environ.get("SLUICE_MODULE_CACHE")
    os.environ["SLUICE_MODULE_CACHE"] = str(session_module_cache(tmp_path_factory))
    yield
    if before is None:
        os.environ.pop("SLUICE_MODULE_CACHE", None)
    else:
        os.environ["SLUICE_MODULE_CACHE"] = before


@pytest.fixture(scope="session")
def tansu_broker() -> Iterator[TansuBroker]:
    """The bundled Tansu broker (the demo's default), one per session."""
    with TansuBroker() as b:
        yield b


@pytest.fixture(scope="session")
def broker(tansu_broker: TansuBroker) -> TansuBroker:
    """The broker of the tests outside tests/e2e and tests/transforms, which run against
    Apache Kafka instead (their conftest overrides this fixture)."""
    return tansu_broker


@pytest.fixture
def start_proxy(broker: TansuBroker) -> Iterator[Callable[..., SluiceProxy]]:
    """Factory: start_proxy(config=None, extra_args=[]) -> a running SluiceProxy, stopped after."""
    started: list[SluiceProxy] = []

    def start(
        config: Path | None = None, extra_args: list[str] | None = None, upstream: str | None = None
    ) -> SluiceProxy:
        proxy = SluiceProxy(
            upstream=upstream or broker.bootstrap, config=config, extra_args=list(extra_args or [])
        )
        started.append(proxy.start())
        return proxy

    yield start
    for proxy in started:
        proxy.stop()


@pytest.fixture
def proxy(start_proxy: Callable[..., SluiceProxy]) -> SluiceProxy:
    """A proxy with no filters in front of the session broker."""
    return start_proxy()


@pytest.fixture(scope="session")
def shared_proxy(broker: TansuBroker) -> Iterator[SluiceProxy]:
    """One filterless proxy for the whole session (tests that only pass traffic through)."""
    with SluiceProxy(upstream=broker.bootstrap) as p:
        yield p


@pytest.fixture(scope="session")
def kafka_broker() -> Iterator[KafkaCluster]:
    """One Apache Kafka node (KRaft, combined) with every listener, for the whole session.

    `bootstrap` is its PLAINTEXT listener (User:ANONYMOUS, a super user); `client_config(
    listener, user, mechanism)` gives confluent-kafka settings for the secured ones. Besides
    `alice` and `bob`, the ordinary users `app` and `billing-eu` are the principals of the
    encryption tests (tests/e2e/test_encryption.py). Kafka 4.4, or 3.9 with
    SLUICE_E2E_BROKER=kafka39 (tests/harness/kafka39_smoke.py)."""
    version = session_kafka_version()
    with KafkaCluster(nodes=1, version=version, users=(*ORDINARY_USERS, *E2E_USERS)) as cluster:
        yield cluster


@pytest.fixture(scope="session")
def kafka39_broker(request: pytest.FixtureRequest) -> Iterator[KafkaCluster]:
    """One Apache Kafka 3.9 node, for tests about what 3.9 still serves (the API versions
    Kafka 4 removed, tests/e2e/test_old_clients.py). The session's `kafka_broker` when that is
    already 3.9 (SLUICE_E2E_BROKER=kafka39)."""
    if session_kafka_version() == KAFKA39_VERSION:
        yield request.getfixturevalue("kafka_broker")
        return
    with KafkaCluster(nodes=1, version=KAFKA39_VERSION) as cluster:
        yield cluster


@pytest.fixture(scope="session")
def kafka_cluster() -> Iterator[KafkaCluster]:
    """Three Apache Kafka nodes, one quorum, internal topics replicated 3 times,
    min.insync.replicas 2. A test that kills or stops a node restarts it before it ends."""
    with KafkaCluster(nodes=3) as cluster:
        yield cluster


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        f"{kafka39_smoke.MARKER}: the subset CI also runs against Kafka 3.9 "
        "(tests/harness/kafka39_smoke.py)",
    )
    config.addinivalue_line(
        "markers",
        f"{kafka39_smoke.NEEDS_39}: uses the kafka39_broker fixture (a Kafka 3.9 node)",
    )


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The Kafka 3.9 smoke subset gets its marker (`-m kafka39_smoke` selects it), and the
    tests that start a 3.9 node theirs."""
    for item in items:
        if kafka39_smoke.selected(item.nodeid):
            item.add_marker(kafka39_smoke.MARKER)
        if "kafka39_broker" in getattr(item, "fixturenames", ()):
            item.add_marker(kafka39_smoke.NEEDS_39)
