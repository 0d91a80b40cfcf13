"""A minimal, independent Sluice ABI v1 host used by the guest tests.

It encodes a batch exactly as the brief's byte layout says, calls the guest's exports through
wasmtime and decodes the output. It is deliberately separate from the production runtime
(filters/runtime*.py): two independent readings of the same layout catch each other's
mistakes. Tests of the developer loop (`sluice filter test`) use the production runtime.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import wasmtime

KEEP, REWRITE, DROP, REJECT = 0, 1, 2, 3


@dataclass
class Rec:
    """One input record."""

    value: bytes | None
    key: bytes | None = None
    headers: list[tuple[str, bytes | None]] = field(default_factory=list)
    offset: int = 0
    timestamp_ms: int = 0


@dataclass
class Decision:
    """One output decision (key/value/headers only for rewrites, reason only for rejects)."""

    kind: int
    key: bytes | None = None
    value: bytes | None = None
    headers: list[tuple[str, bytes | None]] = field(default_factory=list)
    reason: str = ""


def _str(b: bytes) -> bytes:
    return struct.pack("<I", len(b)) + b


def _opt(b: bytes | None) -> bytes:
    return struct.pack("<i", -1) if b is None else struct.pack("<i", len(b)) + b


def encode_batch(records: list[Rec], topic: str = "t", partition: int = 0, direction: int = 0,
                 client_id: str = "cli", principal: str = "User:alice") -> bytes:
    out = [struct.pack("<IB", 1, direction), _str(topic.encode()), struct.pack("<i", partition),
           _str(client_id.encode()), _str(principal.encode()), struct.pack("<I", len(records))]
    for r in records:
        out.append(struct.pack("<qq", r.offset, r.timestamp_ms))
        out.append(_opt(r.key))
        out.append(_opt(r.value))
        out.append(struct.pack("<I", len(r.headers)))
        for hk, hv in r.headers:
            out.append(_str(hk.encode()))
            out.append(_opt(hv))
    return b"".join(out)


class _Reader:
    def __init__(self, data: bytes) -> None:
        self.data = data
        self.pos = 0

    def take(self, n: int) -> bytes:
        if self.pos + n > len(self.data):
            raise ValueError("truncated guest output")
        b = self.data[self.pos:self.pos + n]
        self.pos += n
        return b

    def u32(self) -> int:
        return int(struct.unpack("<I", self.take(4))[0])

    def i32(self) -> int:
        return int(struct.unpack("<i", self.take(4))[0])

    def opt(self) -> bytes | None:
        n = self.i32()
        return None if n == -1 else self.take(n)


def decode_output(data: bytes, expected: int) -> tuple[list[Decision], dict[str, int]]:
    r = _Reader(data)
    count = r.u32()
    if count != expected:
        raise ValueError(f"guest returned {count} decisions for {expected} records")
    decisions = []
    for _ in range(count):
        kind = r.take(1)[0]
        if kind == REWRITE:
            key = r.opt()
            value = r.opt()
            headers = []
            for _h in range(r.u32()):
                hk = r.take(r.u32()).decode()
                headers.append((hk, r.opt()))
            decisions.append(Decision(kind, key, value, headers))
        elif kind == REJECT:
            decisions.append(Decision(kind, reason=r.take(r.u32()).decode()))
        elif kind in (KEEP, DROP):
            decisions.append(Decision(kind))
        else:
            raise ValueError(f"unknown decision {kind}")
    counts = {}
    for _ in range(r.u32()):
        name = r.take(r.u32()).decode()
        counts[name] = r.u32()
    if r.pos != len(data):
        raise ValueError("trailing bytes in guest output")
    return decisions, counts


class GuestError(RuntimeError):
    """The guest returned a negative result; the message comes from sluice_last_error."""


class Guest:
    """One instance of a Sluice ABI v1 module."""

    def __init__(self, path: Path, config: dict[str, Any] | None = None,
                 engine: wasmtime.Engine | None = None) -> None:
        self.engine = engine or wasmtime.Engine()
        self.store = wasmtime.Store(self.engine)
        module = wasmtime.Module.from_file(self.engine, str(path))
        foreign = [f"{i.module}.{i.name}" for i in module.imports
                   if i.module != "wasi_snapshot_preview1"]
        if foreign:
            raise ValueError(f"guest imports {foreign}")
        if module.imports:
            # A WASI reactor (the Go SDK): wasmtime's own WASI, with nothing granted, stands
            # in for the production host's stubs; `_initialize` runs first, as WASI says.
            self.store.set_wasi(wasmtime.WasiConfig())
            linker = wasmtime.Linker(self.engine)
            linker.define_wasi()
            self.instance = linker.instantiate(self.store, module)
        else:
            self.instance = wasmtime.Instance(self.store, module, [])
        # Typed loosely: the export union (Func | Memory | Global ...) is checked at run time.
        ex: Any = self.instance.exports(self.store)
        if "_initialize" in ex:
            ex["_initialize"](self.store)
        self.exports: Any = ex
        self.memory: Any = ex["memory"]
        assert ex["sluice_abi_version"](self.store) == 1
        if config is not None and "sluice_init" in ex:
            raw = json.dumps(config).encode()
            ptr = self._write(raw)
            rc = ex["sluice_init"](self.store, ptr, len(raw))
            if rc != 0:
                raise GuestError(self.last_error())

    def _write(self, data: bytes) -> int:
        ptr = int(self.exports["sluice_alloc"](self.store, len(data)))
        self.memory.write(self.store, data, ptr)
        return ptr

    def _read_packed(self, packed: int) -> bytes:
        ptr, length = (packed >> 32) & 0xFFFFFFFF, packed & 0xFFFFFFFF
        return bytes(self.memory.read(self.store, ptr, ptr + length))

    def last_error(self) -> str:
        if "sluice_last_error" not in self.exports:
            return ""
        return self._read_packed(int(self.exports["sluice_last_error"](self.store))).decode()

    def call_raw(self, payload: bytes) -> bytes:
        ptr = self._write(payload)
        res = int(self.exports["sluice_filter"](self.store, ptr, len(payload)))
        if res < 0:
            raise GuestError(self.last_error())
        return self._read_packed(res)

    def run(self, records: list[Rec], **ctx: Any) -> tuple[list[Decision], dict[str, int]]:
        out = self.call_raw(encode_batch(records, **ctx))
        return decode_output(out, len(records))

    def admin(self, request: dict[str, Any]) -> dict[str, Any]:
        raw = json.dumps(request).encode()
        ptr = self._write(raw)
        res = int(self.exports["sluice_admin"](self.store, ptr, len(raw)))
        if res < 0:
            raise GuestError(self.last_error())
        result: dict[str, Any] = json.loads(self._read_packed(res))
        return result
