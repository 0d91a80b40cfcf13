"""The native record check (codec/record_check.c behind `check_batch` / `check_section`) gives
aiokafka's reader's verdict (the Python reference, `check_batch_python` /
`check_section_python`) on well-formed sections and on sections damaged byte by byte: same
acceptance, same error class."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sluice.codec import records as rec
from sluice.codec.errors import CodecError
from sluice.codec.records import (
    HEADER_SIZE,
    BatchHeader,
    Record,
    build_batch_from_section,
    check_batch,
    check_batch_python,
    check_section,
    check_section_python,
)

blobs = st.one_of(st.none(), st.binary(max_size=40))
header_keys = st.text(max_size=8)
records = st.lists(
    st.builds(
        Record,
        offset_delta=st.integers(-(2**40), 2**40),
        timestamp_delta=st.integers(-(2**62), 2**62),
        key=blobs,
        value=blobs,
        headers=st.lists(st.tuples(header_keys, blobs), max_size=3),
        attributes=st.integers(0, 255) | st.just(0),
    ),
    max_size=6,
)

# Byte strings that stress the reader's corners: long and overlong varints, negative
# lengths, invalid UTF-8 (lone continuation, surrogate, overlong, above U+10FFFF).
nasty = st.sampled_from([
    b"\xff" * 9 + b"\x01", b"\xff" * 10, b"\x80" * 10 + b"\x00", b"\x01", b"\x03", b"\x00",
    b"\xfe\xff\xff\xff\xff\xff\xff\xff\xff\x01", b"\x80", b"\xed\xa0\x80", b"\xc0\xaf",
    b"\xf4\x90\x80\x80", b"\xe0\x80\x80", b"\xf0\x8f\xbf\xbf", b"\xc2", b"\xef\xbf\xbf",
    b"\xf4\x8f\xbf\xbf", b"\xe2\x82\xac",
])


@st.composite
def mutated(draw: st.DrawFn, plain: bytes) -> bytes:
    data = bytearray(plain)
    for _ in range(draw(st.integers(0, 3))):
        kind = draw(st.sampled_from(["flip", "set", "insert", "delete", "cut", "splice"]))
        at = draw(st.integers(0, len(data))) if data else 0
        if kind == "flip" and at < len(data):
            data[at] ^= 1 << draw(st.integers(0, 7))
        elif kind == "set" and at < len(data):
            data[at] = draw(st.integers(0, 255))
        elif kind == "insert":
            data[at:at] = draw(st.binary(min_size=1, max_size=3))
        elif kind == "delete" and at < len(data):
            del data[at : at + draw(st.integers(1, 3))]
        elif kind == "cut":
            del data[at:]
        elif kind == "splice":
            data[at : at + draw(st.integers(0, 3))] = draw(nasty)
    return bytes(data)


def outcome(check: object, *args: object) -> str:
    try:
        check(*args)  # type: ignore[operator]
    except Exception as exc:
        return type(exc).__name__
    return "ok"


def section_of(recs: list[Record]) -> bytes:
    # The pure-Python encoder writes any attributes byte and header key as given.
    return rec._encode_records_python(recs)


def a_batch(plain: bytes, count: int) -> bytes:
    header = BatchHeader(5, 0, -1, 2, 0, 0, max(count - 1, 0), 0, 0, -1, -1, -1, count)
    data = bytearray(build_batch_from_section(header, plain, max(count, 1)))
    data[HEADER_SIZE - 4 : HEADER_SIZE] = count.to_bytes(4, "big", signed=True)
    return bytes(data)


def test_native_check_is_built() -> None:
    # The set-up builds it; without it the hot path falls back to aiokafka's reader.
    assert rec.NATIVE_CHECK


@settings(max_examples=1500, deadline=None)
@given(recs=records, data=st.data())
def test_native_section_check_matches_reference(recs: list[Record], data: st.DataObject) -> None:
    plain = section_of(recs)
    count = len(recs)
    # aiokafka reads a record's attributes as a varint, so a byte >= 0x80 (no Kafka client
    # writes one) shifts the rest of the record: the native check reads it the same way.
    assert outcome(check_section, plain, count) == outcome(check_section_python, plain, count)
    if all(r.attributes < 0x80 for r in recs):
        assert outcome(check_section, plain, count) == "ok"
    bad = data.draw(mutated(plain))
    declared = data.draw(st.sampled_from([count, count - 1, count + 1, 0, -1, 2**31 - 1]))
    assert outcome(check_section, bad, declared) == outcome(check_section_python, bad, declared)


@settings(max_examples=1500, deadline=None)
@given(recs=records, data=st.data())
def test_native_batch_check_matches_reference(recs: list[Record], data: st.DataObject) -> None:
    count = len([r for r in recs if r.attributes < 0x80])
    good = a_batch(section_of([r for r in recs if r.attributes < 0x80]), count)
    assert outcome(check_batch, good) == "ok"
    assert outcome(check_batch, memoryview(good)) == "ok"
    bad = good[:HEADER_SIZE] + data.draw(mutated(good[HEADER_SIZE:]))
    if data.draw(st.booleans()):
        declared = data.draw(st.integers(-3, count + 3))
        bad = bad[: HEADER_SIZE - 4] + declared.to_bytes(4, "big", signed=True) + bad[HEADER_SIZE:]
    if data.draw(st.booleans()):  # a view into a larger buffer, as batches of a request are
        bad_view: bytes | memoryview = memoryview(bad + b"\x81\x81\x81")[: len(bad)]
    else:
        bad_view = bad
    assert outcome(check_batch, bad_view) == outcome(check_batch_python, bad_view)


@settings(max_examples=500, deadline=None)
@given(noise=st.binary(max_size=80), count=st.integers(-2, 5))
def test_native_check_matches_reference_on_noise(noise: bytes, count: int) -> None:
    assert outcome(check_section, noise, count) == outcome(check_section_python, noise, count)
    batch = a_batch(b"", 0)[: HEADER_SIZE - 4] + count.to_bytes(4, "big", signed=True) + noise
    assert outcome(check_batch, batch) == outcome(check_batch_python, batch)


def test_native_rejections_carry_the_reference_message() -> None:
    # A client sees the same error text whichever path refused its batch.
    bad_key = section_of([Record(0, 0, None, b"v", [("k", None)])]).replace(b"k", b"\xff")
    messages = []
    for check in (check_section, check_section_python):
        try:
            check(bad_key, 1)
        except Exception as exc:
            messages.append(str(exc))
    assert len(messages) == 2 and messages[0] == messages[1]
    assert "utf-8" in messages[0]


# Varints of every length, each side of its boundaries, and blobs whose lengths take one,
# two or three bytes: the check's one- and two-byte varint paths against the reference.
_edges = st.sampled_from([0, 1, 63, 64, 65, 127, 128, 8191, 8192, 8193, 2**20, 2**27, 2**34,
                          2**41, 2**48, 2**55, 2**62, 2**63 - 1]).flatmap(
    lambda v: st.sampled_from([v, -v - 1]))
large_records = st.lists(
    st.builds(
        Record,
        offset_delta=_edges,
        timestamp_delta=_edges,
        key=st.one_of(st.none(), st.binary(max_size=70)),
        value=st.one_of(st.none(), st.binary(min_size=60, max_size=9000)),
        headers=st.lists(st.tuples(header_keys, st.one_of(st.none(), st.binary(max_size=200))),
                         max_size=2),
    ),
    min_size=1,
    max_size=3,
)


@settings(max_examples=600, deadline=None)
@given(recs=large_records, data=st.data())
def test_native_check_matches_reference_across_varint_lengths(recs: list[Record],
                                                              data: st.DataObject) -> None:
    plain = section_of(recs)
    count = len(recs)
    assert outcome(check_section, plain, count) == "ok"
    # Cut anywhere (inside a varint too), or damaged as above.
    cut = plain[: data.draw(st.integers(0, len(plain)))]
    assert outcome(check_section, cut, count) == outcome(check_section_python, cut, count)
    bad = data.draw(mutated(plain))
    assert outcome(check_section, bad, count) == outcome(check_section_python, bad, count)


@pytest.mark.parametrize("check", [check_batch, check_batch_python])
@pytest.mark.parametrize("fault", ["corrupt", "headers"])
def test_a_refused_batch_view_is_not_left_exported_by_the_error(check: Any, fault: str) -> None:
    """aiokafka's reader holds an export of the batch it reads; a batch refused by it (here a
    view of one, as a request's batches are) is given back before the error leaves: the
    error's traceback keeps the reading frame, and a memoryview still exported from a kept
    frame, in a reference cycle, crashes CPython 3.11's collector (gh-77894)."""
    recs = [Record(0, 0, None, b"v", [("k", None)]), Record(1, 0, None, b"w", [("k", b"x")])]
    good = a_batch(section_of(recs), 2)
    data = good.replace(b"k", b"\xff") if fault == "corrupt" else good
    view = memoryview(bytearray(data))
    with pytest.raises(CodecError) as caught:
        check(view, 1)  # max_headers 1: the headers fault's two are one too many
    assert caught.value.__traceback__ is not None
    view.release()  # BufferError while the kept frame still exports it
