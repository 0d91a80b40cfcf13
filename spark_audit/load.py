"""Parsing what the user says about the telemetry: ``kafka://`` URLs and ``--from/--to`` times.

Kept free of pyspark imports; ``sources`` does the reading.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, datetime

_KAFKA_URL = re.compile(r"^kafka://(?P<bootstrap>[^/]+)/(?P<topic>[^/?#]+)/?$")


@dataclass(frozen=True)
class KafkaUrl:
    bootstrap: str
    topic: str


def parse_kafka_url(source: str) -> KafkaUrl | None:
    """``kafka://h:p[,h2:p2]/topic`` -> KafkaUrl; other strings -> None."""
    if not source.startswith("kafka://"):
        return None
    match = _KAFKA_URL.match(source)
    if match is None:
        raise ValueError(f"telemetry source {source!r}: expected kafka://HOST:PORT/TOPIC")
    return KafkaUrl(match["bootstrap"], match["topic"])


def parse_time(value: str | None) -> int | None:
    """``--from``/``--to``: epoch milliseconds, a date, or ISO-8601 (no zone = UTC) -> epoch ms."""
    if value is None or value == "":
        return None
    text = value.strip()
    if re.fullmatch(r"-?\d{10,}", text):
        return int(text)
    if text.endswith("Z"):
        text = text[:-1] + "+00:00"
    try:
        dt = datetime.fromisoformat(text)
    except ValueError as exc:
        raise ValueError(
            f"time {value!r}: expected ISO-8601 (2026-11-18T10:00:00Z), a date or epoch ms"
        ) from exc
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=UTC)
    return int(dt.timestamp() * 1000)
