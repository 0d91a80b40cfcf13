"""Admin resources offered to ``admin`` filters, and their verdicts, as the ABI's JSON.

Request (host -> ``sluice_admin``)::

    {"op": "create_topics" | "create_partitions" | "alter_configs" | "incremental_alter_configs",
     "resource_type": "topic" | "broker" | ..., "name": str, "partitions": int | null,
     "replication_factor": int | null, "configs": {key: value | null}  (the RESULTING config),
     "principal": str, "client_id": str}

Response::

    {"decision": "allow" | "deny" | "rewrite", "message": str,
     "partitions": int (rewrite, optional), "configs": {...} (rewrite, optional)}

A rewrite's ``configs`` replaces the resulting config as a whole (keys with null are removed).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Final

from sluice.filters.records_io import AbiError

ADMIN_OPS: Final = ("create_topics", "create_partitions", "alter_configs",
                    "incremental_alter_configs")
DECISIONS: Final = ("allow", "deny", "rewrite")
MAX_MESSAGE_CHARS: Final = 500


@dataclass(frozen=True, slots=True)
class AdminResource:
    """One item of an admin request, as a policy sees it (configs = the resulting config)."""

    op: str
    name: str
    resource_type: str = "topic"
    partitions: int | None = None
    replication_factor: int | None = None
    configs: dict[str, str | None] = field(default_factory=dict)
    principal: str | None = None
    client_id: str | None = None

    def __post_init__(self) -> None:
        if self.op not in ADMIN_OPS:
            raise ValueError(f"unknown admin op {self.op!r} (expected {', '.join(ADMIN_OPS)})")

    def to_json(self) -> bytes:
        return json.dumps({
            "op": self.op, "resource_type": self.resource_type, "name": self.name,
            "partitions": self.partitions, "replication_factor": self.replication_factor,
            "configs": self.configs, "principal": self.principal or "",
            "client_id": self.client_id or "",
        }, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


@dataclass(frozen=True, slots=True)
class AdminVerdict:
    """The chain's answer for one resource.

    `decision`: allow, deny or rewrite; `filter`: the filter that denied or last rewrote
    (None for a plain allow); `partitions`/`configs`: the values to send upstream after
    rewrites (None = unchanged); `failure`: set when a filter failure produced the verdict.
    """

    decision: str
    message: str = ""
    partitions: int | None = None
    configs: dict[str, str | None] | None = None
    filter: str | None = None
    failure: str | None = None

    @property
    def allowed(self) -> bool:
        return self.decision != "deny"


def decode_admin_output(raw: bytes) -> AdminVerdict:
    """Parse a ``sluice_admin`` response (AbiError when it does not follow the schema)."""
    try:
        doc: Any = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise AbiError(f"admin output is not JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise AbiError("admin output is not a JSON object")
    decision = doc.get("decision")
    if decision not in DECISIONS:
        raise AbiError(f"admin output has decision {decision!r} (expected allow, deny, rewrite)")
    message = doc.get("message", "")
    if not isinstance(message, str):
        raise AbiError("admin output message is not a string")
    if len(message) > MAX_MESSAGE_CHARS:
        message = message[:MAX_MESSAGE_CHARS] + "..."
    partitions = doc.get("partitions")
    configs = doc.get("configs")
    if decision == "rewrite":
        if partitions is not None and (isinstance(partitions, bool)
                                       or not isinstance(partitions, int) or partitions <= 0):
            raise AbiError("admin rewrite partitions must be a positive integer")
        if configs is not None:
            if not isinstance(configs, dict) or not all(
                    isinstance(k, str) and (v is None or isinstance(v, str))
                    for k, v in configs.items()):
                raise AbiError("admin rewrite configs must map strings to strings or null")
    else:
        partitions = None
        configs = None
    return AdminVerdict(decision=decision, message=message, partitions=partitions,
                        configs=configs)
