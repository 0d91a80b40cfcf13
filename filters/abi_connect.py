"""The Kafka Connect Wasm ABI (kafka-connect-wasm-transformer): per record, guest pulls and pushes.

The guest exports ``memory``, ``alloc(i32) -> i32``, ``dealloc(i32, i32)`` and an entry point
(the spec's ``function``) taking no arguments and returning nothing or an i64. It imports host
functions from module ``env`` (the same names and signatures as the Java transformer):

    get_key() -> i64, get_value() -> i64, get_topic() -> i64, get_record() -> i64,
    get_header(name_ptr: i32, name_len: i32) -> i64,
    set_key(ptr, len), set_value(ptr, len), set_topic(ptr, len), set_record(ptr, len),
    set_header(name_ptr, name_len, value_ptr, value_len)

A getter asks the guest's ``alloc`` for a buffer, copies the data in and returns
``(ptr << 32) | len``; the guest owns (and frees) that buffer. Null keys/values and missing
headers read as empty; writing back the empty bytes keeps a null as null. ``set_header``
appends a header (like Connect's ``headers().add``); ``get_header`` reads the last one of that
name. ``get_record``/``set_record`` exchange JSON ``{"topic", "key", "value", "headers"}`` with
base64 key, value and header values. If the entry point returns an i64 whose low word has bit 31
set, the call failed and ``(ptr, len & 0x7fffffff)`` is a UTF-8 message; the host calls
``dealloc(ptr, len)`` on any non-empty result. A proxy cannot move a record to another topic, so
``set_topic`` with a different name is a filter failure. There is no drop in this ABI.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Sequence
from typing import Any, Final

import wasmtime

from sluice.filters.abi_base import AbiRunner, FilterLoadError, Signature, failure_decision
from sluice.filters.config import FilterSpec
from sluice.filters.context import Header, RecordContext, RecordLike
from sluice.filters.decisions import KEEP, Action, Decision
from sluice.filters.engine import FilterEngine
from sluice.filters.guest import (
    GuestFailure,
    GuestInstance,
    RawFunc,
    export_signatures,
    exports_memory,
    format_signature,
)

HOST_MODULE: Final = "env"
_I64R: Final = ((), ("i64",))
_SET: Final = (("i32", "i32"), ())
HOST_FUNCTIONS: Final[dict[str, Signature]] = {
    "get_key": _I64R,
    "get_value": _I64R,
    "get_topic": _I64R,
    "get_record": _I64R,
    "get_header": (("i32", "i32"), ("i64",)),
    "set_key": _SET,
    "set_value": _SET,
    "set_topic": _SET,
    "set_record": _SET,
    "set_header": (("i32", "i32", "i32", "i32"), ()),
}
_ALLOC_SIG: Final = (("i32",), ("i32",))
_DEALLOC_SIG: Final = (("i32", "i32"), ())
_ENTRY_SIGS: Final = (((), ()), ((), ("i64",)))
_ERROR_BIT: Final = 0x80000000


def _vt(name: str) -> wasmtime.ValType:
    return wasmtime.ValType.i64() if name == "i64" else wasmtime.ValType.i32()


def connect_function(module: wasmtime.Module, function: str | None) -> str | None:
    """The entry point name if `module` fits the Connect ABI, else None."""
    if function is None:
        return None
    sigs = export_signatures(module)
    if sigs.get(function) in _ENTRY_SIGS and sigs.get("alloc") == _ALLOC_SIG:
        return function
    return None


class _Current:
    """The record being transformed, as the host functions see and change it."""

    __slots__ = ("headers", "key", "topic", "value")

    def __init__(self, topic: str, rec: RecordLike) -> None:
        self.topic = topic
        self.key = rec.key
        self.value = rec.value
        self.headers: list[Header] = list(rec.headers)


class ConnectAbi(AbiRunner):
    abi = "connect"

    def __init__(self, engine: FilterEngine, module: wasmtime.Module, spec: FilterSpec,
                 who: str) -> None:
        super().__init__(engine, module, spec, who)
        sigs = export_signatures(module)
        name = spec.function
        if name is None or sigs.get(name) not in _ENTRY_SIGS:
            raise FilterLoadError(f"{who}: Connect ABI needs 'function' naming an export "
                                  "with signature () -> () or () -> i64")
        if sigs.get("alloc") != _ALLOC_SIG:
            raise FilterLoadError(f"{who}: Connect ABI module must export alloc with "
                                  f"signature {format_signature(_ALLOC_SIG)}")
        if not exports_memory(module):
            raise FilterLoadError(f"{who}: module does not export 'memory'")
        self.function = name
        self.has_dealloc = sigs.get("dealloc") == _DEALLOC_SIG
        self.prepare()
        for fname, (params, results) in HOST_FUNCTIONS.items():
            ty = wasmtime.FuncType([_vt(p) for p in params], [_vt(r) for r in results])
            self.linker.define_func(HOST_MODULE, fname, ty, getattr(self, f"_h_{fname}"))
        self._cur: _Current | None = None
        self._live: GuestInstance | None = None
        self._fn: RawFunc | None = None
        self._alloc: RawFunc | None = None
        self._dealloc: RawFunc | None = None

    def host_functions(self) -> dict[tuple[str, str], Signature]:
        return {(HOST_MODULE, name): sig for name, sig in HOST_FUNCTIONS.items()}

    def on_instantiate(self, guest: GuestInstance) -> None:
        self._live = guest
        self._fn = guest.func(self.function)
        self._alloc = guest.func("alloc")
        self._dealloc = guest.func("dealloc") if self.has_dealloc else None

    # -- host functions (run inside the guest call; raising traps the call) --------------

    def _state(self) -> tuple[GuestInstance, _Current]:
        if self._cur is None or self._live is None:
            raise GuestFailure("error", "host function called outside a record call")
        return self._live, self._cur

    def _give(self, data: bytes | None) -> int:
        guest, _ = self._state()
        assert self._alloc is not None
        raw = data or b""
        ptr = self._alloc(len(raw)) & 0xFFFFFFFF
        guest.write(ptr, raw)
        return (ptr << 32) | len(raw)

    def _take(self, ptr: int, n: int) -> bytes:
        guest, _ = self._state()
        return guest.read(ptr & 0xFFFFFFFF, n)

    def _h_get_key(self) -> int:
        return self._give(self._state()[1].key)

    def _h_get_value(self) -> int:
        return self._give(self._state()[1].value)

    def _h_get_topic(self) -> int:
        return self._give(self._state()[1].topic.encode("utf-8"))

    def _h_get_header(self, name_ptr: int, name_len: int) -> int:
        _, cur = self._state()
        name = self._take(name_ptr, name_len).decode("utf-8", "replace")
        found = next((v for k, v in reversed(cur.headers) if k == name), None)
        return self._give(found)

    def _h_set_key(self, ptr: int, n: int) -> None:
        _, cur = self._state()
        data = self._take(ptr, n)
        cur.key = None if (cur.key is None and not data) else data

    def _h_set_value(self, ptr: int, n: int) -> None:
        _, cur = self._state()
        data = self._take(ptr, n)
        cur.value = None if (cur.value is None and not data) else data

    def _h_set_topic(self, ptr: int, n: int) -> None:
        _, cur = self._state()
        topic = self._take(ptr, n).decode("utf-8", "replace")
        if topic != cur.topic:
            raise GuestFailure("invalid-output", "set_topic cannot move a record to another "
                                                 "topic through a proxy")

    def _h_set_header(self, name_ptr: int, name_len: int, ptr: int, n: int) -> None:
        _, cur = self._state()
        name = self._take(name_ptr, name_len).decode("utf-8", "replace")
        cur.headers.append((name, self._take(ptr, n)))

    def _h_get_record(self) -> int:
        _, cur = self._state()
        doc: dict[str, Any] = {
            "topic": cur.topic,
            "value": base64.b64encode(cur.value or b"").decode("ascii"),
            "headers": {k: base64.b64encode(v or b"").decode("ascii") for k, v in cur.headers},
        }
        if cur.key is not None:
            doc["key"] = base64.b64encode(cur.key).decode("ascii")
        return self._give(json.dumps(doc, separators=(",", ":")).encode("utf-8"))

    def _h_set_record(self, ptr: int, n: int) -> None:
        _, cur = self._state()
        try:
            doc = json.loads(self._take(ptr, n))
            if not isinstance(doc, dict):
                raise ValueError("not an object")
            topic = doc.get("topic", cur.topic)
            key = doc.get("key")
            value = doc.get("value")
            headers = doc.get("headers") or {}
            if not isinstance(headers, dict):
                raise ValueError("headers is not an object")
            new_key = None if key is None else base64.b64decode(key, validate=True)
            new_value = None if value is None else base64.b64decode(value, validate=True)
            new_headers: list[Header] = [
                (str(k), None if v is None else base64.b64decode(v, validate=True))
                for k, v in headers.items()]
        except (ValueError, TypeError, binascii.Error) as exc:
            raise GuestFailure("invalid-output", f"set_record: bad record JSON ({exc})") from None
        if topic != cur.topic:
            raise GuestFailure("invalid-output", "set_record cannot move a record to another "
                                                 "topic through a proxy")
        cur.key = None if (cur.key is None and not new_key) else new_key
        cur.value = None if (cur.value is None and not new_value) else new_value
        cur.headers = new_headers

    # -- driver -------------------------------------------------------------------------

    def run(self, ctx: RecordContext, records: Sequence[RecordLike], offset_base: int,
            timestamp_base: int) -> tuple[list[Decision], dict[str, int]]:
        out: list[Decision] = []
        for rec in records:
            try:
                out.append(self._one(ctx, rec))
            except GuestFailure as exc:
                # A trapped instance is marked dead and replaced on the next record.
                out.append(failure_decision(exc))
            finally:
                self._cur = None
        return out, {}

    def _one(self, ctx: RecordContext, rec: RecordLike) -> Decision:
        guest = self.guest()
        fn = self._fn
        assert fn is not None
        cur = self._cur = _Current(ctx.topic, rec)
        result = fn()
        if fn.has_result:
            ptr = (result >> 32) & 0xFFFFFFFF
            size = result & 0xFFFFFFFF
            if size & _ERROR_BIT:
                size &= ~_ERROR_BIT
                message = guest.read(ptr, min(size, 2000)).decode("utf-8", "replace")
                self._release(ptr, size)
                raise GuestFailure("error", message[:500] or "function reported an error")
            self._release(ptr, size)
        if cur.key == rec.key and cur.value == rec.value and cur.headers == list(rec.headers):
            return KEEP
        return Decision(Action.REWRITE, key=cur.key, value=cur.value, headers=cur.headers)

    def _release(self, ptr: int, size: int) -> None:
        if self._dealloc is not None and size:
            self._dealloc(ptr, size)
