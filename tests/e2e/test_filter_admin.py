"""Per-item admin policy through the proxy with builtin:topic-policy, against Apache Kafka.

A denied item answers POLICY_VIOLATION with the rule in the message while the other items of
the same request reach the broker; IncrementalAlterConfigs is judged on the resulting config
(the proxy reads the current one with DescribeConfigs); a rewrite (defaults, capped
partitions) is what the broker creates. CreatePartitions and legacy AlterConfigs are sent as
raw requests: denied items are answered by the proxy, allowed ones reach Kafka (Tansu has
neither API, so before the move to Kafka only the denials could be tested).
"""

from __future__ import annotations

import datetime
import struct
import time
from collections.abc import Iterator
from typing import Any

import pytest
import yaml
from confluent_kafka import KafkaException
from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    NewTopic,
)

from sluice.codec import entities, schemas
from sluice.codec.headers import request_header_bytes, response_header_size
from sluice.codec.messages import ApiKey, decode_response, encode_request
from tests.e2e.clients import QUIET, unique, wait_for_leaders
from tests.harness.broker import TansuBroker
from tests.harness.proxy import SluiceProxy
from tests.harness.session_builds import session_module_cache
from tests.harness.validating_relay import exchange

POLICY_VIOLATION = 44
HOUR_MS = 3_600_000
POLICY = {
    "name_pattern": "^pol-[a-z0-9-]+$",
    "partitions": {"min": 1, "max": 4},
    "retention_ms": {"min": HOUR_MS, "max": 7 * 24 * HOUR_MS},
    "required_configs": ["retention.ms"],
}
REWRITE = {
    "partitions": {"min": 1, "max": 3},
    "cap_partitions": True,
    "defaults": {"retention.ms": str(24 * HOUR_MS)},
}


@pytest.fixture(scope="module")
def proxy(broker: TansuBroker, tmp_path_factory: pytest.TempPathFactory) -> Iterator[SluiceProxy]:
    def policy(name: str, topics: str, config: dict[str, Any]) -> dict[str, Any]:
        return {
            "name": name,
            "module": "builtin:topic-policy",
            "topics": [topics],
            "apply_to": ["admin"],
            "config": config,
        }

    config = {
        "module_cache_dir": str(session_module_cache(tmp_path_factory)),
        "filters": [
            policy("topic-rules", "pol-*", POLICY),
            policy("topic-shaper", "rw-*", REWRITE),
        ],
    }
    path = tmp_path_factory.mktemp("admin") / "sluice.yaml"
    path.write_text(yaml.safe_dump(config))
    with SluiceProxy(upstream=broker.bootstrap, config=path) as p:
        yield p


def admin(bootstrap: str) -> AdminClient:
    return AdminClient({"bootstrap.servers": bootstrap, **QUIET})


def partitions_on_broker(broker: TansuBroker, topic: str) -> int | None:
    topics = admin(broker.bootstrap).list_topics(timeout=10).topics
    return len(topics[topic].partitions) if topic in topics else None


def configs_on_broker(
    broker: TansuBroker, topic: str, expect: dict[str, str] | None = None
) -> dict[str, str | None]:
    """The topic's configs on the broker; with `expect`, read again (up to 5 s) until they
    show those values: Kafka applies a change through its metadata log, so a read right
    after the change may show the old value for a moment."""
    deadline = time.monotonic() + 5
    while True:
        client = admin(broker.bootstrap)  # must outlive its futures
        (future,) = client.describe_configs([ConfigResource("topic", topic)]).values()
        found = {name: entry.value for name, entry in future.result(10).items()}
        if not expect or all(found.get(k) == v for k, v in expect.items()):
            return found
        if time.monotonic() > deadline:
            return found
        time.sleep(0.05)


def retention_on_broker(broker: TansuBroker, topic: str, want: str) -> str | None:
    """retention.ms on the broker, once it shows `want` (or after 5 s)."""
    return configs_on_broker(broker, topic, {"retention.ms": want})["retention.ms"]


def create(bootstrap: str, *topics: NewTopic) -> dict[str, KafkaException | None]:
    """Create `topics` in one CreateTopics request: the error (or None) per topic."""
    out: dict[str, KafkaException | None] = {}
    client = admin(bootstrap)  # must outlive its futures
    for name, future in client.create_topics(list(topics)).items():
        try:
            future.result(15)
            out[name] = None
        except KafkaException as exc:
            out[name] = exc
    return out


def policy_violation(exc: KafkaException | None) -> str:
    assert exc is not None, "expected a POLICY_VIOLATION"
    err = exc.args[0]
    assert err.code() == POLICY_VIOLATION, err
    return str(err.str())


def raw_admin(address: str, api_key: int, version: int, **fields: Any) -> Any:
    cls = schemas.request_schema(api_key, version)
    body = request_header_bytes(api_key, version, 7, "raw-admin")
    body += encode_request(entities.build(cls, **fields))
    (raw,) = exchange(address, [struct.pack(">i", len(body)) + body])
    return decode_response(api_key, version, raw[response_header_size(raw, api_key, version) :])


