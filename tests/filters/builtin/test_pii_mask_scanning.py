"""builtin:pii-mask's scanning shortcuts keep its output exact.

The filter classifies each string 16 bytes at a time to decide which detectors can match,
finds where JSON strings end the same way, copies nothing until the first replacement and
masks ASCII runs 16 bytes at a time. These tests aim at the edges of those shortcuts: matches
at every offset around a 16-byte step, the smallest match each detector accepts, escaped JSON
strings, long masks mixing ASCII and UTF-8, and JSON mode against text mode string by string.
"""

from __future__ import annotations

import json
from functools import cache
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.filters.builtin.conftest import BUILTIN
from tests.filters.sdk.guest_abi import KEEP, REWRITE, Guest, Rec


@cache
def guest(config_json: str = "{}") -> Guest:
    return Guest(BUILTIN / "pii-mask.wasm", json.loads(config_json))


def pii_mask(config: dict[str, Any] | None = None) -> Guest:
    return guest(json.dumps(config or {}, sort_keys=True))


def run(g: Guest, values: list[bytes]) -> tuple[list[bytes], dict[str, int]]:
    """Each value after masking (unchanged ones as given), and the batch's counts."""
    decisions, counts = g.run([Rec(v) for v in values])
    out = []
    for v, d in zip(values, decisions, strict=True):
        assert d.kind in (KEEP, REWRITE)
        out.append(v if d.kind == KEEP else d.value or b"")
    return out, counts


def masked(text: str, keep_last: int = 0, mask: str = "*", preserve_format: bool = True) -> str:
    """The documented masking of one whole match: every letter, digit and non-ASCII character
    (every character without preserve_format) becomes the mask, except the last keep_last of
    them, unless that would leave all of them visible."""
    maskable = [not preserve_format or not ch.isascii() or ch.isalnum() for ch in text]
    total = sum(maskable)
    keep = 0 if keep_last >= total else keep_last
    out, seen = [], 0
    for ch, m in zip(text, maskable, strict=True):
        if m:
            out.append(mask if seen < total - keep else ch)
            seen += 1
        else:
            out.append(ch)
    return "".join(out)


def test_matches_at_every_offset_around_the_16_byte_steps() -> None:
    g = pii_mask()
    cases = []
    for before in range(0, 36):
        for after in (0, 1, 7, 15, 16, 17):
            for pii, det in (("a@b.io", "email"), ("4111 1111 1111 1111", "card"),
                             ("10.0.0.254", "ipv4"), ("123-45-6789", "ssn")):
                text = "x" * before + (" " if before else "") + pii + (" " if after else "") + \
                    "y" * after
                cases.append((text, text.replace(pii, masked(pii)), det))
    texts = [t.encode() for t, _, _ in cases]
    docs = [json.dumps({"v": t}).encode() for t, _, _ in cases]
    out_text, counts_text = run(g, texts)
    out_json, counts_json = run(g, docs)
    for (_, want, _), got_text, got_json in zip(cases, out_text, out_json, strict=True):
        assert got_text == want.encode()
        assert got_json == json.dumps({"v": want}).encode()
    per_detector = {det: sum(1 for _, _, d in cases if d == det) for _, _, det in cases}
    assert counts_text == per_detector
    assert counts_json == per_detector


def test_the_smallest_match_of_each_detector_and_just_below_it() -> None:
    g = pii_mask()
    found = [
        ("4222222222222", "card"),  # 13 digits, the fewest a card has
        ("+49151123", "phone"),  # 8 digits after the country code
        ("415-555-0132", "phone"),
        ("123-45-6789", "ssn"),
        ("NO9386011117947", "iban"),  # 15 characters, the shortest IBAN
        ("1.2.3.4", "ipv4"),  # 7 bytes
        ("AKIAIOSFODNN7EXAMPLE", "aws_access_key"),  # exactly 20 characters
        ("a@b.io", "email"),
    ]
    want = {"card": 1, "phone": 2, "ssn": 1, "iban": 1, "ipv4": 1, "aws_access_key": 1,
            "email": 1}
    # as text, and as the last bytes of a JSON string (classified within a 16-byte step)
    out, counts = run(g, [f"id {v}".encode() for v, _ in found])
    assert out == [f"id {masked(v)}".encode() for v, _ in found]
    assert counts == want
    out, counts = run(g, [json.dumps({"v": f"id {v}"}).encode() for v, _ in found])
    assert out == [json.dumps({"v": f"id {masked(v)}"}).encode() for v, _ in found]
    assert counts == want
    near = ["id 422222222222", "id +4915112", "id 1.2.3", "id AKIAIOSFODNN7EXAMPL",
            "id NO938601111794", "id a@b"]
    for values in ([v.encode() for v in near], [json.dumps({"v": v}).encode() for v in near]):
        out, counts = run(g, values)
        assert out == values
        assert counts == {}


def test_escaped_json_strings_are_scanned_decoded_and_written_back_escaped() -> None:
    g = pii_mask()
    docs = [
        rb'{"e": "a\u0040b.io"}',  # the '@' only exists after decoding
        rb'{"e": "say \"hi\" to a@b.io\n", "n": 1}',  # kept quotes and newline re-escaped
        rb'{"e": "tab\there \u00e9 4111\u00201111 1111 1111"}',
        rb'{"e": "\u0000ctl a@b.io \u001f"}',
    ]
    out, counts = run(g, docs)
    assert out == [
        b'{"e": "*@*.**"}',
        rb'{"e": "say \"hi\" to *@*.**\n", "n": 1}',
        '{"e": "tab\\there \u00e9 **** **** **** ****"}'.encode(),
        rb'{"e": "\u0000ctl *@*.** \u001f"}',
    ]
    assert counts == {"email": 3, "card": 1}


