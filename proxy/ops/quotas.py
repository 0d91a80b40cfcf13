"""Byte-rate quotas: the `quotas:` config section and the throttle decision per request.

A rule matches clients by principal and/or client id (shell-style patterns) and optionally
restricts itself to topics, and caps produce and/or fetch bytes per second. Semantics
(docs/QUOTAS.md has the long form):

- **Every matching rule applies**; a client over several is held back for the longest of the
  throttle times they give (no precedence to learn: a narrower rule simply adds a cap).
- **Who shares a budget.** A rule's budget is shared by all traffic that has the same values
  of the fields the rule names: ``client_id: "batch-*"`` gives each matching client id its own
  budget (all its connections share it, as in Kafka); ``principal: "User:alice"`` shares one
  among all of alice's connections; a rule naming no field caps the whole proxy; with
  ``topic:``, each matching topic has its own budget (per client too, if the rule names one).
- **What is counted.** Produce: the request frame's bytes (with ``topic:``, the record bytes
  of the matching topics). Fetch: the response frame's bytes (with ``topic:``, the record
  bytes of the matching topics). As in Kafka, produce is counted when the request is read and
  fetch when the broker's response arrives.
- **The algorithm.** A token bucket per budget, refilled at the quota, holding at most
  ``burst_seconds`` of it (default 11 s: Kafka's 11 samples x 1 s window), which may go
  negative; a request that leaves it negative gets ``throttle = deficit / quota`` (at most
  ``max_throttle_ms``; the rest of the deficit carries over to the next request). Kafka's own
  client quotas use a sampled rate, which lets one large sample hold the average above the
  quota until it expires and then allows a burst (Kafka's `TokenBucket`, KIP-599, was written
  for that reason); a bucket keeps a continuously over-quota client at the quota, smoothly.
- **Across `--workers N`: divided.** Each worker enforces quota / N (and burst / N): with
  SO_REUSEPORT a client's connections spread over the workers, so a client with many
  connections gets about the quota; a client with one connection lands on one worker and gets
  quota / N. Nothing is shared between processes, so nothing on the data path waits on them.

`Quotas` is per process and lives on the event loop; it is asked only while some rule is
configured (`active`), so a proxy without quotas pays one attribute test per request.
"""

from __future__ import annotations

import math
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from fnmatch import fnmatchcase
from typing import Any

from sluice.codec.errors import CodecError
from sluice.codec.headers import RequestHeader, response_header_size
from sluice.codec.messages import ApiKey, decode_response
from sluice.filters.principal import ANONYMOUS
from sluice.filters.yaml_lines import LineMap
from sluice.proxy.contract import ProduceRequest

PRODUCE = int(ApiKey.PRODUCE)
FETCH = int(ApiKey.FETCH)
DIRECTIONS = ("produce", "fetch")

_SECTION_KEYS = ("rules", "burst_seconds", "max_throttle_ms")
_RULE_KEYS = (
    "name",
    "principal",
    "client_id",
    "topic",
    "produce_bytes_per_second",
    "fetch_bytes_per_second",
)
#: Kafka's quota.window.num (11) x quota.window.size.seconds (1).
DEFAULT_BURST_SECONDS = 11.0
#: Longest single throttle; a longer deficit is carried over to the next request, so that a
#: client's requests waiting in its socket never reach its request timeout (30 s by default).
DEFAULT_MAX_THROTTLE_MS = 5000
#: Budgets idle this long beyond a full bucket are forgotten (bounds memory: client ids come
#: from clients).
_SWEEP_SECONDS = 60.0
_MATCH_CACHE = 4096


@dataclass(frozen=True, slots=True)
class QuotaRule:
    """One entry of `quotas.rules` (rates in bytes per second for the whole proxy)."""

    name: str
    principal: str | None = None
    client_id: str | None = None
    topic: str | None = None
    produce: float | None = None
    fetch: float | None = None

    def rate(self, direction: str) -> float | None:
        return self.produce if direction == "produce" else self.fetch

    def matches_client(self, principal: str | None, client_id: str | None) -> bool:
        # No SASL or certificate: Kafka's User:ANONYMOUS, as for filters and data policies.
        if self.principal is not None and not fnmatchcase(principal or ANONYMOUS, self.principal):
            return False
        return self.client_id is None or fnmatchcase(client_id or "", self.client_id)

    def client_key(self, principal: str | None, client_id: str | None) -> tuple[str, ...]:
        """The values of the client fields this rule names: its budget is shared by them."""
        key: tuple[str, ...] = ()
        if self.principal is not None:
            key += (principal or ANONYMOUS,)
        if self.client_id is not None:
            key += (client_id or "",)
        return key


