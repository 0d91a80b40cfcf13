"""Which path sees a Produce response (issue 29, pass-through of large Produce requests).

The internal-topics path stands in front of the other paths for every response that may list
or name topics, but not for Produce: an unfiltered Produce response goes straight to the path
behind (the address path's KIP-951 scan), one Python call less per response on the cold caches
of a loaded machine. A Produce the internal-topics path changed (a partition of one of the
proxy's own topics taken out) pins that path instead, so its refusal is still merged into the
broker's answer, whatever chain is in force when the answer comes.
"""

from __future__ import annotations

import datetime
import time

from sluice.codec import entities, schemas
from sluice.codec.headers import parse_request_header, request_header_bytes, response_header_bytes
from sluice.codec.messages import ApiKey, decode_response, encode_request, encode_response
from sluice.codec.records import BatchHeader, Record, build_batch
from sluice.proxy.contract import ClientInfo
from sluice.proxy.paths.addresses import AddressPath
from sluice.proxy.paths.base import Exchange, Forward, PathContext, Respond
from sluice.proxy.paths.catalog import standard_paths
from sluice.proxy.paths.internal_topics import InternalTopicsPath
from sluice.proxy.paths.protection import Protection
from sluice.proxy.paths.registry import Router, VersionTable
from sluice.proxy.paths.topics import TopicRegistry
from sluice.proxy.telemetry.metrics import Metrics

INTERNAL, ORDINARY = "_sluice_filters", "users"
PRODUCE = int(ApiKey.PRODUCE)
VERSION = 11  # flexible, with KIP-951 node endpoints in its response's tags
DENIED = 29


def context(generation: int = 0) -> PathContext:
    return PathContext(
        chain=None, generation=generation, directions=frozenset(), topics=TopicRegistry(),
        metrics=Metrics(), node_address=lambda n, h, p: (h, p),  # type: ignore[arg-type]
        open_upstream=None,  # type: ignore[arg-type]
        protection=Protection(frozenset({INTERNAL}), frozenset()),
    )


def produce(names: list[str]) -> bytes:
    now = int(time.time() * 1000)
    batch = build_batch(BatchHeader(0, 0, -1, 2, 0, 0, 0, now, now, -1, -1, -1, 1),
                        [Record(0, 0, None, b'{"n": 1}', [])])
    cls = schemas.request_schema(PRODUCE, VERSION)
    tcls = entities.element_class(cls, "topic_data")
    pcls = entities.element_class(tcls, "partition_data")
    request = entities.build(
        cls, transactional_id=None, acks=-1, timeout=datetime.timedelta(seconds=5),
        topic_data=tuple(entities.build(tcls, name=n, partition_data=(
            entities.build(pcls, index=0, records=batch),)) for n in names),
    )
    return request_header_bytes(PRODUCE, VERSION, 7, "test") + encode_request(request)


def broker_answer(names: list[str]) -> bytes:
    cls = schemas.response_schema(PRODUCE, VERSION)
    tcls = entities.element_class(cls, "responses")
    pcls = entities.element_class(tcls, "partition_responses")
    body = entities.build(cls, throttle_time_ms=0, responses=tuple(
        entities.build(tcls, name=n, partition_responses=(entities.build(
            pcls, index=0, error_code=0, base_offset=5, log_append_time_ms=-1,
            log_start_offset=0),)) for n in names))
    return response_header_bytes(7, PRODUCE, VERSION) + encode_response(body)


def router(generation: int = 0) -> Router:
    return Router(standard_paths(VersionTable()), context(generation), VersionTable())


def test_produce_responses_go_to_the_address_path_not_the_internal_topics_path() -> None:
    routes = router()
    assert isinstance(routes.response_path(PRODUCE, VERSION), AddressPath)
    # Every other response that can name a topic still meets the internal-topics path first.
    assert isinstance(routes.response_path(int(ApiKey.FETCH), 12), InternalTopicsPath)
    assert isinstance(routes.response_path(int(ApiKey.METADATA), 12), InternalTopicsPath)
    # The path behind answers an unfiltered Produce response with the broker's own bytes.
    frame = produce([ORDINARY])
    exchange = Exchange(parse_request_header(frame), ClientInfo("c", ("b", 1)))
    path = routes.request_path(PRODUCE)
    assert path is not None
    outcome = path.on_request(routes.ctx, exchange, frame)
    assert type(outcome) is Forward and outcome.frame is None and outcome.pin is None
    answer = broker_answer([ORDINARY])
    response_path = routes.response_path(PRODUCE, VERSION)
    assert response_path is not None
    sent = response_path.on_response(routes.ctx, exchange, answer)
    assert type(sent) is Respond and sent.frame is answer


def test_a_produce_the_internal_topics_path_changed_pins_it_across_a_reload() -> None:
    before = router(0)
    frame = produce([INTERNAL, ORDINARY])
    exchange = Exchange(parse_request_header(frame), ClientInfo("c", ("b", 1)))
    path = before.request_path(PRODUCE)
    assert isinstance(path, InternalTopicsPath)
    outcome = path.on_request(before.ctx, exchange, frame)
    assert type(outcome) is Forward and outcome.frame is not None
    assert INTERNAL.encode() not in bytes(outcome.frame)
    # Pinned: the connection hands the response to this path whatever router is in force.
    assert outcome.pin is path
    after = router(1)  # a reload meanwhile
    answered = outcome.pin.on_response(after.ctx, exchange, broker_answer([ORDINARY]))
    assert type(answered) is Respond
    body = bytes(answered.frame)
    size = len(response_header_bytes(7, PRODUCE, VERSION))
    decoded = decode_response(PRODUCE, VERSION, body[size:])
    codes = {t.name: [int(p.error_code) for p in t.partition_responses]
             for t in decoded.responses}
    assert codes == {ORDINARY: [0], INTERNAL: [DENIED]}
