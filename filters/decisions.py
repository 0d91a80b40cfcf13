"""What a filter says about each record, and the result of running one filter over a batch.

`Action` values are the decision bytes of the Sluice ABI v1 output. `Decision` objects for keep
and drop are shared singletons (`KEEP`, `DROP`): never mutate a Decision.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import IntEnum

from sluice.filters.context import Header


class PartitionError(Exception):
    """Raised by a host filter (filters.host) to fail a whole partition with Kafka error
    `code` (e.g. 56 KAFKA_STORAGE_ERROR, retriable, when a KMS is unreachable) instead of
    deciding per record. `message` names the filter and never holds record data."""

    def __init__(self, code: int, message: str, filter_name: str = "") -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.filter_name = filter_name


class Action(IntEnum):
    KEEP = 0
    REWRITE = 1
    DROP = 2
    REJECT = 3


class Decision:
    """One record's fate. For REWRITE: the new key, value and headers (all three are set).
    For REJECT: `reason`. `failure` is set when the decision came from the filter's failure
    policy (trap, timeout, memory, invalid output) rather than from the filter itself, and
    `dead_letter` when that policy is dead-letter."""

    __slots__ = ("action", "dead_letter", "failure", "headers", "key", "reason", "value")

    def __init__(self, action: Action, key: bytes | None = None, value: bytes | None = None,
                 headers: list[Header] | None = None, reason: str | None = None,
                 failure: str | None = None, dead_letter: bool = False) -> None:
        self.action = action
        self.key = key
        self.value = value
        self.headers = headers
        self.reason = reason
        self.failure = failure
        self.dead_letter = dead_letter

    def __repr__(self) -> str:
        extra = ""
        if self.action is Action.REWRITE:
            extra = f", key={self.key!r}, value={self.value!r}, headers={self.headers!r}"
        elif self.action is Action.REJECT:
            extra = f", reason={self.reason!r}"
        if self.failure:
            extra += f", failure={self.failure!r}, dead_letter={self.dead_letter}"
        return f"Decision({self.action.name}{extra})"

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Decision):
            return NotImplemented
        return (self.action, self.key, self.value, self.headers, self.reason, self.failure,
                self.dead_letter) == (other.action, other.key, other.value, other.headers,
                                      other.reason, other.failure, other.dead_letter)

    __hash__ = None  # type: ignore[assignment]


KEEP = Decision(Action.KEEP)
DROP = Decision(Action.DROP)


def rewrite(key: bytes | None, value: bytes | None, headers: list[Header]) -> Decision:
    return Decision(Action.REWRITE, key=key, value=value, headers=headers)


def reject(reason: str) -> Decision:
    return Decision(Action.REJECT, reason=reason)


@dataclass(slots=True)
class BatchResult:
    """One filter over one batch: a decision per input record, in order.

    `failure` describes a whole-call failure (the failure policy then produced every
    decision); `failed_records` counts records whose decision came from the failure policy;
    `detector_counts` are the filter's own counters (e.g. PII detectors that fired).
    """

    decisions: list[Decision]
    detector_counts: dict[str, int] = field(default_factory=dict)
    failure: str | None = None
    failed_records: int = 0
    time_ns: int = 0
