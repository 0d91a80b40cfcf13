"""Apache Kafka for tests: the same launcher `sluice demo --broker kafka` uses."""

from __future__ import annotations

from sluice.kafka_broker import (
    CLIENT_LISTENERS,
    KAFKA39_VERSION,
    KAFKA_VERSION,
    KafkaCluster,
    KafkaNode,
    KafkaNotInstalled,
    KafkaStartError,
)
from sluice.kafka_security import ADMIN_USER, BROKER_USER, ORDINARY_USERS, PROXY_USER

__all__ = [
    "ADMIN_USER",
    "BROKER_USER",
    "CLIENT_LISTENERS",
    "KAFKA39_VERSION",
    "KAFKA_VERSION",
    "ORDINARY_USERS",
    "PROXY_USER",
    "KafkaCluster",
    "KafkaNode",
    "KafkaNotInstalled",
    "KafkaStartError",
]
