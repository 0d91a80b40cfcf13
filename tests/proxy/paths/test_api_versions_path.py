"""The ApiVersions path: versions the codec reads pass to the broker; a newer one is answered
by the proxy as a broker answers a version it lacks (KIP-511), never relayed unread."""

from __future__ import annotations

import dataclasses
import datetime

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from sluice.codec import entities
from sluice.codec.error_codes import ErrorCode
from sluice.codec.headers import request_header_bytes
from sluice.codec.messages import ApiKey, codec_version_range, decode_response, encode_response
from sluice.proxy.paths.apiversions import (
    ApiVersionsPath,
    _raw_key,
    rewrite_api_versions_response,
)
from sluice.proxy.paths.base import Answer, Forward
from sluice.proxy.paths.registry import VersionTable
from sluice.proxy.paths.share import UNFILTERED_RECORD_APIS
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


def _answer(version: int, ranges: dict[int, tuple[int, int]], cid: int, epoch: int) -> bytes:
    """A broker's ApiVersions response frame (correlation id `cid`) listing `ranges`, with
    FinalizedFeaturesEpoch `epoch` (-1, the default, is left out of the encoding)."""
    cls = entities.response_class(ApiKey.API_VERSIONS, version)
    key_cls = entities.element_class(cls, "api_keys")
    keys = tuple(entities.build(key_cls, api_key=k, min_version=lo, max_version=hi)
                 for k, (lo, hi) in sorted(ranges.items()))
    return cid.to_bytes(4, "big") + encode_response(entities.build(
        cls, error_code=0, api_keys=keys, throttle_time=datetime.timedelta(0),
        finalized_features_epoch=epoch))


def test_api_versions_memo_answers_as_the_rewrite_and_learns_each_time() -> None:
    """An answer seen before is answered from the path's memo: the same bytes as a fresh
    rewrite (per hidden set, whatever FinalizedFeaturesEpoch Kafka's answer carries: its
    metadata offset, which moves), the broker's correlation id, and the broker's ranges learnt
    again, as another broker's answer may have replaced them in between."""
    version = 3
    one = {k: (0, codec_version_range(k)[1]) for k in (0, 1, 3, 18)}  # type: ignore[index]
    other = {**one, 1: (4, 11)}
    versions = VersionTable()
    path = ApiVersionsPath(versions)
    plain = context(None, ListSink(), Letters())
    fetching = dataclasses.replace(plain, directions=frozenset({"fetch"}))
    for cid, epoch in ((5, 28), (6, 29), (7, -1), (8, 1 << 40), (9, -1)):
        request = request_header_bytes(ApiKey.API_VERSIONS, version, cid, "client") + bytes(3)
        for ctx in (plain, fetching):
            for ranges in (one, other):
                frame = _answer(version, ranges, cid, epoch)
                outcome = path.on_response(ctx, exchange_of(request), frame)
                hidden = UNFILTERED_RECORD_APIS if ctx is fetching else frozenset()
                assert outcome.frame == cid.to_bytes(4, "big") + rewrite_api_versions_response(
                    version, frame[4:], hidden)
                assert versions.ranges == ranges
    # Two bodies, each with and without the hidden keys, with and without an epoch.
    assert len(path._memo) == 8


