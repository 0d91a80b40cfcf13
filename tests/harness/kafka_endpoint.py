"""The session's Apache Kafka node behind the `broker` fixture of tests/e2e and tests/transforms.

Those folders' conftests override the root `broker` (Tansu) with `kafka_or_tansu`: a
`KafkaEndpoint` over the session-scoped `kafka_broker` node (PLAINTEXT listener) that offers
the part of TansuBroker's interface the tests use. `SLUICE_E2E_BROKER=tansu` gives Tansu back
(to compare the two brokers; the tests assert Kafka's behaviour where the two differ).
`mark_kafka_tests` gives every test that uses Kafka the `kafka` marker, so that
`-m "not kafka"` still leaves out everything that needs Java.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import pytest

from tests.harness.broker import TansuBroker
from tests.harness.kafka_broker import KafkaCluster

# Fixtures that start (or are) Apache Kafka.
_KAFKA_FIXTURES = frozenset({"broker", "kafka_broker", "kafka_cluster"})


@dataclass(frozen=True)
class KafkaEndpoint:
    """The part of TansuBroker's interface the tests use, for one Kafka node."""

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


def kafka_or_tansu(request: pytest.FixtureRequest) -> KafkaEndpoint | TansuBroker:
    if os.environ.get("SLUICE_E2E_BROKER", "kafka") == "tansu":
        tansu: TansuBroker = request.getfixturevalue("tansu_broker")
        return tansu
    return KafkaEndpoint(request.getfixturevalue("kafka_broker"))


def mark_kafka_tests(items: list[pytest.Item], folder: str) -> None:
    """Add the `kafka` marker to the tests under `folder` that use a Kafka fixture."""
    for item in items:
        if folder in str(item.path) and _KAFKA_FIXTURES & set(
            getattr(item, "fixturenames", ())
        ):
            item.add_marker(pytest.mark.kafka)
