"""The fetch path: filter the records of Fetch responses before the consumer sees them.

Decoded only while a fetch filter is in force; which chain applies is decided when the response
arrives (and checked again when it is sent: see `net/connection.py`), never when the request
was forwarded, so a long-polling Fetch in flight across a reload meets the new filters.

Only partitions of topics with fetch filters are touched; batch boundaries, base offsets, last
offset deltas, control batches and a truncated trailing batch survive (sluice.filters.pipeline).
A filter failure is reported on that partition, never as a top-level error (consumers treat a
top-level error like an empty topic and loop quietly). Filters run in the filter thread pool;
telemetry is emitted when the response is sent.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from sluice.codec.batch_counts import count_records, offset_range
from sluice.codec.batch_limits import DEFAULT_BATCH_LIMITS, BatchLimits
from sluice.codec.endpoints import rewrite_endpoints
from sluice.codec.error_codes import ErrorCode
from sluice.codec.messages import ApiKey
from sluice.filters.chain import DeadLetter, FilterChain
from sluice.filters.context import RecordContext
from sluice.filters.pipeline import filter_fetch
from sluice.proxy.paths import responses
from sluice.proxy.paths.base import (
    Defer,
    Exchange,
    Frame,
    Job,
    PathContext,
    RequestOutcome,
    Respond,
    ResponseOutcome,
    inline_key,
    job_size,
)


@dataclass(slots=True)
class _FilteredResponse:
    response: Any  # the decoded response, filtered (the same object when nothing changed)
    batches: list[dict[str, Any]]  # record_batch telemetry fields per filtered partition
    dead_letters: list[list[DeadLetter]]


class FetchPath:
    name = "fetch"
    api_keys = frozenset({int(ApiKey.FETCH)})

    def wants_request(self, ctx: PathContext, api_key: int) -> bool:
        return False

    def wants_response(self, ctx: PathContext, api_key: int, version: int) -> bool:
        return ctx.filters_on("fetch")

    def on_request(self, ctx: PathContext, exchange: Exchange, frame: Frame) -> RequestOutcome:
        raise AssertionError("the fetch path handles no request")

    def on_response(self, ctx: PathContext, exchange: Exchange, frame: Frame) -> ResponseOutcome:
        size, response = responses.decode(exchange.header, frame)
        unknown = ctx.topics.unknown(
            getattr(t, "topic_id", None)
            for t in response.responses
            if not getattr(t, "topic", None)
        )
        if unknown:
            return Defer(
                Job(
                    run=lambda: ctx.topics.refresh(ctx.open_upstream),
                    finish=lambda _: self._filter(ctx, exchange, frame, size, response),
                    in_thread=False,
                    what="topic id look-up",
                )
            )
        return self._filter(ctx, exchange, frame, size, response)

    def _filter(
        self, ctx: PathContext, exchange: Exchange, frame: Frame, size: int, response: Any
    ) -> ResponseOutcome:
        chain = ctx.chain
        client = exchange.client
        names = {
            id(t): getattr(t, "topic", None) or ctx.topics.name(getattr(t, "topic_id", None))
            for t in response.responses
        }
        if chain is None or (
            all(n is not None for n in names.values())
            and not any(chain.applies(n, "fetch", client.principal) for n in names.values() if n)
        ):
            unfiltered = _FilteredResponse(response, [], [])
            return self._respond(ctx, exchange, frame, size, response, unfiltered)
        limits = ctx.batch_limits
        filtered = (
            part.records
            for t in response.responses
            if (name := names[id(t)]) is not None and chain.applies(name, "fetch", client.principal)
            for part in t.partitions
        )
        return Defer(
            Job(
                run=lambda: _filter_response(
                    chain, response, names, client.client_id, client.principal, limits
                ),
                finish=lambda result: self._respond(ctx, exchange, frame, size, response, result),
                what="fetch filters",
                inline_key=inline_key(chain, "fetch", list(names.values()), client.principal),
                size=job_size(len(frame), filtered),
            )
        )

    def _respond(
        self,
        ctx: PathContext,
        exchange: Exchange,
        frame: Frame,
        size: int,
        original: Any,
        result: _FilteredResponse,
    ) -> Respond:
        for letters in result.dead_letters:
            ctx.dead_letters.submit(letters)
        hdr = exchange.header
        final = rewrite_endpoints(result.response, hdr.api_key, hdr.api_version, ctx.map_endpoint)
        out = frame if final is original else responses.encode(frame, size, final)
        client = exchange.client

        def sent() -> None:
            for fields in result.batches:
                ctx.telemetry.record_batch(client, api="fetch", **fields)

        return Respond(out, sent if result.batches else None)


def _filter_response(
    chain: FilterChain,
    response: Any,
    names: dict[int, str | None],
    client_id: str | None,
    principal: str | None,
    limits: BatchLimits = DEFAULT_BATCH_LIMITS,
) -> _FilteredResponse:
    """Runs in the filter thread pool (each batch within `limits`); touches no loop-owned
    state."""
    topics = []
    changed = False
    batches: list[dict[str, Any]] = []
    dead: list[list[DeadLetter]] = []
    for topic in response.responses:
        name = names[id(topic)]
        if name is None:
            # A topic id the cluster does not know either: it may be filtered, so its
            # records must not pass.
            changed = True
            topic = dataclasses.replace(
                topic,
                partitions=tuple(
                    dataclasses.replace(
                        p, records=None, error_code=type(p.error_code)(ErrorCode.UNKNOWN_TOPIC_ID)
                    )
                    for p in topic.partitions
                ),
            )
            topics.append(topic)
            continue
        if not chain.applies(name, "fetch", principal):
            topics.append(topic)
            continue
        parts = []
        for part in topic.partitions:
            records = part.records
            if not records:
                parts.append(part)
                continue
            ctx = RecordContext(name, int(part.partition_index), "fetch", client_id, principal)
            outcome = filter_fetch(chain, ctx, records, limits=limits)
            if outcome.dead_letters:
                dead.append(outcome.dead_letters)
            if outcome.error_code:
                changed = True
                part = dataclasses.replace(
                    part, records=None, error_code=type(part.error_code)(outcome.error_code)
                )
            elif outcome.changed:
                changed = True
                part = dataclasses.replace(part, records=bytes(outcome.records))
            first, last = offset_range(records)
            records_in = count_records(records)
            batches.append(
                {
                    "topic": name,
                    "partition": int(part.partition_index),
                    "offset_first": first,
                    "offset_last": last,
                    "records_in": records_in,
                    "records_out": count_records(part.records) if outcome.changed else records_in,
                    "bytes_in": len(records),
                    "bytes_out": len(part.records or b""),
                    "stats": outcome.stats,
                    "error_code": outcome.error_code,
                    "error_message": outcome.error_message,
                    "record_errors": outcome.record_errors,
                    "dead_letters": len(outcome.dead_letters),
                }
            )
            parts.append(part)
        topics.append(dataclasses.replace(topic, partitions=tuple(parts)))
    if not changed:
        return _FilteredResponse(response, batches, dead)
    return _FilteredResponse(dataclasses.replace(response, responses=tuple(topics)), batches, dead)