# FinalizedFeaturesEpoch whose bytes, each with its low bit flipped (how `_rewrite` finds the
# epoch in the encoding), read -1: the flipped body leaves the tag out, so the kept body is
# good for that one epoch only.
_FLIPS_TO_DEFAULT = -1 ^ 0x0101010101010101


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(answers=st.lists(st.tuples(
    st.integers(0, 4),                                    # request version
    st.booleans(),                                        # fetch filters on
    st.booleans(),                                        # the other broker's ranges
    st.sampled_from([0, int(ErrorCode.UNSUPPORTED_VERSION)]),
    st.sampled_from([0, 7]),                              # throttle_time ms
    st.one_of(st.sampled_from([-1, 0, 127, 128, (1 << 63) - 1, -(1 << 63), _FLIPS_TO_DEFAULT,
                               _FLIPS_TO_DEFAULT ^ 1]), st.integers(-(1 << 63), (1 << 63) - 1)),
), min_size=1, max_size=40))
@example(answers=[(3, False, False, 0, 0, _FLIPS_TO_DEFAULT), (3, False, False, 0, 0, 5)])
def test_api_versions_memo_answers_as_a_fresh_rewrite(
    answers: list[tuple[int, bool, bool, int, int, int]],
) -> None:
    """Whatever answers come in whatever order (versions with and without tagged fields,
    errors, throttles, fetch filters switched on and off, any epoch), each client gets the
    bytes a fresh rewrite gives and the ranges of every answer without error are learnt."""
    one = {k: (0, codec_version_range(k)[1]) for k in (0, 1, 3, 18, 78)}  # type: ignore[index]
    other = {**one, 1: (4, 11)}
    versions = VersionTable()
    path = ApiVersionsPath(versions)
    plain = context(None, ListSink(), Letters())
    fetching = dataclasses.replace(plain, directions=frozenset({"fetch"}))
    for cid, (version, fetch, second, error, throttle, epoch) in enumerate(answers):
        ranges = other if second else one
        cls = entities.response_class(ApiKey.API_VERSIONS, version)
        key_cls = entities.element_class(cls, "api_keys")
        frame = cid.to_bytes(4, "big") + encode_response(entities.build(
            cls, error_code=error, throttle_time=datetime.timedelta(milliseconds=throttle),
            finalized_features_epoch=epoch, api_keys=tuple(
                entities.build(key_cls, api_key=k, min_version=lo, max_version=hi)
                for k, (lo, hi) in sorted(ranges.items()))))
        request = request_header_bytes(ApiKey.API_VERSIONS, version, cid, "client") + bytes(3)
        before = versions.ranges
        outcome = path.on_response(fetching if fetch else plain, exchange_of(request), frame)
        hidden = UNFILTERED_RECORD_APIS if fetch else frozenset()
        assert outcome.frame == cid.to_bytes(4, "big") + rewrite_api_versions_response(
            version, frame[4:], hidden)
        assert versions.ranges == (ranges if error == 0 else before)
    assert len(path._memo) <= 16


_FEATURES = st.lists(st.tuples(st.text(min_size=1, max_size=12), st.integers(0, 30),
                               st.integers(0, 30)), max_size=4)
_EPOCHS = st.one_of(st.sampled_from([-1, 0, 1, (1 << 63) - 1, -(1 << 63)]),
                    st.integers(-(1 << 63), (1 << 63) - 1))


def _featured(version: int, cid: int, epoch: int, supported: list[tuple[str, int, int]],
              finalized: list[tuple[str, int, int]], zk: bool) -> bytes:
    """A Kafka-like ApiVersions answer: ranges, supported and finalized features, an epoch."""
    cls = entities.response_class(ApiKey.API_VERSIONS, version)
    key_cls = entities.element_class(cls, "api_keys")
    sup_cls = entities.element_class(cls, "supported_features")
    fin_cls = entities.element_class(cls, "finalized_features")
    return cid.to_bytes(4, "big") + encode_response(entities.build(
        cls, error_code=0, throttle_time=datetime.timedelta(0), finalized_features_epoch=epoch,
        zk_migration_ready=zk,
        api_keys=tuple(entities.build(key_cls, api_key=k, min_version=0,
                                      max_version=codec_version_range(k)[1])  # type: ignore[index]
                       for k in (0, 1, 3, 18)),
        supported_features=tuple(entities.build(sup_cls, name=n, min_version=a, max_version=b)
                                 for n, a, b in supported),
        finalized_features=tuple(entities.build(fin_cls, name=n, min_version_level=a,
                                                max_version_level=b) for n, a, b in finalized)))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(version=st.integers(3, 4), epochs=st.lists(_EPOCHS, min_size=1, max_size=4),
       supported=_FEATURES, finalized=_FEATURES, zk=st.booleans())
def test_api_versions_memo_by_bytes_reads_the_epoch_the_decode_reads(
    version: int, epochs: list[int], supported: list[tuple[str, int, int]],
    finalized: list[tuple[str, int, int]], zk: bool,
) -> None:
    """Features before and after the epoch's tag, any epoch: the scan finds the epoch the
    decode finds, the same answer with another epoch has the same key, and every client gets
    the bytes of a fresh rewrite (the later ones from the memo by bytes)."""
    path = ApiVersionsPath(VersionTable())
    ctx = context(None, ListSink(), Letters())
    keys = set()
    for cid, epoch in enumerate(epochs):
        frame = _featured(version, cid, epoch, supported, finalized, zk)
        key, read = _raw_key(frozenset(), version, frame[4:])
        assert key is not None
        assert read == decode_response(ApiKey.API_VERSIONS, version, frame[4:]
                                       ).finalized_features_epoch
        keys.add((key, epoch == -1))
        request = request_header_bytes(ApiKey.API_VERSIONS, version, cid, "client") + bytes(3)
        outcome = path.on_response(ctx, exchange_of(request), frame)
        assert outcome.frame == cid.to_bytes(4, "big") + rewrite_api_versions_response(
            version, frame[4:])
    # One key for the epochs written, one for the default (left out of the encoding).
    assert len(keys) == len({epoch == -1 for epoch in epochs})
    assert len(path._memo) == len(keys)