@dataclass(frozen=True, slots=True)
class QuotaSettings:
    """The `quotas:` section."""

    rules: tuple[QuotaRule, ...] = ()
    burst_seconds: float = DEFAULT_BURST_SECONDS
    max_throttle_ms: int = DEFAULT_MAX_THROTTLE_MS


def parse_quotas(raw: Any, lines: LineMap) -> QuotaSettings:
    """The `quotas:` section; raises ConfigError naming the file, line and field."""
    if raw is None:
        return QuotaSettings()
    if not isinstance(raw, dict):
        raise lines.error(("quotas",), "must be a mapping")
    for key in raw:
        if key not in _SECTION_KEYS:
            raise lines.error(
                ("quotas", key), f"unknown key (expected one of {', '.join(_SECTION_KEYS)})"
            )
    burst = raw.get("burst_seconds", DEFAULT_BURST_SECONDS)
    if isinstance(burst, bool) or not isinstance(burst, int | float) or not burst > 0:
        raise lines.error(("quotas", "burst_seconds"), f"must be a number > 0, got {burst!r}")
    max_ms = raw.get("max_throttle_ms", DEFAULT_MAX_THROTTLE_MS)
    if isinstance(max_ms, bool) or not isinstance(max_ms, int) or not 1 <= max_ms <= 300_000:
        raise lines.error(
            ("quotas", "max_throttle_ms"), f"must be an integer 1..300000, got {max_ms!r}"
        )
    items = raw.get("rules") or []
    if not isinstance(items, list):
        raise lines.error(("quotas", "rules"), "must be a list of rules")
    rules: list[QuotaRule] = []
    names: set[str] = set()
    for i, item in enumerate(items):
        at: tuple[str | int, ...] = ("quotas", "rules", i)
        if not isinstance(item, dict):
            raise lines.error(at, "must be a mapping")
        for key in item:
            if key not in _RULE_KEYS:
                raise lines.error(
                    (*at, key), f"unknown key (expected one of {', '.join(_RULE_KEYS)})"
                )
        name = item.get("name", f"rules[{i}]")
        if not isinstance(name, str) or not name:
            raise lines.error((*at, "name"), f"must be a non-empty string, got {name!r}")
        if name in names:
            raise lines.error((*at, "name"), f"duplicate rule name {name!r}")
        names.add(name)
        patterns: dict[str, str | None] = {}
        for key in ("principal", "client_id", "topic"):
            value = item.get(key)
            if value is not None and (not isinstance(value, str) or not value):
                raise lines.error((*at, key), f"must be a non-empty pattern, got {value!r}")
            patterns[key] = value
        rates: dict[str, float | None] = {}
        for direction in DIRECTIONS:
            key = f"{direction}_bytes_per_second"
            value = item.get(key)
            if value is not None and (
                isinstance(value, bool) or not isinstance(value, int | float) or not value > 0
            ):
                raise lines.error((*at, key), f"must be a number > 0, got {value!r}")
            rates[direction] = None if value is None else float(value)
        if rates["produce"] is None and rates["fetch"] is None:
            raise lines.error(
                at, "names no limit (set produce_bytes_per_second and/or fetch_bytes_per_second)"
            )
        rules.append(
            QuotaRule(
                name,
                patterns["principal"],
                patterns["client_id"],
                patterns["topic"],
                rates["produce"],
                rates["fetch"],
            )
        )
    return QuotaSettings(tuple(rules), float(burst), max_ms)


class TokenBucket:
    """Bytes allowed at `rate` per second with at most `burst` saved up; may go negative."""

    __slots__ = ("burst", "last", "rate", "tokens")

    def __init__(self, rate: float, burst: float, now: float) -> None:
        self.rate = rate
        self.burst = burst
        self.tokens = burst  # a new client starts with a full bucket, like an empty window
        self.last = now

    def take(self, amount: int, now: float) -> float:
        """Count `amount` bytes at `now`; returns the seconds until the bucket is back at
        zero (0.0 while it is not negative)."""
        elapsed = now - self.last
        if elapsed > 0:
            self.tokens = min(self.burst, self.tokens + elapsed * self.rate)
            self.last = now
        self.tokens -= amount
        return -self.tokens / self.rate if self.tokens < 0 else 0.0

    def idle(self, now: float) -> bool:
        """Full again (nothing owed, nothing to remember)."""
        return self.tokens + (now - self.last) * self.rate >= self.burst


