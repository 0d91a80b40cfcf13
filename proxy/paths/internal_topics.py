"""The proxy's own topics: out of reach of clients, whatever API they use.

The fleet topic, the Kafka telemetry topic, the dead-letter topics of the filters in force and
`security.internal_topics` hold what the proxy itself relies on (filters, policies, the audit
trail). A client of the proxy may not produce to them, read them, delete them, change their
configs or partitions, or move their offsets: every item of a request that names one (by name
or by topic id) gets Kafka's TOPIC_AUTHORIZATION_FAILED, the other items go to the broker and
the two answers are merged; Metadata and the other listings leave them out. Principals in
`security.operators` pass untouched. docs/SECURITY.md gives the rule of every API.

This path sits in front of the others (`paths/catalog.py`): for each request it either hands
the frame to the path the router would otherwise have chosen, or first takes the internal
topics out of it and keeps the refusals on the exchange for the response. The same split
serves one more rule of the admin filters (paths/admin.py has the Metadata side): while one is
in force, a Produce to a topic the cluster does not have, whose creation the filters would
refuse, gets UNKNOWN_TOPIC_OR_PARTITION for it (Kafka's answer; Tansu would store the records),
operators included.

Pass-through stays cheap: requests of APIs that cannot name a topic never reach it; of a
Produce request only the acks and topic names (or ids) are read (`Exchange.produce_topics`,
kept on the exchange for the Produce path); other requests
are decoded only when their bytes contain the name (or known id) of an internal topic, or name
topics by id while an internal topic's id is still unknown.
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import cache
from typing import Any

from sluice.codec import entities, schemas
from sluice.codec.error_codes import ErrorCode
from sluice.codec.errors import CodecError
from sluice.codec.headers import response_header_bytes
from sluice.codec.messages import (
    ApiKey,
    codec_version_range,
    decode_request,
    encode_request,
    encode_response,
)
from sluice.codec.passthrough import produce_head_at
from sluice.codec.produce_splice import (
    splice_produce_records,
)
from sluice.filters.admin import AdminResource
from sluice.proxy.contract import UpstreamError
from sluice.proxy.paths import responses
from sluice.proxy.paths.base import (
    Answer,
    ApiPath,
    Defer,
    Exchange,
    Forward,
    Frame,
    Job,
    NoReply,
    PathContext,
    Pin,
    Refuse,
    RequestOutcome,
    Respond,
    ResponseOutcome,
    ResponsePath,
    UndecodableGate,
)
from sluice.proxy.paths.produce import LocalAnswer, local_response, merge_local
from sluice.proxy.paths.protection import Protection
from sluice.proxy.paths.registry import pick_request_path, pick_response_path
from sluice.proxy.paths.topics import TopicRegistry, is_null_id
from sluice.proxy.telemetry.logs import log

DENIED = ErrorCode.TOPIC_AUTHORIZATION_FAILED
MESSAGE = "sluice: this topic belongs to the proxy"
UNKNOWN_TOPIC = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
NOT_CREATED = "sluice: the topic does not exist and the admin filters refuse to create it"
TOPIC_RESOURCE = 2

# Where each API's requests name topics, and where its responses answer each of them: a
# field path to the list of topic items (two fields: a list of groups, transactions or log
# dirs, each holding a list of topics). Several shapes: the first whose request field the
# version has applies (OffsetFetch v8+ groups its topics, AddPartitionsToTxn v4+ groups them by
# transaction, DeleteTopics before v6 lists bare names).
_Shape = tuple[tuple[str, ...], tuple[str, ...]]
_TOPICS: _Shape = (("topics",), ("topics",))
SHAPES: dict[int, tuple[_Shape, ...]] = {
    ApiKey.FETCH: ((("topics",), ("responses",)),),
    ApiKey.LIST_OFFSETS: (_TOPICS,),
    ApiKey.METADATA: (_TOPICS,),
    ApiKey.OFFSET_COMMIT: (_TOPICS,),
    ApiKey.OFFSET_FETCH: ((("groups", "topics"), ("groups", "topics")), _TOPICS),
    ApiKey.CREATE_TOPICS: (_TOPICS,),
    ApiKey.DELETE_TOPICS: ((("topics",), ("responses",)), (("topic_names",), ("responses",))),
    ApiKey.DELETE_RECORDS: (_TOPICS,),
    ApiKey.OFFSET_FOR_LEADER_EPOCH: (_TOPICS,),
    ApiKey.ADD_PARTITIONS_TO_TXN: (
        (("transactions", "topics"), ("results_by_transaction", "topic_results")),
        (("v3_and_below_topics",), ("results_by_topic_v3_and_below",)),
    ),
    ApiKey.TXN_OFFSET_COMMIT: (_TOPICS,),
    ApiKey.DESCRIBE_CONFIGS: ((("resources",), ("results",)),),
    ApiKey.ALTER_CONFIGS: ((("resources",), ("responses",)),),
    ApiKey.INCREMENTAL_ALTER_CONFIGS: ((("resources",), ("responses",)),),
    ApiKey.ALTER_REPLICA_LOG_DIRS: ((("dirs", "topics"), ("results",)),),
    ApiKey.DESCRIBE_LOG_DIRS: ((("topics",), ("results", "topics")),),
    ApiKey.CREATE_PARTITIONS: ((("topics",), ("results",)),),
    ApiKey.ELECT_LEADERS: ((("topic_partitions",), ("replica_election_results",)),),
    ApiKey.ALTER_PARTITION_REASSIGNMENTS: ((("topics",), ("responses",)),),
    ApiKey.LIST_PARTITION_REASSIGNMENTS: (_TOPICS,),
    ApiKey.OFFSET_DELETE: (_TOPICS,),
    ApiKey.DESCRIBE_PRODUCERS: (_TOPICS,),
    ApiKey.DESCRIBE_TOPIC_PARTITIONS: (_TOPICS,),
    ApiKey.SHARE_FETCH: ((("topics",), ("responses",)),),
    ApiKey.SHARE_ACKNOWLEDGE: ((("topics",), ("responses",)),),
    ApiKey.DESCRIBE_SHARE_GROUP_OFFSETS: ((("groups", "topics"), ("groups", "topics")),),
    ApiKey.ALTER_SHARE_GROUP_OFFSETS: ((("topics",), ("responses",)),),
    ApiKey.DELETE_SHARE_GROUP_OFFSETS: ((("topics",), ("responses",)),),
}
_PRODUCE = int(ApiKey.PRODUCE)
_UNSET: Any = object()  # not in a memo yet (None is a memoised answer: no path)
#: Responses that may list topics nobody named (all topics, all offsets of a group, all log
#: dirs): the internal ones are taken out.
LISTINGS = frozenset(int(k) for k in (
    ApiKey.METADATA, ApiKey.DESCRIBE_TOPIC_PARTITIONS, ApiKey.DESCRIBE_LOG_DIRS,
    ApiKey.LIST_PARTITION_REASSIGNMENTS, ApiKey.OFFSET_FETCH, ApiKey.DESCRIBE_SHARE_GROUP_OFFSETS,
    ApiKey.LIST_CONFIG_RESOURCES,
))
#: Listings whose requests name no topic: where their answers list them.
LISTING_ONLY: dict[int, tuple[str, ...]] = {
    ApiKey.LIST_CONFIG_RESOURCES: ("config_resources",),  # v1+: topics among the resources
}
#: Requests only brokers and controllers send each other (some name topics): never relayed
#: for a client that is not an operator.
BROKER_ONLY = frozenset(int(k) for k in (
    ApiKey.WRITE_TXN_MARKERS, ApiKey.ALTER_PARTITION, ApiKey.ENVELOPE, ApiKey.FETCH_SNAPSHOT,
    ApiKey.BROKER_REGISTRATION, ApiKey.BROKER_HEARTBEAT, ApiKey.UNREGISTER_BROKER,
    ApiKey.ALLOCATE_PRODUCER_IDS, ApiKey.CONTROLLER_REGISTRATION, ApiKey.ASSIGN_REPLICAS_TO_DIRS,
    ApiKey.INITIALIZE_SHARE_GROUP_STATE, ApiKey.READ_SHARE_GROUP_STATE,
    ApiKey.WRITE_SHARE_GROUP_STATE, ApiKey.DELETE_SHARE_GROUP_STATE,
    ApiKey.READ_SHARE_GROUP_STATE_SUMMARY, ApiKey.VOTE, ApiKey.BEGIN_QUORUM_EPOCH,
    ApiKey.END_QUORUM_EPOCH,
))
GUARDED = frozenset({int(ApiKey.PRODUCE), *(int(k) for k in SHAPES), *LISTING_ONLY,
                     *BROKER_ONLY})

_NAME_FIELDS = ("name", "topic", "topic_name")
_PART_FIELDS = ("partitions", "partition_indexes", "partition_data", "partition_responses",
                "results_by_partition", "partition_result")
_INDEX_FIELDS = ("partition_index", "partition", "index", "partition_id")
_ERROR_FIELDS = ("error_code", "partition_error_code")


@dataclass(slots=True)
class _Refused:
    """A request item the proxy answers itself: where it was (index of its group, or -1),
    the item, and its topic name."""

    outer: int
    item: Any
    name: str


@dataclass(slots=True)
class Guard:
    """What the response needs: the refusals to merge, and the inner path's pin if it had one."""

    refused: list[_Refused] = field(default_factory=list)
    produce: list[LocalAnswer] = field(default_factory=list)
    pin: Pin | None = None


