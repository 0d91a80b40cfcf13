"""The Sluice Wasm ABI v1: one guest call per record batch (selected by ``sluice_abi_version``).

The ABI is one required core and a list of optional capabilities, one export each
(``CAPABILITIES``; docs/FILTER_ABI.md, "Core and capabilities"). Core: ``memory``;
``sluice_abi_version() -> i32`` (= 1); ``sluice_alloc(i32) -> i32``;
``sluice_filter(i32, i32) -> i64``. Capabilities: ``init`` (``sluice_init(i32, i32) -> i32``),
``admin`` (``sluice_admin(i32, i32) -> i64``), ``last_error`` (``sluice_last_error() -> i64``),
``records`` (``sluice_filter_records(i32, i32) -> i64``: the same filter over Kafka's record
encoding, the host's fast path: native_io; alloc, input and call in one native crossing where
native_call is built), ``host_sha256`` (``sluice_host_sha256() -> i32``:
the host hashes the SHA-256 requests a records call lists, once per batch: host_sha256). A new
capability is a new optional export, never a new meaning of an old one, so the version stays 1.
Results pack
``(ptr << 32) | len``; a negative result is an error whose text ``sluice_last_error`` may give.
Byte layouts: records_io. The guest may reset an arena on each ``sluice_alloc``: the host calls
it exactly once per guest call, right before it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

import wasmtime

from sluice.codec.lz4_section import PendingSection, SectionRefused
from sluice.codec.records import Buffer
from sluice.filters import host_sha256, native_call
from sluice.filters.abi_base import AbiRunner, FilterLoadError
from sluice.filters.config import FilterSpec
from sluice.filters.context import RecordContext, RecordLike
from sluice.filters.decisions import Decision
from sluice.filters.engine import FilterEngine
from sluice.filters.guest import (
    GuestFailure,
    GuestInstance,
    RawFunc,
    export_signatures,
    exports_memory,
    format_signature,
)
from sluice.filters.native_io import (
    ROOM,
    Finish,
    NativeOutput,
    decode_native_output,
    native_input_head,
)
from sluice.filters.records_io import AbiError, decode_filter_output, encode_filter_input

ABI_VERSION: Final = 1
MAX_ERROR_CHARS: Final = 500
#: CPU time a batch call is allowed per record, on top of the filter's timeout_ms.
RECORD_BUDGET_US: Final = 100

# Below this size, joining the input head and the records costs less than a second write.
_JOIN_LIMIT: Final = 64 * 1024

_REQUIRED: Final = {
    "sluice_abi_version": ((), ("i32",)),
    "sluice_alloc": (("i32",), ("i32",)),
    "sluice_filter": (("i32", "i32"), ("i64",)),
}
_OPTIONAL: Final = {
    "sluice_init": (("i32", "i32"), ("i32",)),
    "sluice_admin": (("i32", "i32"), ("i64",)),
    "sluice_last_error": ((), ("i64",)),
    "sluice_filter_records": (("i32", "i32"), ("i64",)),
    "sluice_host_sha256": ((), ("i32",)),
}
#: The optional capabilities of ABI v1, by name, and the export that declares each.
CAPABILITIES: Final = {
    "init": "sluice_init",
    "admin": "sluice_admin",
    "last_error": "sluice_last_error",
    "records": "sluice_filter_records",
    "host_sha256": "sluice_host_sha256",
}


def is_sluice_module(module: wasmtime.Module) -> bool:
    return "sluice_abi_version" in export_signatures(module)


def unpack(result: int) -> tuple[int, int]:
    """(ptr, len) from a packed i64 result."""
    return (result >> 32) & 0xFFFFFFFF, result & 0xFFFFFFFF


class SluiceAbi(AbiRunner):
    abi = "sluice-v1"

    def __init__(self, engine: FilterEngine, module: wasmtime.Module, spec: FilterSpec,
                 who: str) -> None:
        super().__init__(engine, module, spec, who)
        sigs = export_signatures(module)
        if not exports_memory(module):
            raise FilterLoadError(f"{who}: module does not export 'memory'")
        for name, want in _REQUIRED.items():
            got = sigs.get(name)
            if got is None:
                raise FilterLoadError(f"{who}: Sluice ABI module lacks export {name!r}")
            if got != want:
                raise FilterLoadError(f"{who}: export {name} has signature "
                                      f"{format_signature(got)}, expected "
                                      f"{format_signature(want)}")
        for name, want in _OPTIONAL.items():
            got = sigs.get(name)
            if got is not None and got != want:
                raise FilterLoadError(f"{who}: export {name} has signature "
                                      f"{format_signature(got)}, expected "
                                      f"{format_signature(want)}")
        self.has_init = "sluice_init" in sigs
        self.has_admin = "sluice_admin" in sigs
        self.has_last_error = "sluice_last_error" in sigs
        self.has_native = "sluice_filter_records" in sigs
        # Offered only where the native pass is built and the records path exists; the pass
        # runs inside the fused records call (native_call), so that must be built too.
        self.has_host_sha256 = (host_sha256.AVAILABLE and native_call.AVAILABLE
                                and self.has_native and "sluice_host_sha256" in sigs)
        self.capabilities = frozenset(c for c, export in CAPABILITIES.items() if export in sigs)
        self.config_json = spec.config_json
        self.prepare()
        self._alloc: RawFunc | None = None
        self._filter: RawFunc | None = None
        self._admin: RawFunc | None = None
        self._last_error: RawFunc | None = None
        self._native: RawFunc | None = None
        #: `_native` in one native call (sluice_alloc, the input's write, the call and, where
        #: the guest takes it, the host's SHA-256 pass), where native_call is built.
        self._fused: native_call.NativeCall | None = None
        #: The guest's hash request slot (host_sha256), 0 when the capability is not in use.
        self._hash_slot = 0
        #: Input bytes `sluice_alloc` handed out for pending sections the codec refused (the
        #: call never made): a guest that frees its input in the call keeps them, so past a
        #: quarter of the memory cap the instance is made afresh (`_unpaired_input`).
        self._unpaired = 0

    @property
    def supports_admin(self) -> bool:
        return self.has_admin

    def on_instantiate(self, guest: GuestInstance) -> None:
        version = guest.func("sluice_abi_version")
        assert version is not None
        got = version()
        if got != ABI_VERSION:
            raise FilterLoadError(f"{self.who}: module speaks Sluice ABI version {got}, "
                                  f"this host supports {ABI_VERSION}")
        self._alloc = guest.func("sluice_alloc")
        self._filter = guest.func("sluice_filter")
        self._admin = guest.func("sluice_admin") if self.has_admin else None
        self._last_error = guest.func("sluice_last_error") if self.has_last_error else None
        self._native = guest.func("sluice_filter_records") if self.has_native else None
        self._hash_slot = 0
        self._fused = None
        self._unpaired = 0
        if self.has_init:
            init = guest.func("sluice_init")
            assert init is not None
            ptr = self._write_input(guest, self.config_json)
            rc = init(ptr, len(self.config_json))
            if rc != 0:
                raise FilterLoadError(f"{self.who}: sluice_init rejected the config (code "
                                      f"{rc}): {self.last_error(guest) or 'no message'}")
        if self.has_host_sha256:
            self._offer_host_sha256(guest)
        if self._native is not None and native_call.AVAILABLE:
            assert self._alloc is not None
            self._fused = native_call.NativeCall(self._native, self._alloc, guest,
                                                 self._hash_slot)

    def _offer_host_sha256(self, guest: GuestInstance) -> None:
        """The host_sha256 handshake, once per instance after sluice_init: calling the export
        is the host's promise to run the hash requests of every successful records call; the
        guest answers with the address of its request slot (0: it declines)."""
        offer = guest.func("sluice_host_sha256")
        assert offer is not None
        slot = offer() & 0xFFFFFFFF
        if slot and (slot % 4 or slot + 8 > guest.memory_size()):
            raise FilterLoadError(f"{self.who}: sluice_host_sha256 returned slot {slot}, not "
                                  "8 bytes of linear memory at a 4-byte boundary")
        self._hash_slot = slot

    def _write_input(self, guest: GuestInstance, data: bytes) -> int:
        assert self._alloc is not None
        ptr = self._alloc(len(data))
        if ptr == 0 and data:
            raise GuestFailure("memory", f"sluice_alloc({len(data)}) returned 0")
        guest.write(ptr & 0xFFFFFFFF, data)
        return ptr & 0xFFFFFFFF

    def _unpaired_input(self, size: int) -> None:
        """Count an input of `size` bytes allocated for a call that was not made (its batch
        refused). Not made afresh each time: a stored batch the codec refuses comes back on
        every fetch of its offset, and an instantiation (~0.6 ms, on the event loop for an
        inline job) cost ~20 times the refusal. docs/FILTER_ABI.md lets a guest reset its
        arena in `sluice_alloc`; one that frees its input in the call would keep these, so
        past a quarter of its memory cap the instance goes (its next call makes it anew)."""
        self._unpaired += size
        if self._unpaired > self.spec.max_memory_mb * 1024 * 1024 // 4:
            self.discard()

    def last_error(self, guest: GuestInstance) -> str | None:
        """The guest's own description of its last error (None if it offers none)."""
        if self._last_error is None or guest.dead:
            return None
        try:
            ptr, n = unpack(self._last_error())
            text = guest.read(ptr, min(n, 4 * MAX_ERROR_CHARS))
        except GuestFailure:
            return None
        message = text.decode("utf-8", "replace")
        return message[:MAX_ERROR_CHARS] if message else None

    def _call(self, admin: bool, data: bytes, records: int = 0) -> bytes:
        guest = self.guest()  # may re-instantiate, which rebinds the RawFuncs
        ptr = self._write_input(guest, data)
        call = self._admin if admin else self._filter
        assert call is not None
        # timeout_ms bounds a call; a batch of N records also gets N x RECORD_BUDGET_US, so a
        # producer's 5 000-record batch on a busy machine is not refused for being large.
        guest.extra_ticks = int(records * RECORD_BUDGET_US / 1000 / guest.engine.tick_ms)
        try:
            result = call(ptr, len(data))
        finally:
            guest.extra_ticks = 0
        if result < 0:
            message = self.last_error(guest) or f"returned {result}"
            raise GuestFailure("error", message)
        out_ptr, out_len = unpack(result)
        return guest.read(out_ptr, out_len)

    def run(self, ctx: RecordContext, records: Sequence[RecordLike], offset_base: int,
            timestamp_base: int) -> tuple[list[Decision], dict[str, int]]:
        data = encode_filter_input(ctx, records, offset_base, timestamp_base)
        out = self._call(False, data, len(records))
        try:
            return decode_filter_output(out, len(records))
        except AbiError as exc:
            raise GuestFailure("invalid-output", str(exc)) from None

    def run_native(self, ctx: RecordContext, records: Buffer | PendingSection, count: int,
                   offset_base: int, timestamp_base: int,
                   finish: Finish | None = None) -> NativeOutput:
        """``sluice_filter_records`` over one records section (GuestFailure on any failure);
        a `PendingSection` is decompressed into the input where the guest reads it
        (SectionRefused when the codec refuses it: the guest is not called). `finish` takes
        a new section where it lies in guest memory (`native_io.decode_native_output`)."""
        head = native_input_head(ctx, count, offset_base, timestamp_base)
        guest = self.guest()
        extra = int(count * RECORD_BUDGET_US / 1000 / guest.engine.tick_ms)
        fused = self._fused
        if fused is not None and not isinstance(records, PendingSection):
            # sluice_alloc, the input written, the call (and the digests a host_sha256 guest
            # asked for) in one native call.
            result = fused(0, len(head) + len(records), count, extra, head, records)
        else:
            result = self._write_and_call(guest, head, records, count, extra)
        if result < 0:
            raise GuestFailure("error", self.last_error(guest) or f"returned {result}")
        out_ptr, out_len = (result >> 32) & 0xFFFFFFFF, result & 0xFFFFFFFF  # unpack()
        view = (guest.view(out_ptr, out_len) if fused is None
                else fused.view(out_ptr, out_len))
        try:
            # Read in place: only the new records section is copied out, once, behind room
            # for the batch header that the pipeline writes around it.
            return decode_native_output(view, count, ROOM, finish)
        except AbiError as exc:
            raise GuestFailure("invalid-output", str(exc)) from None

    def _write_and_call(self, guest: GuestInstance, head: bytes,
                        records: Buffer | PendingSection, count: int, extra: int) -> int:
        """`run_native`'s input written and the records export called, step by step (a
        pending section, or native_call not built): the export's result (the digests done,
        for a host_sha256 guest)."""
        assert self._alloc is not None
        size = len(head) + (records.room if isinstance(records, PendingSection)
                            else len(records))
        ptr = self._alloc(size) & 0xFFFFFFFF
        if ptr == 0:
            raise GuestFailure("memory", f"sluice_alloc({size}) returned 0")
        if isinstance(records, PendingSection):
            # Decompressed and checked where the guest reads it (codec/lz4_section.py):
            # SectionRefused, before the call, when the batch is refused.
            guest.write(ptr, head)
            try:
                size = len(head) + records.write_into(
                    guest.address(ptr + len(head), records.room))
            except SectionRefused:
                self._unpaired_input(size)
                raise
        elif len(records) <= _JOIN_LIMIT:
            guest.write(ptr, head + records)  # one crossing for small batches
        else:
            guest.write(ptr, head)
            guest.write(ptr + len(head), records)
        if self._fused is not None:
            return self._fused(ptr, size, count, extra)
        call = self._native
        assert call is not None
        guest.extra_ticks = extra
        try:
            return int(call(ptr, size))
        finally:
            guest.extra_ticks = 0

    def admin(self, request: bytes) -> bytes:
        if not self.has_admin:
            raise GuestFailure("error", "module does not export sluice_admin")
        return self._call(True, request)
