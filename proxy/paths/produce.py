"""Produce requests to filtered topics.

The request is decoded only when some filter acts on produce. Each partition of a filtered
topic goes through the chain (sluice.filters.pipeline); partitions that survive are forwarded
(re-encoded only if something changed), partitions that were refused or entirely dropped are
answered by the proxy, and the two are merged into one response in the client's version.
A Produce the proxy cannot decode never reaches the broker: the connection is closed.

Filters run in the filter thread pool (`Job`); the request is forwarded when they are done, and
later requests of the connection wait behind it, so the broker sees them in order. When every
filter the request meets keeps no state between calls (`LoadedFilter.concurrent`), its job
may overlap those of the connection's next Produce requests (`Job.overlap`,
`proxy.spread_produce`): librdkafka keeps up to five in flight, and with one partition each is
one job, so pipelined requests are filtered on the pool's threads side by side, each on a
filter instance of its own, while the connection still forwards them in order. Topic ids
the proxy has not seen yet (Produce v13+) are looked up first (`topics.py`).
"""

from __future__ import annotations

import dataclasses
import functools
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from sluice.codec import entities
from sluice.codec.batch_counts import count_records
from sluice.codec.batch_limits import DEFAULT_BATCH_LIMITS, BatchLimits
from sluice.codec.error_codes import ErrorCode
from sluice.codec.errors import CodecError
from sluice.codec.headers import RequestHeader, response_header_bytes, response_header_size
from sluice.codec.messages import ApiKey, encode_response
from sluice.codec.produce_offsets import produce_response_tagged, scan_produce_offsets
from sluice.codec.produce_splice import (
    ProduceRequestLayout,
    splice_produce_pieces,
)
from sluice.filters.chain import DeadLetter, FilterChain, FilterStats
from sluice.filters.context import RecordContext
from sluice.filters.pipeline import filter_produce
from sluice.proxy.contract import ClientInfo
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
    cost_follows_size,
    inline_key,
    job_size,
    with_topic_ids,
)
from sluice.proxy.telemetry.events import produce_offsets

if TYPE_CHECKING:
    from sluice.proxy.telemetry.recorder import TelemetryRecorder

_new = object.__new__  # an outcome made without its dataclass __init__ (`on_request`)