# ------------------------------------------------------------------ reading the schemas


def _field(cls: type[Any], names: Sequence[str]) -> str | None:
    return next((n for n in names if entities.has_field(cls, n)), None)


@cache
def _shape(api_key: int, version: int) -> _Shape | None:
    cls = schemas.request_schema(api_key, version)
    for shape in SHAPES.get(api_key, ()):
        if entities.has_field(cls, shape[0][0]):
            return shape
    return None


@cache
def _by_id(api_key: int, version: int) -> bool:
    """Whether requests of this version may name topics by id."""
    shape = _shape(api_key, version)
    if shape is None:
        return False
    cls = schemas.request_schema(api_key, version)
    for name in shape[0]:
        if not _is_entity_list(cls, name):
            return False
        cls = entities.element_class(cls, name)
    return entities.has_field(cls, "topic_id")


def _is_entity_list(cls: type[Any], name: str) -> bool:
    try:
        return dataclasses.is_dataclass(entities.element_class(cls, name))
    except (KeyError, IndexError, StopIteration, TypeError):
        return False


def _item_name(item: Any, topics: TopicRegistry) -> tuple[str | None, Any]:
    """(topic name, unknown topic id) of a request or response item."""
    if isinstance(item, str):
        return item, None
    if hasattr(item, "resource_type"):
        if int(item.resource_type) != TOPIC_RESOURCE:
            return None, None
        return str(item.resource_name), None
    for n in _NAME_FIELDS:
        value = getattr(item, n, None)
        if value:
            return str(value), None
    topic_id = getattr(item, "topic_id", None)
    if is_null_id(topic_id):
        return None, None
    name = topics.name(topic_id)
    return name, (topic_id if name is None else None)


