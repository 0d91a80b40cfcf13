"""builtin:rules: each action and condition, rules in order, counters, the config checked at
load time with file:line:field errors (and again by the guest), and the native records path
against the decoding path on generated JSON records."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sluice.filters.chain import FilterChain
from sluice.filters.config import FilterSpec, load_filter_specs
from sluice.filters.context import FilterRecord, RecordContext
from sluice.filters.decisions import Action, Decision
from sluice.filters.pipeline import filter_fetch, filter_produce
from sluice.filters.runtime import FilterLoadError, load_filter
from sluice.filters.yaml_lines import ConfigError
from tests.filters.test_native_path import both_paths, make_batch, native_answers, summary

CTX = RecordContext(topic="events", partition=0, direction="produce", client_id="t")
RULES: list[dict[str, Any]] = [
    {"field": "card", "action": "remove"},
    {"field": "email", "action": "hash", "salt": "s3cret"},
    {"field": "user.name", "action": "rename", "to": "user.display_name"},
    {"field": "comment", "action": "truncate", "length": 5},
    {"field": "source", "action": "set", "value": {"via": "web", "n": [1, 2]}},
    {"field": "type", "action": "drop", "when": {"equals": "debug"}},
    {"field": "note", "action": "remove", "when": {"field": "type", "prefix": "int"}},
    {"field": "source.n", "action": "remove", "when": {"field": "type", "contains": "tern"}},
]


def run(config: dict[str, Any], *values: bytes | None) -> tuple[list[Decision], dict[str, int]]:
    f = load_filter(FilterSpec(name="rules", module="builtin:rules", config=config))
    res = f.run_batch(CTX, [FilterRecord(i, 0, b"k", v, [("h", b"1")])
                            for i, v in enumerate(values)])
    return res.decisions, res.detector_counts


def test_every_action_in_order() -> None:
    record = {"card": "4111", "email": "a@b.c", "user": {"name": "Ann", "id": 1},
              "comment": "h\u00e9llo world", "type": "click"}
    got, counts = run({"rules": RULES}, json.dumps(record).encode(), b'{"type": "debug"}',
                      b'{"type": "internal", "note": "x", "source": 1}', b"not json", None,
                      b'{"nothing": "to do", "type": "click"}')
    assert got[0].action == Action.REWRITE and got[0].value is not None
    assert got[0].headers == [("h", b"1")]
    assert json.loads(got[0].value) == {
        "email": hashlib.sha256(b"s3creta@b.c").hexdigest(),
        "user": {"display_name": "Ann", "id": 1},
        "comment": "h\u00e9ll",  # 5 bytes would split the two-byte character
        "type": "click", "source": {"via": "web", "n": [1, 2]}}
    assert got[1].action == Action.DROP
    # "internal": note removed, source replaced, then source.n removed from the new value
    assert got[2].value == b'{"type":"internal","source":{"via":"web"}}'
    assert [d.action for d in got[3:5]] == [Action.KEEP, Action.KEEP]
    # set always applies: the shared value was copied, the previous record's removal did not
    # reach it
    assert got[5].value == (b'{"nothing":"to do","type":"click",'
                            b'"source":{"via":"web","n":[1,2]}}')
    # set runs before the drop rule, so the dropped record counts a set too
    assert counts == {"removed": 3, "hashed": 1, "renamed": 1, "truncated": 1, "set": 4,
                      "dropped": 1, "not_json_object": 1}


def test_unchanged_records_keep_their_bytes_and_conditions() -> None:
    rules = [{"field": "a", "action": "hash", "when": {"exists": False}},
             {"field": "b", "action": "set", "value": None, "when": {"field": "a", "exists": True}},
             {"field": "n", "action": "hash"}]
    got, _ = run({"rules": rules}, b'{ "x" : 1 }', b'{"a": 0}', b'{"n": [1, {"k": true}]}')
    assert got[0].action == Action.KEEP
    assert got[1].value == b'{"a":0,"b":null}'
    salted = hashlib.sha256(b'[1,{"k":true}]').hexdigest()
    assert got[2].value == b'{"n":"' + salted.encode() + b'"}'


def test_rename_replaces_an_existing_target_and_paths_need_objects() -> None:
    rules = [{"field": "a", "action": "rename", "to": "b"},
             {"field": "x.y", "action": "set", "value": 1}]
    got, _ = run({"rules": rules}, b'{"a": 1, "b": 2}', b'{"x": 5}', b'{"x": {}}')
    assert got[0].value == b'{"a":1}'.replace(b'"a"', b'"b"')
    assert got[1].action == Action.KEEP  # x is not an object: nothing to set into
    assert got[2].value == b'{"x":{"y":1}}'


def test_rewritten_values_are_the_same_json() -> None:
    """Escapes, control characters and non-ASCII text survive the tree and its writer."""
    doc = {"s": 'q"b\\n\n\t\x01\x1f\u2028 \U0001f600 \u00e9', "n": [-0.5e3, 1, True, None],
           "o": {"k\"": {}}, "drop_me": 1}
    (d,), _ = run({"rules": [{"field": "drop_me", "action": "remove"}]},
                  json.dumps(doc).encode())
    assert d.value is not None
    del doc["drop_me"]
    assert json.loads(d.value) == doc


def _spec_file(tmp_path: Path, rules_yaml: str) -> Path:
    path = tmp_path / "sluice.yaml"
    path.write_text("filters:\n  - name: r\n    module: builtin:rules\n    topics: [\"*\"]\n"
                    "    apply_to: [produce]\n    config:\n      rules:\n" + rules_yaml)
    return path


@pytest.mark.parametrize(("rules_yaml", "line", "field", "reason"), [
    ("        - {field: a, action: hsh}\n", 8, "rules[0].action", "required: one of set"),
    ("        - {field: a, action: remove}\n        - action: remove\n", 9, "rules[1].field",
     "required: a field name"),
    ("        - {field: a, action: set}\n", 8, "rules[0].value", "required by set"),
    ("        - {field: a, action: remove, value: 1}\n", 8, "rules[0].value",
     "only set takes a value"),
    ("        - {field: a, action: truncate, length: -1}\n", 8, "rules[0].length",
     "whole number"),
    ("        - {field: a.b, action: rename, to: c.d}\n", 8, "rules[0].to", "in its object"),
    ("        - {field: a, action: drop, when: {equals: 1, prefix: x}}\n", 8, "rules[0].when",
     "exactly one"),
    ("        - field: a\n          action: drop\n          when: {exist: true}\n", 10,
     "rules[0].when", "unknown test"),
    ("        - {field: a..b, action: remove}\n", 8, "rules[0].field", "dotted path"),
    ("        - {field: a, action: hash, salt: 5}\n", 8, "rules[0].salt", "must be a string"),
])
def test_config_errors_name_file_line_and_field(tmp_path: Path, rules_yaml: str, line: int,
                                                field: str, reason: str) -> None:
    path = _spec_file(tmp_path, rules_yaml)
    with pytest.raises(ConfigError) as info:
        load_filter_specs(path)
    err = info.value
    assert (err.line, err.field) == (line, f"filters[0].config.{field}")
    assert reason in err.reason and str(err).startswith(f"{path}:{line}: ")
    # The guest refuses the same config with the same field when it comes from elsewhere.
    config = {"rules": __import__("yaml").safe_load(rules_yaml)}
    with pytest.raises(FilterLoadError, match=field.replace("[", r"\[").replace("]", r"\]")):
        load_filter(FilterSpec(name="r", module="builtin:rules", config=config))


def test_a_valid_config_loads_from_yaml(tmp_path: Path) -> None:
    path = _spec_file(tmp_path, "".join(f"        - {json.dumps(r)}\n" for r in RULES))
    (spec,) = load_filter_specs(path)
    assert spec.config == {"rules": RULES}


json_leaf = st.one_of(st.none(), st.booleans(), st.integers(-10**6, 10**6),
                      st.sampled_from(["a@b.c", "debug", "internal", "h\u00e9llo world", "",
                                       'q"b\\n\n\t\x01\u2028 \U0001f600']))
json_obj = st.dictionaries(st.sampled_from(["card", "email", "user", "comment", "type", "note",
                                            "source", "x"]),
                           st.one_of(json_leaf, st.dictionaries(
                               st.sampled_from(["name", "id", "n"]), json_leaf, max_size=3)),
                           max_size=6)
value_st = st.one_of(json_obj.map(lambda d: json.dumps(d).encode()), st.binary(max_size=20),
                     st.none())


@pytest.fixture(scope="module")
def rules_chain() -> Any:
    chain = FilterChain.from_specs([FilterSpec(
        name="rules", module="builtin:rules", topics=("*",),
        apply_to=frozenset({"produce", "fetch"}), config={"rules": RULES})], cache_dir=None)
    yield chain
    chain.close()


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                   HealthCheck.function_scoped_fixture])
@given(values=st.lists(value_st, min_size=1, max_size=10), codec=st.integers(0, 4),
       fetch=st.booleans())
def test_native_and_decoding_paths_agree(rules_chain: Any, values: list[bytes | None],
                                         codec: int, fetch: bool) -> None:
    data = make_batch(values, codec=codec, base_offset=100 if fetch else 0)
    ctx = RecordContext("orders", 3, "fetch" if fetch else "produce", "app", "User:alice")
    with native_answers() as answers:
        native, slow = both_paths(rules_chain, filter_fetch if fetch else filter_produce, ctx,
                                  data)
    assert summary(native) == summary(slow)
    assert len(answers) == 1 and answers[0] is not None  # the native answer itself was used


def test_values_that_mention_no_rule_field_skip_the_parser_but_not_escaped_names() -> None:
    rules = [{"field": "email", "action": "hash"}, {"field": "x", "action": "drop",
                                                    "when": {"field": "env", "equals": "t"}}]
    got, counts = run({"rules": rules}, b'{"name": "e-mail"}', b"not json", b'{"\\u0065mail": 1}',
                      b'{"env": "t"}', b'{"a": "email"}')
    assert [d.action for d in got] == [Action.KEEP, Action.KEEP, Action.REWRITE, Action.DROP,
                                       Action.KEEP]
    assert got[2].value == b'{"email":"' + hashlib.sha256(b"1").hexdigest().encode() + b'"}'
    # neither "not json" nor {"name": ...} was parsed; {"a": "email"} was (the name is there)
    assert counts == {"hashed": 1, "dropped": 1}
    # a set rule needs every value parsed
    got, counts = run({"rules": [*rules, {"field": "v", "action": "set", "value": 1}]},
                      b"not json")
    assert counts == {"not_json_object": 1}
