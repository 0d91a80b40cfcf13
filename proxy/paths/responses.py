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
from sluice.codec.fetch_splice import (
    fetch_response_tagged,
    native_fetch_response_tagged,
    native_tagged_args,
)
from sluice.codec.guard import fields_end
from sluice.codec.headers import RequestHeader, response_header_size
from sluice.codec.messages import ApiKey, decode_response, encode_response
from sluice.codec.produce_offsets import (
    native_produce_response_tagged,
    native_tagged_by_id,
    produce_response_tagged,
)
from sluice.codec.schemas import response_schema
from sluice.proxy.paths.base import EndpointMapper, Frame, Refused

#: What `may_carry_endpoints` does per (api_key << 16 | version), worked out once per key
#: and version (both bounded by the router's version gate).
_NONE, _DECODE, _PRODUCE_SCAN, _FIELDS_SCAN, _FETCH_SCAN, _PRODUCE_NATIVE, _FETCH_NATIVE = range(7)
_plans: dict[int, int] = {}
#: The native check and its arguments after (frame, start), by the same key
#: (codec/passthrough.c).
_native: dict[int, tuple[Callable[..., Any], tuple[Any, ...]]] = {}
_PRODUCE = int(ApiKey.PRODUCE)
_FETCH = int(ApiKey.FETCH)


def _plan(api_key: int, version: int) -> int:
    if not carries_endpoints(api_key, version):
        return _NONE
    if not endpoints_only_in_tags(api_key, version):
        return _DECODE
    key = api_key << 16 | version
    if api_key == _PRODUCE:
        check = native_produce_response_tagged
        by_id = native_tagged_by_id(version)
        if check is None or by_id is None:
            return _PRODUCE_SCAN
        _native[key] = (check, (by_id,))
        return _PRODUCE_NATIVE
    if api_key != _FETCH:
        return _FIELDS_SCAN
    fetch_check = native_fetch_response_tagged
    args = native_tagged_args(version)
    if fetch_check is None or args is None:
        return _FETCH_SCAN
    _native[key] = (fetch_check, args)
    return _FETCH_NATIVE


def may_carry_endpoints(api_key: int, version: int, frame: Frame) -> bool:
    """Whether the response may hold a broker endpoint, so it must be decoded to be rewritten.

    Most Produce and Fetch responses carry none: their only endpoints (KIP-951) sit in a
    top-level tagged field, and a scan of the regular fields proves there is no tagged field
    without decoding (the full decode of every Produce response was the largest Python cost
    of pass-through; a Produce response's scan steps over each error-free partition with one
    byte comparison, `produce_response_tagged`). Every Produce response of a pass-through
    connection comes here, so what to do for its key and version is looked up once, and the
    response header every client sends (no tagged field) is stepped over inline: each Python
    call costs several µs on the cold caches of a loaded machine (workload 2). Fetch v16+
    responses get the same: one call (`fetch_response_tagged`) instead of a schema walk that
    made two per partition."""
    key = api_key << 16 | version
    plan = _plans.get(key)
    if plan is None:
        plan = _plans[key] = _plan(api_key, version)
    if plan == _PRODUCE_NATIVE:
        # The check's walk in C, called from here (one Python call less per response); -1:
        # a partition with an error, which the Python walk steps over.
        if len(frame) > 4 and frame[4] == 0:
            check, args = _native[key]
            found = check(frame, 5, *args)
            if found >= 0:
                return bool(found)
        plan = _PRODUCE_SCAN
    elif plan == _FETCH_NATIVE:
        if len(frame) > 4 and frame[4] == 0:
            check, args = _native[key]
            found = check(frame, 5, *args)
            if found >= 0:
                return bool(found)
            # -1: a nested tag section that is not empty, for the schema walk (below).
        plan = _FETCH_SCAN
    if plan == _PRODUCE_SCAN:
        # Produce v10+ (the only versions with endpoints) has the flexible response header:
        # the correlation id, then tagged fields, almost always none (one 0 byte).
        if len(frame) > 4 and frame[4] == 0:
            return produce_response_tagged(version, frame, 5)
        return produce_response_tagged(version, frame, response_header_size(frame, api_key,
                                                                            version))
    if plan == _FETCH_SCAN:
        # Fetch v16+ (the only versions with endpoints): as Produce's, one call per response.
        if len(frame) > 4 and frame[4] == 0:
            return fetch_response_tagged(version, frame, 5)
        return fetch_response_tagged(version, frame, response_header_size(frame, api_key,
                                                                          version))
    if plan == _NONE:
        return False
    if plan == _DECODE:
        return True
    size = response_header_size(frame, api_key, version)
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
