"""The address path's Metadata answers: the broker list written in bytes between the answer's
own bytes (codec/metadata_brokers.py) against the kio path it replaced (decode, rewrite every
endpoint, encode again), for any version, brokers, racks, topics and address mapping."""

from __future__ import annotations

import dataclasses
import datetime
import uuid
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sluice.codec import entities
from sluice.codec.endpoints import rewrite_endpoints
from sluice.codec.errors import DecodeError
from sluice.codec.headers import request_header_bytes, response_header_bytes
from sluice.codec.messages import ApiKey, codec_version_range, decode_response, encode_response
from sluice.codec.metadata_brokers import brokers_end, brokers_start
from sluice.proxy.paths.addresses import AddressPath
from tests.proxy.paths.test_paths import Letters, ListSink, context, exchange_of

_SPAN = codec_version_range(ApiKey.METADATA)
assert _SPAN is not None
_VERSIONS = st.integers(_SPAN[0], _SPAN[1])
_HOSTS = st.one_of(st.sampled_from(["kafka-1.internal", "127.0.0.1", "b", ""]),
                   st.text(min_size=0, max_size=40))
_BROKERS = st.lists(st.tuples(st.integers(-2, 40), _HOSTS, st.integers(-1, 65535),
                              st.one_of(st.none(), st.text(max_size=12))), max_size=6)
_TOPICS = st.lists(st.tuples(st.text(min_size=1, max_size=20), st.integers(0, 6)), max_size=3)


def _answer(version: int, cid: int, brokers: list[tuple[int, str, int, str | None]],
            topics: list[tuple[str, int]]) -> bytes:
    cls = entities.response_class(ApiKey.METADATA, version)
    bcls = entities.element_class(cls, "brokers")
    tcls = entities.element_class(cls, "topics")
    pcls = entities.element_class(tcls, "partitions")
    built_topics = tuple(
        entities.build(
            tcls, error_code=0, name=name, topic_id=uuid.UUID(int=i + 1), is_internal=False,
            partitions=tuple(entities.build(pcls, error_code=0, partition_index=p, leader_id=1,
                                            leader_epoch=3, replica_nodes=(1, 2),
                                            isr_nodes=(1,), offline_replicas=())
                             for p in range(count)),
            topic_authorized_operations=-2147483648)
        for i, (name, count) in enumerate(topics))
    body = encode_response(entities.build(
        cls, throttle_time=datetime.timedelta(0),
        brokers=tuple(entities.build(bcls, node_id=n, host=h, port=p, rack=r)
                      for n, h, p, r in brokers),
        cluster_id="cluster", controller_id=1, topics=built_topics,
        cluster_authorized_operations=-2147483648))
    return response_header_bytes(cid, ApiKey.METADATA, version) + body


def _by_kio(version: int, frame: bytes, mapper: Any) -> bytes:
    """What the address path answered before the splice: decode, rewrite, encode."""
    size = len(response_header_bytes(0, ApiKey.METADATA, version))
    response = decode_response(ApiKey.METADATA, version, frame[size:])
    rewritten = rewrite_endpoints(response, ApiKey.METADATA, version, mapper)
    return frame if rewritten is response else frame[:size] + encode_response(rewritten)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(version=_VERSIONS, brokers=_BROKERS, topics=_TOPICS,
       picks=st.lists(st.booleans(), max_size=6), host=_HOSTS, port=st.integers(0, 65535))
def test_the_spliced_answer_is_the_kio_rewrite(
    version: int, brokers: list[tuple[int, str, int, str | None]], topics: list[tuple[str, int]],
    picks: list[bool], host: str, port: int,
) -> None:
    """Byte for byte, for every Metadata version: the picked brokers' nodes get (`host`,
    `port`), the others keep theirs (an answer with nothing to map passes as it came). The
    nodes moved are picked among the answer's own, so that most examples splice."""
    moved = {b[0] for b, pick in zip(brokers, picks, strict=False) if pick}
    _check_against_kio(version, brokers, topics, moved, host, port)


