"""builtin:pii-mask on the ways card numbers (and other PII) are written besides plain ASCII.

Card numbers grouped with underscores (``4111_1111_1111_1111``) and written with full-width
digits (U+FF10-U+FF19, as East Asian input methods type them, with ASCII or full-width spaces
and dashes) are found, Luhn-checked and bounded as the ASCII forms are. A full-width character
is masked as one character: its three UTF-8 bytes become one mask, so the output stays valid
UTF-8 (and JSON stays JSON) with as many characters as the input. The property tests state
that: any string, with any of its characters turned into their full-width forms, is masked
exactly where its ASCII reading is.
"""

from __future__ import annotations

import itertools
import json
import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.filters.builtin.pii_corpus import card as corpus_card
from tests.filters.builtin.test_pii_mask_scanning import pii_mask, run

IDEOGRAPHIC_SPACE = "\u3000"
KANA = "\u30ab\u30fc\u30c9\u756a\u53f7"  # "card number" in Japanese
TEL = "\u96fb\u8a71"  # "telephone"


def wide(text: str, spaces: str = " ") -> str:
    """`text` with its ASCII characters in their full-width forms (spaces become `spaces`).
    (Tests spell full-width text this way: the literals would be hard to tell from ASCII.)"""
    return "".join(spaces if ch == " " else chr(ord(ch) + 0xFEE0) if "!" <= ch <= "~" else ch
                   for ch in text)


W = wide


def M(masked: str, spaces: str = " ") -> str:
    """A masked full-width text: the punctuation full-width, the masks ASCII "*"."""
    return wide(masked, spaces).replace(wide("*"), "*")


def mask_text(text: str, config: dict[str, object] | None = None) -> tuple[str, dict[str, int]]:
    out, counts = run(pii_mask(config), [text.encode()])
    return out[0].decode("utf-8"), counts


@pytest.mark.parametrize(
    ("text", "want"),
    [
        ("pay 4111_1111_1111_1111 now", "pay ****_****_****_**** now"),
        ("amex 3782_822463_10005.", "amex ****_******_*****."),
        (f"pay {W('4111 1111 1111 1111')} now", "pay **** **** **** **** now"),
        (f"pay {W('4111-1111-1111-1111')} now", f"pay {M('****-****-****-****')} now"),
        (f"pay {W('4111 1111 1111 1111', IDEOGRAPHIC_SPACE)} now",
         f"pay {M('**** **** **** ****', IDEOGRAPHIC_SPACE)} now"),
        (f"pay {W('4111_1111_1111_1111')} now", f"pay {M('****_****_****_****')} now"),
        (f"{KANA}{W('4111111111111111')}.", f"{KANA}****************."),
        # ASCII spaces between full-width groups, and digits of both widths in one number
        (f"pay 4111 {W('1111')} 1111 {W('1111')}", "pay **** **** **** ****"),
    ],
)
def test_underscore_and_full_width_card_numbers_are_masked(text: str, want: str) -> None:
    out, counts = mask_text(text)
    assert out == want
    assert counts == {"card": 1}
    assert len(out) == len(text)  # one mask per character, whatever its width


@pytest.mark.parametrize(
    "text",
    [
        "order 4111_1111_1111_1112",  # Luhn fails
        f"order {W('4111 1111 1111 1112')}",
        "short 4111_1111_1111",  # 12 digits
        f"short {W('411111111111')}",
        "long 4111_1111_1111_1111_1111",  # 20 digits, one token
        f"long {W('41111111111111111111')}",
        "inside 1234_4111_1111_1111_1111",  # a valid number inside a longer one
        f"inside {W('12344111111111111111')}",
        "glued id_4111_1111_1111_1111 and 4111_1111_1111_1111_x",
        f"glued {W('a4111111111111111')} and {W('4111111111111111b')}",
        "mixed 4111_1111-1111 1111",  # one separator throughout
        # dates and ids joined like card groups, their digits passing Luhn: cards are printed
        # in groups of 3 to 6 digits
        "run 2024_01_15_1000003 done",
        "run 2024-01-15-1000003 done",
        "run 2024_01_15_12_100004",
        f"run {W('2024-01-15-1000003')}",
        f"decimal {W('4111111111111111.5')}",
        f"first digit {W('9111 1111 1111 1113')}",
    ],
)
def test_near_misses_stay(text: str) -> None:
    out, counts = mask_text(text)
    assert (out, counts) == (text, {})


def test_keep_last_keeps_full_width_digits_and_json_stays_valid() -> None:
    number = W("4111 1111 1111 1111")
    out, _ = mask_text(f"pay {number}", {"detectors": {"card": {"keep_last": 4}}})
    assert out == f"pay **** **** **** {W('1111')}"
    for ensure_ascii in (True, False):  # raw UTF-8 and \\uFF14 escapes
        doc = json.dumps({"card": number, "n": 1}, ensure_ascii=ensure_ascii)
        out, counts = mask_text(doc)
        assert json.loads(out) == {"card": "**** **** **** ****", "n": 1}
        assert counts == {"card": 1}


