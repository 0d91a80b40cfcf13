"""HTML and SVG rendering, and the job's argument parsing: pure Python, no Spark session."""

from __future__ import annotations

import xml.etree.ElementTree as ET

import pytest

from sluice.spark_audit import html_report, svg
from sluice.spark_audit.options import parse_conf


def test_topology_escapes_names_and_is_well_formed() -> None:
    edges = [
        svg.Edge("<script>alert(1)</script>", "host-a i1", "orders", "produce", 10, 1000),
        svg.Edge("bob/reader", "host-a i1", "orders", "fetch", 5, 500),
        svg.Edge("bob/reader", "host-b i2", "a&b", "fetch", 1, 100),
    ]
    out = svg.topology(edges, title="t")
    root = ET.fromstring(out)
    texts = [t.text for t in root.iter("{http://www.w3.org/2000/svg}text")]
    assert "<script>alert(1)</script>"[:27] in "".join(x or "" for x in texts)
    assert "<script>" not in out
    # one curve per (client, proxy, api) and per (proxy, topic, api)
    paths = [p for p in root.iter("{http://www.w3.org/2000/svg}path") if p.get("stroke")]
    assert len(paths) == 3 + 3
    # thicker line for more records
    widths = {
        p.findtext("{http://www.w3.org/2000/svg}title"): float(p.get("stroke-width") or 0)
        for p in paths
    }
    assert (
        widths["host-a i1 \u2194 orders: 10 records (produce)"]
        > widths["host-b i2 \u2194 a&b: 1 records (fetch)"]
    )


def test_charts_handle_empty_and_single_points() -> None:
    assert "no data" in svg.line_chart({}, title="x", y_label="y")
    single = svg.line_chart({"c": [(1_000, 5.0)]}, title="x", y_label="y")
    ET.fromstring(single)
    bars = svg.bar_chart([("t1", (3.0, 1.0)), ("t2", (0.0, 2.0))], series=("p", "f"), title="b")
    root = ET.fromstring(bars)
    rects = [
        r
        for r in root.iter("{http://www.w3.org/2000/svg}rect")
        if r.find("{http://www.w3.org/2000/svg}title") is not None
    ]
    assert len(rects) == 3  # zero-width segments are not drawn


def test_human_numbers() -> None:
    assert svg.human(999) == "999"
    assert svg.human(1_234_567) == "1.23M"
    assert svg.human(2_500) == "2.5k"


def test_render_fills_every_section() -> None:
    data = html_report.ReportData(
        source="/data/<telemetry>",
        generated_at="2026-11-18T12:00:00.000Z",
        events_by_type={"record_batch": 3},
        totals={"produce_records": 30, "detections": 2},
        instances=["i1"],
        traffic={"alice/app": [(0, 10.0), (60_000, 20.0)]},
        top_topics=[("orders", 30, 0)],
        detections=[("email @ orders", 2)],
        edges=[svg.Edge("alice/app", "h i1", "orders", "produce", 30, 3000)],
        modules=[{"module_sha256": "ab" * 32, "filter_names": ["pii"], "batches": 3}],
        clients=[{"principal": "alice", "client_id": "app", "produce_records_out": 30}],
        compliance=[{"kind": "detection", "topic": "orders", "name": "email", "count": 2}],
        files=[("billing", "billing.parquet", "billing.csv")],
    )
    page = html_report.render(data)
    assert "$" not in page.replace("$(", "")  # every placeholder substituted
    assert "/data/&lt;telemetry&gt;" in page
    assert page.count("<svg ") == 4
    assert '<a href="billing.csv">' in page
    assert '<td class="n">30</td>' in page


@pytest.mark.parametrize(
    ("text", "ms"),
    [
        ("2026-11-18T10:00:00Z", 1_794_996_000_000),
        ("2026-11-18T11:00:00+01:00", 1_794_996_000_000),
        ("2026-11-18T10:00:00", 1_794_996_000_000),
        ("2026-11-18", 1_794_960_000_000),
        ("1794996000000", 1_794_996_000_000),
        (None, None),
    ],
)
def test_parse_time(text: str | None, ms: int | None) -> None:
    pytest.importorskip("pyspark")
    from sluice.spark_audit.load import parse_time

    assert parse_time(text) == ms


def test_parse_kafka_url() -> None:
    pytest.importorskip("pyspark")
    from sluice.spark_audit.load import KafkaUrl, parse_kafka_url

    assert parse_kafka_url("kafka://h1:9092,h2:9092/tel") == KafkaUrl("h1:9092,h2:9092", "tel")
    assert parse_kafka_url("/data/telemetry") is None
    assert parse_kafka_url("s3a://bucket/x") is None
    with pytest.raises(ValueError, match="kafka://HOST:PORT/TOPIC"):
        parse_kafka_url("kafka://h1:9092")


def test_parse_conf() -> None:
    assert parse_conf(["a=b", "spark.x=1=2"]) == {"a": "b", "spark.x": "1=2"}
    with pytest.raises(ValueError, match="KEY=VALUE"):
        parse_conf(["novalue"])