def test_long_masks_mixing_ascii_and_utf8() -> None:
    long_values = [
        "abcdefghijklmnop" * 3,
        "x" * 15 + "\u00e9" + "y" * 20,  # a 2-byte character across the first 16-byte step
        "0123456789 abcdef-ghij.klmn/opqr_stuv \u2603 wxyz" * 2,
        "\U0001f600" + "z" * 40 + "\u00fc",
    ]
    rules: list[tuple[int, str, bool]] = [(0, "*", True), (0, "*", False), (4, "*", True),
                                          (0, "#", True), (2, "<>", True)]
    for keep_last, mask, preserve_format in rules:
        rule = {"keep_last": keep_last, "mask": mask, "preserve_format": preserve_format}
        g = pii_mask({"fields": ["v"], "detectors": {"field": rule}})
        docs = [json.dumps({"v": v}, ensure_ascii=False).encode() for v in long_values]
        out, counts = run(g, docs)
        want = [masked(v, keep_last, mask, preserve_format) for v in long_values]
        assert [json.loads(o)["v"] for o in out] == want, rule
        assert counts == {"field": len(long_values)}


def test_a_long_record_without_personal_data_is_kept() -> None:
    doc: dict[str, Any] = {f"field_{i}": ("lorem ipsum dolor " * i)[: i * 7] for i in range(40)}
    doc.update({"n": 12345, "f": 3.25, "t": True, "z": None, "list": ["a", "b", [1, 2]]})
    (d,), counts = pii_mask().run([Rec(json.dumps(doc, indent=2).encode())])
    assert d.kind == KEEP
    assert counts == {}


_PII = st.sampled_from([
    "a@b.io", "ann.lee+tag@mail.example.co.uk", "4111 1111 1111 1111", "378282246310005",
    "+1 415-555-0132", "(415) 555-0132", "020 7946 0958", "123-45-6789",
    "DE89 3704 0044 0532 0130 00", "GB82WEST12345698765432", "10.0.0.254",
    "AKIAIOSFODNN7EXAMPLE", "AWS_SECRET_ACCESS_KEY=abc/def+ghi", "Bearer abcdef0123456789abcdef",
    "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U",
])
_FILLER = st.text(alphabet=st.characters(codec="utf-8", exclude_categories=["Cs"]), max_size=24)
_VALUE = st.lists(st.one_of(_PII, _FILLER, st.sampled_from([" ", "-", ".", "\"", "\\", "\n"])),
                  max_size=6).map("".join)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(values=st.lists(_VALUE, min_size=1, max_size=8))
def test_json_mode_masks_each_string_as_text_mode_masks_it_alone(values: list[str]) -> None:
    # The JSON pass edits string literals only: the output is the input with each value that
    # text mode would change replaced by the JSON encoding of text mode's result.
    literals = [json.dumps(v, ensure_ascii=False) for v in values]
    doc = "{" + ", ".join(f'"k{i}": {lit}' for i, lit in enumerate(literals)) + "}"
    alone, counts_alone = run(pii_mask({"mode": "text"}), [v.encode() for v in values])
    want = "{" + ", ".join(
        f'"k{i}": {lit if a == v.encode() else json.dumps(a.decode(), ensure_ascii=False)}'
        for i, (v, lit, a) in enumerate(zip(values, literals, alone, strict=True))) + "}"
    (got,), counts = run(pii_mask(), [doc.encode()])
    assert got == want.encode()
    assert counts == counts_alone


def test_each_detector_from_every_offset_of_a_long_text_and_at_its_end() -> None:
    """Detectors skip 16-byte blocks holding no byte their match can start with (block scan):
    a match starting at any offset around a block step, or in the last bytes after the last
    whole block, is still found, in texts longer than 64 bytes (the detectors' long paths)."""
    g = pii_mask()
    jwt = "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0In0.c2lnbmF0dXJlX2hlcmU"
    values = [
        ("jo.doe@mail.example.org", "jo.doe@mail.example.org", "email"),
        ("4111 1111 1111 1111", "4111 1111 1111 1111", "card"),
        ("+49 151 2345 6789", "+49 151 2345 6789", "phone"),
        ("123-45-6789", "123-45-6789", "ssn"),
        ("DE89 3704 0044 0532 0130 00", "DE89 3704 0044 0532 0130 00", "iban"),
        ("10.20.30.40", "10.20.30.40", "ipv4"),
        ("AKIAIOSFODNN7EXAMPLE", "AKIAIOSFODNN7EXAMPLE", "aws_access_key"),
        ("aws_secret_access_key=wJalrXUtnFEMI/K7MDENG", "wJalrXUtnFEMI/K7MDENG",
         "aws_secret_key"),
        (jwt, jwt, "jwt"),
        ("Bearer abcdefghijklmnop123", "abcdefghijklmnop123", "bearer"),
    ]
    cases = []
    for text_value, secret, det in values:
        for before in range(0, 40):
            for tail in (0, 1, 15, 16, 17, 40):
                head = "lorem ipsum dolor sit amet " * 3 + "q" * before
                text = head + " " + text_value + (" " + "z" * tail if tail else "")
                cases.append((text, text.replace(secret, masked(secret)), det))
    out, counts = run(g, [t.encode() for t, _, _ in cases])
    assert [o.decode() for o in out] == [want for _, want, _ in cases]
    assert counts == {det: sum(1 for _, _, d in cases if d == det) for _, _, det in values}
