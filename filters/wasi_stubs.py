"""The only WASI a filter gets: inert stubs, so modules built against wasi-libc still load.

Filters have no filesystem, network, arguments or environment. Modules compiled for
``wasm32-wasi`` import a handful of ``wasi_snapshot_preview1`` functions from libc start-up code
even when they never touch a file; those are provided here as stubs that report "nothing there":
empty argv/environ, no preopened directories (EBADF), writes to stdout/stderr are accepted and
discarded (never logged: they may contain record data), ``proc_exit`` traps, ``poll_oneoff``
returns at once (a clock subscription fires immediately: a filter never sleeps; Go's runtime
polls there when idle). A reactor's ``_initialize`` export is called once after instantiation
(filters/guest.py). Clocks and
``random_get`` work (they leak nothing). Any other import is refused when the module loads.
"""

from __future__ import annotations

import os
import struct
import time
from collections.abc import Callable
from typing import Any, Final

import wasmtime

WASI_MODULE: Final = "wasi_snapshot_preview1"
_EBADF: Final = 8
_EINVAL: Final = 28
_MAX_RANDOM: Final = 65536

_i32 = wasmtime.ValType.i32()
_i64 = wasmtime.ValType.i64()


class ProcExit(Exception):
    """The guest called proc_exit: its call ends as a failure."""


def _mem(caller: wasmtime.Caller) -> wasmtime.Memory:
    mem = caller.get("memory")
    if not isinstance(mem, wasmtime.Memory):
        raise ProcExit("WASI call from a module without an exported memory")
    return mem


def _put(caller: wasmtime.Caller, ptr: int, data: bytes) -> None:
    mem = _mem(caller)
    if ptr < 0 or ptr + len(data) > mem.data_len(caller):
        raise ProcExit("WASI call with an out-of-bounds pointer")
    mem.write(caller, data, ptr)


def _zero_sizes(caller: wasmtime.Caller, count_ptr: int, size_ptr: int) -> int:
    _put(caller, count_ptr, b"\0\0\0\0")
    _put(caller, size_ptr, b"\0\0\0\0")
    return 0


def _nothing(caller: wasmtime.Caller, a: int, b: int) -> int:
    return 0


def _clock_time_get(caller: wasmtime.Caller, clock_id: int, precision: int, out: int) -> int:
    now = time.time_ns() if clock_id == 0 else time.monotonic_ns()
    _put(caller, out, struct.pack("<Q", now))
    return 0


def _clock_res_get(caller: wasmtime.Caller, clock_id: int, out: int) -> int:
    _put(caller, out, struct.pack("<Q", 1000))
    return 0


def _random_get(caller: wasmtime.Caller, ptr: int, n: int) -> int:
    if n < 0 or n > _MAX_RANDOM:
        return _EINVAL
    _put(caller, ptr, os.urandom(n))
    return 0


def _fd_write(caller: wasmtime.Caller, fd: int, iovs: int, iovs_len: int, nwritten: int) -> int:
    if fd not in (1, 2):
        return _EBADF
    if iovs_len < 0 or iovs_len > 1024:
        return _EINVAL
    mem = _mem(caller)
    raw = mem.read(caller, iovs, iovs + 8 * iovs_len)
    total = sum(struct.unpack_from("<I", raw, 8 * i + 4)[0] for i in range(iovs_len))
    _put(caller, nwritten, struct.pack("<I", total & 0xFFFFFFFF))
    return 0


def _proc_exit(caller: wasmtime.Caller, code: int) -> None:
    raise ProcExit(f"guest called proc_exit({code})")


def _badf1(caller: wasmtime.Caller, fd: int) -> int:
    return _EBADF


def _badf2(caller: wasmtime.Caller, fd: int, a: int) -> int:
    return _EBADF


def _badf3(caller: wasmtime.Caller, fd: int, a: int, b: int) -> int:
    return _EBADF


def _badf4(caller: wasmtime.Caller, fd: int, a: int, b: int, c: int) -> int:
    return _EBADF


def _sched_yield(caller: wasmtime.Caller) -> int:
    return 0


_SUBSCRIPTION: Final = 48
_EVENT: Final = 32
_MAX_SUBSCRIPTIONS: Final = 64


def _poll_oneoff(caller: wasmtime.Caller, subs: int, events: int, n: int, nevents: int) -> int:
    """Every subscription fires at once: clocks as if their time had come (a filter never
    sleeps; Go's scheduler polls here when idle), file descriptors with EBADF."""
    if n <= 0 or n > _MAX_SUBSCRIPTIONS:
        return _EINVAL
    mem = _mem(caller)
    if subs < 0 or subs + n * _SUBSCRIPTION > mem.data_len(caller):
        raise ProcExit("WASI call with an out-of-bounds pointer")
    raw = mem.read(caller, subs, subs + n * _SUBSCRIPTION)
    out = bytearray()
    for i in range(n):
        userdata = raw[i * _SUBSCRIPTION:i * _SUBSCRIPTION + 8]
        tag = raw[i * _SUBSCRIPTION + 8]
        errno = 0 if tag == 0 else _EBADF
        out += userdata + struct.pack("<HB5x", errno, tag) + bytes(16)
    _put(caller, events, bytes(out))
    _put(caller, nevents, struct.pack("<I", n))
    return 0


_STUBS: Final[dict[str, tuple[list[wasmtime.ValType], list[wasmtime.ValType],
                              Callable[..., Any]]]] = {
    "args_get": ([_i32, _i32], [_i32], _nothing),
    "args_sizes_get": ([_i32, _i32], [_i32], _zero_sizes),
    "environ_get": ([_i32, _i32], [_i32], _nothing),
    "environ_sizes_get": ([_i32, _i32], [_i32], _zero_sizes),
    "clock_res_get": ([_i32, _i32], [_i32], _clock_res_get),
    "clock_time_get": ([_i32, _i64, _i32], [_i32], _clock_time_get),
    "random_get": ([_i32, _i32], [_i32], _random_get),
    "fd_write": ([_i32, _i32, _i32, _i32], [_i32], _fd_write),
    "fd_read": ([_i32, _i32, _i32, _i32], [_i32], _badf4),
    "fd_close": ([_i32], [_i32], _badf1),
    "fd_fdstat_get": ([_i32, _i32], [_i32], _badf2),
    "fd_prestat_get": ([_i32, _i32], [_i32], _badf2),
    "fd_prestat_dir_name": ([_i32, _i32, _i32], [_i32], _badf3),
    "fd_seek": ([_i32, _i64, _i32, _i32], [_i32], _badf4),
    "proc_exit": ([_i32], [], _proc_exit),
    "sched_yield": ([], [_i32], _sched_yield),
    "poll_oneoff": ([_i32, _i32, _i32, _i32], [_i32], _poll_oneoff),
}


def stub_signatures() -> dict[tuple[str, str], tuple[tuple[str, ...], tuple[str, ...]]]:
    """(module, name) -> (params, results) of every stub, for the load-time import check."""
    return {(WASI_MODULE, name): (tuple(str(p) for p in params), tuple(str(r) for r in results))
            for name, (params, results, _) in _STUBS.items()}


def define_wasi_stubs(linker: wasmtime.Linker, wanted: set[str]) -> None:
    """Define the stubs named in `wanted` (the module's WASI imports) in `linker`."""
    for name in sorted(wanted):
        params, results, func = _STUBS[name]
        linker.define_func(WASI_MODULE, name, wasmtime.FuncType(params, results), func,
                           access_caller=True)
