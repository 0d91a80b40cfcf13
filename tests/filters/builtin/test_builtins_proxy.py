"""The shipped filters end to end: real clients through `sluice serve` in front of Tansu.

pii-mask on produce (the broker stores masked records), rules mutating and dropping records on
produce, json-validate rejecting a bad record
(the producer gets the reason), and topic-policy denying, allowing and rewriting CreateTopics
items (POLICY_VIOLATION for the denied item only).
"""

from __future__ import annotations

import hashlib
import json
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, ConfigResource, NewTopic

from tests.harness.broker import TansuBroker
from tests.harness.kafka_admin import create_topics
from tests.harness.proxy import SluiceProxy

QUIET = {"log_level": 3}


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def write_config(tmp_path: Path, filters: list[dict[str, Any]]) -> Path:
    path = tmp_path / "sluice.yaml"
    path.write_text(json.dumps({"filters": filters}))  # JSON is YAML
    return path


def produce(bootstrap: str, topic: str, values: list[bytes]) -> list[str | None]:
    """Produce one record at a time; the delivery error (or None) of each."""
    # Retries on: a loaded machine can answer a first send with a retriable error (a leader
    # not known yet); a filter's INVALID_RECORD is not retried, so each record still gets its
    # own verdict.
    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 0, "retries": 5,
                  "retry.backoff.ms": 200, **QUIET})
    errors: list[str | None] = []
    for v in values:
        result: list[str | None] = []

        def delivered(err: Any, _msg: Any, r: list[str | None] = result) -> None:
            r.append(None if err is None else f"{err.name()}: {err.str()}")

        p.produce(topic, v, on_delivery=delivered)
        assert p.flush(30) == 0
        errors.append(result[0])
    return errors


def consume(bootstrap: str, topic: str, want: int) -> list[bytes]:
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": unique("g"), **QUIET})
    c.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])
    got: list[bytes] = []
    deadline = time.monotonic() + 30
    while len(got) < want and time.monotonic() < deadline:
        m = c.poll(0.5)
        value = m.value() if m is not None and m.error() is None else None
        if value is not None:
            got.append(value)
    c.close()
    return got




def test_pii_mask_on_produce_stores_masked(tmp_path: Path, broker: TansuBroker,
                                           start_proxy: Callable[..., SluiceProxy]) -> None:
    topic = unique("payments")
    cfg = write_config(tmp_path, [{"name": "mask", "module": "builtin:pii-mask",
                                   "topics": ["payments-*"], "apply_to": ["produce"],
                                   "config": {"fields": ["user.name"],
                                              "detectors": {"card": {"keep_last": 4}}}}])
    proxy = start_proxy(config=cfg)
    assert create_topics(broker.bootstrap, [NewTopic(topic, 1, 1)]) == {topic: None}
    doc = {"user": {"name": "Ann Lee", "email": "ann@example.com"},
           "card": "4111 1111 1111 1111", "amount": 12.5}
    assert produce(proxy.bootstrap, topic, [json.dumps(doc).encode(), b"no pii"]) == [None, None]
    stored = consume(broker.bootstrap, topic, 2)
    assert json.loads(stored[0]) == {"user": {"name": "*** ***", "email": "***@*******.***"},
                                     "card": "**** **** **** 1111", "amount": 12.5}
    assert stored[1] == b"no pii"