def test_create_topics_denies_one_item_and_creates_the_other(
    broker: TansuBroker, proxy: SluiceProxy
) -> None:
    good, too_big = unique("pol-ok"), unique("pol-big")
    results = create(
        proxy.bootstrap,
        NewTopic(good, 2, 1, config={"retention.ms": str(2 * HOUR_MS)}),
        NewTopic(too_big, 9, 1, config={"retention.ms": str(2 * HOUR_MS)}),
    )
    assert results[good] is None
    message = policy_violation(results[too_big])
    assert "partitions.max: 9 requested, at most 4 allowed" in message
    assert partitions_on_broker(broker, good) == 2
    assert partitions_on_broker(broker, too_big) is None


def test_create_topics_names_every_broken_rule(broker: TansuBroker, proxy: SluiceProxy) -> None:
    bad = unique("pol-Upper")
    message = policy_violation(create(proxy.bootstrap, NewTopic(bad, 1, 1))[bad])
    assert "name_pattern" in message and "required_configs: 'retention.ms'" in message
    assert partitions_on_broker(broker, bad) is None
    # Topics no admin filter is bound to are not judged.
    free = unique("free")
    assert create(proxy.bootstrap, NewTopic(free, 7, 1))[free] is None
    assert partitions_on_broker(broker, free) == 7


def test_create_partitions_beyond_max_is_denied(proxy: SluiceProxy) -> None:
    topic = unique("pol-grow")
    assert create(proxy.bootstrap, NewTopic(topic, 2, 1, config={"retention.ms": str(HOUR_MS)}))[
        topic
    ] is None
    version = 1
    cls = schemas.request_schema(ApiKey.CREATE_PARTITIONS, version)
    tcls = entities.element_class(cls, "topics")
    response = raw_admin(
        proxy.bootstrap,
        ApiKey.CREATE_PARTITIONS,
        version,
        topics=(entities.build(tcls, name=topic, count=12, assignments=None),),
        timeout=datetime.timedelta(seconds=10),
        validate_only=False,
    )
    (result,) = response.results
    assert result.name == topic
    assert int(result.error_code) == POLICY_VIOLATION
    assert "partitions.max: 12 requested, at most 4 allowed" in (result.error_message or "")


def test_create_partitions_within_max_reaches_the_broker(
    broker: TansuBroker, proxy: SluiceProxy
) -> None:
    topic = unique("pol-grow-ok")
    assert create(proxy.bootstrap, NewTopic(topic, 2, 1, config={"retention.ms": str(HOUR_MS)}))[
        topic
    ] is None
    cls = schemas.request_schema(ApiKey.CREATE_PARTITIONS, 1)
    tcls = entities.element_class(cls, "topics")
    response = raw_admin(
        proxy.bootstrap, ApiKey.CREATE_PARTITIONS, 1,
        topics=(entities.build(tcls, name=topic, count=4, assignments=None),),
        timeout=datetime.timedelta(seconds=10), validate_only=False,
    )
    (result,) = response.results
    assert int(result.error_code) == 0, result.error_message
    wait_for_leaders(broker.bootstrap, topic, 4)
    assert partitions_on_broker(broker, topic) == 4


def legacy_alter(address: str, topic: str, retention_ms: str) -> Any:
    cls = schemas.request_schema(ApiKey.ALTER_CONFIGS, 1)
    rcls = entities.element_class(cls, "resources")
    ccls = entities.element_class(rcls, "configs")
    return raw_admin(
        address, ApiKey.ALTER_CONFIGS, 1,
        resources=(entities.build(rcls, resource_type=2, resource_name=topic, configs=(
            entities.build(ccls, name="retention.ms", value=retention_ms),)),),
        validate_only=False,
    )


def test_legacy_alter_configs_within_bounds_reaches_the_broker(
    broker: TansuBroker, proxy: SluiceProxy
) -> None:
    topic = unique("pol-legacy-ok")
    assert create(proxy.bootstrap, NewTopic(topic, 1, 1, config={"retention.ms": str(HOUR_MS)}))[
        topic
    ] is None
    (result,) = legacy_alter(proxy.bootstrap, topic, str(2 * HOUR_MS)).responses
    assert int(result.error_code) == 0, result.error_message
    expect = {"retention.ms": str(2 * HOUR_MS)}
    assert configs_on_broker(broker, topic, expect)["retention.ms"] == str(2 * HOUR_MS)


def test_legacy_alter_configs_out_of_bounds_is_denied(proxy: SluiceProxy) -> None:
    topic = unique("pol-legacy")
    version = 1
    cls = schemas.request_schema(ApiKey.ALTER_CONFIGS, version)
    rcls = entities.element_class(cls, "resources")
    ccls = entities.element_class(rcls, "configs")
    response = raw_admin(
        proxy.bootstrap,
        ApiKey.ALTER_CONFIGS,
        version,
        resources=(
            entities.build(
                rcls,
                resource_type=2,
                resource_name=topic,
                configs=(entities.build(ccls, name="retention.ms", value="5"),),
            ),
        ),
        validate_only=False,
    )
    (result,) = response.responses
    assert result.resource_name == topic
    assert int(result.error_code) == POLICY_VIOLATION
    assert "retention_ms.min: retention.ms=5" in (result.error_message or "")


