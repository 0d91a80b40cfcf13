"""ApiVersions: advertise only what both the broker and the proxy's codec can handle.

A client picks the highest version both sides support. If the proxy advertised a version its
codec cannot decode, a Produce to a filtered topic could not be inspected. Re-encoding the
response also normalises broker quirks (Debian's kcat cannot parse Tansu's own encoding).

The broker's own ranges are recorded in the process's `VersionTable`; the router's
`refusal` (registry.py) uses them to gate requests by the same rule (`advertised_range`).

Every client connection starts with an ApiVersions exchange, and a broker answers each with the
same list: the path keeps its rewrite per answer (in one memo, `_MEMO`), so a connection's
answer costs a scan of its bytes (`_raw_key`, ~4 µs in process for Kafka's 89-key answer)
instead of a decode, a rebuild of every entry and an encode (~380 µs), or, where the scan
cannot tell, a decode and a look-up by the decoded answer (~52 µs). Kafka's
FinalizedFeaturesEpoch, which moves every half second or so, is left out of both kinds of key
and written into the kept bytes.

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
from sluice.codec.errors import CodecError, DecodeError
from sluice.codec.guard import read_uvarint
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
#: `_rewrite`'s answer: the broker's ranges, the body's bytes before and after the epoch's,
#: the one epoch those bytes are good for (None: any).
_Rewrite = tuple[dict[int, tuple[int, int]] | None, bytes, bytes, int | None]
#: FinalizedFeaturesEpoch's default in the schema (a tagged field: not encoded when default).
_NO_EPOCH = -1
#: The first ApiVersions version with tagged fields (the epoch among them), the epoch's tag.
_TAGGED_FROM = 3
_EPOCH_TAG = 1


class ApiVersionsPath:
    name = "api-versions"
    api_keys = frozenset({int(ApiKey.API_VERSIONS)})

    def __init__(self, versions: VersionTable) -> None:
        self.versions = versions
        #: `_rewrite`s, each kept under one key: the answer's bytes without its epoch's
        #: (`_raw_key`; a hit costs a scan of the answer instead of its decode), or where
        #: that scan cannot tell, (hidden keys, whether the epoch is the default, the decoded
        #: answer with a FinalizedFeaturesEpoch of 0).
        self._memo: dict[tuple[Any, ...], _Rewrite] = {}

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
        body = frame[4:]
        key, epoch = _raw_key(hidden, version, body)
        known = self._memo.get(key) if key is not None else None
        # A kept rewrite answers unless it holds the one epoch it is good for, and another.
        if known is None or (known[3] is not None and known[3] != epoch):
            try:
                response = decode_api_versions(version, body)
            except CodecError as exc:
                raise Refused(f"cannot decode ApiVersions response: {exc}") from None
            decoded = getattr(response, "finalized_features_epoch", None)
            if key is None or decoded != epoch:
                # The scan could not tell, or read another epoch than the decode (an answer
                # in v0 to a newer request, `decode_api_versions`): kept by the decoded
                # answer, never by its bytes. Kafka's FinalizedFeaturesEpoch is its metadata
                # log's offset, which moves every ~0.5 s (KRaft's no-op records): not in the
                # key, written into the kept bytes; except whether it is the schema's
                # default, which the encoding leaves out.
                epoch = decoded
                key = (hidden, epoch == _NO_EPOCH, response if epoch is None else
                       dataclasses.replace(response, finalized_features_epoch=type(epoch)(0)))
                known = self._memo.get(key)
            if known is None or (known[3] is not None and known[3] != epoch):
                known = _rewrite(response, hidden, epoch)
                if len(self._memo) >= _MEMO:
                    self._memo.clear()  # a handful in use: start over, not track age
                self._memo[key] = known
        assert known is not None  # for the type checker: set on every path above
        ranges, head, tail, pinned = known
        if ranges is not None:
            # Learnt on every answer: another broker's may have been learnt since.
            self.versions.learn(ranges)
        if epoch is not None and pinned is None:
            head += epoch.to_bytes(8, "big", signed=True) + tail
        return Respond(bytes(frame[:4]) + head)


def _raw_key(hidden: frozenset[int], version: int, body: Frame
             ) -> tuple[tuple[Any, ...] | None, int | None]:
    """The answer's key in the memo by bytes, and the FinalizedFeaturesEpoch its bytes hold:
    every byte but the epoch's eight (found by a scan of the v3+ layout: ErrorCode, the
    ApiKeys entries, ThrottleTimeMs, then tagged fields, the epoch's tag 1). (None, None) when
    the scan cannot tell (an entry with tagged fields, tags out of order or repeated, a
    truncated body): the decode decides.
    With the epoch's field, also whether it holds the default (written or not, kio's rewrite
    leaves the default out). Without the field, the whole body, and the schema's default (-1;
    None before v3)."""
    if version < _TAGGED_FROM:
        return (hidden, version, bytes(body), None), None
    end = len(body)
    try:
        count, pos = read_uvarint(body, 2, end)  # after ErrorCode
        count -= 1
        if count > 0:
            # Each entry is 7 bytes when its tagged-field count (its last byte) is 0.
            stop = pos + 7 * count
            if stop > end or body[pos + 6:stop:7] != bytes(count):
                return None, None
            pos = stop
        pos += 4  # ThrottleTimeMs
        tags, pos = read_uvarint(body, pos, end)
        at = None
        last = -1
        for _ in range(tags):
            tag, pos = read_uvarint(body, pos, end)
            size, pos = read_uvarint(body, pos, end)
            if tag <= last:
                # Out of order or repeated: kio's decode keeps the last epoch, not the first.
                return None, None
            last = tag
            if tag == _EPOCH_TAG:
                if size != 8 or pos + 8 > end:
                    return None, None
                at = pos
            pos += size
    except DecodeError:
        return None, None
    if at is None:
        return (hidden, version, bytes(body), None), _NO_EPOCH
    epoch = int.from_bytes(body[at:at + 8], "big", signed=True)
    # Whether it is the default, as in the memo per decoded answer: a default the broker
    # wrote is left out of the rewrite (shorter than another epoch's).
    return (hidden, version, bytes(body[:at]), bytes(body[at + 8:]), epoch == _NO_EPOCH), epoch


def _rewrite(response: Any, hidden: frozenset[int], epoch: int | None) -> _Rewrite:
    """The broker's ranges (None unless it lists some without error), and the body the client
    gets: all of it in the first bytes, or (with an epoch) the bytes before and after the
    epoch's eight; last, the one epoch the body is good for where the epoch's bytes were not
    found (the broker's default, which kio leaves out), else None."""
    ranges = None
    if int(response.error_code) == ErrorCode.NONE and response.api_keys:
        ranges = {
            int(e.api_key): (int(e.min_version), int(e.max_version)) for e in response.api_keys
        }
    kept = intersect_api_versions(response, hidden)
    body = encode_response(kept)
    if epoch is None:
        return ranges, body, b"", None
    # The epoch's place in the encoding: encoded again with a bit of each of its bytes
    # flipped, the body differs in exactly those eight bytes.
    other = encode_response(dataclasses.replace(
        kept, finalized_features_epoch=type(epoch)(epoch ^ 0x0101010101010101)))
    at = next((i for i, (a, b) in enumerate(zip(body, other, strict=False)) if a != b), len(body))
    found = (len(other) == len(body) and body[at:at + 8] == epoch.to_bytes(8, "big", signed=True)
             and body[:at] == other[:at] and body[at + 8:] == other[at + 8:])
    return (ranges, body[:at], body[at + 8:], None) if found else (ranges, body, b"", epoch)