#: Record errors one partition's answer lists: Kafka lists every failed record, which for a
#: batch of 100 000 records that all fail is megabytes of answer; past these the partition's
#: error message counts them.
MAX_ANSWERED_RECORD_ERRORS = 100


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
        chain = ctx.chain
        if chain is None or "produce" not in ctx.directions:  # ctx.filters_on, inline
            kept = exchange.parsed
            if kept is not None and kept[0] is frame:
                # Read already (the internal-topics path): `Exchange.produce_acks`' first
                # case, written out, as this runs on every unfiltered Produce; the `Forward`
                # made without its __init__'s frame (every field set here).
                forward = _new(Forward)
                forward.frame = forward.state = forward.pin = None
                forward.expect_response = kept[1].acks != 0
                return forward
            try:
                acks = exchange.produce_acks(frame)
            except CodecError as exc:
                return Refuse(f"malformed Produce request: {exc}")
            return Forward(expect_response=acks != 0)
        try:
            # Only the layout: where each partition's records are. The request is never
            # decoded into entities nor re-encoded; changed records are spliced in.
            layout = exchange.produce_layout(frame)
        except CodecError as exc:
            # Fail closed: an undecodable Produce could carry records for a filtered topic.
            return Refuse(f"cannot decode Produce v{header.api_version}: {exc}")
        topics = layout.topics
        if len(topics) == 1 and topics[0].name:
            # One topic, named (every request before v13): no id to look up, and four calls
            # fewer per filtered request (issue 29).
            return self._filter(ctx, exchange, frame, layout)
        return with_topic_ids(
            ctx, topics, lambda: self._filter(ctx, exchange, frame, layout)
        )

    def _filter(
        self, ctx: PathContext, exchange: Exchange, frame: Frame, layout: ProduceRequestLayout
    ) -> RequestOutcome:
        chain = ctx.chain
        assert chain is not None
        client = exchange.client
        names = [t.name or ctx.topics.name(t.topic_id) for t in layout.topics]
        applied, key, scales, concurrent = _kind(chain, names, client.principal)
        if not any(applied) and all(n is not None for n in names):
            return Forward(expect_response=layout.acks != 0)
        limits = ctx.batch_limits
        topics = layout.topics
        # `applied` has an entry per topic (`_kind`, from these names): zip without strict=,
        # whose keyword costs ~0.5 µs a request; one topic's partitions without the zip.
        filtered = (
            (part.records for part in topics[0].partitions) if len(topics) == 1 and applied[0]
            else (part.records for topic, on in zip(topics, applied) if on  # noqa: B905
                  for part in topic.partitions)
        )
        return Defer(
            Job(
                run=lambda: _filter_request(
                    chain, layout, names, applied, client.client_id, client.principal, limits
                ),
                finish=lambda result: self._forward(ctx, exchange, frame, layout, result),
                what="produce filters",
                inline_key=key,
                scales=scales,
                size=job_size(len(frame), filtered),
                overlap=concurrent and ctx.overlap_produce,
            )
        )

    def _forward(
        self,
        ctx: PathContext,
        exchange: Exchange,
        frame: Frame,
        layout: ProduceRequestLayout,
        result: _FilteredRequest,
    ) -> RequestOutcome:
        header = exchange.header
        for letters in result.dead_letters:
            exchange.dead_letters(letters)
        expect = layout.acks != 0
        state = ProduceState(result.local, result.filtered)
        if not result.replaced and not result.drop:
            if not expect:
                _emit(exchange, state, None)
            return Forward(expect_response=expect, state=state, pin=self if expect else None)
        # (No drop: `replaced` is not empty, so some partition stays.)
        if result.drop and len(result.drop) >= sum(len(t.partitions) for t in layout.topics):
            _emit(exchange, state, None)
            if not expect:
                return NoReply()
            return Answer(local_response(header, result.local))
        view = memoryview(frame)
        # Pieces, written with one writev: the new batches are not copied into a new frame.
        new_frame = tuple(splice_produce_pieces(
            view[header.header_size :], layout, result.replaced, result.drop,
            prefix=view[: header.header_size],
        ))
        if not expect:
            _emit(exchange, state, None)
        return Forward(
            frame=new_frame,
            expect_response=expect,
            state=state,
            pin=self if expect else None,
        )

    def on_response(self, ctx: PathContext, exchange: Exchange, frame: Frame) -> Respond:
        state: ProduceState = exchange.state
        header = exchange.header
        version = header.api_version
        if not state.local and not produce_response_tagged(
                version, frame, 5 if version >= 9 and len(frame) > 4 and frame[4] == 0
                else response_header_size(frame, header.api_key, version)):
            # Nothing to merge and no endpoint to rewrite (the walk the pass-through check
            # makes, one byte comparison per error-free partition, which also proves the body
            # well formed; the response header every client sends stepped over inline): the
            # response is relayed as it came.
            # Telemetry's base offsets are scanned out of it only if an event is built: with
            # telemetry off (the metrics alone), not at all (issue 29).
            _emit(exchange, state, functools.partial(_scanned_offsets, ctx, header, frame))
            return Respond(frame)

        def change(response: Any) -> Any:
            _emit(exchange, state, _base_offsets(ctx, response))
            return merge_local(response, state.local) if state.local else response

        # A body the check above could not prove well formed is decoded in full (Refused
        # when it cannot be).
        return Respond(responses.transform(header, frame, ctx.node_address, change))

    def on_unanswered(self, ctx: PathContext, exchange: Exchange, reason: str) -> None:
        """The broker went away before answering: the audit shows these batches as lost."""
        state: ProduceState | None = exchange.state
        if state is None:
            return
        for info in state.filtered:
            if info.forwarded:
                info.error_code = ErrorCode.NETWORK_EXCEPTION
                info.error_message = f"sluice: {reason} before answering; outcome unknown"
        _emit(exchange, state, None)


#: Requests' topic lists remembered per chain (`_kind`): a client names few, but names are
#: the client's to choose, so the table is bounded, and so is what one entry keeps: a request
#: naming more topics, or longer names, is worked out again each time (its cost follows its
#: size anyway) rather than pinning a frame's worth of names for the chain's life.
_KINDS_LIMIT = 4096
_KINDS_MAX_TOPICS = 16
_KINDS_MAX_CHARS = 1024


