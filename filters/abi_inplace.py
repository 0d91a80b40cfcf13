"""The in-place ABI of the Redpanda-style seed: one guest call per record, buffers edited in place.

``transform_record(payload_ptr, payload_len, key_ptr, key_len) -> i64`` (name configurable
with the spec's ``function``; an i32 result is accepted too). The host copies the value and key
into guest memory; the guest may rewrite both buffers in place. A result ``n >= 0`` is the new
value length (at most the original: the value becomes the first ``n`` bytes of the buffer, the
key the whole key buffer); ``-2`` drops the record; any other negative result is an error (the
filter's failure policy applies). Headers are not visible to this ABI and pass unchanged.

Where the buffers live: if the module exports an allocator (``alloc`` or ``sluice_alloc``,
``(i32) -> i32``) the host allocates one scratch buffer through it and reuses it while it is
big enough (releasing it with ``dealloc(ptr, len)`` when exported and a bigger one is needed);
otherwise the host grows linear memory and uses the new pages at its end, which no guest
allocator owns. A null value or key is passed as length 0 and comes back null if unchanged.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

import wasmtime

from sluice.filters.abi_base import AbiRunner, FilterLoadError, failure_decision
from sluice.filters.config import FilterSpec
from sluice.filters.context import RecordContext, RecordLike
from sluice.filters.decisions import DROP, KEEP, Action, Decision
from sluice.filters.engine import FilterEngine
from sluice.filters.guest import (
    WASM_PAGE,
    GuestFailure,
    GuestInstance,
    RawFunc,
    export_signatures,
    exports_memory,
    format_signature,
)

DEFAULT_FUNCTION: Final = "transform_record"
DROP_CODE: Final = -2
_PARAMS: Final = ("i32", "i32", "i32", "i32")
_ALLOC_SIG: Final = (("i32",), ("i32",))
_DEALLOC_SIG: Final = (("i32", "i32"), ())


def inplace_function(module: wasmtime.Module, function: str | None) -> str | None:
    """The entry point name if `module` fits the in-place ABI, else None."""
    name = function or DEFAULT_FUNCTION
    sig = export_signatures(module).get(name)
    if sig is not None and sig[0] == _PARAMS and sig[1] in (("i64",), ("i32",)):
        return name
    return None


class InPlaceAbi(AbiRunner):
    abi = "inplace"

    def __init__(self, engine: FilterEngine, module: wasmtime.Module, spec: FilterSpec,
                 who: str) -> None:
        super().__init__(engine, module, spec, who)
        name = inplace_function(module, spec.function)
        if name is None:
            want = format_signature((_PARAMS, ("i64",)))
            raise FilterLoadError(f"{who}: no export {spec.function or DEFAULT_FUNCTION!r} "
                                  f"with signature {want}")
        if not exports_memory(module):
            raise FilterLoadError(f"{who}: module does not export 'memory'")
        self.function = name
        sigs = export_signatures(module)
        self.alloc_name = next((n for n in ("alloc", "sluice_alloc") if sigs.get(n) == _ALLOC_SIG),
                               None)
        self.dealloc_name = "dealloc" if sigs.get("dealloc") == _DEALLOC_SIG else None
        self.prepare()
        self._fn: RawFunc | None = None
        self._alloc: RawFunc | None = None
        self._dealloc: RawFunc | None = None
        self._scratch = 0
        self._scratch_size = 0

    def on_instantiate(self, guest: GuestInstance) -> None:
        self._fn = guest.func(self.function)
        self._alloc = guest.func(self.alloc_name) if self.alloc_name else None
        self._dealloc = guest.func(self.dealloc_name) if self.dealloc_name else None
        self._scratch = 0
        self._scratch_size = 0

    def _buffer(self, guest: GuestInstance, size: int) -> int:
        if size <= self._scratch_size:
            return self._scratch
        want = max(size, 2 * self._scratch_size, 256)
        if self._alloc is not None:
            if self._dealloc is not None and self._scratch_size:
                self._dealloc(self._scratch, self._scratch_size)
            ptr = self._alloc(want) & 0xFFFFFFFF
            if ptr == 0 or ptr + want > guest.memory_size():
                raise GuestFailure("memory", f"{self.alloc_name}({want}) returned an unusable "
                                             f"pointer {ptr}")
        else:
            pages = -(-want // WASM_PAGE)
            ptr = guest.grow(pages)
            want = pages * WASM_PAGE
        self._scratch, self._scratch_size = ptr, want
        return ptr

    def run(self, ctx: RecordContext, records: Sequence[RecordLike], offset_base: int,
            timestamp_base: int) -> tuple[list[Decision], dict[str, int]]:
        out: list[Decision] = []
        for rec in records:
            try:
                out.append(self._one(rec))
            except GuestFailure as exc:
                # A trapped instance is marked dead and replaced on the next record.
                out.append(failure_decision(exc))
        return out, {}

    def _one(self, rec: RecordLike) -> Decision:
        guest = self.guest()
        fn = self._fn
        assert fn is not None
        value = rec.value or b""
        key = rec.key or b""
        vlen, klen = len(value), len(key)
        ptr = self._buffer(guest, vlen + klen)
        guest.write(ptr, value)
        guest.write(ptr + vlen, key)
        result = fn(ptr, vlen, ptr + vlen, klen)
        if result == DROP_CODE:
            return DROP
        if result < 0:
            raise GuestFailure("error", f"{self.function} returned {result}")
        if result > vlen:
            raise GuestFailure("invalid-output", f"{self.function} returned length {result}, "
                                                 f"beyond the original {vlen}")
        new_value: bytes | None = guest.read(ptr, result)
        new_key: bytes | None = guest.read(ptr + vlen, klen)
        if rec.value is None and not new_value:
            new_value = None
        if rec.key is None:
            new_key = None
        if new_value == rec.value and new_key == rec.key:
            return KEEP
        return Decision(Action.REWRITE, key=new_key, value=new_value, headers=list(rec.headers))
