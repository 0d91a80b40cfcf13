"""The filter chain: which filters apply where, and running records and admin items through them.

`FilterChain.from_specs(specs)` loads every filter (failing fast with FilterLoadError).
`applies(topic, direction, principal)` answers from a per-(topic, direction, principal) cache,
so the proxy can decide cheaply whether to decode a partition at all.

Records go through the filters bound to their topic in listed order: a rewrite by one filter is
what the next one sees; a drop or reject ends that record's trip. On fetch, filters that nest
(``builtin:encrypt``: each seals what the one before it produced) run in reverse order among
themselves, so the last seal is opened first; every other filter keeps its place.

Filters may reserve a header-name prefix (``sluice.enc`` for ``builtin:encrypt``): a produced
record carrying such a header on a topic where that filter is bound (produce or fetch) fails
the partition with INVALID_RECORD before any filter runs, so producers cannot forge what only
the proxy writes. Admin resources go through
the ``admin`` filters in order: a rewrite is what the next filter sees; the first deny wins.

Topic globs use shell syntax (``*``, ``?``, ``[...]``; ``*`` also matches dots), case-sensitive
like Kafka topic names. Principal globs match the authenticated principal (e.g.
``User:alice``); a connection without one counts as ``User:ANONYMOUS`` (Kafka's name for it),
so a filter scoped with ``principals: ["User:*"]`` cannot be bypassed by skipping
authentication.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from fnmatch import translate
from pathlib import Path
from typing import Any, Final, cast

from sluice.codec.lz4_section import PendingSection
from sluice.codec.records import Buffer
from sluice.filters.admin import AdminResource, AdminVerdict
from sluice.filters.config import FilterSpec
from sluice.filters.context import Header, RecordContext, RecordLike
from sluice.filters.decisions import Action, PartitionError
from sluice.filters.engine import FilterEngine
from sluice.filters.module_cache import ModuleCache
from sluice.filters.native_io import Finish
from sluice.filters.principal import ANONYMOUS
from sluice.filters.runtime import LoadedFilter, load_filter, shared_cache

_CACHE_LIMIT: Final = 10_000
#: Longest topic name the per-topic caches keep: Kafka's own limit (249). Names are the
#: client's to choose and the protocol allows 32 767 bytes, so 10 000 cached entries of
#: invalid long names could hold hundreds of MB; such a name is answered uncached.
_CACHED_NAME_MAX: Final = 249
INVALID_RECORD: Final = 87


KEEP: Final = int(Action.KEEP)
REWRITE: Final = int(Action.REWRITE)
DROP: Final = int(Action.DROP)
REJECT: Final = int(Action.REJECT)

# Dead-letter headers naming the filter and the reason.
H_FILTER: Final = "sluice.filter"
H_SHA256: Final = "sluice.filter.sha256"
H_REASON: Final = "sluice.reason"
H_TOPIC: Final = "sluice.source.topic"
H_PARTITION: Final = "sluice.source.partition"
H_DIRECTION: Final = "sluice.source.direction"


def _glob(patterns: Sequence[str]) -> re.Pattern[str]:
    return re.compile("|".join(f"(?:{translate(p)})" for p in patterns))


@dataclass(slots=True)
class FilterStats:
    """What one filter did to one partition's records (telemetry reads these)."""

    name: str
    sha256: str
    kept: int = 0
    rewritten: int = 0
    dropped: int = 0
    rejected: int = 0
    detector_counts: dict[str, int] = field(default_factory=dict)
    time_ns: int = 0
    errors: int = 0
    failure: str | None = None
    #: The key id that signed the filter's fleet record (None: not a signed fleet filter).
    signer: str | None = None


@dataclass(frozen=True, slots=True)
class DeadLetter:
    """A record the proxy must produce to `topic` (failure policy ``dead-letter``)."""

    topic: str
    key: bytes | None
    value: bytes | None
    headers: list[Header]

    def __iter__(self) -> Iterator[object]:
        # Lets callers unpack (topic, key, value, headers) as the shared contract describes.
        return iter((self.topic, self.key, self.value, self.headers))


@dataclass(slots=True)
class ChainResult:
    """The fate of each input record after the whole chain.

    `fates[i]` is KEEP (untouched), REWRITE (`records[i]` is the new record), DROP or REJECT
    (`records[i]` is None; `reasons[i]` says ``filter NAME: reason`` for rejects; `by[i]`
    names the filter that dropped or rejected it).
    `changed` is False when every record was kept as it came.
    """

    records: list[RecordLike | None]
    fates: list[int]
    reasons: dict[int, str]
    by: dict[int, str]
    dead_letters: list[DeadLetter]
    stats: list[FilterStats]

    @property
    def changed(self) -> bool:
        return any(f != KEEP for f in self.fates)

    @property
    def rejected(self) -> list[tuple[int, str]]:
        return sorted(self.reasons.items())


