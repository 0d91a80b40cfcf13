"""What the three ABI adapters share: import checking, instance lifecycle, failure decisions.

An adapter (`AbiRunner` subclass) owns a linker with exactly the host functions its ABI offers,
creates `GuestInstance`s lazily and throws an instance away after any failure (a trap can leave
memory and globals half-written); the next call instantiates afresh (and, for the Sluice ABI,
calls ``sluice_init`` again).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

import wasmtime

from sluice.filters.config import FilterSpec
from sluice.filters.context import RecordContext, RecordLike
from sluice.filters.decisions import Action, Decision
from sluice.filters.engine import FilterEngine
from sluice.filters.guest import GuestFailure, GuestInstance, format_signature, signature
from sluice.filters.wasi_stubs import WASI_MODULE, define_wasi_stubs, stub_signatures

Signature = tuple[tuple[str, ...], tuple[str, ...]]


class FilterLoadError(ValueError):
    """A filter module that cannot run: bad module, forbidden import, missing export, failed
    init. The message names the filter (and its config location when known)."""


def failure_decision(exc: GuestFailure) -> Decision:
    """A placeholder REJECT carrying the failure; LoadedFilter maps it through the policy."""
    return Decision(Action.REJECT, reason=str(exc), failure=str(exc))


def check_imports(module: wasmtime.Module, provided: dict[tuple[str, str], Signature],
                  who: str) -> set[str]:
    """Refuse any import not in `provided` (or with another signature); return the WASI stub
    names the module needs."""
    allowed = dict(stub_signatures())
    allowed.update(provided)
    wasi: set[str] = set()
    for imp in module.imports:
        name = imp.name or ""
        key = (imp.module, name)
        ty: Any = imp.type
        if not isinstance(ty, wasmtime.FuncType):
            kind = type(ty).__name__.replace("Type", "").lower()
            raise FilterLoadError(
                f"{who}: module imports {imp.module}.{name} ({kind}); filters may import "
                "only host functions")
        want = allowed.get(key)
        if want is None:
            offered = sorted(f"{m}.{n}" for m, n in provided) or ["none besides WASI stubs"]
            raise FilterLoadError(
                f"{who}: module imports {imp.module}.{name}, which Sluice does not provide "
                f"(no filesystem, network or other host access). Available to this ABI: "
                f"{', '.join(offered)}")
        got = signature(ty)
        if got != want:
            raise FilterLoadError(
                f"{who}: import {imp.module}.{name} has signature {format_signature(got)}, "
                f"expected {format_signature(want)}")
        if imp.module == WASI_MODULE:
            wasi.add(name)
    return wasi


class AbiRunner:
    """Base of the ABI adapters. Subclasses set `abi`, fill the linker, implement `run`."""

    abi: ClassVar[str] = ""
    #: The optional parts of its ABI the module exports (Sluice ABI: ``abi_sluice.CAPABILITIES``).
    capabilities: frozenset[str] = frozenset()

    @property
    def supports_admin(self) -> bool:
        """Whether this ABI can answer admin requests (only the Sluice ABI can)."""
        return False

    def __init__(self, engine: FilterEngine, module: wasmtime.Module, spec: FilterSpec,
                 who: str) -> None:
        self.engine = engine
        self.module = module
        self.spec = spec
        self.who = who
        self.linker = wasmtime.Linker(engine.engine)
        self._guest: GuestInstance | None = None
        self.instantiations = 0

    def host_functions(self) -> dict[tuple[str, str], Signature]:
        """(module, name) -> signature of the host functions this ABI offers."""
        return {}

    def prepare(self) -> None:
        """Check imports and define WASI stubs; subclasses then define their own functions."""
        wasi = check_imports(self.module, self.host_functions(), self.who)
        define_wasi_stubs(self.linker, wasi)

    def guest(self) -> GuestInstance:
        """The live instance, instantiating (and initialising) it when needed."""
        guest = self._guest
        if guest is None or guest.dead:
            self._guest = None
            guest = GuestInstance(self.engine, self.module, self.linker,
                                  memory_bytes=self.spec.max_memory_mb * 1024 * 1024,
                                  timeout_ms=self.spec.timeout_ms)
            self.instantiations += 1
            self.on_instantiate(guest)
            self._guest = guest
        return guest

    def on_instantiate(self, guest: GuestInstance) -> None:
        """Per-instance set-up (bind exports, call init); raise GuestFailure to refuse."""

    def discard(self) -> None:
        self._guest = None

    def run(self, ctx: RecordContext, records: Sequence[RecordLike], offset_base: int,
            timestamp_base: int) -> tuple[list[Decision], dict[str, int]]:
        """Decisions for `records`. Raises GuestFailure when the whole call failed; per-record
        failures come back as `failure_decision`s."""
        raise NotImplementedError

    def admin(self, request: bytes) -> bytes:
        raise GuestFailure("error", f"the {self.abi} ABI has no admin entry point")

    def close(self) -> None:
        self._guest = None
