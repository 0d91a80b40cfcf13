"""The pass-through fast path's native readers (codec/passthrough.c, `sluice.codec._passthrough`)
give the Python readers' answers: request headers, a Produce request's acks and one topic
name, and whether a Produce or Fetch response may carry top-level tagged fields (KIP-951 node
endpoints), on generated frames and on frames cut or damaged byte by byte. Where the native
reader hands a frame back (None, or -1) the Python reader decides, errors included."""

from __future__ import annotations

import struct
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
from sluice.codec.produce_splice import produce_head, produce_topics
from tests.codec.test_codec_fetch_tagged import flexible
from tests.codec.test_codec_produce_splice import requests
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
