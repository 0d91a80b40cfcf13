"""The pass-through fast path's native readers (codec/passthrough.c, `sluice.codec._passthrough`)
give the Python readers' answers: request headers, a Produce request's acks and one topic
name, and whether a Produce or Fetch response may carry top-level tagged fields (KIP-951 node
endpoints), and a Produce request's layout (where each partition's records are), on
generated frames and on frames cut or damaged byte by byte. Where the native
reader hands a frame back (None, or -1) the Python reader decides, errors included."""

from __future__ import annotations

import struct
import uuid
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sluice.codec import fetch_splice, frames, passthrough, produce_offsets
from sluice.codec.errors import CodecError, FrameTooLarge
from sluice.codec.headers import (
    parse_request_header,
    request_header_bytes,
    response_header_bytes,
    response_header_size,
)
from sluice.codec.messages import encode_request, encode_response
from sluice.codec.produce_splice import (
    ProduceRequestLayout,
    produce_head,
    produce_topics,
    scan_produce_request,
)
from sluice.proxy.paths import base as paths_base
from tests.codec.test_codec_fetch_tagged import flexible
from tests.codec.test_codec_produce_splice import build, requests
from tests.codec.test_codec_produce_tagged import mixed

native = passthrough.native


def test_the_native_readers_are_built_and_in_use() -> None:
    # scripts/dev.sh install builds them; without them the Python readers run alone.
    assert native is not None
    assert passthrough.request_header is native.request_header
    assert produce_offsets._native_tagged is native.produce_response_tagged
    assert fetch_splice._native_tagged is native.fetch_response_tagged
    assert frames._whole_frames is native.whole_frames
    assert frames._read_frames is native.read_frames
    assert passthrough.scan_layout is native.scan_produce_request
    assert paths_base.scan_layout is native.scan_produce_request  # what produce_layout calls


def _feed_all(chunks: list[bytes], max_size: int, use_native: bool) -> list[Any]:
    """What a FrameBuffer hands out for `chunks` (frames as bytes, then FrameTooLarge or
    the bytes still missing at the end)."""
    saved = frames._whole_frames
    frames._whole_frames = saved if use_native else None
    got: list[Any] = []
    try:
        fb = frames.FrameBuffer(max_size)
        for chunk in chunks:
            out = fb.feed(chunk)
            got.append([(type(f), bytes(f)) for f in out])
            got.append(fb.missing)
    except FrameTooLarge:
        got.append("too large")
    finally:
        frames._whole_frames = saved
    return got


@settings(max_examples=400, deadline=None)
@given(data=st.data(), bodies=st.lists(st.binary(max_size=40), max_size=6),
       max_size=st.integers(0, 50), extra=st.binary(max_size=6))
def test_reads_are_split_into_frames_as_the_python_reader_splits_them(
    data: st.DataObject, bodies: list[bytes], max_size: int, extra: bytes
) -> None:
    stream = b"".join(struct.pack(">i", len(b)) + b for b in bodies) + extra
    cuts = sorted(data.draw(st.lists(st.integers(0, len(stream)), max_size=4)))
    chunks = [stream[a:b] for a, b in zip([0, *cuts], [*cuts, len(stream)], strict=True)]
    assert _feed_all(chunks, max_size, True) == _feed_all(chunks, max_size, False)


@settings(max_examples=400, deadline=None)
@given(bodies=st.lists(st.binary(max_size=40), max_size=6), max_size=st.integers(0, 50),
       extra=st.binary(max_size=6), spare=st.binary(max_size=8))
def test_a_read_buffer_is_split_into_frames_as_whole_frames_splits_a_copy(
    bodies: list[bytes], max_size: int, extra: bytes, spare: bytes
) -> None:
    # `read_frames` reads a buffer's first `nbytes` in place: the frames `whole_frames` finds
    # in a copy of them (None alike), as read-only views of the buffer itself; the bytes
    # past `nbytes` (not read by the socket) are never looked at.
    read = b"".join(struct.pack(">i", len(b)) + b for b in bodies) + extra
    buffer = bytearray(read + spare)
    got = native.read_frames(buffer, len(read), max_size)
    want = native.whole_frames(read, max_size)
    if want is None:
        assert got is None
        return
    assert got is not None
    assert [bytes(f) for f in got] == [bytes(f) for f in want]
    assert all(f.readonly and f.obj is buffer for f in got)


