"""The self-contained HTML summary: inline SVG charts and tables, no JavaScript, no links out.

``render(data)`` is pure (no Spark): the job collects small aggregates into ``ReportData``
and this module turns them into one HTML file that opens from the output folder.
"""

from __future__ import annotations

import importlib.resources
from collections.abc import Sequence
from dataclasses import dataclass, field
from string import Template
from typing import Any

from sluice.spark_audit.svg import (
    FETCH_COLOUR,
    PRODUCE_COLOUR,
    Edge,
    bar_chart,
    esc,
    line_chart,
    topology,
)


@dataclass
class ReportData:
    source: str
    generated_at: str
    time_from: str | None = None
    time_to: str | None = None
    first_event: str | None = None
    last_event: str | None = None
    events_by_type: dict[str, int] = field(default_factory=dict)
    totals: dict[str, int] = field(default_factory=dict)
    instances: list[str] = field(default_factory=list)
    bucket_label: str = "hour"
    traffic: dict[str, list[tuple[int, float]]] = field(default_factory=dict)
    top_topics: list[tuple[str, int, int]] = field(default_factory=list)
    detections: list[tuple[str, int]] = field(default_factory=list)
    edges: list[Edge] = field(default_factory=list)
    modules: list[dict[str, Any]] = field(default_factory=list)
    clients: list[dict[str, Any]] = field(default_factory=list)
    compliance: list[dict[str, Any]] = field(default_factory=list)
    # Rows of the transforms and encryption reports (the first ones, in report order).
    transforms: list[dict[str, Any]] = field(default_factory=list)
    encryption: list[dict[str, Any]] = field(default_factory=list)
    files: list[tuple[str, str, str]] = field(default_factory=list)
    # {"malformed": {type: rows}, "unknown_schema_version": {type: rows}}: rows the job could
    # not use, shown so that nothing is left out without a word.
    skipped: dict[str, dict[str, int]] = field(default_factory=dict)
    # ``job.integrity_summary``: what verified and what was refused (left out of the reports).
    integrity: dict[str, Any] = field(default_factory=dict)


def _integrity_note(integrity: dict[str, Any]) -> str:
    """The line under the title that says whether the telemetry was authenticated."""
    if not integrity.get("verified"):
        note = integrity.get("note") or "telemetry tags were not checked"
        return f'<p class="note"><b>Unverified telemetry</b>: {esc(note)}.</p>'
    accepted = ", ".join(f"{n:,} {esc(source)}"
                         for source, n in sorted(integrity.get("accepted", {}).items()))
    text = (f"Telemetry verified with key {esc(', '.join(integrity.get('keys', [])))}: "
            f"{accepted or 'nothing'} authenticated.")
    refused = [f"{n:,} {esc(reason.replace('_', ' '))} ({esc(dataset)})"
               for reason, per in sorted(integrity.get("refused", {}).items())
               for dataset, n in sorted(per.items()) if n]
    if refused:
        text += (f" <b>Refused, in no report</b> (forged, altered or from an untrusted key): "
                 f"{'; '.join(refused)}.")
    missing = [f"{n:,} of instance {esc(instance)}"
               for instance, n in sorted(integrity.get("missing_messages", {}).items())]
    if missing:
        text += f" <b>Telemetry messages missing</b> from the topic: {'; '.join(missing)}."
    return f'<p class="note">{text}</p>'


def _table(rows: Sequence[dict[str, Any]], columns: Sequence[tuple[str, str]]) -> str:
    if not rows:
        return '<p class="note">none</p>'
    head = "".join(
        f'<th class="{"n" if _is_num(rows[0].get(key)) else ""}">{esc(title)}</th>'
        for key, title in columns
    )
    body = []
    for row in rows:
        cells = []
        for key, _title in columns:
            value = row.get(key)
            if _is_num(value):
                cells.append(f'<td class="n">{value:,}</td>')
            elif isinstance(value, list | tuple):
                cells.append(f"<td>{esc(', '.join(str(v) for v in value))}</td>")
            elif value is None:
                cells.append("<td></td>")
            else:
                cells.append(f"<td>{esc(value)}</td>")
        body.append("<tr>" + "".join(cells) + "</tr>")
    return f"<table><tr>{head}</tr>{''.join(body)}</table>"


