"""The fetch path: filter the records of Fetch responses before the consumer sees them.

Looked at only while a fetch filter is in force; which chain applies is decided when the response
arrives (and checked again when it is sent: see `net/connection.py`), never when the request
was forwarded, so a long-polling Fetch in flight across a reload meets the new filters.

Only partitions of topics with fetch filters are touched; batch boundaries, base offsets, last
offset deltas, control batches and a truncated trailing batch survive (sluice.filters.pipeline).
A filter failure is reported on that partition, never as a top-level error (consumers treat a
top-level error like an empty topic and loop quietly). Filters run in the filter thread pool;
telemetry is emitted when the response is sent. A large response's partitions, and runs of
consecutive batches of one large partition, may be filtered on several of the pool's threads at
once when their filters keep no state between calls (`filters/parallel.py`,
`pipeline.plan_fetch`); their results are joined and spliced in order, as a serial pass would.

While a fetch filter is in force, a Fetch request asking for more than
`proxy.filtered_fetch_max_bytes` is forwarded asking for that much (`on_request`; only its
max_bytes changes, and a min_bytes above it, `codec/fetch_request.py`), so that responses
stay small enough to be filtered while the consumer still reads the one before. A connection's
first Fetch asks for at most 1 MiB, each later one for twice the one before up to the setting
(`ramp_cap`), so that a new consumer's first records are not held for a whole large pass.

The response is scanned, not decoded (`sluice.codec.fetch_splice`): the filters get the records
of the filtered topics' partitions as views of the broker's frame, and their output is spliced
into that frame as pieces the connection writes in order (never joined into one buffer), so
other topics pass as the broker's bytes and nothing is re-encoded or copied.
kio decodes the response instead (the reference path) when the scan refuses it or when it
carries KIP-951 node endpoints (broker addresses the address rewrite must see).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from sluice.codec.batch_counts import count_records, offset_range
from sluice.codec.batch_limits import DEFAULT_BATCH_LIMITS, BatchLimits
from sluice.codec.endpoints import rewrite_endpoints
from sluice.codec.error_codes import ErrorCode
from sluice.codec.errors import CodecError
from sluice.codec.fetch_request import cap_fetch_max_bytes
from sluice.codec.fetch_splice import FetchResponseLayout, scan_fetch_response, splice_fetch_pieces
from sluice.codec.headers import response_header_size
from sluice.codec.messages import ApiKey
from sluice.filters import blocking
from sluice.filters.chain import DeadLetter, FilterChain
from sluice.filters.context import RecordContext
from sluice.filters.parallel import Helpers, map_ordered
from sluice.filters.pipeline import (
    FetchOutcome,
    filter_fetch,
    finish_fetch,
    plan_fetch,
    run_fetch,
)
from sluice.proxy.contract import ClientInfo
from sluice.proxy.paths import responses
from sluice.proxy.paths.base import (
    Defer,
    Exchange,
    Forward,
    Frame,
    Job,
    PathContext,
    Pieces,
    RequestOutcome,
    Respond,
    ResponseOutcome,
    TelemetryCall,
    cost_follows_size,
    inline_key,
    job_size,
    with_topic_ids,
)

if TYPE_CHECKING:
    from sluice.proxy.telemetry.recorder import TelemetryRecorder


@dataclass(slots=True)
class _Spliced:
    # The response to send: the broker's frame when nothing changed, else its pieces
    # (`Pieces`, written with one writev: joined, they were a copy of the whole response).
    frame: Frame | Pieces
    batches: list[dict[str, Any]]  # record_batch telemetry fields per filtered partition
    dead_letters: list[list[DeadLetter]]
    spread: bool = False  # partitions were filtered on several threads at once


@dataclass(slots=True)
class _FilteredResponse:
    response: Any  # the decoded response, filtered (the same object when nothing changed)
    batches: list[dict[str, Any]]  # record_batch telemetry fields per filtered partition
    dead_letters: list[list[DeadLetter]]


#: The cap of a connection's first Fetch under a fetch filter; each later Fetch may ask for
#: twice the one before, up to `proxy.filtered_fetch_max_bytes`.
RAMP_FIRST_BYTES = 1 << 20
#: Doublings after which the ramp is above any setting (1 MiB << 11 = 2 GiB > an int32).
_RAMP_STEPS = 11


def ramp_cap(cap: int, sent: int) -> int:
    """What a connection's Fetch may ask for when `sent` Fetch requests went before it on
    that connection under a fetch filter: a new consumer with a backlog waits for the
    filter pass of its first response before it has any record (8 MiB: ~36 000 records,
    tens of ms), so its first responses are smaller and it reads one while the next is
    filtered."""
    return min(cap, RAMP_FIRST_BYTES << min(sent, _RAMP_STEPS))


class FetchPath:
    name = "fetch"
    api_keys = frozenset({int(ApiKey.FETCH)})

    def wants_request(self, ctx: PathContext, api_key: int) -> bool:
        return ctx.fetch_max_bytes > 0 and ctx.filters_on("fetch")

    def wants_response(self, ctx: PathContext, api_key: int, version: int) -> bool:
        return ctx.filters_on("fetch")

    def on_request(self, ctx: PathContext, exchange: Exchange, frame: Frame) -> RequestOutcome:
        """While a fetch filter is in force, a Fetch request asks the broker for at most
        `proxy.filtered_fetch_max_bytes` (`PathContext.fetch_max_bytes`): a consumer keeps one
        Fetch in flight per broker and reads nothing of a response until the proxy has
        filtered all of it, so a smaller response is filtered while the consumer still works
        through the one before (docs/PERFORMANCE.md, *Why filtered fetch lags most*)."""
        hdr = exchange.header
        client = exchange.client
        sent = client.capped_fetches
        client.capped_fetches = sent + 1
        capped = cap_fetch_max_bytes(frame, hdr.header_size, hdr.api_version,
                                     ramp_cap(ctx.fetch_max_bytes, sent))
        return Forward() if capped is None else Forward(capped)

    def on_response(self, ctx: PathContext, exchange: Exchange, frame: Frame) -> ResponseOutcome:
        hdr = exchange.header
        try:
            size = response_header_size(frame, hdr.api_key, hdr.api_version)
            layout: FetchResponseLayout | None = scan_fetch_response(hdr.api_version, frame, size)
        except CodecError:
            layout = None  # kio's decode decides (and refuses what it cannot read)
        if layout is None or layout.endpoints:
            return self._on_decoded(ctx, exchange, frame)
        scanned = layout
        return with_topic_ids(
            ctx, layout.topics, lambda: self._filter_scanned(ctx, exchange, frame, scanned)
        )

    def _filter_scanned(
        self, ctx: PathContext, exchange: Exchange, frame: Frame, layout: FetchResponseLayout
    ) -> ResponseOutcome:
        chain = ctx.chain
        if chain is None:
            return Respond(frame)
        client = exchange.client
        principal = client.principal
        names = [
            # An empty name counts as unknown, as on the kio path.
            t.name or ctx.topics.name(t.topic_id)
            for t in layout.topics
        ]
        # Whether a filter applies, asked once per topic (the thread and the pipeline reuse it).
        applied = [n is not None and chain.applies(n, "fetch", principal) for n in names]
        filtered = [
            p.records for t, on in zip(layout.topics, applied, strict=True) if on
            for p in t.partitions
        ]
        if all(n is not None for n in names) and not any(filtered):
            # No records a filter would see (an empty long-poll answer, or no filtered topic).
            return Respond(frame)
        limits = ctx.batch_limits
        helpers = ctx.helpers
        return Defer(
            Job(
                run=lambda: _filter_scanned(
                    chain, frame, layout, names, applied, client.client_id, principal, limits,
                    helpers,
                ),
                finish=lambda result: self._respond_spliced(ctx, exchange, result),
                what="fetch filters",
                inline_key=inline_key(chain, "fetch", names, principal),
                scales=cost_follows_size(chain, "fetch", names, principal),
                size=job_size(len(frame), filtered),
            )
        )

    def _respond_spliced(self, ctx: PathContext, exchange: Exchange, result: _Spliced) -> Respond:
        if result.spread:
            ctx.metrics.fetch_spread += 1
        for letters in result.dead_letters:
            exchange.dead_letters(letters)
        return Respond(result.frame, _sent(exchange.client, result.batches))

    def _on_decoded(self, ctx: PathContext, exchange: Exchange, frame: Frame) -> ResponseOutcome:
        """The reference path: kio decodes the whole response (and rewrites its endpoints)."""
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
        applied = {
            key: n is not None and chain.applies(n, "fetch", client.principal)
            for key, n in names.items()
        } if chain is not None else {}
        if chain is None or (
            all(n is not None for n in names.values()) and not any(applied.values())
        ):
            unfiltered = _FilteredResponse(response, [], [])
            return self._respond(ctx, exchange, frame, size, response, unfiltered)
        limits = ctx.batch_limits
        filtered = (
            part.records for t in response.responses if applied[id(t)] for part in t.partitions
        )
        return Defer(
            Job(
                run=lambda: _filter_response(
                    chain, response, names, applied, client.client_id, client.principal, limits
                ),
                finish=lambda result: self._respond(ctx, exchange, frame, size, response, result),
                what="fetch filters",
                inline_key=inline_key(chain, "fetch", list(names.values()), client.principal),
                scales=cost_follows_size(
                    chain, "fetch", list(names.values()), client.principal
                ),
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
        hdr = exchange.header
        # Before the effects: a node not learnt yet raises here, and the call is made again.
        final = rewrite_endpoints(result.response, hdr.api_key, hdr.api_version, ctx.node_address)
        for letters in result.dead_letters:
            exchange.dead_letters(letters)
        out = frame if final is original else responses.encode(frame, size, final)
        return Respond(out, _sent(exchange.client, result.batches))


def _sent(client: ClientInfo, batches: list[dict[str, Any]]) -> TelemetryCall | None:
    """The `on_sent` of a filtered Fetch response: its record_batch events."""
    if not batches:
        return None

    def sent(recorder: TelemetryRecorder) -> None:
        for fields in batches:
            recorder.record_batch(client, api="fetch", **fields)

    return sent


def _batch_fields(name: str, part: int, records: Any, outcome: FetchOutcome,
                  out: Any) -> dict[str, Any]:
    """The record_batch telemetry of one filtered partition (`out`: its records as sent, None
    for a null field, else `outcome`'s): counts and offsets from the pipeline's split of the
    batches when it made one."""
    first, last = outcome.offsets if outcome.offsets is not None else offset_range(records)
    records_in = outcome.records_in if outcome.records_in >= 0 else count_records(records)
    if not outcome.changed:
        records_out = records_in
    elif out is None:
        records_out = 0
    else:
        records_out = (outcome.records_out if outcome.records_out >= 0
                       else count_records(outcome.records))
    return {
        "topic": name,
        "partition": part,
        "offset_first": first,
        "offset_last": last,
        "records_in": records_in,
        "records_out": records_out,
        "bytes_in": len(records),
        "bytes_out": 0 if out is None else outcome.size,
        "stats": outcome.stats,
        "error_code": outcome.error_code,
        "error_message": outcome.error_message,
        "record_errors": outcome.record_errors,
        "dead_letters": len(outcome.dead_letters),
    }


#: Below this many bytes of filtered records a response is filtered on one thread: handing
#: partitions to another thread costs a wake-up and ~30 µs of CPU.
SPREAD_MIN_BYTES = 64 * 1024
#: Runs of batches (`pipeline.plan_fetch`) per filter thread that a spread response is cut
#: into at least: more than one, so that a thread that starts late or runs slow (a loaded
#: machine) leaves its share to the others; taking a run costs a lock, not a wake-up (the
#: helpers stay on the queue until it is empty).
RUNS_PER_THREAD = 4
#: A spread partition is cut into runs of about this many bytes at most (whole batches, none
#: under `pipeline.RUN_MIN_BYTES`): the pass ends when its last run does, so a run is what one
#: thread may still be working on while the other waits. Cut by share alone, the benchmark's
#: lz4 responses (3-14 MB, 2-4 MB a partition, ~100 ms of filtering a partition on the loaded
#: machine) left one thread idle for 10-80 ms at each response's end.
RUN_TARGET_BYTES = 256 * 1024


@dataclass(frozen=True, slots=True)
class _Part:
    """One filtered partition of a scanned response: where it is and what to filter."""

    topic: int
    index: int
    name: str
    partition: int
    blob: Any


def _filter_scanned(
    chain: FilterChain,
    frame: Frame,
    layout: FetchResponseLayout,
    names: list[str | None],
    applied: list[bool],
    client_id: str | None,
    principal: str | None,
    limits: BatchLimits = DEFAULT_BATCH_LIMITS,
    helpers: Helpers | None = None,
) -> _Spliced:
    """Runs in the filter thread pool (each batch within `limits`): filters the partitions of
    the filtered topics and splices their new records and error codes into the frame.

    With `helpers`, partitions (and runs of one partition's batches) run on several pool
    threads at once when every filter they meet may (`LoadedFilter.concurrent`) and there is
    enough to share; the results are taken in order either way, so frame, telemetry, dead
    letters and failure counts are the serial pass's."""
    records: dict[tuple[int, int], Any] = {}
    errors: dict[tuple[int, int], int] = {}
    batches: list[dict[str, Any]] = []
    dead: list[list[DeadLetter]] = []
    parts: list[_Part] = []
    for i, (topic, name) in enumerate(zip(layout.topics, names, strict=True)):
        if name is None:
            # A topic id the cluster does not know either: it may be filtered, so its
            # records must not pass.
            for j in range(len(topic.partitions)):
                records[(i, j)] = None
                errors[(i, j)] = ErrorCode.UNKNOWN_TOPIC_ID
            continue
        if not applied[i]:
            continue
        parts.extend(
            _Part(i, j, name, part.partition, part.records)
            for j, part in enumerate(topic.partitions) if part.records
        )

    spread = helpers if _may_spread(chain, parts, principal) else None
    if spread is None:
        outcomes = [
            filter_fetch(chain, RecordContext(p.name, p.partition, "fetch", client_id,
                                              principal), p.blob, limits=limits, checked=True)
            for p in parts
        ]
        spread_out = False
    else:
        outcomes, spread_out = _filter_spread(chain, parts, client_id, principal, limits,
                                              spread)
    for p, outcome in zip(parts, outcomes, strict=True):
        if outcome.dead_letters:
            dead.append(outcome.dead_letters)
        out: Any = p.blob
        if outcome.error_code:
            out = records[(p.topic, p.index)] = None
            errors[(p.topic, p.index)] = outcome.error_code
        elif outcome.changed:
            # The pieces as built: pieces of the response too (`splice_fetch_pieces`).
            out = records[(p.topic, p.index)] = outcome.pieces
        batches.append(_batch_fields(p.name, p.partition, p.blob, outcome, out))
    if not records and not errors:
        return _Spliced(frame, batches, dead, spread_out)
    return _Spliced(splice_fetch_pieces(frame, layout, records, errors), batches, dead,
                    spread_out)


def _filter_spread(chain: FilterChain, parts: list[_Part], client_id: str | None,
                   principal: str | None, limits: BatchLimits,
                   helpers: Helpers) -> tuple[list[FetchOutcome], bool]:
    """The partitions' outcomes, filtered on several pool threads at once, and whether they
    were. The work is shared out in runs of consecutive batches (`pipeline.plan_fetch`): a
    partition gets runs in proportion to its share of the bytes, about `RUNS_PER_THREAD` per
    thread in all, so that one large partition (the benchmark's workload 1) is shared too,
    and more where its runs would be much over `RUN_TARGET_BYTES` (`_runs`).
    Each partition's runs are joined in order (`pipeline.finish_fetch`), which gives what a
    serial pass gives: pieces, counts, stats, dead letters, the first failure by offset, and
    the filters' failure counts and warnings (held per run and applied only for the batches a
    serial pass reaches)."""
    total = sum(len(p.blob) for p in parts)
    want = helpers.threads * RUNS_PER_THREAD
    plans = [
        plan_fetch(chain, RecordContext(p.name, p.partition, "fetch", client_id, principal),
                   p.blob, checked=True, runs=_runs(len(p.blob), total, want))
        for p in parts
    ]
    pieces = [(plan, i) for plan in plans for i in range(plan.runs)]
    spread = len(pieces) > 1 and helpers.threads > 1
    results = iter(map_ordered(
        lambda piece: run_fetch(chain, piece[0], piece[1], limits, defer=spread),
        pieces, helpers if spread else None,
    ))
    return [finish_fetch(plan, [next(results) for _ in range(plan.runs)])
            for plan in plans], spread


def _runs(size: int, total: int, want: int) -> int:
    """How many runs a partition of `size` of a spread response's `total` filtered bytes asks
    for: its share of `want`, and enough that none is much over `RUN_TARGET_BYTES`
    (`pipeline.plan_fetch` keeps to whole batches and `RUN_MIN_BYTES`)."""
    return max(1, want * size // max(1, total), -(-size // RUN_TARGET_BYTES))


def _may_spread(chain: FilterChain, parts: list[_Part], principal: str | None) -> bool:
    """Whether `parts` may be filtered on several threads at once: enough bytes to be worth a
    thread's wake-up, on a thread that may wait (never inline on the event loop), and only
    filters that keep no state between calls (a stateful one would see the partitions, or
    one partition's batches, in an order that changes from run to run): stateless Wasm
    filters, and host filters whose runner may be called from several threads at once on
    fetch (`HostRunner.concurrent`: builtin:encrypt, builtin:block). Whether there is more
    than one piece of work to share is `_filter_spread`'s to find out."""
    if not parts or not blocking.allowed():
        return False
    if sum(len(p.blob) for p in parts) < SPREAD_MIN_BYTES:
        return False
    return all(
        f.concurrent("fetch") for name in {p.name for p in parts}
        for f in chain.filters_for(name, "fetch", principal)
    )


def _filter_response(
    chain: FilterChain,
    response: Any,
    names: dict[int, str | None],
    applied: dict[int, bool],
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
        if not applied[id(topic)]:
            topics.append(topic)
            continue
        parts = []
        for part in topic.partitions:
            records = part.records
            if not records:
                parts.append(part)
                continue
            ctx = RecordContext(name, int(part.partition_index), "fetch", client_id, principal)
            outcome = filter_fetch(chain, ctx, records, limits=limits, checked=True)
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
            batches.append(
                _batch_fields(name, int(part.partition_index), records, outcome,
                              None if outcome.error_code else records)
            )
            parts.append(part)
        topics.append(dataclasses.replace(topic, partitions=tuple(parts)))
    if not changed:
        return _FilteredResponse(response, batches, dead)
    return _FilteredResponse(dataclasses.replace(response, responses=tuple(topics)), batches, dead)
