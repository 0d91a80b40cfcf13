"""The internal-topics path over every version of every API that can name a topic.

The black-box tests (tests/e2e/test_internal_topics.py) attack a real proxy with the versions
clients use; here each (API, version) the codec knows gets a request naming one internal and
one ordinary topic, and the path must take the internal one out before the broker sees it and
answer it with TOPIC_AUTHORIZATION_FAILED wherever the response has room for an error.
"""

from __future__ import annotations

import dataclasses
import uuid
from typing import Any

import pytest

from sluice.codec import entities, schemas
from sluice.codec.headers import parse_request_header, request_header_bytes, response_header_bytes
from sluice.codec.messages import (
    ApiKey,
    codec_version_range,
    decode_request,
    decode_response,
    encode_request,
    encode_response,
)
from sluice.proxy.contract import ClientInfo
from sluice.proxy.paths.base import Answer, Exchange, Forward, PathContext, Refuse, Respond
from sluice.proxy.paths.internal_topics import (
    BROKER_ONLY,
    SHAPES,
    InternalTopicsPath,
    _field,
    _shape,
)
from sluice.proxy.paths.protection import Protection
from sluice.proxy.paths.topics import TopicRegistry
from sluice.proxy.telemetry.metrics import Metrics

INTERNAL, ORDINARY = "_sluice_filters", "users"
IDS = {INTERNAL: uuid.UUID(int=1), ORDINARY: uuid.UUID(int=2)}
DENIED = 29


def context(operators: frozenset[str] = frozenset()) -> PathContext:
    topics = TopicRegistry()
    for name, topic_id in IDS.items():
        topics.names[topic_id] = name
        topics.ids[name] = topic_id
    return PathContext(
        chain=None, generation=0, directions=frozenset(), topics=topics,
        metrics=Metrics(), node_address=lambda n, h, p: (h, p),  # type: ignore[arg-type]
        open_upstream=None,  # type: ignore[arg-type]
        protection=Protection(frozenset({INTERNAL}), operators),
    )


def topic_item(cls: Any, name: str) -> Any:
    if not dataclasses.is_dataclass(cls):
        return name  # DeleteTopics before v6: bare names
    values: dict[str, Any] = {}
    if entities.has_field(cls, "resource_type"):
        values.update(resource_type=2, resource_name=name)
    named = _field(cls, ("name", "topic", "topic_name"))
    if named is not None:
        values[named] = name
    elif entities.has_field(cls, "topic_id"):
        values["topic_id"] = IDS[name]
    parts = _field(cls, ("partitions", "partition_indexes", "partition_data"))
    if parts is not None:
        pcls = entities.element_class(cls, parts)
        if dataclasses.is_dataclass(pcls):
            index = _field(pcls, ("partition_index", "partition", "index"))
            assert index is not None
            values[parts] = (entities.build(pcls, **{index: 0}),)
        else:
            values[parts] = (0,)
    return entities.build(cls, **values)


def request(api: int, version: int, names: list[str]) -> bytes:
    shape = _shape(api, version)
    assert shape is not None, f"{ApiKey(api).name} v{version} has no shape"
    cls = schemas.request_schema(api, version)
    path = shape[0]
    if len(path) == 1:
        icls = entities.element_class(cls, path[0])
        body = entities.build(cls, **{path[0]: tuple(topic_item(icls, n) for n in names)})
    else:
        ocls = entities.element_class(cls, path[0])
        icls = entities.element_class(ocls, path[1])
        outer = entities.build(ocls, group_id="g", transactional_id="t",
                               **{path[1]: tuple(topic_item(icls, n) for n in names)})
        body = entities.build(cls, **{path[0]: (outer,)})
    return request_header_bytes(api, version, 7, "test") + encode_request(body)


def exchange_for(frame: bytes, principal: str | None = None) -> Exchange:
    return Exchange(parse_request_header(frame), ClientInfo("c", ("b", 1), principal=principal))


def named_in(api: int, version: int, frame: bytes) -> list[str]:
    """The topics a request names, read back from its bytes."""
    header = parse_request_header(frame)
    decoded = decode_request(api, version, frame[header.header_size:])
    path = _shape(api, version)
    assert path is not None
    lists = [getattr(decoded, path[0][0])]
    if len(path[0]) == 2:
        lists = [getattr(o, path[0][1]) for o in lists[0]]
    out = []
    for items in lists:
        for i in items:
            if isinstance(i, str):
                out.append(i)
                continue
            name = next((getattr(i, f) for f in ("name", "topic", "topic_name", "resource_name")
                         if getattr(i, f, None)), None)
            out.append(str(name) if name else {v: k for k, v in IDS.items()}[i.topic_id])
    return out


