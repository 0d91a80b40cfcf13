"""FrameBuffer read into (`get_buffer`, `filled`: a buffered protocol's reads): the same frames
as `feed` whatever the reads, a large frame's body read into a buffer of its own, and the
reservation bound."""

from __future__ import annotations

import itertools
import struct
import tracemalloc
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from sluice.codec import frames as frames_module
from sluice.codec.frames import (
    CLIENT_RESERVE,
    OWN_BUFFER,
    READ_SIZE,
    RESERVE,
    FrameBuffer,
    FrameTooLarge,
    frame,
)


@pytest.fixture
def small(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Sizes small enough that short streams cross every branch: reads of 64 bytes, frames of
    16 bytes or more in buffers of their own, reserved 32 bytes at a time (so they grow)."""
    monkeypatch.setattr(frames_module, "READ_SIZE", 64)
    monkeypatch.setattr(frames_module, "OWN_BUFFER", 16)
    monkeypatch.setattr(frames_module, "RESERVE", 32)
    yield


def body(n: int, seed: int = 0) -> bytes:
    return bytes((i * 7 + seed) % 251 for i in range(n))


def read(fb: FrameBuffer, data: bytes) -> list[bytes]:
    """`data` as a socket gives it to a buffered protocol: as many reads as the buffers take."""
    out: list[bytes] = []
    view = memoryview(data)
    while view:
        buf = fb.get_buffer()
        assert len(buf) > 0
        n = min(len(buf), len(view))
        buf[:n] = view[:n]
        del buf  # as an event loop lets go of it after the read: the buffer may grow in place
        view = view[n:]
        out.extend(bytes(f) for f in fb.filled(n))
    return out


def test_real_sizes_are_ordered() -> None:
    # Reads of READ_SIZE keep any frame below OWN_BUFFER (prefix included) whole in them.
    assert OWN_BUFFER + 4 < READ_SIZE < RESERVE


def test_a_large_frame_is_read_into_its_own_buffer() -> None:
    fb = FrameBuffer()
    payload = body(1_000_000)
    data = frame(payload) + frame(b"next")
    first = fb.get_buffer()
    assert len(first) == READ_SIZE
    first[:] = data[:READ_SIZE]
    assert fb.filled(READ_SIZE) == []
    assert fb.missing == 1_000_000 + 4 - READ_SIZE
    rest = fb.get_buffer()
    # The rest of the frame, no more: the read stops at the frame's end.
    assert len(rest) == fb.missing
    rest[:] = data[READ_SIZE : 1_000_004]
    (out,) = fb.filled(len(rest))
    assert bytes(out) == payload
    assert fb.missing == 0 and fb.pending == 0
    assert read(fb, data[1_000_004:]) == [b"next"]


def test_a_frame_over_the_reserve_grows_as_it_arrives(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(frames_module, "RESERVE", 1 << 20)
    fb = FrameBuffer()
    size = (1 << 20) + 3 * READ_SIZE
    head = frame(b"\0" * size)[:4]
    buf = fb.get_buffer()
    buf[:4] = head
    fb.filled(4)
    assert fb.missing == size
    # What is reserved at once is bounded, whatever the prefix declares.
    assert len(fb.get_buffer()) == 1 << 20
    payload = body(size, 3)
    assert read(fb, payload) == [payload]


def test_a_client_frame_reserves_its_own_bound_and_grows_past_it() -> None:
    # A client's requests (proxy/net/connection.py): at most CLIENT_RESERVE at once.
    fb = FrameBuffer(reserve=CLIENT_RESERVE)
    size = CLIENT_RESERVE + 2 * READ_SIZE + 7
    buf = fb.get_buffer()
    buf[:4] = struct.pack(">i", size)
    fb.filled(4)
    assert fb.missing == size
    assert len(fb.get_buffer()) == CLIENT_RESERVE
    payload = body(size, 9)
    assert read(fb, payload + frame(b"after")) == [payload, b"after"]


def test_a_buffer_still_viewed_grows_by_a_copy(small: None) -> None:
    fb = FrameBuffer()
    payload = body(100, 5)
    data = frame(payload)
    kept = []
    got: list[bytes] = []
    at = 0
    while at < len(data):
        buf = fb.get_buffer()
        kept.append(buf)  # a view the caller did not let go of: no resize in place
        n = min(len(buf), len(data) - at)
        buf[:n] = data[at : at + n]
        at += n
        got.extend(bytes(f) for f in fb.filled(n))
    assert got == [payload]


def test_a_declared_size_reserves_no_more_than_the_bound() -> None:
    fb = FrameBuffer(max_frame_size=RESERVE + (1 << 20))
    tracemalloc.start()
    try:
        read(fb, struct.pack(">i", RESERVE + (1 << 20)) + b"x" * 40_000)
        held, _peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert held < RESERVE + 2 * READ_SIZE
    assert fb.pending == 40_004


def test_connections_that_read_small_frames_hold_no_read_buffer() -> None:
    # Found in review: each broker connection kept a `READ_SIZE` read buffer (zeroed) for its
    # life once it had read anything: 2.5 GB for 10 000 idle connections, where the event
    # loop's own reads held nothing per connection. Now one per thread.
    tracemalloc.start()
    try:
        before, _ = tracemalloc.get_traced_memory()
        connections = [FrameBuffer() for _ in range(100)]
        frames = [read(fb, frame(body(20, seed))) for seed, fb in enumerate(connections)]
        held, _peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert frames == [[body(20, seed)] for seed in range(100)]
    assert held - before < READ_SIZE + 100 * 2_000  # at most the thread's one read buffer
    assert all(fb.pending == 0 for fb in connections)
    assert len(connections[0].get_buffer()) == READ_SIZE  # the next read gets one again


def test_a_read_of_whole_large_frames_is_handed_over_not_copied() -> None:
    # A client's read holding whole frames, the first large (a workload-2 Produce request):
    # its frames are read-only views of the buffer the socket read into, and the next read,
    # of this or any connection of the thread, goes into another buffer (the frames handed
    # out keep their bytes).
    fb, other = FrameBuffer(hand_over=True), FrameBuffer()
    big, small_one = body(OWN_BUFFER, 1), body(10, 2)
    buf = fb.get_buffer()
    data = frame(big) + frame(small_one)
    buf[: len(data)] = data
    array = buf.obj
    del buf
    got = fb.filled(len(data))
    assert [bytes(f) for f in got] == [big, small_one]
    assert all(f.readonly and f.obj is array for f in got)
    assert read(other, frame(body(OWN_BUFFER, 3))) == [body(OWN_BUFFER, 3)]
    assert fb.get_buffer().obj is not array
    assert [bytes(f) for f in got] == [big, small_one]


def test_reads_of_small_frames_or_without_hand_over_are_copied() -> None:
    # Only a large first frame hands the buffer over (a read of small frames would hold 256 KB
    # for a few bytes), and only where asked (a response is held until sent).
    for fb, size in ((FrameBuffer(hand_over=True), OWN_BUFFER - 1), (FrameBuffer(), OWN_BUFFER)):
        buf = fb.get_buffer()
        data = frame(body(size))
        buf[: len(data)] = data
        array = buf.obj
        del buf
        got = fb.filled(len(data))
        assert [bytes(f) for f in got] == [body(size)]
        assert got[0].obj is not array
        assert fb.get_buffer().obj is array  # the thread's buffer, read into again


def test_connections_reading_in_turn_through_the_shared_buffer_keep_their_own_bytes(
    small: None,
) -> None:
    # Each read of one connection, then one of another (as an event loop serves them), every
    # frame cut across reads: what one read left in assembly was copied out of the buffer.
    streams = [b"".join(frame(body(n, seed)) for n in (3, 15, 40, 7, 100, 1)) for seed in (1, 2, 3)]
    connections = [FrameBuffer() for _ in streams]
    got: list[list[bytes]] = [[] for _ in streams]
    at = [0] * len(streams)
    step = 0
    while any(a < len(s) for a, s in zip(at, streams, strict=True)):
        for i, (fb, stream) in enumerate(zip(connections, streams, strict=True)):
            if at[i] < len(stream):
                buf = fb.get_buffer()
                n = min(len(buf), 1 + (step + 5 * i) % 23, len(stream) - at[i])
                buf[:n] = stream[at[i] : at[i] + n]
                buf[n:] = b"\xee" * (len(buf) - n)  # whatever the next read leaves there
                del buf
                at[i] += n
                got[i].extend(bytes(f) for f in fb.filled(n))
        step += 1
    assert got == [[body(n, seed) for n in (3, 15, 40, 7, 100, 1)] for seed in (1, 2, 3)]


def test_an_oversize_prefix_is_refused_and_reads_go_on_into_a_buffer() -> None:
    fb = FrameBuffer(max_frame_size=1024)
    buf = fb.get_buffer()
    buf[:4] = struct.pack(">i", 2048)
    with pytest.raises(FrameTooLarge):
        fb.filled(4)
    assert len(fb.get_buffer()) > 0  # an event loop may still read before the close


def test_feed_finishes_a_frame_being_read_into(small: None) -> None:
    fb = FrameBuffer()
    data = frame(body(100)) + frame(b"tail")
    buf = fb.get_buffer()
    buf[:40] = data[:40]
    assert fb.filled(40) == []
    assert [bytes(f) for f in fb.feed(data[40:])] == [body(100), b"tail"]
    assert fb.pending == 0


def test_every_split_point_gives_the_same_frames(small: None) -> None:
    bodies = [b"", body(3), body(40, 1), body(15, 2), body(100, 3), body(17, 4), b"z"]
    stream = b"".join(frame(b) for b in bodies)
    for cut in range(len(stream) + 1):
        fb = FrameBuffer()
        got = read(fb, stream[:cut]) + read(fb, stream[cut:])
        assert got == bodies, cut
        assert fb.pending == 0 and fb.missing == 0


def test_every_pair_of_split_points_gives_the_same_frames(small: None) -> None:
    bodies = [body(5), body(70, 1), body(2, 2), body(33, 3)]
    stream = b"".join(frame(b) for b in bodies)
    for a, b in itertools.combinations(range(len(stream) + 1), 2):
        fb = FrameBuffer()
        got = read(fb, stream[:a]) + read(fb, stream[a:b]) + read(fb, stream[b:])
        assert got == bodies, (a, b)


@settings(max_examples=300, deadline=None)
@given(
    sizes=st.lists(st.integers(min_value=0, max_value=300), max_size=12),
    reads=st.lists(st.integers(min_value=1, max_value=400), max_size=60),
    feeds=st.lists(st.booleans(), max_size=60),
    hand_over=st.booleans(),
)
def test_any_reads_and_feeds_give_feeds_frames_and_missing(
    sizes: list[int], reads: list[int], feeds: list[bool], hand_over: bool
) -> None:
    """Against `feed` alone, the reference: the same frames and the same `missing` after each
    step, whether a step is a read into `get_buffer` (at most what it offers) or a chunk fed,
    the reads handed over or copied (frames compared at the end: handed over, they must
    keep their bytes while later reads go on)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(frames_module, "READ_SIZE", 64)
        patch.setattr(frames_module, "OWN_BUFFER", 16)
        patch.setattr(frames_module, "RESERVE", 32)
        bodies = [body(n, k) for k, n in enumerate(sizes)]
        stream = memoryview(b"".join(frame(b) for b in bodies))
        fb, ref = FrameBuffer(hand_over=hand_over), FrameBuffer()
        got: list[Any] = []
        step = 0
        while stream:
            want = reads[step % len(reads)] if reads else len(stream)
            fed = feeds[step % len(feeds)] if feeds else False
            step += 1
            if fed:
                n = min(want, len(stream))
                out = fb.feed(stream[:n])
            else:
                buf = fb.get_buffer()
                n = min(want, len(buf), len(stream))
                buf[:n] = stream[:n]
                out = fb.filled(n)
            got.extend(out)
            ref.feed(stream[:n])
            stream = stream[n:]
            assert fb.missing == ref.missing
            assert fb.pending == ref.pending
        assert [bytes(f) for f in got] == bodies


class Reads(RuleBasedStateMachine):
    """A stream of frames arriving in reads of any size: whatever the order of the reads, the
    frames come out whole, in order, and the buffer offered is never empty."""

    def __init__(self) -> None:
        super().__init__()
        self.patch = pytest.MonkeyPatch()
        self.patch.setattr(frames_module, "READ_SIZE", 64)
        self.patch.setattr(frames_module, "OWN_BUFFER", 16)
        self.patch.setattr(frames_module, "RESERVE", 32)
        self.fb = FrameBuffer(max_frame_size=500)
        self.sent: list[bytes] = []
        self.got: list[bytes] = []
        self.unread = bytearray()

    def teardown(self) -> None:
        self.patch.undo()

    @rule(size=st.integers(min_value=0, max_value=500), seed=st.integers(0, 250))
    def peer_sends(self, size: int, seed: int) -> None:
        self.sent.append(body(size, seed))
        self.unread += frame(self.sent[-1])

    @precondition(lambda self: bool(self.unread))
    @rule(want=st.integers(min_value=1, max_value=600))
    def socket_reads(self, want: int) -> None:
        buf = self.fb.get_buffer()
        n = min(want, len(buf), len(self.unread))
        buf[:n] = self.unread[:n]
        del self.unread[:n]
        self.got.extend(bytes(f) for f in self.fb.filled(n))

    @invariant()
    def frames_whole_and_in_order(self) -> None:
        assert self.got == self.sent[: len(self.got)]
        assert len(self.fb.get_buffer()) > 0
        if not self.unread:
            assert self.got == self.sent
            assert self.fb.pending == 0


TestReads = Reads.TestCase
TestReads.settings = settings(max_examples=100, stateful_step_count=40, deadline=None)
