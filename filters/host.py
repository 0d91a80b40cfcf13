"""Host filters: filters the proxy implements in Python instead of Wasm, behind the interface
the chain already uses.

A host filter is named like a packaged builtin (``module: builtin:NAME``; `HOST_BUILTINS`
lists the names) and loads into an ordinary `LoadedFilter` whose runner is a `HostRunner`
instead of a Wasm ABI adapter: `run` returns one `Decision` per record plus counters, exactly
like a guest, so the chain, the pipeline's batch rules, telemetry and metrics treat it the same.
No Wasm is involved and nothing crosses a sandbox boundary: host filters are trusted code of
the proxy, used where a guest cannot work (keys held by a KMS, for ``builtin:encrypt``).

Besides decisions, a host runner may raise `PartitionError` to fail the whole partition with a
chosen Kafka error code (e.g. a retriable one when its KMS is unreachable): the pipeline turns
it into that partition's error instead of applying ``on_error``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

from sluice.filters.config import HOST_BUILTINS, FilterSpec
from sluice.filters.context import RecordContext, RecordLike
from sluice.filters.decisions import Decision
from sluice.filters.host_identity import host_filter_sha256

__all__ = ["HOST_BUILTINS", "HostRunner"]


class HostRunner:
    """Base of host filters: the AbiRunner surface LoadedFilter uses, without Wasm."""

    abi: ClassVar[str] = "host"
    #: The builtin name (``encrypt`` for ``builtin:encrypt``).
    kind: ClassVar[str] = ""
    #: Bumped when a host filter's stored output changes meaning (part of its sha256).
    implementation_version: ClassVar[int] = 1
    supports_admin: ClassVar[bool] = False

    def __init__(self, spec: FilterSpec, who: str) -> None:
        self.spec = spec
        self.who = who
        self.instantiations = 1

    @classmethod
    def identity(cls) -> str:
        """What telemetry reports as the module sha256: a digest of the host filter's kind
        and implementation version (there is no module file)."""
        return host_filter_sha256(cls.kind, cls.implementation_version)

    def run(self, ctx: RecordContext, records: Sequence[RecordLike], offset_base: int,
            timestamp_base: int) -> tuple[list[Decision], dict[str, int]]:
        raise NotImplementedError

    def admin(self, request: bytes) -> bytes:
        raise NotImplementedError("host filters do not act on admin requests")

    def discard(self) -> None:
        """Nothing to throw away: host filters keep no guest state."""

    def close(self) -> None:
        """Release what the filter holds (nothing by default)."""
