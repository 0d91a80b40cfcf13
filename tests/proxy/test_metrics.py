"""Prometheus metrics: the counters themselves, the exposition, and `/metrics`, `/healthz`,
`/readyz` of a running proxy under real client traffic."""

from __future__ import annotations

import asyncio
import json
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from sluice.codec.messages import ApiKey
from sluice.filters.chain import FilterStats
from sluice.proxy.ops.config_load import ConfigFileError, build_config
from sluice.proxy.telemetry.metrics import LATENCY_BUCKETS, Metrics, MetricsServer
from tests.e2e.clients import confluent_consume, confluent_produce, create_topic, unique
from tests.harness.ports import free_port
from tests.harness.proxy import SluiceProxy

StartProxy = Callable[..., SluiceProxy]
Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def samples(text: str) -> Samples:
    out: Samples = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def value(found: Samples, name: str, **labels: str) -> float:
    return found.get((name, tuple(sorted(labels.items()))), 0.0)


def total(found: Samples, name: str, **labels: str) -> float:
    want = set(labels.items())
    return sum(v for (n, ls), v in found.items() if n == name and want <= set(ls))


def get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


# ------------------------------------------------------------------ counters (unit)


def test_counters_and_exposition() -> None:
    m = Metrics(active_connections=lambda: 3, sink_stats=lambda: {"emitted": 5, "written": 4})
    for _ in range(3):
        m.request(ApiKey.PRODUCE, 9, 100)
    m.request(ApiKey.FETCH, 12, 50)
    m.response(ApiKey.PRODUCE, 9, 20, 0.002)
    m.response(ApiKey.PRODUCE, 9, 20, 0.5)
    m.response(ApiKey.PRODUCE, 9, 20, 99.0)  # beyond the last bucket
    m.filter_stats(
        [FilterStats("mask", "ab", kept=3, rewritten=2, time_ns=1_500_000_000, errors=1)]
    )
    m.filter_stats([FilterStats("mask", "ab", dropped=1, rejected=4)])
    m.sasl("PLAIN", "ok")
    m.protocol_violations += 1
    registry = CollectorRegistry(auto_describe=False)
    registry.register(m.collector())
    found = samples(generate_latest(registry).decode())
    assert value(found, "sluice_requests_total", api="produce", version="9") == 3
    assert value(found, "sluice_request_bytes_total", api="produce", version="9") == 300
    assert value(found, "sluice_requests_total", api="fetch", version="12") == 1
    assert value(found, "sluice_response_bytes_total", api="produce", version="9") == 60
    assert value(found, "sluice_request_latency_seconds_count", api="produce") == 3
    assert value(found, "sluice_request_latency_seconds_sum", api="produce") == pytest.approx(
        99.502
    )
    assert value(found, "sluice_request_latency_seconds_bucket", api="produce", le="0.0025") == 1
    assert value(found, "sluice_request_latency_seconds_bucket", api="produce", le="0.5") == 2
    assert value(found, "sluice_request_latency_seconds_bucket", api="produce", le="30.0") == 2
    assert value(found, "sluice_request_latency_seconds_bucket", api="produce", le="+Inf") == 3
    for decision, n in (("kept", 3), ("rewritten", 2), ("dropped", 1), ("rejected", 4)):
        assert value(found, "sluice_filter_records_total", filter="mask", decision=decision) == n
    assert value(found, "sluice_filter_batches_total", filter="mask") == 2
    assert value(found, "sluice_filter_seconds_total", filter="mask") == 1.5
    assert value(found, "sluice_filter_failures_total", filter="mask") == 1
    assert value(found, "sluice_sasl_authentications_total", mechanism="PLAIN", result="ok") == 1
    assert value(found, "sluice_protocol_violations_total") == 1
    assert value(found, "sluice_connections_active") == 3
    assert value(found, "sluice_telemetry_events_emitted_total") == 5
    assert value(found, "sluice_telemetry_events_written_total") == 4
    assert len(LATENCY_BUCKETS) + 1 == len(
        [k for k in found if k[0] == "sluice_request_latency_seconds_bucket"]
    )


