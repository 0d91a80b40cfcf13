"""builtin:json-validate over the ABI: validity (checked against Python's json), required
fields, size limit, reject vs drop, tombstones."""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.filters.builtin.conftest import BUILTIN
from tests.filters.sdk.guest_abi import DROP, KEEP, REJECT, Guest, GuestError, Rec

Loader = Callable[..., Guest]


def one(g: Guest, value: bytes | None) -> tuple[int, str, dict[str, int]]:
    (d,), counts = g.run([Rec(value)])
    return d.kind, d.reason, counts


@pytest.mark.parametrize("value", [b'{"a": 1}', b"[]", b"0", b'"x"', b"null", b" true ",
                                   b'{"a": [1.5e-3, -0, {"b": "\\u00e9\\ud83d\\ude00"}]}'])
def test_valid_json_kept(load_builtin: Loader, value: bytes) -> None:
    assert one(load_builtin("json-validate"), value)[0] == KEEP


@pytest.mark.parametrize(("value", "why"), [
    (b"", "unexpected end of input at byte 0"),
    (b"{", "expected member name at byte 1"),
    (b'{"a": 1,}', "expected member name at byte 8"),
    (b"[1 2]", "expected ',' or ']' at byte 3"),
    (b"01", "trailing characters after JSON value at byte 1"),
    (b"NaN", "unexpected character at byte 0"),
    (b'"\xff"', "invalid UTF-8 at byte 1"),
    (b'"a\nb"', "control character in string at byte 2"),
    (b"{} {}", "trailing characters after JSON value at byte 3"),
])
def test_invalid_json_rejected_with_position(load_builtin: Loader, value: bytes, why: str) -> None:
    kind, reason, counts = one(load_builtin("json-validate"), value)
    assert kind == REJECT
    assert reason == f"json-validate: value is not valid JSON: {why}"
    assert counts == {"invalid_json": 1}


def test_required_fields(load_builtin: Loader) -> None:
    g = load_builtin("json-validate", {"required_fields": ["user_id", "ctx.region", "items.0.sku"]})
    ok = b'{"user_id": 1, "ctx": {"region": "eu"}, "items": [{"sku": "a"}]}'
    assert one(g, ok)[0] == KEEP
    kind, reason, counts = one(g, b'{"user_id": 1, "ctx": {}, "items": [{"sku": "a"}]}')
    assert (kind, reason) == (REJECT, "json-validate: required field 'ctx.region' is missing")
    assert counts == {"missing_field": 1}
    kind, reason, _ = one(g, b"[1, 2]")
    assert (kind, reason) == (REJECT, "json-validate: value is not a JSON object")
    assert one(g, b'{"user_id": null, "ctx": {"region": 1}, "items": [{"sku": 0}]}')[0] == KEEP


def test_max_bytes_and_drop_action(load_builtin: Loader) -> None:
    g = load_builtin("json-validate", {"max_bytes": 10, "action": "drop"})
    decisions, counts = g.run([Rec(b'{"a":1}'), Rec(b'{"a":"0123456789"}'), Rec(b"nope")])
    assert [d.kind for d in decisions] == [KEEP, DROP, DROP]
    assert counts == {"too_large": 1, "invalid_json": 1}
    g = load_builtin("json-validate", {"max_bytes": 10})
    kind, reason, _ = one(g, b'{"a":"0123456789"}')
    assert (kind, reason) == (REJECT, "json-validate: value is 18 bytes, max_bytes is 10")


def test_tombstones(load_builtin: Loader) -> None:
    assert one(load_builtin("json-validate"), None)[0] == KEEP
    kind, reason, counts = one(load_builtin("json-validate", {"allow_tombstones": False}), None)
    assert (kind, reason, counts) == (REJECT, "json-validate: value is null", {"tombstone": 1})


@pytest.mark.parametrize("config", [{"action": "warn"}, {"max_bytes": -5},
                                    {"required_fields": "user_id"}, {"typo": 1}])
def test_bad_config(load_builtin: Loader, config: dict[str, Any]) -> None:
    with pytest.raises(GuestError, match="json-validate"):
        load_builtin("json-validate", config)


@functools.cache
def _validator() -> Guest:
    return Guest(BUILTIN / "json-validate.wasm", {})


def _python_says_valid(raw: bytes) -> bool:
    def no_constants(name: str) -> None:
        raise ValueError(name)

    try:
        json.loads(raw.decode("utf-8"), parse_constant=no_constants)
    except ValueError:
        return False
    return True


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda children: st.lists(children, max_size=4)
    | st.dictionaries(st.text(max_size=5), children, max_size=4),
    max_leaves=12,
)


@settings(max_examples=150, deadline=None)
@given(value=json_values, cut=st.integers(min_value=0, max_value=40),
       junk=st.sampled_from([b"", b",", b"}", b"]", b'"', b"\\", b"\x00", b"\xc3", b"e", b" x"]))
def test_agrees_with_python_json(value: Any, cut: int, junk: bytes) -> None:
    raw = json.dumps(value, ensure_ascii=bool(cut % 2)).encode()
    for candidate in (raw, raw[:cut] + junk + raw[cut:]):
        got = one(_validator(), candidate)[0] == KEEP
        assert got == _python_says_valid(candidate), candidate