@dataclass(slots=True)
class QuotaCounters:
    """Per rule and direction, for /metrics (labels bounded by the config's rule names)."""

    bytes: int = 0
    throttled: int = 0  # requests (produce) or responses (fetch) given a throttle time
    throttle_ms: int = 0


# (rule, client key) pairs of one client for one direction: rules counting whole frames, and
# rules counting the bytes of matching topics.
_Matches = tuple[tuple[tuple[QuotaRule, tuple[str, ...]], ...], ...]


class Quotas:
    """The throttle decisions of one process (see the module docstring)."""

    def __init__(
        self,
        workers: int = 1,
        topic_name: Callable[[uuid.UUID], str | None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.workers = max(1, workers)
        self.settings = QuotaSettings()
        self.active = False
        self.counters: dict[tuple[str, str], QuotaCounters] = {}
        self._topic_name = topic_name or (lambda _id: None)
        self._clock = clock
        self._buckets: dict[tuple[Any, ...], TokenBucket] = {}
        self._matches: dict[tuple[str | None, str | None, int], _Matches] = {}
        self._next_sweep = 0.0

    # ------------------------------------------------------------------ configuration
    def update(self, settings: QuotaSettings) -> None:
        """Install new rules (start-up, reload). Budgets of rules that kept their name and
        match fields keep what they owe; the others start full."""
        by_ident = {(r.name, r.principal, r.client_id, r.topic): r for r in settings.rules}
        kept: dict[tuple[Any, ...], TokenBucket] = {}
        for bucket_key, bucket in self._buckets.items():
            rule = by_ident.get(bucket_key[0])
            rate = rule.rate(bucket_key[1]) if rule is not None else None
            if rate is None:
                continue
            bucket.rate = rate / self.workers
            bucket.burst = bucket.rate * settings.burst_seconds
            bucket.tokens = min(bucket.tokens, bucket.burst)
            kept[bucket_key] = bucket
        self._buckets = kept
        self.settings = settings
        self._matches.clear()
        for rule in settings.rules:
            for direction in DIRECTIONS:
                if rule.rate(direction) is not None:
                    self.counters.setdefault((rule.name, direction), QuotaCounters())
        self.active = bool(settings.rules)

    def limit(self, rule: QuotaRule, direction: str) -> float | None:
        """This worker's share of a rule's rate (bytes per second)."""
        rate = rule.rate(direction)
        return None if rate is None else rate / self.workers

    # ------------------------------------------------------------------ decisions
    def produce(self, principal: str | None, client_id: str | None,
                request: ProduceRequest, frame: bytes | memoryview) -> float:
        """A Produce request was read: count it; returns the monotonic time until which the
        client is held back (0.0: not throttled)."""
        plain, by_topic = self._for(principal, client_id, 0)
        if not plain and not by_topic:
            return 0.0
        topics: dict[str, int] = {}
        if by_topic:
            topics = self._produce_topics(request, frame)
        return self._charge("produce", plain, by_topic, len(frame), topics)

    def fetch(self, principal: str | None, client_id: str | None,
              header: RequestHeader, frame: bytes | memoryview) -> float:
        """A Fetch response arrived from the broker: count it; as `produce`."""
        plain, by_topic = self._for(principal, client_id, 1)
        if not plain and not by_topic:
            return 0.0
        topics: dict[str, int] = {}
        if by_topic:
            topics = self._fetch_topics(header, frame)
        return self._charge("fetch", plain, by_topic, len(frame), topics)

    def _for(self, principal: str | None, client_id: str | None, which: int) -> _Matches:
        cache_key = (principal, client_id, which)
        found = self._matches.get(cache_key)
        if found is not None:
            return found
        direction = DIRECTIONS[which]
        plain: list[tuple[QuotaRule, tuple[str, ...]]] = []
        by_topic: list[tuple[QuotaRule, tuple[str, ...]]] = []
        for rule in self.settings.rules:
            if rule.rate(direction) is None or not rule.matches_client(principal, client_id):
                continue
            pair = (rule, rule.client_key(principal, client_id))
            (by_topic if rule.topic is not None else plain).append(pair)
        if len(self._matches) >= _MATCH_CACHE:
            self._matches.clear()
        found = self._matches[cache_key] = (tuple(plain), tuple(by_topic))
        return found

    def _charge(
        self,
        direction: str,
        plain: tuple[tuple[QuotaRule, tuple[str, ...]], ...],
        by_topic: tuple[tuple[QuotaRule, tuple[str, ...]], ...],
        size: int,
        topics: dict[str, int],
    ) -> float:
        now = self._clock()
        worst = 0.0
        worst_rule: QuotaRule | None = None
        for rule, key in plain:
            wait = self._take(rule, direction, key, size, now)
            if wait > worst:
                worst, worst_rule = wait, rule
        for rule, key in by_topic:
            pattern = rule.topic
            assert pattern is not None
            for topic, amount in topics.items():
                if fnmatchcase(topic, pattern):
                    wait = self._take(rule, direction, (*key, topic), amount, now)
                    if wait > worst:
                        worst, worst_rule = wait, rule
        if now >= self._next_sweep:
            self._sweep(now)
        if worst_rule is None:
            return 0.0
        wait = min(worst, self.settings.max_throttle_ms / 1000)
        counters = self.counters[(worst_rule.name, direction)]
        counters.throttled += 1
        counters.throttle_ms += math.ceil(wait * 1000)
        return now + wait

    def _take(
        self, rule: QuotaRule, direction: str, key: tuple[str, ...], amount: int, now: float
    ) -> float:
        bucket_key = ((rule.name, rule.principal, rule.client_id, rule.topic), direction, key)
        bucket = self._buckets.get(bucket_key)
        if bucket is None:
            rate = self.limit(rule, direction)
            assert rate is not None
            bucket = self._buckets[bucket_key] = TokenBucket(
                rate, rate * self.settings.burst_seconds, now
            )
        self.counters[(rule.name, direction)].bytes += amount
        return bucket.take(amount, now)

    def _sweep(self, now: float) -> None:
        self._next_sweep = now + _SWEEP_SECONDS
        self._buckets = {k: b for k, b in self._buckets.items() if not b.idle(now)}

    # ------------------------------------------------------------------ topic bytes
    def _produce_topics(
        self, request: ProduceRequest, frame: bytes | memoryview
    ) -> dict[str, int]:
        """Record bytes per topic name of a Produce request (topic ids the proxy has not
        learnt are not counted against topic rules); the layout is the request's one parse,
        which the Produce path reuses."""
        try:
            layout = request.produce_layout(frame)
        except CodecError:
            return {}  # the produce path refuses it; nothing to count
        out: dict[str, int] = {}
        for t in layout.topics:
            name = t.name if t.name is not None else self._topic_name(t.topic_id)  # type: ignore[arg-type]
            if name is None:
                continue
            size = sum(len(p.records) for p in t.partitions if p.records is not None)
            out[name] = out.get(name, 0) + size
        return out

    def _fetch_topics(self, header: RequestHeader, frame: bytes | memoryview) -> dict[str, int]:
        """Record bytes per topic name of a Fetch response (decoded: only while a fetch rule
        names topics)."""
        try:
            size = response_header_size(frame, header.api_key, header.api_version)
            response = decode_response(header.api_key, header.api_version, frame[size:])
        except CodecError:
            return {}  # relayed or refused by the fetch path; nothing to count
        out: dict[str, int] = {}
        for t in response.responses:
            name = getattr(t, "topic", None) or self._topic_name(getattr(t, "topic_id", None))  # type: ignore[arg-type]
            if not name:
                continue
            size = sum(len(p.records) for p in t.partitions if p.records)
            out[name] = out.get(name, 0) + size
        return out

    # ------------------------------------------------------------------ exposition
    def stats(self) -> list[tuple[str, str, float | None, QuotaCounters]]:
        """(rule, direction, this worker's limit or None if the rule is gone, counters)."""
        rules = {r.name: r for r in self.settings.rules}
        out = []
        for (name, direction), counters in sorted(self.counters.items()):
            rule = rules.get(name)
            out.append((name, direction, self.limit(rule, direction) if rule else None, counters))
        return out