def test_incremental_alter_configs_judges_each_resource(
    broker: TansuBroker, proxy: SluiceProxy
) -> None:
    low, fine = unique("pol-low"), unique("pol-fine")
    for topic in (low, fine):
        assert create(
            proxy.bootstrap, NewTopic(topic, 1, 1, config={"retention.ms": str(2 * HOUR_MS)})
        )[topic] is None

    def set_retention(topic: str, value: str) -> ConfigResource:
        return ConfigResource(
            "topic",
            topic,
            incremental_configs=[
                ConfigEntry("retention.ms", value, incremental_operation=AlterConfigOpType.SET)
            ],
        )

    client = admin(proxy.bootstrap)
    futures = client.incremental_alter_configs(
        [set_retention(low, "1000"), set_retention(fine, str(5 * HOUR_MS))]
    )
    outcome: dict[str, KafkaException | None] = {}
    for resource, future in futures.items():
        try:
            future.result(15)
            outcome[resource.name] = None
        except KafkaException as exc:
            outcome[resource.name] = exc
    message = policy_violation(outcome[low])
    assert "retention_ms.min: retention.ms=1000, at least 3600000 required" in message
    assert outcome[fine] is None
    assert retention_on_broker(broker, low, str(2 * HOUR_MS)) == str(2 * HOUR_MS)
    assert retention_on_broker(broker, fine, str(5 * HOUR_MS)) == str(5 * HOUR_MS)


def test_incremental_alter_configs_is_judged_on_the_resulting_config(
    broker: TansuBroker, proxy: SluiceProxy
) -> None:
    topic = unique("pol-keep")
    config = {"retention.ms": str(2 * HOUR_MS), "cleanup.policy": "delete"}
    assert create(proxy.bootstrap, NewTopic(topic, 1, 1, config=config))[topic] is None
    client = admin(proxy.bootstrap)

    def alter(*entries: ConfigEntry) -> KafkaException | None:
        (future,) = client.incremental_alter_configs(
            [ConfigResource("topic", topic, incremental_configs=list(entries))]
        ).values()
        try:
            future.result(15)
        except KafkaException as exc:
            return exc
        return None

    # The request names only cleanup.policy; the resulting config still has retention.ms: ok.
    assert alter(ConfigEntry("cleanup.policy", "compact",
                             incremental_operation=AlterConfigOpType.SET)) is None
    # Deleting retention.ms carries no value to check: only the resulting config breaks a rule.
    message = policy_violation(
        alter(ConfigEntry("retention.ms", None, incremental_operation=AlterConfigOpType.DELETE))
    )
    assert "required_configs: 'retention.ms' must be set" in message
    stored = configs_on_broker(
        broker, topic, {"retention.ms": str(2 * HOUR_MS), "cleanup.policy": "compact"})
    assert stored["retention.ms"] == str(2 * HOUR_MS)
    assert stored["cleanup.policy"] == "compact"


def test_rewrite_caps_partitions_and_sets_defaults_on_the_broker(
    broker: TansuBroker, proxy: SluiceProxy
) -> None:
    wide, explicit = unique("rw-wide"), unique("rw-explicit")
    results = create(
        proxy.bootstrap,
        NewTopic(wide, 10, 1),
        NewTopic(explicit, 2, 1, config={"retention.ms": str(HOUR_MS)}),
    )
    assert results == {wide: None, explicit: None}
    assert partitions_on_broker(broker, wide) == 3
    assert retention_on_broker(broker, wide, str(24 * HOUR_MS)) == str(24 * HOUR_MS)
    assert partitions_on_broker(broker, explicit) == 2
    assert retention_on_broker(broker, explicit, str(HOUR_MS)) == str(HOUR_MS)


def test_rewrite_of_incremental_alter_sets_the_defaults_too(
    broker: TansuBroker, proxy: SluiceProxy
) -> None:
    topic = unique("rw-late")
    # Created behind the proxy's back: no retention.ms yet.
    assert create(broker.bootstrap, NewTopic(topic, 1, 1, config={"segment.ms": "600000"}))[
        topic
    ] is None
    client = admin(proxy.bootstrap)
    resource = ConfigResource(
        "topic",
        topic,
        incremental_configs=[
            ConfigEntry("cleanup.policy", "compact", incremental_operation=AlterConfigOpType.SET)
        ],
    )
    (future,) = client.incremental_alter_configs([resource]).values()
    future.result(15)
    stored = configs_on_broker(broker, topic, {"cleanup.policy": "compact"})
    assert stored["cleanup.policy"] == "compact"
    assert stored["retention.ms"] == str(24 * HOUR_MS)  # added by the rewrite
    assert stored["segment.ms"] == "600000"  # untouched
