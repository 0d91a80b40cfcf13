"""The API paths on their own: real filter chains (the shipped pii-mask and topic-policy
builds), real Kafka frames built by the codec, no sockets and no server."""

from __future__ import annotations

import datetime
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest

from sluice.codec import entities, schemas
from sluice.codec.error_codes import ErrorCode
from sluice.codec.fetch_splice import scan_fetch_response
from sluice.codec.headers import (
    parse_request_header,
    request_header_bytes,
    response_header_bytes,
)
from sluice.codec.messages import (
    ApiKey,
    decode_request,
    decode_response,
    encode_request,
    encode_response,
)
from sluice.codec.records import decode_records, split_batches
from sluice.filters.chain import FilterChain
from sluice.filters.config import FilterSpec
from sluice.proxy.contract import ClientInfo
from sluice.proxy.paths.admin import AdminPath
from sluice.proxy.paths.base import (
    Answer,
    DeadLetters,
    Defer,
    Exchange,
    Forward,
    PathContext,
    Refuse,
    Refused,
    Respond,
    Telemetry,
)
from sluice.proxy.paths.fetch import FetchPath
from sluice.proxy.paths.produce import ProducePath
from sluice.proxy.paths.sasl import SaslPath
from sluice.proxy.paths.topics import TopicRegistry
from sluice.proxy.telemetry.events import proxy_info
from sluice.proxy.telemetry.metrics import Metrics
from sluice.proxy.telemetry.recorder import TelemetryRecorder
from tests.filters.test_native_path import make_batch
from tests.proxy.paths.frames import joined

EMAIL = b'{"user": "ann@example.com", "note": "hi"}'


@dataclass
class ListSink:
    events: list[dict[str, Any]] = field(default_factory=list)
    recorder: Any = None  # the recorder writing here (set by `context`)

    def emit(self, event: dict[str, Any]) -> None:
        self.events.append(event)

    def stats(self) -> dict[str, Any]:
        return {}

    def close(self, timeout: float = 0) -> None:
        pass


@dataclass
class Letters:
    submitted: list[Any] = field(default_factory=list)

    def submit(self, letters: list[Any]) -> None:
        self.submitted.extend(letters)


@pytest.fixture
def chain(tmp_path: Any) -> Iterator[FilterChain]:
    specs = [
        FilterSpec(
            name="pii",
            module="builtin:pii-mask",
            topics=("pii.*",),
            apply_to=frozenset({"produce", "fetch"}),
        ),
        FilterSpec(
            name="policy",
            module="builtin:topic-policy",
            topics=("*",),
            apply_to=frozenset({"admin"}),
            config={"partitions": {"max": 12}},
        ),
    ]
    built = FilterChain.from_specs(specs, cache_dir=tmp_path / "cache")
    yield built
    built.close()


def context(chain: FilterChain | None, sink: ListSink, letters: Letters) -> PathContext:
    recorder = TelemetryRecorder(proxy_info("test"), Metrics())
    recorder.sink = sink  # type: ignore[assignment]
    sink.recorder = recorder
    directions: set[str] = set()
    for f in chain.filters if chain is not None else ():
        directions |= set(f.spec.apply_to)

    async def no_upstream() -> Any:
        raise OSError("no broker in a unit test")

    return PathContext(
        chain=chain,
        generation=1,
        directions=frozenset(directions),
        topics=TopicRegistry(),
        metrics=Metrics(),
        node_address=lambda node, host, port: ("proxy.local", 19092),
        open_upstream=no_upstream,
    )


def perform(exchange: Exchange, sink: ListSink, letters: Letters | None = None) -> None:
    """Perform the side effects the paths asked for on `exchange`, as the session would."""
    for effect in exchange.effects or ():
        if isinstance(effect, Telemetry):
            effect.call(sink.recorder)
        elif isinstance(effect, DeadLetters) and letters is not None:
            letters.submit(effect.letters)
    exchange.effects = None


def run(outcome: Any) -> Any:
    """Run deferred jobs the way the connection would (thread jobs inline here)."""
    while isinstance(outcome, Defer):
        assert outcome.job.in_thread, "these tests need no network look-up"
        outcome = outcome.job.finish(outcome.job.run())
    return outcome


