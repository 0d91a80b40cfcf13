"""A client cannot mint fresh job kinds by naming topics (`paths.base.inline_key`).

Job placement (net/job_placement.py) lets a kind run inline after `learn` fast runs and backs it
off after a slow run on the loop, so crafted records stall the loop at most once per the
longest back-off of the kind's jobs (docs/SECURITY.md). A kind used to be named after the
request's topics, which the client chooses: a pattern binding matches endless names, and a
topic no filter applies to may be added to any request. Each new name was a fresh kind, inline
after 8 fast runs and allowed its one slow run on the loop."""

from __future__ import annotations

from pathlib import Path

import pytest

from sluice.filters.chain import FilterChain
from sluice.filters.config import FilterSpec
from sluice.proxy.net.job_placement import JobPlacement
from sluice.proxy.paths.base import inline_key


@pytest.fixture
def chain(tmp_path: Path) -> FilterChain:
    made = FilterChain.from_specs(
        [FilterSpec(name="pii", module="builtin:pii-mask", topics=("pii.*",),
                    apply_to=frozenset({"produce", "fetch"}))],
        cache_dir=tmp_path / "cache",
    )
    return made


def test_topic_names_do_not_make_new_kinds(chain: FilterChain) -> None:
    key = inline_key(chain, "produce", ["pii.users"], None)
    assert key is not None
    # another name the pattern matches, an unfiltered topic beside it, the topic twice
    for topics in (["pii.x1"], ["pii.users", "junk-1"], ["junk-2", "pii.users", "pii.users"]):
        assert inline_key(chain, "produce", topics, None) == key, topics
    assert inline_key(chain, "fetch", ["pii.users"], None) != key
    assert inline_key(chain, "produce", ["pii.users", None], None) is None


def test_minted_names_get_no_stalls_past_the_back_off(chain: FilterChain) -> None:
    """The attack: one slow job per freshly named kind after `learn` fast ones. Once the
    kind has backed off fully, 200 fresh names must not let one job inline."""
    placement = JobPlacement()
    slow = 0.05  # a crafted batch: far over max_seconds and the tolerance
    first = inline_key(chain, "produce", ["pii.users"], None)
    # The kind is found out and backed off to the longest back-off.
    while placement._kinds.get(first or "", [0, 0])[1] < placement.learn * placement.max_backoff:
        while not placement.inline(first, 100):
            placement.record(first, 0.0001, 100)
        placement.record(first, slow, 100, ran_inline=True)
    stalls = 0
    for n in range(200):
        key = inline_key(chain, "produce", ["pii.users", f"junk-{n}"], None)
        for _ in range(placement.learn):
            ran = placement.inline(key, 100)
            placement.record(key, 0.0001, 100, ran_inline=ran)
        if placement.inline(key, 100):
            stalls += 1
            placement.record(key, slow, 100, ran_inline=True)
        else:
            placement.record(key, slow, 100)
    assert stalls == 0, f"{stalls} slow jobs ran on the loop in {200 * 9} jobs"


def test_the_produce_path_remembers_a_requests_kind_with_its_chain(
    chain: FilterChain, tmp_path: Path
) -> None:
    """`produce._kind` answers from the chain's memo what `inline_key`, `cost_follows_size`
    and `applies` would answer; another chain (a reload) answers from its own bindings; the
    table stays bounded whatever names clients send."""
    from sluice.proxy.paths import produce

    names: list[str | None] = ["pii.users", "junk"]
    # pii-mask keeps no state: the request's job may overlap the connection's next ones.
    expected = ((True, False), inline_key(chain, "produce", names, None), False, True)
    assert produce._kind(chain, names, None) == expected
    assert produce._kind(chain, names, None) == expected  # from the memo
    assert produce._kind(chain, ["junk"], None) == ((False,), inline_key(chain, "produce",
                                                                         ["junk"], None), False,
                                                    True)
    other = FilterChain.from_specs(
        [FilterSpec(name="pii", module="builtin:pii-mask", topics=("junk",),
                    apply_to=frozenset({"produce"}))],
        cache_dir=tmp_path / "cache",
    )
    assert produce._kind(other, names, None)[0] == (False, True)
    assert produce._kind(chain, names, None) == expected
    assert produce._kind(chain, ["pii.users", None], None)[1] is None
    for n in range(produce._KINDS_LIMIT + 10):
        produce._kind(chain, [f"pii.{n}"], None)
    assert len(chain.memo["produce"]) <= produce._KINDS_LIMIT


def test_the_produce_memo_keeps_no_large_topic_lists(chain: FilterChain) -> None:
    """The memo's keys are the request's topic names, which the client chooses: bounded in
    entries alone, 4 096 requests of a 100 MB frame's worth of names each stayed in memory for
    the chain's life. Only small requests are remembered; large ones are worked out again."""
    from sluice.proxy.paths import produce

    for n in range(64):
        names: list[str | None] = [f"pii.{n}.{i}.{'x' * 200}" for i in range(2000)]
        applied, key, _scales, _overlap = produce._kind(chain, names, None)
        assert all(applied) and key == inline_key(chain, "produce", ["pii.users"], None)
    kept = sum(len(name or "") for names, _principal in chain.memo.get("produce", {})
               for name in names)
    assert kept <= 1 << 20, f"{kept} characters of topic names kept"
    assert produce._kind(chain, ["pii.users"], None) == produce._kind(chain, ["pii.users"], None)
    assert (("pii.users",), None) in chain.memo["produce"]  # small requests still are
