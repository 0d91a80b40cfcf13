"""Fetch requests: the response size a consumer asks for, read and lowered in place.

A Fetch request's `max_bytes` (v3 and later: how many bytes of records the whole response may
hold, at least one batch whatever it says) is a fixed-width field at a fixed place behind the
request header: after `replica_id`, `max_wait_ms` and `min_bytes` up to v14; from v15, where
`replica_id` moved into a tagged field, after `max_wait_ms` and `min_bytes`. `min_bytes`, just
before it, is lowered to the same cap when it asks for more: a broker answers as soon as
`min_bytes` are available (counted per partition, not up to `max_bytes`), so a request left
asking for more than it may get would wait `max_wait_ms` for data already there once the
backlog falls under `min_bytes`. Lowering them changes nothing else in the request, so they are
written over in a copy of the frame; nothing is decoded. Sans-IO.
"""

from __future__ import annotations

import struct
from typing import Final

from sluice.codec.errors import DecodeError

__all__ = ["cap_fetch_max_bytes", "fetch_max_bytes_at"]

Buffer = bytes | bytearray | memoryview

_MIN_MAX: Final = struct.Struct(">ii")  # min_bytes, max_bytes


def fetch_max_bytes_at(version: int) -> int | None:
    """Where `max_bytes` sits in a Fetch request of `version`, from the end of its request
    header; None before v3, which has none."""
    if version < 3:
        return None
    return 12 if version < 15 else 8


def cap_fetch_max_bytes(frame: Buffer, header_size: int, version: int,
                        cap: int) -> bytes | None:
    """`frame` (a Fetch request from its header on, `header_size` bytes of header) asking for
    at most `cap` bytes (`max_bytes`, and `min_bytes` where it asked for more), or None when
    it asks for no more already (or has no `max_bytes`). DecodeError when the frame ends
    before the field."""
    at = fetch_max_bytes_at(version)
    if at is None:
        return None
    at += header_size
    if len(frame) < at + 4:
        raise DecodeError(f"Fetch v{version} request ends at byte {len(frame)}, before max_bytes")
    least, asked = _MIN_MAX.unpack_from(frame, at - 4)
    if asked <= cap:
        return None
    out = bytearray(frame)
    _MIN_MAX.pack_into(out, at - 4, min(least, cap), cap)
    return bytes(out)