# ------------------------------------------------------------------ the path


class InternalTopicsPath:
    """In front of every path for the APIs that can name a topic (see the module doc)."""

    name = "internal-topics"
    api_keys = GUARDED

    def __init__(self, others: Sequence[ApiPath]) -> None:
        self.others = tuple(others)
        self._requests: dict[int, ApiPath | None] = {}
        self._responses: dict[int, ResponsePath | None] = {}
        self._generation = -1
        # Whether the admin filters let a principal create a topic, by chain and principal.
        self._creatable: dict[tuple[int, str | None], dict[str, bool]] = {}

    def wants_request(self, ctx: PathContext, api_key: int) -> bool:
        return ctx.protection is not None

    def relays_undecodable(self, ctx: PathContext, header: Any, frame: Frame) -> bool:
        """An old version the codec cannot decode (Sarama 1.22's CreateTopics v0, say) may pass
        when nothing else inspects its key and no protected topic's name occurs in its bytes.
        Versions older than the codec's name topics only by name (topic ids came later), as
        length-prefixed UTF-8, so a name that is not in the bytes is not in the request."""
        key = header.api_key
        if key in BROKER_ONLY:
            return False
        inner = self._inner_request(ctx, key)
        if inner is not None and not (
            isinstance(inner, UndecodableGate) and inner.relays_undecodable(ctx, header, frame)
        ):
            return False
        span = codec_version_range(key)
        if span is None or any(
            self._inner_response(ctx, key, v) is not None for v in range(span[0], span[1] + 1)
        ):
            return False
        protection = ctx.protection
        if protection is None:
            return True
        pattern, _ = protection.pattern(ctx.topics)
        return pattern is None or pattern.search(frame[header.header_size :]) is None

    def wants_response(self, ctx: PathContext, api_key: int, version: int) -> bool:
        # Always, but for Produce: an exchange this path changed is recognised on its
        # response, and that must not depend on the chain in force when the response comes
        # back. A Produce it changed pins this path instead (`_forward`): Produce is never
        # listed, so the router hands every other Produce response straight to the path
        # behind (the address path's scan), without this path's call in between, which on a
        # loaded machine cost ~10 µs of cold-cache CPU per response (workload 2).
        return api_key != _PRODUCE

    # ---------------------------------------------------------------- the paths behind

    def _memo(self, ctx: PathContext) -> None:
        if ctx.generation != self._generation:
            self._requests.clear()
            self._responses.clear()
            self._generation = ctx.generation

    def _inner_request(self, ctx: PathContext, api_key: int) -> ApiPath | None:
        # Asked on every Produce: the memo's generation is compared here (no `_memo` call).
        if ctx.generation == self._generation:
            found = self._requests.get(api_key, _UNSET)
            if found is not _UNSET:
                return found
        else:
            self._memo(ctx)
        found = self._requests[api_key] = pick_request_path(self.others, ctx, api_key)
        return found

    def _inner_response(self, ctx: PathContext, api_key: int, version: int) -> ResponsePath | None:
        # Asked on every response but Produce's: `_memo` is called only when the chain changed.
        if ctx.generation != self._generation:
            self._memo(ctx)
        key = api_key << 16 | (version & 0xFFFF)
        try:
            return self._responses[key]
        except KeyError:
            found = pick_response_path(self.others, ctx, api_key, version)
            self._responses[key] = found
            return found

    def _pass(self, ctx: PathContext, exchange: Exchange, frame: Frame) -> RequestOutcome:
        inner = self._inner_request(ctx, exchange.header.api_key)
        return Forward() if inner is None else inner.on_request(ctx, exchange, frame)

    # ---------------------------------------------------------------- requests

    def on_request(self, ctx: PathContext, exchange: Exchange, frame: Frame) -> RequestOutcome:
        protection = ctx.protection
        header = exchange.header
        key = header.api_key
        if protection is None:
            return self._pass(ctx, exchange, frame)
        # Without operators nobody is exempt: no call (this runs on every request).
        exempt = bool(protection.operators) and protection.exempts(exchange.client.principal)
        if key == _PRODUCE:
            names = frozenset() if exempt else protection.names
            directions = ctx.directions
            if (names and exchange.parsed is None and "admin" not in directions
                    and "produce" not in directions):
                # `_produce`'s common case (`Exchange.produce_topics` and the short branch)
                # written out: one topic, by name, not the proxy's own; two calls less on
                # every pass-through Produce (issue 29). Anything else (a parse the quotas
                # made already, among others), `_produce` reads.
                try:
                    read = produce_head_at(frame, header.header_size, header.api_version)
                except CodecError:
                    read = None
                if read is not None:
                    exchange.parsed = (frame, read)  # what `_produce` reads, if it must
                    keys = read.keys
                    if len(keys) == 1 and type(keys[0]) is str and keys[0] not in names:
                        inner = (self._requests.get(_PRODUCE, _UNSET)
                                 if ctx.generation == self._generation else _UNSET)
                        if inner is _UNSET:
                            inner = self._inner_request(ctx, _PRODUCE)
                        return Forward() if inner is None else inner.on_request(
                            ctx, exchange, frame)
            return self._produce(ctx, exchange, frame, names, looked_up=False)
        span = codec_version_range(key)
        if span is None or not span[0] <= header.api_version <= span[1]:
            # Only a version `relays_undecodable` vouched for gets here (registry.py's rule):
            # no path has anything to do with it.
            return Forward()
        if exempt:
            return self._pass(ctx, exchange, frame)
        if key in BROKER_ONLY:
            return Refuse(f"{ApiKey(key).name} is sent between brokers, not by clients")
        body = frame[header.header_size :]
        shape = _shape(key, header.api_version)
        if shape is None:
            return self._pass(ctx, exchange, frame)
        pattern, ids_known = protection.pattern(ctx.topics)
        by_id = _by_id(key, header.api_version)
        if (pattern is None or pattern.search(body) is None) and (ids_known or not by_id):
            # What `_pass` does, inline, and `_inner_request`'s memo read here: every Fetch of
            # a pass-through connection gets here.
            inner = (self._requests.get(key, _UNSET) if ctx.generation == self._generation
                     else _UNSET)
            if inner is _UNSET:
                inner = self._inner_request(ctx, key)
            return Forward() if inner is None else inner.on_request(ctx, exchange, frame)
        try:
            request = decode_request(key, header.api_version, body)
        except CodecError as exc:
            return Refuse(f"cannot decode {ApiKey(key).name} v{header.api_version}: {exc}")
        return self._split(ctx, exchange, frame, request, shape, protection, looked_up=False)

    def _split(
        self,
        ctx: PathContext,
        exchange: Exchange,
        frame: Frame,
        request: Any,
        shape: _Shape,
        protection: Protection,
        looked_up: bool,
    ) -> RequestOutcome:
        names = protection.names
        path = shape[0]
        refused: list[_Refused] = []
        unknown: list[Any] = []
        # Where the topic items are: one list, or one per group (transaction, log dir).
        lists: list[tuple[int, Any]] = (
            [(-1, getattr(request, path[0]))] if len(path) == 1
            else [(i, getattr(o, path[1])) for i, o in enumerate(getattr(request, path[0]) or ())]
        )
        for outer, items in lists:
            for item in items or ():
                name, topic_id = _item_name(item, ctx.topics)
                if topic_id is not None:
                    unknown.append(topic_id)
                if name is not None and name in names:
                    refused.append(_Refused(outer, item, name))
        if unknown and not looked_up:
            # A topic id the proxy has not learnt may be an internal topic's: ask the cluster.
            return Defer(Job(
                run=lambda: _lookup(ctx),
                finish=lambda _: self._split(ctx, exchange, frame, request, shape, protection,
                                             looked_up=True),
                in_thread=False,
                what="topic id look-up",
            ))
        if not refused:
            return self._pass(ctx, exchange, frame)
        header = exchange.header
        log.debug("internal_topics_refused", api=ApiKey(header.api_key).name,
                  topics=sorted({r.name for r in refused}), principal=exchange.client.principal)
        ctx.metrics.internal_refused(header.api_key, len(refused))
        gone = {id(r.item) for r in refused}

        def kept(items: Any) -> tuple[Any, ...] | None:
            return None if items is None else tuple(i for i in items if id(i) not in gone)

        if len(path) == 1:
            stripped = dataclasses.replace(request, **{path[0]: kept(getattr(request, path[0]))})
        else:
            stripped = dataclasses.replace(request, **{path[0]: tuple(
                dataclasses.replace(o, **{path[1]: kept(getattr(o, path[1]))})
                for o in getattr(request, path[0]) or ())})
        # A None list (all topics of a group) still asks the broker something.
        kept_any = any(items is None or any(id(i) not in gone for i in items)
                       for _outer, items in lists)
        guard = Guard(refused=refused)
        if not kept_any and header.api_key != ApiKey.METADATA:
            # Nothing left for the broker (Metadata always goes: its answer lists the brokers).
            cls = entities.response_class(header.api_key, header.api_version)
            empty = entities.build(cls, **{shape[1][0]: ()})
            merged = _merge(empty, shape, request, guard)
            return Answer(
                response_header_bytes(header.correlation_id, header.api_key, header.api_version)
                + encode_response(merged)
            )
        new_frame = bytes(frame[: header.header_size]) + encode_request(stripped)
        return self._forward(ctx, exchange, new_frame, guard, shape, request)

    def _produce(
        self,
        ctx: PathContext,
        exchange: Exchange,
        frame: Frame,
        internal: frozenset[str],
        looked_up: bool,
    ) -> RequestOutcome:
        header = exchange.header
        directions = ctx.directions  # `ctx.filters_on`, read once (on every Produce)
        admin = "admin" in directions
        if not internal and not admin:
            return self._pass(ctx, exchange, frame)
        try:
            if "produce" in directions:
                # The Produce path will need the layout: scan it now, the names come with it.
                exchange.produce_layout(frame)
            keys = exchange.produce_topics(frame).keys
        except CodecError as exc:
            return Refuse(f"cannot decode Produce v{header.api_version}: {exc}")
        if not admin and len(keys) == 1 and type(keys[0]) is str and keys[0] not in internal:
            # The common case, kept short: one topic, by name, not the proxy's own (`_pass`
            # written out, and `_inner_request`'s memo read here: two calls less on every
            # Produce).
            inner = (self._requests.get(_PRODUCE, _UNSET) if ctx.generation == self._generation
                     else _UNSET)
            if inner is _UNSET:
                inner = self._inner_request(ctx, _PRODUCE)
            return Forward() if inner is None else inner.on_request(ctx, exchange, frame)
        names = [k if isinstance(k, str) else ctx.topics.name(k) for k in keys]
        if not looked_up and any(n is None for n in names):
            return Defer(Job(
                run=lambda: _lookup(ctx),
                finish=lambda _: self._produce(ctx, exchange, frame, internal, looked_up=True),
                in_thread=False,
                what="topic id look-up",
            ))
        chain = ctx.chain
        principal = exchange.client.principal
        if chain is None or not admin:
            return self._drop(ctx, exchange, frame, names, internal, set())
        # A Produce to a topic that does not exist creates it on lenient brokers (Tansu
        # stores the records): a name the admin filters would not let the client create,
        # and that the cluster does not have, is refused like Kafka refuses a missing topic.
        judged = {n for n in names if n is not None and n not in internal
                  and ctx.topics.id_of(n) is None and chain.applies(n, "admin", principal)}
        if not judged:
            return self._drop(ctx, exchange, frame, names, internal, set())
        key = (ctx.generation, principal)
        known = self._creatable.setdefault(key, {})
        if len(self._creatable) > 64:
            self._creatable.clear()
        missing = sorted(n for n in judged if n not in known)
        client = exchange.client

        def verdicts() -> dict[str, bool]:
            return {n: chain.run_admin(AdminResource(
                op="create_topics", name=n, principal=principal, client_id=client.client_id,
            )).decision == "allow" for n in missing}

        def judged_all(found: dict[str, bool]) -> RequestOutcome:
            if len(known) < 10_000:
                known.update(found)
            refused = {n for n in judged if not {**known, **found}.get(n, False)}
            if not refused:
                return self._drop(ctx, exchange, frame, names, internal, set())

            def exists(_: Any) -> RequestOutcome:
                absent = {n for n in refused if ctx.topics.id_of(n) is None}
                return self._drop(ctx, exchange, frame, names, internal, absent)

            return Defer(Job(run=lambda: _lookup(ctx), finish=exists, in_thread=False,
                             what="topic look-up"))

        if not missing:
            return judged_all({})
        return Defer(Job(run=verdicts, finish=judged_all, in_thread=True,
                         what="auto-creation check"))

    def _drop(
        self,
        ctx: PathContext,
        exchange: Exchange,
        frame: Frame,
        names: list[str | None],
        internal: frozenset[str],
        absent: set[str],
    ) -> RequestOutcome:
        """Answer the partitions of internal topics (and of `absent` topics the client may
        not create) and hand the rest on."""
        header = exchange.header
        if not any(n in internal or n in absent for n in names):
            return self._pass(ctx, exchange, frame)
        # Checked like this by `Exchange.produce_topics` already: the scan cannot fail.
        layout = exchange.produce_layout(frame)
        drop: set[tuple[int, int]] = set()
        local: list[LocalAnswer] = []
        for i, topic in enumerate(layout.topics):
            if names[i] in internal:
                code, message = DENIED, MESSAGE
            elif names[i] in absent:
                code, message = UNKNOWN_TOPIC, NOT_CREATED
            else:
                continue
            for j, part in enumerate(topic.partitions):
                drop.add((i, j))
                local.append(LocalAnswer(topic.name, topic.topic_id, part.partition, code,
                                         message))
        if not drop:
            return self._pass(ctx, exchange, frame)
        log.debug("produce_partitions_refused",
                  topics=sorted({n for n in names if n in internal or n in absent}),
                  principal=exchange.client.principal)
        refused = sum(1 for a in local if a.error_code == DENIED)
        if refused:
            ctx.metrics.internal_refused(header.api_key, refused)
        if len(drop) == sum(len(t.partitions) for t in layout.topics):
            if layout.acks == 0:
                return NoReply()
            return Answer(local_response(header, local))
        new_frame = bytes(frame[: header.header_size]) + splice_produce_records(
            frame[header.header_size :], layout, {}, drop
        )
        return self._forward(ctx, exchange, new_frame, Guard(produce=local), None, None)

    def _forward(
        self,
        ctx: PathContext,
        exchange: Exchange,
        new_frame: bytes,
        guard: Guard,
        shape: _Shape | None,
        request: Any,
    ) -> RequestOutcome:
        """Hand the request without its internal topics to the path behind, and keep the
        refusals for the response, whatever that path answers (now or after a job)."""
        inner = self._inner_request(ctx, exchange.header.api_key)
        outcome = Forward() if inner is None else inner.on_request(ctx, exchange, new_frame)
        header = exchange.header

        def adapt(outcome: Any) -> Any:
            if type(outcome) is Forward:
                if outcome.frame is None:
                    outcome.frame = new_frame  # "the original bytes" are ours now
                if outcome.expect_response:
                    exchange.guard = guard
                    if outcome.pin is not None or header.api_key == _PRODUCE:
                        # Produce: pinned whether or not the path behind pinned (this path
                        # does not ask for Produce responses, `wants_response`). Nothing a
                        # reload changes applies to an unfiltered Produce's answer.
                        guard.pin, outcome.pin = outcome.pin, self
                return outcome
            if type(outcome) is Answer:
                size, decoded = responses.decode(header, outcome.response)
                merged = (merge_local(decoded, guard.produce) if shape is None
                          else _merge(decoded, shape, request, guard))
                return Answer(responses.encode(outcome.response, size, merged), outcome.on_sent)
            if type(outcome) is Defer:
                job = outcome.job
                finish = job.finish
                return Defer(dataclasses.replace(job, finish=lambda r: adapt(finish(r))))
            return outcome  # NoReply, Refuse

        return adapt(outcome)

    # ---------------------------------------------------------------- responses

    def on_response(self, ctx: PathContext, exchange: Exchange, frame: Frame) -> ResponseOutcome:
        header = exchange.header
        guard: Guard | None = exchange.guard
        inner: ResponsePath | None = guard.pin if guard is not None else None
        if inner is None:
            # `_inner_response`'s memo read here (every Fetch response comes by): a call less.
            key = header.api_key << 16 | (header.api_version & 0xFFFF)
            inner = (self._responses.get(key, _UNSET) if ctx.generation == self._generation
                     else _UNSET)
            if inner is _UNSET:
                inner = self._inner_response(ctx, header.api_key, header.api_version)
        outcome = Respond(frame) if inner is None else inner.on_response(ctx, exchange, frame)
        protection = ctx.protection
        hide = (header.api_key in LISTINGS and protection is not None
                and not protection.exempts(exchange.client.principal))
        if guard is None and not hide:
            return outcome
        return _then(outcome, lambda r: self._finish(ctx, exchange, r, guard, hide))

    def _finish(self, ctx: PathContext, exchange: Exchange, respond: Respond, guard: Guard | None,
                hide: bool) -> Respond:
        header = exchange.header
        protection = ctx.protection
        frame = respond.frame
        if isinstance(frame, tuple):  # Pieces (a spliced Fetch): read and decoded whole here
            frame = b"".join(frame)
        if hide and protection is not None:
            pattern, _known = protection.pattern(ctx.topics)
            hide = pattern is not None and pattern.search(frame) is not None
        if guard is None and not hide:
            return respond
        size, decoded = responses.decode(header, frame)
        result = decoded
        shape = _shape(header.api_key, header.api_version)
        listing = LISTING_ONLY.get(header.api_key) or (shape[1] if shape is not None else None)
        if hide and protection is not None and listing is not None:
            result = _hide(result, listing, protection.names, ctx.topics)
        if guard is not None:
            if header.api_key == ApiKey.PRODUCE:
                result = merge_local(result, guard.produce)
            elif shape is not None:
                result = _merge(result, shape, None, guard)
        if result is decoded:
            return respond
        return Respond(responses.encode(frame, size, result), respond.on_sent)

    def on_unanswered(self, ctx: PathContext, exchange: Exchange, reason: str) -> None:
        guard: Guard | None = exchange.guard
        if guard is not None and guard.pin is not None:
            guard.pin.on_unanswered(ctx, exchange, reason)