@pytest.mark.parametrize("nbytes", [-1, 9])
def test_a_read_past_the_buffer_is_refused(nbytes: int) -> None:
    with pytest.raises(ValueError):
        native.read_frames(bytearray(8), nbytes, 100)
    with pytest.raises(TypeError):
        native.read_frames(b"\0" * 8, 4, 100)  # a bytes object was never read into


@pytest.mark.parametrize("limit", [2**31 - 1, 2**63 - 1, 2**63, 2**70])
def test_a_frame_size_limit_past_64_bits_is_no_limit_as_in_the_python_reader(limit: int) -> None:
    # `limits.max_frame_size` has no upper bound: the C reader raised OverflowError on every
    # read of a proxy configured above 2**63 (it stopped answering anyone).
    stream = b"".join(struct.pack(">i", len(b)) + b for b in (b"abc", b"", b"x" * 9))
    want = _feed_all([stream], limit, False)
    assert want[0] == [(memoryview, b"abc"), (memoryview, b""), (memoryview, b"x" * 9)]
    assert _feed_all([stream], limit, True) == want
    assert _feed_all([stream[:5], stream[5:]], limit, True) == _feed_all(
        [stream[:5], stream[5:]], limit, False)


@st.composite
def damaged(draw: st.DrawFn, frame: bytes, start: int = 0) -> bytes:
    """`frame`, maybe cut, with up to three bytes after `start` set to anything."""
    data = bytearray(frame)
    if data and draw(st.booleans()):
        del data[draw(st.integers(start, len(data))):]
    for _ in range(draw(st.integers(0, 3))):
        if len(data) > start:
            data[draw(st.integers(start, len(data) - 1))] = draw(st.integers(0, 255))
    return bytes(data)


def _python_header(frame: bytes) -> Any:
    try:
        return parse_request_header(frame)
    except CodecError:
        return None


@settings(max_examples=400, deadline=None)
@given(data=st.data(), key=st.integers(0, 80), version=st.integers(-1, 20),
       correlation=st.integers(-(2**31), 2**31 - 1),
       client_id=st.one_of(st.none(), st.text(max_size=12)), tail=st.binary(max_size=6))
def test_request_headers_read_as_the_python_reader_reads_them(
    data: st.DataObject, key: int, version: int, correlation: int, client_id: str | None,
    tail: bytes,
) -> None:
    assert native is not None
    # Written by hand: keys and versions the codec does not know are relayed too.
    raw = None if client_id is None else client_id.encode()
    head = struct.pack(">hhih", key, version, correlation, -1 if raw is None else len(raw))
    frame = data.draw(damaged(head + (raw or b"") + tail))
    _python_header(frame)  # fills the flexibility table, as the first request of a key does
    got = native.request_header(frame)
    want = _python_header(frame)
    if got is not None:
        assert got == want and type(got) is type(want)
        assert [type(x) for x in got] == [type(x) for x in want]
    assert passthrough.request_header(memoryview(frame)) in (None, want)


@settings(max_examples=400, deadline=None)
@given(data=st.data(), request=requests())
def test_produce_heads_read_as_the_python_reader_reads_them(
    data: st.DataObject, request: tuple[int, Any]
) -> None:
    assert native is not None
    version, entity = request
    head = request_header_bytes(0, version, 3, "rdkafka")
    frame = data.draw(damaged(head + encode_request(entity), len(head)))
    start = len(head)
    got = native.produce_head(memoryview(frame), start, version)
    try:
        # What `Exchange.produce_topics` reads without the native reader.
        want = produce_head(version, frame[start:]) or produce_topics(version, frame[start:])
    except CodecError:
        assert got is None
        with pytest.raises(CodecError):
            passthrough.read_produce_topics(frame, start, version)
        return
    if got is not None:
        assert got == want and type(got) is type(want)
        assert [type(k) for k in got.keys] == [type(k) for k in want.keys]
    else:
        assert passthrough.read_produce_topics(frame, start, version) == want


def _python_produce_tagged(version: int, frame: bytes, start: int) -> bool:
    saved = produce_offsets._native_tagged
    produce_offsets._native_tagged = None
    try:
        return produce_offsets.produce_response_tagged(version, frame, start)
    finally:
        produce_offsets._native_tagged = saved


