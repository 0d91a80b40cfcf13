"""Produce requests to filtered topics.

The request is decoded only when some filter acts on produce. Each partition of a filtered
topic goes through the chain (sluice.filters.pipeline); partitions that survive are forwarded
(re-encoded only if something changed), partitions that were refused or entirely dropped are
answered by the proxy, and the two are merged into one response in the client's version.
A Produce the proxy cannot decode never reaches the broker: the connection is closed.

Filters run in the filter thread pool (`Job`); the request is forwarded when they are done, and
later requests of the connection wait behind it, so the broker sees them in order. Topic ids
the proxy has not seen yet (Produce v13+) are looked up first (`topics.py`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from sluice.codec import entities
from sluice.codec.batch_counts import count_records
from sluice.codec.error_codes import ErrorCode
from sluice.codec.errors import CodecError
from sluice.codec.headers import RequestHeader, response_header_bytes
from sluice.codec.messages import ApiKey, decode_request, encode_request, encode_response
from sluice.codec.peek import produce_acks
from sluice.filters.chain import DeadLetter, FilterChain, FilterStats
from sluice.filters.context import RecordContext
from sluice.filters.pipeline import filter_produce
from sluice.proxy.net.client_info import ClientInfo
from sluice.proxy.net.upstream_client import UpstreamError
from sluice.proxy.paths import responses
from sluice.proxy.paths.base import (
    Answer,
    Defer,
    Exchange,
    Forward,
    Frame,
    Job,
    NoReply,
    PathContext,
    Refuse,
    RequestOutcome,
    Respond,
)
from sluice.proxy.telemetry.events import produce_offsets
from sluice.proxy.telemetry.logs import log


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


class ProducePath:
    """Produce requests: always looked at (acks decides whether a response comes), decoded
    only when a produce filter is in force."""

    name = "produce"
    api_keys = frozenset({int(ApiKey.PRODUCE)})

    def wants_request(self, ctx: PathContext, api_key: int) -> bool:
        return True  # even unfiltered Produce needs its acks read (acks=0 gets no response)

    def wants_response(self, ctx: PathContext, api_key: int, version: int) -> bool:
        return False  # filtered requests pin this path; others go to the address path

    def on_request(self, ctx: PathContext, exchange: Exchange, frame: Frame) -> RequestOutcome:
        header = exchange.header
        body = frame[header.header_size :]
        chain = ctx.chain
        if chain is None or not ctx.filters_on("produce"):
            try:
                acks = produce_acks(body, header.flexible)
            except CodecError as exc:
                return Refuse(f"malformed Produce request: {exc}")
            return Forward(expect_response=acks != 0)
        try:
            request = decode_request(ApiKey.PRODUCE, header.api_version, body)
        except CodecError as exc:
            # Fail closed: an undecodable Produce could carry records for a filtered topic.
            return Refuse(f"cannot decode Produce v{header.api_version}: {exc}")
        unknown = ctx.topics.unknown(
            getattr(t, "topic_id", None) for t in request.topic_data if not getattr(t, "name", None)
        )
        if unknown:
            return Defer(
                Job(
                    run=lambda: _lookup(ctx),
                    finish=lambda _: self._filter(ctx, exchange, frame, request),
                    in_thread=False,
                    what="topic id look-up",
                )
            )
        return self._filter(ctx, exchange, frame, request)

    def _filter(
        self, ctx: PathContext, exchange: Exchange, frame: Frame, request: Any
    ) -> RequestOutcome:
        chain = ctx.chain
        assert chain is not None
        client = exchange.client
        names = {
            id(t): getattr(t, "name", None) or ctx.topics.name(getattr(t, "topic_id", None))
            for t in request.topic_data
        }
        if not any(
            name is not None and chain.applies(name, "produce", client.principal)
            for name in names.values()
        ) and all(name is not None for name in names.values()):
            return Forward(expect_response=int(request.acks) != 0)
        return Defer(
            Job(
                run=lambda: _filter_request(
                    chain, request, names, client.client_id, client.principal
                ),
                finish=lambda result: self._forward(ctx, exchange, frame, request, result),
                what="produce filters",
            )
        )

    def _forward(
        self, ctx: PathContext, exchange: Exchange, frame: Frame, request: Any, result: _Filtered
    ) -> RequestOutcome:
        header = exchange.header
        for letters in result.dead_letters:
            ctx.dead_letters.submit(letters)
        expect = int(request.acks) != 0
        state = ProduceState(result.local, result.filtered)
        if not result.changed:
            if not expect:
                _emit(ctx, exchange.client, state, None)
            return Forward(expect_response=expect, state=state, pin=self if expect else None)
        if not result.kept_topics:
            _emit(ctx, exchange.client, state, None)
            if not expect:
                return NoReply()
            return Answer(_local_response(header, result.local))
        new_body = encode_request(
            dataclasses.replace(request, topic_data=tuple(result.kept_topics))
        )
        if not expect:
            _emit(ctx, exchange.client, state, None)
        return Forward(
            frame=bytes(frame[: header.header_size]) + new_body,
            expect_response=expect,
            state=state,
            pin=self if expect else None,
        )

    def on_response(self, ctx: PathContext, exchange: Exchange, frame: Frame) -> Respond:
        state: ProduceState = exchange.state

        def change(response: Any) -> Any:
            _emit(ctx, exchange.client, state, response)
            return _merge_local(response, state.local) if state.local else response

        return Respond(responses.transform(exchange.header, frame, ctx.map_endpoint, change))

    def on_unanswered(self, ctx: PathContext, exchange: Exchange, reason: str) -> None:
        """The broker went away before answering: the audit shows these batches as lost."""
        state: ProduceState | None = exchange.state
        if state is None:
            return
        for info in state.filtered:
            if info.forwarded:
                info.error_code = ErrorCode.NETWORK_EXCEPTION
                info.error_message = f"sluice: {reason} before answering; outcome unknown"
        _emit(ctx, exchange.client, state, None)


async def _lookup(ctx: PathContext) -> None:
    try:
        await ctx.topics.resolve(ctx.open_upstream)
    except (OSError, UpstreamError, TimeoutError, CodecError) as exc:
        log.warning("topic_id_lookup_failed", error=str(exc))


@dataclass(slots=True)
class _Filtered:
    """What the filter thread found for one Produce request (applied on the loop)."""

    local: list[LocalAnswer]
    filtered: list[FilteredPartition]
    kept_topics: list[Any]
    dead_letters: list[list[DeadLetter]]
    changed: bool


def _filter_request(
    chain: FilterChain,
    request: Any,
    names: dict[int, str | None],
    client_id: str | None,
    principal: str | None,
) -> _Filtered:
    """Runs in the filter thread pool: every partition of a filtered topic through the chain.
    Touches no loop-owned state; returns what the loop applies."""
    local: list[LocalAnswer] = []
    filtered: list[FilteredPartition] = []
    kept_topics = []
    dead: list[list[DeadLetter]] = []
    changed = False
    for topic in request.topic_data:
        name = names[id(topic)]
        topic_id = getattr(topic, "topic_id", None)
        if name is None:
            # A topic id the cluster does not know either: we cannot tell whether a filter
            # applies, so its records do not pass.
            changed = True
            for part in topic.partition_data:
                local.append(
                    LocalAnswer(
                        None,
                        topic_id,
                        int(part.index),
                        ErrorCode.UNKNOWN_TOPIC_ID,
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
            ctx = RecordContext(name, int(part.index), "produce", client_id, principal)
            outcome = filter_produce(chain, ctx, records)
            if outcome.dead_letters:
                dead.append(outcome.dead_letters)
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
    return _Filtered(local, filtered, kept_topics, dead, changed)


def _emit(ctx: PathContext, client: ClientInfo, state: ProduceState, response: Any) -> None:
    """One record_batch event per filtered partition, with the broker's base offsets."""
    base: dict[tuple[str, int], tuple[int, int]] = {}
    if response is not None:
        for t in response.responses:
            name = getattr(t, "name", None) or ctx.topics.name(getattr(t, "topic_id", None))
            for p in t.partition_responses:
                base[(name or "", int(p.index))] = (int(p.base_offset), int(p.error_code))
    for info in state.filtered:
        offset, code = base.get((info.topic, info.index), (-1, info.error_code))
        first, last = produce_offsets(offset if info.forwarded else None, info.records_out)
        ctx.telemetry.record_batch(
            client,
            api="produce",
            topic=info.topic,
            partition=info.index,
            offset_first=first,
            offset_last=last,
            records_in=info.records_in,
            records_out=info.records_out if info.forwarded else 0,
            bytes_in=info.bytes_in,
            bytes_out=info.bytes_out,
            stats=info.stats,
            error_code=info.error_code or code,
            error_message=info.error_message,
            record_errors=info.record_errors,
            dead_letters=info.dead_letters,
        )


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
    cls = entities.response_class(ApiKey.PRODUCE, header.api_version)
    empty = entities.build(cls, responses=())
    body = encode_response(_merge_local(empty, local))
    return response_header_bytes(header.correlation_id, header.api_key, header.api_version) + body