def _then(outcome: Any, then: Callable[[Respond], Any]) -> Any:
    """`then` applied to the response `outcome` gives, now or once its job is done."""
    if type(outcome) is Respond:
        return then(outcome)
    if type(outcome) is Defer:
        job = outcome.job
        finish = job.finish
        return Defer(dataclasses.replace(job, finish=lambda r: _then(finish(r), then)))
    return outcome


async def _lookup(ctx: PathContext) -> None:
    try:
        await ctx.topics.resolve(ctx.open_upstream)
    except (OSError, UpstreamError, TimeoutError, CodecError) as exc:
        log.warning("topic_id_lookup_failed", error=str(exc))


# ------------------------------------------------------------------ building answers


def _hide(response: Any, path: tuple[str, ...], names: frozenset[str],
          topics: TopicRegistry) -> Any:
    """`response` without the items of internal topics in its list at `path`."""

    def visible(items: Any) -> tuple[Any, ...] | None:
        if items is None:
            return None
        return tuple(i for i in items if _item_name(i, topics)[0] not in names)

    items = getattr(response, path[0], None)
    if items is None:
        return response
    if len(path) == 1:
        kept = visible(items)
        return response if kept == tuple(items) else dataclasses.replace(
            response, **{path[0]: kept})
    outers = tuple(dataclasses.replace(o, **{path[1]: visible(getattr(o, path[1]))})
                   for o in items)
    return dataclasses.replace(response, **{path[0]: outers})


