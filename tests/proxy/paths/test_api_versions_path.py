"""The ApiVersions path: versions the codec reads pass to the broker; a newer one is answered
by the proxy as a broker answers a version it lacks (KIP-511), never relayed unread."""

from __future__ import annotations

from sluice.codec.error_codes import ErrorCode
from sluice.codec.headers import request_header_bytes
from sluice.codec.messages import ApiKey, codec_version_range, decode_response
from sluice.proxy.paths.apiversions import ApiVersionsPath
from sluice.proxy.paths.base import Answer, Forward
from sluice.proxy.paths.registry import VersionTable
from tests.proxy.paths.test_paths import Letters, ListSink, context, exchange_of


def test_api_versions_newer_than_the_codec_gets_unsupported_version() -> None:
    span = codec_version_range(ApiKey.API_VERSIONS)
    assert span is not None
    path = ApiVersionsPath(VersionTable())
    ctx = context(None, ListSink(), Letters())
    for version in range(span[1] + 1):
        frame = request_header_bytes(ApiKey.API_VERSIONS, version, 7, "client") + b"\x00" * 3
        assert isinstance(path.on_request(ctx, exchange_of(frame), frame), Forward)
    newer = span[1] + 1  # what Kafka 4.4's Java client sends first
    frame = request_header_bytes(ApiKey.API_VERSIONS, newer, 42, "client") + b"\x00" * 3
    outcome = path.on_request(ctx, exchange_of(frame), frame)
    assert isinstance(outcome, Answer)
    assert int.from_bytes(outcome.response[:4], "big") == 42  # header v0: correlation id
    answer = decode_response(ApiKey.API_VERSIONS, 0, outcome.response[4:])
    assert answer.error_code == ErrorCode.UNSUPPORTED_VERSION
    assert [(int(k.api_key), int(k.min_version), int(k.max_version)) for k in answer.api_keys] == [
        (int(ApiKey.API_VERSIONS), span[0], span[1])]
