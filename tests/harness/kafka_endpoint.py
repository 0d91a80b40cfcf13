"""The session's Apache Kafka node behind the `broker` fixture of tests/e2e and tests/transforms.

Those folders' conftests override the root `broker` (Tansu) with `kafka_or_tansu`: a
`KafkaEndpoint` over the session-scoped `kafka_broker` node (PLAINTEXT listener) that offers
the part of TansuBroker's interface the tests use. `SLUICE_E2E_BROKER=tansu` gives Tansu back
(to compare the two brokers; the tests assert Kafka's behaviour where the two differ);
`SLUICE_E2E_BROKER=kafka39` makes the session's Kafka node a 3.9 one (the smoke run,
tests/harness/kafka39_smoke.py).
`mark_kafka_tests` gives every test that uses Kafka the `kafka` marker, so that
`-m "not kafka"` still leaves out everything that needs Java.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import pytest

from tests.harness.broker import TansuBroker
from tests.harness.kafka_broker import KAFKA39_VERSION, KAFKA_VERSION, KafkaCluster

# Fixtures that start (or are) Apache Kafka.
_KAFKA_FIXTURES = frozenset({"broker", "kafka_broker", "kafka_cluster", "kafka39_broker"})
# SLUICE_E2E_BROKER's values: the Kafka version of the session's node, or Tansu.
E2E_BROKERS = {"kafka": KAFKA_VERSION, "kafka39": KAFKA39_VERSION, "tansu": None}


def e2e_broker() -> str:
    """SLUICE_E2E_BROKER (default `kafka`), checked: a typo must not run the suite elsewhere."""
    name = os.environ.get("SLUICE_E2E_BROKER", "kafka")
    if name not in E2E_BROKERS:
        raise pytest.UsageError(
            f"SLUICE_E2E_BROKER={name!r}: one of {', '.join(E2E_BROKERS)}"
        )
    return name


def session_kafka_version() -> str:
    """The Kafka version of the session's node: 3.9 with SLUICE_E2E_BROKER=kafka39, else 4.4."""
    return KAFKA39_VERSION if e2e_broker() == "kafka39" else KAFKA_VERSION


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
    if e2e_broker() == "tansu":
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
