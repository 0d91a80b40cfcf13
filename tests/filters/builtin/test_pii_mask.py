"""builtin:pii-mask over the ABI: each detector, masking styles, JSON mode, keys and headers."""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest

from sluice.filters.config import FilterSpec
from sluice.filters.context import FilterRecord, RecordContext
from sluice.filters.decisions import Action
from sluice.filters.runtime import load_filter
from tests.filters.sdk.guest_abi import KEEP, REWRITE, Guest, GuestError, Rec

Loader = Callable[..., Guest]


def mask_one(guest: Guest, text: str) -> tuple[str, dict[str, int]]:
    (d,), counts = guest.run([Rec(text.encode())])
    if d.kind == KEEP:
        return text, counts
    assert d.kind == REWRITE
    assert d.value is not None
    return d.value.decode(), counts


def test_seed_example_secret_and_email(load_builtin: Loader) -> None:
    g = load_builtin("pii-mask")
    text = "AWS_SECRET_ACCESS_KEY=myawssecretkeyvalue \nMy email is example@email.com"
    out, counts = mask_one(g, text)
    assert out == "AWS_SECRET_ACCESS_KEY=******************* \nMy email is *******@*****.***"
    assert counts == {"aws_secret_key": 1, "email": 1}


@pytest.mark.parametrize(
    ("text", "detector"),
    [
        ("pay with 4111 1111 1111 1111 today", "card"),
        ("pay with 4111-1111-1111-1111 today", "card"),
        ("amex 378282246310005.", "card"),
        ("call +1 415-555-0132 now", "phone"),
        ("call (415) 555-0132 now", "phone"),
        ("call 415.555.0132 now", "phone"),
        ("ring +44 (0) 20 7946 0958", "phone"),
        ("ring 020 7946 0958", "phone"),
        ("mobil +4915112345678", "phone"),
        ("ssn 123-45-6789 on file", "ssn"),
        ("iban DE89 3704 0044 0532 0130 00 thanks", "iban"),
        ("iban GB82WEST12345698765432", "iban"),
        ("from 10.0.0.254 port 22", "ipv4"),
        ("key AKIAIOSFODNN7EXAMPLE set", "aws_access_key"),
        ("aws_secret_access_key: wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY", "aws_secret_key"),
        ("Authorization: Bearer abcdef0123456789abcdef", "bearer"),
        ("tok eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0."
         "dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U", "jwt"),
        ("mail ann.lee+tag@mail.example.co.uk ok", "email"),
    ],
)
def test_detectors_find(load_builtin: Loader, text: str, detector: str) -> None:
    out, counts = mask_one(load_builtin("pii-mask"), text)
    assert counts == {detector: 1}
    assert out != text
    assert len(out.split()) == len(text.split())  # surrounding words untouched


@pytest.mark.parametrize(
    "text",
    [
        "order 4111 1111 1111 1112 (bad Luhn)",
        "iban DE89 3704 0044 0532 0130 01 (bad checksum)",
        "release 1.2.3 and v2.10.4.1",
        "at 2024-01-15T10:00:00+01:00 epoch 1700000000000",
        "sha256 9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08",
        "ssn-like 000-12-3456 and 666-12-3456",
        "ip-like 256.1.1.1 and 1.2.3",
        "user@localhost is not an address",
        "the bearer of bad news",
        "uuid 123e4567-e89b-12d3-a456-426614174000",
    ],
)
def test_near_misses_untouched(load_builtin: Loader, text: str) -> None:
    out, counts = mask_one(load_builtin("pii-mask"), text)
    assert out == text
    assert counts == {}


def test_keep_last_and_replacement_and_mask_char(load_builtin: Loader) -> None:
    g = load_builtin("pii-mask", {"mask": "#", "detectors": {"card": {"keep_last": 4},
                                                            "email": {"replacement": "[email]"}}})
    out, _ = mask_one(g, "card 4111 1111 1111 1111 mail a@b.io")
    assert out == "card #### #### #### 1111 mail [email]"


def test_preserve_format_off_masks_every_character(load_builtin: Loader) -> None:
    g = load_builtin("pii-mask", {"preserve_format": False})
    out, _ = mask_one(g, "ssn 123-45-6789")
    assert out == "ssn ***********"


def test_detector_switched_off(load_builtin: Loader) -> None:
    g = load_builtin("pii-mask", {"detectors": {"ipv4": False}})
    out, counts = mask_one(g, "host 10.1.2.3 mail a@b.io")
    assert out == "host 10.1.2.3 mail *@*.**"
    assert counts == {"email": 1}


