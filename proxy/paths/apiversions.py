"""ApiVersions: advertise only what both the broker and the proxy's codec can handle.

A client picks the highest version both sides support. If the proxy advertised a version its
codec cannot decode, a Produce to a filtered topic could not be inspected. Re-encoding the
response also normalises broker quirks (Debian's kcat cannot parse Tansu's own encoding).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from sluice.codec.errors import CodecError
from sluice.codec.messages import ApiKey, codec_version_range, decode_response, encode_response

UNSUPPORTED_VERSION = 35


def intersect_api_versions(response: Any, hidden: frozenset[int] = frozenset()) -> Any:
    """Keep the versions both sides support; drop the API keys in `hidden` altogether."""
    kept = []
    for entry in response.api_keys:
        if int(entry.api_key) in hidden:
            continue
        ours = codec_version_range(int(entry.api_key))
        if ours is None:
            continue
        low = max(int(entry.min_version), ours[0])
        high = min(int(entry.max_version), ours[1])
        if low > high:
            continue
        kept.append(
            dataclasses.replace(
                entry,
                min_version=type(entry.min_version)(low),
                max_version=type(entry.max_version)(high),
            )
        )
    return dataclasses.replace(response, api_keys=tuple(kept))


def rewrite_api_versions_response(
    version: int, body: bytes | memoryview, hidden: frozenset[int] = frozenset()
) -> bytes:
    """`body` is the response after its (always v0, 4-byte) header."""
    try:
        response = decode_response(ApiKey.API_VERSIONS, version, body)
    except CodecError:
        if version == 0:
            raise
        # A broker that does not support the requested version answers in v0.
        response = decode_response(ApiKey.API_VERSIONS, 0, body)
    return encode_response(intersect_api_versions(response, hidden))
