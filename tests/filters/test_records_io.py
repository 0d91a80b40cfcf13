"""The Sluice ABI v1 byte layout: input encoding byte for byte, output decoding and its errors."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sluice.filters.context import FilterRecord, RecordContext
from sluice.filters.decisions import DROP, KEEP, Action, Decision, reject, rewrite
from sluice.filters.records_io import (
    MAX_DETECTOR_NAME_BYTES,
    MAX_DETECTORS,
    AbiError,
    decode_filter_output,
    encode_filter_input,
    encode_filter_output,
)


def test_input_layout_byte_for_byte() -> None:
    ctx = RecordContext("tp", 7, "fetch", "cid", None)
    records = [FilterRecord(2, 5, None, b"vv", [("hk", b"x"), ("n", None)])]
    got = encode_filter_input(ctx, records, offset_base=100, timestamp_base=1000)
    want = b"".join([
        struct.pack("<IB", 1, 1),
        struct.pack("<I", 2), b"tp",
        struct.pack("<i", 7),
        struct.pack("<I", 3), b"cid",
        struct.pack("<I", 0),                  # no principal -> empty string
        struct.pack("<I", 1),
        struct.pack("<qq", 102, 1005),
        struct.pack("<i", -1),                 # null key
        struct.pack("<i", 2), b"vv",
        struct.pack("<I", 2),
        struct.pack("<I", 2), b"hk", struct.pack("<i", 1), b"x",
        struct.pack("<I", 1), b"n", struct.pack("<i", -1),
    ])
    assert got == want


def test_produce_direction_byte() -> None:
    data = encode_filter_input(RecordContext("t", 0, "produce"), [])
    assert data[4] == 0 and data[-4:] == b"\0\0\0\0"


def test_output_decodes_every_decision_kind() -> None:
    decisions = [KEEP, rewrite(None, b"new", [("a", None), ("b", b"")]), DROP,
                 reject("too big"), rewrite(b"", None, [])]
    raw = encode_filter_output(decisions, {"email": 2, "card": 1})
    got, detectors = decode_filter_output(raw, len(decisions))
    assert got == decisions
    assert detectors == {"email": 2, "card": 1}


def test_detector_section_may_be_omitted_and_names_are_summed() -> None:
    raw = struct.pack("<I", 1) + b"\0"
    assert decode_filter_output(raw, 1) == ([KEEP], {})
    raw += struct.pack("<I", 2) + (struct.pack("<I", 1) + b"x" + struct.pack("<I", 3)) * 2
    assert decode_filter_output(raw, 1)[1] == {"x": 6}


def test_empty_reject_reason_gets_a_default_and_long_ones_are_cut() -> None:
    raw = encode_filter_output([reject(""), reject("r" * 2000)])
    (a, b), _ = decode_filter_output(raw, 2)
    assert a.reason == "rejected by filter"
    assert b.reason is not None and len(b.reason) == 503


@pytest.mark.parametrize(("raw", "expected", "message"), [
    (b"", 0, "truncated reading record_count"),
    (struct.pack("<I", 2) + b"\0\0", 3, "2 decisions for 3 records"),
    (struct.pack("<I", 1) + b"\x07", 1, "unknown decision 7"),
    (struct.pack("<I", 1) + b"\x01" + struct.pack("<i", -2), 1, "negative length -2"),
    (struct.pack("<I", 1) + b"\x01" + struct.pack("<i", 10) + b"abc", 1, "truncated"),
    (struct.pack("<I", 1) + b"\x01" + struct.pack("<ii", -1, -1) + struct.pack("<I", 10**9), 1,
     "header count 1000000000"),
    (struct.pack("<I", 1) + b"\x03" + struct.pack("<I", 2) + b"\xff\xfe", 1, "not valid UTF-8"),
    (struct.pack("<I", 1) + b"\x00" + struct.pack("<I", 0) + b"zz", 1, "2 unexpected bytes"),
    (struct.pack("<I", 0) + struct.pack("<I", 5), 0, "detector count 5 exceeds"),
])
def test_malformed_outputs_raise_abi_error(raw: bytes, expected: int, message: str) -> None:
    with pytest.raises(AbiError, match=message):
        decode_filter_output(raw, expected)


@settings(max_examples=400, deadline=None)
@given(st.binary(max_size=200), st.integers(min_value=0, max_value=5))
def test_random_bytes_never_crash_the_decoder(raw: bytes, expected: int) -> None:
    try:
        decisions, detectors = decode_filter_output(raw, expected)
    except AbiError:
        return
    assert len(decisions) == expected
    assert all(isinstance(k, str) and v >= 0 for k, v in detectors.items())


_bytes_or_none = st.one_of(st.none(), st.binary(max_size=20))
_headers = st.lists(st.tuples(st.text(max_size=5), _bytes_or_none), max_size=3)
_decision = st.one_of(
    st.just(KEEP), st.just(DROP),
    st.builds(rewrite, _bytes_or_none, _bytes_or_none, _headers),
    st.builds(reject, st.text(min_size=1, max_size=30)),
)


@pytest.mark.parametrize("detectors, error", [
    ({f"d{i}": 1 for i in range(MAX_DETECTORS)}, None),
    ({f"d{i}": 1 for i in range(MAX_DETECTORS + 1)}, "detector count 257 is over the limit"),
    ({"é" * (MAX_DETECTOR_NAME_BYTES // 2): 1}, None),
    ({"é" * (MAX_DETECTOR_NAME_BYTES // 2) + "x": 1}, "name is over the limit of 256 bytes"),
])
def test_detector_entries_and_names_are_bounded(detectors: dict[str, int],
                                                error: str | None) -> None:
    raw = encode_filter_output([KEEP], detectors)
    if error is None:
        assert decode_filter_output(raw, 1)[1] == detectors
    else:
        with pytest.raises(AbiError, match=error):
            decode_filter_output(raw, 1)


@settings(max_examples=200, deadline=None)
@given(st.lists(_decision, max_size=10),
       st.dictionaries(st.text(max_size=8), st.integers(0, 2**32 - 1), max_size=4))
def test_encode_decode_round_trip(decisions: list[Decision], detectors: dict[str, int]) -> None:
    raw = encode_filter_output(decisions, detectors)
    got, got_detectors = decode_filter_output(raw, len(decisions))
    assert got == decisions
    assert got_detectors == detectors


@settings(max_examples=200, deadline=None)
@given(st.lists(_decision, min_size=1, max_size=5), st.data())
def test_corrupting_a_valid_output_never_crashes(decisions: list[Decision],
                                                 data: st.DataObject) -> None:
    raw = bytearray(encode_filter_output(decisions, {"d": 1}))
    pos = data.draw(st.integers(0, len(raw) - 1))
    raw[pos] = data.draw(st.integers(0, 255))
    cut = data.draw(st.integers(0, len(raw)))
    try:
        got, _ = decode_filter_output(bytes(raw[:cut]), len(decisions))
    except AbiError:
        return
    assert len(got) == len(decisions)
    assert all(d.action in Action for d in got)
