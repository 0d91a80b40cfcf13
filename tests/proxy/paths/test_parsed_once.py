"""Each Produce request is parsed once on its way through the quotas, the internal-topics path
and the Produce path: the parse is kept on the exchange (`Exchange.produce_*`) and reused."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest

from sluice.proxy.paths import base as parsed
from sluice.proxy.paths import internal_topics
from sluice.proxy.paths.base import Forward
from sluice.proxy.paths.internal_topics import InternalTopicsPath
from sluice.proxy.paths.produce import ProducePath
from tests.filters.test_native_path import make_batch
from tests.proxy.paths.test_internal_topics import INTERNAL, ORDINARY, context, exchange_for
from tests.proxy.paths.test_paths import produce_frame


@pytest.fixture
def parses(monkeypatch: pytest.MonkeyPatch) -> Counter[str]:
    """Counts every parse of a Produce request body the paths make."""
    counts: Counter[str] = Counter()
    for name in ("produce_head_at", "read_produce_topics", "scan_layout",
                 "scan_produce_request", "produce_acks"):
        real = getattr(parsed, name)

        def counted(*args: Any, _real: Any = real, _name: str = name) -> Any:
            counts[_name] += 1
            return _real(*args)

        monkeypatch.setattr(parsed, name, counted)
        if name == "produce_head_at":  # read inline there too (its common case)
            monkeypatch.setattr(internal_topics, name, counted)
    return counts


@pytest.mark.parametrize("acks", [0, -1])
def test_unfiltered_produce_is_read_once(parses: Counter[str], acks: int) -> None:
    path = InternalTopicsPath([ProducePath()])
    frame = produce_frame(ORDINARY, make_batch([b"x"]), acks=acks)
    outcome = path.on_request(context(), exchange_for(frame), frame)
    assert type(outcome) is Forward and outcome.expect_response == (acks != 0)
    # Made without its __init__ (produce.py): every field as the dataclass makes it.
    assert outcome == Forward(expect_response=acks != 0)
    assert sum(parses.values()) == 1, parses


def test_produce_to_a_protected_topic_is_scanned_once_more_only_for_its_layout(
    parses: Counter[str],
) -> None:
    path = InternalTopicsPath([ProducePath()])
    frame = produce_frame(INTERNAL, make_batch([b"x"]))
    path.on_request(context(), exchange_for(frame), frame)
    # The name first (from the head), then the layout to answer the partitions: no parse
    # repeated (the layout natively where built; `scan_layout` is the Python scan otherwise).
    assert parses == Counter(produce_head_at=1, scan_layout=1), parses


def test_filtered_produce_is_scanned_once(parses: Counter[str], tmp_path: Any) -> None:
    """The quotas (a topic rule counts record bytes per topic), the internal-topics path and
    the Produce path share one scan."""
    from sluice.filters.chain import FilterChain
    from sluice.filters.config import FilterSpec
    from sluice.proxy.ops.quotas import QuotaRule, Quotas, QuotaSettings

    chain = FilterChain.from_specs(
        [FilterSpec(name="pii", module="builtin:pii-mask", topics=(ORDINARY,),
                    apply_to=frozenset({"produce"}))],
        cache_dir=tmp_path / "cache",
    )
    try:
        ctx = context()
        ctx.chain, ctx.directions = chain, frozenset({"produce"})
        path = InternalTopicsPath([ProducePath()])
        frame = produce_frame(ORDINARY, make_batch([b'{"email": "ann@example.com"}']))
        exchange = exchange_for(frame)
        quotas = Quotas(1)
        quotas.update(QuotaSettings((QuotaRule("t", topic=ORDINARY, produce=1e9),)))
        quotas.produce(None, "c", exchange, frame)
        outcome = path.on_request(ctx, exchange, frame)
        while type(outcome).__name__ == "Defer":
            outcome = outcome.job.finish(outcome.job.run())  # type: ignore[union-attr]
        assert type(outcome) is Forward and outcome.frame is not None
        assert parses == Counter(scan_layout=1), parses
    finally:
        chain.close()


@pytest.mark.parametrize(("value", "recounts"), [(b'{"note": "hi"}', 0),
                                                 (b'{"email": "ann@example.com"}', 0)],
                         ids=["unchanged", "masked"])
def test_fetch_telemetry_reuses_the_pipelines_count(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Any, value: bytes, recounts: int
) -> None:
    """The record_batch event's counts and offsets come from the split the pipeline made,
    the output's count too: records the filters changed (new batches) are not split again."""
    from sluice.filters.chain import FilterChain
    from sluice.filters.config import FilterSpec
    from sluice.proxy.paths import fetch
    from tests.proxy.paths.test_paths import (
        Letters,
        ListSink,
        fetch_exchange,
        fetch_response,
        run,
    )
    from tests.proxy.paths.test_paths import context as paths_context

    splits: Counter[str] = Counter()
    for name in ("count_records", "offset_range"):
        real = getattr(fetch, name)

        def counted(*args: Any, _real: Any = real, _name: str = name) -> Any:
            splits[_name] += 1
            return _real(*args)

        monkeypatch.setattr(fetch, name, counted)
    chain = FilterChain.from_specs(
        [FilterSpec(name="pii", module="builtin:pii-mask", topics=("pii.*",),
                    apply_to=frozenset({"fetch"}))],
        cache_dir=tmp_path / "cache",
    )
    try:
        sink = ListSink()
        ctx = paths_context(chain, sink, Letters())
        frame = fetch_response("pii.users", make_batch([value, value]))
        respond = run(fetch.FetchPath().on_response(ctx, fetch_exchange(), frame))
        assert respond.on_sent is not None
        respond.on_sent(sink.recorder)
        (event,) = sink.events
        assert (event["records_in"], event["records_out"]) == (2, 2)
        assert (event["offset_first"], event["offset_last"]) == (0, 1)
        assert sum(splits.values()) == recounts, splits
    finally:
        chain.close()
