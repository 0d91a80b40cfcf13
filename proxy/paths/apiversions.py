"""ApiVersions: advertise only what both the broker and the proxy's codec can handle.

A client picks the highest version both sides support. If the proxy advertised a version its
codec cannot decode, a Produce to a filtered topic could not be inspected. Re-encoding the
response also normalises broker quirks (Debian's kcat cannot parse Tansu's own encoding).

The broker's own ranges are recorded in the process's `VersionTable`; the router's
`refusal` (registry.py) uses them to gate requests by the same rule (`advertised_range`).

Every client connection starts with an ApiVersions exchange, and a broker answers each with the
same body (the correlation id is in the header): the path keeps the rewrite of the last few
bodies it saw (`_MEMO`), so a connection's answer is a dictionary look-up instead of a kio
decode, a rebuild and an encode (~0.3 ms of CPU warm, several times that cold: a sixth of a
short-lived consumer's proxy CPU in `bench_proxy`'s workload 2, which opens ~11 connections a
slice per variant).

An ApiVersions request newer than the codec decodes (Kafka 4.4's clients send v5) is answered
by the proxy as a broker answers a version it lacks (KIP-511): error UNSUPPORTED_VERSION in a
v0 body listing the ApiVersions versions the proxy reads, so the client asks again in one of
them. Relaying it would hand the client the broker's list unfiltered: versions the codec
cannot decode, and the share-group APIs hidden while fetch filters run.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from sluice.codec import entities
from sluice.codec.error_codes import ErrorCode
from sluice.codec.errors import CodecError
from sluice.codec.messages import ApiKey, codec_version_range, decode_response, encode_response
from sluice.proxy.paths.base import (
    Answer,
    Exchange,
    Forward,
    Frame,
    PathContext,
    Refused,
    RequestOutcome,
    Respond,
)
from sluice.proxy.paths.registry import VersionTable, advertised_range
from sluice.proxy.paths.share import UNFILTERED_RECORD_APIS


def intersect_api_versions(response: Any, hidden: frozenset[int] = frozenset()) -> Any:
    """Keep the versions both sides support; drop the API keys in `hidden` altogether."""
    kept = []
    for entry in response.api_keys:
        if int(entry.api_key) in hidden:
            continue
        broker = (int(entry.min_version), int(entry.max_version))
        span = advertised_range(int(entry.api_key), broker)
        if span is None:
            continue
        low, high = span
        kept.append(
            dataclasses.replace(
                entry,
                min_version=type(entry.min_version)(low),
                max_version=type(entry.max_version)(high),
            )
        )
    return dataclasses.replace(response, api_keys=tuple(kept))


def decode_api_versions(version: int, body: bytes | memoryview) -> Any:
    """`body` is the response after its (always v0, 4-byte) header."""
    try:
        return decode_response(ApiKey.API_VERSIONS, version, body)
    except CodecError:
        if version == 0:
            raise
        # A broker that does not support the requested version answers in v0.
        return decode_response(ApiKey.API_VERSIONS, 0, body)


def unsupported_version_answer(correlation_id: int) -> bytes:
    """A broker's answer to an ApiVersions version it lacks: header v0, a v0 body with error
    UNSUPPORTED_VERSION and the ApiVersions range the proxy reads."""
    span = codec_version_range(ApiKey.API_VERSIONS)
    assert span is not None
    cls = entities.response_class(ApiKey.API_VERSIONS, 0)
    key_cls = entities.element_class(cls, "api_keys")
    only = entities.build(
        key_cls, api_key=int(ApiKey.API_VERSIONS), min_version=span[0], max_version=span[1]
    )
    body = encode_response(
        entities.build(cls, error_code=int(ErrorCode.UNSUPPORTED_VERSION), api_keys=(only,))
    )
    return correlation_id.to_bytes(4, "big", signed=True) + body


def rewrite_api_versions_response(
    version: int, body: bytes | memoryview, hidden: frozenset[int] = frozenset()
) -> bytes:
    """`body` is the response after its (always v0, 4-byte) header."""
    return encode_response(intersect_api_versions(decode_api_versions(version, body), hidden))


#: Rewritten ApiVersions bodies kept per process (`ApiVersionsPath.on_response`): one per
#: (broker, request version, fetch filters on or off) seen, so a handful; emptied when full.
_MEMO = 16


class ApiVersionsPath:
    name = "api-versions"
    api_keys = frozenset({int(ApiKey.API_VERSIONS)})

    def __init__(self, versions: VersionTable) -> None:
        self.versions = versions
        #: (request version, hidden keys, the broker's body) -> (the broker's ranges when it
        #: lists any without error, else None; the rewritten body).
        self._memo: dict[tuple[int, frozenset[int], bytes],
                         tuple[dict[int, tuple[int, int]] | None, bytes]] = {}

    def wants_request(self, ctx: PathContext, api_key: int) -> bool:
        return True

    def wants_response(self, ctx: PathContext, api_key: int, version: int) -> bool:
        return True

    def on_request(self, ctx: PathContext, exchange: Exchange, frame: Frame) -> RequestOutcome:
        span = codec_version_range(ApiKey.API_VERSIONS)
        if span is not None and exchange.header.api_version <= span[1]:
            return Forward()
        return Answer(unsupported_version_answer(exchange.header.correlation_id))

    def on_response(self, ctx: PathContext, exchange: Exchange, frame: Frame) -> Respond:
        hidden = UNFILTERED_RECORD_APIS if ctx.filters_on("fetch") else frozenset()
        version = exchange.header.api_version
        # ApiVersions responses always use header v0: the 4-byte correlation id.
        key = (version, hidden, bytes(frame[4:]))
        known = self._memo.get(key)
        if known is None:
            known = self._rewrite(version, key[2], hidden)
            if len(self._memo) >= _MEMO:
                self._memo.clear()
            self._memo[key] = known
        ranges, body = known
        if ranges is not None:
            # Learnt again: another broker's answer may have been learnt since.
            self.versions.learn(ranges)
        return Respond(bytes(frame[:4]) + body)

    @staticmethod
    def _rewrite(version: int, body: bytes, hidden: frozenset[int]
                 ) -> tuple[dict[int, tuple[int, int]] | None, bytes]:
        """The broker's ranges (None unless it lists some without error) and the body
        the client gets."""
        try:
            response = decode_api_versions(version, body)
        except CodecError as exc:
            raise Refused(f"cannot decode ApiVersions response: {exc}") from None
        ranges = None
        if int(response.error_code) == ErrorCode.NONE and response.api_keys:
            ranges = {
                int(e.api_key): (int(e.min_version), int(e.max_version))
                for e in response.api_keys
            }
        return ranges, encode_response(intersect_api_versions(response, hidden))
