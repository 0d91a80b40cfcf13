"""builtin:pii-mask's cheap pre-checks skip only detectors that cannot match.

Before running a detector on a string the filter rules it out by what the match needs: phone
and ssn a run of exactly three digits (a phone may instead start with '+' or a trunk '0'), an
IPv4 address three dots, a JSON number eight digits or more (only card, phone and ssn can match
one); card, phone and ssn all need one run of digits and separators holding 13, 8 and 9 digits
(hex ids, hashes and UUIDs have many digits in short runs). Short strings (up to 64 bytes)
look for e-mail addresses with bit masks of their bytes, longer ones byte by byte. The JSON
walk without field paths is a loop over an explicit stack. These tests give each pre-check
inputs on both sides of its condition, with the expected output written from the documented
masking.
"""

from __future__ import annotations

import json

from tests.filters.builtin.test_pii_mask_scanning import masked, pii_mask, run


def test_phone_and_ssn_next_to_card_numbers_and_other_long_digit_runs() -> None:
    g = pii_mask()
    card = "4111 1111 1111 1111"
    cases = [
        (f"card {card}", f"card {masked(card)}", {"card": 1}),
        (f"{card} or 123-45-6789", f"{masked(card)} or {masked('123-45-6789')}",
         {"card": 1, "ssn": 1}),
        (f"{card} call 415-555-0132", f"{masked(card)} call {masked('415-555-0132')}",
         {"card": 1, "phone": 1}),
        (f"{card} call +44 20 7946 0958", f"{masked(card)} call {masked('+44 20 7946 0958')}",
         {"card": 1, "phone": 1}),
        (f"{card} call 020 7946 0958", f"{masked(card)} call {masked('020 7946 0958')}",
         {"card": 1, "phone": 1}),
        # digits enough for phone and ssn, but only runs of four: neither can match
        ("ids 1234 5678 9123", "ids 1234 5678 9123", {}),
        ("order 12345678901 ref 4444-5555", "order 12345678901 ref 4444-5555", {}),
    ]
    for text, want, counts in cases:
        for value, expected in ((text, want), (json.dumps({"v": text}), json.dumps({"v": want}))):
            out, got = run(g, [value.encode()])
            assert out == [expected.encode()], value
            assert got == counts, value


def test_phone_runs_only_where_one_of_its_ways_to_a_match_is_open() -> None:
    """The phone detector is skipped on a string without '+', '(', a 0 starting a run of
    digits, a run of exactly three digits or a phone label (card numbers printed in groups of
    four): each way is kept open, including a label that is only the member's name."""
    g = pii_mask()
    grouped = "1234 5678 9012"  # 12 digits in groups of four, a 0 inside a group
    cases = [
        (json.dumps({"phone": grouped}), json.dumps({"phone": masked(grouped)}), {"phone": 1}),
        (json.dumps({"mobile_no": "4101 2345 6789"}),
         json.dumps({"mobile_no": masked("4101 2345 6789")}), {"phone": 1}),
        # the member name changes between records: the remembered name is not reused
        (json.dumps({"card": grouped}), json.dumps({"card": grouped}), {}),
        (f"phone {grouped}", f"phone {masked(grouped)}", {"phone": 1}),
        (f"ref {grouped}", f"ref {grouped}", {}),
        (json.dumps({"v": "(11) 9612 3745"}), json.dumps({"v": masked("(11) 9612 3745")}),
         {"phone": 1}),
        (json.dumps({"tel": "123456789012 - 99999"}),
         json.dumps({"tel": masked("123456789012") + " - 99999"}), {"phone": 1}),
        (json.dumps({"v": "123456789012 - 99990"}), json.dumps({"v": "123456789012 - 99990"}),
         {}),
        # a card number with zeros inside its groups, at the end of the record
        (json.dumps({"card": "5500 0000 0000 0004"}),
         json.dumps({"card": masked("5500 0000 0000 0004")}), {"card": 1}),
        # a 0 after a digit and a separator ends a longer number: no trunk prefix, no phone;
        # after a NANP country code ("1 ", "1-", "1.") it is one
        (json.dumps({"v": "4111 1111 1111 0123"}), json.dumps({"v": "4111 1111 1111 0123"}), {}),
        (json.dumps({"v": "1 0201 7946 0958"}), json.dumps({"v": masked("1 0201 7946 0958")}),
         {"phone": 1}),
        (json.dumps({"v": "x 1.0201 7946 0958"}),
         json.dumps({"v": "x " + masked("1.0201 7946 0958")}), {"phone": 1}),
        (json.dumps({"v": "# 0201 7946 0958"}),
         json.dumps({"v": "# " + masked("0201 7946 0958")}), {"phone": 1}),
    ]
    for value, expected, counts in cases:
        out, got = run(g, [value.encode()])
        assert out == [expected.encode()], value
        assert got == counts, value