def produce_frame(topic: str, records: bytes, acks: int = -1, version: int = 9) -> bytes:
    cls = schemas.request_schema(ApiKey.PRODUCE, version)
    tcls = entities.element_class(cls, "topic_data")
    pcls = entities.element_class(tcls, "partition_data")
    request = entities.build(
        cls,
        transactional_id=None,
        acks=acks,
        timeout=datetime.timedelta(seconds=5),
        topic_data=(
            entities.build(
                tcls, name=topic, partition_data=(entities.build(pcls, index=0, records=records),)
            ),
        ),
    )
    return request_header_bytes(ApiKey.PRODUCE, version, 7, "app") + encode_request(request)


def exchange_of(frame: bytes, principal: str | None = None) -> Exchange:
    client = ClientInfo("127.0.0.1:1", ("broker", 9092), principal=principal)
    return Exchange(parse_request_header(frame), client)


def values_of(records: bytes) -> list[bytes | None]:
    batches, _ = split_batches(records)
    return [r.value for b in batches for r in decode_records(b)]


# ------------------------------------------------------------------ produce


def test_produce_to_a_filtered_topic_is_masked_and_forwarded(chain: FilterChain) -> None:
    sink, letters = ListSink(), Letters()
    ctx = context(chain, sink, letters)
    frame = produce_frame("pii.users", make_batch([EMAIL]))
    exchange = exchange_of(frame)
    outcome = ProducePath().on_request(ctx, exchange, frame)
    assert isinstance(outcome, Defer), "filters run off the event loop"
    forward = run(outcome)
    assert isinstance(forward, Forward) and forward.frame is not None and forward.pin is not None
    # The spliced request goes out as its pieces (one writev), never joined by the path.
    assert isinstance(forward.frame, tuple)
    sent = b"".join(forward.frame)
    header = parse_request_header(sent)
    request = decode_request(ApiKey.PRODUCE, 9, sent[header.header_size :])
    (value,) = values_of(request.topic_data[0].partition_data[0].records)
    assert value is not None and b"ann@example.com" not in value
    # The new batch is one of the pieces itself: not copied into a new frame.
    batch = request.topic_data[0].partition_data[0].records
    assert any(type(p) is not memoryview and bytes(p) == batch for p in forward.frame)
    exchange.state = forward.state
    # The broker's answer gives the base offset that telemetry records.
    rcls = schemas.response_schema(ApiKey.PRODUCE, 9)
    tcls = entities.element_class(rcls, "responses")
    pcls = entities.element_class(tcls, "partition_responses")
    response = entities.build(
        rcls,
        responses=(
            entities.build(
                tcls,
                name="pii.users",
                partition_responses=(entities.build(pcls, index=0, base_offset=41),),
            ),
        ),
        throttle_time=datetime.timedelta(0),
    )
    raw = response_header_bytes(7, ApiKey.PRODUCE, 9) + encode_response(response)
    answered = forward.pin.on_response(ctx, exchange, raw)
    assert isinstance(answered, Respond)
    # No endpoint to rewrite and nothing answered locally: the broker's bytes are relayed
    # (the base offset was scanned out of them, not decoded).
    assert answered.frame is raw
    assert sink.events == [], "the path emits nothing itself: the session performs it"
    perform(exchange, sink)
    (event,) = sink.events
    assert (event["topic"], event["offset_first"], event["offset_last"]) == ("pii.users", 41, 41)
    assert event["filters"][0]["name"] == "pii" and event["filters"][0]["rewritten"] == 1


def _filtered_produce(ctx: PathContext, version: int) -> tuple[Exchange, Forward]:
    frame = produce_frame("pii.users", make_batch([EMAIL, EMAIL]), version=version)
    exchange = exchange_of(frame)
    forward = run(ProducePath().on_request(ctx, exchange, frame))
    assert isinstance(forward, Forward) and forward.pin is not None
    exchange.state = forward.state
    return exchange, forward


