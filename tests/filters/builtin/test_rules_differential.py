"""builtin:rules against the module it replaced: the same decisions, values and counters.

`data/rules-tree-reference.wasm` is filters/builtin/rules.wasm as committed at bdb17db, before
the module parsed only what its rules touch (every value parsed into a full tree by the SDK's
parser and written back from it). The shipped module must answer every batch exactly as that
one does, for generated rules and generated values: valid JSON with any
spacing, escapes, nesting, duplicate members and arrays, and broken JSON; on the decoding path
(`sluice_filter`) and on the native path the proxy takes (`sluice_filter_records`: the whole
records section it writes back, byte for byte), with hashed fields long enough to span SHA-256
blocks and salts of one and more whole blocks. Counters must also come in the same order (the
module sums them per batch and reports them in the order each was first counted).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from sluice.codec.records import BatchHeader, Record, build_batch
from sluice.filters.config import FilterSpec
from sluice.filters.context import FilterRecord, RecordContext
from sluice.filters.runtime import LoadedFilter, load_filter

REFERENCE = Path(__file__).resolve().parent / "data" / "rules-tree-reference.wasm"
CTX = RecordContext(topic="events", partition=0, direction="produce", client_id="t")
NAMES = ["a", "b", "c", "\u00e9", "q\"", "x"]
PATHS = ["a", "b", "c", "a.b", "a.c", "b.a", "a.b.c", "\u00e9", "x"]

scalar = st.one_of(st.none(), st.booleans(), st.integers(-1000, 1000),
                   st.floats(allow_nan=False, allow_infinity=False, width=32),
                   st.sampled_from(["", "a", "debug", "internal", "h\u00e9llo w\u00f6rld",
                                    "q\"b\\n\n\t\x01\x1f\u2028 \U0001f600", "a.b", "x" * 70,
                                    "y" * 47, "z" * 55, "w" * 56, "\u00e9" * 40]))
json_value = st.recursive(
    scalar,
    lambda inner: st.one_of(st.lists(inner, max_size=4),
                            st.lists(st.tuples(st.sampled_from(NAMES), inner), max_size=5)),
    max_leaves=12)


def _dump(value: Any, spacing: tuple[str, str], ascii_only: bool) -> str:
    """JSON text with duplicate members kept (a list of pairs is an object)."""
    item_sep, key_sep = spacing
    if isinstance(value, list) and value and all(isinstance(v, tuple) for v in value):
        return "{" + item_sep.join(json.dumps(k, ensure_ascii=ascii_only) + key_sep +
                                   _dump(v, spacing, ascii_only) for k, v in value) + "}"
    if isinstance(value, list):
        return "[" + item_sep.join(_dump(v, spacing, ascii_only) for v in value) + "]"
    return json.dumps(value, ensure_ascii=ascii_only)


@st.composite
def record_values(draw: st.DrawFn) -> bytes | None:
    members = draw(st.lists(st.tuples(st.sampled_from(NAMES), json_value), max_size=6))
    spacing = draw(st.sampled_from([(",", ":"), (", ", ": "), (" ,\n", " :\t")]))
    text = _dump(members, spacing, draw(st.booleans())) if members else "{}"
    text = draw(st.sampled_from(["", " ", "\n"])) + text + draw(st.sampled_from(["", " "]))
    data = text.encode()
    kind = draw(st.integers(0, 9))
    if kind == 0:  # broken JSON: a byte cut off, or an invalid byte
        cut = draw(st.integers(0, max(len(data) - 1, 0)))
        data = data[:cut] + draw(st.sampled_from([b"", b"\xff", b"\\", b"\x01", b"]"])) + \
            data[cut + 1:]
    elif kind == 1:
        return draw(st.one_of(st.none(), st.binary(max_size=12),
                              st.sampled_from([b"[1]", b"\"a\"", b"1", b"null", b"[" * 70])))
    return data


@st.composite
def rule(draw: st.DrawFn) -> dict[str, Any]:
    action = draw(st.sampled_from(["set", "remove", "rename", "hash", "truncate", "drop"]))
    field = draw(st.sampled_from(PATHS))
    r: dict[str, Any] = {"field": field, "action": action}
    if action == "set":
        r["value"] = draw(st.one_of(scalar, st.dictionaries(st.sampled_from(NAMES), scalar,
                                                             max_size=2)))
    elif action == "rename":
        parent = field.rsplit(".", 1)[0] + "." if "." in field else ""
        r["to"] = parent + draw(st.sampled_from(NAMES))
    elif action == "hash" and draw(st.booleans()):
        r["salt"] = draw(st.sampled_from(["", "s3cret", "p" * 63, "q" * 64, "r" * 130]))
    elif action == "truncate":
        r["length"] = draw(st.integers(0, 8))
    if draw(st.integers(0, 2)) == 0:
        test = draw(st.sampled_from(["exists", "equals", "prefix", "contains"]))
        when: dict[str, Any] = {
            "exists": draw(st.booleans()), "equals": draw(scalar),
            "prefix": draw(st.sampled_from(["", "h", "int", "q\""])),
            "contains": draw(st.sampled_from(["", "l", "tern", "\u00e9"]))}
        r["when"] = {test: when[test]}
        if draw(st.booleans()):
            r["when"]["field"] = draw(st.sampled_from(PATHS))
    return r


def _answer(f: LoadedFilter, values: list[bytes | None]) -> tuple[Any, ...]:
    res = f.run_batch(CTX, [FilterRecord(i, 0, b"k", v, []) for i, v in enumerate(values)])
    return ([(d.action, d.value, d.reason) for d in res.decisions],
            list(res.detector_counts.items()))  # in the order the module reported them


def _native_answer(f: LoadedFilter, values: list[bytes | None]) -> tuple[Any, ...]:
    n = len(values)
    raw = build_batch(BatchHeader(0, 0, -1, 2, 0, 0, n - 1, 1_700_000_000_000,
                                  1_700_000_000_000, -1, -1, -1, n),
                      [Record(i, 0, b"k", v, [("h", b"v")]) for i, v in enumerate(values)])
    out = f.run_native(CTX, raw[61:], n)
    assert out is not None
    # The new section may be a view into the buffer the batch is built in: compare bytes.
    records = None if out.records is None else bytes(out.records)
    return out.fates, records, out.rejects, list(out.detector_counts.items())


@pytest.mark.skipif(not REFERENCE.is_file(), reason="reference module missing")
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(rules=st.lists(rule(), min_size=1, max_size=5),
       values=st.lists(record_values(), min_size=1, max_size=8))
def test_rules_answer_as_the_full_tree_module_did(rules: list[dict[str, Any]],
                                                  values: list[bytes | None]) -> None:
    config = {"rules": rules}
    new = load_filter(FilterSpec(name="rules", module="builtin:rules", config=config))
    old = load_filter(FilterSpec(name="old", module=str(REFERENCE), config=config))
    try:
        assert _answer(new, values) == _answer(old, values)
        assert _native_answer(new, values) == _native_answer(old, values)
    finally:
        new.close()
        old.close()


@pytest.mark.skipif(not REFERENCE.is_file(), reason="reference module missing")
@pytest.mark.parametrize("rules", [
    [{"field": "a", "action": "hash", "salt": "s"}, {"field": "a.b", "action": "truncate",
                                                     "length": 1}],
    [{"field": "a.b", "action": "remove", "when": {"field": "a.c", "equals": 7}},
     {"field": "c", "action": "set", "value": {"x": [1]}}],
    [{"field": "a", "action": "rename", "to": "b"}, {"field": "b.c", "action": "hash"}],
])
def test_values_with_more_nodes_than_the_pool_answer_as_the_full_tree_module_did(
        rules: list[dict[str, Any]]) -> None:
    """The module keeps a record's nodes in a pool of 1024 and takes more from the arena: values
    of ~3,000 built members (duplicates, nested objects) on both sides of that boundary."""
    inner = ", ".join(f'"b": "v{i}", "c": {i % 9}' for i in range(700))
    outer = ", ".join(f'"a": {{"b": "w{i}", "c": 7}}' for i in range(600))
    values: list[bytes | None] = [
        ("{" + outer + ', "a": {' + inner + "}}").encode(),
        ('{"a": {' + inner + '}, "c": 1}').encode(),
        ("{" + outer + "}").encode(),
        b'{"a": {"b": "short", "c": 7}}',  # after the big ones: the pool starts over
    ]
    config = {"rules": rules}
    new = load_filter(FilterSpec(name="rules", module="builtin:rules", config=config))
    old = load_filter(FilterSpec(name="old", module=str(REFERENCE), config=config))
    try:
        assert _answer(new, values) == _answer(old, values)
        assert _native_answer(new, values) == _native_answer(old, values)
    finally:
        new.close()
        old.close()


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(rules=st.lists(rule(), min_size=1, max_size=5),
       calls=st.lists(st.tuples(st.booleans(), st.lists(record_values(), min_size=1,
                                                        max_size=6)), min_size=2, max_size=4))
# A call that leaves hashes to the host (host_sha256), then one that queues its own.
@example(rules=[{"field": "a", "action": "hash", "salt": "s"}],
         calls=[(True, [b'{"a": "x@y.z"}', b'{"a": "q"}']), (True, [b'{"a": "r"}']),
                (False, [b'{"a": "s"}'])])
# A call that ends on a value it parsed and kept (its buffer the next record's), then values
# that are rewritten.
@example(rules=[{"field": "b", "action": "remove"}],
         calls=[(native, values) for native in (True, False) for values in (
             [b'{"b": 1}', b'{"a": "b"}'],
             [b'{"b": 2, "c": "keep me"}', b'{"b": 3, "d": "' + b"z" * 200 + b'"}'])])
def test_a_used_instance_answers_each_call_as_a_new_one(
        rules: list[dict[str, Any]], calls: list[tuple[bool, list[bytes | None]]]) -> None:
    """builtin:rules is stateless (filters/config.py STATELESS_BUILTINS: the host runs its calls
    on whichever instance of its pool is idle), so an instance that ran other calls first,
    through either entry point, answers each call as a new instance does: the same decisions,
    section and counters (hash queues, output buffers, counter runs and the node pool are the
    module's statics)."""
    config = {"rules": rules}
    used = load_filter(FilterSpec(name="used", module="builtin:rules", config=config))
    try:
        for native, values in calls:
            new = load_filter(FilterSpec(name="new", module="builtin:rules", config=config))
            try:
                answer = _native_answer if native else _answer
                assert answer(used, values) == answer(new, values)
            finally:
                new.close()
    finally:
        used.close()
