"""FindCoordinator's coordinators written in bytes (codec/coordinators.py) against the kio way
it replaces (decode, `rewrite_endpoints`, encode), for every version, any coordinators and
address mapping; on the golden answers captured from real clients; and declining (None, the
kio path decides) whatever is not a plain answer."""

from __future__ import annotations

import datetime
import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sluice.codec import entities
from sluice.codec.coordinators import BATCHED_FROM, rewrite_coordinators
from sluice.codec.endpoints import rewrite_endpoints
from sluice.codec.errors import CodecError
from sluice.codec.headers import response_header_size
from sluice.codec.messages import ApiKey, codec_version_range, decode_response, encode_response

_KEY = int(ApiKey.FIND_COORDINATOR)
_SPAN = codec_version_range(_KEY)
assert _SPAN is not None
_VERSIONS = st.integers(_SPAN[0], _SPAN[1])
_HOSTS = st.one_of(st.sampled_from(["kafka-1.internal", "127.0.0.1", "b", ""]),
                   st.text(max_size=40))
#: (key, node id, host, port, error code, error message) of one coordinator.
_ENTRIES = st.lists(st.tuples(st.text(max_size=16), st.integers(-2, 40), _HOSTS,
                              st.integers(-1, 65535), st.sampled_from([0, 15, 16]),
                              st.one_of(st.none(), st.text(max_size=20))),
                    min_size=1, max_size=5)

Entry = tuple[str, int, str, int, int, "str | None"]


def _answer(version: int, entries: list[Entry], throttle: int = 0) -> bytes:
    """A FindCoordinator response body: v4+ lists `entries`, older versions carry the first."""
    cls = entities.response_class(_KEY, version)
    fields: dict[str, Any] = {}
    if version >= 1:
        fields["throttle_time"] = datetime.timedelta(milliseconds=throttle)
    if version >= BATCHED_FROM:
        ecls = entities.element_class(cls, "coordinators")
        fields["coordinators"] = tuple(
            entities.build(ecls, key=k, node_id=n, host=h, port=p, error_code=e,
                           error_message=m) for k, n, h, p, e, m in entries)
    else:
        _k, n, h, p, e, m = entries[0]
        fields.update(node_id=n, host=h, port=p, error_code=e)
        if version >= 1:
            fields["error_message"] = m
    return encode_response(entities.build(cls, **fields))


def _by_kio(version: int, body: bytes, mapper: Any) -> bytes:
    """What the address path answered before: decode, rewrite, encode (the body itself when
    nothing changed)."""
    response = decode_response(_KEY, version, body)
    rewritten = rewrite_endpoints(response, _KEY, version, mapper)
    return body if rewritten is response else encode_response(rewritten)


def _mover(moved: set[int], host: str, port: int) -> Any:
    def mapper(node: int, h: str, p: int) -> tuple[str, int]:
        return (host, port) if node in moved else (h, p)
    return mapper


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(version=_VERSIONS, entries=_ENTRIES, picks=st.lists(st.booleans(), max_size=5),
       host=_HOSTS, port=st.integers(0, 65535), throttle=st.integers(0, 1000))
def test_the_spliced_answer_is_the_kio_rewrite(version: int, entries: list[Entry],
                                               picks: list[bool], host: str, port: int,
                                               throttle: int) -> None:
    """Byte for byte, for every version: the picked coordinators' nodes get (`host`,
    `port`), the others keep theirs, an entry without a usable endpoint stays, and an answer
    with nothing to map is handed back as the same object."""
    body = _answer(version, entries, throttle)
    moved = {e[1] for e, pick in zip(entries, picks, strict=False) if pick}
    mapper = _mover(moved, host, port)
    out = rewrite_coordinators(version, body, mapper)
    expected = _by_kio(version, body, mapper)
    assert out is not None and bytes(out) == expected
    assert (out is body) == (expected is body)


@pytest.mark.parametrize("version", range(_SPAN[0], _SPAN[1] + 1))
def test_every_version_splices_as_kio_does(version: int) -> None:
    """Each version for sure: a longer and a shorter host, a node left alone, an entry in
    error (node -1, no host) untouched, over a view as well as bytes."""
    entries: list[Entry] = [("g1", 1, "kafka-1.internal", 9092, 0, None),
                            ("g2", -1, "", -1, 15, "not available"),
                            ("g3", 3, "kafka-3", 9094, 0, None)]
    for first in (0, 2):  # before v4 only the first entry is in the answer
        listed = entries[first:] + entries[:first]
        for moved, host, port in (({1, 3}, "a-much-longer-proxy-host.local", 19092),
                                  ({1}, "p", 1)):
            body = _answer(version, listed)
            mapper = _mover(moved, host, port)
            expected = _by_kio(version, body, mapper)
            for given_body in (body, memoryview(body)):
                out = rewrite_coordinators(version, given_body, mapper)
                assert out is not None and bytes(out) == expected
            in_answer = listed if version >= BATCHED_FROM else listed[:1]
            assert (expected != body) == any(e[1] in moved for e in in_answer)