def test_rules_mutate_and_drop_on_produce(tmp_path: Path, broker: TansuBroker,
                                          start_proxy: Callable[..., SluiceProxy]) -> None:
    topic = unique("signups")
    rules = [{"field": "password", "action": "remove"},
             {"field": "email", "action": "hash", "salt": "pepper"},
             {"field": "bio", "action": "truncate", "length": 4},
             {"field": "env", "action": "drop", "when": {"equals": "test"}}]
    cfg = write_config(tmp_path, [{"name": "rules", "module": "builtin:rules",
                                   "topics": ["signups-*"], "apply_to": ["produce"],
                                   "config": {"rules": rules}}])
    proxy = start_proxy(config=cfg)
    assert create_topics(broker.bootstrap, [NewTopic(topic, 1, 1)]) == {topic: None}
    docs = [{"email": "ann@example.com", "password": "hunter2", "bio": "long story"},
            {"env": "test", "email": "x@y.z"}, {"env": "prod"}]
    errors = produce(proxy.bootstrap, topic, [json.dumps(d).encode() for d in docs])
    assert errors == [None, None, None]
    stored = [json.loads(v) for v in consume(broker.bootstrap, topic, 2)]
    digest = hashlib.sha256(b"pepperann@example.com").hexdigest()
    assert stored == [{"email": digest, "bio": "long"}, {"env": "prod"}]


def test_json_validate_rejects_with_reason(tmp_path: Path, broker: TansuBroker,
                                           start_proxy: Callable[..., SluiceProxy]) -> None:
    topic = unique("events")
    cfg = write_config(tmp_path, [{"name": "validate", "module": "builtin:json-validate",
                                   "topics": ["events-*"], "apply_to": ["produce"],
                                   "config": {"required_fields": ["user_id"]}}])
    proxy = start_proxy(config=cfg)
    assert create_topics(broker.bootstrap, [NewTopic(topic, 1, 1)]) == {topic: None}
    errors = produce(proxy.bootstrap, topic, [b'{"user_id": 1}', b'{"event": "x"}', b"{bad"])
    assert errors[0] is None
    assert errors[1] is not None and errors[1].startswith("INVALID_RECORD")
    assert errors[2] is not None and errors[2].startswith("INVALID_RECORD")
    assert consume(broker.bootstrap, topic, 1) == [b'{"user_id": 1}']


@pytest.fixture
def policy_proxy(tmp_path: Path, start_proxy: Callable[..., SluiceProxy]) -> SluiceProxy:
    cfg = write_config(tmp_path, [{
        "name": "policy", "module": "builtin:topic-policy", "topics": ["*"],
        "apply_to": ["admin"],
        "config": {"name_pattern": "^[a-z0-9._-]+$", "partitions": {"min": 1, "max": 4},
                   "required_configs": ["retention.ms"],
                   "retention_ms": {"min": 3600000, "max": 604800000},
                   "defaults": {"retention.ms": "86400000"}, "cap_partitions": True}}])
    return start_proxy(config=cfg)


def test_topic_policy_denies_per_item(policy_proxy: SluiceProxy, broker: TansuBroker) -> None:
    good, bad = unique("good.topic"), unique("Bad_Topic")
    short = unique("short")
    result = create_topics(policy_proxy.bootstrap, [
        NewTopic(good, 2, 1, config={"retention.ms": "7200000"}),
        NewTopic(bad, 1, 1),
        NewTopic(short, 1, 1, config={"retention.ms": "1000"}),
    ])
    assert result[good] is None
    denied, too_short = result[bad] or "", result[short] or ""
    assert denied.startswith("POLICY_VIOLATION")
    assert "name_pattern" in denied and bad in denied
    assert "retention_ms.min" in too_short
    md = AdminClient({"bootstrap.servers": broker.bootstrap, **QUIET}).list_topics(timeout=10)
    assert good in md.topics and bad not in md.topics and short not in md.topics


def test_topic_policy_rewrites(policy_proxy: SluiceProxy, broker: TansuBroker) -> None:
    name = unique("capped")
    assert create_topics(policy_proxy.bootstrap, [NewTopic(name, 50, 1)]) == {name: None}
    admin = AdminClient({"bootstrap.servers": broker.bootstrap, **QUIET})
    md = admin.list_topics(timeout=10)
    assert len(md.topics[name].partitions) == 4  # capped by the policy
    res = ConfigResource(ConfigResource.Type.TOPIC, name)
    configs = admin.describe_configs([res])[res].result(15)
    assert configs["retention.ms"].value == "86400000"  # the policy's default


