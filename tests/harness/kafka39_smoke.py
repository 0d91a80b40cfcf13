"""The Kafka 3.9 smoke run: which tests run against Apache Kafka 3.9, and how they are chosen.

`SLUICE_E2E_BROKER=kafka39` makes the session's Kafka node (`kafka_broker`, and so the e2e
`broker`) a 3.9.2 node instead of 4.4.0. The whole suite is not meant for it (a few tests
assert what Kafka 4 does and 3.9 does not: KIP-896's closed connections, KIP-848 and KIP-932
on by default); `SMOKE` is the representative subset CI runs against 3.9, marked
`kafka39_smoke` at collection (tests/conftest.py):

    SLUICE_E2E_BROKER=kafka39 .venv/bin/python -m pytest -m kafka39_smoke \\
        $(.venv/bin/python -m tests.harness.kafka39_smoke)

Each entry is a node id or the start of one (every parameter of a parametrized test).
"""

from __future__ import annotations

import os

SMOKE = (
    # the client matrix: librdkafka (every codec, idempotent and not), kafka-python, aiokafka,
    # kcat, admin calls compared with direct ones
    "tests/e2e/test_clients_passthrough.py::test_confluent_produce_consume",
    "tests/e2e/test_clients_passthrough.py::test_kafka_python_produce_consume_group",
    "tests/e2e/test_clients_passthrough.py::test_aiokafka_produce_consume_group",
    "tests/e2e/test_clients_passthrough.py::test_kcat_metadata_produce_consume",
    "tests/e2e/test_clients_passthrough.py::test_admin_calls_match_direct",
    # the Java client (4.4) through the proxy, and a filter chain on produce and on fetch
    "tests/e2e/test_java_client.py::test_idempotent_producer_through_the_proxy",
    "tests/e2e/test_java_client.py::test_consumer_group_protocols_through_the_proxy[classic",
    "tests/e2e/test_java_client.py::test_transactional_producer_commit_and_abort",
    "tests/e2e/test_java_client.py::test_produce_filter_masks_what_java_producers_store",
    "tests/e2e/test_java_client.py::test_fetch_filter_masks_what_the_java_consumer_reads",
    # record encryption on the SASL listener with ACLs (every codec), a transactional producer
    "tests/e2e/test_encryption.py::test_confluent_idempotent_all_codecs",
    "tests/e2e/test_encryption.py::test_whole_values_with_aiokafka",
    "tests/e2e/test_encryption.py::test_transactional_producer",
    # a data policy bound with Kafka's own kafka-configs (4.4's tool against the 3.9 broker)
    "tests/e2e/test_kafka_tools.py::test_kafka_configs_binds_a_data_policy",
    # a transform: records, partitions and telemetry
    "tests/transforms/test_transform_records.py::test_records_partitions_and_telemetry",
)

MARKER = "kafka39_smoke"


def selected(nodeid: str) -> bool:
    return any(nodeid == entry or nodeid.startswith(entry) for entry in SMOKE)


def files() -> list[str]:
    """The test files the smoke run collects (fewer than the whole suite: faster)."""
    return sorted({entry.split("::", 1)[0] for entry in SMOKE})


def wanted() -> bool:
    """True when this run's Kafka is 3.9 (`SLUICE_E2E_BROKER=kafka39`)."""
    return os.environ.get("SLUICE_E2E_BROKER", "kafka") == "kafka39"


if __name__ == "__main__":
    print(" ".join(files()))