def _kind(
    chain: FilterChain, names: list[str | None], principal: str | None
) -> tuple[tuple[bool, ...], str | None, bool, bool]:
    """For a request naming `names` (None: a topic id not known): whether a filter applies to
    each topic (the thread and the pipeline reuse it), the job's `inline_key` and `scales`,
    and whether every filter it meets may run on several threads at once (its job may then
    overlap others: `Job.overlap`). Derived from the chain's bindings alone, so remembered
    with the chain."""
    kinds = chain.memo.get("produce")
    if kinds is None:
        kinds = chain.memo["produce"] = {}
    key = (tuple(names), principal)
    hit: tuple[tuple[bool, ...], str | None, bool, bool] | None = kinds.get(key)
    if hit is None:
        hit = (
            tuple(n is not None and chain.applies(n, "produce", principal) for n in names),
            inline_key(chain, "produce", names, principal),
            cost_follows_size(chain, "produce", names, principal),
            all(
                f.concurrent("produce") for n in names if n is not None
                for f in chain.filters_for(n, "produce", principal)
            ),
        )
        if len(names) <= _KINDS_MAX_TOPICS and sum(
                len(n) for n in names if n is not None) <= _KINDS_MAX_CHARS:
            if len(kinds) >= _KINDS_LIMIT:
                kinds.clear()
            kinds[key] = hit
    return hit


@dataclass(slots=True)
class _FilteredRequest:
    """What the filter thread found for one Produce request (applied on the loop).

    Partitions are named by position in the request, (topic i, partition j), as the splice
    takes them."""

    local: list[LocalAnswer]
    filtered: list[FilteredPartition]
    replaced: dict[tuple[int, int], bytes | bytearray]
    drop: set[tuple[int, int]]
    dead_letters: list[list[DeadLetter]]


def _filter_request(
    chain: FilterChain,
    layout: ProduceRequestLayout,
    names: list[str | None],
    applied: Sequence[bool],
    client_id: str | None,
    principal: str | None,
    limits: BatchLimits = DEFAULT_BATCH_LIMITS,
) -> _FilteredRequest:
    """Runs in the filter thread pool: every partition of a filtered topic through the chain,
    each batch within `limits`. Touches no loop-owned state; returns what the loop applies."""
    result = _FilteredRequest([], [], {}, set(), [])
    for i, topic in enumerate(layout.topics):
        name = names[i]
        if name is None:
            # A topic id the cluster does not know either: we cannot tell whether a filter
            # applies, so its records do not pass.
            for j, part in enumerate(topic.partitions):
                result.drop.add((i, j))
                result.local.append(
                    LocalAnswer(
                        None,
                        topic.topic_id,
                        part.partition,
                        ErrorCode.UNKNOWN_TOPIC_ID,
                        "topic id unknown to the proxy; refresh metadata",
                    )
                )
            continue
        if not applied[i]:
            continue
        for j, part in enumerate(topic.partitions):
            records = part.records if part.records is not None else b""
            ctx = RecordContext(name, part.partition, "produce", client_id, principal)
            outcome = filter_produce(chain, ctx, records, limits=limits, checked=True)
            if outcome.dead_letters:
                result.dead_letters.append(outcome.dead_letters)
            records_in = outcome.records_in
            if records_in < 0:
                records_in = count_records(records)
            # Positional: a slots dataclass's __init__ takes keywords ~0.2 µs slower.
            info = FilteredPartition(
                name, part.partition, records_in, 0, len(records), 0, outcome.stats,
                outcome.error_code, outcome.error_message, list(outcome.record_errors),
                len(outcome.dead_letters),
            )
            result.filtered.append(info)
            if outcome.records is None:
                info.forwarded = False
                result.drop.add((i, j))
                result.local.append(
                    LocalAnswer(
                        name,
                        topic.topic_id,
                        part.partition,
                        outcome.error_code,
                        outcome.error_message,
                        # The partition's message counts the rest ("and N more record errors").
                        outcome.record_errors[:MAX_ANSWERED_RECORD_ERRORS],
                    )
                )
                continue
            info.bytes_out = len(outcome.records)
            if not outcome.changed:
                info.records_out = records_in
            elif outcome.records_out >= 0:
                info.records_out = outcome.records_out
            else:
                info.records_out = count_records(outcome.records)
            if outcome.changed:
                new = outcome.records
                # A view may be of a buffer the thread reuses; a batch built here is ours.
                result.replaced[(i, j)] = new if isinstance(new, (bytes, bytearray)) else bytes(new)
    return result