def stored_records(bootstrap: str, topic: str, want: int) -> list[Any]:
    """The records of partition 0 read straight from the broker (not through the proxy)."""
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": unique("g"), **QUIET})
    c.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])
    got: list[Any] = []
    deadline = time.monotonic() + 30
    while len(got) < want and time.monotonic() < deadline:
        m = c.poll(0.5)
        if m is not None and m.error() is None:
            got.append(m)
    c.close()
    return got


@pytest.mark.parametrize("keys", [None, False])
def test_pii_mask_defaults_mask_key_value_and_headers(
        tmp_path: Path, broker: TansuBroker, start_proxy: Callable[..., SluiceProxy],
        keys: bool | None) -> None:
    # "Stored records are masked": with the default config the key and the header values are
    # masked too (before, only the value was); `keys: false` leaves the key as sent.
    topic = unique("people")
    config: dict[str, Any] = {} if keys is None else {"keys": keys}
    cfg = write_config(tmp_path, [{"name": "mask", "module": "builtin:pii-mask",
                                   "topics": ["people-*"], "apply_to": ["produce"],
                                   "config": config}])
    proxy = start_proxy(config=cfg)
    assert create_topics(broker.bootstrap, [NewTopic(topic, 1, 1)]) == {topic: None}
    p = Producer({"bootstrap.servers": proxy.bootstrap, "linger.ms": 0, "retries": 0, **QUIET})
    errors: list[Any] = []
    p.produce(topic, key=b"ann@example.com", value=b'{"card": "4111_1111_1111_1111"}',
              headers=[("x-user", b"ann@example.com"), ("x-phone", b"+44 20 7946 0958"),
                       ("trace", b"abc-1")],
              on_delivery=lambda err, _m: errors.append(err))
    assert p.flush(30) == 0 and errors == [None]
    (m,) = stored_records(broker.bootstrap, topic, 1)
    assert json.loads(m.value()) == {"card": "****_****_****_****"}
    assert m.key() == (b"ann@example.com" if keys is False else b"***@*******.***")
    assert m.headers() == [("x-user", b"***@*******.***"), ("x-phone", b"+** ** **** ****"),
                           ("trace", b"abc-1")]


def _wide(text: str) -> str:
    """`text` with its ASCII digits and punctuation in their full-width forms (U+FF01-FF5E),
    as East Asian input methods type them; spaces stay ASCII."""
    return "".join(chr(ord(ch) + 0xFEE0) if "!" <= ch <= "~" else ch for ch in text)


def test_pii_mask_defaults_mask_underscore_and_full_width_cards_everywhere(
        tmp_path: Path, broker: TansuBroker, start_proxy: Callable[..., SluiceProxy]) -> None:
    # Card numbers as people also type them: underscores, full-width digits (in the value, the
    # key and a header). Before, both passed the default pii-mask in clear.
    topic = unique("people")
    cfg = write_config(tmp_path, [{"name": "mask", "module": "builtin:pii-mask",
                                   "topics": ["people-*"], "apply_to": ["produce"]}])
    proxy = start_proxy(config=cfg)
    assert create_topics(broker.bootstrap, [NewTopic(topic, 1, 1)]) == {topic: None}
    card = _wide("4111 1111 1111 1111").encode()
    value = json.dumps({"a": "5500_0000_0000_0004", "b": _wide("4111-1111-1111-1111")},
                       ensure_ascii=False).encode()
    p = Producer({"bootstrap.servers": proxy.bootstrap, "linger.ms": 0, "retries": 0, **QUIET})
    errors: list[Any] = []
    p.produce(topic, key=b"card " + card, value=value, headers=[("x-card", card)],
              on_delivery=lambda err, _m: errors.append(err))
    assert p.flush(30) == 0 and errors == [None]
    (m,) = stored_records(broker.bootstrap, topic, 1)
    assert json.loads(m.value()) == {"a": "****_****_****_****",
                                     "b": _wide("****-****-****-****").replace(_wide("*"), "*")}
    assert m.key() == b"card **** **** **** ****"
    assert m.headers() == [("x-card", b"**** **** **** ****")]