def test_card_phone_and_ssn_need_one_run_with_enough_digits() -> None:
    g = pii_mask()
    trace = "4bf92f3577b34da6a3ce929d0e0e4736"  # 18 digits, none in a run of more than 4
    uuid = "123e4567-e89b-12d3-a456-426614174000"
    card, phone, ssn = "4111_1111_1111_1111", "+44 (0) 20 7946 0958", "123-45-6789"
    cases = [
        (trace, trace, {}),
        (uuid, uuid, {}),
        # the same strings with a match inside or next to them: found on both sides of 64 bytes
        (f"{trace} {card}", f"{trace} {masked(card)}", {"card": 1}),
        (f"{trace}{trace} {phone}", f"{trace}{trace} {masked(phone)}", {"phone": 1}),
        (f"{uuid} ssn {ssn}", f"{uuid} ssn {masked(ssn)}", {"ssn": 1}),
        (f"{ssn} {uuid}{trace}", f"{masked(ssn)} {uuid}{trace}", {"ssn": 1}),
        # 12 and 7 digits in the longest run: no card, no phone
        ("ref 4111 1111 1111 x 1", "ref 4111 1111 1111 x 1", {}),
        ("tel +44 20 794", "tel +44 20 794", {}),
    ]
    for text, want, counts in cases:
        for value, expected in ((text, want), (json.dumps({"v": text}), json.dumps({"v": want}))):
            out, got = run(g, [value.encode()])
            assert out == [expected.encode()], value
            assert got == counts, value


def test_ipv4_needs_three_dots() -> None:
    g = pii_mask()
    out, counts = run(g, [b'{"a": "host 10.0.0.1", "b": "user1234@example.com", "c": "v1234.5.6"}'])
    want = json.dumps({"a": f"host {masked('10.0.0.1')}", "b": masked("user1234@example.com"),
                       "c": "v1234.5.6"})
    assert out == [want.encode()]
    assert counts == {"ipv4": 1, "email": 1}


def test_json_numbers_with_few_digits_are_kept_and_card_numbers_masked() -> None:
    g = pii_mask()
    value = b'{"a": 1234.56, "b": -1.5e+10, "c": 4111111111111111, "d": 1234567}'
    out, counts = run(g, [value])
    # a masked number becomes a string of the same length
    assert out == [b'{"a": 1234.56, "b": -1.5e+10, "c": "' + b"*" * 16 + b'", "d": 1234567}']
    assert counts == {"card": 1}


def test_emails_in_short_and_long_strings_are_found_alike() -> None:
    g = pii_mask()
    emails = ["a@b.io", "user.name+tag@example.co.uk", "x-y_z%1@sub-domain.example.org"]
    tricky = [
        ("..a@b.io", "..*@*.**"),  # leading dots are not part of the local part
        ("a@b.io@c.de", "*@*.**@c.de"),  # the second '@' is inside the first match
        ("a@-b.io x@y.z9 p@q.r", "a@-b.io x@y.z9 p@q.r"),  # no valid domain
        ("a@b.c.io.", "*@*.*.**."),
        ("me@host.d-e.com", "**@****.*-*.***"),
    ]
    for pad in (0, 1, 15, 16, 40, 60, 80):
        for e in emails:
            text = "x" * pad + " " + e + " end"
            want = "x" * pad + " " + masked(e) + " end"
            for value, expected in ((text, want), (json.dumps([text]), json.dumps([want]))):
                out, counts = run(g, [value.encode()])
                assert out == [expected.encode()], value
                assert counts == {"email": 1}
        for text, want in tricky:
            text, want = "y" * pad + " " + text, "y" * pad + " " + want
            out, _ = run(g, [json.dumps({"t": text}).encode()])
            assert out == [json.dumps({"t": want}).encode()], text


def test_the_json_walk_keeps_its_grammar() -> None:
    g = pii_mask()
    email = "a@b.io"
    nested = "[" * 64 + json.dumps(email) + "]" * 64
    too_deep = "[" * 65 + json.dumps(email) + "]" * 65
    out, counts = run(g, [nested.encode()])
    assert out == [nested.replace(email, masked(email)).encode()]
    assert counts == {"email": 1}
    # not JSON (too deep, trailing comma, missing colon, bad literal): masked as text, in
    # which the quotes around the address are kept
    for text in (too_deep, '{"e": "a@b.io",}', '{"e" "a@b.io"}', '{"e": "a@b.io", "t": tru}'):
        out, counts = run(g, [text.encode()])
        assert out == [text.replace(email, masked(email)).encode()], text
        assert counts == {"email": 1}
    # whitespace of every kind between tokens, and secret keys found by the walk
    text = '{ "AWS_SECRET_ACCESS_KEY" :\t"abc" ,\r\n"x":[ "a@b.io" ,{ } ,[ ] ]\n}'
    out, counts = run(g, [text.encode()])
    assert out == [text.replace('"abc"', '"***"').replace(email, masked(email)).encode()]
    assert counts == {"aws_secret_key": 1, "email": 1}