def test_detector_list_enables_only_those(load_builtin: Loader) -> None:
    g = load_builtin("pii-mask", {"detectors": ["ssn"]})
    out, _ = mask_one(g, "123-45-6789 a@b.io")
    assert out == "***-**-**** a@b.io"


def test_json_mode_paths_detectors_and_validity(load_builtin: Loader) -> None:
    g = load_builtin("pii-mask", {"fields": ["user.name", "cards[*].cvv", "tags[1]"]})
    doc = {
        "user": {"name": "Ann\u00e9 \"Lee\"", "email": "ann@x.io", "age": 31},
        "cards": [{"number": 4111111111111111, "cvv": 123},
                  {"number": "5500 0000 0000 0004", "cvv": "999"}],
        "tags": ["a", "b@c.de", "c"],
        "note": "line\nmail bob@y.org",
    }
    raw = json.dumps(doc, ensure_ascii=True)
    out, counts = mask_one(g, raw)
    got = json.loads(out)
    assert got["user"] == {"name": "**** \"***\"", "email": "***@*.**", "age": 31}
    assert got["cards"][0] == {"number": "****************", "cvv": "***"}
    assert got["cards"][1] == {"number": "**** **** **** ****", "cvv": "***"}
    assert got["tags"] == ["a", "*@*.**", "c"]
    assert got["note"] == "line\nmail ***@*.***"
    assert counts["field"] == 4
    assert counts["card"] == 2
    assert counts["email"] == 2  # user.email and note; tags[1] was masked by path


def test_json_whole_subtree_by_path(load_builtin: Loader) -> None:
    g = load_builtin("pii-mask", {"fields": ["address"]})
    out, _ = mask_one(g, '{"address": {"street": "Main St 1", "zip": 12345, "geo": null}, "id": 7}')
    assert json.loads(out) == {"address": {"street": "**** ** *", "zip": "*****", "geo": None},
                               "id": 7}


def test_json_secret_member_names(load_builtin: Loader) -> None:
    g = load_builtin("pii-mask")
    out, counts = mask_one(g, '{"AWS_SECRET_ACCESS_KEY": "abc/def+ghi", "ok": true}')
    assert json.loads(out) == {"AWS_SECRET_ACCESS_KEY": "***/***+***", "ok": True}
    assert counts == {"aws_secret_key": 1}


def test_json_unchanged_is_kept_byte_for_byte(load_builtin: Loader) -> None:
    g = load_builtin("pii-mask")
    (d,), counts = g.run([Rec(b'{ "a" : [1, 2.5e3, "x\\u00e9"], "b": null }')])
    assert d.kind == KEEP
    assert counts == {}


def test_invalid_json_falls_back_to_text(load_builtin: Loader) -> None:
    out, counts = mask_one(load_builtin("pii-mask"), '{"broken": "a@b.io"')
    assert out == '{"broken": "*@*.**"'
    assert counts == {"email": 1}


def test_text_mode_ignores_json_structure(load_builtin: Loader) -> None:
    g = load_builtin("pii-mask", {"mode": "text", "fields": ["name"]})
    out, counts = mask_one(g, '{"name": "Ann", "mail": "a@b.io"}')
    assert out == '{"name": "Ann", "mail": "*@*.**"}'
    assert counts == {"email": 1}


def test_keys_and_headers(load_builtin: Loader) -> None:
    g = load_builtin("pii-mask", {"keys": True, "headers": ["x-user"]})
    (d,), _ = g.run([Rec(b"v", key=b"a@b.io", headers=[("x-user", b"c@d.io"), ("other", b"e@f.io"),
                                                         ("x-user", None)])])
    assert d.kind == REWRITE
    assert d.key == b"*@*.**"
    assert d.value == b"v"
    assert d.headers == [("x-user", b"*@*.**"), ("other", b"e@f.io"), ("x-user", None)]


def test_keys_and_header_values_masked_by_default(load_builtin: Loader) -> None:
    # "Stored records are masked": the key and every header value, not only the value.
    (d,), counts = load_builtin("pii-mask").run([
        Rec(b"v", key=b"a@b.io", headers=[("x-user", b"c@d.io"), ("trace", b"t-1"),
                                          ("x-card", b"4111 1111 1111 1111"), ("e", None)])])
    assert d.kind == REWRITE
    assert d.key == b"*@*.**"
    assert d.value == b"v"
    assert d.headers == [("x-user", b"*@*.**"), ("trace", b"t-1"),
                         ("x-card", b"**** **** **** ****"), ("e", None)]
    assert counts == {"email": 2, "card": 1}


