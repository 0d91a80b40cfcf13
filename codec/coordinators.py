"""A FindCoordinator response's endpoints found and written in bytes: the address path
(proxy/paths/addresses.py) maps each coordinator's host and port by splicing them between the
answer's own bytes instead of decoding the answer with kio, rewriting the entities and
encoding it again (as Metadata's broker list, `metadata_brokers.py`).

Layouts (after the response header): v0 ErrorCode, NodeId, Host, Port; v1-v2 ThrottleTimeMs,
ErrorCode, ErrorMessage (nullable), NodeId, Host, Port; v3 the same in compact encodings and
tagged fields last; v4+ ThrottleTimeMs, then Coordinators, a compact array of (Key, NodeId,
Host, Port, ErrorCode, ErrorMessage, tagged fields), then tagged fields. `rewrite_coordinators`
declines (None) anything but a plain answer that kio would read as it is: truncated or
trailing bytes, a tagged field (none is defined; kio's encoding would drop it), a null where
the schema has none, text that is not UTF-8, an error code kio does not know (its decode
refuses it). The kio path then decides, as it always did.
"""

from __future__ import annotations

import struct

from .endpoints import EndpointMapper
from .error_codes import ErrorCode
from .errors import DecodeError
from .guard import read_uvarint
from .splice_fields import Buffer, uvarint_bytes

_i16, _i32 = struct.Struct(">h"), struct.Struct(">i")

#: The first FindCoordinator version with ThrottleTimeMs, with compact encodings, with the
#: Coordinators array.
THROTTLE_FROM = 1
FLEXIBLE_FROM = 3
BATCHED_FROM = 4
#: The error codes kio decodes (`ErrorCode`, equal to kio's list): any other fails its decode.
_KNOWN_CODES = frozenset(int(code) for code in ErrorCode)


class _Unread(Exception):
    """Not a plain answer: the kio path decides."""


def _string(body: Buffer, pos: int, end: int, flexible: bool, nullable: bool
            ) -> tuple[str | None, int]:
    """The string at `pos` (checked as kio reads it) and the position after it."""
    if flexible:
        size, pos = read_uvarint(body, pos, end)
        size -= 1
    else:
        (size,) = _i16.unpack_from(body, pos)
        pos += 2
    if size < 0:
        if size != -1 or not nullable:
            raise _Unread()
        return None, pos
    if pos + size > end:
        raise _Unread()
    return str(body[pos:pos + size], "utf-8"), pos + size


def _error_code(body: Buffer, pos: int) -> int:
    """The position after the ErrorCode at `pos`; _Unread for a code kio would refuse."""
    (code,) = _i16.unpack_from(body, pos)
    if code not in _KNOWN_CODES:
        raise _Unread()
    return pos + 2


def _tags_none(body: Buffer, pos: int, end: int) -> int:
    if pos >= end or body[pos] != 0:
        raise _Unread()  # truncated, or a tagged field
    return pos + 1


def _endpoint(body: Buffer, pos: int, end: int, flexible: bool
              ) -> tuple[tuple[int, int, int, str, int], int]:
    """((Host's start, Port's end, node id, host, port), the position after Port)."""
    (node_id,) = _i32.unpack_from(body, pos)
    pos += 4
    at = pos
    host, pos = _string(body, pos, end, flexible, False)
    (port,) = _i32.unpack_from(body, pos)
    pos += 4
    return (at, pos, node_id, host or "", port), pos  # `or ""`: never None (not nullable)


def _endpoints(version: int, body: Buffer) -> list[tuple[int, int, int, str, int]]:
    """Every coordinator endpoint of the answer; _Unread when it is not a plain one."""
    end = len(body)
    flexible = version >= FLEXIBLE_FROM
    pos = 4 if version >= THROTTLE_FROM else 0
    found = []
    if version < BATCHED_FROM:
        pos = _error_code(body, pos)
        if version >= THROTTLE_FROM:
            _, pos = _string(body, pos, end, flexible, True)  # ErrorMessage
        entry, pos = _endpoint(body, pos, end, flexible)
        found.append(entry)
    else:
        count, pos = read_uvarint(body, pos, end)
        if count == 0:
            raise _Unread()  # a null array: not nullable
        for _ in range(count - 1):
            _, pos = _string(body, pos, end, True, False)  # Key
            entry, pos = _endpoint(body, pos, end, True)
            found.append(entry)
            pos = _error_code(body, pos)
            _, pos = _string(body, pos, end, True, True)  # ErrorMessage
            pos = _tags_none(body, pos, end)
    if flexible:
        pos = _tags_none(body, pos, end)
    if pos != end:
        raise _Unread()
    return found


def rewrite_coordinators(version: int, body: Buffer, mapper: EndpointMapper
                         ) -> Buffer | None:
    """`body` (the answer after its header) with each coordinator's endpoint mapped, as
    `codec.endpoints.rewrite_endpoints` and kio's encoding make it: `body` itself when no
    address changes, None when the answer is not a plain one (see the module's docstring).
    An entry without a usable endpoint (a negative node id or port, an empty host) stays, as
    there; `mapper`'s own errors pass through."""
    try:
        found = _endpoints(version, body)
    except (_Unread, DecodeError, struct.error, UnicodeDecodeError):
        return None
    flexible = version >= FLEXIBLE_FROM
    pieces: list[Buffer] = []
    done = 0
    for at, port_end, node_id, host, port in found:
        if node_id < 0 or not host or port < 0:
            continue
        new_host, new_port = mapper(node_id, host, port)
        if (new_host, new_port) == (host, port):
            continue
        raw = new_host.encode()
        size = uvarint_bytes(len(raw) + 1) if flexible else _i16.pack(len(raw))
        pieces += (body[done:at], size, raw, _i32.pack(new_port))
        done = port_end
    if not pieces:
        return body
    pieces.append(body[done:])
    return b"".join(pieces)
