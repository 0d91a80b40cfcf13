"""Prometheus metrics and the `/metrics`, `/healthz`, `/readyz` HTTP endpoint.

The data path only bumps plain Python integers (one dict lookup per request keyed by
``api_key << 16 | version``, no locks, no label resolution); the numbers are turned into
Prometheus metric families when something scrapes `/metrics`. The proxy runs on one event loop
thread, so these counters need no locking; the exposition reads them from the same loop.
"""

from __future__ import annotations

import asyncio
from bisect import bisect_left
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from sluice.codec.messages import ApiKey
from sluice.proxy.telemetry.logs import log

if TYPE_CHECKING:
    from sluice.filters.chain import FilterStats

#: Upper bounds (seconds) of the request latency histogram buckets.
LATENCY_BUCKETS = (
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
)
_DECISIONS = ("kept", "rewritten", "dropped", "rejected")


class Histogram:
    """Bucket counts and a sum; `observe` is a bisect and two additions."""

    __slots__ = ("counts", "sum")

    def __init__(self) -> None:
        self.counts = [0] * (len(LATENCY_BUCKETS) + 1)
        self.sum = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect_left(LATENCY_BUCKETS, value)] += 1
        self.sum += value

    def cumulative(self) -> list[tuple[str, float]]:
        out: list[tuple[str, float]] = []
        running = 0
        for bound, count in zip((*LATENCY_BUCKETS, float("inf")), self.counts, strict=True):
            running += count
            out.append(("+Inf" if bound == float("inf") else repr(bound), float(running)))
        return out


