"""What a filter sees besides the records: the record context, and the record shape it accepts.

`RecordContext` is built by the proxy once per partition. Records are any objects with the
attributes of `sluice.codec.records.Record` (`RecordLike`); `FilterRecord` is a stand-alone
implementation for callers without a decoded batch (``sluice filter test``, unit tests).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Final, Protocol

DIRECTIONS: Final = ("produce", "fetch", "admin")
#: Direction byte of the Sluice ABI v1 input.
DIRECTION_CODE: Final = {"produce": 0, "fetch": 1}

Header = tuple[str, bytes | None]


@dataclass(frozen=True, slots=True)
class RecordContext:
    """Where a batch of records is going: topic, partition, direction and who sent it."""

    topic: str
    partition: int
    direction: str
    client_id: str | None = None
    principal: str | None = None

    def __post_init__(self) -> None:
        if self.direction not in DIRECTION_CODE:
            raise ValueError(f"direction must be produce or fetch, got {self.direction!r}")


class RecordLike(Protocol):
    """The fields of a record the filter chain reads (sluice.codec.records.Record has them)."""

    offset_delta: int
    timestamp_delta: int
    key: bytes | None
    value: bytes | None
    headers: list[Header]
    attributes: int


@dataclass(slots=True)
class FilterRecord:
    """A plain record, field-compatible with sluice.codec.records.Record."""

    offset_delta: int
    timestamp_delta: int
    key: bytes | None
    value: bytes | None
    headers: list[Header] = field(default_factory=list)
    attributes: int = 0
