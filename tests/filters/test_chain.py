"""FilterChain: binding by topic/direction/principal, order, dead letters, admin resources."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from sluice.filters.abi_base import FilterLoadError
from sluice.filters.admin import AdminResource
from sluice.filters.chain import DROP, KEEP, REJECT, REWRITE, FilterChain
from sluice.filters.config import FilterSpec
from sluice.filters.context import FilterRecord, RecordContext
from sluice.filters.module_cache import ModuleCache

MakeSpec = Callable[..., FilterSpec]


def rec(value: bytes | None, key: bytes | None = None, headers=None) -> FilterRecord:
    return FilterRecord(0, 0, key, value, list(headers or []))


@pytest.fixture
def chain_of(module_cache: ModuleCache):
    made: list[FilterChain] = []

    def build(*specs: FilterSpec) -> FilterChain:
        chain = FilterChain.from_specs(list(specs), cache=module_cache)
        made.append(chain)
        return chain

    yield build
    for c in made:
        c.close()


def test_applies_by_topic_direction_and_principal(make_spec: MakeSpec, chain_of) -> None:
    chain = chain_of(
        make_spec("sluice_upper", name="pay", topics=("payments.*", "users"),
                  apply_to=frozenset({"produce"})),
        make_spec("sluice_upper", name="scoped", topics=("audit?",),
                  apply_to=frozenset({"fetch"}), principals=("User:ops-*",)),
    )
    assert chain.applies("payments.eu", "produce")
    assert chain.applies("payments.eu.cards", "produce")  # * also matches dots
    assert chain.applies("users", "produce")
    assert not chain.applies("users2", "produce")
    assert not chain.applies("Payments.eu", "produce")  # topic names are case-sensitive
    assert not chain.applies("payments.eu", "fetch")
    assert chain.applies("audit1", "fetch", "User:ops-bob")
    assert not chain.applies("audit1", "fetch", "User:alice")
    assert not chain.applies("audit1", "fetch")  # anonymous is User:ANONYMOUS
    assert [f.name for f in chain.filters_for("payments.x", "produce")] == ["pay"]
    assert chain.filters_for("users", "produce") is chain.filters_for("users", "produce")


def test_topic_names_longer_than_kafka_allows_are_answered_but_not_cached(
        make_spec: MakeSpec, chain_of) -> None:
    # Topic names are the client's: the protocol allows 32 767 bytes, Kafka 249. The per-topic
    # caches keep up to 10 000 entries, so long invalid names must not be kept.
    chain = chain_of(make_spec("sluice_upper", name="all", topics=("*",),
                               apply_to=frozenset({"produce", "fetch"})))
    for i in range(50):
        long_name = f"{i:05d}" + "x" * 30_000
        assert [f.name for f in chain.filters_for(long_name, "produce")] == ["all"]
        assert chain.applies(long_name, "fetch")
        chain.reserved_for(long_name)
        chain._screens(long_name)
    assert chain.applies("x" * 249, "produce")
    kept = [*(k[0] for k in chain._cache), *chain._reserved, *chain._screen_cache]
    assert kept and max(len(name) for name in kept) <= 249


def test_anonymous_principal_matches_user_glob(make_spec: MakeSpec, chain_of) -> None:
    chain = chain_of(make_spec("sluice_upper", principals=("User:*",)))
    assert chain.applies("t", "produce", None)


def test_filters_run_in_order_and_see_rewrites(make_spec: MakeSpec, chain_of) -> None:
    # connect value_to_key copies the value to the key, then sluice_upper upper-cases the
    # value and keeps the key: the key shows the value as filter 1 left it.
    chain = chain_of(
        make_spec("connect_funcs", name="v2k", function="value_to_key"),
        make_spec("sluice_upper", name="upper"),
    )
    ctx = RecordContext("t", 0, "produce")
    result = chain.run_records(ctx, [rec(b"abc"), rec(b"DROP"), rec(b"REJECT!"), rec(b"KEPT")])
    assert result.fates == [REWRITE, DROP, REJECT, REWRITE]
    first = result.records[0]
    assert first is not None and (first.key, first.value) == (b"abc", b"ABC")
    assert result.records[1] is None and result.records[2] is None
    assert result.reasons == {2: "filter upper: marker REJECT"}
    assert result.by == {1: "upper", 2: "upper"}
    v2k, upper = result.stats
    assert (v2k.name, v2k.rewritten, v2k.kept) == ("v2k", 4, 0)
    assert (upper.kept, upper.rewritten, upper.dropped, upper.rejected) == (1, 1, 1, 1)
    assert upper.detector_counts == {"upper": 1}
    assert result.changed


def test_drop_stops_the_record_before_later_filters(make_spec: MakeSpec, chain_of) -> None:
    chain = chain_of(make_spec("inplace_upper", name="first"),
                     make_spec("sluice_upper", name="second"))
    result = chain.run_records(RecordContext("t", 0, "produce"), [rec(b"DROP"), rec(b"x")])
    assert result.fates == [DROP, REWRITE]
    assert result.stats[1].kept + result.stats[1].rewritten == 1  # saw only one record


def test_unchanged_batch_is_reported_unchanged(make_spec: MakeSpec, chain_of) -> None:
    chain = chain_of(make_spec("sluice_upper"))
    records = [rec(b"UPPER"), rec(None)]
    result = chain.run_records(RecordContext("t", 0, "fetch"), records)
    assert not result.changed and result.fates == [KEEP, KEEP]
    assert result.records[0] is records[0]


def test_no_filter_bound_means_no_stats(make_spec: MakeSpec, chain_of) -> None:
    chain = chain_of(make_spec("sluice_upper", topics=("other",)))
    result = chain.run_records(RecordContext("t", 0, "produce"), [rec(b"x")])
    assert result.stats == [] and not result.changed


def test_dead_letters_name_filter_and_reason(make_spec: MakeSpec, chain_of) -> None:
    chain = chain_of(make_spec("sluice_upper", name="dl", on_error="dead-letter",
                               dead_letter_topic="orders.dlq"))
    ctx = RecordContext("orders", 4, "produce")
    result = chain.run_records(ctx, [rec(b"TRAP", key=b"k1", headers=[("orig", b"1")]),
                                     rec(b"other", key=b"k2")])
    assert result.fates == [REJECT, REJECT]
    assert len(result.dead_letters) == 2
    topic, key, value, headers = result.dead_letters[0]
    assert (topic, key, value) == ("orders.dlq", b"k1", b"TRAP")
    h = dict(headers)
    assert h["orig"] == b"1"
    assert h["sluice.filter"] == b"dl"
    assert h["sluice.filter.sha256"] == chain.filters[0].sha256.encode()
    assert h["sluice.reason"].startswith(b"filter dl failed: trap:")
    assert (h["sluice.source.topic"], h["sluice.source.partition"]) == (b"orders", b"4")
    assert result.stats[0].errors == 2 and result.stats[0].failure is not None


def test_own_rejects_are_not_dead_lettered(make_spec: MakeSpec, chain_of) -> None:
    chain = chain_of(make_spec("sluice_upper", on_error="dead-letter", dead_letter_topic="d"))
    result = chain.run_records(RecordContext("t", 0, "produce"), [rec(b"REJECT")])
    assert result.fates == [REJECT] and result.dead_letters == []


def test_load_error_names_the_filter(make_spec: MakeSpec, module_cache: ModuleCache) -> None:
    specs = [make_spec("sluice_upper", name="good"),
             make_spec("forbidden_import", name="evil")]
    with pytest.raises(FilterLoadError, match="filter 'evil'"):
        FilterChain.from_specs(specs, cache=module_cache)


# -- admin -------------------------------------------------------------------------------


def admin_spec(make_spec: MakeSpec, **kw) -> FilterSpec:
    kw.setdefault("apply_to", frozenset({"admin"}))
    return make_spec("admin_policy", **kw)


def res(name: str, **kw) -> AdminResource:
    kw.setdefault("op", "create_topics")
    return AdminResource(name=name, partitions=kw.pop("partitions", 6),
                         replication_factor=1, configs=kw.pop("configs", {"a": "1"}), **kw)


def test_admin_allow_deny_rewrite(make_spec: MakeSpec, chain_of) -> None:
    chain = chain_of(admin_spec(make_spec, name="policy"))
    assert chain.has_admin
    assert chain.run_admin(res("fine")).decision == "allow"
    denied = chain.run_admin(res("bad-topic"))
    assert (denied.decision, denied.message, denied.filter) == (
        "deny", "name starts with bad", "policy")
    rewritten = chain.run_admin(res("big-topic", partitions=64))
    assert (rewritten.decision, rewritten.partitions, rewritten.configs, rewritten.filter) == (
        "rewrite", 3, {"retention.ms": "1000"}, "policy")


def test_admin_rewrite_is_seen_by_the_next_filter_and_deny_wins(make_spec: MakeSpec,
                                                                 chain_of) -> None:
    chain = chain_of(admin_spec(make_spec, name="one"), admin_spec(make_spec, name="two"))
    verdict = chain.run_admin(res("big"))
    assert verdict.decision == "rewrite" and verdict.partitions == 3
    assert verdict.message == "capped; capped"
    assert chain.run_admin(res("bad")).filter == "one"


def test_admin_topics_glob_and_other_ops(make_spec: MakeSpec, chain_of) -> None:
    chain = chain_of(admin_spec(make_spec, topics=("prod.*",)))
    assert chain.run_admin(res("bad")).decision == "allow"  # not bound to this name
    assert chain.run_admin(res("prod.bad", op="incremental_alter_configs")).decision == "allow"
    assert chain.run_admin(AdminResource(op="alter_configs", name="prod.x",
                                         configs={"retention.ms": None})).decision == "allow"


@pytest.mark.parametrize(("policy", "decision"), [("reject", "deny"), ("pass", "allow"),
                                                  ("dead-letter", "deny")])
def test_admin_failures_follow_policy(make_spec: MakeSpec, chain_of, policy: str,
                                      decision: str) -> None:
    chain = chain_of(admin_spec(make_spec, on_error=policy,
                                dead_letter_topic="d" if policy == "dead-letter" else None))
    for name, kind in (("junk", "invalid-output"), ("trap-me", "trap")):
        verdict = chain.run_admin(res(name))
        assert verdict.decision == decision
        if decision == "deny":
            assert verdict.message.startswith(f"filter admin_policy failed: {kind}")
    assert chain.run_admin(res("bad")).decision == "deny"  # still works after the trap


def test_admin_resource_validation() -> None:
    with pytest.raises(ValueError, match="unknown admin op"):
        AdminResource(op="delete_topics", name="x")
    doc = AdminResource(op="create_partitions", name="t", partitions=4).to_json()
    assert doc == (b'{"op":"create_partitions","resource_type":"topic","name":"t",'
                   b'"partitions":4,"replication_factor":null,"configs":{},"principal":"",'
                   b'"client_id":""}')