def test_produce_response_with_node_endpoints_is_rewritten_and_offsets_recorded(
    chain: FilterChain,
) -> None:
    sink, letters = ListSink(), Letters()
    ctx = context(chain, sink, letters)
    exchange, forward = _filtered_produce(ctx, version=10)
    rcls = schemas.response_schema(ApiKey.PRODUCE, 10)
    tcls = entities.element_class(rcls, "responses")
    pcls = entities.element_class(tcls, "partition_responses")
    ecls = entities.element_class(rcls, "node_endpoints")
    response = entities.build(
        rcls,
        responses=(
            entities.build(
                tcls,
                name="pii.users",
                partition_responses=(entities.build(pcls, index=0, base_offset=100),),
            ),
        ),
        throttle_time=datetime.timedelta(0),
        node_endpoints=(entities.build(ecls, node_id=1, host="broker.internal", port=9092),),
    )
    raw = response_header_bytes(7, ApiKey.PRODUCE, 10) + encode_response(response)
    assert forward.pin is not None
    answered = forward.pin.on_response(ctx, exchange, raw)
    assert isinstance(answered, Respond)
    size = len(response_header_bytes(7, ApiKey.PRODUCE, 10))
    relayed = decode_response(ApiKey.PRODUCE, 10, bytes(answered.frame)[size:])
    ((host, port),) = [(e.host, e.port) for e in relayed.node_endpoints]
    assert (host, port) == ("proxy.local", 19092), "no broker address reaches the client"
    perform(exchange, sink)
    (event,) = sink.events
    assert (event["offset_first"], event["offset_last"]) == (100, 101)


def test_produce_response_that_cannot_be_scanned_is_refused(chain: FilterChain) -> None:
    ctx = context(chain, ListSink(), Letters())
    exchange, forward = _filtered_produce(ctx, version=9)
    truncated = response_header_bytes(7, ApiKey.PRODUCE, 9) + b"\x02\x0apii"
    assert forward.pin is not None
    with pytest.raises(Refused):
        forward.pin.on_response(ctx, exchange, truncated)


def test_produce_to_an_unfiltered_topic_passes_as_its_bytes(chain: FilterChain) -> None:
    ctx = context(chain, ListSink(), Letters())
    frame = produce_frame("plain", make_batch([EMAIL]))
    outcome = run(ProducePath().on_request(ctx, exchange_of(frame), frame))
    assert isinstance(outcome, Forward) and outcome.frame is None and outcome.expect_response


def test_produce_acks0_without_filters_expects_no_response() -> None:
    ctx = context(None, ListSink(), Letters())
    frame = produce_frame("plain", make_batch([EMAIL]), acks=0)
    outcome = ProducePath().on_request(ctx, exchange_of(frame), frame)
    assert isinstance(outcome, Forward) and not outcome.expect_response


def test_undecodable_produce_is_refused(chain: FilterChain) -> None:
    ctx = context(chain, ListSink(), Letters())
    frame = produce_frame("pii.users", make_batch([EMAIL]))[:-9]
    outcome = ProducePath().on_request(ctx, exchange_of(frame), frame)
    assert isinstance(outcome, Refuse)


def test_produce_with_a_corrupt_batch_is_answered_by_the_proxy(chain: FilterChain) -> None:
    sink = ListSink()
    ctx = context(chain, sink, Letters())
    batch = bytearray(make_batch([EMAIL]))
    batch[-1] ^= 0xFF  # the CRC no longer matches
    frame = produce_frame("pii.users", bytes(batch))
    exchange = exchange_of(frame)
    outcome = run(ProducePath().on_request(ctx, exchange, frame))
    perform(exchange, sink)
    assert isinstance(outcome, Answer)
    size = len(response_header_bytes(7, ApiKey.PRODUCE, 9))
    response = decode_response(ApiKey.PRODUCE, 9, outcome.response[size:])
    (part,) = response.responses[0].partition_responses
    assert int(part.error_code) == ErrorCode.CORRUPT_MESSAGE
    assert sink.events and sink.events[0]["error_code"] == ErrorCode.CORRUPT_MESSAGE


# ------------------------------------------------------------------ fetch


