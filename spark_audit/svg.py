"""Small inline-SVG charts for the HTML report: no JavaScript, no external files.

Pure functions from plain Python data to SVG markup; every text goes through
``html.escape``. Colours come from one fixed palette so a client keeps its colour across charts.
"""

from __future__ import annotations

import html
import math
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

PALETTE = (
    "#4e79a7",
    "#f28e2b",
    "#e15759",
    "#76b7b2",
    "#59a14f",
    "#edc948",
    "#b07aa1",
    "#ff9da7",
    "#9c755f",
    "#bab0ac",
)
PRODUCE_COLOUR = "#4e79a7"
FETCH_COLOUR = "#f28e2b"
FONT = 'font-family="system-ui,-apple-system,Segoe UI,sans-serif"'


def esc(text: object) -> str:
    return html.escape(str(text), quote=True)


def human(n: float) -> str:
    """1234567 -> '1.23M' (for axis labels; tables show exact numbers)."""
    value = float(n)
    for unit, size in (("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(value) >= size:
            return f"{value / size:.3g}{unit}"
    return f"{value:.3g}" if value != int(value) else str(int(value))


def _nice_max(value: float) -> float:
    if value <= 0:
        return 1.0
    exp = 10 ** math.floor(math.log10(value))
    for step in (1, 2, 2.5, 5, 10):
        if step * exp >= value:
            return step * exp
    return 10 * exp


def _time_label(ms: int, span_ms: int) -> str:
    dt = datetime.fromtimestamp(ms / 1000, tz=UTC)
    if span_ms <= 2 * 3600_000:
        return dt.strftime("%H:%M:%S")
    if span_ms <= 2 * 86400_000:
        return dt.strftime("%d %H:%M")
    return dt.strftime("%Y-%m-%d")


def empty_chart(message: str, width: int = 720, height: int = 60) -> str:
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'role="img" {FONT}><text x="10" y="35" font-size="14" fill="#666">{esc(message)}'
        "</text></svg>"
    )


def line_chart(
    series: dict[str, list[tuple[int, float]]],
    *,
    title: str,
    y_label: str,
    width: int = 760,
    height: int = 300,
) -> str:
    """One line per series over epoch-millisecond x values; legend on the right."""
    points = [p for values in series.values() for p in values]
    if not points:
        return empty_chart(f"{title}: no data")
    left, right, top, bottom = 60, 190, 30, 40
    plot_w, plot_h = width - left - right, height - top - bottom
    x_min = min(p[0] for p in points)
    x_max = max(p[0] for p in points)
    span = max(1, x_max - x_min)
    y_max = _nice_max(max(p[1] for p in points))

    def x_of(ms: int) -> float:
        return left + (ms - x_min) / span * plot_w if x_max > x_min else left + plot_w / 2

    def y_of(v: float) -> float:
        return top + plot_h - v / y_max * plot_h

    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" role="img" {FONT}>',
        f"<title>{esc(title)}</title>",
        f'<text x="{left}" y="18" font-size="14" font-weight="600">{esc(title)}</text>',
    ]
    for i in range(5):
        v = y_max * i / 4
        y = y_of(v)
        parts.append(
            f'<line x1="{left}" x2="{left + plot_w}" y1="{y:.1f}" y2="{y:.1f}" stroke="#e5e5e5"/>'
        )
        parts.append(
            f'<text x="{left - 6}" y="{y + 4:.1f}" font-size="11" text-anchor="end" '
            f'fill="#555">{esc(human(v))}</text>'
        )
    for i in range(5):
        ms = x_min + span * i // 4 if x_max > x_min else x_min
        x = x_of(ms)
        parts.append(
            f'<text x="{x:.1f}" y="{top + plot_h + 16}" font-size="11" text-anchor="middle" '
            f'fill="#555">{esc(_time_label(ms, span))}</text>'
        )
        if x_max == x_min:
            break
    parts.append(
        f'<text x="14" y="{top + plot_h / 2:.1f}" font-size="11" fill="#555" '
        f'transform="rotate(-90 14 {top + plot_h / 2:.1f})" text-anchor="middle">'
        f"{esc(y_label)}</text>"
    )
    for idx, (name, values) in enumerate(series.items()):
        other = name.startswith("other ")
        colour = "#999999" if other else PALETTE[idx % len(PALETTE)]
        dash = ' stroke-dasharray="5,3"' if other else ""
        ordered = sorted(values)
        coords = " ".join(f"{x_of(x):.1f},{y_of(y):.1f}" for x, y in ordered)
        if len(ordered) > 1:
            parts.append(
                f'<polyline points="{coords}" fill="none" stroke="{colour}" '
                f'stroke-width="2"{dash}/>'
            )
        for x, y in ordered:
            parts.append(
                f'<circle cx="{x_of(x):.1f}" cy="{y_of(y):.1f}" r="3" fill="{colour}">'
                f"<title>{esc(name)}: {esc(human(y))}</title></circle>"
            )
        ly = top + 14 + idx * 18
        parts.append(
            f'<rect x="{left + plot_w + 14}" y="{ly - 9}" width="10" height="10" fill="{colour}"/>'
        )
        parts.append(
            f'<text x="{left + plot_w + 30}" y="{ly}" font-size="12">{esc(_clip(name, 24))}</text>'
        )
    parts.append("</svg>")
    return "".join(parts)