def test_api_versions_memo_by_bytes_declines_what_it_cannot_scan() -> None:
    """An entry with tagged fields (none defined): the scan cannot step over the entries by
    their size, and the decode answers. A v0 answer to a v3 request (a broker without v3):
    the scan misreads it, disagrees with the decode, and is never kept by its bytes."""
    frame = _featured(3, 1, 5, [], [], False)
    body = bytearray(frame[4:])
    assert body[2] == 5 and body[3 + 6] == 0  # four entries; the first's tagged fields
    assert _raw_key(frozenset(), 3, bytes(body[:3 + 6]) + b"\x01\x00\x00"
                    + bytes(body[3 + 7:]))[0] is None
    old = _answer(0, {0: (0, 9), 18: (0, 3)}, 2, -1)
    path = ApiVersionsPath(VersionTable())
    request = request_header_bytes(ApiKey.API_VERSIONS, 3, 2, "client") + bytes(3)
    for _ in range(2):
        outcome = path.on_response(context(None, ListSink(), Letters()), exchange_of(request), old)
        assert outcome.frame == old[:4] + rewrite_api_versions_response(3, old[4:])
    # Kept once, by the decoded answer: no part of its key is the answer's bytes.
    assert len(path._memo) == 1
    assert not any(isinstance(part, bytes) for part in next(iter(path._memo)))


@pytest.mark.parametrize("version", [3, 4])
def test_api_versions_memo_by_bytes_tells_a_written_default_epoch(version: int) -> None:
    """A broker may write FinalizedFeaturesEpoch's default (-1), which kio's encoding leaves
    out: the same bytes as an answer with another epoch but for those eight, yet a fresh
    rewrite of it is shorter. After the other answer, the client still gets the fresh bytes."""
    frame = _featured(version, 1, 5, [("metadata.version", 1, 20)], [], False)
    key, epoch = _raw_key(frozenset(), version, frame[4:])
    assert key is not None and epoch == 5
    at = 4 + len(key[2])
    written = frame[:at] + (-1).to_bytes(8, "big", signed=True) + frame[at + 8:]
    path = ApiVersionsPath(VersionTable())
    request = request_header_bytes(ApiKey.API_VERSIONS, version, 1, "client") + bytes(3)
    for answer in (frame, written):
        outcome = path.on_response(context(None, ListSink(), Letters()), exchange_of(request),
                                   answer)
        assert outcome.frame == answer[:4] + rewrite_api_versions_response(version, answer[4:])


def test_api_versions_memo_by_bytes_leaves_a_repeated_epoch_tag_to_the_decode() -> None:
    """Tags out of order or repeated break the protocol, yet kio's decode takes the last
    epoch written: the scan, which would read the first, gives no key, and a second answer
    that differs in the first epoch only gets a fresh rewrite's bytes (the last epoch)."""
    frame = _featured(3, 1, 5, [], [], False)
    key, epoch = _raw_key(frozenset(), 3, frame[4:])
    assert key is not None and epoch == 5
    at = 4 + len(key[2])  # the epoch's eight; before them its tag (1), size (8), the count
    assert frame[at - 3:at] == b"\x01\x01\x08"

    def twice(first: int, last: int) -> bytes:
        return (frame[:at - 3] + b"\x02" + b"\x01\x08" + first.to_bytes(8, "big")
                + b"\x01\x08" + last.to_bytes(8, "big") + frame[at + 8:])

    assert _raw_key(frozenset(), 3, twice(5, 5)[4:]) == (None, None)
    path = ApiVersionsPath(VersionTable())
    request = request_header_bytes(ApiKey.API_VERSIONS, 3, 1, "client") + bytes(3)
    for answer in (twice(5, 5), twice(7, 5)):
        outcome = path.on_response(context(None, ListSink(), Letters()), exchange_of(request),
                                   answer)
        assert outcome.frame == answer[:4] + rewrite_api_versions_response(3, answer[4:])