def _merge(response: Any, shape: _Shape, request: Any, guard: Guard) -> Any:
    """`response` with an answer for every refused item, where its response has room for one
    (a listing without error codes just leaves the item out)."""
    path = shape[1]
    cls = type(response)
    if len(path) == 1:
        icls = entities.element_class(cls, path[0])
        added = [e for r in guard.refused if (e := _refusal(icls, r)) is not None]
        if not added:
            return response
        return dataclasses.replace(
            response, **{path[0]: (*(getattr(response, path[0]) or ()), *added)})
    ocls = entities.element_class(cls, path[0])
    icls = entities.element_class(ocls, path[1])
    outers = list(getattr(response, path[0]) or ())
    request_outers = getattr(request, shape[0][0], None) or () if request is not None else ()
    for r in guard.refused:
        entry = _refusal(icls, r)
        if entry is None or r.outer < 0:
            continue
        while len(outers) <= r.outer:
            # Answering the whole request: the group (or transaction) entry, copied from the
            # request's (same field names: group_id, transactional_id).
            src = request_outers[len(outers)] if len(outers) < len(request_outers) else None
            same = {f.name: getattr(src, f.name) for f in dataclasses.fields(ocls)
                    if src is not None and hasattr(src, f.name) and f.name != path[1]
                    and not isinstance(getattr(src, f.name), tuple)}
            outers.append(entities.build(ocls, **same))
        o = outers[r.outer]
        outers[r.outer] = dataclasses.replace(o, **{path[1]: (*getattr(o, path[1]), entry)})
    return dataclasses.replace(response, **{path[0]: tuple(outers)})


