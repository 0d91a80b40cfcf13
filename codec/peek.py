"""Cheap reads of single fields from frames, for the pass-through path that does not decode.

The proxy must know a few facts about every frame (the correlation id of a response, whether a
Produce request expects a response) without paying for a full decode.
"""

from __future__ import annotations

import struct

from sluice.codec.errors import DecodeError
from sluice.codec.headers import _read_uvarint

_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")


def produce_acks(body: bytes | memoryview, flexible: bool) -> int:
    """The `acks` of a Produce request (v3+) body, i.e. the frame after the request header.

    Produce v3+ starts with transactional_id (nullable string, compact when flexible), then acks.
    """
    pos = 0
    if flexible:
        length_plus_one, pos = _read_uvarint(body, pos)
        if length_plus_one > 0:
            pos += length_plus_one - 1
    else:
        if len(body) < 2:
            raise DecodeError("truncated transactional_id")
        length = _I16.unpack_from(body, 0)[0]
        pos = 2 + max(length, 0)
    if pos + 2 > len(body):
        raise DecodeError("truncated acks")
    return int(_I16.unpack_from(body, pos)[0])