def errors_in(api: int, version: int, body: bytes) -> list[int]:
    """Every error code of a response body (header included), wherever it sits."""
    size = len(response_header_bytes(7, api, version))
    decoded = decode_response(api, version, body[size:])
    found: list[int] = []

    def walk(value: Any) -> None:
        if dataclasses.is_dataclass(value):
            for f in dataclasses.fields(value):
                v = getattr(value, f.name)
                if f.name in ("error_code", "partition_error_code"):
                    found.append(int(v))
                else:
                    walk(v)
        elif isinstance(value, tuple):
            for v in value:
                walk(v)

    walk(decoded)
    return found


#: Listings whose topics carry no error code: a refused topic is only left out.
NO_ROOM = frozenset({int(ApiKey.DESCRIBE_LOG_DIRS), int(ApiKey.LIST_PARTITION_REASSIGNMENTS)})

CASES = [
    (int(api), v)
    for api in SHAPES
    for v in range(*(lambda r: (r[0], r[1] + 1))(codec_version_range(int(api)) or (0, -1)))
]


@pytest.mark.parametrize(("api", "version"), CASES,
                         ids=[f"{ApiKey(a).name}-v{v}" for a, v in CASES])
def test_mixed_request_loses_the_internal_topic_and_its_answer_says_29(api: int,
                                                                      version: int) -> None:
    ctx = context()
    path = InternalTopicsPath([])
    frame = request(api, version, [INTERNAL, ORDINARY])
    exchange = exchange_for(frame)
    outcome = path.on_request(ctx, exchange, frame)
    assert type(outcome) is Forward and outcome.frame is not None
    assert named_in(api, version, outcome.frame) == [ORDINARY]
    # The broker answers nothing in particular; the refusal is merged into its answer.
    empty = entities.build(entities.response_class(api, version))
    broker = response_header_bytes(7, api, version) + encode_response(empty)
    answered = path.on_response(ctx, exchange, broker)
    assert type(answered) is Respond
    codes = errors_in(api, version, bytes(answered.frame))
    if api in NO_ROOM:
        # A listing without error codes for its topics just leaves the topic out.
        assert INTERNAL.encode() not in bytes(answered.frame) and DENIED not in codes
    else:
        assert DENIED in codes, codes


@pytest.mark.parametrize(("api", "version"), CASES,
                         ids=[f"{ApiKey(a).name}-v{v}" for a, v in CASES])
def test_only_internal_topics_are_answered_by_the_proxy(api: int, version: int) -> None:
    ctx = context()
    path = InternalTopicsPath([])
    frame = request(api, version, [INTERNAL])
    outcome = path.on_request(ctx, exchange_for(frame), frame)
    if api == ApiKey.METADATA:
        # Metadata always reaches the broker (its answer lists the brokers), without the name.
        assert type(outcome) is Forward and outcome.frame is not None
        assert named_in(api, version, outcome.frame) == []
        return
    assert type(outcome) is Answer
    codes = errors_in(api, version, outcome.response)
    if api in NO_ROOM:
        assert INTERNAL.encode() not in outcome.response and DENIED not in codes
    else:
        assert DENIED in codes, codes


@pytest.mark.parametrize(("api", "version"), CASES[::7],
                         ids=[f"{ApiKey(a).name}-v{v}" for a, v in CASES[::7]])
def test_ordinary_requests_and_operators_pass_untouched(api: int, version: int) -> None:
    path = InternalTopicsPath([])
    ordinary = request(api, version, [ORDINARY])
    outcome = path.on_request(context(), exchange_for(ordinary), ordinary)
    assert type(outcome) is Forward and outcome.frame is None
    internal = request(api, version, [INTERNAL])
    ops = context(frozenset({"User:ops"}))
    outcome = path.on_request(ops, exchange_for(internal, "User:ops"), internal)
    assert type(outcome) is Forward and outcome.frame is None


