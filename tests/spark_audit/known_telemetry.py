"""A small, fully known telemetry data set built with the proxy's own event builders.

Two proxy instances, two filter modules, produce and fetch traffic from three clients across
two hours, one rejected partition, one filter error, an offset gap, an unfiltered topic, admin
decisions, a connection, and a telemetry gap. Instance B runs the pii module from a signed
fleet record (its entries name ``SIGNER``); instance A runs it from its config file. The tests
derive every expected report figure from the constants here.
"""

from __future__ import annotations

import functools
import hashlib
from datetime import UTC, datetime
from typing import Any

from sluice.proxy import telemetry as t

A = t.ProxyInfo(host="host-a", pid=101, instance_id="inst-a")
B = t.ProxyInfo(host="host-b", pid=202, instance_id="inst-b")
PII = hashlib.sha256(b"pii filter module").hexdigest()
POLICY = hashlib.sha256(b"policy filter module").hexdigest()
# The Ed25519 key id that signed instance B's fleet record of the pii module.
SIGNER = "5ca1ab1e0ddba11e"
T0 = int(datetime(2026, 11, 18, 10, 0, tzinfo=UTC).timestamp() * 1000)
MIN = 60_000
HOUR10 = "2026-11-18T10:00:00.000Z"
HOUR11 = "2026-11-18T11:00:00.000Z"


def _pii(**counts: Any) -> dict[str, Any]:
    return t.filter_entry("pii", PII, **counts)


def _batch(proxy: t.ProxyInfo, minute: int, **fields: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "connection_id": "c-1",
        "client_address": "127.0.0.1:40000",
        "error_code": 0,
    }
    base.update(fields)
    return t.record_batch_event(proxy, time_ms=T0 + minute * MIN, **base)


