"""builtin:topic-policy over the ABI: every rule, rewrite mode, and the regex subset."""

from __future__ import annotations

import functools
import re
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.filters.builtin.conftest import BUILTIN
from tests.filters.sdk.guest_abi import KEEP, Guest, GuestError, Rec

Loader = Callable[..., Guest]

ISSUE_CONFIG: dict[str, Any] = {  # the issue's example, verbatim
    "name_pattern": "^[a-z0-9._-]+$",
    "partitions": {"min": 1, "max": 12},
    "min_replication_factor": 1,
    "allowed_cleanup_policies": ["delete"],
    "retention_ms": {"min": 3600000, "max": 604800000},
    "max_message_bytes": {"max": 1048576},
    "required_configs": ["retention.ms"],
    "forbidden_configs": ["unclean.leader.election.enable"],
}


def create(name: str = "orders.v1", partitions: int | None = 3, rf: int | None = 1,
           op: str = "create_topics", **configs: str | None) -> dict[str, Any]:
    return {"op": op, "resource_type": "topic", "name": name, "partitions": partitions,
            "replication_factor": rf,
            "configs": {k.replace("_", "."): v for k, v in configs.items()},
            "principal": "User:alice", "client_id": "admin-cli"}


@pytest.fixture
def policy(load_builtin: Loader) -> Guest:
    return load_builtin("topic-policy", ISSUE_CONFIG)


def test_compliant_topic_allowed(policy: Guest) -> None:
    assert policy.admin(create(retention_ms="86400000"))["decision"] == "allow"


@pytest.mark.parametrize(
    ("request_", "rule", "value"),
    [
        (create(name="Orders!", retention_ms="86400000"), "name_pattern", "'Orders!'"),
        (create(partitions=50, retention_ms="86400000"), "partitions.max", "50 requested"),
        (create(partitions=0, retention_ms="86400000"), None, None),  # 0 = not given: no check
        (create(rf=0, retention_ms="86400000"), None, None),
        (create(retention_ms="86400000", cleanup_policy="compact"), "allowed_cleanup_policies",
         "'compact'"),
        (create(retention_ms="60000"), "retention_ms.min", "retention.ms=60000"),
        (create(retention_ms="999999999999"), "retention_ms.max", "retention.ms=999999999999"),
        (create(retention_ms="-1"), "retention_ms.max", "(unlimited)"),
        (create(retention_ms="soon"), "retention_ms.max", "'soon' is not an integer"),
        (create(retention_ms="86400000", max_message_bytes="2000000"), "max_message_bytes.max",
         "max.message.bytes=2000000"),
        (create(), "required_configs", "'retention.ms' must be set"),
        (create(retention_ms="86400000", unclean_leader_election_enable="true"),
         "forbidden_configs", "'unclean.leader.election.enable' may not be set"),
    ],
)
def test_each_rule_names_itself_and_the_value(policy: Guest, request_: dict[str, Any],
                                              rule: str | None, value: str | None) -> None:
    verdict = policy.admin(request_)
    if rule is None:
        assert verdict["decision"] == "allow"
        return
    assert verdict["decision"] == "deny"
    assert verdict["message"].startswith("topic-policy: ")
    assert f"{rule}: " in verdict["message"]
    assert value in verdict["message"]


def test_min_replication_factor(load_builtin: Loader) -> None:
    g = load_builtin("topic-policy", {"min_replication_factor": 3})
    v = g.admin(create(rf=1))
    assert v["decision"] == "deny"
    assert "min_replication_factor: replication factor 1, at least 3 required" in v["message"]
    assert g.admin(create(rf=3))["decision"] == "allow"
    assert g.admin(create(rf=None))["decision"] == "allow"  # broker default: not ours to judge


def test_all_violations_are_listed(policy: Guest) -> None:
    v = policy.admin(create(name="BAD", partitions=99, cleanup_policy="compact,delete"))
    assert v["decision"] == "deny"
    for rule in ("name_pattern", "partitions.max", "allowed_cleanup_policies",
                 "required_configs"):
        assert rule in v["message"]
    assert "'compact'" in v["message"] and "'delete'" not in v["message"].split("allowed:")[0]


def test_create_partitions_checks_only_the_count(policy: Guest) -> None:
    assert policy.admin(create(name="X!", partitions=13, op="create_partitions"))["decision"] \
        == "deny"
    assert policy.admin(create(name="X!", partitions=12, op="create_partitions"))["decision"] \
        == "allow"


def test_alter_configs_check_resulting_config(policy: Guest) -> None:
    v = policy.admin(create(op="incremental_alter_configs", partitions=None, rf=None,
                            retention_ms=None))
    assert v["decision"] == "deny" and "required_configs" in v["message"]
    v = policy.admin(create(name="LEGACY_NAME", op="alter_configs", partitions=None, rf=None,
                            retention_ms="7200000"))
    assert v["decision"] == "allow"  # names are judged at creation only


