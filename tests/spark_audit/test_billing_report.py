"""The billing report, grouped in Arrow, against the rule written plainly in Python: per
principal, client id, topic and hour, each API's sums of its rows, and the filters' time of
all rows (rows of another or no API count for neither API)."""

from __future__ import annotations

from typing import Any

import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from sluice.spark_audit import reports

HOUR = reports.HOUR_MS
_COUNTS = ("batches", "records_in", "records_out", "bytes_in", "bytes_out", "errors")

_ROW = st.fixed_dictionaries({
    "principal": st.sampled_from([None, "alice", "bob"]),
    "client_id": st.sampled_from([None, "app", ""]),
    "topic": st.sampled_from(["orders", "users"]),
    "api": st.sampled_from(["produce", "fetch", "admin", None]),
    "bucket": st.integers(0, 5).map(lambda h: 1_795_000_000_000 // HOUR * HOUR + h * 600_000),
    **{c: st.integers(0, 2**40) for c in (*_COUNTS, "filter_time_ns")},
    "host": st.just("ignored"),
})


def _plain(batches: list[dict[str, Any]]) -> list[dict[str, Any]]:
    groups: dict[tuple[Any, ...], list[dict[str, Any]]] = {}
    for r in batches:
        key = (r["principal"], r["client_id"], r["topic"], r["bucket"] // HOUR * HOUR)
        groups.setdefault(key, []).append(r)
    out = []
    for (principal, client_id, topic, hour), rows in groups.items():
        row: dict[str, Any] = {"principal": principal, "client_id": client_id,
                               "topic": topic, "hour": hour}
        for api in ("produce", "fetch"):
            for col in _COUNTS:
                row[f"{api}_{col}"] = sum(r[col] for r in rows if r["api"] == api)
        row["filter_time_ns"] = sum(r["filter_time_ns"] for r in rows)
        out.append(row)
    return out


@settings(max_examples=150, deadline=None)
@given(st.lists(_ROW, max_size=40))
def test_billing_equals_the_plain_rule(batches: list[dict[str, Any]]) -> None:
    expected = reports.to_table("billing", _plain(batches),
                                ["hour", "principal", "client_id", "topic"])
    assert reports.billing(pa.Table.from_pylist(batches)).equals(expected)
