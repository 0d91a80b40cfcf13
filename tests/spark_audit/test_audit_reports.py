"""The audit reports, built from the offset runs' Arrow table, against their rules written
plainly in Python over rows: ``audit`` is the runs themselves (times as timestamps), and
``audit_modules`` has one row per module sha256 seen in runs, filter loads or admin decisions,
with the union of its names, signer key ids, instances and topics, its sums and its first
and last times."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from sluice.spark_audit import reports

_DECISIONS = ("kept", "rewritten", "dropped", "rejected", "detections", "errors",
              "filter_time_ns")
_MODULES = st.sampled_from([None, "aa", "bb", "cc"])
_NAMES = st.lists(st.sampled_from(["pii", "schema", "mask"]), max_size=3, unique=True)
_TIME = st.one_of(st.none(), st.integers(1_795_000_000_000, 1_795_100_000_000))

_RUN = st.fixed_dictionaries({
    "module_sha256": _MODULES,
    "api": st.sampled_from([None, "produce", "fetch"]),
    "topic": st.sampled_from([None, "orders", "users"]),
    "partition": st.sampled_from([None, 0, 1]),
    "run": st.integers(1, 3),
    "offset_first": st.one_of(st.none(), st.integers(0, 100)),
    "offset_last": st.one_of(st.none(), st.integers(0, 100)),
    "filter_names": _NAMES,
    "signer_key_ids": st.lists(st.sampled_from(["00000000000000a1", "00000000000000b2"]),
                               max_size=2, unique=True),
    "batches": st.integers(0, 50),
    "records": st.integers(0, 500),
    **{c: st.integers(0, 2**40) for c in _DECISIONS},
    "proxy_instances": st.lists(st.sampled_from(["i1", "i2"]), max_size=2, unique=True),
    "proxy_hosts": st.lists(st.sampled_from(["h1", "h2"]), max_size=2, unique=True),
    "time_first_ms": _TIME,
    "time_last_ms": _TIME,
    "_rows": st.integers(1, 9),
})
_LOAD = st.fixed_dictionaries({
    "module_sha256": _MODULES, "filter_name": st.sampled_from([None, "pii", "loader"]),
    "instance_id": st.sampled_from([None, "i1", "i3"]),
    "topics": st.lists(st.sampled_from(["orders", "audit"]), max_size=2, unique=True),
    "apply_to": st.lists(st.sampled_from(["produce", "fetch"]), max_size=2, unique=True),
    "first_ms": _TIME, "last_ms": _TIME,
})
_ADMIN = st.fixed_dictionaries({
    "module_sha256": _MODULES, "filter_name": st.sampled_from([None, "policy"]),
    "instance_id": st.sampled_from([None, "i4"]), "count": st.integers(0, 9),
    "decision": st.sampled_from(["allow", "deny", "error"]),
})


def _time(ms: int | None) -> datetime | None:
    return None if ms is None else datetime.fromtimestamp(ms / 1000, tz=UTC)


def _least(values: list[Any]) -> Any:
    present = [v for v in values if v is not None]
    return min(present) if present else None


def _most(values: list[Any]) -> Any:
    present = [v for v in values if v is not None]
    return max(present) if present else None


def _plain_modules(runs: list[dict[str, Any]], loads: list[dict[str, Any]],
                   admins: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for m in {r["module_sha256"] for r in runs + loads + admins}:
        t = [r for r in runs if r["module_sha256"] == m]
        lo = [r for r in loads if r["module_sha256"] == m]
        ad = [r for r in admins if r["module_sha256"] == m]
        row = {
            "module_sha256": m,
            "filter_names": sorted({n for r in t for n in r["filter_names"]}
                                   | {r["filter_name"] for r in lo + ad} - {None}),
            "signer_key_ids": sorted({key for r in t for key in r["signer_key_ids"]}),
            "proxy_instances": sorted({i for r in t for i in r["proxy_instances"]}
                                      | {r["instance_id"] for r in lo + ad} - {None}),
            "proxy_hosts": sorted({h for r in t for h in r["proxy_hosts"]}),
            "bound_topics": sorted({x for r in lo for x in r["topics"]}),
            "apply_to": sorted({x for r in lo for x in r["apply_to"]}),
            "apis": sorted({r["api"] for r in t} - {None}),
            "topics": sorted({r["topic"] for r in t} - {None}),
            "batches": sum(r["batches"] for r in t),
            **{c: sum(r[c] for r in t) for c in _DECISIONS},
            "admin_items": sum(r["count"] for r in ad),
            "admin_denied": sum(r["count"] for r in ad if r["decision"] == "deny"),
            "topic_partitions": len({(r["topic"], r["partition"]) for r in t}),
            "first_loaded": _time(_least([r["first_ms"] for r in lo])),
            "last_loaded": _time(_most([r["last_ms"] for r in lo])),
            "first_seen": _time(_least([r["time_first_ms"] for r in t])),
            "last_seen": _time(_most([r["time_last_ms"] for r in t])),
        }
        out.append(row)
    return out


def _runs_table(runs: list[dict[str, Any]]) -> pa.Table:
    """The runs as ``Rollup.final_table`` types them."""
    names = pa.list_(pa.string())
    schema = pa.schema([
        (k, names if isinstance(v, list) else pa.string() if isinstance(v, str) or k in (
            "module_sha256", "api", "topic") else pa.int64())
        for k, v in (runs[0].items() if runs else [])
    ])
    return pa.Table.from_pylist(runs, schema=schema) if runs else pa.table({})


def _key(row: dict[str, Any]) -> str:
    return repr(sorted(row.items()))


@settings(max_examples=150, deadline=None)
@given(runs=st.lists(_RUN, max_size=25), loads=st.lists(_LOAD, max_size=5),
       admins=st.lists(_ADMIN, max_size=5))
def test_audit_modules_equal_the_plain_rule(runs: list[dict[str, Any]],
                                            loads: list[dict[str, Any]],
                                            admins: list[dict[str, Any]]) -> None:
    got = reports.audit_modules(_runs_table(runs), loads, admins)
    assert got.schema == reports.SCHEMAS["audit_modules"]
    assert sorted(got.to_pylist(), key=_key) == sorted(_plain_modules(runs, loads, admins),
                                                       key=_key)
    assert got["module_sha256"].to_pylist() == sorted(
        {r["module_sha256"] for r in runs + loads + admins}, key=lambda m: (m is not None, m))


@settings(max_examples=100, deadline=None)
@given(runs=st.lists(_RUN, max_size=25))
def test_audit_is_the_runs(runs: list[dict[str, Any]]) -> None:
    got = reports.audit(_runs_table(runs))
    assert got.schema == reports.SCHEMAS["audit"]
    want = [{**{f.name: r.get(f.name) for f in reports.SCHEMAS["audit"]},
             "time_first": _time(r["time_first_ms"]), "time_last": _time(r["time_last_ms"])}
            for r in runs]
    assert sorted(got.to_pylist(), key=_key) == sorted(want, key=_key)
