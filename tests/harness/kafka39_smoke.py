"""The Kafka 3.9 smoke run: which tests run against Apache Kafka 3.9, and how they are chosen.

`SLUICE_E2E_BROKER=kafka39` makes the session's Kafka node (`kafka_broker`, and so the e2e
`broker`) a 3.9.2 node instead of 4.4.0. The whole suite is not meant for it (a few tests
assert what Kafka 4 does and 3.9 does not: KIP-896's closed connections, KIP-848 and KIP-932
on by default); `SMOKE` is the representative subset CI runs against 3.9, marked
`kafka39_smoke` at collection (tests/conftest.py), after the other passes of
`scripts/dev.sh test`:

    SLUICE_E2E_BROKER=kafka39 .venv/bin/python -m pytest -m kafka39_smoke \\
        $(.venv/bin/python -m tests.harness.kafka39_smoke)

Each entry is a node id or the start of one (every parameter of a parametrized test).
"""

from __future__ import annotations

import os

SMOKE = (
    # the client matrix: librdkafka (every codec; idempotent and not), kafka-python, aiokafka,
    # kcat, admin calls compared with direct ones
    "tests/e2e/test_clients_passthrough.py::test_confluent_produce_consume[none-plain]",
    "tests/e2e/test_clients_passthrough.py::test_confluent_produce_consume[gzip-idempotent]",
    "tests/e2e/test_clients_passthrough.py::test_confluent_produce_consume[snappy-plain]",
    "tests/e2e/test_clients_passthrough.py::test_confluent_produce_consume[lz4-idempotent]",
    "tests/e2e/test_clients_passthrough.py::test_confluent_produce_consume[zstd-idempotent]",
    "tests/e2e/test_clients_passthrough.py::test_kafka_python_produce_consume_group",
    "tests/e2e/test_clients_passthrough.py::test_aiokafka_produce_consume_group",
    "tests/e2e/test_clients_passthrough.py::test_kcat_metadata_produce_consume",
    "tests/e2e/test_clients_passthrough.py::test_admin_calls_match_direct",
    # the Java client (4.4) through the proxy, and a filter chain on produce and on fetch
    "tests/e2e/test_java_client.py::test_idempotent_producer_through_the_proxy",
    "tests/e2e/test_java_client.py::test_consumer_group_protocols_through_the_proxy[classic",
    "tests/e2e/test_java_client.py::test_transactional_producer_commit_and_abort",
    "tests/e2e/test_java_client.py::test_produce_filter_masks_what_java_producers_store",
    # (the Java fetch-filter test reads with KIP-848's `consumer` protocol, which 3.9 does not
    # serve by default: a filter chain on fetch is shown by franz-go and the console tools)
    "tests/e2e/test_go_client.py::test_franz_go_produces_and_consumes_through_the_proxy",
    "tests/e2e/test_go_client.py::test_franz_go_records_pass_the_filters",
    "tests/e2e/test_kafka_tools.py::test_console_tools_through_filters",
    # record encryption on the SASL listener with ACLs (every codec), a transactional producer
    "tests/e2e/test_encryption.py::test_confluent_idempotent_all_codecs[zstd]",
    "tests/e2e/test_encryption.py::test_whole_values_with_aiokafka",
    "tests/e2e/test_encryption.py::test_transactional_producer",
    # data policies set through the Kafka admin clients, a fleet of two proxies (kafka-configs
    # binding one, tests/e2e/test_kafka_tools.py, costs 25 s of JVM starts: left to 4.4)
    "tests/e2e/test_policies.py::test_policies_through_kafka_admin_clients",
    # a transform: records, partitions and telemetry
    "tests/transforms/test_transform_records.py::test_records_partitions_and_telemetry",
    # the harness: the version that runs, every listener (PLAINTEXT, SASL PLAIN and
    # SCRAM-SHA-512, mTLS, SASL_SSL), ACL denials, a wrong password, the proxy in front
    "tests/e2e/test_kafka_broker.py::test_the_pinned_kafka_version_is_what_runs",
    "tests/e2e/test_kafka_broker.py::test_produce_and_consume_on_every_listener",
    "tests/e2e/test_kafka_broker.py::test_an_acl_denial_reaches_the_client",
    "tests/e2e/test_kafka_broker.py::test_a_wrong_password_is_an_authentication_error",
    "tests/e2e/test_kafka_broker.py::test_without_a_client_certificate_the_ssl_listener",
    "tests/e2e/test_kafka_broker.py::test_the_sluice_proxy_in_front_of_kafka_passes_records",
    # SASL pass-through to Kafka's own users: per-principal filters, its ACL denial and its
    # authentication error through the proxy
    "tests/proxy/test_sasl.py::test_filters_bind_per_principal",
    "tests/proxy/test_sasl.py::test_an_acl_denial_reaches_the_client_through_the_proxy",
    "tests/proxy/test_sasl.py::test_wrong_password_sets_no_principal",
    # the files of the tests that need a 3.9 node whatever the session's Kafka is (fixture
    # `kafka39_broker`, marker `kafka39`): old clients that skip ApiVersions
    "tests/e2e/test_old_clients.py",
    "tests/e2e/test_old_go_clients.py",
)

MARKER = "kafka39_smoke"
# Tests that use `kafka39_broker`: `scripts/dev.sh test` runs them in the smoke pass only,
# where that fixture is the session's node (one 3.9 start instead of one per worker).
NEEDS_39 = "kafka39"


def selected_by(entry: str, nodeid: str) -> bool:
    return nodeid == entry or nodeid.startswith(entry)


def selected(nodeid: str) -> bool:
    return any(selected_by(entry, nodeid) for entry in SMOKE)


def files() -> list[str]:
    """The test files the smoke run collects (fewer than the whole suite: faster)."""
    return sorted({entry.split("::", 1)[0] for entry in SMOKE})


def wanted() -> bool:
    """True when this run's Kafka is 3.9 (`SLUICE_E2E_BROKER=kafka39`)."""
    return os.environ.get("SLUICE_E2E_BROKER", "kafka") == "kafka39"


if __name__ == "__main__":
    print(" ".join(files()))
