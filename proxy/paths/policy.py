"""Data policies set with Kafka's own tools: the ``x-data-policy`` topic config.

While the proxy follows a fleet (`PathContext.policies`), AlterConfigs and
IncrementalAlterConfigs are always decoded and every ``x-data-policy`` entry of a topic
resource is taken out before the request reaches the broker (the broker never sees the key):

- IncrementalAlterConfigs SET stores the policy, DELETE removes it; APPEND and SUBTRACT get
  INVALID_CONFIG. AlterConfigs replaces a topic's whole dynamic config, so a topic resource
  naming ``x-data-policy`` sets it and one that does not name it deletes the policy in force
  (Kafka's semantics; the other keys of the request still go to the broker).
- Only principals matching ``policy_admins`` may change a policy: others get
  TOPIC_AUTHORIZATION_FAILED for that resource (nothing of it is applied). A malformed value,
  or one naming a filter the fleet does not have or that does not load with the policy's
  config, gets INVALID_CONFIG with a message naming the field (``x-data-policy:
  filters[0].apply_to: ...``).
- The other config keys of a resource go to the broker untouched; the policy is stored only
  when the broker accepted them (a resource with nothing but ``x-data-policy`` is answered by
  the proxy). ``validate_only`` checks and stores nothing.

This module decides (`plan_alter`) and writes (`publish_changes`); `admin.py` composes it with
the admin filters and merges the answers in request order. `PolicyDescribePath` adds the key
with its value to DescribeConfigs answers for topics that have a policy.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Final

from sluice.codec import entities
from sluice.codec.error_codes import ErrorCode
from sluice.codec.errors import CodecError
from sluice.codec.messages import ApiKey, decode_request
from sluice.proxy.ops.policies import (
    CONFIG_KEY,
    Policy,
    PolicyError,
    parse_policy,
    topic_name_problem,
)
from sluice.proxy.paths import responses
from sluice.proxy.paths.base import (
    Exchange,
    Forward,
    Frame,
    PathContext,
    PolicyBook,
    Refuse,
    RequestOutcome,
    Respond,
)
from sluice.proxy.telemetry.logs import log

TOPIC_RESOURCE: Final = 2
SET, DELETE, APPEND, SUBTRACT = 0, 1, 2, 3
#: DescribeConfigs' config_source for the key (Kafka's DYNAMIC_TOPIC_CONFIG) and its type.
DYNAMIC_TOPIC_CONFIG: Final = 1
STRING_TYPE: Final = 2
DOCUMENTATION: Final = ("Sluice data policy: filters deployed in the fleet that the proxies "
                        "apply to this topic (kept by the proxies, not the broker).")


@dataclass(slots=True)
class Change:
    """A policy change one resource asks for: `value` None deletes."""

    topic: str
    value: str | None
    policy: Policy | None = None


@dataclass(slots=True)
class AlterPlan:
    """What the policy part of an alter request comes to, per resource index.

    `local` holds answers the proxy gives itself ((error code, message)); `sent` the items to
    pass on (``x-data-policy`` entries removed) for the other indices; `changes` the policy
    writes due, by index, once their resource is accepted; `refused` the changes refused here
    (for telemetry). admin.py uses the same plan for what its admin filters deny.
    """

    local: dict[int, tuple[int, str | None]] = field(default_factory=dict)
    sent: dict[int, Any] = field(default_factory=dict)
    changes: dict[int, Change] = field(default_factory=dict)
    refused: dict[int, Change] = field(default_factory=dict)
    validate_only: bool = False
    stripped: bool = False  # an unchanged x-data-policy entry was taken out of a resource

    @property
    def touched(self) -> bool:
        return bool(self.local or self.changes or self.stripped)


def is_policy_key(name: Any) -> bool:
    """``x-data-policy`` in any case: the broker must never see the key in any spelling."""
    return str(name).lower() == CONFIG_KEY


def _is_policy(entry: Any) -> bool:
    return is_policy_key(entry.name)


NO_FLEET: Final = (f"sluice: {CONFIG_KEY} needs a proxy that follows a fleet (a fleet: section "
                   "in its config); the key is never passed to the broker")
IN_CREATE: Final = (f"sluice: {CONFIG_KEY} cannot be set by CreateTopics: create the topic, then "
                    "set the policy with AlterConfigs / IncrementalAlterConfigs (a topic must "
                    "never exist for a moment without the policy it was created with)")


def mentions_policy(api: ApiKey, request: Any) -> bool:
    """Whether any item of an admin request names ``x-data-policy`` (any case)."""
    if api == ApiKey.CREATE_TOPICS:
        return any(_is_policy(c) for t in request.topics for c in (t.configs or ()))
    if api in (ApiKey.ALTER_CONFIGS, ApiKey.INCREMENTAL_ALTER_CONFIGS):
        return any(_is_policy(c) for r in request.resources for c in (r.configs or ()))
    return False


def plan_refusals(api: ApiKey, request: Any, items: list[Any], message: str) -> AlterPlan:
    """A plan that answers INVALID_CONFIG for every item naming ``x-data-policy`` and sends
    the others on (CreateTopics always; alters on a proxy without a fleet)."""
    plan = AlterPlan(validate_only=bool(getattr(request, "validate_only", False)))
    for i, item in enumerate(items):
        if any(_is_policy(c) for c in (item.configs or ())):
            plan.local[i] = (ErrorCode.INVALID_CONFIG, message)
        else:
            plan.sent[i] = item
    return plan


def plan_alter(api: ApiKey, request: Any, book: PolicyBook,
               principal: str | None) -> AlterPlan:
    """Split the ``x-data-policy`` entries out of an (Incremental)AlterConfigs request."""
    plan = AlterPlan(validate_only=bool(request.validate_only))
    for i, item in enumerate(request.resources):
        if int(item.resource_type) != TOPIC_RESOURCE:
            if any(_is_policy(c) for c in item.configs):
                plan.local[i] = (ErrorCode.INVALID_CONFIG,
                                 f"sluice: {CONFIG_KEY} is a topic config")
            else:
                plan.sent[i] = item
            continue
        topic = str(item.resource_name)
        ours = [c for c in item.configs if _is_policy(c)]
        rest = tuple(c for c in item.configs if not _is_policy(c))
        change: Change | None = None
        if len(ours) > 1:
            plan.local[i] = (ErrorCode.INVALID_CONFIG, f"{CONFIG_KEY}: named more than once")
            continue
        problem = topic_name_problem(topic)
        if problem is not None:
            if ours:
                # A policy names exactly one topic: no globs, nothing a glob could match.
                plan.local[i] = (ErrorCode.INVALID_CONFIG, f"sluice: {CONFIG_KEY}: {problem}")
            else:
                plan.sent[i] = item
            continue
        if api == ApiKey.ALTER_CONFIGS:
            if ours:
                change = Change(topic, ours[0].value)
            elif book.value(topic) is not None:
                # AlterConfigs replaces the whole dynamic config: leaving the key out removes
                # the policy, as Kafka would remove any other key.
                change = Change(topic, None)
        elif ours:
            op = int(ours[0].config_operation)
            if op in (APPEND, SUBTRACT):
                plan.local[i] = (ErrorCode.INVALID_CONFIG,
                                 f"{CONFIG_KEY}: only SET and DELETE apply (not a list config)")
                continue
            change = Change(topic, ours[0].value if op == SET else None)
        if change is not None and change.value == book.value(topic):
            # Nothing changes (a client's read-modify-write AlterConfigs re-sends the value it
            # described): no write, and no need to be a policy admin.
            change = None
            if ours and not rest:
                plan.local[i] = (ErrorCode.NONE, None)
                continue
            if ours:
                item = dataclasses.replace(item, configs=rest)
                plan.local.pop(i, None)
                plan.sent[i] = item
                plan.stripped = True
                continue
        if change is None:
            plan.sent[i] = item
            continue
        if not book.allows(principal):
            plan.refused[i] = change
            plan.local[i] = (ErrorCode.TOPIC_AUTHORIZATION_FAILED,
                             f"sluice: {principal or 'User:ANONYMOUS'} may not "
                             f"{'set' if change.value is not None else 'remove'} {CONFIG_KEY} "
                             f"of topic {topic!r} (not in policy_admins)")
            continue
        if change.value is not None:
            try:
                change.policy = parse_policy(change.value)
            except PolicyError as exc:
                plan.refused[i] = change
                plan.local[i] = (ErrorCode.INVALID_CONFIG, str(exc))
                continue
        plan.changes[i] = change
        if not ours:
            plan.sent[i] = item  # a plain AlterConfigs of other keys goes on as asked
        elif rest:
            plan.sent[i] = dataclasses.replace(item, configs=rest)
        else:
            # Only x-data-policy: answered here (for AlterConfigs too, so that setting a policy
            # does not send the broker an empty config, which would clear its other keys).
            plan.local[i] = (ErrorCode.NONE, None)
    return plan


def check_changes(book: PolicyBook, plan: AlterPlan) -> dict[int, PolicyError]:
    """Which policies being set cannot run (blocking: loads modules; run it in a thread)."""
    failed: dict[int, PolicyError] = {}
    for i, change in plan.changes.items():
        if change.policy is not None:
            problem = book.check(change.topic, change.policy)
            if problem is not None:
                failed[i] = problem
    return failed


def apply_checks(plan: AlterPlan, failed: dict[int, PolicyError]) -> None:
    """Turn failed checks into INVALID_CONFIG answers (nothing of those resources is sent)."""
    for i, problem in failed.items():
        change = plan.changes.pop(i, None)
        if change is not None:
            plan.refused[i] = change
        plan.sent.pop(i, None)
        plan.local[i] = (ErrorCode.INVALID_CONFIG, str(problem))


async def publish_changes(book: PolicyBook, changes: dict[int, Change],
                          principal: str | None) -> dict[int, tuple[int, str]]:
    """Store the changes in the fleet topic, one by one; the ones that failed, by index."""
    failed: dict[int, tuple[int, str]] = {}
    for i, change in changes.items():
        try:
            await book.publish(change.topic, change.value, principal)
        except TimeoutError:
            failed[i] = (ErrorCode.REQUEST_TIMED_OUT,
                         "sluice: timed out storing the policy in the fleet topic")
        except Exception as exc:  # any client failure: that resource fails, others go on
            log.warning("policy_store_failed", topic=change.topic,
                        error=str(exc) or type(exc).__name__)
            failed[i] = (ErrorCode.UNKNOWN_SERVER_ERROR,
                         f"sluice: cannot store the policy in the fleet topic: "
                         f"{str(exc) or type(exc).__name__}")
    return failed


def emit(exchange: Exchange, change: Change, code: int, message: str | None) -> None:
    """One ``admin`` telemetry event for a policy set or delete (or its refusal)."""
    client = exchange.client
    fields: dict[str, Any] = {
        "op": "set_policy" if change.value is not None else "delete_policy",
        "resource_type": "topic",
        "resource": change.topic,
        "decision": "allow" if code == 0 else ("error" if code in (
            ErrorCode.UNKNOWN_SERVER_ERROR, ErrorCode.REQUEST_TIMED_OUT) else "deny"),
        "message": message,
        "filter_name": CONFIG_KEY,
        "module_sha256": "",
        "error_code": int(code),
    }
    exchange.emit(lambda t: t.admin_decision(client, **fields))


# ------------------------------------------------------------------------------------------
# DescribeConfigs
# ------------------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class _Asked:
    keys: dict[str, tuple[str, ...] | None]  # topic -> configuration keys asked (None: all)
    synonyms: bool
    documentation: bool


class PolicyDescribePath:
    """DescribeConfigs while policies are on: topics with a policy show ``x-data-policy``."""

    name = "policy-describe"
    api_keys = frozenset({int(ApiKey.DESCRIBE_CONFIGS)})

    def wants_request(self, ctx: PathContext, api_key: int) -> bool:
        return ctx.policies is not None

    def wants_response(self, ctx: PathContext, api_key: int, version: int) -> bool:
        return False  # pinned by the request

    def on_request(self, ctx: PathContext, exchange: Exchange, frame: Frame) -> RequestOutcome:
        header = exchange.header
        try:
            request = decode_request(header.api_key, header.api_version,
                                     frame[header.header_size:])
        except CodecError as exc:
            return Refuse(f"cannot decode DESCRIBE_CONFIGS v{header.api_version}: {exc}")
        keys = {str(r.resource_name): (tuple(str(k) for k in r.configuration_keys)
                                       if r.configuration_keys is not None else None)
                for r in request.resources if int(r.resource_type) == TOPIC_RESOURCE}
        if not keys:
            return Forward()
        asked = _Asked(keys, bool(request.include_synonyms),
                       bool(getattr(request, "include_documentation", False)))
        return Forward(state=asked, pin=self)

    def on_response(self, ctx: PathContext, exchange: Exchange, frame: Frame) -> Respond:
        asked: _Asked = exchange.state
        book = ctx.policies
        return Respond(responses.transform(
            exchange.header, frame, ctx.node_address,
            lambda r: add_policies(r, asked, book) if book is not None else r))

    def on_unanswered(self, ctx: PathContext, exchange: Exchange, reason: str) -> None:
        """Nothing to account for: the client sees the connection close."""


def add_policies(response: Any, asked: _Asked, book: PolicyBook) -> Any:
    """`response` with ``x-data-policy`` added to each topic result that has a policy."""
    rcls = entities.element_class(type(response), "results")
    ccls = entities.element_class(rcls, "configs")
    changed = False
    results = []
    for result in response.results:
        topic = str(result.resource_name)
        value = book.value(topic) if (int(result.resource_type) == TOPIC_RESOURCE
                                      and int(result.error_code) == 0
                                      and topic in asked.keys) else None
        wanted = asked.keys.get(topic)
        if value is None or (wanted is not None and CONFIG_KEY not in wanted):
            results.append(result)
            continue
        synonyms: tuple[Any, ...] = ()
        if asked.synonyms:
            scls = entities.element_class(ccls, "synonyms")
            synonyms = (entities.build(scls, name=CONFIG_KEY, value=value,
                                       source=DYNAMIC_TOPIC_CONFIG),)
        entry = entities.build(
            ccls, name=CONFIG_KEY, value=value, read_only=False,
            config_source=DYNAMIC_TOPIC_CONFIG, is_sensitive=False, synonyms=synonyms,
            config_type=STRING_TYPE,
            documentation=DOCUMENTATION if asked.documentation else None)
        others = tuple(c for c in result.configs if str(c.name) != CONFIG_KEY)
        results.append(dataclasses.replace(result, configs=(*others, entry)))
        changed = True
    return dataclasses.replace(response, results=tuple(results)) if changed else response