@pytest.mark.parametrize(
    ("config", "key", "header"),
    [
        ({"keys": False}, b"a@b.io", b"*@*.**"),
        ({"headers": False}, b"*@*.**", b"c@d.io"),
        ({"keys": False, "headers": False}, b"a@b.io", b"c@d.io"),
        ({"headers": ["other"]}, b"*@*.**", b"c@d.io"),
        ({"keys": True, "headers": True}, b"*@*.**", b"*@*.**"),
    ],
)
def test_keys_and_headers_switched_off_explicitly(load_builtin: Loader, config: dict[str, object],
                                                  key: bytes, header: bytes) -> None:
    (d,), _ = load_builtin("pii-mask", config).run(
        [Rec(b"mail e@f.io", key=b"a@b.io", headers=[("x-user", b"c@d.io")])])
    assert (d.key, d.value, d.headers) == (key, b"mail *@*.**", [("x-user", header)])


@pytest.mark.parametrize(
    ("config", "words"),
    [
        ({"keys": "yes"}, "config.keys: must be true or false"),
        ({"keys": None}, "config.keys: must be true or false"),
        ({"keys": 0}, "config.keys: must be true or false"),
        ({"headers": "all"}, "config.headers: must be true, false or a list"),
        ({"headers": ["x-user", 7]}, "config.headers: must be true, false or a list"),
    ],
)
def test_keys_and_headers_settings_are_checked(load_builtin: Loader, config: dict[str, object],
                                               words: str) -> None:
    # Before, a value that was not a boolean was silently read as "off" (keys: "yes" left keys
    # in clear).
    with pytest.raises(GuestError, match=words):
        load_builtin("pii-mask", config)


def test_null_and_empty_values_kept(load_builtin: Loader) -> None:
    decisions, counts = load_builtin("pii-mask").run([Rec(None), Rec(b"")])
    assert [d.kind for d in decisions] == [KEEP, KEEP]
    assert counts == {}


def test_counts_accumulate_over_the_batch_and_reset(load_builtin: Loader) -> None:
    g = load_builtin("pii-mask")
    _, counts = g.run([Rec(b"a@b.io"), Rec(b"c@d.io x@y.io"), Rec(b"nothing")])
    assert counts == {"email": 3}
    _, counts = g.run([Rec(b"nothing")])
    assert counts == {}


@pytest.mark.parametrize(
    "config",
    [
        {"mode": "yaml"},
        {"detectors": {"emial": True}},
        {"keep_last": -1},
        {"fields": ["a..b"]},
        {"fields": ["a[x]"]},
        {"unknown_option": 1},
        {"mask": ""},
    ],
)
def test_bad_config_is_refused_with_a_message(load_builtin: Loader,
                                              config: dict[str, object]) -> None:
    with pytest.raises(GuestError, match="pii-mask"):
        load_builtin("pii-mask", config)


def test_large_batch_and_unicode(load_builtin: Loader) -> None:
    g = load_builtin("pii-mask")
    recs = [Rec(f"Grüße {i} \u2013 mail user{i}@example.com ☃".encode()) for i in range(500)]
    decisions, counts = g.run(recs)
    assert counts == {"email": 500}
    assert decisions[7].value == "Grüße 7 \u2013 mail *****@*******.*** ☃".encode()


def test_memory_exhaustion_fails_closed() -> None:
    # Under a tight memory cap the filter must fail (the on_error policy then rejects), never
    # pass a record it could not finish masking.
    f = load_filter(FilterSpec(name="pii", module="builtin:pii-mask", max_memory_mb=2))
    ctx = RecordContext(topic="t", partition=0, direction="produce")
    big = b"a@b.io " * 60_000
    result = f.run_batch(ctx, [FilterRecord(0, 0, None, big), FilterRecord(1, 0, None, b"x")])
    assert result.failure is not None
    assert [d.action for d in result.decisions] == [Action.REJECT, Action.REJECT]
    small = f.run_batch(ctx, [FilterRecord(0, 0, None, b"mail a@b.io")])
    assert small.failure is None and small.decisions[0].value == b"mail *@*.**"