def _python_fetch_tagged(version: int, frame: bytes, start: int) -> bool:
    saved = fetch_splice._native_tagged
    fetch_splice._native_tagged = None
    try:
        return fetch_splice.fetch_response_tagged(version, frame, start)
    finally:
        fetch_splice._native_tagged = saved


@settings(max_examples=400, deadline=None)
@given(data=st.data(), response=mixed())
def test_produce_responses_are_judged_as_the_python_walk_judges_them(
    data: st.DataObject, response: tuple[int, Any]
) -> None:
    version, entity = response
    whole = response_header_bytes(7, 0, version) + encode_response(entity)
    size = response_header_size(whole, 0, version)
    frame = data.draw(damaged(whole, size))
    assert produce_offsets.produce_response_tagged(version, frame, size) == (
        _python_produce_tagged(version, frame, size))


@settings(max_examples=300, deadline=None)
@given(data=st.data(), response=flexible())
def test_fetch_responses_are_judged_as_the_python_walk_judges_them(
    data: st.DataObject, response: tuple[int, Any]
) -> None:
    version, entity = response
    whole = response_header_bytes(7, 1, version) + encode_response(entity)
    size = response_header_size(whole, 1, version)
    frame = data.draw(damaged(whole, size))
    assert fetch_splice.fetch_response_tagged(version, frame, size) == (
        _python_fetch_tagged(version, frame, size))


@pytest.mark.parametrize("frame", [b"", b"\x00", b"\x00\x00\x00\x09\x00\x00\x00\x01\xff\xfe",
                                   b"\xff\xff\x00\x00\x00\x00\x00\x01\xff\xff"])
def test_short_or_malformed_headers_are_left_to_the_python_reader(frame: bytes) -> None:
    assert native is not None
    assert native.request_header(frame) is None
    with pytest.raises(CodecError):
        parse_request_header(frame)


# ------------------------------------------------------------------ Produce request layouts


def _described(value: Any) -> Any:
    """`value` (a layout, or anything in it) as plain data that tells every difference: each
    item with its type, a records view with its bytes, the object it views and its flags."""
    if isinstance(value, memoryview):
        return (memoryview, bytes(value), id(value.obj), value.readonly, value.format,
                value.contiguous, value.ndim)
    if isinstance(value, tuple):
        return (type(value), tuple(_described(v) for v in value))
    return (type(value), value)


def _python_layout(version: int, body: Any) -> ProduceRequestLayout | None:
    try:
        return scan_produce_request(version, body)
    except CodecError:
        return None


def _body_as(kind: str, frame: bytes, start: int) -> Any:
    """The body at `start` of `frame` as a caller hands it over: a slice of a view of the
    frame (the paths: a frame read from a socket is a memoryview), or a copy."""
    if kind == "view":
        return memoryview(frame)[start:]
    if kind == "readonly":
        return memoryview(bytearray(frame)).toreadonly()[start:]
    if kind == "bytearray":
        return bytearray(frame[start:])
    return frame[start:]


KINDS = st.sampled_from(["view", "readonly", "bytearray", "bytes"])


def _agree(version: int, body: Any) -> ProduceRequestLayout | None:
    """The native scan's answer for `body`, held to the Python scan's: None, or the same
    layout (records views of the same object); None wherever the Python scan raises."""
    got = native.scan_produce_request(version, body)
    want = _python_layout(version, body)
    if want is None:
        assert got is None
        return None
    if got is not None:
        assert got == want
        assert _described(got) == _described(want)
    return got


@settings(max_examples=400, deadline=None)
@given(request=requests(), kind=KINDS)
def test_produce_layouts_are_found_as_the_python_scan_finds_them(
    request: tuple[int, Any], kind: str
) -> None:
    version, entity = request
    head = request_header_bytes(0, version, 3, "rdkafka")
    body = _body_as(kind, head + encode_request(entity), len(head))
    got = _agree(version, body)
    # kio writes no tagged fields: every version by name is the native scan's to answer, long
    # names, counts and records lengths (varints past one byte) included; by id, the Python's.
    assert (got is not None) == (version < 13)
    if got is not None:
        for topic in got.topics:
            for part in topic.partitions:
                if part.records is not None:  # a slice of the very body (zero-copy)
                    assert part.records.obj is (body.obj if kind in ("view", "readonly")
                                                else body)