def test_non_topic_resources_allowed(policy: Guest) -> None:
    req = create(op="alter_configs")
    req["resource_type"] = "broker"
    assert policy.admin(req)["decision"] == "allow"


def test_rewrite_defaults_and_cap_partitions(load_builtin: Loader) -> None:
    cfg = dict(ISSUE_CONFIG, defaults={"retention.ms": "604800000", "cleanup.policy": "delete"},
               cap_partitions=True)
    g = load_builtin("topic-policy", cfg)
    v = g.admin(create(partitions=50, segment_bytes="1000"))
    assert v["decision"] == "rewrite"
    assert v["partitions"] == 12
    assert v["configs"] == {"segment.bytes": "1000", "retention.ms": "604800000",
                            "cleanup.policy": "delete"}
    assert "partitions 50 -> 12" in v["message"]
    # defaults never override what the client set; a valid request stays untouched
    v = g.admin(create(retention_ms="7200000", cleanup_policy="delete"))
    assert v["decision"] == "allow"
    # a default does not rescue a request that breaks another rule
    v = g.admin(create(name="BAD NAME"))
    assert v["decision"] == "deny"


def test_no_config_allows_everything(load_builtin: Loader) -> None:
    g = load_builtin("topic-policy", {})
    assert g.admin(create(name="ANY thing", partitions=1000))["decision"] == "allow"


def test_records_pass_untouched(policy: Guest) -> None:
    (d,), counts = policy.run([Rec(b"x")])
    assert d.kind == KEEP and counts == {}


@pytest.mark.parametrize(
    "config",
    [
        {"name_pattern": "([a-z]"},
        {"name_pattern": "[z-a]"},
        {"name_pattern": "a{3,1}"},
        {"name_pattern": "*a"},
        {"name_pattern": "\\p{L}"},
        {"partitions": {"min": 5, "max": 1}},
        {"partitions": 3},
        {"retention_ms": {"min": "soon"}},
        {"required_configs": "retention.ms"},
        {"defaults": ["retention.ms"]},
        {"nonsense": True},
    ],
)
def test_bad_config_refused(load_builtin: Loader, config: dict[str, Any]) -> None:
    with pytest.raises(GuestError, match="topic-policy"):
        load_builtin("topic-policy", config)


# --- the regex subset agrees with Python's re.search on the shared syntax -------------------

PATTERNS = [
    "^[a-z0-9._-]+$", "^(orders|payments)\\.[a-z]+$", "^team-\\d{2,4}\\.", "v\\d+$",
    "^[^A-Z]*$", "^a*b?c+$", "^(ab)+$", "x{3}", "^\\w+(\\.\\w+)*$", "^$", "a|b|c",
    "^(?:dev|prod)-[a-z]{1,3}$", "\\.internal$", "^[\\w.-]{1,249}$", "^.{5}$",
    "^\\s*$", "[\\D]", "^[a-c-]+$", "^a{2,}$", "^ab??c$",
]
NAMES = ["orders.v1", "payments.eu", "Orders", "team-12.x", "team-1.x", "a.v12", "", "ab",
         "abab", "xxx", "xx", "dev-abc", "prod-abcd", "db.internal", "aaaaab", "abcde", " ",
         "12", "a-c", "aaa", "ac", "abc", "a" * 300]


@pytest.mark.parametrize("pattern", PATTERNS)
def test_regex_subset_matches_python(load_builtin: Loader, pattern: str) -> None:
    g = load_builtin("topic-policy", {"name_pattern": pattern})
    for name in NAMES:
        got = g.admin(create(name=name))["decision"] == "allow"
        assert got == bool(re.search(pattern, name)), (pattern, name)


def test_regex_is_linear_time(load_builtin: Loader) -> None:
    # Python's backtracking re takes minutes on this; the NFA answers at once.
    g = load_builtin("topic-policy", {"name_pattern": "^(a*)*b$"})
    assert g.admin(create(name="a" * 240 + "c"))["decision"] == "deny"
    assert g.admin(create(name="a" * 240 + "b"))["decision"] == "allow"


@functools.cache
def _random_names_policy() -> Guest:
    return Guest(BUILTIN / "topic-policy.wasm", {"name_pattern": "^(a|b)+[._-]?[a-z0-9]*$"})


@settings(max_examples=60, deadline=None)
@given(name=st.text(alphabet="ab.-_Z09", max_size=12))
def test_regex_subset_random_names(name: str) -> None:
    g = _random_names_policy()
    got = g.admin(create(name=name))["decision"] == "allow"
    assert got == bool(re.search("^(a|b)+[._-]?[a-z0-9]*$", name))