def fetch_response(topic: str, records: bytes, version: int = 12) -> bytes:
    cls = schemas.response_schema(ApiKey.FETCH, version)
    tcls = entities.element_class(cls, "responses")
    pcls = entities.element_class(tcls, "partitions")
    response = entities.build(
        cls,
        throttle_time=datetime.timedelta(0),
        error_code=0,
        session_id=0,
        responses=(
            entities.build(
                tcls,
                topic=topic,
                partitions=(
                    entities.build(
                        pcls,
                        partition_index=0,
                        high_watermark=1,
                        records=records,
                        aborted_transactions=None,
                    ),
                ),
            ),
        ),
    )
    return response_header_bytes(3, ApiKey.FETCH, version) + encode_response(response)


def fetch_exchange(version: int = 12) -> Exchange:
    header = request_header_bytes(ApiKey.FETCH, version, 3, "consumer")
    return Exchange(parse_request_header(header), ClientInfo("127.0.0.1:2", ("broker", 9092)))


def test_fetch_records_are_masked_and_counted_when_sent(chain: FilterChain) -> None:
    sink = ListSink()
    ctx = context(chain, sink, Letters())
    path = FetchPath()
    assert path.wants_response(ctx, ApiKey.FETCH, 12)
    raw = fetch_response("pii.users", make_batch([EMAIL]))
    respond = run(path.on_response(ctx, fetch_exchange(), raw))
    assert isinstance(respond, Respond) and respond.on_sent is not None
    size = len(response_header_bytes(3, ApiKey.FETCH, 12))
    # Pieces for the connection to write in order: the frame is never joined (a copy).
    assert isinstance(respond.frame, tuple) and len(respond.frame) > 1
    decoded = decode_response(ApiKey.FETCH, 12, joined(respond.frame)[size:])
    (value,) = values_of(decoded.responses[0].partitions[0].records)
    assert value is not None and b"ann@example.com" not in value
    assert sink.events == [], "telemetry waits until the response is sent"
    respond.on_sent(sink.recorder)
    (event,) = sink.events
    assert event["api"] == "fetch" and event["records_in"] == 1


def test_fetch_of_an_unfiltered_topic_keeps_its_bytes(chain: FilterChain) -> None:
    ctx = context(chain, ListSink(), Letters())
    raw = fetch_response("plain", make_batch([EMAIL]))
    respond = run(FetchPath().on_response(ctx, fetch_exchange(), raw))
    assert isinstance(respond, Respond) and respond.frame is raw


def two_topic_fetch(version: int, records: bytes, endpoints: tuple[Any, ...] = ()) -> bytes:
    """A Fetch response (v13+: topics by id 1 = pii.users, 2 = plain) with one partition
    of `records` in the filtered topic "pii.users" and one in the unfiltered "plain"."""
    cls = schemas.response_schema(ApiKey.FETCH, version)
    tcls = entities.element_class(cls, "responses")
    pcls = entities.element_class(tcls, "partitions")
    part = entities.build(
        pcls, partition_index=0, high_watermark=1, records=records, aborted_transactions=None
    )
    topics = tuple(
        entities.build(
            tcls,
            partitions=(part,),
            **({"topic_id": uuid.UUID(int=n)} if version >= 13 else {"topic": name}),
        )
        for n, name in ((1, "pii.users"), (2, "plain"))
    )
    extra: dict[str, Any] = {}
    if endpoints:
        ncls = entities.element_class(cls, "node_endpoints")
        extra["node_endpoints"] = tuple(
            entities.build(ncls, node_id=n, host=h, port=p) for n, h, p in endpoints
        )
    response = entities.build(
        cls,
        throttle_time=datetime.timedelta(0),
        error_code=0,
        session_id=0,
        responses=topics,
        **extra,
    )
    return response_header_bytes(3, ApiKey.FETCH, version) + encode_response(response)


def known_ids(ctx: PathContext) -> None:
    for n, name in ((1, "pii.users"), (2, "plain")):
        ctx.topics.names[uuid.UUID(int=n)] = name


