"""The address path's FindCoordinator answers: coordinators' addresses written in bytes
(codec/coordinators.py) without a kio decode, the bytes the kio path wrote; anything else
still read by kio, which refuses what it cannot decode."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from sluice.codec.headers import request_header_bytes, response_header_bytes
from sluice.codec.messages import ApiKey, codec_version_range
from sluice.proxy.paths import responses
from sluice.proxy.paths.addresses import AddressPath
from sluice.proxy.paths.base import Refused, UnknownNodes
from tests.codec.test_codec_coordinators import _answer, _by_kio
from tests.proxy.paths.test_paths import Letters, ListSink, context, exchange_of

_KEY = int(ApiKey.FIND_COORDINATOR)
_SPAN = codec_version_range(_KEY)
assert _SPAN is not None
_ENTRIES = [("g1", 1, "kafka-1.internal", 9092, 0, None), ("g2", 2, "b", 9093, 0, None)]


def _respond(version: int, frame: bytes, mapper: Any) -> bytes:
    ctx = dataclasses.replace(context(None, ListSink(), Letters()), node_address=mapper)
    request = request_header_bytes(_KEY, version, 9, "client") + bytes(8)
    return bytes(AddressPath().on_response(ctx, exchange_of(request), frame).frame)


@pytest.mark.parametrize("version", range(_SPAN[0], _SPAN[1] + 1))
def test_a_find_coordinator_answer_is_rewritten_without_kio(
        version: int, monkeypatch: pytest.MonkeyPatch) -> None:
    head = response_header_bytes(9, _KEY, version)
    body = _answer(version, list(_ENTRIES))

    def moved(node: int, host: str, port: int) -> tuple[str, int]:
        return ("proxy.local", 19000 + node)

    expected = head + _by_kio(version, body, moved)

    def no_kio(*args: object) -> Any:
        raise AssertionError("decoded with kio")

    monkeypatch.setattr(responses, "decode", no_kio)
    assert _respond(version, head + body, moved) == expected != head + body
    assert _respond(version, head + body, lambda n, h, p: (h, p)) == head + body


@pytest.mark.parametrize("version", [_SPAN[0], _SPAN[1]])
def test_an_unknown_coordinator_is_raised_and_a_broken_answer_refused(version: int) -> None:
    """A node not learnt yet is raised for the connection to learn, as on the kio path; a
    truncated answer goes to kio, which refuses it."""
    head = response_header_bytes(9, _KEY, version)
    body = _answer(version, list(_ENTRIES))

    def unknown(node: int, host: str, port: int) -> tuple[str, int]:
        raise UnknownNodes([(node, host, port)])

    with pytest.raises(UnknownNodes) as caught:
        _respond(version, head + body, unknown)
    assert caught.value.nodes == ((1, "kafka-1.internal", 9092),)
    with pytest.raises(Refused):
        _respond(version, head + body[:-1], lambda n, h, p: ("proxy.local", 1))
