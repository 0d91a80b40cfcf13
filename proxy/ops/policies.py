"""Data policies: the ``x-data-policy`` topic config, its fleet record and the filters it binds.

A data policy binds filters deployed in the fleet (by name) to one topic, for the directions
it names, with config overrides. It is set with Kafka's own tools, through the proxy::

    kafka-configs.sh --bootstrap-server PROXY --alter --entity-type topics --entity-name orders \\
        --add-config 'x-data-policy={"filters":[{"name":"pii","apply_to":"produce"}]}'

The value is JSON::

    {"filters": [{"name": "pii", "apply_to": ["produce", "fetch"], "config": {"mask": "#"}}]}

- ``filters`` (required, 1..16 entries): each names a filter deployed in the fleet (``name``),
  the directions (``apply_to``: ``"produce"``, ``"fetch"`` or a list of them; required) and
  ``config`` (optional object): merged over the deployed filter's own config, key by key (the
  policy's keys win).

`parse_policy` validates a value (`PolicyError` names the field, e.g. ``filters[0].apply_to``).
The proxy stores a policy in the fleet topic under the key ``policy:<topic>``
(`policy_record_value`; an empty value deletes it) and every proxy following the fleet binds
the filters (`policy_specs`): the policy *adds* a binding of each named filter to exactly that
topic, a copy named ``policy:<topic>/<filter>`` that runs after the config file's and the
fleet's own filters; the deployed filter's own ``topics`` binding stays as it is.

A policy whose filter is not deployed (removed after the policy was set), or whose binding does
not load, or a policy record that cannot be parsed, fails closed for its topic: a
``builtin:block`` host filter stands in for it and fails every partition of that topic in the
policy's directions with KAFKA_STORAGE_ERROR (retriable), so clients retry until the filter is
back, and nothing passes unfiltered.
"""

from __future__ import annotations

import dataclasses
import json
import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from fnmatch import translate
from typing import Any, Final

from sluice.filters.config import FilterSpec
from sluice.filters.principal import ANONYMOUS
from sluice.filters.yaml_lines import LineMap

CONFIG_KEY: Final = "x-data-policy"
POLICY_PREFIX: Final = "policy:"
FORMAT_VERSION: Final = 1
MAX_VALUE_BYTES: Final = 64 * 1024
MAX_FILTERS: Final = 16
DIRECTIONS: Final = ("produce", "fetch")
#: The error a topic whose policy cannot be applied answers (56 KAFKA_STORAGE_ERROR, retriable).
BLOCKED_ERROR_CODE: Final = 56
_TOP_KEYS: Final = ("filters",)
_ENTRY_KEYS: Final = ("name", "apply_to", "config")
_NAME: Final = re.compile(r"^[A-Za-z0-9._-]{1,249}$")


def valid_topic_name(name: str) -> bool:
    """A legal Kafka topic name ([a-zA-Z0-9._-], 1..249 characters, not "." or "..").

    Policies bind exactly one topic: such a name holds no glob character, so the bindings
    built from it (whose ``topics`` are globs) match that topic alone.
    """
    return bool(_NAME.match(name)) and name not in (".", "..")


def topic_name_problem(name: str) -> str | None:
    """Why `name` cannot be a policy's topic (None: it can)."""
    if valid_topic_name(name):
        return None
    return (f"{name!r} is not a Kafka topic name (a policy names exactly one topic: letters, "
            "digits, '.', '_' and '-', at most 249, not '.' or '..'; no globs)")


class PolicyError(ValueError):
    """A malformed ``x-data-policy`` value; `field` says which part (``filters[0].name``)."""

    def __init__(self, field: str, reason: str) -> None:
        super().__init__(f"{CONFIG_KEY}: {field}: {reason}" if field else f"{CONFIG_KEY}: {reason}")
        self.field = field
        self.reason = reason


@dataclass(frozen=True, slots=True)
class PolicyFilter:
    """One filter a policy binds: its fleet name, directions and config overrides."""

    name: str
    apply_to: tuple[str, ...]
    config: Mapping[str, Any]


@dataclass(frozen=True, slots=True)
class Policy:
    filters: tuple[PolicyFilter, ...]


def _kind(value: Any) -> str:
    return {dict: "an object", list: "a list", str: "a string", bool: "a boolean",
            type(None): "null"}.get(type(value), "a number")


