"""The audit job on known telemetry: every report figure equals what the events say."""

from __future__ import annotations

import csv
import json
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from sluice.cli import main as sluice_main
from sluice.proxy import telemetry as t
from tests.spark_audit import known_telemetry as k

pytestmark = [pytest.mark.spark, pytest.mark.timeout(900)]


def write_known_telemetry(directory: Path) -> None:
    """Through the real file sink, small files so the job reads many of them."""
    sink = t.FileSink(k.A, directory, rotate_bytes=3000)
    for event in k.events():
        sink.emit(event)
    sink.close(timeout=10)
    assert sink.stats()["written"] == len(k.events())
    # A file still being written must be ignored by the job (its events would double-count).
    (directory / "sluice-telemetry-inst-z-000001-x.jsonl.tmp").write_text(
        json.dumps(k.events()[3]) + "\n"
    )


def rows(out: Path, name: str) -> list[dict[str, Any]]:
    return list(pq.read_table(out / f"{name}.parquet").to_pylist())


def csv_rows(out: Path, name: str) -> list[dict[str, str]]:
    with (out / f"{name}.csv").open(newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


@pytest.fixture(scope="module")
def telemetry_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("telemetry")
    write_known_telemetry(directory)
    return directory


@pytest.fixture(scope="module")
def report(spark: Any, telemetry_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("report")
    code = sluice_main(["audit", "--telemetry", str(telemetry_dir), "--out", str(out)])
    assert code == 0
    return out


def test_summary_counts_every_event_once(report: Path) -> None:
    summary = json.loads((report / "summary.json").read_text())
    expected: dict[str, int] = {}
    for e in k.events():
        expected[e["type"]] = expected.get(e["type"], 0) + 1
    assert summary["events_by_type"] == expected
    assert summary["instances"] == ["inst-a", "inst-b"]


def test_audit_offset_runs_per_module(report: Path) -> None:
    audit = [
        (r["api"], r["topic"], r["partition"], r["offset_first"], r["offset_last"], r["batches"],
         r["records"], r["kept"], r["rewritten"], r["rejected"], r["detections"], r["errors"],
         r["filter_time_ns"], r["proxy_instances"])
        for r in rows(report, "audit")
        if r["module_sha256"] == k.PII
    ]
    assert sorted(audit, key=repr) == sorted(
        [
            # fetch re-reads by two instances merge into one run 0-49
            ("fetch", "orders", 0, 0, 49, 2, 50, 50, 0, 0, 0, 0, 7000, ["inst-a", "inst-b"]),
            # the 30-39 gap splits the produce runs
            ("produce", "orders", 0, 0, 29, 3, 30, 24, 6, 0, 6, 0, 15000, ["inst-a"]),
            ("produce", "orders", 0, 40, 49, 1, 10, 10, 0, 0, 0, 0, 3000, ["inst-b"]),
            ("produce", "payments", 1, 0, 3, 1, 4, 4, 0, 0, 0, 1, 2000, ["inst-a"]),
            # the rejected partition got no offsets from the broker
            ("produce", "payments", 1, None, None, 1, 5, 2, 0, 3, 3, 0, 4000, ["inst-a"]),
        ],
        key=repr,
    )
    # Nothing else: the unfiltered topic and the admin-only module touched no record batch.
    assert {r["module_sha256"] for r in rows(report, "audit")} == {k.PII}


def test_audit_names_the_signer_of_the_module_per_run(report: Path) -> None:
    """Instance B's batches went through the pii module of a signed fleet record: the runs
    they are in and the module name its key; A's own runs and the admin-only module none."""
    signed = {(r["api"], r["topic"], r["partition"], r["offset_first"]): r["signer_key_ids"]
              for r in rows(report, "audit")}
    assert signed == {
        ("fetch", "orders", 0, 0): [k.SIGNER],
        ("produce", "orders", 0, 0): [],
        ("produce", "orders", 0, 40): [k.SIGNER],
        ("produce", "payments", 1, 0): [],
        ("produce", "payments", 1, None): [],
    }
    modules = {r["module_sha256"]: r["signer_key_ids"] for r in rows(report, "audit_modules")}
    assert modules == {k.PII: [k.SIGNER], k.POLICY: []}
    assert {r["module_sha256"]: r["signer_key_ids"]
            for r in csv_rows(report, "audit_modules")} == {k.PII: k.SIGNER, k.POLICY: ""}
    html = (report / "report.html").read_text(encoding="utf-8")
    assert ">signed by</th>" in html and f"<td>{k.SIGNER}</td>" in html


def test_audit_time_windows(report: Path) -> None:
    run = next(
        r for r in rows(report, "audit")
        if r["api"] == "produce" and r["topic"] == "orders" and r["offset_first"] == 0
    )
    assert int(run["time_first"].timestamp() * 1000) == k.T0 + 1 * k.MIN
    assert int(run["time_last"].timestamp() * 1000) == k.T0 + 3 * k.MIN
    assert run["proxy_hosts"] == ["host-a"]


def test_audit_modules(report: Path) -> None:
    modules = {r["module_sha256"]: r for r in rows(report, "audit_modules")}
    pii, policy = modules[k.PII], modules[k.POLICY]
    assert pii["filter_names"] == ["pii"]
    assert pii["proxy_instances"] == ["inst-a", "inst-b"]
    assert pii["bound_topics"] == ["orders", "payments"]
    assert pii["topics"] == ["orders", "payments"]
    assert pii["topic_partitions"] == 2
    assert (pii["batches"], pii["kept"], pii["rewritten"], pii["rejected"]) == (8, 90, 6, 3)
    assert (pii["detections"], pii["errors"], pii["filter_time_ns"]) == (9, 1, 31000)
    assert (policy["batches"], policy["admin_items"], policy["admin_denied"]) == (0, 2, 1)
    assert policy["proxy_instances"] == ["inst-a"]
    assert policy["apply_to"] == ["admin"]


def billing_figures(out: Path) -> dict[tuple[Any, ...], tuple[int, ...]]:
    return {
        (r["principal"], r["client_id"], r["topic"], r["hour"].strftime("%H")): (
            r["produce_batches"], r["produce_records_in"], r["produce_records_out"],
            r["produce_bytes_in"], r["produce_bytes_out"], r["fetch_batches"],
            r["fetch_records_out"], r["fetch_bytes_out"], r["produce_errors"],
            r["filter_time_ns"],
        )
        for r in rows(out, "billing")
    }


def test_billing_per_principal_client_topic_hour(report: Path) -> None:
    assert billing_figures(report) == k.EXPECTED_BILLING


def test_billing_connections_resolve_client_of_open_event(report: Path) -> None:
    got = {
        (r["principal"], r["client_id"], r["api"]): (
            r["requests"], r["bytes_in"], r["bytes_out"], r["connections_opened"],
            r["connections_closed"], r["duration_ms"], r["throttle_ms"],
        )
        for r in rows(report, "billing_connections")
    }
    assert got == {
        ("alice", "app-1", "*"): (5, 5000, 700, 1, 1, 30 * k.MIN, 1500),
        ("alice", "app-1", "produce"): (3, 3500, 300, 0, 0, 0, 0),
        ("alice", "app-1", "metadata"): (2, 100, 400, 0, 0, 0, 0),
    }


def test_compliance(report: Path) -> None:
    got = {
        (r["kind"], r["topic"], r["api"], r["filter_name"], r["name"]): r["count"]
        for r in rows(report, "compliance")
    }
    assert got == {
        ("detection", "orders", "produce", "pii", "email"): 3,
        ("detection", "orders", "produce", "pii", "phone"): 3,
        ("detection", "payments", "produce", "pii", "card"): 3,
        ("rejected", "payments", "produce", "pii", ""): 3,
        ("reject_reason", "payments", "produce", None, "card number"): 3,
        ("filter_error", "payments", "produce", "pii", "trap: out of bounds"): 1,
        ("partition_error", "payments", "produce", None, "87: INVALID_RECORD"): 1,
        ("admin_deny", "bad-topic", "create_topics", "policy", "partitions > 12"): 1,
        ("telemetry_dropped", None, None, "inst-b", "queue full"): 7,
    }


def test_admin_report(report: Path) -> None:
    got = {
        (r["resource"], r["decision"]): (r["count"], r["principal"], r["messages"])
        for r in rows(report, "admin")
    }
    assert got == {
        ("bad-topic", "deny"): (1, "alice", ["partitions > 12"]),
        ("good-topic", "allow"): (1, "alice", []),
    }


def test_csv_matches_parquet(report: Path) -> None:
    for name in ("audit", "audit_modules", "billing", "billing_connections", "compliance",
                 "admin"):
        parquet = rows(report, name)
        table = csv_rows(report, name)
        assert len(table) == len(parquet), name
        assert list(table[0]) == list(parquet[0]), name
    billing = csv_rows(report, "billing")
    first = billing[0]  # sorted by hour, principal, client: the null principal sorts first
    assert (first["principal"], first["client_id"], first["hour"]) == ("", "app-2", k.HOUR10)
    assert first["produce_bytes_in"] == "900"
    audit = csv_rows(report, "audit")
    assert {r["proxy_instances"] for r in audit} == {"inst-a", "inst-b", "inst-a;inst-b"}


def test_html_is_self_contained_with_charts_and_topology(report: Path) -> None:
    html = (report / "report.html").read_text(encoding="utf-8")
    assert "<script" not in html.lower()
    assert "<link" not in html.lower()
    assert "src=" not in html
    svgs = [html[i : html.index("</svg>", i) + 6] for i in _find_all(html, "<svg ")]
    assert len(svgs) == 4  # topology, traffic, topics, detections
    for svg in svgs:
        ET.fromstring(svg)  # well-formed XML
    topology = svgs[0]
    for node in ("alice/app-1", "app-2", "bob/reader", "host-a inst-a", "host-b inst-b",
                 "orders", "payments", "metrics"):
        assert f">{node}<title>" in topology, node
    assert "20 records (fetch)" in topology  # B -> bob's fetch of orders hour 11
    assert "email @ orders" in svgs[3]


def _find_all(text: str, needle: str) -> list[int]:
    out, i = [], text.find(needle)
    while i >= 0:
        out.append(i)
        i = text.find(needle, i + 1)
    return out


def test_time_window_from_to(spark: Any, telemetry_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "windowed"
    code = sluice_main(
        [
            "audit", "--telemetry", str(telemetry_dir), "--out", str(out),
            "--from", "2026-11-18T11:00:00Z", "--to", str(k.T0 + 85 * k.MIN),
        ]
    )
    assert code == 0
    summary = json.loads((out / "summary.json").read_text())
    # 11:00 <= t < 11:25: B's produce (11:10), B's fetch (11:15), the metrics fetch (11:20)
    assert summary["events"] == k.events_from(60) - k.events_from(85) == 3
    assert {(r["topic"], r["client_id"]) for r in rows(out, "billing")} == {
        ("orders", "app-1"), ("orders", "reader"), ("metrics", "reader"),
    }


def test_bad_time_is_a_usage_error(spark: Any, telemetry_dir: Path, tmp_path: Path) -> None:
    code = sluice_main(
        ["audit", "--telemetry", str(telemetry_dir), "--out", str(tmp_path), "--from", "noon"]
    )
    assert code == 2


def test_missing_telemetry_path_is_a_clear_error_before_spark_starts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = tmp_path / "no-such-dir"
    assert sluice_main(["audit", "--telemetry", str(missing), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert f"--telemetry {missing}: no such file or directory" in err
    assert "Traceback" not in err
