"""Request and response headers.

Request header v1: api_key i16, api_version i16, correlation_id i32, client_id (nullable string
with an i16 length; Kafka keeps this legacy encoding even in v2). Request header v2 adds tagged
fields. Response header v0 is just correlation_id i32; v1 adds tagged fields. Which version a
message uses follows from whether its API version is flexible, with one exception: ApiVersions
responses always use response header v0, so that a client can read the answer whatever version
it asked for.

These functions run on every frame the proxy relays, so they read with `struct.unpack_from`
straight from the frame (bytes or memoryview) and remember flexibility per (key, version).
"""

from __future__ import annotations

import struct
from typing import NamedTuple

from .errors import DecodeError, EncodeError, UnsupportedVersion
from .schemas import schema_flexible

__all__ = [
    "API_VERSIONS_KEY",
    "RequestHeader",
    "is_flexible",
    "parse_request_header",
    "peek_request_header",
    "read_correlation_id",
    "request_header_bytes",
    "response_header_bytes",
    "response_header_size",
]

API_VERSIONS_KEY = 18

_REQ_FIXED = struct.Struct(">hhih")
_unpack_req = _REQ_FIXED.unpack_from
_pack_req = _REQ_FIXED.pack
_I32 = struct.Struct(">i")
_unpack_i32 = _I32.unpack_from
_pack_i32 = _I32.pack

Buffer = bytes | bytearray | memoryview


class RequestHeader(NamedTuple):
    """A parsed request header.

    header_size counts every header byte, tagged fields included, so that
    `frame[header_size:]` is the request body. For an API key the codec does not know,
    flexible is False and header_size ends after client_id (such frames are only relayed).

    A named tuple rather than a frozen dataclass: one is made for every request the proxy
    relays, and a frozen dataclass's `__init__` (one `object.__setattr__` per field) cost
    about three times as much (issue 29).
    """

    api_key: int
    api_version: int
    correlation_id: int
    client_id: str | None
    header_size: int
    flexible: bool


def is_flexible(api_key: int, api_version: int, request: bool = True) -> bool:
    """Whether the request (or response) body of this API version is flexible.

    Note that an ApiVersions response body may be flexible while its header is still v0;
    `response_header_size`/`response_header_bytes` handle that.
    Raises UnsupportedVersion for an API key the codec does not know.
    """
    return schema_flexible(api_key, api_version, request)


def _skip_tagged_fields(buf: Buffer, pos: int) -> int:
    """Return the position after the tagged-field section starting at `pos`."""
    count, pos = _read_uvarint(buf, pos)
    for _ in range(count):
        _tag, pos = _read_uvarint(buf, pos)
        size, pos = _read_uvarint(buf, pos)
        pos += size
        if pos > len(buf):
            raise DecodeError("tagged field runs past the end of the frame")
    return pos


def _read_uvarint(buf: Buffer, pos: int) -> tuple[int, int]:
    result = 0
    shift = 0
    n = len(buf)
    while True:
        if pos >= n:
            raise DecodeError("truncated varint")
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return result, pos
        shift += 7
        if shift > 28:
            raise DecodeError("varint longer than 5 bytes")


#: Whether a request header is flexible, by api_key << 16 | version: one look-up per request
#: (no call into the schemas; every request's header is parsed).
_request_flexible: dict[int, bool] = {}


def parse_request_header(frame: Buffer) -> RequestHeader:
    """Parse the header at the start of a request frame body (without size prefix)."""
    try:
        api_key, api_version, correlation_id, id_len = _unpack_req(frame, 0)
    except struct.error:
        raise DecodeError(f"request frame of {len(frame)} bytes is too short") from None
    pos = 10
    client_id: str | None
    if id_len == -1:
        client_id = None
    elif id_len < 0:
        raise DecodeError(f"invalid client_id length {id_len}")
    else:
        end = pos + id_len
        if end > len(frame):
            raise DecodeError("client_id runs past the end of the frame")
        try:
            client_id = str(frame[pos:end], "utf-8")
        except UnicodeDecodeError:
            raise DecodeError("client_id is not valid UTF-8") from None
        pos = end
    if api_key < 0:
        raise DecodeError(f"invalid api_key {api_key}")
    key = api_key << 16 | (api_version & 0xFFFF)
    flexible = _request_flexible.get(key)
    if flexible is None:
        try:
            flexible = schema_flexible(api_key, api_version, True)
        except UnsupportedVersion:
            flexible = False
        if len(_request_flexible) < 65_536:  # bounded whatever keys a peer sends
            _request_flexible[key] = flexible
    if flexible:
        if pos < len(frame) and frame[pos] == 0:
            pos += 1  # no tagged field: what every client sends
        else:
            pos = _skip_tagged_fields(frame, pos)
    return RequestHeader(api_key, api_version, correlation_id, client_id, pos, flexible)


_REQ_IDS = struct.Struct(">hhi")
_unpack_ids = _REQ_IDS.unpack_from


def peek_request_header(frame: Buffer) -> tuple[int, int, int]:
    """(api_key, api_version, correlation_id) of a request frame: the cheapest read, for
    frames that are relayed without looking further (no client_id, no RequestHeader)."""
    try:
        return _unpack_ids(frame, 0)
    except struct.error:
        raise DecodeError(f"request frame of {len(frame)} bytes is too short") from None


def read_correlation_id(frame: Buffer) -> int:
    """Correlation id of a response frame body (also of a request frame: it sits at byte 4)."""
    try:
        return int(_unpack_i32(frame, 0)[0])
    except struct.error:
        raise DecodeError("frame shorter than a correlation id") from None


def _response_header_flexible(api_key: int, api_version: int) -> bool:
    if api_key == API_VERSIONS_KEY:
        return False
    return schema_flexible(api_key, api_version, False)


def response_header_size(frame: Buffer, api_key: int, api_version: int) -> int:
    """Size of the response header at the start of `frame` for the request it answers."""
    if len(frame) < 4:
        raise DecodeError("response frame shorter than its header")
    if not _response_header_flexible(api_key, api_version):
        return 4
    return _skip_tagged_fields(frame, 4)


def response_header_bytes(correlation_id: int, api_key: int, api_version: int) -> bytes:
    """Encode a response header (v0, or v1 with no tagged fields) for this API version."""
    try:
        head = _pack_i32(correlation_id)
    except struct.error as exc:
        raise EncodeError(f"correlation_id {correlation_id}: {exc}") from None
    if _response_header_flexible(api_key, api_version):
        return head + b"\x00"
    return head


def request_header_bytes(
    api_key: int, api_version: int, correlation_id: int, client_id: str | None
) -> bytes:
    """Encode a request header (v1, or v2 with no tagged fields) for this API version."""
    if client_id is None:
        raw = b""
        id_len = -1
    else:
        raw = client_id.encode("utf-8")
        id_len = len(raw)
    try:
        head = _pack_req(api_key, api_version, correlation_id, id_len)
    except struct.error as exc:
        raise EncodeError(f"request header field out of range: {exc}") from None
    if schema_flexible(api_key, api_version, True):
        return head + raw + b"\x00"
    return head + raw
