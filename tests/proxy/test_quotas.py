"""Quota rules and the throttle decision (proxy/ops/quotas.py): the `quotas:` section's
errors, the token bucket's math, who shares a budget, every matching rule applying, topic
rules, reload keeping debts, and the division across workers."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sluice.codec.headers import parse_request_header, request_header_bytes
from sluice.codec.messages import encode_request
from sluice.filters.yaml_lines import ConfigError, load_yaml_text_with_lines
from sluice.proxy.contract import ClientInfo
from sluice.proxy.ops.config import ConfigFileError, ProxyConfig
from sluice.proxy.ops.config_load import load_config_file
from sluice.proxy.ops.quotas import QuotaRule, Quotas, QuotaSettings, TokenBucket, parse_quotas
from sluice.proxy.paths.base import Exchange
from tests.codec.test_codec_produce_splice import build


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def parse(text: str) -> QuotaSettings:
    data, lines = load_yaml_text_with_lines(text, "sluice.yaml")
    return parse_quotas(data.get("quotas"), lines)


def produce_frame(size: int) -> tuple[Exchange, bytes]:
    frame = request_header_bytes(0, 9, 1, "c") + b"x" * (size - 12)
    return Exchange(parse_request_header(frame), ClientInfo("c", ("b", 1))), frame


# ------------------------------------------------------------------ config


@pytest.mark.parametrize(
    ("text", "where"),
    [
        ("quotas: [1]", "sluice.yaml:1: quotas: must be a mapping"),
        ("quotas:\n  rulez: []", "sluice.yaml:2: quotas.rulez: unknown key"),
        ("quotas:\n  rules:\n    - client_id: a", "sluice.yaml:3: quotas.rules[0]: names no limit"),
        (
            "quotas:\n  rules:\n    - client_id: a\n      produce_bytes_per_second: -1",
            "sluice.yaml:4: quotas.rules[0].produce_bytes_per_second: must be a number > 0",
        ),
        (
            "quotas:\n  rules:\n    - fetch_bytes_per_second: 5\n      clientid: a",
            "sluice.yaml:4: quotas.rules[0].clientid: unknown key",
        ),
        (
            "quotas:\n  rules:\n    - {name: x, fetch_bytes_per_second: 5}\n"
            "    - {name: x, fetch_bytes_per_second: 6}",
            "sluice.yaml:4: quotas.rules[1].name: duplicate rule name 'x'",
        ),
        ("quotas:\n  burst_seconds: 0", "sluice.yaml:2: quotas.burst_seconds: must be a number"),
        ("quotas:\n  max_throttle_ms: 1.5", "sluice.yaml:2: quotas.max_throttle_ms: must be an"),
        (
            "quotas:\n  rules:\n    - {topic: '', fetch_bytes_per_second: 5}",
            "sluice.yaml:3: quotas.rules[0].topic: must be a non-empty pattern",
        ),
    ],
)
def test_config_errors_name_file_line_and_field(text: str, where: str) -> None:
    with pytest.raises(ConfigError) as err:
        parse(text)
    assert str(err.value).startswith(where), str(err.value)


def test_config_file_section(tmp_path: Path) -> None:
    path = tmp_path / "sluice.yaml"
    path.write_text(
        "quotas:\n  burst_seconds: 2\n  rules:\n"
        "    - name: batch\n      client_id: 'batch-*'\n      produce_bytes_per_second: 1000\n"
    )
    config = load_config_file(path, ProxyConfig(("127.0.0.1", 0), [("127.0.0.1", 1)]))
    assert config.quotas == QuotaSettings(
        (QuotaRule("batch", client_id="batch-*", produce=1000.0),), burst_seconds=2.0
    )
    path.write_text("quotas:\n  rules:\n    - name: 3\n      fetch_bytes_per_second: 1\n")
    with pytest.raises(ConfigFileError, match=r"sluice.yaml:3: quotas.rules\[0\].name"):
        load_config_file(path, ProxyConfig(("127.0.0.1", 0), [("127.0.0.1", 1)]))


# ------------------------------------------------------------------ the bucket


def test_bucket_throttle_is_the_deficit_over_the_rate() -> None:
    bucket = TokenBucket(rate=1000.0, burst=1000.0, now=0.0)
    assert bucket.take(1000, 0.0) == 0.0  # the burst
    assert bucket.take(500, 0.0) == pytest.approx(0.5)
    assert bucket.take(0, 0.25) == pytest.approx(0.25)  # refilled meanwhile
    assert bucket.take(0, 10.0) == 0.0
    assert bucket.tokens == 1000.0, "never more than the burst"


@settings(max_examples=200, deadline=None)
@given(sizes=st.lists(st.integers(1, 50_000), min_size=1, max_size=200))
def test_a_client_that_waits_its_throttle_gets_exactly_the_rate(sizes: list[int]) -> None:
    """A client sending each request once its previous wait is over (as the connection makes
    it) moves at most burst + rate x elapsed bytes, and never waits more than needed."""
    rate, burst = 1000.0, 2000.0
    bucket = TokenBucket(rate, burst, now=0.0)
    now = 0.0
    for size in sizes:
        wait = bucket.take(size, now)
        now += wait
    total = sum(sizes)
    assert total <= burst + rate * now + 1e-6
    # Every wait ends exactly when the bucket is back at zero: the client is not held longer.
    assert now == pytest.approx(max(0.0, (total - burst) / rate), abs=1e-6)


# ------------------------------------------------------------------ decisions


def quotas(rules: list[QuotaRule], workers: int = 1, burst: float = 1.0) -> tuple[Quotas, Clock]:
    clock = Clock()
    q = Quotas(workers, clock=clock)
    q.update(QuotaSettings(tuple(rules), burst_seconds=burst))
    return q, clock


def test_budget_shared_by_the_named_fields_values() -> None:
    q, clock = quotas([QuotaRule("per-client", client_id="app-*", produce=1000.0)])
    header, frame = produce_frame(1500)
    until = q.produce(None, "app-1", header, frame)
    assert until == pytest.approx(clock.now + 0.5)
    # Another client id matching the pattern has its own budget; a connection of the same
    # client id shares app-1's.
    assert q.produce(None, "app-2", header, frame) == pytest.approx(clock.now + 0.5)
    assert q.produce(None, "app-1", header, frame) == pytest.approx(clock.now + 2.0)
    assert q.produce(None, "other", header, frame) == 0.0
    stats = {(n, d): c for n, d, _, c in q.stats()}
    assert stats[("per-client", "produce")].bytes == 4500
    assert stats[("per-client", "produce")].throttled == 3


def test_every_matching_rule_applies_and_the_longest_wait_wins() -> None:
    q, clock = quotas(
        [
            QuotaRule("alice", principal="User:alice", produce=10_000.0),
            QuotaRule("alice-batch", principal="User:alice", client_id="batch", produce=1000.0),
        ]
    )
    header, frame = produce_frame(3000)
    until = q.produce("User:alice", "batch", header, frame)
    assert until == pytest.approx(clock.now + 2.0)  # the narrower rule's wait
    assert q.produce("User:alice", "web", header, frame) == 0.0
    # ... and the shared principal budget saw both.
    stats = {(n, d): c for n, d, _, c in q.stats()}
    assert stats[("alice", "produce")].bytes == 6000


def test_rule_without_fields_caps_the_whole_proxy_and_throttle_is_capped() -> None:
    q, clock = quotas([QuotaRule("all", produce=1000.0)])
    q.settings = QuotaSettings(q.settings.rules, 1.0, max_throttle_ms=1500)
    header, frame = produce_frame(6000)
    assert q.produce(None, "a", header, frame) == pytest.approx(clock.now + 1.5)
    # The rest of the deficit carries over to the next request, of any client.
    clock.now += 1.5
    assert q.produce(None, "b", header, frame) == pytest.approx(clock.now + 1.5)


def test_workers_divide_the_rate() -> None:
    q, clock = quotas([QuotaRule("c", client_id="*", produce=2000.0)], workers=2)
    header, frame = produce_frame(2000)
    # Burst 1 s of 1000 B/s (half of 2000), so 1000 bytes over -> 1 s.
    assert q.produce(None, "a", header, frame) == pytest.approx(clock.now + 1.0)
    assert [(n, d, limit) for n, d, limit, _ in q.stats()] == [("c", "produce", 1000.0)]


def test_topic_rules_count_record_bytes_per_topic() -> None:
    q, clock = quotas([QuotaRule("logs", topic="logs-*", produce=1000.0)])
    entity = build(9, None, 1, [("logs-a", [(0, b"r" * 1500)]), ("other", [(0, b"o" * 9000)])])
    frame = request_header_bytes(0, 9, 1, "c") + encode_request(entity)
    request = Exchange(parse_request_header(frame), ClientInfo("c", ("b", 1)))
    until = q.produce(None, "c", request, frame)
    assert until == pytest.approx(clock.now + 0.5), "only logs-a's 1500 record bytes count"


def test_reload_keeps_debts_of_unchanged_rules_and_drops_removed_ones() -> None:
    q, clock = quotas([QuotaRule("a", client_id="x", produce=1000.0)])
    header, frame = produce_frame(3000)
    q.produce(None, "x", header, frame)
    q.update(QuotaSettings((QuotaRule("a", client_id="x", produce=2000.0),), burst_seconds=1.0))
    # Owes 2000 bytes at the new 2000 B/s: a further 1000 bytes -> 1.5 s.
    header, small = produce_frame(1000)
    assert q.produce(None, "x", header, small) == pytest.approx(clock.now + 1.5)
    q.update(QuotaSettings(()))
    assert not q.active
    assert q.produce(None, "x", header, small) == 0.0


def test_no_rule_for_the_direction_costs_nothing() -> None:
    q, _ = quotas([QuotaRule("f", fetch=10.0)])
    header, frame = produce_frame(100_000)
    assert q.produce(None, "x", header, frame) == 0.0
    assert math.isclose(sum(c.bytes for *_, c in q.stats()), 0)


def test_a_client_without_a_principal_is_user_anonymous_as_for_filters() -> None:
    rule = QuotaRule(name="anon", principal="User:ANONYMOUS", produce=1000.0)
    assert rule.matches_client(None, "app")
    assert not rule.matches_client("User:alice", "app")
    assert rule.client_key(None, "app") == ("User:ANONYMOUS",)
