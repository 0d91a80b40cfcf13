"""Topic administration through ``admin`` filters, like a validating/mutating admission webhook.

CreateTopics, CreatePartitions, AlterConfigs and IncrementalAlterConfigs are decoded only when
an admin filter is configured. Each item (a topic, a config resource) is offered to the filters
bound to its name as the *resulting* state: the partitions and replication factor asked for,
and the whole config the topic would have afterwards (for IncrementalAlterConfigs the proxy
reads the current config from the broker and applies SET/DELETE/APPEND/SUBTRACT). A denial
answers POLICY_VIOLATION with the filter's message for that item only; the other items go to
the broker, and the two answers are merged in request order of items.

While data policies are on (a fleet is followed), (Incremental)AlterConfigs are decoded
whatever the filters, and the ``x-data-policy`` entries are handled first (paths/policy.py):
admin filters then judge what is left for the broker, never the policy itself.

Auto-creation is creation too: while an admin filter is in force, a Metadata request that lets
the broker create the topics it names (``allow_auto_topic_creation``) offers each name bound
to an admin filter as a CreateTopics item with the broker's defaults. If any is not allowed
as it is and the cluster does not have it (the proxy looks its topics up), that name is
taken out of the request and answered UNKNOWN_TOPIC_OR_PARTITION, Kafka's answer for a topic
it did not create; the other names go on with auto-creation as the client asked, so an
allowed new topic named beside a refused one is still created, as by the broker directly.
Metadata v0-3 cannot carry that choice (the broker always may create): such a request naming
a refused topic is refused.
A Produce to a missing topic is the other way in: paths/internal_topics.py answers it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sluice.codec import entities, schemas
from sluice.codec.endpoints import rewrite_endpoints
from sluice.codec.error_codes import ErrorCode
from sluice.codec.errors import CodecError
from sluice.codec.headers import RequestHeader, response_header_bytes
from sluice.codec.messages import ApiKey, decode_request, encode_request, encode_response
from sluice.filters.admin import AdminResource, AdminVerdict
from sluice.filters.chain import FilterChain
from sluice.proxy.contract import ClientInfo, UpstreamError
from sluice.proxy.ops.policies import CONFIG_KEY
from sluice.proxy.paths import policy, responses
from sluice.proxy.paths.addresses import learn_metadata
from sluice.proxy.paths.base import (
    Answer,
    Defer,
    Exchange,
    Forward,
    Frame,
    Job,
    PathContext,
    Refuse,
    RequestOutcome,
    Respond,
    UpstreamOpener,
)
from sluice.proxy.paths.policy import AlterPlan
from sluice.proxy.telemetry.logs import log

#: The data-policy config key as bytes, to look for it (any case) in a frame not decoded.
_POLICY_KEY = CONFIG_KEY.encode()

POLICY_VIOLATION = ErrorCode.POLICY_VIOLATION
TOPIC_RESOURCE = 2
SET, DELETE, APPEND, SUBTRACT = 0, 1, 2, 3

ALTER_KEYS = frozenset({int(ApiKey.ALTER_CONFIGS), int(ApiKey.INCREMENTAL_ALTER_CONFIGS)})
#: The first Metadata version that says whether the broker may create the topics it names.
AUTO_CREATE_FLAG_VERSION = 4
ADMIN_APIS = (
    ApiKey.CREATE_TOPICS,
    ApiKey.CREATE_PARTITIONS,
    ApiKey.ALTER_CONFIGS,
    ApiKey.INCREMENTAL_ALTER_CONFIGS,
)


@dataclass(frozen=True, slots=True)
class _Api:
    op: str
    items: str  # request field holding the items
    results: str  # response field holding per-item results
    name_of: Callable[[Any], str]


_APIS = {
    ApiKey.CREATE_TOPICS: _Api("create_topics", "topics", "topics", lambda i: str(i.name)),
    ApiKey.CREATE_PARTITIONS: _Api("create_partitions", "topics", "results", lambda i: str(i.name)),
    ApiKey.ALTER_CONFIGS: _Api(
        "alter_configs", "resources", "responses", lambda i: str(i.resource_name)
    ),
    ApiKey.INCREMENTAL_ALTER_CONFIGS: _Api(
        "incremental_alter_configs", "resources", "responses", lambda i: str(i.resource_name)
    ),
}


def _split_list(value: str | None) -> list[str]:
    return [v for v in (value or "").split(",") if v]


def apply_incremental(current: dict[str, str | None], ops: Any) -> dict[str, str | None]:
    """The config after IncrementalAlterConfigs operations (Kafka's semantics)."""
    result = dict(current)
    for op in ops:
        name, value, kind = str(op.name), op.value, int(op.config_operation)
        if kind == SET:
            result[name] = value
        elif kind == DELETE:
            result.pop(name, None)
        elif kind == APPEND:
            items = _split_list(result.get(name))
            items += [v for v in _split_list(value) if v not in items]
            result[name] = ",".join(items)
        elif kind == SUBTRACT:
            drop = set(_split_list(value))
            result[name] = ",".join(v for v in _split_list(result.get(name)) if v not in drop)
    return result


async def _current_configs(
    open_upstream: UpstreamOpener, names: list[str]
) -> dict[str, dict[str, str | None]]:
    conn = await open_upstream()
    try:
        version = conn.pick_version(ApiKey.DESCRIBE_CONFIGS)
        rcls = entities.element_class(
            schemas.request_schema(ApiKey.DESCRIBE_CONFIGS, version), "resources"
        )
        response = await conn.request(
            ApiKey.DESCRIBE_CONFIGS,
            version,
            resources=tuple(
                entities.build(
                    rcls, resource_type=TOPIC_RESOURCE, resource_name=n, configuration_keys=None
                )
                for n in names
            ),
            include_synonyms=False,
            include_documentation=False,
        )
    finally:
        await conn.close()
    out: dict[str, dict[str, str | None]] = {}
    for result in response.results:
        code = int(result.error_code)
        if code not in (0, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION):
            # E.g. TOPIC_AUTHORIZATION_FAILED when the proxy's user lacks DescribeConfigs: an
            # empty config would be judged instead of the real one (a rewrite's defaults
            # replacing values set on the topic). A missing topic stays empty: the broker
            # answers the alter itself.
            raise UpstreamError(
                f"DescribeConfigs of topic {str(result.resource_name)!r} refused by the broker:"
                f" {_error_name(code)} ({code})"
            )
        out[str(result.resource_name)] = {
            str(c.name): c.value for c in result.configs if _set_on_topic(c)
        }
    return out


def _error_name(code: int) -> str:
    try:
        return ErrorCode(code).name
    except ValueError:
        return "unknown error"


# DescribeConfigs' config_source values that mean "not set on the topic": a broker setting
# (dynamic, default or static) or the built-in default. Apache Kafka lists every key with
# these; Tansu lists only the keys set on the topic.
_NOT_SET_ON_TOPIC = frozenset({2, 3, 4, 5, 6})


def _set_on_topic(config: Any) -> bool:
    """Whether a DescribeConfigs entry is a value set on the topic itself (so a policy's
    `defaults` must not replace it), not a default the broker reports beside them."""
    # Every DescribeConfigs version the codec has (v1 on) carries config_source.
    return int(config.config_source) not in _NOT_SET_ON_TOPIC


def _resource(
    api: ApiKey, item: Any, client: ClientInfo, current: dict[str, str | None] | None
) -> AdminResource | None:
    op = _APIS[api].op
    common: dict[str, Any] = {"principal": client.principal, "client_id": client.client_id}
    if api == ApiKey.CREATE_TOPICS:
        return AdminResource(
            op=op,
            name=str(item.name),
            partitions=int(item.num_partitions) if int(item.num_partitions) >= 0 else None,
            replication_factor=int(item.replication_factor)
            if int(item.replication_factor) >= 0
            else None,
            configs={str(c.name): c.value for c in item.configs},
            **common,
        )
    if api == ApiKey.CREATE_PARTITIONS:
        return AdminResource(op=op, name=str(item.name), partitions=int(item.count), **common)
    if int(item.resource_type) != TOPIC_RESOURCE:
        return None  # broker configs are not topic policy
    if api == ApiKey.ALTER_CONFIGS:
        configs = {str(c.name): c.value for c in item.configs}
    else:
        configs = apply_incremental(current or {}, item.configs)
    return AdminResource(op=op, name=str(item.resource_name), configs=configs, **common)


def _rewrite(
    api: ApiKey,
    item: Any,
    verdict: AdminVerdict,
    before: AdminResource,
    current: dict[str, str | None] | None,
) -> Any:
    if api == ApiKey.CREATE_TOPICS:
        changes: dict[str, Any] = {}
        if verdict.partitions is not None:
            changes["num_partitions"] = type(item.num_partitions)(verdict.partitions)
        if verdict.configs is not None:
            ccls = entities.element_class(type(item), "configs")
            changes["configs"] = tuple(
                entities.build(ccls, name=k, value=v) for k, v in verdict.configs.items()
            )
        return dataclasses.replace(item, **changes)
    if api == ApiKey.CREATE_PARTITIONS:
        if verdict.partitions is None:
            return item
        return dataclasses.replace(item, count=type(item.count)(verdict.partitions))
    if verdict.configs is None:
        return item
    ccls = entities.element_class(type(item), "configs")
    if api == ApiKey.ALTER_CONFIGS:
        return dataclasses.replace(
            item,
            configs=tuple(
                entities.build(ccls, name=k, value=v) for k, v in verdict.configs.items()
            ),
        )
    # Incremental: express the rewritten resulting config as operations on the current one.
    base = current or {}
    ops = [
        entities.build(ccls, name=k, config_operation=SET, value=v)
        for k, v in verdict.configs.items()
        if base.get(k) != v or k not in base
    ]
    ops += [
        entities.build(ccls, name=k, config_operation=DELETE, value=None)
        for k in base
        if k not in verdict.configs
    ]
    return dataclasses.replace(item, configs=tuple(ops))


def _result_entity(api: ApiKey, cls: type[Any], item: Any, code: int,
                   message: str | None) -> Any:
    if api in (ApiKey.CREATE_TOPICS, ApiKey.CREATE_PARTITIONS):
        return entities.build(
            cls,
            name=item.name,
            error_code=code,
            error_message=message,
            num_partitions=-1,
            replication_factor=-1,
            configs=None,
        )
    return entities.build(
        cls,
        error_code=code,
        error_message=message,
        resource_type=item.resource_type,
        resource_name=item.resource_name,
    )


def _result_name(result: Any) -> str:
    return str(getattr(result, "resource_name", None) or getattr(result, "name", ""))


def _broker_results(api: ApiKey, plan: AlterPlan, items: list[Any],
                    results: tuple[Any, ...]) -> dict[int, Any]:
    """The broker's result for each item index sent to it (it answers in request order;
    matched by name should a broker answer otherwise)."""
    sent = sorted(plan.sent)
    pairs = list(zip(sent, results, strict=False))
    if len(results) == len(sent) and all(
        _result_name(r) == _APIS[api].name_of(items[i]) for i, r in pairs
    ):
        return dict(pairs)
    found: dict[int, Any] = {}
    unused = list(results)
    for i in sent:
        name = _APIS[api].name_of(items[i])
        match = next((r for r in unused if _result_name(r) == name), None)
        if match is not None:
            unused.remove(match)
            found[i] = match
    return found


def _merged(api: ApiKey, response: Any, plan: AlterPlan, items: list[Any],
            failed: dict[int, tuple[int, str]]) -> Any:
    """`response` (the broker's, or an empty one) with the proxy's answers, in item order."""
    spec = _APIS[api]
    cls = entities.element_class(type(response), spec.results)
    broker = _broker_results(api, plan, items, getattr(response, spec.results))
    out = []
    for i, item in enumerate(items):
        if i in failed:
            out.append(_result_entity(api, cls, item, *failed[i]))
        elif i in plan.local:
            out.append(_result_entity(api, cls, item, *plan.local[i]))
        elif i in broker:
            out.append(broker[i])
    return dataclasses.replace(response, **{spec.results: tuple(out)})


@dataclass(slots=True)
class _Sent:
    """What the response path needs: the plan and the request's items."""

    plan: AlterPlan
    items: list[Any]


class AdminPath:
    """Topic administration requests: decoded while an admin filter is in force, and
    (Incremental)AlterConfigs always while data policies are on (paths/policy.py)."""

    name = "admin"
    api_keys = frozenset({*(int(k) for k in ADMIN_APIS), int(ApiKey.METADATA)})

    def wants_request(self, ctx: PathContext, api_key: int) -> bool:
        # Always: ``x-data-policy`` (any case) is handled here, never passed to the broker.
        return api_key != int(ApiKey.CREATE_PARTITIONS) or ctx.filters_on("admin")

    def wants_response(self, ctx: PathContext, api_key: int, version: int) -> bool:
        return False  # answers to changed requests are pinned by the request

    def relays_undecodable(self, ctx: PathContext, header: Any, frame: Frame) -> bool:
        """An old version the codec cannot decode (CreateTopics v0 from Sarama 1.22) may pass
        when no admin filter is in force and no ``x-data-policy`` key (any case) occurs in
        its bytes: then this path would forward it unchanged."""
        if ctx.filters_on("admin"):
            return False
        return _POLICY_KEY not in bytes(frame[header.header_size :]).lower()

    def on_request(self, ctx: PathContext, exchange: Exchange, frame: Frame) -> RequestOutcome:
        header = exchange.header
        chain = ctx.chain
        api = ApiKey(header.api_key)
        if api == ApiKey.METADATA:
            return self._auto_creation(ctx, exchange, frame)
        spec = _APIS[api]
        try:
            request = decode_request(api, header.api_version, frame[header.header_size :])
        except CodecError as exc:
            return Refuse(f"cannot decode {api.name} v{header.api_version}: {exc}")
        items = list(getattr(request, spec.items))
        principal = exchange.client.principal
        plan: AlterPlan | None = None
        book = ctx.policies
        if book is not None and api in ALTER_KEYS:
            plan = policy.plan_alter(api, request, book, principal)
            if not plan.touched:
                plan = None
        elif policy.mentions_policy(api, request):
            plan = policy.plan_refusals(api, request, items, policy.IN_CREATE
                                        if api == ApiKey.CREATE_TOPICS else policy.NO_FLEET)
        filtered = (
            ctx.filters_on("admin")
            and chain is not None
            and any(chain.applies(spec.name_of(i), "admin", principal) for i in items)
        )
        if plan is None and not filtered:
            return Forward()
        if plan is None:
            plan = AlterPlan(sent=dict(enumerate(items)),
                             validate_only=bool(getattr(request, "validate_only", False)))
        work = plan

        def filters_stage() -> RequestOutcome:
            if not filtered or chain is None or not work.sent:
                return self._conclude(ctx, exchange, frame, request, items, work)
            return self._filter_stage(ctx, chain, exchange, frame, request, items, work)

        if book is not None and any(c.policy is not None for c in work.changes.values()):
            # Whether the policy's filters exist and load: module init, off the event loop.
            def checked(failed: dict[int, Any]) -> RequestOutcome:
                policy.apply_checks(work, failed)
                return filters_stage()

            return Defer(Job(run=lambda: policy.check_changes(book, work), finish=checked,
                             in_thread=True, what="policy check"))
        return filters_stage()

    def _auto_creation(self, ctx: PathContext, exchange: Exchange, frame: Frame) -> RequestOutcome:
        """A Metadata request that may create topics: the admin filters judge the creation."""
        header = exchange.header
        chain = ctx.chain
        try:
            request = decode_request(ApiKey.METADATA, header.api_version,
                                     frame[header.header_size :])
        except CodecError as exc:
            return Refuse(f"cannot decode METADATA v{header.api_version}: {exc}")
        may_create = (header.api_version < AUTO_CREATE_FLAG_VERSION
                      or bool(request.allow_auto_topic_creation))
        client = exchange.client
        names = [str(t.name) for t in request.topics or () if t.name]
        judged = [n for n in dict.fromkeys(names)
                  if chain is not None and chain.applies(n, "admin", client.principal)]
        if not may_create or chain is None or not judged:
            return Forward()
        resources = [AdminResource(op="create_topics", name=n, principal=client.principal,
                                   client_id=client.client_id) for n in judged]

        def run() -> list[AdminVerdict]:
            return [chain.run_admin(r) for r in resources]

        def finish(verdicts: list[AdminVerdict]) -> RequestOutcome:
            refused = []
            for resource, verdict in zip(resources, verdicts, strict=True):
                if verdict.decision != "allow":
                    # A rewrite cannot apply to a topic the broker creates with its defaults.
                    _emit(exchange, chain, resource, dataclasses.replace(
                        verdict, decision="deny",
                        message=verdict.message or "auto-creation needs a rewrite"))
                    refused.append(resource.name)
            if not refused:
                return Forward()
            if header.api_version < AUTO_CREATE_FLAG_VERSION:
                return Refuse(f"METADATA v{header.api_version} lets the broker create "
                              f"{', '.join(refused)}, which the admin filters refuse")
            return Defer(Job(run=lambda: _existing(ctx.open_upstream, refused),
                             finish=lambda found: _without_absent(exchange, frame, request,
                                                                  set(refused), found),
                             in_thread=False, what="topic look-up"))

        return Defer(Job(run=run, finish=finish, in_thread=True, what="auto-creation check"))

    def _filter_stage(
        self,
        ctx: PathContext,
        chain: FilterChain,
        exchange: Exchange,
        frame: Frame,
        request: Any,
        items: list[Any],
        plan: AlterPlan,
    ) -> RequestOutcome:
        header = exchange.header
        api = ApiKey(header.api_key)
        if api != ApiKey.INCREMENTAL_ALTER_CONFIGS:
            self._decide(ctx, chain, exchange, plan, {})
            return self._conclude(ctx, exchange, frame, request, items, plan)
        names = [
            _APIS[api].name_of(i) for i in plan.sent.values()
            if int(i.resource_type) == TOPIC_RESOURCE
        ]

        async def current() -> Any:
            try:
                return await _current_configs(ctx.open_upstream, names)
            except (OSError, UpstreamError, TimeoutError, CodecError) as exc:
                return exc

        def decide(found: Any) -> RequestOutcome:
            if isinstance(found, Exception):
                # Without the current config the result cannot be validated: refuse, do not
                # guess.
                log.warning("admin_current_config_failed", error=str(found))
                for i in list(plan.sent):
                    plan.local[i] = (
                        POLICY_VIOLATION, f"sluice: cannot read current config to validate: {found}"
                    )
                    del plan.sent[i]
                    plan.changes.pop(i, None)
            else:
                self._decide(ctx, chain, exchange, plan, found)
            return self._conclude(ctx, exchange, frame, request, items, plan)

        return Defer(Job(run=current, finish=decide, in_thread=False, what="config look-up"))

    def _decide(
        self,
        ctx: PathContext,
        chain: FilterChain,
        exchange: Exchange,
        plan: AlterPlan,
        currents: dict[str, dict[str, str | None]],
    ) -> None:
        # `chain` is the one this request started with: a hot reload may have installed
        # another while the request awaited the broker's current config.
        api = ApiKey(exchange.header.api_key)
        spec = _APIS[api]
        client = exchange.client
        for i, item in sorted(plan.sent.items()):
            name = spec.name_of(item)
            if not chain.applies(name, "admin", client.principal):
                continue
            resource = _resource(api, item, client, currents.get(name))
            if resource is None:
                continue
            verdict = chain.run_admin(resource)
            _emit(exchange, chain, resource, verdict)
            if verdict.decision == "deny":
                plan.local[i] = (POLICY_VIOLATION, verdict.message or "denied by policy")
                del plan.sent[i]
                plan.changes.pop(i, None)
            elif verdict.decision == "rewrite":
                plan.sent[i] = _rewrite(api, item, verdict, resource, currents.get(name))

    def _conclude(
        self,
        ctx: PathContext,
        exchange: Exchange,
        frame: Frame,
        request: Any,
        items: list[Any],
        plan: AlterPlan,
    ) -> RequestOutcome:
        header = exchange.header
        api = ApiKey(header.api_key)
        spec = _APIS[api]
        for i, change in plan.refused.items():
            code, message = plan.local[i]
            policy.emit(exchange, change, code, message)
        if not plan.sent:
            # Nothing for the broker: answer now, once the policies are stored.
            def answer(failed: dict[int, tuple[int, str]]) -> Answer:
                return Answer(_answer(header, api, plan, items, failed))

            changes = _due(plan, set(plan.local))
            return self._with_writes(ctx, exchange, plan, changes, answer)
        unchanged = not plan.local and all(plan.sent.get(i) is it for i, it in enumerate(items))
        if unchanged and not plan.changes:
            return Forward()
        new_frame: Frame | None = None
        if not unchanged:
            sent = tuple(plan.sent[i] for i in sorted(plan.sent))
            new_frame = bytes(frame[: header.header_size]) + encode_request(
                dataclasses.replace(request, **{spec.items: sent})
            )
        return Forward(frame=new_frame, state=_Sent(plan, items), pin=self)

    def _with_writes(
        self,
        ctx: PathContext,
        exchange: Exchange,
        plan: AlterPlan,
        changes: dict[int, policy.Change],
        then: Callable[[dict[int, tuple[int, str]]], Any],
    ) -> Any:
        """Store `changes` (not with validate_only), emit their telemetry, then `then`."""
        book = ctx.policies
        client = exchange.client

        def done(failed: dict[int, tuple[int, str]]) -> Any:
            for i, change in changes.items():
                code, message = failed.get(i, (0, "validate only: not stored"
                                               if plan.validate_only else None))
                policy.emit(exchange, change, code, message)
            return then(failed)

        if not changes or plan.validate_only or book is None:
            return done({})
        return Defer(Job(run=lambda: policy.publish_changes(book, changes, client.principal),
                         finish=done, in_thread=False, what="policy store"))

    def on_response(self, ctx: PathContext, exchange: Exchange, frame: Frame) -> Any:
        sent: _Sent = exchange.state
        header = exchange.header
        api = ApiKey(header.api_key)
        plan, items = sent.plan, sent.items
        accepted: set[int] = set(plan.local)
        if plan.changes:
            _size, response = responses.decode(header, frame)
            broker = _broker_results(api, plan, items, getattr(response, _APIS[api].results))
            accepted |= {i for i, r in broker.items() if int(r.error_code) == 0}
        changes = _due(plan, accepted)

        def respond(failed: dict[int, tuple[int, str]]) -> Respond:
            return Respond(
                responses.transform(
                    header, frame, ctx.node_address, lambda r: _merged(api, r, plan, items, failed)
                )
            )

        return self._with_writes(ctx, exchange, plan, changes, respond)

    def on_unanswered(self, ctx: PathContext, exchange: Exchange, reason: str) -> None:
        """Nothing to account for: the client sees the connection close."""


def _due(plan: AlterPlan, accepted: set[int]) -> dict[int, policy.Change]:
    """The policy changes whose resource was accepted (by the proxy alone, or the broker)."""
    return {
        i: c for i, c in plan.changes.items()
        if i in accepted and plan.local.get(i, (0, None))[0] == 0
    }


def _answer(
    header: RequestHeader,
    api: ApiKey,
    plan: AlterPlan,
    items: list[Any],
    failed: dict[int, tuple[int, str]],
) -> bytes:
    cls = entities.response_class(api, header.api_version)
    empty = entities.build(cls, **{_APIS[api].results: ()})
    body = encode_response(_merged(api, empty, plan, items, failed))
    return response_header_bytes(header.correlation_id, header.api_key, header.api_version) + body


def _emit(
    exchange: Exchange,
    chain: FilterChain,
    resource: AdminResource,
    verdict: AdminVerdict,
) -> None:
    client = exchange.client
    filters = chain.filters_for(resource.name, "admin", client.principal)
    deciding = next(
        (f for f in filters if f.name == verdict.filter), filters[0] if filters else None
    )
    fields: dict[str, Any] = {
        "op": resource.op,
        "resource_type": resource.resource_type,
        "resource": resource.name,
        "decision": verdict.decision,
        "message": verdict.message,
        "filter_name": deciding.name if deciding else "",
        "module_sha256": deciding.sha256 if deciding else "",
        "error_code": POLICY_VIOLATION if verdict.decision == "deny" else 0,
    }
    exchange.emit(lambda t: t.admin_decision(client, **fields))


async def _existing(open_upstream: UpstreamOpener, names: list[str]) -> set[str] | None:
    """Which of `names` the cluster has (a Metadata request for them that creates nothing,
    asked now: the topic registry may be a second behind); None if the look-up failed."""
    try:
        conn = await open_upstream()
        try:
            version = conn.pick_version(ApiKey.METADATA, ceiling=12)
            tcls = entities.element_class(schemas.request_schema(ApiKey.METADATA, version),
                                          "topics")
            response = await conn.request(
                ApiKey.METADATA, version,
                topics=tuple(entities.build(tcls, name=n) for n in names),
                allow_auto_topic_creation=False,
                include_topic_authorized_operations=False,
            )
        finally:
            await conn.close()
    except (OSError, UpstreamError, TimeoutError, CodecError) as exc:
        log.warning("topic_lookup_failed", error=str(exc) or type(exc).__name__)
        return None
    return {str(t.name) for t in response.topics or () if int(t.error_code) == 0}


def _without_absent(exchange: Exchange, frame: Frame, request: Any, refused: set[str],
                    existing: set[str] | None) -> RequestOutcome:
    """The auto-creating Metadata `request` without the refused names the cluster does not
    have (answered UNKNOWN_TOPIC_OR_PARTITION by `_NotCreated`); the rest as asked. Without an
    answer to the look-up, auto-creation is turned off for the whole request (fail closed)."""
    header = exchange.header
    if existing is None:
        body = encode_request(dataclasses.replace(request, allow_auto_topic_creation=False))
        return Forward(frame=bytes(frame[: header.header_size]) + body)
    absent = refused - existing
    if not absent:
        return Forward()  # they exist: auto-creation cannot create them
    kept = tuple(t for t in request.topics or () if str(t.name) not in absent)
    body = encode_request(dataclasses.replace(request, topics=kept))
    return Forward(frame=bytes(frame[: header.header_size]) + body, pin=_NotCreated(absent))


@dataclass(frozen=True, slots=True)
class _NotCreated:
    """The Metadata response of a request whose refused, absent topics were taken out: their
    entries added back with UNKNOWN_TOPIC_OR_PARTITION (the address path's work done too)."""

    names: frozenset[str] | set[str]

    def on_response(self, ctx: PathContext, exchange: Exchange, frame: Frame) -> Respond:
        header = exchange.header

        def added(response: Any) -> Any:
            tcls = entities.element_class(type(response), "topics")
            unknown = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
            entries = tuple(entities.build(tcls, name=n, error_code=unknown)
                            for n in sorted(self.names))
            return dataclasses.replace(response, topics=(*(response.topics or ()), *entries))

        size, decoded = responses.decode(header, frame)
        learn_metadata(ctx, decoded)
        final = added(rewrite_endpoints(decoded, header.api_key, header.api_version,
                                        ctx.node_address))
        return Respond(responses.encode(frame, size, final))

    def on_unanswered(self, ctx: PathContext, exchange: Exchange, reason: str) -> None:
        """Nothing to account for: the client sees the connection close."""