def _clip(text: str, n: int) -> str:
    return text if len(text) <= n else text[: n - 1] + "…"


def bar_chart(
    rows: Sequence[tuple[str, Sequence[float]]],
    *,
    series: Sequence[str],
    colours: Sequence[str] | None = None,
    title: str,
    width: int = 760,
) -> str:
    """Horizontal stacked bars: one row per label, one segment per series."""
    if not rows:
        return empty_chart(f"{title}: no data")
    colours = colours or PALETTE
    left, right, top, row_h = 200, 110, 46, 22
    height = top + row_h * len(rows) + 10
    plot_w = width - left - right
    total_max = _nice_max(max(sum(values) for _, values in rows))
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" role="img" {FONT}>',
        f"<title>{esc(title)}</title>",
        f'<text x="10" y="18" font-size="14" font-weight="600">{esc(title)}</text>',
    ]
    x = left
    for idx, name in enumerate(series):
        parts.append(
            f'<rect x="{x}" y="26" width="10" height="10" fill="{colours[idx % len(colours)]}"/>'
            f'<text x="{x + 14}" y="35" font-size="12">{esc(name)}</text>'
        )
        x += 16 + 8 * len(name) + 20
    for r, (label, values) in enumerate(rows):
        y = top + r * row_h
        parts.append(
            f'<text x="{left - 8}" y="{y + 15}" font-size="12" text-anchor="end">'
            f"{esc(_clip(label, 30))}<title>{esc(label)}</title></text>"
        )
        x0 = float(left)
        for idx, value in enumerate(values):
            w = value / total_max * plot_w
            if w > 0:
                parts.append(
                    f'<rect x="{x0:.1f}" y="{y + 3}" width="{w:.1f}" height="{row_h - 6}" '
                    f'fill="{colours[idx % len(colours)]}"><title>{esc(label)} '
                    f"{esc(series[idx])}: {value:,.0f}</title></rect>"
                )
            x0 += w
        parts.append(
            f'<text x="{x0 + 6:.1f}" y="{y + 15}" font-size="11" fill="#555">'
            f"{esc(human(sum(values)))}</text>"
        )
    parts.append("</svg>")
    return "".join(parts)


def _ordered(names: set[str]) -> list[str]:
    """Sorted, with the catch-all "other ..." nodes last."""
    return sorted(names, key=lambda n: (n.startswith("other "), n))


@dataclass(frozen=True)
class Edge:
    """Traffic between a client and a topic through one proxy instance."""

    client: str
    proxy: str
    topic: str
    api: str  # produce | fetch
    records: int
    bytes: int


