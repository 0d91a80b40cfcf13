"""Load-time checks of ``builtin:rules`` configs, so that a mistake names file, line and field.

The guest (filters/src/rules/filter.c) checks the same things in ``sluice_init`` with the same
messages, for configs that reach it some other way (code, the filter fleet); this copy runs
while the YAML's line numbers are still known: ``sluice.yaml:14:
filters[0].config.rules[1].action: required: one of set, remove, rename, hash, truncate,
drop``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from sluice.filters.yaml_lines import ConfigError

Fail = Callable[[tuple[str | int, ...], str], ConfigError]

MAX_RULES = 64
ACTIONS = ("set", "remove", "rename", "hash", "truncate", "drop")
RULE_KEYS = ("field", "action", "when", "value", "to", "salt", "length")
WHEN_TESTS = ("exists", "equals", "prefix", "contains")


def _valid_path(path: Any) -> bool:
    return (isinstance(path, str) and path != "" and not path.startswith(".")
            and not path.endswith(".") and ".." not in path)


def _parent(path: str) -> str:
    return path.rsplit(".", 1)[0] if "." in path else ""


def check_rules_config(config: Any, fail: Fail) -> None:
    """Raise (through `fail(subpath, reason)`) at the first problem of a rules config."""
    if not isinstance(config, dict):
        raise fail((), "must be a mapping")
    for key in config:
        if key != "rules":
            raise fail((str(key),), "unknown field (expected rules)")
    rules = config.get("rules")
    if rules is None:
        return
    if not isinstance(rules, list):
        raise fail(("rules",), "must be a list of rules")
    if len(rules) > MAX_RULES:
        raise fail(("rules",), f"at most {MAX_RULES} rules")
    for i, rule in enumerate(rules):
        _check_rule(rule, _under(fail, ("rules", i)))


def _under(fail: Fail, prefix: tuple[str | int, ...]) -> Fail:
    """`fail` for the fields under `prefix`."""
    def sub_fail(sub: tuple[str | int, ...], reason: str) -> ConfigError:
        return fail((*prefix, *sub), reason)
    return sub_fail


def _check_rule(rule: Any, fail: Fail) -> None:
    if not isinstance(rule, dict):
        raise fail((), "each rule must be a mapping")
    for key in rule:
        if key not in RULE_KEYS:
            raise fail((str(key),), f"unknown field (expected {', '.join(RULE_KEYS)})")
    field = rule.get("field")
    if not isinstance(field, str) or not _valid_path(field):
        raise fail(("field",), "required: a field name or dotted path such as user.email")
    action = rule.get("action")
    if action not in ACTIONS:
        raise fail(("action",), f"required: one of {', '.join(ACTIONS)}")
    for key, owner in (("value", "set"), ("to", "rename"), ("length", "truncate")):
        if (key in rule) != (action == owner):
            raise fail((key,), f"required by {owner}" if action == owner
                       else f"only {owner} takes {'a ' if key != 'to' else ''}{key}")
    if "salt" in rule and action != "hash":
        raise fail(("salt",), "only hash takes a salt")
    if "to" in rule:
        to = rule["to"]
        if not isinstance(to, str) or to.rsplit(".", 1)[-1] == "":
            raise fail(("to",), "must be a non-empty string")
        if "." in to and _parent(to) != _parent(field):
            raise fail(("to",), "rename keeps the field in its object: give a new name, or the "
                                "same parent path")
    if "salt" in rule and not isinstance(rule["salt"], str):
        raise fail(("salt",), "must be a string")
    if "length" in rule:
        length = rule["length"]
        if isinstance(length, bool) or not isinstance(length, int) or length < 0:
            raise fail(("length",), "must be a whole number of bytes, 0 or more")
    if "when" in rule:
        _check_when(rule["when"], _under(fail, ("when",)))


def _check_when(when: Any, fail: Fail) -> None:
    if not isinstance(when, dict):
        raise fail((), "must be a mapping: exists, equals, prefix or contains (and field)")
    for key, value in when.items():
        if key == "field":
            if not _valid_path(value):
                raise fail(("field",), "must be a field name or dotted path")
        elif key == "exists":
            if not isinstance(value, bool):
                raise fail(("exists",), "must be true or false")
        elif key == "equals":
            if isinstance(value, (dict, list)):
                raise fail(("equals",), "must be a string, number, true, false or null")
        elif key in ("prefix", "contains"):
            if not isinstance(value, str):
                raise fail((key,), "must be a string")
        else:
            raise fail((), "unknown test (expected exists, equals, prefix, contains, field)")
    if sum(key in when for key in WHEN_TESTS) != 1:
        raise fail((), "needs exactly one of exists, equals, prefix, contains")
