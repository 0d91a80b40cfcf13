"""Topic administration through ``admin`` filters, like a validating/mutating admission webhook.

CreateTopics, CreatePartitions, AlterConfigs and IncrementalAlterConfigs are decoded only when
an admin filter is configured. Each item (a topic, a config resource) is offered to the filters
bound to its name as the *resulting* state: the partitions and replication factor asked for,
and the whole config the topic would have afterwards (for IncrementalAlterConfigs the proxy
reads the current config from the broker and applies SET/DELETE/APPEND/SUBTRACT). A denial
answers POLICY_VIOLATION with the filter's message for that item only; the other items go to
the broker, and the two answers are merged in request order of items.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sluice.codec import entities, schemas
from sluice.codec.error_codes import ErrorCode
from sluice.codec.errors import CodecError
from sluice.codec.headers import RequestHeader, response_header_bytes
from sluice.codec.messages import ApiKey, decode_request, encode_request, encode_response
from sluice.filters.admin import AdminResource, AdminVerdict
from sluice.filters.chain import FilterChain
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
    PathContext,
    Refuse,
    RequestOutcome,
    Respond,
    UpstreamOpener,
)
from sluice.proxy.telemetry.logs import log

POLICY_VIOLATION = ErrorCode.POLICY_VIOLATION
TOPIC_RESOURCE = 2
SET, DELETE, APPEND, SUBTRACT = 0, 1, 2, 3

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


@dataclass(slots=True)
class _Denied:
    item: Any
    message: str


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
        out[str(result.resource_name)] = {str(c.name): c.value for c in result.configs}
    return out


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


def _result_entity(api: ApiKey, cls: type[Any], item: Any, message: str) -> Any:
    if api in (ApiKey.CREATE_TOPICS, ApiKey.CREATE_PARTITIONS):
        return entities.build(
            cls,
            name=item.name,
            error_code=POLICY_VIOLATION,
            error_message=message,
            num_partitions=-1,
            replication_factor=-1,
            configs=None,
        )
    return entities.build(
        cls,
        error_code=POLICY_VIOLATION,
        error_message=message,
        resource_type=item.resource_type,
        resource_name=item.resource_name,
    )


def _merge(api: ApiKey, response: Any, denied: list[_Denied]) -> Any:
    spec = _APIS[api]
    cls = entities.element_class(type(response), spec.results)
    extra = tuple(_result_entity(api, cls, d.item, d.message) for d in denied)
    return dataclasses.replace(
        response, **{spec.results: (*getattr(response, spec.results), *extra)}
    )


class AdminPath:
    """Topic administration requests, decoded only while an admin filter is in force."""

    name = "admin"
    api_keys = frozenset(int(k) for k in ADMIN_APIS)

    def wants_request(self, ctx: PathContext, api_key: int) -> bool:
        return ctx.filters_on("admin")

    def wants_response(self, ctx: PathContext, api_key: int, version: int) -> bool:
        return False  # answers to changed requests are pinned by the request

    def on_request(self, ctx: PathContext, exchange: Exchange, frame: Frame) -> RequestOutcome:
        header = exchange.header
        chain = ctx.chain
        api = ApiKey(header.api_key)
        spec = _APIS[api]
        try:
            request = decode_request(api, header.api_version, frame[header.header_size :])
        except CodecError as exc:
            return Refuse(f"cannot decode {api.name} v{header.api_version}: {exc}")
        items = list(getattr(request, spec.items))
        principal = exchange.client.principal
        if chain is None or not any(
            chain.applies(spec.name_of(i), "admin", principal) for i in items
        ):
            return Forward()
        if api != ApiKey.INCREMENTAL_ALTER_CONFIGS:
            return self._decide(ctx, chain, exchange, frame, request, items, {})
        names = [spec.name_of(i) for i in items if int(i.resource_type) == TOPIC_RESOURCE]

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
                denied_all = [
                    _Denied(i, f"sluice: cannot read current config to validate: {found}")
                    for i in items
                ]
                return Answer(_answer(header, api, denied_all))
            return self._decide(ctx, chain, exchange, frame, request, items, found)

        return Defer(Job(run=current, finish=decide, in_thread=False, what="config look-up"))

    def _decide(
        self,
        ctx: PathContext,
        chain: FilterChain,
        exchange: Exchange,
        frame: Frame,
        request: Any,
        items: list[Any],
        currents: dict[str, dict[str, str | None]],
    ) -> RequestOutcome:
        # `chain` is the one this request started with: a hot reload may have installed
        # another while the request awaited the broker's current config.
        header = exchange.header
        api = ApiKey(header.api_key)
        spec = _APIS[api]
        client = exchange.client
        kept: list[Any] = []
        denied: list[_Denied] = []
        for item in items:
            name = spec.name_of(item)
            resource = None
            if chain.applies(name, "admin", client.principal):
                resource = _resource(api, item, client, currents.get(name))
            if resource is None:
                kept.append(item)
                continue
            verdict = chain.run_admin(resource)
            _emit(ctx, client, chain, resource, verdict)
            if verdict.decision == "deny":
                denied.append(_Denied(item, verdict.message or "denied by policy"))
            elif verdict.decision == "rewrite":
                kept.append(_rewrite(api, item, verdict, resource, currents.get(name)))
            else:
                kept.append(item)
        if not denied and all(a is b for a, b in zip(kept, items, strict=True)):
            return Forward()
        if not kept:
            return Answer(_answer(header, api, denied))
        new_body = encode_request(dataclasses.replace(request, **{spec.items: tuple(kept)}))
        return Forward(frame=bytes(frame[: header.header_size]) + new_body, state=denied, pin=self)

    def on_response(self, ctx: PathContext, exchange: Exchange, frame: Frame) -> Respond:
        denied: list[_Denied] = exchange.state
        api = ApiKey(exchange.header.api_key)
        return Respond(
            responses.transform(
                exchange.header,
                frame,
                ctx.map_endpoint,
                lambda r: _merge(api, r, denied) if denied else r,
            )
        )


def _answer(header: RequestHeader, api: ApiKey, denied: list[_Denied]) -> bytes:
    cls = entities.response_class(api, header.api_version)
    empty = entities.build(cls, **{_APIS[api].results: ()})
    body = encode_response(_merge(api, empty, denied))
    return response_header_bytes(header.correlation_id, header.api_key, header.api_version) + body


def _emit(
    ctx: PathContext,
    client: ClientInfo,
    chain: FilterChain,
    resource: AdminResource,
    verdict: AdminVerdict,
) -> None:
    filters = chain.filters_for(resource.name, "admin", client.principal)
    deciding = next(
        (f for f in filters if f.name == verdict.filter), filters[0] if filters else None
    )
    ctx.telemetry.admin_decision(
        client,
        op=resource.op,
        resource_type=resource.resource_type,
        resource=resource.name,
        decision=verdict.decision,
        message=verdict.message,
        filter_name=deciding.name if deciding else "",
        module_sha256=deciding.sha256 if deciding else "",
        error_code=POLICY_VIOLATION if verdict.decision == "deny" else 0,
    )