def test_metadata_listing_hides_internal_topics() -> None:
    ctx = context()
    path = InternalTopicsPath([])
    version = 12
    frame = request_header_bytes(ApiKey.METADATA, version, 7, "t") + encode_request(
        entities.build(schemas.request_schema(ApiKey.METADATA, version), topics=None))
    exchange = exchange_for(frame)
    assert type(path.on_request(ctx, exchange, frame)) is Forward
    cls = entities.response_class(ApiKey.METADATA, version)
    tcls = entities.element_class(cls, "topics")
    listed = entities.build(cls, topics=tuple(
        entities.build(tcls, name=n, topic_id=IDS[n]) for n in (INTERNAL, ORDINARY)))
    out = path.on_response(ctx, exchange, response_header_bytes(7, ApiKey.METADATA, version)
                           + encode_response(listed))
    assert type(out) is Respond
    size = len(response_header_bytes(7, ApiKey.METADATA, version))
    shown = decode_response(ApiKey.METADATA, version, bytes(out.frame)[size:])
    assert [t.name for t in shown.topics] == [ORDINARY]


def test_broker_only_apis_are_refused() -> None:
    ctx = context()
    path = InternalTopicsPath([])
    for api in sorted(BROKER_ONLY):
        span = codec_version_range(api)
        assert span is not None
        frame = request_header_bytes(api, span[0], 7, "t") + b""
        outcome = path.on_request(ctx, exchange_for(frame), frame)
        assert type(outcome) is Refuse, ApiKey(api).name


def test_config_resource_listing_hides_internal_topics() -> None:
    ctx = context()
    path = InternalTopicsPath([])
    api, version = ApiKey.LIST_CONFIG_RESOURCES, 1
    frame = request_header_bytes(api, version, 7, "t") + encode_request(
        entities.build(schemas.request_schema(api, version), resource_types=(2,)))
    exchange = exchange_for(frame)
    assert type(path.on_request(ctx, exchange, frame)) is Forward
    cls = entities.response_class(api, version)
    rcls = entities.element_class(cls, "config_resources")
    listed = entities.build(cls, config_resources=tuple(
        entities.build(rcls, resource_name=n, resource_type=2) for n in (INTERNAL, ORDINARY)))
    out = path.on_response(ctx, exchange, response_header_bytes(7, api, version)
                           + encode_response(listed))
    assert type(out) is Respond
    size = len(response_header_bytes(7, api, version))
    shown = decode_response(api, version, bytes(out.frame)[size:])
    assert [r.resource_name for r in shown.config_resources] == [ORDINARY]


def test_own_topics_come_from_the_whole_config() -> None:
    from sluice.proxy.ops.security import own_topics

    raw = {
        "fleet": {"topic": "fleet-x"},
        "telemetry": {"kafka": {"bootstrap": "h:1", "topic": "tele-x"}},
        "filters": [{"name": "a", "dead_letter_topic": "dlq-a"}, {"name": "b"}],
        "transforms": [{"name": "t", "filters": [{"name": "c", "dead_letter_topic": "dlq-c"}]}],
    }
    assert own_topics(raw, ["extra"]) == {"_sluice_filters", "fleet-x", "tele-x", "dlq-a",
                                          "dlq-c", "extra"}
    assert own_topics({}) == {"_sluice_filters"}


def test_delete_topics_by_id_is_refused() -> None:
    ctx = context()
    path = InternalTopicsPath([])
    api, version = ApiKey.DELETE_TOPICS, 6
    cls = schemas.request_schema(api, version)
    tcls = entities.element_class(cls, "topics")
    frame = request_header_bytes(api, version, 7, "t") + encode_request(entities.build(
        cls, topics=tuple(entities.build(tcls, name=None, topic_id=IDS[n])
                          for n in (INTERNAL, ORDINARY))))
    exchange = exchange_for(frame)
    outcome = path.on_request(ctx, exchange, frame)
    assert type(outcome) is Forward and outcome.frame is not None
    header = parse_request_header(outcome.frame)
    sent = decode_request(api, version, outcome.frame[header.header_size:])
    assert [t.topic_id for t in sent.topics] == [IDS[ORDINARY]]
    broker = response_header_bytes(7, api, version) + encode_response(
        entities.build(entities.response_class(api, version)))
    answered = path.on_response(ctx, exchange, broker)
    assert type(answered) is Respond
    size = len(response_header_bytes(7, api, version))
    decoded = decode_response(api, version, bytes(answered.frame)[size:])
    assert [(r.topic_id, int(r.error_code)) for r in decoded.responses] == [(IDS[INTERNAL],
                                                                             DENIED)]