@dataclass(slots=True)
class NativeChainResult:
    """The chain over one records section in Kafka's encoding (`FilterChain.run_native`).

    `records` is the section after the last filter (the input object itself when nothing
    changed; b"" for an unchanged `PendingSection`, which the caller has as its batch)
    holding `count` records; `rejected` maps an input index to ``filter NAME: reason`` and
    `dropped` maps an input index to the filter that dropped it. `trusted`: every
    filter that changed the section is the proxy's own code (`NativeOutput.trusted`), so the
    section is as well-formed as the checked input and needs no second check.
    `incompressible`, `tail`: the last filter that changed the section says it will not
    compress, and what its records end with (`NativeOutput.incompressible`).
    `framed`: `records` is the tail of this buffer, behind room for a batch header
    (`NativeOutput.framed`), or None.
    `finished`: `records` is what the caller's `finish` made of the last filter's section
    (`NativeOutput.finished`: the new batch), not a section.
    """

    records: Buffer
    count: int
    changed: bool
    rejected: dict[int, str]
    dropped: dict[int, str]
    stats: list[FilterStats]
    trusted: bool = False
    incompressible: bool = False
    tail: bytes = b""
    framed: bytearray | None = None
    finished: bool = False


class _Bound:
    __slots__ = ("directions", "filter", "principals", "spec", "topics")

    def __init__(self, loaded: LoadedFilter) -> None:
        spec = loaded.spec
        self.filter = loaded
        self.spec = spec
        self.topics = _glob(spec.topics)
        self.principals = _glob(spec.principals) if spec.principals else None
        self.directions = spec.apply_to

    def matches(self, topic: str, direction: str, principal: str) -> bool:
        if direction not in self.directions or self.topics.fullmatch(topic) is None:
            return False
        return self.principals is None or self.principals.fullmatch(principal) is not None


