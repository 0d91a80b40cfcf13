"""Host filters: filters the proxy implements in Python instead of Wasm, behind the interface
the chain already uses.

A host filter is named like a packaged builtin (``module: builtin:NAME``; `HOST_BUILTINS`
lists the names) and loads into an ordinary `LoadedFilter` whose runner is a `HostRunner`
instead of a Wasm ABI adapter: `run` returns one `Decision` per record plus counters, exactly
like a guest, so the chain, the pipeline's batch rules, telemetry and metrics treat it the same.
No Wasm is involved and nothing crosses a sandbox boundary: host filters are trusted code of
the proxy, used where a guest cannot work (keys held by a KMS, for ``builtin:encrypt``), or
where nothing may run at all (``builtin:block``: every partition fails with the configured
error; the proxy puts it in place of a data policy's filter that cannot run,
proxy/ops/policies.py).

Besides decisions, a host runner may raise `PartitionError` to fail the whole partition with a
chosen Kafka error code (e.g. a retriable one when its KMS is unreachable): the pipeline turns
it into that partition's error instead of applying ``on_error``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

from sluice.codec.records import Buffer
from sluice.filters.abi_base import FilterLoadError
from sluice.filters.config import HOST_BUILTINS, FilterSpec
from sluice.filters.context import RecordContext, RecordLike
from sluice.filters.decisions import Decision, PartitionError
from sluice.filters.native_io import NativeOutput
from sluice.telemetry_schema.host_identity import host_filter_sha256

__all__ = ["HOST_BUILTINS", "BlockRunner", "HostRunner"]


class HostRunner:
    """Base of host filters: the AbiRunner surface LoadedFilter uses, without Wasm."""

    abi: ClassVar[str] = "host"
    capabilities: ClassVar[frozenset[str]] = frozenset()
    #: The builtin name (``encrypt`` for ``builtin:encrypt``).
    kind: ClassVar[str] = ""
    #: Bumped when a host filter's stored output changes meaning (part of its sha256).
    implementation_version: ClassVar[int] = 1
    supports_admin: ClassVar[bool] = False
    #: Seals what the filters before it produced: fetch runs such filters in reverse order.
    nests: ClassVar[bool] = False
    #: Header-name prefix only this filter writes; the chain refuses produced records that
    #: carry one (None: no such prefix).
    reserved_header_prefix: ClassVar[str | None] = None
    #: Never waits on a thread inside `blocking.forbidden()` (raises `WouldBlock` where it
    #: would), so its jobs may run inline on the event loop (proxy/net/job_placement.py).
    never_waits: ClassVar[bool] = False
    #: Directions in which several threads may call this one runner at once (on different
    #: partitions): the filter keeps no per-call state outside the call's own thread, and what
    #: it shares (caches, its KMS client, counters) is thread-safe. `LoadedFilter` then takes
    #: no lock for such calls, and a Fetch response's partitions may be filtered on several
    #: threads at once (filters/parallel.py). Empty: every call is serialised.
    concurrent: ClassVar[frozenset[str]] = frozenset()
    #: Its cost per batch follows the batch's size and nothing else (the proxy's own native
    #: code, no guest), so the proxy may estimate it from the declared size.
    cost_follows_size: bool = False

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

    @property
    def has_native(self) -> bool:
        """Whether `run_native` serves records sections (the chain's fast path)."""
        return False

    @property
    def can_screen(self) -> bool:
        """Whether `screen_native` can look for `reserved_header_prefix` in a section."""
        return False

    def run_native(self, ctx: RecordContext, records: Buffer, count: int, offset_base: int,
                   timestamp_base: int) -> NativeOutput | None:
        """`run` over a records section in Kafka's encoding (filters/native_io.py's output
        without the wire format). None: use `run`; PartitionError as for `run`."""
        return None

    def screen_native(self, records: Buffer, count: int) -> tuple[int, str] | None:
        """(record index, header name) of the first header carrying the reserved prefix in a
        records section, None when there is none."""
        raise NotImplementedError

    def admin(self, request: bytes) -> bytes:
        raise NotImplementedError("host filters do not act on admin requests")

    def discard(self) -> None:
        """Nothing to throw away: host filters keep no guest state."""

    def close(self) -> None:
        """Release what the filter holds (nothing by default)."""


class BlockRunner(HostRunner):
    """``builtin:block``: fails every partition it sees with ``config.code`` (default 56
    KAFKA_STORAGE_ERROR, which clients retry) and ``config.reason`` as the message.

    Fail-closed stand-in for a filter that must apply but cannot (a data policy naming a
    filter no longer deployed): records neither reach the broker nor a consumer unfiltered.
    """

    kind = "block"
    never_waits = True
    # Keeps nothing at all: it only raises.
    concurrent = frozenset({"produce", "fetch"})

    def __init__(self, spec: FilterSpec, who: str) -> None:
        super().__init__(spec, who)
        cfg = spec.config
        unknown = sorted(set(cfg) - {"code", "reason"})
        if unknown:
            raise FilterLoadError(f"{who}: builtin:block rejected the config: config.{unknown[0]}: "
                                  "unknown key (expected code, reason)")
        code = cfg.get("code", 56)
        if isinstance(code, bool) or not isinstance(code, int) or not 0 < code < 32768:
            raise FilterLoadError(f"{who}: builtin:block rejected the config: config.code: "
                                  f"must be a Kafka error code > 0, got {code!r}")
        reason = cfg.get("reason", "blocked")
        self.code = code
        self.reason = f"{spec.name}: {reason}" if isinstance(reason, str) else spec.name

    def run(self, ctx: RecordContext, records: Sequence[RecordLike], offset_base: int,
            timestamp_base: int) -> tuple[list[Decision], dict[str, int]]:
        raise PartitionError(self.code, self.reason, self.spec.name)