def test_fetch_splices_the_filtered_topic_and_keeps_the_brokers_bytes(
    chain: FilterChain,
) -> None:
    """Only the filtered partition's records change: the unfiltered topic keeps a tagged
    field kio would drop, and the empty node_endpoints tag Tansu sends stays as sent."""
    sink = ListSink()
    ctx = context(chain, sink, Letters())
    known_ids(ctx)
    raw = two_topic_fetch(16, make_batch([EMAIL]))
    size = len(response_header_bytes(3, ApiKey.FETCH, 16))
    layout = scan_fetch_response(16, raw, size)
    plain = layout.topics[1].partitions[0]
    # An unknown tag (7) in the unfiltered partition, and Tansu's empty node_endpoints.
    raw = raw[: plain.records_end] + b"\x01\x07\x02zz" + raw[plain.records_end + 1 : -1]
    raw += b"\x01\x00\x01\x01"
    respond = run(FetchPath().on_response(ctx, fetch_exchange(16), raw))
    assert isinstance(respond, Respond) and respond.on_sent is not None
    out = joined(respond.frame)
    start = layout.topics[1].start
    assert out[-(len(raw) - start) :] == raw[start:], "the plain topic passes as bytes"
    decoded = decode_response(ApiKey.FETCH, 16, out[size:])
    (value,) = values_of(decoded.responses[0].partitions[0].records)
    assert value is not None and b"ann@example.com" not in value
    assert decoded.responses[1].partitions[0].records == make_batch([EMAIL])
    respond.on_sent(sink.recorder)
    (event,) = sink.events
    assert event["topic"] == "pii.users" and event["records_out"] == 1


def test_fetch_with_node_endpoints_still_rewrites_them(chain: FilterChain) -> None:
    ctx = context(chain, ListSink(), Letters())
    known_ids(ctx)
    raw = two_topic_fetch(16, make_batch([EMAIL]), endpoints=((1, "10.1.2.3", 9092),))
    respond = run(FetchPath().on_response(ctx, fetch_exchange(16), raw))
    assert isinstance(respond, Respond)
    size = len(response_header_bytes(3, ApiKey.FETCH, 16))
    decoded = decode_response(ApiKey.FETCH, 16, joined(respond.frame)[size:])
    (endpoint,) = decoded.node_endpoints
    assert (endpoint.host, endpoint.port) == ("proxy.local", 19092)
    (value,) = values_of(decoded.responses[0].partitions[0].records)
    assert value is not None and b"ann@example.com" not in value


@pytest.mark.parametrize("version", [4, 11, 12, 13, 18])
def test_a_corrupt_filtered_partition_gets_an_error_and_no_records(
    chain: FilterChain, version: int
) -> None:
    sink = ListSink()
    ctx = context(chain, sink, Letters())
    known_ids(ctx)
    good = make_batch([EMAIL])
    bad = good[:-5] + bytes(b ^ 0xFF for b in good[-5:])  # the CRC no longer matches
    raw = two_topic_fetch(version, bad)
    respond = run(FetchPath().on_response(ctx, fetch_exchange(version), raw))
    assert isinstance(respond, Respond) and respond.on_sent is not None
    size = len(response_header_bytes(3, ApiKey.FETCH, version))
    decoded = decode_response(ApiKey.FETCH, version, joined(respond.frame)[size:])
    filtered, plain = (t.partitions[0] for t in decoded.responses)
    assert int(filtered.error_code) == ErrorCode.CORRUPT_MESSAGE and filtered.records is None
    assert int(plain.error_code) == 0 and plain.records == bad  # not filtered: as sent
    respond.on_sent(sink.recorder)
    assert sink.events[0]["error_code"] == ErrorCode.CORRUPT_MESSAGE


def test_an_error_code_kio_does_not_know_passes_as_without_filters(chain: FilterChain) -> None:
    """A newer broker's error code on an unfiltered partition is relayed, as on the
    unfiltered path (kio's decode refused it, which closed the connection)."""
    ctx = context(chain, ListSink(), Letters())
    raw = bytearray(two_topic_fetch(12, make_batch([EMAIL])))
    size = len(response_header_bytes(3, ApiKey.FETCH, 12))
    plain = scan_fetch_response(12, raw, size).topics[1].partitions[0]
    raw[plain.start + 4 : plain.start + 6] = (9999).to_bytes(2, "big")
    respond = run(FetchPath().on_response(ctx, fetch_exchange(12), bytes(raw)))
    assert isinstance(respond, Respond)
    layout = scan_fetch_response(12, joined(respond.frame), size)
    assert layout.topics[1].partitions[0].error_code == 9999
    masked = layout.topics[0].partitions[0].records
    assert masked is not None and b"ann@example.com" not in bytes(masked)


