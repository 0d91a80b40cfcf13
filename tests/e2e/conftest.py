"""The end-to-end tests run against Apache Kafka: here `broker` is the session's one Kafka node.

The root conftest's `broker` is Tansu; overriding it in this folder moves every end-to-end test
(and the `start_proxy`, `proxy` and `shared_proxy` fixtures they use, which pytest resolves
from the test's folder) onto the session-scoped Kafka node of `kafka_broker`, PLAINTEXT
listener (tests/harness/kafka_endpoint.py). A test that needs Tansu itself (because it
injects data Kafka rightly refuses, or shows a fact of the demo's default broker) asks for
`tansu_broker` and says why.
"""

from __future__ import annotations

import pytest

from tests.harness.broker import TansuBroker
from tests.harness.kafka_endpoint import KafkaEndpoint, kafka_or_tansu, mark_kafka_tests
from tests.harness.kafka_tools import ClientProbe


@pytest.fixture(scope="session")
def broker(request: pytest.FixtureRequest) -> KafkaEndpoint | TansuBroker:
    return kafka_or_tansu(request)


@pytest.fixture(scope="session")
def probe(tmp_path_factory: pytest.TempPathFactory) -> ClientProbe:
    """The Java client (tests/java/ClientProbe.java), compiled once per session (per xdist
    worker) for every test that runs it."""
    return ClientProbe(tmp_path_factory.mktemp("java-probe")).compile()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    mark_kafka_tests(items, "/tests/e2e/")