def parse_policy(text: str | None) -> Policy:
    """Validate an ``x-data-policy`` value (PolicyError names the field at fault)."""
    if text is None or not text.strip():
        raise PolicyError("", "the value is empty (delete the key to remove the policy)")
    if len(text.encode("utf-8")) > MAX_VALUE_BYTES:
        raise PolicyError("", f"the value is longer than {MAX_VALUE_BYTES} bytes")
    try:
        raw = json.loads(text)
    except ValueError as exc:
        raise PolicyError("", f"not JSON ({exc})") from None
    if not isinstance(raw, dict):
        raise PolicyError("", f"must be a JSON object, got {_kind(raw)}")
    for key in raw:
        if key not in _TOP_KEYS:
            raise PolicyError(str(key), f"unknown field (expected {', '.join(_TOP_KEYS)})")
    entries = raw.get("filters")
    if isinstance(entries, dict):
        # kafka-configs.sh drops every `[` and `]` of an --add-config value, so a policy of
        # one filter written as the docs show arrives with that filter as an object.
        entries = [entries]
    if not isinstance(entries, list):
        raise PolicyError("filters", f"required: a list of filters, got {_kind(entries)}")
    if not entries or len(entries) > MAX_FILTERS:
        raise PolicyError("filters", f"must name 1 to {MAX_FILTERS} filters, got {len(entries)}")
    out: list[PolicyFilter] = []
    seen: set[str] = set()
    for i, entry in enumerate(entries):
        where = f"filters[{i}]"
        if not isinstance(entry, dict):
            raise PolicyError(where, f"must be an object, got {_kind(entry)}")
        for key in entry:
            if key not in _ENTRY_KEYS:
                raise PolicyError(f"{where}.{key}",
                                  f"unknown field (expected one of {', '.join(_ENTRY_KEYS)})")
        name = entry.get("name")
        if not isinstance(name, str) or not _NAME.match(name):
            raise PolicyError(f"{where}.name", f"required: the name of a filter deployed in the "
                                               f"fleet, got {json.dumps(name)}")
        if name in seen:
            raise PolicyError(f"{where}.name", f"filter {name!r} is named twice")
        seen.add(name)
        apply_raw = entry.get("apply_to")
        values = [apply_raw] if isinstance(apply_raw, str) else apply_raw
        if not isinstance(values, list) or not values:
            raise PolicyError(f"{where}.apply_to", f'required: "produce", "fetch" or a list of '
                                                   f"them, got {json.dumps(apply_raw)}")
        for j, value in enumerate(values):
            if value not in DIRECTIONS:
                at = f"{where}.apply_to" if isinstance(apply_raw, str) else f"{where}.apply_to[{j}]"
                raise PolicyError(at, f'expected "produce" or "fetch", got {json.dumps(value)}')
        config = entry.get("config", {})
        if not isinstance(config, dict):
            raise PolicyError(f"{where}.config", f"must be an object, got {_kind(config)}")
        out.append(PolicyFilter(name, tuple(sorted(set(values))), config))
    return Policy(tuple(out))


# ------------------------------------------------------------------------------------------
# the fleet record
# ------------------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class PolicyRecord:
    """The newest ``policy:<topic>`` record of the fleet topic.

    `policy` is None when the record cannot be used (`error` says why): the topic fails closed.
    """

    topic: str
    value: str
    policy: Policy | None
    error: str | None
    set_by: str | None
    set_at: str | None
    partition: int
    offset: int
    #: Id of the key that signed the record (None: an unsigned record, permissive fleets only).
    signer: str | None = None
    seq: int = 0

    @property
    def version(self) -> tuple[int, int]:
        return (self.partition, self.offset)


def policy_key(topic: str) -> bytes:
    return f"{POLICY_PREFIX}{topic}".encode()


def policy_payload(topic: str, value: str | None, set_by: str | None,
                   instance: str | None = None) -> dict[str, Any]:
    """What the proxy records when `set_by` sets `value` on `topic` (None: removes it); signed
    as is (fleet_signing.sign adds nothing but a nonce), or written unsigned (format 1) on a
    fleet that allows unsigned records."""
    at = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    if value is None:
        return {"type": "policy-removed", "topic": topic, "removed_at": at, "removed_by": set_by,
                "set_via": instance}
    return {"format": FORMAT_VERSION, "type": "policy", "topic": topic, "value": value,
            "set_at": at, "set_by": set_by, "set_via": instance}