def test_readyz_follows_readiness() -> None:
    async def scenario() -> list[tuple[int, str]]:
        m = Metrics()
        server = MetricsServer(m, "127.0.0.1", 0)
        await server.start()
        base = f"http://127.0.0.1:{server.port}"
        loop = asyncio.get_running_loop()
        out = [await loop.run_in_executor(None, get, base + "/readyz")]
        m.ready = True
        for path in ("/readyz", "/healthz", "/nope"):
            out.append(await loop.run_in_executor(None, get, base + path))
        await server.close()
        return out

    assert asyncio.run(scenario()) == [
        (503, "not ready\n"),
        (200, "ready\n"),
        (200, "ok\n"),
        (404, "not found\n"),
    ]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("metrics:\n  listen: nowhere\n", "sluice.yaml:2: metrics.listen:"),
        ("metrics:\n  port: 9000\n", "sluice.yaml:2: metrics.port: unknown key"),
    ],
)
def test_metrics_config_errors(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "sluice.yaml"
    path.write_text(text)
    with pytest.raises(ConfigFileError) as err:
        build_config(("127.0.0.1", 9092), [("127.0.0.1", 9093)], path)
    assert message in str(err.value)


# ------------------------------------------------------------------ a running proxy


def test_metrics_endpoint_under_real_traffic(start_proxy: StartProxy, tmp_path: Path) -> None:
    port = free_port()
    telemetry_dir = tmp_path / "telemetry"
    config = {
        "metrics": {"listen": f"127.0.0.1:{port}"},
        "telemetry": {"dir": str(telemetry_dir)},
        "filters": [
            {
                "name": "mask",
                "module": "builtin:pii-mask",
                "topics": ["metrics-*"],
                "apply_to": ["produce"],
            }
        ],
    }
    path = tmp_path / "sluice.yaml"
    path.write_text(yaml.safe_dump(config))
    proxy = start_proxy(config=path)
    base = f"http://127.0.0.1:{port}"
    assert get(base + "/healthz") == (200, "ok\n")
    assert get(base + "/readyz") == (200, "ready\n")

    topic = unique("metrics")
    create_topic(proxy.bootstrap, topic)
    sent = [(None, json.dumps({"email": f"u{i}@example.com"}).encode()) for i in range(30)]
    sent += [(None, b"nothing personal")] * 10
    confluent_produce(proxy.bootstrap, topic, sent)
    assert len(confluent_consume(proxy.bootstrap, topic, 40)) == 40

    status, text = get(base + "/metrics")
    assert status == 200
    found = samples(text)
    assert total(found, "sluice_requests_total", api="produce") >= 1
    assert total(found, "sluice_requests_total", api="fetch") >= 1
    assert total(found, "sluice_requests_total", api="metadata") >= 1
    assert total(found, "sluice_request_bytes_total", api="produce") > 40 * 16
    assert total(found, "sluice_response_bytes_total", api="fetch") > 40 * 16
    assert total(found, "sluice_request_latency_seconds_count", api="produce") >= 1
    assert total(found, "sluice_connections_total") >= 2
    rewritten = value(found, "sluice_filter_records_total", filter="mask", decision="rewritten")
    kept = value(found, "sluice_filter_records_total", filter="mask", decision="kept")
    assert (rewritten, kept) == (30, 10)
    assert value(found, "sluice_filter_batches_total", filter="mask") >= 1
    assert value(found, "sluice_filter_seconds_total", filter="mask") > 0
    assert value(found, "sluice_telemetry_events_emitted_total") >= 1
    assert value(found, "sluice_ready") == 1
    assert ("sluice_telemetry_events_dropped_total", (("reason", "queue_full"),)) in found