_SASL_MECHANISMS = frozenset(
    {"PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "GSSAPI", "OAUTHBEARER"}
)


@dataclass(slots=True)
class FilterCounters:
    batches: int = 0
    kept: int = 0
    rewritten: int = 0
    dropped: int = 0
    rejected: int = 0
    time_ns: int = 0
    failures: int = 0


@dataclass
class Metrics:
    """Everything the proxy counts. Cheap to update; exposed by `collector()`."""

    connections_total: int = 0
    connections_rejected: int = 0
    connections_idle_closed: int = 0
    protocol_violations: int = 0
    requests: dict[int, list[int]] = field(default_factory=dict)  # key -> [count, bytes]
    responses: dict[int, list[int]] = field(default_factory=dict)
    latency: dict[int, Histogram] = field(default_factory=dict)
    #: (key << 16 | version) -> its API key's histogram in `latency`, set with its
    #: `responses` entry (the connection reads both: one call less per response).
    latency_of: dict[int, Histogram] = field(default_factory=dict, repr=False)
    filters: dict[str, FilterCounters] = field(default_factory=dict)
    sasl_outcomes: dict[tuple[str, str], int] = field(default_factory=dict)
    #: api key -> request items naming the proxy's own topics, refused (paths/internal_topics)
    internal_refusals: dict[int, int] = field(default_factory=dict)
    active_connections: Callable[[], int] = lambda: 0
    sink_stats: Callable[[], dict[str, Any]] | None = None
    #: DeadLetterWriter.stats (produced, failed, dropped, lost_at_shutdown, queued, queued_bytes)
    dead_letter_stats: Callable[[], dict[str, int]] | None = None
    #: (filter jobs run inline on the loop, filter jobs handed to the pool): JobPlacement
    job_placement: Callable[[], tuple[int, int]] | None = None
    #: Quotas.stats: (rule name, direction, this worker's limit or None, counters with
    #: bytes, throttled, throttle_ms); labels are bounded by the config's rule names.
    quota_stats: Callable[[], list[tuple[str, str, float | None, Any]]] | None = None
    #: Fleet records refused (unsigned, untrusted key, bad signature...), by reason.
    fleet_refused: dict[str, int] = field(default_factory=dict)
    #: Times the fleet topic vanished, was recreated or truncated under this proxy.
    fleet_lost: int = 0
    #: Filtered Fetch responses whose partitions ran on several filter threads at once.
    fetch_spread: int = 0
    #: Filter jobs of Produce requests started while an earlier request of the same connection
    #: was still in its job (`Job.overlap`, proxy.spread_produce).
    produce_overlapped: int = 0
    ready: bool = False
    worker: str = "0"

    # ---------------------------------------------------------------- data path
    def request(self, api_key: int, version: int, size: int) -> None:
        key = api_key << 16 | version
        slot = self.requests.get(key)
        if slot is None:
            slot = self.requests[key] = [0, 0]
        slot[0] += 1
        slot[1] += size

    def response(self, api_key: int, version: int, size: int, seconds: float) -> None:
        key = api_key << 16 | version
        slot = self.responses.get(key)
        if slot is None:
            slot = self.responses[key] = [0, 0]
            self.latency_of[key] = self.latency.setdefault(api_key, Histogram())
        slot[0] += 1
        slot[1] += size
        hist = self.latency_of[key]
        hist.counts[bisect_left(LATENCY_BUCKETS, seconds)] += 1
        hist.sum += seconds

    def filter_stats(self, stats: Iterable[FilterStats]) -> None:
        for st in stats:
            c = self.filters.get(st.name)
            if c is None:
                c = self.filters[st.name] = FilterCounters()
            c.batches += 1
            c.kept += st.kept
            c.rewritten += st.rewritten
            c.dropped += st.dropped
            c.rejected += st.rejected
            c.time_ns += st.time_ns
            c.failures += st.errors

    def fleet_record_refused(self, reason: str) -> None:
        # `reason` is one of fleet.REFUSAL_REASONS: a bounded label set.
        self.fleet_refused[reason] = self.fleet_refused.get(reason, 0) + 1

    def fleet_topic_lost(self) -> None:
        self.fleet_lost += 1

    def sasl(self, mechanism: str | None, result: str) -> None:
        # The mechanism name comes from the client: only known names become label values.
        name = mechanism if mechanism in _SASL_MECHANISMS else ("other" if mechanism else "unknown")
        key = (name, result)
        self.sasl_outcomes[key] = self.sasl_outcomes.get(key, 0) + 1

    def internal_refused(self, api_key: int, items: int) -> None:
        self.internal_refusals[api_key] = self.internal_refusals.get(api_key, 0) + items

    # ---------------------------------------------------------------- exposition
    def collector(self) -> Any:
        return _Collector(self)


def _api_name(api_key: int) -> str:
    try:
        return ApiKey(api_key).name.lower()
    except ValueError:
        return f"api_{api_key}"


class _Collector:
    def __init__(self, metrics: Metrics) -> None:
        self.m = metrics

    def describe(self) -> list[Any]:
        return []

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import (
            CounterMetricFamily,
            GaugeMetricFamily,
            HistogramMetricFamily,
        )

        m = self.m
        yield GaugeMetricFamily(
            "sluice_ready", "1 once the listeners accept connections", value=int(m.ready)
        )
        yield GaugeMetricFamily(
            "sluice_connections_active", "Open client connections", value=m.active_connections()
        )
        yield CounterMetricFamily(
            "sluice_connections", "Client connections accepted", value=m.connections_total
        )
        yield CounterMetricFamily(
            "sluice_connections_rejected",
            "Connections closed on accept because limits.max_connections was reached",
            value=m.connections_rejected,
        )
        yield CounterMetricFamily(
            "sluice_connections_idle_closed",
            "Connections closed after limits.idle_timeout_seconds without traffic",
            value=m.connections_idle_closed,
        )
        yield CounterMetricFamily(
            "sluice_protocol_violations",
            "Connections closed because a frame could not be decoded or relayed safely",
            value=m.protocol_violations,
        )
        for name, table, what in (
            ("sluice_requests", m.requests, "Requests from clients"),
            ("sluice_responses", m.responses, "Responses to clients"),
        ):
            count = CounterMetricFamily(
                name, f"{what}, by API and version", labels=("api", "version")
            )
            size = CounterMetricFamily(
                f"{name[:-1]}_bytes",
                f"Bytes of {what.lower()} (frame bodies)",
                labels=("api", "version"),
            )
            for key, (n, nbytes) in sorted(table.items()):
                labels = [_api_name(key >> 16), str(key & 0xFFFF)]
                count.add_metric(labels, n)
                size.add_metric(labels, nbytes)
            yield count
            yield size
        hist = HistogramMetricFamily(
            "sluice_request_latency_seconds",
            "Time from a request's arrival to its response being ready, by API",
            labels=("api",),
        )
        for api_key, h in sorted(m.latency.items()):
            hist.add_metric([_api_name(api_key)], h.cumulative(), h.sum)
        yield hist
        decisions = CounterMetricFamily(
            "sluice_filter_records", "Records by filter and decision", labels=("filter", "decision")
        )
        batches = CounterMetricFamily(
            "sluice_filter_batches", "Record batches a filter ran on", labels=("filter",)
        )
        seconds = CounterMetricFamily(
            "sluice_filter_seconds", "Time spent inside a filter", labels=("filter",)
        )
        failures = CounterMetricFamily(
            "sluice_filter_failures",
            "Filter invocations that failed (trap, timeout, bad output)",
            labels=("filter",),
        )
        for name, c in sorted(m.filters.items()):
            for decision in _DECISIONS:
                decisions.add_metric([name, decision], getattr(c, decision))
            batches.add_metric([name], c.batches)
            seconds.add_metric([name], c.time_ns / 1e9)
            failures.add_metric([name], c.failures)
        yield from (decisions, batches, seconds, failures)
        sasl = CounterMetricFamily(
            "sluice_sasl_authentications",
            "SASL exchanges seen passing through, by mechanism and broker verdict",
            labels=("mechanism", "result"),
        )
        for (mechanism, result), n in sorted(m.sasl_outcomes.items()):
            sasl.add_metric([mechanism, result], n)
        yield sasl
        refused = CounterMetricFamily(
            "sluice_fleet_records_refused",
            "Fleet records refused and ignored (unsigned, untrusted_key, bad_signature, "
            "unreadable, replay, invalid_name)",
            labels=("reason",),
        )
        for reason, n in sorted(m.fleet_refused.items()):
            refused.add_metric([reason], n)
        yield refused
        yield CounterMetricFamily(
            "sluice_fleet_topic_lost",
            "Times the fleet topic vanished, was recreated or lost the records in force "
            "(the last verified state stays in force)",
            value=m.fleet_lost,
        )
        refusals = CounterMetricFamily(
            "sluice_internal_topic_refusals",
            "Request items naming the proxy's own topics, answered TOPIC_AUTHORIZATION_FAILED",
            labels=("api",),
        )
        for api_key, n in sorted(m.internal_refusals.items()):
            refusals.add_metric([_api_name(api_key)], n)
        yield refusals
        yield from _sink_families(m.sink_stats)
        yield from _dead_letter_families(m.dead_letter_stats)
        if m.job_placement is not None:
            inline, pool = m.job_placement()
            jobs = CounterMetricFamily(
                "sluice_filter_jobs",
                "Filter jobs by where they ran (inline: small jobs of kinds that proved fast)",
                labels=("where",),
            )
            jobs.add_metric(["inline"], inline)
            jobs.add_metric(["pool"], pool)
            yield jobs
        yield CounterMetricFamily(
            "sluice_fetch_spread_responses",
            "Filtered Fetch responses whose partitions ran on several filter threads at once",
            value=m.fetch_spread,
        )
        yield CounterMetricFamily(
            "sluice_produce_overlapped_jobs",
            "Produce filter jobs started while an earlier request of the connection was in its "
            "job",
            value=m.produce_overlapped,
        )
        yield from _quota_families(m.quota_stats)


def _quota_families(
    stats_of: Callable[[], list[tuple[str, str, float | None, Any]]] | None,
) -> Iterator[Any]:
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

    labels = ("quota", "direction")
    limit = GaugeMetricFamily(
        "sluice_quota_limit_bytes_per_second",
        "This worker's share of a quota rule's rate (the rule's rate / --workers)",
        labels=labels,
    )
    counted = CounterMetricFamily(
        "sluice_quota_bytes", "Bytes counted against a quota rule", labels=labels
    )
    throttled = CounterMetricFamily(
        "sluice_quota_throttled",
        "Requests (produce) or responses (fetch) a quota rule throttled (the longest wait won)",
        labels=labels,
    )
    seconds = CounterMetricFamily(
        "sluice_quota_throttle_seconds",
        "Throttle time a quota rule gave clients",
        labels=labels,
    )
    for name, direction, rate, c in stats_of() if stats_of is not None else ():
        if rate is not None:
            limit.add_metric([name, direction], rate)
        counted.add_metric([name, direction], c.bytes)
        throttled.add_metric([name, direction], c.throttled)
        seconds.add_metric([name, direction], c.throttle_ms / 1000)
    yield from (limit, counted, throttled, seconds)


def _sink_families(sink_stats: Callable[[], dict[str, Any]] | None) -> Iterator[Any]:
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

    stats: dict[str, Any] = {}
    if sink_stats is not None:
        try:
            stats = sink_stats()
        except Exception as exc:  # a broken sink must not break the scrape
            log.warning("metrics_sink_stats_failed", error=repr(exc))
    yield CounterMetricFamily(
        "sluice_telemetry_events_emitted",
        "Telemetry events handed to the sink",
        value=int(stats.get("emitted", 0)),
    )
    yield CounterMetricFamily(
        "sluice_telemetry_events_written",
        "Telemetry events the sink wrote",
        value=int(stats.get("written", 0)),
    )
    dropped = CounterMetricFamily(
        "sluice_telemetry_events_dropped", "Telemetry events lost, by reason", labels=("reason",)
    )
    if "dropped_queue_full" in stats or "dropped_sink_error" in stats:
        dropped.add_metric(["queue_full"], int(stats.get("dropped_queue_full", 0)))
        dropped.add_metric(["sink_error"], int(stats.get("dropped_sink_error", 0)))
    else:
        dropped.add_metric(["any"], int(stats.get("dropped", 0)))
    yield dropped
    yield GaugeMetricFamily(
        "sluice_telemetry_queue_depth",
        "Telemetry events waiting to be written",
        value=int(stats.get("queued", 0)) + int(stats.get("in_flight", 0)),
    )


#: Outcomes of a dead letter, as `sluice_dead_letters_total{outcome}` labels them.
DEAD_LETTER_OUTCOMES = ("produced", "failed", "dropped", "lost_at_shutdown")


def _dead_letter_families(stats_of: Callable[[], dict[str, int]] | None) -> Iterator[Any]:
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

    stats: dict[str, int] = {}
    if stats_of is not None:
        try:
            stats = stats_of()
        except Exception as exc:  # must not break the scrape
            log.warning("metrics_dead_letter_stats_failed", error=repr(exc))
    total = CounterMetricFamily(
        "sluice_dead_letters", "Dead letters by outcome", labels=("outcome",)
    )
    for outcome in DEAD_LETTER_OUTCOMES:
        total.add_metric([outcome], int(stats.get(outcome, 0)))
    yield total
    yield GaugeMetricFamily(
        "sluice_dead_letters_queued",
        "Dead letters waiting for the broker (queued or being sent)",
        value=int(stats.get("queued", 0)),
    )
    yield GaugeMetricFamily(
        "sluice_dead_letters_queued_bytes",
        "Bytes of dead letters waiting for the broker (bounded by dead_letters.max_queued_bytes)",
        value=int(stats.get("queued_bytes", 0)),
    )


# ------------------------------------------------------------------ HTTP endpoint


class MetricsServer:
    """`/metrics`, `/healthz` and `/readyz` on the proxy's own event loop."""

    def __init__(self, metrics: Metrics, host: str, port: int) -> None:
        from prometheus_client import CollectorRegistry

        self.metrics = metrics
        self.host = host
        self.port = port
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(metrics.collector())
        self._server: asyncio.Server | None = None

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._handle, self.host, self.port)
        sock = self._server.sockets[0]
        self.port = int(sock.getsockname()[1])
        log.info("metrics_serving", address=f"{self.host}:{self.port}")

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    def render(self, path: str) -> tuple[int, str, bytes]:
        from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

        path = path.split("?", 1)[0]
        if path == "/metrics":
            return 200, CONTENT_TYPE_LATEST, generate_latest(self.registry)
        if path == "/healthz":
            return 200, "text/plain; charset=utf-8", b"ok\n"
        if path == "/readyz":
            if self.metrics.ready:
                return 200, "text/plain; charset=utf-8", b"ready\n"
            return 503, "text/plain; charset=utf-8", b"not ready\n"
        return 404, "text/plain; charset=utf-8", b"not found\n"

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
            method, _, rest = head.decode("latin-1").partition(" ")
            path = rest.split(" ", 1)[0]
            if method not in ("GET", "HEAD"):
                status, ctype, body = 405, "text/plain; charset=utf-8", b"method not allowed\n"
            else:
                status, ctype, body = self.render(path)
            reason = {200: "OK", 404: "Not Found", 405: "Method Not Allowed"}.get(
                status, "Service Unavailable"
            )
            writer.write(
                f"HTTP/1.1 {status} {reason}\r\nContent-Type: {ctype}\r\n"
                f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode("latin-1")
            )
            if method != "HEAD":
                writer.write(body)
            await writer.drain()
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, TimeoutError, OSError):
            pass
        finally:
            writer.close()


def parse_listen(value: Any) -> tuple[str, int]:
    """`metrics.listen` as (host, port); raises ValueError with a readable reason."""
    from sluice.proxy.net.hostport import parse_hostport

    if not isinstance(value, str):
        raise ValueError("must be HOST:PORT")
    return parse_hostport(value, "metrics.listen")