def policy_record_value(topic: str, value: str, set_by: str | None,
                        instance: str | None = None) -> bytes:
    """An unsigned (format 1) policy record, as a permissive fleet accepts it."""
    body = policy_payload(topic, value, set_by, instance)
    return json.dumps(body, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def parse_policy_record(topic: str, data: bytes | Mapping[str, Any], partition: int = 0,
                        offset: int = 0, signer: str | None = None,
                        seq: int = 0) -> PolicyRecord:
    """Read a ``policy:<topic>`` record (its JSON, or a signed payload already parsed); an
    unusable one comes back with `error` set."""
    value, by, at, error = "", None, None, None
    policy: Policy | None = None
    try:
        body = data if isinstance(data, Mapping) else json.loads(data)
        if not isinstance(body, Mapping):
            raise ValueError("the record must be a JSON object")
        if body.get("format") != FORMAT_VERSION:
            raise ValueError(f"unsupported format {body.get('format')!r} "
                             f"(this proxy reads {FORMAT_VERSION})")
        if body.get("topic", topic) != topic:
            raise ValueError(f"the record names topic {body.get('topic')!r}")
        raw_value = body.get("value")
        if not isinstance(raw_value, str):
            raise ValueError("value is missing")
        value = raw_value
        by = body.get("set_by") if isinstance(body.get("set_by"), str) else None
        at = body.get("set_at") if isinstance(body.get("set_at"), str) else None
        policy = parse_policy(value)
    except (ValueError, PolicyError) as exc:
        error = f"policy record for topic {topic!r}: {exc}"
        policy = None
    return PolicyRecord(topic, value, policy, error, by, at, partition, offset, signer, seq)


# ------------------------------------------------------------------------------------------
# bindings
# ------------------------------------------------------------------------------------------

def binding_name(topic: str, filter_name: str) -> str:
    """The name a policy's copy of a filter runs under (telemetry, metrics, logs)."""
    return f"{POLICY_PREFIX}{topic}/{filter_name}"


def block_spec(topic: str, filter_name: str, directions: Sequence[str],
               reason: str) -> FilterSpec:
    """The stand-in for a policy binding that cannot run: fails the topic's partitions."""
    return FilterSpec(
        name=binding_name(topic, filter_name), module="builtin:block", topics=(topic,),
        apply_to=frozenset(directions),
        config={"code": BLOCKED_ERROR_CODE,
                "reason": f"data policy of topic {topic!r} cannot be applied: {reason}"},
        source=f"fleet:{POLICY_PREFIX}{topic}")


@dataclass(frozen=True, slots=True)
class Binding:
    """One filter of one policy: the spec to run, or why it cannot run (`blocked`)."""

    topic: str
    filter: str
    spec: FilterSpec
    blocked: str | None = None


def policy_bindings(policies: Mapping[str, PolicyRecord],
                    deployed: Mapping[str, FilterSpec]) -> list[Binding]:
    """The filter bindings of every policy, by topic then in the policy's order.

    `deployed` maps fleet filter names to the specs this proxy accepted. A binding naming a
    filter that is not there, or a policy record that cannot be used, becomes a block.
    """
    out: list[Binding] = []
    for topic in sorted(policies):
        if not valid_topic_name(topic):
            continue  # never a glob: the fleet view refuses such keys, this is a second guard
        record = policies[topic]
        if record.policy is None:
            reason = record.error or "the policy record cannot be read"
            out.append(Binding(topic, "*", block_spec(topic, "*", DIRECTIONS, reason), reason))
            continue
        for entry in record.policy.filters:
            base = deployed.get(entry.name)
            if base is None:
                reason = f"filter {entry.name!r} is not deployed in the fleet"
                out.append(Binding(topic, entry.name,
                                   block_spec(topic, entry.name, entry.apply_to, reason), reason))
                continue
            out.append(Binding(topic, entry.name, bind_spec(topic, entry, base)))
    return out


def bind_spec(topic: str, entry: PolicyFilter, base: FilterSpec) -> FilterSpec:
    """The copy of the deployed filter `base` that `entry` binds to `topic`."""
    return dataclasses.replace(
        base, name=binding_name(topic, entry.name), topics=(topic,),
        apply_to=frozenset(entry.apply_to), config={**base.config, **entry.config},
        source=f"fleet:{POLICY_PREFIX}{topic}", line=None)


# ------------------------------------------------------------------------------------------
# who may set policies
# ------------------------------------------------------------------------------------------

def parse_policy_admins(raw: Any, lines: LineMap | None = None) -> tuple[str, ...] | None:
    """Validate ``policy_admins:`` (a list of principal globs; None when absent)."""
    lm = lines if lines is not None else LineMap("<config>")
    if raw is None:
        return None
    if isinstance(raw, str):
        raw = [raw]
    if not isinstance(raw, list):
        raise lm.error(("policy_admins",),
                       f'must be a list of principal patterns such as "User:ops-*", '
                       f"got {_kind(raw)}")
    for i, item in enumerate(raw):
        if not isinstance(item, str) or not item.strip():
            raise lm.error(("policy_admins", i),
                           f"must be a principal pattern such as \"User:ops-*\", got {item!r}")
    return tuple(raw)


class AdminMatcher:
    """Whether a principal may set or delete policies (shell globs, like ``decrypt_for``).

    No patterns: nobody may (the safe default). A connection without a principal is
    ``User:ANONYMOUS``.
    """

    def __init__(self, patterns: Sequence[str] | None) -> None:
        self.patterns = tuple(patterns or ())
        self._re = (re.compile("|".join(f"(?:{translate(p)})" for p in self.patterns))
                    if self.patterns else None)

    def allows(self, principal: str | None) -> bool:
        return self._re is not None and self._re.fullmatch(principal or ANONYMOUS) is not None
