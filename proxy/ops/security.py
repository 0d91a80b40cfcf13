"""The ``security:`` section, and which topics are the proxy's own.

``security.operators`` lists the principals (``User:ops``, exactly as the proxy learns them
from SASL or a client certificate; ``User:ANONYMOUS`` for a connection without either) that
may still reach the proxy's own topics through the proxy; ``security.internal_topics`` adds
topics to those the proxy finds in its config (the fleet topic, the Kafka telemetry topic and
the filters' dead-letter topics). paths/internal_topics.py enforces it; docs/SECURITY.md.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Final

from sluice.filters.yaml_lines import LineMap
from sluice.proxy.ops.fleet import DEFAULT_TOPIC

KEYS: Final = ("operators", "internal_topics")
# Kafka's rule for topic names.
_TOPIC: Final = re.compile(r"^[A-Za-z0-9._-]{1,249}$")
# A Kafka principal: a type, a colon, a name (User:alice, User:CN=proxy,O=acme).
_PRINCIPAL: Final = re.compile(r"^[A-Za-z][A-Za-z0-9]*:.+$")


@dataclass(frozen=True, slots=True)
class SecuritySettings:
    operators: frozenset[str] = frozenset()
    internal_topics: tuple[str, ...] = ()


def _kind(value: Any) -> str:
    return "nothing" if value is None else type(value).__name__


def parse_security(raw: Any, lines: LineMap | None = None) -> SecuritySettings:
    """Validate ``security:``; a ConfigError names the line and field of a mistake."""
    lm = lines if lines is not None else LineMap("<config>")
    if raw is None:
        return SecuritySettings()
    if not isinstance(raw, dict):
        raise lm.error(("security",), f"must be a mapping, got {_kind(raw)}")
    for key in raw:
        if key not in KEYS:
            raise lm.error(("security", str(key)),
                           f"unknown key (expected one of {', '.join(KEYS)})")
    operators = raw.get("operators") or []
    if not isinstance(operators, list):
        raise lm.error(("security", "operators"),
                       f'must be a list of principals such as "User:ops", got {_kind(operators)}')
    for i, item in enumerate(operators):
        if not isinstance(item, str) or not _PRINCIPAL.match(item):
            raise lm.error(("security", "operators", i),
                           f'must be a principal such as "User:ops", got {item!r}')
        if any(c in item for c in "*?["):
            raise lm.error(("security", "operators", i),
                           f"must name one principal exactly (no patterns), got {item!r}")
    topics = raw.get("internal_topics") or []
    if not isinstance(topics, list):
        raise lm.error(("security", "internal_topics"),
                       f"must be a list of topic names, got {_kind(topics)}")
    for i, item in enumerate(topics):
        if not isinstance(item, str) or not _TOPIC.match(item):
            raise lm.error(("security", "internal_topics", i),
                           f"must be a Kafka topic name, got {item!r}")
    return SecuritySettings(frozenset(operators), tuple(topics))


def own_topics(raw: dict[str, Any], extra: Iterable[str] = ()) -> frozenset[str]:
    """The topics the proxy itself writes or follows, from an already validated config file
    (`raw`): the fleet topic (``_sluice_filters`` unless ``fleet.topic`` says otherwise: other
    proxies on the cluster may follow it even when this one does not), the Kafka telemetry
    topic, the dead-letter topics of the config file's filters and transforms, and `extra`."""
    names = {DEFAULT_TOPIC, *extra}
    fleet = raw.get("fleet")
    if isinstance(fleet, dict) and isinstance(fleet.get("topic"), str):
        names.add(fleet["topic"])
    telemetry = raw.get("telemetry")
    kafka = telemetry.get("kafka") if isinstance(telemetry, dict) else None
    if isinstance(kafka, dict) and isinstance(kafka.get("topic"), str):
        names.add(kafka["topic"])
    entries = list(raw.get("filters") or ())
    for transform in raw.get("transforms") or ():  # their filters' dead letters too
        if isinstance(transform, dict):
            entries += list(transform.get("filters") or ())
    for entry in entries:
        if isinstance(entry, dict) and isinstance(entry.get("dead_letter_topic"), str):
            names.add(entry["dead_letter_topic"])
    return frozenset(names)