class FilterChain:
    """Filters in config order, with the binding rules of each."""

    def __init__(self, filters: Sequence[LoadedFilter]) -> None:
        self._bound = [_Bound(f) for f in filters]
        self.filters: tuple[LoadedFilter, ...] = tuple(filters)
        self._cache: dict[tuple[str, str, str], tuple[LoadedFilter, ...]] = {}
        self._reserved: dict[str, tuple[tuple[str, str], ...]] = {}
        self._screen_cache: dict[str, tuple[LoadedFilter, ...]] = {}
        self._native_cache: dict[tuple[str, str, str | None], bool] = {}
        #: What callers derive from the bindings alone (the proxy's paths: which topics of a
        #: request are filtered, the job's kind), kept as long as the chain: the bindings
        #: never change. Each caller keeps its own bounded table under a key of its own.
        self.memo: dict[str, dict[Any, Any]] = {}

    @classmethod
    def from_specs(cls, specs: Sequence[FilterSpec], cache_dir: str | Path | None = None, *,
                   engine: FilterEngine | None = None,
                   cache: ModuleCache | None = None) -> FilterChain:
        """Load every filter (FilterLoadError names the first that cannot run)."""
        module_cache = cache or shared_cache(engine, cache_dir)
        loaded: list[LoadedFilter] = []
        try:
            for spec in specs:
                loaded.append(load_filter(spec, cache=module_cache))
        except BaseException:
            for f in loaded:
                f.close()
            raise
        return cls(loaded)

    def __len__(self) -> int:
        return len(self.filters)

    def filters_for(self, topic: str, direction: str,
                    principal: str | None = None) -> tuple[LoadedFilter, ...]:
        """The filters bound to (topic, direction, principal), in order (cached)."""
        key = (topic, direction, principal or ANONYMOUS)
        hit = self._cache.get(key)
        if hit is None:
            hit = tuple(b.filter for b in self._bound if b.matches(*key))
            if direction == "fetch":
                hit = _nested_reversed(hit)
            if len(topic) > _CACHED_NAME_MAX:
                return hit
            if len(self._cache) >= _CACHE_LIMIT:
                self._cache.clear()
            self._cache[key] = hit
        return hit

    def applies(self, topic: str, direction: str, principal: str | None = None) -> bool:
        """Whether any filter is bound to `topic` for `direction` ("produce", "fetch",
        "admin") and `principal`."""
        return bool(self.filters_for(topic, direction, principal)) or (
            direction == "produce" and bool(self.reserved_for(topic)))

    def reserved_for(self, topic: str) -> tuple[tuple[str, str], ...]:
        """(header prefix, filter name) reserved by the filters bound to `topic` for produce
        or fetch, whoever the principal (cached)."""
        hit = self._reserved.get(topic)
        if hit is None:
            found: list[tuple[str, str]] = []
            for b in self._bound:
                prefix = b.filter.reserved_header_prefix
                if prefix and b.topics.fullmatch(topic) is not None and (
                        "produce" in b.directions or "fetch" in b.directions):
                    found.append((prefix, b.filter.name))
            hit = tuple(found)
            if len(topic) > _CACHED_NAME_MAX:
                return hit
            if len(self._reserved) >= _CACHE_LIMIT:
                self._reserved.clear()
            self._reserved[topic] = hit
        return hit

    def screen_produce(self, topic: str, records: Sequence[RecordLike]) -> None:
        """PartitionError (INVALID_RECORD) when a produced record carries a header reserved
        by a filter bound to `topic` (see the module docstring)."""
        reserved = self.reserved_for(topic)
        if not reserved:
            return
        for i, rec in enumerate(records):
            for name, _value in rec.headers:
                for prefix, owner in reserved:
                    if name.startswith(prefix):
                        raise PartitionError(
                            INVALID_RECORD, f"filter {owner}: record {i} carries the header "
                            f"{name[:60]!r}; headers starting with {prefix!r} are written only "
                            "by the proxy (a forged one could block or mislead readers)", owner)

    @property
    def has_admin(self) -> bool:
        return any("admin" in b.directions for b in self._bound)

    def run_records(self, ctx: RecordContext, records: Sequence[RecordLike], *,
                    offset_base: int = 0, timestamp_base: int = 0) -> ChainResult:
        """Run `records` of one batch through the filters bound to ctx's topic/direction."""
        n = len(records)
        current: list[RecordLike | None] = list(records)
        fates = [KEEP] * n
        reasons: dict[int, str] = {}
        by: dict[int, str] = {}
        dead: list[DeadLetter] = []
        stats: list[FilterStats] = []
        alive = list(range(n))
        if ctx.direction == "produce":
            self.screen_produce(ctx.topic, records)
        for f in self.filters_for(ctx.topic, ctx.direction, ctx.principal):
            st = FilterStats(f.name, f.sha256, signer=f.spec.signer)
            stats.append(st)
            if not alive:
                continue
            # Indices in `alive` always hold a record (None marks dropped/rejected ones).
            batch: list[RecordLike] = [cast(RecordLike, current[i]) for i in alive]
            result = f.run_batch(ctx, batch, offset_base=offset_base,
                                 timestamp_base=timestamp_base)
            st.time_ns = result.time_ns
            st.detector_counts = result.detector_counts
            st.errors = result.failed_records
            st.failure = result.failure
            survivors: list[int] = []
            for j, d in enumerate(result.decisions):
                i = alive[j]
                action = d.action
                if action is Action.KEEP:
                    st.kept += 1
                    survivors.append(i)
                elif action is Action.REWRITE:
                    st.rewritten += 1
                    rec = batch[j]
                    current[i] = _rewritten(rec, d.key, d.value, d.headers or [])
                    fates[i] = REWRITE
                    survivors.append(i)
                elif action is Action.DROP:
                    st.dropped += 1
                    current[i] = None
                    fates[i] = DROP
                    by[i] = f.name
                else:
                    st.rejected += 1
                    reason = d.reason or "rejected"
                    # Failure-policy rejects already name the filter ("filter X failed: ...").
                    own = reason.startswith(f"filter {f.name} ")
                    reasons[i] = reason if own else f"filter {f.name}: {reason}"
                    fates[i] = REJECT
                    by[i] = f.name
                    if d.dead_letter and f.spec.dead_letter_topic:
                        dead.append(_dead_letter(f, ctx, batch[j], reason))
                    current[i] = None
            alive = survivors
        return ChainResult(current, fates, reasons, by, dead, stats)

    def _screens(self, topic: str) -> tuple[LoadedFilter, ...]:
        """The filters whose reserved prefix `reserved_for(topic)` lists, in that order
        (cached: asked twice per produced batch on the native path)."""
        hit = self._screen_cache.get(topic)
        if hit is None:
            names = {name for _prefix, name in self.reserved_for(topic)}
            hit = tuple(f for f in self.filters if f.name in names)
            if len(topic) > _CACHED_NAME_MAX:
                return hit
            if len(self._screen_cache) >= _CACHE_LIMIT:
                self._screen_cache.clear()
            self._screen_cache[topic] = hit
        return hit

    def native_for(self, topic: str, direction: str, principal: str | None = None) -> bool:
        """Whether every filter bound here offers the native entry point (`run_native`)
        and, on produce, every reserved header prefix can be screened on the section
        (cached: asked once per partition filtered, issue 29)."""
        key = (topic, direction, principal)
        hit = self._native_cache.get(key)
        if hit is None:
            filters = self.filters_for(topic, direction, principal)
            if direction == "produce" and not all(f.can_screen for f in self._screens(topic)):
                hit = False  # reserved headers are screened on decoded records
            else:
                hit = bool(filters) and all(f.native for f in filters)
            if len(topic) > _CACHED_NAME_MAX:
                return hit
            if len(self._native_cache) >= _CACHE_LIMIT:
                self._native_cache.clear()
            self._native_cache[key] = hit
        return hit

    def _screen_native(self, topic: str, records: Buffer, count: int) -> bool:
        """`screen_produce` on a records section: PartitionError as there; False when a
        section could not be screened (the caller takes the decoding path)."""
        for f in self._screens(topic):
            try:
                found = f.screen_native(records, count)
            except Exception:
                return False
            if found is not None:
                i, name = found
                prefix = f.reserved_header_prefix
                raise PartitionError(
                    INVALID_RECORD, f"filter {f.name}: record {i} carries the header "
                    f"{name[:60]!r}; headers starting with {prefix!r} are written only "
                    "by the proxy (a forged one could block or mislead readers)", f.name)
        return True

    def pending_room(self, topic: str, direction: str, principal: str | None = None) -> int:
        """The largest `PendingSection.room` `run_native` may be given here, 0 when none:
        every filter bound must be a Sluice ABI module with the native entry point, and each
        allocates the room in its memory (`LoadedFilter.pending_room`). On produce none for a
        topic whose records a filter screens for its reserved header prefix: the screen reads
        the section in the host before any filter runs (`run_native`)."""
        if direction == "produce" and self._screens(topic):
            return 0
        filters = self.filters_for(topic, direction, principal)
        return min((f.pending_room for f in filters), default=0)

    def run_native(self, ctx: RecordContext, records: Buffer | PendingSection, count: int, *,
                   offset_base: int = 0, timestamp_base: int = 0,
                   finish: Finish | None = None) -> NativeChainResult | None:
        """Run a records section (Kafka's encoding, uncompressed) through the filters bound to
        ctx's topic/direction, every one over its native entry point.

        Same semantics as `run_records`; the records are never decoded here. Returns None
        when a filter call failed or a host filter declined the batch: the caller then runs
        it through `run_records`, where the filter's failure policy applies. A host filter's
        PartitionError (and the reserved-header screen's, on produce) propagates as there.
        A `PendingSection` (lz4, only within `pending_room`) is opened by each filter that
        reads it into its own memory; SectionRefused propagates (the batch is refused).
        `finish` is offered the last filter's new section where it lies
        (`LoadedFilter.run_native`); `NativeChainResult.finished` when it took it.
        """
        current = records
        n = count
        changed = False
        trusted = True  # until a filter not of the proxy's own code rewrites the section
        incompressible = False
        tail = b""
        framed: bytearray | None = None
        finished = False
        alive: list[int] | None = None  # input index of each current record (None: identity)
        rejected: dict[int, str] = {}
        dropped: dict[int, str] = {}
        stats: list[FilterStats] = []
        if ctx.direction == "produce" and self._screens(ctx.topic) and (
                isinstance(records, PendingSection)
                or not self._screen_native(ctx.topic, records, count)):
            return None  # a pending section is never screened: `pending_room` offers none
        bound = self.filters_for(ctx.topic, ctx.direction, ctx.principal)
        for i, f in enumerate(bound):
            st = FilterStats(f.name, f.sha256, signer=f.spec.signer)
            stats.append(st)
            if not n:
                continue
            pending = current if isinstance(current, PendingSection) else None
            if pending is not None:
                pending.spent_ns = 0  # set by this filter's write of it, if any
            started = time.perf_counter_ns()
            out = f.run_native(ctx, current, n, offset_base=offset_base,
                               timestamp_base=timestamp_base,
                               finish=finish if i == len(bound) - 1 else None)
            if out is None:
                return None
            # The filter's time, not the caller's `finish` (the batch's compression) nor a
            # pending section's decompression and check into its memory: the host's work.
            st.time_ns = (time.perf_counter_ns() - started - out.finish_ns
                          - (pending.spent_ns if pending is not None else 0))
            st.detector_counts = out.detector_counts
            if out.records is None:
                st.kept = n
                continue
            fates = out.fates
            st.rewritten = fates.count(REWRITE)
            st.dropped = fates.count(DROP)
            st.rejected = fates.count(REJECT)
            st.kept = n - st.rewritten - st.dropped - st.rejected
            changed = True
            trusted = trusted and out.trusted
            incompressible = out.incompressible
            tail = out.tail
            framed = out.framed
            finished = out.finished
            current = out.records
            if st.dropped or st.rejected:
                index = alive if alive is not None else range(n)
                for j, fate in enumerate(fates):
                    if fate == DROP:
                        dropped[index[j]] = f.name
                    elif fate == REJECT:
                        reason = out.rejects[j]
                        own = reason.startswith(f"filter {f.name} ")
                        rejected[index[j]] = reason if own else f"filter {f.name}: {reason}"
                alive = [index[j] for j, fate in enumerate(fates) if fate <= REWRITE]
                n = len(alive)
        if isinstance(current, PendingSection):
            current = b""  # nothing changed: the caller forwards the batch as it came
        return NativeChainResult(current, n, changed, rejected, dropped, stats,
                                 changed and trusted, changed and incompressible, tail, framed,
                                 finished)

    def run_admin(self, resource: AdminResource) -> AdminVerdict:
        """Offer one admin resource to the ``admin`` filters bound to its name."""
        filters = self.filters_for(resource.name, "admin", resource.principal)
        current = resource
        rewrote: str | None = None
        messages: list[str] = []
        for f in filters:
            verdict = f.run_admin(current)
            if verdict.decision == "deny":
                return verdict
            if verdict.decision == "rewrite":
                rewrote = f.name
                if verdict.message:
                    messages.append(verdict.message)
                current = AdminResource(
                    op=current.op, name=current.name, resource_type=current.resource_type,
                    partitions=verdict.partitions if verdict.partitions is not None
                    else current.partitions,
                    replication_factor=current.replication_factor,
                    configs=dict(verdict.configs) if verdict.configs is not None
                    else current.configs,
                    principal=current.principal, client_id=current.client_id)
        if rewrote is None:
            return AdminVerdict("allow")
        return AdminVerdict("rewrite", "; ".join(messages), current.partitions,
                            dict(current.configs), filter=rewrote)

    def describe(self) -> list[dict[str, object]]:
        """One line per filter for start-up logs and `sluice config check`."""
        return [{"name": f.name, "sha256": f.sha256, "abi": f.abi, "origin": f.origin,
                 "topics": list(f.spec.topics), "apply_to": sorted(f.spec.apply_to),
                 "on_error": f.spec.on_error} for f in self.filters]

    def close(self) -> None:
        for f in self.filters:
            f.close()


