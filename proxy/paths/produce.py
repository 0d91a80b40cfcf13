"""Produce requests to filtered topics.

The request is decoded only when some filter acts on produce. Each partition of a filtered
topic goes through the chain (sluice.filters.pipeline); partitions that survive are forwarded
(re-encoded only if something changed), partitions that were refused or entirely dropped are
answered by the proxy, and the two are merged into one response in the client's version.
A Produce the proxy cannot decode never reaches the broker: the connection is closed.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from sluice.codec import entities
from sluice.codec.batch_counts import count_records
from sluice.codec.errors import CodecError
from sluice.codec.headers import RequestHeader
from sluice.codec.messages import ApiKey, decode_request, encode_request, encode_response
from sluice.codec.peek import produce_acks
from sluice.filters.context import RecordContext
from sluice.filters.pipeline import filter_produce
from sluice.proxy.net.session import Pending, ProtocolViolation, Session

if TYPE_CHECKING:
    from sluice.filters.chain import FilterStats

UNKNOWN_TOPIC_ID = 100


@dataclass(slots=True)
class LocalAnswer:
    """A partition the proxy answers itself."""

    topic: str | None
    topic_id: Any
    index: int
    error_code: int
    error_message: str | None = None
    record_errors: list[tuple[int, str]] = field(default_factory=list)


@dataclass(slots=True)
class FilteredPartition:
    """What telemetry needs to know about one filtered partition."""

    topic: str
    index: int
    records_in: int
    records_out: int
    bytes_in: int
    bytes_out: int
    stats: list[FilterStats]
    error_code: int = 0
    error_message: str | None = None
    record_errors: list[tuple[int, str]] = field(default_factory=list)
    dead_letters: int = 0
    forwarded: bool = True


@dataclass(slots=True)
class ProduceState:
    local: list[LocalAnswer]
    filtered: list[FilteredPartition]


def handle_produce(session: Session, header: RequestHeader, frame: memoryview | bytes) -> None:
    server = session.server
    chain = server.chain
    body = frame[header.header_size :]
    if chain is None or not server.filters_on("produce"):
        try:
            acks = produce_acks(body, header.flexible)
        except CodecError as exc:
            raise ProtocolViolation(f"malformed Produce request: {exc}") from None
        session.forward(header, frame, expect_response=acks != 0)
        return
    try:
        request = decode_request(ApiKey.PRODUCE, header.api_version, body)
    except CodecError as exc:
        # Fail closed: an undecodable Produce could carry records for a filtered topic.
        raise ProtocolViolation(f"cannot decode Produce v{header.api_version}: {exc}") from None

    principal = session.principal
    local: list[LocalAnswer] = []
    filtered: list[FilteredPartition] = []
    kept_topics = []
    changed = False
    for topic in request.topic_data:
        name = getattr(topic, "name", None) or server.topic_names.get(
            getattr(topic, "topic_id", None)
        )
        topic_id = getattr(topic, "topic_id", None)
        if name is None:
            # A topic id we never saw in Metadata: we cannot tell whether a filter applies.
            changed = True
            for part in topic.partition_data:
                local.append(
                    LocalAnswer(
                        None,
                        topic_id,
                        int(part.index),
                        UNKNOWN_TOPIC_ID,
                        "topic id unknown to the proxy; refresh metadata",
                    )
                )
            continue
        if not chain.applies(name, "produce", principal):
            kept_topics.append(topic)
            continue
        parts = []
        for part in topic.partition_data:
            records = part.records or b""
            ctx = RecordContext(name, int(part.index), "produce", session.client_id, principal)
            outcome = filter_produce(chain, ctx, records)
            if outcome.dead_letters:
                server.dead_letters.submit(outcome.dead_letters)
            records_in = count_records(records)
            info = FilteredPartition(
                name,
                int(part.index),
                records_in,
                0,
                len(records),
                0,
                outcome.stats,
                error_code=outcome.error_code,
                error_message=outcome.error_message,
                record_errors=list(outcome.record_errors),
                dead_letters=len(outcome.dead_letters),
            )
            filtered.append(info)
            if outcome.records is None:
                changed = True
                info.forwarded = False
                local.append(
                    LocalAnswer(
                        name,
                        topic_id,
                        int(part.index),
                        outcome.error_code,
                        outcome.error_message,
                        list(outcome.record_errors),
                    )
                )
                continue
            info.bytes_out = len(outcome.records)
            info.records_out = count_records(outcome.records) if outcome.changed else records_in
            if outcome.changed:
                changed = True
                part = dataclasses.replace(part, records=bytes(outcome.records))
            parts.append(part)
        if parts:
            kept_topics.append(dataclasses.replace(topic, partition_data=tuple(parts)))

    expect = int(request.acks) != 0
    state = ProduceState(local, filtered)
    if not changed:
        session.forward(
            header,
            frame,
            on_response=_on_response if filtered else None,
            state=state,
            expect_response=expect,
        )
        if not expect:
            server.emit_produce_telemetry(session, state, None)
        return
    if not kept_topics:
        server.emit_produce_telemetry(session, state, None)
        if expect:
            session.answer(header, _local_response(header, local))
        return
    new_body = encode_request(dataclasses.replace(request, topic_data=tuple(kept_topics)))
    session.forward(
        header,
        bytes(frame[: header.header_size]) + new_body,
        on_response=_on_response,
        state=state,
        expect_response=expect,
    )
    if not expect:
        server.emit_produce_telemetry(session, state, None)


def _partition_response(pcls: type[Any], answer: LocalAnswer) -> Any:
    record_errors: tuple[Any, ...] = ()
    # Produce responses before v8 carry no per-record errors (nor an error message).
    if entities.has_field(pcls, "record_errors"):
        rcls = entities.element_class(pcls, "record_errors")
        record_errors = tuple(
            entities.build(rcls, batch_index=i, batch_index_error_message=msg)
            for i, msg in answer.record_errors
        )
    return entities.build(
        pcls,
        index=answer.index,
        error_code=answer.error_code,
        base_offset=-1,
        log_start_offset=-1,
        record_errors=record_errors,
        error_message=answer.error_message,
    )


def _merge_local(response: Any, local: list[LocalAnswer]) -> Any:
    rcls = type(response)
    tcls = entities.element_class(rcls, "responses")
    pcls = entities.element_class(tcls, "partition_responses")
    by_key = {}
    topics = list(response.responses)
    for i, t in enumerate(topics):
        by_key[getattr(t, "name", None) or getattr(t, "topic_id", None)] = i
    for answer in local:
        key = answer.topic if entities.has_field(tcls, "name") else answer.topic_id
        part = _partition_response(pcls, answer)
        if key in by_key:
            i = by_key[key]
            topics[i] = dataclasses.replace(
                topics[i], partition_responses=(*topics[i].partition_responses, part)
            )
        else:
            by_key[key] = len(topics)
            topics.append(
                entities.build(
                    tcls, name=answer.topic, topic_id=answer.topic_id, partition_responses=(part,)
                )
            )
    return dataclasses.replace(response, responses=tuple(topics))


def _local_response(header: RequestHeader, local: list[LocalAnswer]) -> bytes:
    from sluice.codec.headers import response_header_bytes

    cls = entities.response_class(ApiKey.PRODUCE, header.api_version)
    empty = entities.build(cls, responses=())
    body = encode_response(_merge_local(empty, local))
    return response_header_bytes(header.correlation_id, header.api_key, header.api_version) + body


def _on_response(session: Session, pending: Pending, frame: memoryview | bytes) -> Any:
    server = session.server
    state: ProduceState = pending.state

    def transform(response: Any) -> Any:
        server.emit_produce_telemetry(session, state, response)
        return _merge_local(response, state.local) if state.local else response

    return server.transform_response(pending, frame, transform)