@pytest.mark.parametrize("version", range(_SPAN[0], _SPAN[1] + 1))
def test_every_version_splices_as_kio_does(version: int) -> None:
    """Each version once for sure (hypothesis may splice few flexible answers): a longer and
    a shorter host, a null and a set rack, a node the mapping leaves alone."""
    brokers = [(1, "kafka-1.internal", 9092, None), (2, "b", 9093, "rack-b"),
               (3, "kafka-3", 9094, None)]
    for moved, host, port in (({1, 2}, "a-much-longer-proxy-host.local", 19092), ({1}, "p", 1)):
        frame, out = _check_against_kio(version, brokers, [("t", 2)], moved, host, port)
        assert out != frame  # the splice ran


def _check_against_kio(version: int, brokers: list[tuple[int, str, int, str | None]],
                       topics: list[tuple[str, int]], moved: set[int], host: str, port: int
                       ) -> tuple[bytes, bytes]:
    """The answer, and what the address path made of it (asserted equal to the kio path's)."""
    if version == 0:
        brokers = [(n, h, p, None) for n, h, p, _r in brokers]  # no Rack before v1
    frame = _answer(version, 77, brokers, topics)

    def mapper(node: int, h: str, p: int) -> tuple[str, int]:
        return (host, port) if node in moved else (h, p)

    ctx = dataclasses.replace(context(None, ListSink(), Letters()), node_address=mapper)
    request = request_header_bytes(ApiKey.METADATA, version, 77, "client") + bytes(8)
    outcome = AddressPath().on_response(ctx, exchange_of(request), frame)
    assert bytes(outcome.frame) == _by_kio(version, frame, mapper)
    return frame, bytes(outcome.frame)


@pytest.mark.parametrize("version", range(_SPAN[0], _SPAN[1] + 1))
def test_a_null_broker_list_passes_as_on_the_kio_path(version: int) -> None:
    """Brokers is not nullable, yet kio decodes a null list (None): the kio path passed such
    an answer as it came, and so does the splice (no TypeError out of the path)."""
    frame = bytearray(_answer(version, 5, [], [("t", 1)]))
    at = len(response_header_bytes(5, ApiKey.METADATA, version)) + brokers_start(version)
    if version >= 9:
        assert frame[at] == 1  # a compact count of zero entries
        frame[at:at + 1] = b"\x00"
    else:
        assert frame[at:at + 4] == bytes(4)
        frame[at:at + 4] = b"\xff\xff\xff\xff"
    ctx = context(None, ListSink(), Letters())
    request = request_header_bytes(ApiKey.METADATA, version, 5, "client") + bytes(8)
    outcome = AddressPath().on_response(ctx, exchange_of(request), bytes(frame))
    assert bytes(outcome.frame) == _by_kio(version, bytes(frame), ctx.node_address) == frame


@given(version=_VERSIONS, brokers=_BROKERS, cut=st.integers(1, 64))
def test_a_truncated_broker_list_is_a_decode_error(
    version: int, brokers: list[tuple[int, str, int, str | None]], cut: int,
) -> None:
    frame = _answer(version, 1, brokers, [])
    body = frame[len(response_header_bytes(1, ApiKey.METADATA, version)):]
    end = brokers_end(version, body)
    assert end is not None and end > brokers_start(version)
    short = body[:max(end - cut, 0)]
    with pytest.raises(DecodeError):
        brokers_end(version, short)


def test_an_entry_with_tagged_fields_is_left_to_kio() -> None:
    """None defined for a broker entry: kio's encoding would drop one, so the splice
    declines and the answer keeps the kio path's bytes."""
    version = _SPAN[1] if _SPAN[1] >= 9 else 9
    frame = _answer(version, 1, [(1, "b", 9092, None)], [])
    body = bytearray(frame[len(response_header_bytes(1, ApiKey.METADATA, version)):])
    end = brokers_end(version, bytes(body))
    assert end is not None and body[end - 1] == 0
    body[end - 1:end] = b"\x01\x05\x01\x07"  # one tagged field: tag 5, one byte
    assert brokers_end(version, bytes(body)) is None
