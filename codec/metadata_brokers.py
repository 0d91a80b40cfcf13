"""A Metadata response's broker list, found and written in bytes: the only endpoints a
Metadata answer carries, so the address path (proxy/paths/addresses.py) rewrites them by
splicing a new list between the answer's own bytes instead of rewriting the decoded entities
and encoding the whole answer again with kio (a one-topic, six-partition v12 answer in
process: 13.5 µs for the path's decode, learning and splice, 66.5 µs the kio way).

The list sits at the front of the body, after ThrottleTimeMs (v3+): a count (int32; a compact
count from v9), then per broker NodeId (int32), Host (string; compact from v9), Port (int32),
Rack (nullable string, v1+; compact from v9) and, from v9, tagged fields. `brokers_end`
declines (None) a list whose entries carry tagged fields: none is defined, and kio's encoding
would drop them, so such an answer takes the kio path and stays as it always was.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence

from .errors import DecodeError
from .guard import read_uvarint
from .splice_fields import uvarint_bytes

Buffer = bytes | bytearray | memoryview

_i16 = struct.Struct(">h")
_i32 = struct.Struct(">i")

#: The first Metadata version with ThrottleTimeMs, with Rack, with compact encodings.
THROTTLE_FROM = 3
RACK_FROM = 1
FLEXIBLE_FROM = 9

#: (node id, host, port, rack) of one broker entry.
Broker = tuple[int, str, int, "str | None"]


def brokers_start(version: int) -> int:
    """Where the broker list starts in a Metadata response body of `version`."""
    return 4 if version >= THROTTLE_FROM else 0


def brokers_end(version: int, body: Buffer) -> int | None:
    """The offset just past the broker list in `body` (the response after its header); None
    when an entry carries tagged fields. DecodeError when the list runs past the body."""
    end = len(body)
    pos = brokers_start(version)
    flexible = version >= FLEXIBLE_FROM
    try:
        if flexible:
            count, pos = read_uvarint(body, pos, end)
            count -= 1
        else:
            (count,) = _i32.unpack_from(body, pos)
            pos += 4
        for _ in range(max(count, 0)):
            pos += 4  # NodeId
            if flexible:
                size, pos = read_uvarint(body, pos, end)
                pos += size - 1
            else:
                (size,) = _i16.unpack_from(body, pos)
                pos += 2 + max(size, 0)
            pos += 4  # Port
            if version >= RACK_FROM:
                if flexible:
                    size, pos = read_uvarint(body, pos, end)
                    pos += max(size - 1, 0)
                else:
                    (size,) = _i16.unpack_from(body, pos)
                    pos += 2 + max(size, 0)
            if flexible:
                if pos >= end:
                    raise DecodeError("Metadata brokers truncated")
                if body[pos] != 0:
                    return None
                pos += 1
    except struct.error:
        raise DecodeError("Metadata brokers truncated") from None
    if pos > end:
        raise DecodeError("Metadata brokers truncated")
    return pos


def _string(value: str | None, flexible: bool) -> bytes:
    if value is None:
        return b"\x00" if flexible else _i16.pack(-1)
    raw = value.encode()
    return (uvarint_bytes(len(raw) + 1) if flexible else _i16.pack(len(raw))) + raw


def encode_brokers(version: int, brokers: Sequence[Broker]) -> bytes:
    """The broker list of a Metadata response body of `version`, as kio encodes it."""
    flexible = version >= FLEXIBLE_FROM
    out = [uvarint_bytes(len(brokers) + 1) if flexible else _i32.pack(len(brokers))]
    for node_id, host, port, rack in brokers:
        out.append(_i32.pack(node_id))
        out.append(_string(host, flexible))
        out.append(_i32.pack(port))
        if version >= RACK_FROM:
            out.append(_string(rack, flexible))
        if flexible:
            out.append(b"\x00")
    return b"".join(out)