def topology(edges: Sequence[Edge], *, title: str, width: int = 900) -> str:
    """Clients (left) -> proxy instances (middle) -> topics (right); produce in blue with the
    arrow towards the topic, fetch in orange with the arrow towards the client."""
    if not edges:
        return empty_chart(f"{title}: no traffic")
    clients = _ordered({e.client for e in edges})
    proxies = _ordered({e.proxy for e in edges})
    topics = _ordered({e.topic for e in edges})
    row_h, top = 34, 50
    height = top + row_h * max(len(clients), len(proxies), len(topics)) + 20
    col_x = (150, width // 2, width - 150)
    node_w, node_h = 200, 24

    def positions(names: list[str]) -> dict[str, float]:
        total = row_h * len(names)
        start = top + (height - top - 20 - total) / 2
        return {n: start + i * row_h + row_h / 2 for i, n in enumerate(names)}

    cy, py, ty = positions(clients), positions(proxies), positions(topics)
    max_records = max(max(e.records for e in edges), 1)

    def stroke(records: int) -> float:
        return 1.0 + 7.0 * math.log1p(records) / math.log1p(max_records)

    # Sum parallel edges so each drawn curve is one (pair, api).
    left_edges: dict[tuple[str, str, str], int] = {}
    right_edges: dict[tuple[str, str, str], int] = {}
    for e in edges:
        left_edges[(e.client, e.proxy, e.api)] = (
            left_edges.get((e.client, e.proxy, e.api), 0) + e.records
        )
        right_edges[(e.proxy, e.topic, e.api)] = (
            right_edges.get((e.proxy, e.topic, e.api), 0) + e.records
        )

    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" role="img" {FONT}>',
        f"<title>{esc(title)}</title>",
        "<defs>",
        *(
            f'<marker id="arrow-{api}" viewBox="0 0 10 10" refX="9" refY="5" markerWidth="9" '
            f'markerHeight="9" markerUnits="userSpaceOnUse" orient="auto-start-reverse">'
            f'<path d="M0,0L10,5L0,10z" '
            f'fill="{colour}"/></marker>'
            for api, colour in (("produce", PRODUCE_COLOUR), ("fetch", FETCH_COLOUR))
        ),
        "</defs>",
        f'<text x="10" y="18" font-size="14" font-weight="600">{esc(title)}</text>',
        f'<text x="{col_x[0]}" y="40" font-size="12" text-anchor="middle" fill="#555">clients'
        "</text>",
        f'<text x="{col_x[1]}" y="40" font-size="12" text-anchor="middle" fill="#555">'
        "proxy instances</text>",
        f'<text x="{col_x[2]}" y="40" font-size="12" text-anchor="middle" fill="#555">topics'
        "</text>",
    ]

    def curve(
        x1: float, y1: float, x2: float, y2: float, api: str, records: int, label: str
    ) -> str:
        offset = -3 if api == "produce" else 3
        y1, y2 = y1 + offset, y2 + offset
        mid = (x1 + x2) / 2
        colour = PRODUCE_COLOUR if api == "produce" else FETCH_COLOUR
        marker = (
            'marker-end="url(#arrow-produce)"'
            if api == "produce"
            else ('marker-start="url(#arrow-fetch)"')
        )
        return (
            f'<path d="M{x1:.1f},{y1:.1f} C{mid:.1f},{y1:.1f} {mid:.1f},{y2:.1f} '
            f'{x2:.1f},{y2:.1f}" fill="none" stroke="{colour}" stroke-opacity="0.75" '
            f'stroke-width="{stroke(records):.1f}" '
            f"{marker}><title>{esc(label)}: {records:,} records ({esc(api)})</title></path>"
        )

    half = node_w / 2
    for (client, proxy, api), records in sorted(left_edges.items()):
        parts.append(
            curve(
                col_x[0] + half,
                cy[client],
                col_x[1] - half,
                py[proxy],
                api,
                records,
                f"{client} \u2194 {proxy}",
            )
        )
    for (proxy, topic, api), records in sorted(right_edges.items()):
        parts.append(
            curve(
                col_x[1] + half,
                py[proxy],
                col_x[2] - half,
                ty[topic],
                api,
                records,
                f"{proxy} \u2194 {topic}",
            )
        )
    for names, ys, x, fill in (
        (clients, cy, col_x[0], "#eef3f8"),
        (proxies, py, col_x[1], "#f3f3f3"),
        (topics, ty, col_x[2], "#fdf1e6"),
    ):
        for name in names:
            y = ys[name]
            parts.append(
                f'<rect x="{x - half}" y="{y - node_h / 2:.1f}" width="{node_w}" height="{node_h}" '
                f'rx="5" fill="{fill}" stroke="#999"/><text x="{x}" y="{y + 4:.1f}" '
                f'font-size="12" text-anchor="middle">{esc(_clip(name, 28))}'
                f"<title>{esc(name)}</title></text>"
            )
    legend_y = height - 8
    parts.append(
        f'<text x="10" y="{legend_y}" font-size="11" fill="{PRODUCE_COLOUR}">\u25a0 produce '
        f'(client \u2192 topic)</text><text x="200" y="{legend_y}" font-size="11" '
        f'fill="{FETCH_COLOUR}">\u25a0 fetch (topic \u2192 client)</text>'
        f'<text x="400" y="{legend_y}" font-size="11" fill="#555">line width ~ log(records)</text>'
    )
    parts.append("</svg>")
    return "".join(parts)
