"""Decoding a response for a path, and re-encoding it only when something changed.

Every response a path decodes also has its broker endpoints rewritten (a Fetch v16+ or
Produce v10+ response may carry KIP-951 node endpoints), so that decoding for a filter never
lets a broker address through.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from sluice.codec.endpoints import carries_endpoints, endpoints_only_in_tags, rewrite_endpoints
from sluice.codec.errors import CodecError
from sluice.codec.guard import fields_end
from sluice.codec.headers import RequestHeader, response_header_size
from sluice.codec.messages import ApiKey, decode_response, encode_response
from sluice.codec.produce_offsets import produce_response_tagged
from sluice.codec.schemas import response_schema
from sluice.proxy.paths.base import EndpointMapper, Frame, Refused


def may_carry_endpoints(api_key: int, version: int, frame: Frame) -> bool:
    """Whether the response may hold a broker endpoint, so it must be decoded to be rewritten.

    Most Produce and Fetch responses carry none: their only endpoints (KIP-951) sit in a
    top-level tagged field, and a scan of the regular fields proves there is no tagged field
    without decoding (the full decode of every Produce response was the largest Python cost
    of pass-through; a Produce response's scan steps over each error-free partition with one
    byte comparison, `produce_response_tagged`)."""
    if not carries_endpoints(api_key, version):
        return False
    if not endpoints_only_in_tags(api_key, version):
        return True
    size = response_header_size(frame, api_key, version)
    if api_key == ApiKey.PRODUCE:
        # Every Produce response of a pass-through connection comes here: error-free
        # partitions are stepped over by a byte comparison instead of the schema walk.
        return produce_response_tagged(version, frame, size)
    try:
        end = fields_end(response_schema(api_key, version), frame[size:])
    except CodecError:
        return True  # the full decode reports it
    return not (end == len(frame) - size - 1 and frame[-1] == 0)


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