@settings(max_examples=600, deadline=None)
@given(data=st.data(), request=requests(), kind=KINDS)
def test_damaged_produce_layouts_are_found_as_the_python_scan_finds_them_or_handed_back(
    data: st.DataObject, request: tuple[int, Any], kind: str
) -> None:
    version, entity = request
    head = request_header_bytes(0, version, 3, "rdkafka")
    frame = data.draw(damaged(head + encode_request(entity), len(head)))
    body = _body_as(kind, frame, len(head))
    got = _agree(version, body)
    # What `Exchange.produce_layout` answers: the same layout, or the Python scan's error.
    want = _python_layout(version, body)
    if want is None:
        with pytest.raises(CodecError):
            passthrough.scan_layout(version, body) or scan_produce_request(version, body)
    else:
        assert (got or scan_produce_request(version, body)) == want


@settings(max_examples=300, deadline=None)
@given(version=st.sampled_from([3, 8, 9, 12]), body=st.binary(max_size=40))
def test_produce_layouts_of_random_bytes_are_handed_back_where_the_python_scan_raises(
    version: int, body: bytes
) -> None:
    _agree(version, body)
    _agree(version, b"\x00\x00\x00\x01\x00\x00\x00\x00" + body)


def _tagged(body: bytes, at: int) -> bytes:
    """`body` with the empty tag section at `at` replaced by one tag (7) of two bytes."""
    assert body[at] == 0
    return body[:at] + b"\x01\x07\x02zz" + body[at + 1 :]


def test_produce_layouts_with_tagged_fields_are_the_python_scans() -> None:
    body = encode_request(build(9, "tx", -1, [("t", [(0, b"abc"), (1, None)])]))
    layout = scan_produce_request(9, body)
    assert native.scan_produce_request(9, body) == layout
    part, topic = layout.topics[0].partitions[1], layout.topics[0]
    for at in (part.records_end, topic.end - 1, layout.topics_end):
        tagged = _tagged(body, at)
        assert native.scan_produce_request(9, tagged) is None
        assert scan_produce_request(9, tagged).topics[0].name == "t"  # the Python scan's


def test_produce_layouts_by_id_or_of_unknown_versions_are_handed_back() -> None:
    body = encode_request(build(13, None, -1, [(uuid.UUID(int=5), [(0, b"abc")])]))
    assert native.scan_produce_request(13, body) is None
    assert scan_produce_request(13, body).topics[0].topic_id == uuid.UUID(int=5)
    classic = encode_request(build(8, None, 1, [("t", [(0, b"abc")])]))
    for version in (-1, 0, 2, 14, 63, 64, 2**70, True):
        assert native.scan_produce_request(version, classic) is None
    assert native.scan_produce_request(8, classic) == scan_produce_request(8, classic)


def test_produce_layouts_of_views_that_are_not_plain_bytes_are_handed_back() -> None:
    body = encode_request(build(8, None, 1, [("t", [(0, b"abcde")])]))
    assert len(body) % 2 == 0 and native.scan_produce_request(8, body) is not None
    for odd in (memoryview(body).cast("h"), memoryview(body).cast("b"),
                memoryview(body + body)[::2], memoryview(body).cast("B", (2, len(body) // 2))):
        assert native.scan_produce_request(8, odd) is None
    released = memoryview(body)
    released.release()
    assert native.scan_produce_request(8, released) is None
    with pytest.raises(ValueError):
        scan_produce_request(8, released)  # the Python scan's error, as before
    assert native.scan_produce_request(8, "not a buffer") is None
    with pytest.raises(TypeError):
        native.scan_produce_request(8)


def test_hostile_counts_are_handed_back_before_anything_is_allocated() -> None:
    body = bytearray(encode_request(build(8, None, -1, [])))
    body[-4:] = (2**31 - 1).to_bytes(4, "big")  # topic count
    assert native.scan_produce_request(8, body) is None
    flexible_body = bytearray(encode_request(build(9, None, -1, [])))
    flexible_body[-2:] = b"\xff\xff\xff\xff\x07\x00"  # a 5-byte varint count
    assert native.scan_produce_request(9, flexible_body) is None
    with pytest.raises(CodecError):
        scan_produce_request(9, flexible_body)


def test_setup_needs_every_result_class() -> None:
    with pytest.raises(TypeError):
        native.setup(*([tuple] * 2), {}, b"", tuple, tuple)  # one missing
    with pytest.raises(TypeError):
        native.setup(tuple, tuple, {}, b"", tuple, tuple, int)  # not a tuple class