def _golden() -> list[tuple[str, int, bytes]]:
    found = []
    for path in sorted((Path(__file__).parent / "golden").glob("*.jsonl")):
        for line in path.read_text().splitlines():
            raw = json.loads(line)
            if raw["api_key"] == _KEY and raw["dir"] == "response":
                found.append((path.stem, raw["api_version"], bytes.fromhex(raw["frame"])))
    return found


_GOLDEN = _golden()


def test_the_golden_answers_cover_old_and_batched_versions() -> None:
    assert {v < BATCHED_FROM for _c, v, _f in _GOLDEN} == {True, False}


@pytest.mark.parametrize("client, version, frame", _GOLDEN,
                         ids=[f"{c}-v{v}-{i}" for i, (c, v, _f) in enumerate(_GOLDEN)])
def test_golden_answers_splice_as_kio_does(client: str, version: int, frame: bytes) -> None:
    """Tansu's answers to three clients: handed back as they are when no address changes,
    and written as kio writes them when every coordinator moves."""
    body = frame[response_header_size(frame, _KEY, version):]
    same = rewrite_coordinators(version, body, lambda n, h, p: (h, p))
    assert same is body
    mapper = _mover(set(range(-1, 1 << 16)), "proxy.local", 19092)
    out = rewrite_coordinators(version, body, mapper)
    assert out is not None and bytes(out) == _by_kio(version, body, mapper) != body


def _edits(version: int) -> dict[str, bytes]:
    """Answers that are not plain ones, each by one edit of a kio-encoded answer."""
    body = _answer(version, [("g", 1, "h", 9092, 0, None)])
    host_at = body.index(b"h")
    # The error code's place: where the same answer with another code differs.
    other = _answer(version, [("g", 1, "h", 9092, 15, None)])
    code_at = next(i for i, (a, b) in enumerate(zip(body, other, strict=True)) if a != b) - 1
    edits = {
        "error code kio does not know": body[:code_at] + b"\x27\x0f" + body[code_at + 2:],
        "truncated": body[:-1],
        "trailing byte": body + b"\x00",
        "host not UTF-8": body[:host_at] + b"\xff" + body[host_at + 1:],
    }
    if version < 3:
        edits["null host"] = body[:host_at - 2] + b"\xff\xff" + body[host_at + 1:]
    else:
        edits["null host"] = body[:host_at - 1] + b"\x00" + body[host_at + 1:]
        edits["tagged field"] = body[:-1] + b"\x01\x05\x01\x07"
    if version >= BATCHED_FROM:
        edits["entry tagged field"] = body[:-2] + b"\x01\x05\x01\x07" + body[-1:]
        edits["null array"] = body[:4] + b"\x00" + body[-1:]
    return edits


@pytest.mark.parametrize("version", range(_SPAN[0], _SPAN[1] + 1))
def test_what_is_not_a_plain_answer_is_left_to_kio(version: int) -> None:
    """Truncated or trailing bytes, text that is not UTF-8, a null where the schema has none,
    an error code kio does not know (9999), a tagged field (none defined: kio's encoding would
    drop it): None, so the kio path reads the answer and decides (it refuses most of them)."""
    mapper = _mover({1}, "proxy.local", 19092)
    for name, body in _edits(version).items():
        assert rewrite_coordinators(version, body, mapper) is None, name
        try:
            decode_response(_KEY, version, body)
        except CodecError:
            continue
        assert name in ("tagged field", "entry tagged field", "null array"), name


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(version=_VERSIONS, entries=_ENTRIES, data=st.data())
def test_a_mangled_answer_is_spliced_only_where_kio_reads_it(version: int,
                                                             entries: list[Entry],
                                                             data: st.DataObject) -> None:
    """Any answer a few byte edits away from a real one: spliced only where kio decodes it,
    and then exactly as kio rewrites it; else None (declined), never something kio refuses."""
    body = bytearray(_answer(version, entries))
    for _ in range(data.draw(st.integers(1, 3))):
        at = data.draw(st.integers(0, len(body) - 1))
        edit = data.draw(st.sampled_from(["set", "insert", "delete"]))
        if edit == "set":
            body[at] = data.draw(st.integers(0, 255))
        elif edit == "insert":
            body[at:at] = bytes([data.draw(st.integers(0, 255))])
        else:
            del body[at]
    mapper = _mover({e[1] for e in entries}, "proxy.local", 19092)
    out = rewrite_coordinators(version, bytes(body), mapper)
    if out is None:
        return
    expected = _by_kio(version, bytes(body), mapper)  # CodecError: spliced what kio refuses
    assert bytes(out) == expected