@functools.cache
def events() -> list[dict[str, Any]]:
    """Built once: event ids come from a process-wide counter. Do not mutate."""
    alice = {"client_id": "app-1", "principal": "alice"}
    app2 = {"client_id": "app-2", "principal": None}
    bob = {"client_id": "reader", "principal": "bob"}
    out: list[dict[str, Any]] = []
    for proxy in (A, B):
        out.append(
            t.filter_loaded_event(
                proxy,
                name="pii",
                module_sha256=PII,
                topics=["orders", "payments"],
                apply_to={"produce", "fetch"},
                time_ms=T0 - MIN,
            )
        )
    out.append(
        t.filter_loaded_event(
            A, name="policy", module_sha256=POLICY, topics=["*"], apply_to={"admin"},
            time_ms=T0 - MIN,
        )
    )
    # alice produces orders/0 through A: offsets 0-29 in three batches (hour 10)
    for i in range(3):
        out.append(
            _batch(
                A, 1 + i, api="produce", topic="orders", partition=0,
                offset_first=10 * i, offset_last=10 * i + 9,
                records_in=10, records_out=10, bytes_in=1000, bytes_out=1100,
                filters=[_pii(kept=8, rewritten=2, detectors={"email": 1, "phone": 1},
                              time_ns=5000)],
                **alice,
            )
        )
    # ... and offsets 40-49 through B in hour 11 (30-39 never went through a proxy)
    out.append(
        _batch(
            B, 70, api="produce", topic="orders", partition=0, offset_first=40,
            offset_last=49, records_in=10, records_out=10, bytes_in=1000, bytes_out=1000,
            filters=[_pii(kept=10, time_ns=3000, signer_key_id=SIGNER)], **alice,
        )
    )
    # app-2: a rejected partition (no offsets assigned) and a batch with a filter error
    out.append(
        _batch(
            A, 5, api="produce", topic="payments", partition=1, offset_first=None,
            offset_last=None, records_in=5, records_out=0, bytes_in=500, bytes_out=0,
            filters=[_pii(kept=2, rejected=3, detectors={"card": 3}, time_ns=4000)],
            error_code=87, error_message="INVALID_RECORD",
            reject_reasons={"card number": 3}, **app2,
        )
    )
    out.append(
        _batch(
            A, 6, api="produce", topic="payments", partition=1, offset_first=0,
            offset_last=3, records_in=4, records_out=4, bytes_in=400, bytes_out=400,
            filters=[_pii(kept=4, time_ns=2000, errors=["trap: out of bounds"])], **app2,
        )
    )
    # bob fetches orders/0: 0-29 through A (hour 10), 20-49 through B (hour 11)
    out.append(
        _batch(
            A, 10, api="fetch", topic="orders", partition=0, offset_first=0, offset_last=29,
            records_in=30, records_out=30, bytes_in=3300, bytes_out=3300, batches=3,
            filters=[_pii(kept=30, time_ns=6000)], **bob,
        )
    )
    out.append(
        _batch(
            B, 75, api="fetch", topic="orders", partition=0, offset_first=20, offset_last=49,
            records_in=20, records_out=20, bytes_in=2000, bytes_out=2000, batches=2,
            filters=[_pii(kept=20, time_ns=1000, signer_key_id=SIGNER)], **bob,
        )
    )
    # an unfiltered topic, counted for billing only
    out.append(
        _batch(
            B, 80, api="fetch", topic="metrics", partition=0, offset_first=100,
            offset_last=104, records_in=5, records_out=5, bytes_in=500, bytes_out=500,
            filters=[], **bob,
        )
    )
    for minute, resource, decision, message in (
        (20, "bad-topic", "deny", "partitions > 12"),
        (21, "good-topic", "allow", None),
    ):
        out.append(
            t.admin_event(
                A, connection_id="c-1", client_address="127.0.0.1:40000", op="create_topics",
                resource_type="topic", resource=resource, decision=decision, message=message,
                filter_name="policy", module_sha256=POLICY, time_ms=T0 + minute * MIN,
                error_code=44 if decision == "deny" else 0, **alice,
            )
        )
    out.append(
        t.connection_event(
            A, phase="open", connection_id="c-1", client_address="127.0.0.1:40000",
            listener="127.0.0.1:9092", upstream="127.0.0.1:19092", time_ms=T0,
        )
    )
    out.append(
        t.connection_event(
            A, phase="close", connection_id="c-1", client_address="127.0.0.1:40000",
            listener="127.0.0.1:9092", upstream="127.0.0.1:19092", bytes_in=5000,
            bytes_out=700,
            apis={
                "produce": t.ApiCounters(3, 3500, 300),
                "metadata": t.ApiCounters(2, 100, 400),
            },
            duration_ms=30 * MIN, throttle_ms=1500, time_ms=T0 + 30 * MIN, **alice,
        )
    )
    out.append(
        t.telemetry_dropped_event(
            B, dropped=7, reason="queue full", since_ms=T0 + 85 * MIN,
            until_ms=T0 + 90 * MIN, time_ms=T0 + 90 * MIN,
        )
    )
    return out


# (principal, client_id, topic, hour) -> (produce_batches, produce_records_in,
# produce_records_out, produce_bytes_in, produce_bytes_out, fetch_batches, fetch_records_out,
# fetch_bytes_out, produce_errors, filter_time_ns), summed by hand from events() above.
EXPECTED_BILLING = {
    ("alice", "app-1", "orders", "10"): (3, 30, 30, 3000, 3300, 0, 0, 0, 0, 15000),
    ("alice", "app-1", "orders", "11"): (1, 10, 10, 1000, 1000, 0, 0, 0, 0, 3000),
    (None, "app-2", "payments", "10"): (2, 9, 4, 900, 400, 0, 0, 0, 1, 6000),
    ("bob", "reader", "orders", "10"): (0, 0, 0, 0, 0, 1, 30, 3300, 0, 6000),
    ("bob", "reader", "orders", "11"): (0, 0, 0, 0, 0, 1, 20, 2000, 0, 1000),
    ("bob", "reader", "metrics", "11"): (0, 0, 0, 0, 0, 1, 5, 500, 0, 0),
}


def events_from(minute: int) -> int:
    """How many events are at or after T0 + minute."""
    return sum(1 for e in events() if e["time_ms"] >= T0 + minute * MIN)