def _is_num(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _card(value: Any, label: str) -> str:
    shown = f"{value:,}" if _is_num(value) else esc(value)
    return f'<div class="card"><b>{shown}</b><span>{esc(label)}</span></div>'


def render(data: ReportData) -> str:
    template = Template(
        importlib.resources.files("sluice.spark_audit")
        .joinpath("templates/report.html")
        .read_text(encoding="utf-8")
    )
    window = ""
    if data.time_from or data.time_to:
        window = f" · window {esc(data.time_from or '…')} to {esc(data.time_to or '…')}"
    meta = (
        f"Telemetry: <code>{esc(data.source)}</code>{window} · events from "
        f"{esc(data.first_event or '-')} to {esc(data.last_event or '-')} · generated "
        f"{esc(data.generated_at)} · all times UTC"
    )
    skipped_total = sum(n for per_type in data.skipped.values() for n in per_type.values())
    if skipped_total:
        parts = [
            f"{n:,} {esc(kind.replace('_', ' '))} ({esc(type_)})"
            for kind, per_type in sorted(data.skipped.items())
            for type_, n in sorted(per_type.items())
            if n
        ]
        meta += f'<p class="note">Not in the reports: {"; ".join(parts)}.</p>'
    meta += _integrity_note(data.integrity)
    refused_total = int(data.integrity.get("refused_total", 0))

    t = data.totals
    cards = "".join(
        [
            _card(sum(data.events_by_type.values()), "events"),
            _card(len(data.instances), "proxy instances"),
            _card(t.get("produce_records", 0), "records produced (to broker)"),
            _card(t.get("fetch_records", 0), "records consumed (to clients)"),
            _card(t.get("detections", 0), "detections"),
            _card(t.get("rejected", 0), "records rejected"),
            _card(t.get("filter_errors", 0), "filter errors"),
            _card(t.get("transform_records", 0), "records written by transforms"),
            _card(t.get("encrypted_records", 0), "records encrypted"),
            _card(t.get("telemetry_dropped", 0), "telemetry events lost"),
            _card(skipped_total, "rows skipped (unknown schema version or malformed)"),
            _card(refused_total if data.integrity.get("verified") else "unverified",
                  "telemetry files and messages refused (failed verification)"),
        ]
    )
    topics_svg = bar_chart(
        [(name, (float(p), float(f))) for name, p, f in data.top_topics],
        series=("produced", "consumed"),
        colours=(PRODUCE_COLOUR, FETCH_COLOUR),
        title="Records per topic (top 15)",
    )
    detections_svg = bar_chart(
        [(label, (float(n),)) for label, n in data.detections],
        series=("detections",),
        colours=("#e15759",),
        title="Detections per detector and topic (top 15)",
    )
    traffic_svg = line_chart(
        data.traffic,
        title=f"Record bytes per client per {data.bucket_label} (produce in + fetch out)",
        y_label="bytes",
    )
    topology_svg = topology(data.edges, title="Clients → proxies → topics")
    modules = _table(
        data.modules,
        [
            ("module_sha256", "module sha256"),
            ("filter_names", "names"),
            ("signer_key_ids", "signed by"),
            ("proxy_instances", "instances"),
            ("topics", "topics touched"),
            ("topic_partitions", "partitions"),
            ("batches", "batches"),
            ("kept", "kept"),
            ("rewritten", "rewritten"),
            ("dropped", "dropped"),
            ("rejected", "rejected"),
            ("detections", "detections"),
            ("errors", "errors"),
            ("admin_items", "admin items"),
        ],
    )
    clients = _table(
        data.clients,
        [
            ("principal", "principal"),
            ("client_id", "client id"),
            ("produce_records_out", "records produced"),
            ("produce_bytes_in", "bytes produced"),
            ("fetch_records_out", "records consumed"),
            ("fetch_bytes_out", "bytes consumed"),
            ("filter_time_ns", "filter time ns"),
        ],
    )
    compliance = _table(
        data.compliance,
        [
            ("kind", "kind"),
            ("topic", "topic"),
            ("api", "api"),
            ("filter_name", "filter"),
            ("name", "detector / reason / error"),
            ("count", "count"),
        ],
    )
    transforms = _table(
        data.transforms,
        [
            ("transform", "transform"),
            ("module_sha256s", "module sha256s"),
            ("input_topic", "input topic"),
            ("input_partition", "partition"),
            ("input_offset_first", "input first"),
            ("input_offset_last", "input last"),
            ("output_topic", "output topic"),
            ("output_partition", "partition"),
            ("output_offset_first", "output first"),
            ("output_offset_last", "output last"),
            ("output_records", "records out"),
            ("batches", "batches"),
        ],
    )
    encryption = _table(
        data.encryption,
        [
            ("section", "section"),
            ("topic", "topic"),
            ("partition", "partition"),
            ("key_name", "key"),
            ("key_version", "version"),
            ("principal", "principal"),
            ("offset_first", "first offset"),
            ("offset_last", "last offset"),
            ("records", "records"),
            ("decrypted", "decrypted"),
            ("withheld", "withheld"),
            ("unreadable", "unreadable"),
            ("failures", "failures"),
        ],
    )
    files = (
        "<ul>"
        + "".join(
            f'<li>{esc(name)}: <a href="{esc(parquet)}">{esc(parquet)}</a> · '
            f'<a href="{esc(csv)}">{esc(csv)}</a></li>'
            for name, parquet, csv in data.files
        )
        + "</ul>"
    )
    return template.substitute(
        meta=meta,
        cards=cards,
        topology=topology_svg,
        traffic=traffic_svg,
        topics=topics_svg,
        detections=detections_svg,
        modules=modules,
        clients=clients,
        compliance=compliance,
        transforms=transforms,
        encryption=encryption,
        files=files,
    )