def _nested_reversed(filters: tuple[LoadedFilter, ...]) -> tuple[LoadedFilter, ...]:
    """`filters` with the nesting ones (see the module docstring) in reverse order among
    themselves, in the places they hold; the others stay where they are."""
    slots = [i for i, f in enumerate(filters) if f.nests]
    if len(slots) < 2:
        return filters
    out = list(filters)
    for i, f in zip(slots, reversed([filters[i] for i in slots]), strict=True):
        out[i] = f
    return tuple(out)


def _rewritten(rec: RecordLike, key: bytes | None, value: bytes | None,
               headers: list[Header]) -> RecordLike:
    # Same class as the input (codec Record or FilterRecord): field order is shared.
    record_class = cast(Any, type(rec))
    return cast(RecordLike, record_class(rec.offset_delta, rec.timestamp_delta, key, value,
                                         headers, rec.attributes))


def _dead_letter(f: LoadedFilter, ctx: RecordContext, rec: RecordLike,
                 reason: str) -> DeadLetter:
    headers: list[Header] = list(rec.headers)
    headers += [
        (H_FILTER, f.name.encode()),
        (H_SHA256, f.sha256.encode()),
        (H_REASON, reason.encode("utf-8", "replace")),
        (H_TOPIC, ctx.topic.encode()),
        (H_PARTITION, str(ctx.partition).encode()),
        (H_DIRECTION, ctx.direction.encode()),
    ]
    assert f.spec.dead_letter_topic is not None
    return DeadLetter(f.spec.dead_letter_topic, rec.key, rec.value, headers)
