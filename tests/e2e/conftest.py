"""The end-to-end tests run against Apache Kafka: here `broker` is the session's one Kafka node.

The root conftest's `broker` is Tansu; overriding it in this folder moves every end-to-end test
(and the `start_proxy`, `proxy` and `shared_proxy` fixtures they use, which pytest resolves
from the test's folder) onto the session-scoped Kafka node of `kafka_broker`, PLAINTEXT
listener. A test that needs Tansu itself (because it injects data Kafka rightly refuses, or
it is the demo's default) asks for `tansu_broker` and says why.

`SLUICE_E2E_BROKER=tansu` runs the folder against Tansu instead, as before (to compare the
two brokers; the tests assert Kafka's behaviour where the two differ).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from tests.harness.broker import TansuBroker
from tests.harness.kafka_broker import KafkaCluster

# Fixtures that start (or are) Apache Kafka: a test using one gets the `kafka` marker, so
# `-m "not kafka"` still leaves out every test that needs Java.
_KAFKA_FIXTURES = frozenset({"broker", "kafka_broker", "kafka_cluster"})


@dataclass(frozen=True)
class KafkaEndpoint:
    """The part of TansuBroker's interface the end-to-end tests use, for one Kafka node."""

    cluster: KafkaCluster

    @property
    def bootstrap(self) -> str:
        return self.cluster.bootstrap

    @property
    def host(self) -> str:
        return self.bootstrap.split(",")[0].rsplit(":", 1)[0]

    @property
    def port(self) -> int:
        return int(self.bootstrap.split(",")[0].rsplit(":", 1)[1])


@pytest.fixture(scope="session")
def broker(request: pytest.FixtureRequest) -> KafkaEndpoint | TansuBroker:
    if os.environ.get("SLUICE_E2E_BROKER", "kafka") == "tansu":
        tansu: TansuBroker = request.getfixturevalue("tansu_broker")
        return tansu
    return KafkaEndpoint(request.getfixturevalue("kafka_broker"))


@pytest.fixture(scope="session")
def tansu_broker() -> Iterator[TansuBroker]:
    """Tansu, for the few tests that need its leniency (each says why)."""
    with TansuBroker() as b:
        yield b


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if _KAFKA_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.kafka)