def _topic_name(ctx: PathContext, topic: str | uuid.UUID) -> str:
    """A response's topic key as a name (v13+ responses name topics by id)."""
    if isinstance(topic, str):
        return topic
    return ctx.topics.name(topic) or ""


def _scanned_offsets(ctx: PathContext, header: RequestHeader,
                     frame: Frame) -> dict[tuple[str, int], tuple[int, int]]:
    """(topic, partition) -> (base offset, error code) scanned out of a Produce response
    that `may_carry_endpoints` proved well formed (empty should the scan refuse it anyway)."""
    try:
        size = response_header_size(frame, header.api_key, header.api_version)
        scanned = scan_produce_offsets(header.api_version, frame[size:])
    except CodecError:
        return {}
    return {(_topic_name(ctx, t.topic), t.partition): (t.base_offset, t.error_code)
            for t in scanned}


def _base_offsets(ctx: PathContext, response: Any) -> dict[tuple[str, int], tuple[int, int]]:
    """(topic, partition) -> (base offset, error code) of a decoded Produce response."""
    base: dict[tuple[str, int], tuple[int, int]] = {}
    for t in response.responses:
        name = getattr(t, "name", None) or ctx.topics.name(getattr(t, "topic_id", None))
        for p in t.partition_responses:
            base[(name or "", int(p.index))] = (int(p.base_offset), int(p.error_code))
    return base


#: The broker's base offsets for `_emit`: none (no response came), or (topic, partition) ->
#: (base offset, error code), or what works that out when an event needs it.
BaseOffsets = (dict[tuple[str, int], tuple[int, int]]
               | Callable[[], dict[tuple[str, int], tuple[int, int]]] | None)


_NO_OFFSETS: dict[tuple[str, int], tuple[int, int]] = {}  # never written


class _Once:
    """The base offsets, worked out at most once for the events of all the partitions."""

    __slots__ = ("_base", "_done")

    def __init__(self, base: BaseOffsets) -> None:
        self._base = base
        self._done: dict[tuple[str, int], tuple[int, int]] | None = None

    def get(self) -> dict[tuple[str, int], tuple[int, int]]:
        done = self._done
        if done is None:
            base = self._base
            done = self._done = (base() if callable(base) else base) or {}
        return done


def _emit(exchange: Exchange, state: ProduceState, base: BaseOffsets) -> None:
    """One record_batch event per filtered partition, with the broker's base offsets.

    What the event needs is taken now; the event itself is built when the I/O layer performs
    the call, and only if telemetry is on (with it off, a one-record masked Produce spent
    ~10 µs building an event nobody read, issue 29), and so are the base offsets."""
    client = exchange.client
    filtered = state.filtered
    # One partition (nearly every request): its one event works the offsets out itself.
    once: _Once | BaseOffsets = (
        _NO_OFFSETS if base is None else base if isinstance(base, dict) or len(filtered) == 1
        else _Once(base))
    for info in filtered:
        exchange.emit(functools.partial(_record_batch, client, info, once))


def _record_batch(client: ClientInfo, info: FilteredPartition, base: _Once | BaseOffsets,
                  recorder: TelemetryRecorder) -> None:
    """The event `_emit` asked for (the I/O layer passes `recorder` last)."""
    if recorder.stats_only(info.stats):
        return
    offsets = (base.get() if isinstance(base, _Once)
               else (base() if callable(base) else base) or _NO_OFFSETS)
    offset, code = offsets.get((info.topic, info.index), (-1, info.error_code))
    records_out = info.records_out if info.forwarded else 0
    first, last = produce_offsets(offset if info.forwarded else None, info.records_out)
    recorder.record_batch(
        client,
        api="produce",
        topic=info.topic,
        partition=info.index,
        offset_first=first,
        offset_last=last,
        records_in=info.records_in,
        records_out=records_out,
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


def merge_local(response: Any, local: list[LocalAnswer]) -> Any:
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


def local_response(header: RequestHeader, local: list[LocalAnswer]) -> bytes:
    cls = entities.response_class(ApiKey.PRODUCE, header.api_version)
    empty = entities.build(cls, responses=())
    body = encode_response(merge_local(empty, local))
    return response_header_bytes(header.correlation_id, header.api_key, header.api_version) + body