def test_other_detectors_read_full_width_forms() -> None:
    cases = [
        ("mail {} ok", "john@example.com", "****@*******.***", "email"),
        ("call {}", "+44 20 7946 0958", "+** ** **** ****", "phone"),
        (TEL + "{}.", "03-1234-5678", "**-****-****", "phone"),
        ("ssn {}", "123-45-6789", "***-**-****", "ssn"),
        ("from {} ok", "10.0.0.254", "**.*.*.***", "ipv4"),
    ]
    for frame, text, want, detector in cases:
        # the punctuation stays full-width, each letter or digit is one mask
        expected = frame.format(M(want))
        assert mask_text(frame.format(W(text))) == (expected, {detector: 1}), text


def test_corpus_cards_with_underscores_and_full_width_digits() -> None:
    rng = random.Random(7)
    for _ in range(200):
        number = corpus_card(rng).replace(" ", "").replace("-", "")
        # as cards are printed: 4-4-4-4(-3), Amex 4-6-5, 13 digits 4-3-3-3
        sizes = {13: (4, 3, 3, 3), 15: (4, 6, 5)}.get(len(number), (4,) * 5)
        cuts = [sum(sizes[:k]) for k in range(len(sizes) + 1)]
        grouped = "_".join(number[a:b] for a, b in itertools.pairwise(cuts) if number[a:b])
        for text in (grouped, wide(number), wide(grouped), wide(grouped, IDEOGRAPHIC_SPACE)):
            out, counts = mask_text(f"card: {text}.")
            assert counts == {"card": 1}, text
            assert out == "card: " + "".join("*" if ch.isdigit() else ch for ch in text) + "."


# Fragments that make detectors fire or nearly fire, and filler around them.
_FRAGMENTS = st.sampled_from([
    "4111 1111 1111 1111", "4111-1111-1111-1111", "4111_1111_1111_1111", "4111111111111111",
    "4111_1111_1111_1112", "5500 0000 0000 0004", "378282246310005", "a@b.io",
    "ann.lee+tag@mail.example.co.uk", "user@localhost", "+44 20 7946 0958", "(415) 555-0132",
    "020 7946 0958", "123-45-6789", "666-12-3456", "10.0.0.254", "1.2.3", "AKIAIOSFODNN7EXAMPLE",
    "GB82WEST12345698765432", "AWS_SECRET_ACCESS_KEY=abc/def", "Bearer abcdef0123456789",
    "2024-01-15T10:00:00", "v2.10.4.1",
])
_FILLER = st.text(alphabet="0123456789 -_.,:/+@()=abcXYZ", max_size=12)
_TEXTS = st.lists(st.one_of(_FRAGMENTS, _FILLER), min_size=1, max_size=6).map(" ".join)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(text=_TEXTS, picks=st.lists(st.booleans(), min_size=200, max_size=200),
       ideographic=st.booleans(), as_json=st.booleans())
def test_full_width_forms_are_masked_where_their_ascii_reading_is(
        text: str, picks: list[bool], ideographic: bool, as_json: bool) -> None:
    # Turn some characters (chosen by `picks`) into their full-width forms: the matches are
    # the ASCII string's, position for position, and the counts the same.
    spaces = IDEOGRAPHIC_SPACE if ideographic else " "
    mixed = "".join(wide(ch, spaces) if picks[i % len(picks)] else ch
                    for i, ch in enumerate(text))

    def masked(value: str) -> tuple[str, dict[str, int]]:
        if not as_json:
            return mask_text(value)
        out, counts = mask_text(json.dumps({"v": value}, ensure_ascii=False))
        return json.loads(out)["v"], counts

    ascii_out, ascii_counts = masked(text)
    mixed_out, mixed_counts = masked(mixed)
    assert mixed_counts == ascii_counts
    assert len(ascii_out) == len(text) == len(mixed_out)
    assert mixed_out == "".join("*" if a == "*" and t != "*" else m
                                for a, t, m in zip(ascii_out, text, mixed, strict=True))


_PIECES = st.sampled_from([b"\xef\xbc\x94", b"\xef\xbc\x91", b"\xef\xbc\x8d", b"\xef\xbc\xbf",
                           b"\xef\xbd\x81", b"\xe3\x80\x80", b"\xef\xbc", b"\xef", b"\xe3\x80",
                           b"\xe3\x81\x82", b"4", b"1", b" ", b"-", b"_", b"@", b".", b"a",
                           b"\xff", b'"', b"{", b"}"])


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(pieces=st.lists(_PIECES, max_size=60))
def test_any_bytes_around_full_width_forms_mask_without_failing(pieces: list[bytes]) -> None:
    # Truncated and malformed sequences next to full-width forms: the filter never fails, and
    # valid UTF-8 stays valid UTF-8 (one mask per whole character, never half of one).
    value = b"".join(pieces)
    out, _ = run(pii_mask(), [value])
    try:
        value.decode("utf-8")
    except UnicodeDecodeError:
        return
    out[0].decode("utf-8")