def test_no_fetch_filter_means_the_fetch_path_is_not_asked() -> None:
    assert not FetchPath().wants_response(context(None, ListSink(), Letters()), ApiKey.FETCH, 12)


# ------------------------------------------------------------------ admin


def create_topics_frame(partitions: int, version: int = 5) -> bytes:
    cls = schemas.request_schema(ApiKey.CREATE_TOPICS, version)
    tcls = entities.element_class(cls, "topics")
    request = entities.build(
        cls,
        topics=(
            entities.build(
                tcls,
                name="orders",
                num_partitions=partitions,
                replication_factor=1,
                assignments=(),
                configs=(),
            ),
        ),
        timeout=datetime.timedelta(seconds=5),
        validate_only=False,
    )
    return request_header_bytes(ApiKey.CREATE_TOPICS, version, 9, "admin") + encode_request(request)


def test_admin_denial_is_answered_with_policy_violation(chain: FilterChain) -> None:
    sink = ListSink()
    ctx = context(chain, sink, Letters())
    frame = create_topics_frame(partitions=64)
    exchange = exchange_of(frame)
    outcome = AdminPath().on_request(ctx, exchange, frame)
    assert isinstance(outcome, Answer)
    perform(exchange, sink)
    size = len(response_header_bytes(9, ApiKey.CREATE_TOPICS, 5))
    (topic,) = decode_response(ApiKey.CREATE_TOPICS, 5, outcome.response[size:]).topics
    assert int(topic.error_code) == ErrorCode.POLICY_VIOLATION
    (event,) = sink.events
    assert event["decision"] == "deny" and event["resource"] == "orders"


def test_admin_allowed_request_passes_as_its_bytes(chain: FilterChain) -> None:
    ctx = context(chain, ListSink(), Letters())
    frame = create_topics_frame(partitions=3)
    outcome = AdminPath().on_request(ctx, exchange_of(frame), frame)
    assert isinstance(outcome, Forward) and outcome.frame is None


# ------------------------------------------------------------------ sasl


def test_sasl_handshake_v0_is_refused() -> None:
    cls = schemas.request_schema(ApiKey.SASL_HANDSHAKE, 0)
    frame = request_header_bytes(ApiKey.SASL_HANDSHAKE, 0, 1, "c") + encode_request(
        entities.build(cls, mechanism="PLAIN")
    )
    outcome = SaslPath().on_request(context(None, ListSink(), Letters()), exchange_of(frame), frame)
    assert isinstance(outcome, Refuse) and "v0" in outcome.reason


def test_sasl_principal_is_learnt_from_a_successful_plain_exchange() -> None:
    ctx = context(None, ListSink(), Letters())
    path = SaslPath()
    hs_cls = schemas.request_schema(ApiKey.SASL_HANDSHAKE, 1)
    handshake = request_header_bytes(ApiKey.SASL_HANDSHAKE, 1, 1, "c") + encode_request(
        entities.build(hs_cls, mechanism="PLAIN")
    )
    exchange = exchange_of(handshake)
    assert isinstance(path.on_request(ctx, exchange, handshake), Forward)
    auth_cls = schemas.request_schema(ApiKey.SASL_AUTHENTICATE, 2)
    auth = request_header_bytes(ApiKey.SASL_AUTHENTICATE, 2, 2, "c") + encode_request(
        entities.build(auth_cls, auth_bytes=b"\x00alice\x00secret")
    )
    auth_exchange = Exchange(parse_request_header(auth), exchange.client)
    forward = path.on_request(ctx, auth_exchange, auth)
    assert isinstance(forward, Forward) and forward.pin is path
    auth_exchange.state = forward.state
    rcls = schemas.response_schema(ApiKey.SASL_AUTHENTICATE, 2)
    ok = response_header_bytes(2, ApiKey.SASL_AUTHENTICATE, 2) + encode_response(
        entities.build(
            rcls,
            error_code=0,
            error_message=None,
            auth_bytes=b"",
            session_lifetime=datetime.timedelta(0),
        )
    )
    path.on_response(ctx, auth_exchange, ok)
    assert exchange.client.principal == "User:alice"
    assert ctx.metrics.sasl_outcomes == {("PLAIN", "ok"): 1}
