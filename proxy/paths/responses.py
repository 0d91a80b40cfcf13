"""Decoding a response for a path, and re-encoding it only when something changed.

Every response a path decodes also has its broker endpoints rewritten (a Fetch v16+ or
Produce v10+ response may carry KIP-951 node endpoints), so that decoding for a filter never
lets a broker address through.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from sluice.codec.endpoints import rewrite_endpoints
from sluice.codec.errors import CodecError
from sluice.codec.headers import RequestHeader, response_header_size
from sluice.codec.messages import ApiKey, decode_response, encode_response
from sluice.proxy.paths.base import EndpointMapper, Frame, Refused


def decode(header: RequestHeader, frame: Frame) -> tuple[int, Any]:
    """(response header size, decoded body); Refused if it cannot be decoded."""
    try:
        size = response_header_size(frame, header.api_key, header.api_version)
        return size, decode_response(header.api_key, header.api_version, frame[size:])
    except CodecError as exc:
        # Forwarding it undecoded could leak a broker address or unfiltered records.
        raise Refused(
            f"cannot decode {ApiKey(header.api_key).name} v{header.api_version} response: {exc}"
        ) from None


def encode(frame: Frame, size: int, response: Any) -> bytes:
    """The frame with its body replaced by `response` (the header bytes are kept)."""
    return bytes(frame[:size]) + encode_response(response)


def transform(
    header: RequestHeader,
    frame: Frame,
    map_endpoint: EndpointMapper,
    change: Callable[[Any], Any],
) -> Frame:
    """Decode, rewrite endpoints, apply `change`; the original bytes if nothing changed."""
    size, response = decode(header, frame)
    final = change(rewrite_endpoints(response, header.api_key, header.api_version, map_endpoint))
    if final is response:
        return frame
    return encode(frame, size, final)