def _refusal(cls: type[Any], refused: _Refused) -> Any:
    """The response item of `cls` saying TOPIC_AUTHORIZATION_FAILED for one request item
    (per partition when both carry partitions); None when `cls` has no error code."""
    item = refused.item
    values: dict[str, Any] = {"num_partitions": -1, "replication_factor": -1}
    if hasattr(item, "resource_type"):
        values["resource_type"] = item.resource_type
        values["resource_name"] = item.resource_name
    # As Kafka's own refusals: an item named by id is answered with that id and no name, one
    # named by name with that name and the null id, so that a refusal discloses nothing the
    # client did not send (KafkaApis: "we should not return topicId on unauthorized error").
    topic_id = getattr(item, "topic_id", None)
    by_id = not is_null_id(topic_id) and not any(
        getattr(item, n, None) for n in _NAME_FIELDS)
    for n in _NAME_FIELDS:
        values[n] = None if by_id else refused.name
    values["topic_id"] = topic_id if not is_null_id(topic_id) else uuid.UUID(int=0)
    parts_field = _field(cls, _PART_FIELDS)
    asked = None if isinstance(item, str) else _partitions(item)
    if parts_field is not None and asked is not None:
        pcls = entities.element_class(cls, parts_field)
        error = _field(pcls, _ERROR_FIELDS)
        index = _field(pcls, _INDEX_FIELDS)
        if error is None or index is None:
            return None
        values[parts_field] = tuple(
            entities.build(pcls, **{index: p, error: DENIED, "error_message": MESSAGE,
                                    "high_watermark": -1, "last_stable_offset": -1,
                                    "log_start_offset": -1, "committed_offset": -1,
                                    "records": b""})
            for p in asked
        )
        if entities.has_field(cls, "error_code"):
            values["error_code"] = 0
        return entities.build(cls, **values)
    if not entities.has_field(cls, "error_code"):
        return None
    values["error_code"] = DENIED
    values["error_message"] = MESSAGE
    if parts_field is not None:
        values[parts_field] = ()
    return entities.build(cls, **values)


def _partitions(item: Any) -> list[int] | None:
    """The partition indexes a request item names (None: it names none)."""
    name = _field(type(item), _PART_FIELDS)
    if name is None:
        return None
    parts = getattr(item, name) or ()
    out = []
    for p in parts:
        if isinstance(p, int):
            out.append(int(p))
        else:
            index = _field(type(p), _INDEX_FIELDS)
            if index is not None:
                out.append(int(getattr(p, index)))
    return out
