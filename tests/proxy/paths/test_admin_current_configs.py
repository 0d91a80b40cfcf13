"""The admin path's look-up of a topic's current config: only values set on the topic count.

Apache Kafka's DescribeConfigs lists every key of a topic, the broker's and built-in defaults
included (Tansu lists only the keys set on it); a default taken for a set value would keep a
topic-policy `defaults` entry from being added by the IncrementalAlterConfigs rewrite."""

from __future__ import annotations

import pytest

from sluice.codec import entities, schemas
from sluice.codec.messages import ApiKey
from sluice.proxy.paths.admin import _set_on_topic

# DescribeConfigs config_source values (Kafka's ConfigSource).
DYNAMIC_TOPIC, DYNAMIC_BROKER, DEFAULT_BROKER, STATIC_BROKER, DEFAULT = 1, 2, 3, 4, 5


def config_entry(version: int, **fields: object) -> object:
    cls = schemas.response_schema(ApiKey.DESCRIBE_CONFIGS, version)
    rcls = entities.element_class(cls, "results")
    return entities.build(entities.element_class(rcls, "configs"), name="retention.ms",
                          value="604800000", read_only=False, is_sensitive=False, **fields)


@pytest.mark.parametrize(("source", "set_on_topic"), [
    (DYNAMIC_TOPIC, True), (0, True),
    (DYNAMIC_BROKER, False), (DEFAULT_BROKER, False), (STATIC_BROKER, False), (DEFAULT, False),
])
def test_config_source_decides(source: int, set_on_topic: bool) -> None:
    entry = config_entry(4, config_source=source, synonyms=(), config_type=5,
                         documentation=None)
    assert _set_on_topic(entry) is set_on_topic
    entry = config_entry(1, config_source=source, synonyms=())  # the oldest the codec has
    assert _set_on_topic(entry) is set_on_topic

