"""builtin:rules' one-pass path against the full-tree module: the same decisions, values and
counters.

When every rule looks at one top-level member (no dotted path, a condition on the member it
acts on or a drop's condition on any member) and only removes, hashes, truncates or drops, the
module reads a value and writes its new one in the same pass, without a tree, and counts its
counters at each record's end (a run of records that fire the same rules as one tally). The
rule sets generated here are all of that kind, so every record goes that way but those that
repeat a member a rule names (the tree path decides those). `data/rules-tree-reference.wasm`
(see test_rules_differential.py) must answer exactly the same, on both entry points.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sluice.filters.config import FilterSpec
from sluice.filters.runtime import load_filter
from tests.filters.builtin.test_rules_differential import (
    NAMES,
    _answer,
    _native_answer,
    record_values,
    scalar,
)

REFERENCE = Path(__file__).resolve().parent / "data" / "rules-tree-reference.wasm"

pytestmark = pytest.mark.skipif(not REFERENCE.is_file(), reason="reference module missing")


@st.composite
def one_pass_rule(draw: st.DrawFn) -> dict[str, Any]:
    action = draw(st.sampled_from(["remove", "hash", "truncate", "drop"]))
    field = draw(st.sampled_from(NAMES))
    r: dict[str, Any] = {"field": field, "action": action}
    if action == "hash" and draw(st.booleans()):
        r["salt"] = draw(st.sampled_from(["", "s3cret", "p" * 63, "q" * 64, "r" * 130]))
    elif action == "truncate":
        r["length"] = draw(st.integers(0, 8))
    if draw(st.integers(0, 2)) == 0:
        test = draw(st.sampled_from(["exists", "equals", "prefix", "contains"]))
        when: dict[str, Any] = {
            "exists": draw(st.booleans()), "equals": draw(scalar),
            "prefix": draw(st.sampled_from(["", "h", "int", "q\"", "0"])),
            "contains": draw(st.sampled_from(["", "l", "tern", "\u00e9"]))}
        r["when"] = {test: when[test]}
        if action == "drop" and draw(st.booleans()):
            r["when"]["field"] = draw(st.sampled_from(NAMES))
        elif draw(st.integers(0, 3)) == 0:
            r["when"]["field"] = field  # the same member, named again
    return r


def _same_answers(rules: list[dict[str, Any]], values: list[bytes | None]) -> None:
    config = {"rules": rules}
    new = load_filter(FilterSpec(name="rules", module="builtin:rules", config=config))
    old = load_filter(FilterSpec(name="old", module=str(REFERENCE), config=config))
    try:
        assert _answer(new, values) == _answer(old, values)
        assert _native_answer(new, values) == _native_answer(old, values)
    finally:
        new.close()
        old.close()


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(rules=st.lists(one_pass_rule(), min_size=1, max_size=6),
       values=st.lists(record_values(), min_size=1, max_size=8))
def test_one_pass_rules_answer_as_the_full_tree_module_did(rules: list[dict[str, Any]],
                                                           values: list[bytes | None]) -> None:
    _same_answers(rules, values)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(rules=st.lists(one_pass_rule(), min_size=1, max_size=4),
       pattern=st.lists(st.integers(0, 5), min_size=1, max_size=40))
def test_runs_of_records_firing_the_same_rules_count_as_the_full_tree_module_did(
        rules: list[dict[str, Any]], pattern: list[int]) -> None:
    """Long batches where the same few shapes of record repeat in runs and interleave: the
    per-run tally of counters must add up to the tree path's counts, in its order."""
    shapes = [
        {"a": "hello", "b": 1, "c": "internal"},
        {"a": "hello", "b": 1, "c": "internal"},  # the same rules again
        {"b": "x" * 70, "x": [1, {"a": 2}]},
        {"c": None, "\u00e9": "h\u00e9llo w\u00f6rld", "a": True},
        {"x": 1},
        {"a": "debug", "c": "debug", "b": "debug"},
    ]
    values: list[bytes | None] = [json.dumps(shapes[p]).encode() for p in pattern]
    _same_answers(rules, values)


@pytest.mark.parametrize("values", [
    # a named member twice: the tree path decides (the last one counts)
    [b'{"email": "a@b", "amount": 1, "email": "c@d"}', b'{"email": "e@f", "amount": 2}'],
    # broken after a hashed member: the queued hash is forgotten, the value kept and counted
    [b'{"email": "a@b", "amount": 1, "note": "xx', b'{"email": "e@f"}', b'{"email": "g@h",]'],
    # dropped after a hashed member (the drop's member last): no hash, no counts after it
    [b'{"email": "a@b", "note": "long note", "user_id": -1}', b'{"email": "e@f", "user_id": 2}'],
    # not objects, and objects no rule changes, between rewritten ones
    [b'[1]', b'{"email": 5}', b'{"other": "x"}', b'"email"', b'{}', b'{"email": "x@y"}'],
])
def test_bench_rules_on_records_the_one_pass_path_hands_back(values: list[bytes | None]) -> None:
    """The bench's rule set (filters/bench.py) on records that leave the one-pass path, fail
    in it after a hash was queued, or are dropped late."""
    from sluice.filters.bench import BENCH_RULES

    _same_answers(BENCH_RULES, values)
