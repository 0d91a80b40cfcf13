"""Fixtures shared by the proxy tests: an Apache Kafka node of their own whose listeners are
announced at counting TCP relays (test_upstream_dialer.py, test_dead_letters.py: they count
the connections the proxy's own client opens)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.harness.kafka_relay import RelayedKafka


@pytest.fixture(scope="session")
def relayed_kafka() -> Iterator[RelayedKafka]:
    """One Kafka node (not the session's shared one: its announced addresses are the relays')
    with PLAIN, SCRAM-SHA-256/512, mTLS and ACLs, every client listener behind a relay."""
    with RelayedKafka() as kafka:
        yield kafka
