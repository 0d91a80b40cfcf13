"""The report tables, built in the driver from the small rollups that ``rollups`` collects.

Reports (column meanings are in docs/TELEMETRY.md, section "Reports"):
- ``audit``: per filter module (sha256), api, topic-partition and contiguous offset run.
- ``audit_modules``: one row per module sha256: where it was loaded and what it touched.
- ``billing``: per principal, client id, topic and hour: records/bytes produced and consumed,
  filter time.
- ``billing_connections``: per principal, client id, hour and API: connection-level traffic
  (also unfiltered), ``api = "*"`` rows hold the connection totals, quota throttle time
  included (``throttle_ms``).
- ``compliance``: long format, ``kind`` in detection, rejected, reject_reason, filter_error,
  partition_error, admin_deny, admin_error, telemetry_dropped.
- ``admin``: admin decisions per module, operation, resource and decision.
- ``transforms``: which transform and module versions wrote which output offsets (per output
  partition) from which input offsets (runs per input partition).
- ``encryption``: offset ranges sealed under each KEK version (``section = encrypted``) and
  what each principal read of encrypted topics (``section = read``), from the
  ``builtin:encrypt`` filter's counters.

Every function returns an Arrow table with the report's columns, sorted by its keys (nulls
first, as Spark sorts). Times are UTC timestamps (``timestamp[us, tz=UTC]``) in every report.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from pyarrow.compute import ScalarAggregateOptions

from sluice.spark_audit import partials

REPORT_NAMES = (
    "audit",
    "audit_modules",
    "billing",
    "billing_connections",
    "compliance",
    "admin",
    "transforms",
    "encryption",
)

_S, _L, _I = pa.string(), pa.int64(), pa.int32()
_T = pa.timestamp("us", tz="UTC")
_LIST = pa.list_(_S)

SCHEMAS: dict[str, pa.Schema] = {
    "audit": pa.schema(
        [("module_sha256", _S), ("api", _S), ("topic", _S), ("partition", _I), ("run", _L),
         ("offset_first", _L), ("offset_last", _L), ("filter_names", _LIST),
         ("signer_key_ids", _LIST), ("batches", _L),
         ("records", _L), ("kept", _L), ("rewritten", _L), ("dropped", _L), ("rejected", _L),
         ("detections", _L), ("errors", _L), ("filter_time_ns", _L), ("proxy_instances", _LIST),
         ("proxy_hosts", _LIST), ("time_first", _T), ("time_last", _T)]
    ),
    "audit_modules": pa.schema(
        [("module_sha256", _S), ("filter_names", _LIST), ("signer_key_ids", _LIST),
         ("proxy_instances", _LIST), ("proxy_hosts", _LIST), ("bound_topics", _LIST),
         ("apply_to", _LIST), ("apis", _LIST), ("topics", _LIST), ("batches", _L),
         ("kept", _L), ("rewritten", _L), ("dropped", _L), ("rejected", _L),
         ("detections", _L), ("errors", _L), ("filter_time_ns", _L),
         ("admin_items", _L), ("admin_denied", _L), ("topic_partitions", _L),
         ("first_loaded", _T), ("last_loaded", _T), ("first_seen", _T), ("last_seen", _T)]
    ),
    "billing": pa.schema(
        [("principal", _S), ("client_id", _S), ("topic", _S), ("hour", _T),
         *[(f"{api}_{col}", _L) for api in ("produce", "fetch")
           for col in ("batches", "records_in", "records_out", "bytes_in", "bytes_out")],
         ("produce_errors", _L), ("fetch_errors", _L), ("filter_time_ns", _L)]
    ),
    "billing_connections": pa.schema(
        [("principal", _S), ("client_id", _S), ("hour", _T), ("api", _S), ("requests", _L),
         ("bytes_in", _L), ("bytes_out", _L), ("connections_opened", _L),
         ("connections_closed", _L), ("duration_ms", _L), ("throttle_ms", _L)]
    ),
    "compliance": pa.schema(
        [("kind", _S), ("topic", _S), ("api", _S), ("filter_name", _S), ("module_sha256", _S),
         ("name", _S), ("count", _L), ("events", _L), ("first_time", _T), ("last_time", _T)]
    ),
    "admin": pa.schema(
        [("module_sha256", _S), ("filter_name", _S), ("op", _S), ("resource_type", _S),
         ("resource", _S), ("decision", _S), ("principal", _S), ("client_id", _S),
         ("count", _L), ("proxy_instances", _LIST), ("messages", _LIST), ("first_time", _T),
         ("last_time", _T)]
    ),
    "transforms": pa.schema(
        [("transform", _S), ("module_sha256s", _LIST), ("filter_names", _LIST),
         ("input_topic", _S), ("input_partition", _I), ("run", _L),
         ("input_offset_first", _L), ("input_offset_last", _L), ("output_topic", _S),
         ("output_partition", _I), ("output_offset_first", _L), ("output_offset_last", _L),
         ("batches", _L), ("input_records", _L), ("output_records", _L), ("dropped", _L),
         ("rejected", _L), ("dead_letters", _L), ("guarantees", _LIST), ("groups", _LIST),
         ("proxy_instances", _LIST), ("time_first", _T), ("time_last", _T)]
    ),
    "encryption": pa.schema(
        [("section", _S), ("topic", _S), ("partition", _I), ("key_name", _S),
         ("key_version", _S), ("principal", _S), ("offset_first", _L), ("offset_last", _L),
         ("records", _L), ("batches", _L), ("decrypted", _L), ("withheld", _L),
         ("unreadable", _L), ("failures", _L)]
    ),
}

HOUR_MS = 3_600_000
_DECISIONS = ("kept", "rewritten", "dropped", "rejected", "detections", "errors",
              "filter_time_ns")


def to_table(name: str, rows: Iterable[dict[str, Any]], keys: Sequence[str],
             nulls_last: Sequence[str] = ()) -> pa.Table:
    """Rows (times as epoch ms) -> the report's Arrow table, sorted by ``keys`` then by every
    other column so that equal keys still come out in one order (nulls first, or last for
    ``nulls_last``; a list column sorts as its items joined by a control character, which is
    the order of the items for names and sha256s)."""
    # Arrow converts the dicts itself (10x faster than a Python list per column).
    return sorted_report(name, pa.Table.from_pylist(list(rows), schema=_as_read(name)), keys,
                         nulls_last)


def _as_read(name: str) -> pa.Schema:
    """The report's schema with its times as epoch milliseconds (int64)."""
    return pa.schema([f.with_type(_L) if pa.types.is_timestamp(f.type) else f
                      for f in SCHEMAS[name]])


def sorted_report(name: str, read: pa.Table, keys: Sequence[str],
                  nulls_last: Sequence[str] = ()) -> pa.Table:
    """``to_table`` of a table with the report's columns in order (``_as_read``: times as
    epoch milliseconds)."""
    schema = SCHEMAS[name]
    table = pa.Table.from_arrays([
        pc.multiply_checked(col, 1000).cast(field.type) if pa.types.is_timestamp(field.type)
        else col
        for col, field in zip(read.columns, schema, strict=True)
    ], schema=schema)
    ordered = list(keys) + [c for c in schema.names if c not in keys]
    by = pa.table({
        f"k{i}": pc.binary_join(table[c], "\x1f") if pa.types.is_list(table[c].type)
        else table[c]
        for i, c in enumerate(ordered)
    })
    order = pc.sort_indices(by, sort_keys=[
        (f"k{i}", "ascending", "at_end" if c in nulls_last else "at_start")
        for i, c in enumerate(ordered)
    ])
    return table.take(order)


def _group(rows: Iterable[dict[str, Any]], key: Callable[[dict[str, Any]], tuple[Any, ...]]
           ) -> dict[tuple[Any, ...], list[dict[str, Any]]]:
    out: dict[tuple[Any, ...], list[dict[str, Any]]] = defaultdict(list)
    for r in rows:
        out[key(r)].append(r)
    return out


def _union(rows: Iterable[dict[str, Any]], col: str) -> list[str]:
    return sorted({v for r in rows for v in (r.get(col) or []) if v is not None})


def _min(values: Iterable[Any]) -> Any:
    present = [v for v in values if v is not None]
    return min(present) if present else None


def _max(values: Iterable[Any]) -> Any:
    present = [v for v in values if v is not None]
    return max(present) if present else None


def _report_columns(name: str, table: pa.Table, **sources: str) -> pa.Table:
    """The report's columns (times as epoch ms, ``_as_read``) from ``table``'s columns of the
    same names, or of the names in ``sources``; a column ``table`` lacks is null."""
    renamed = table.rename_columns([
        next((out for out, src in sources.items() if src == n), n) for n in table.column_names
    ])
    return _with_schema(renamed, _as_read(name))


def audit(runs: pa.Table) -> pa.Table:
    """From the offset runs' table (``Rollup.final_table``, usable rows)."""
    return sorted_report(
        "audit", _report_columns("audit", runs, time_first="time_first_ms",
                                 time_last="time_last_ms"),
        ["module_sha256", "api", "topic", "partition", "offset_first"],
        nulls_last=["offset_first"])


_M = "module_sha256"


def _distinct_per_module(modules: pa.ChunkedArray | pa.Array,
                         values: pa.ChunkedArray | pa.Array) -> dict[Any, list[Any]]:
    """Per module, the distinct non-null ``values`` of its rows, sorted."""
    grouped = pa.table({_M: modules, "v": values}).group_by([_M]).aggregate([("v", "distinct")])
    return {r[_M]: sorted(v for v in r["v_distinct"] if v is not None)
            for r in grouped.to_pylist()}


def _touched(runs: pa.Table) -> dict[Any, dict[str, Any]]:
    """Per module sha256: what its offset runs add to its ``audit_modules`` row, grouped in
    Arrow (the runs are the report's many rows: 11,628 on the bench)."""
    if runs.num_rows == 0:
        return {}
    counted = ScalarAggregateOptions(min_count=0)  # a module's sums are 0, never null
    sums = [(c, "sum", counted) for c in ("batches", *_DECISIONS)]
    per = runs.group_by([_M]).aggregate([*sums, ("time_first_ms", "min"),
                                          ("time_last_ms", "max")])
    partitions = runs.group_by([_M, "topic", "partition"]).aggregate([]).group_by([_M]) \
        .aggregate([([], "count_all")])
    lists = {
        col: _distinct_per_module(runs[_M].take(pc.list_parent_indices(runs[col])),
                                  pc.list_flatten(runs[col]))
        for col in ("filter_names", "signer_key_ids", "proxy_instances", "proxy_hosts")
    }
    apis = _distinct_per_module(runs[_M], runs["api"])
    topics = _distinct_per_module(runs[_M], runs["topic"])
    tp = {r[_M]: r["count_all"] for r in partitions.to_pylist()}
    out = {}
    for r in per.to_pylist():
        m = r[_M]
        out[m] = {
            **{col: lists[col].get(m, []) for col in lists},
            "apis": apis.get(m, []), "topics": topics.get(m, []),
            **{c: r[f"{c}_sum"] for c in ("batches", *_DECISIONS)},
            "topic_partitions": tp[m],
            "first_seen": r["time_first_ms_min"], "last_seen": r["time_last_ms_max"],
        }
    return out


def audit_modules(runs: pa.Table, loads: list[dict[str, Any]],
                  admin_rows: list[dict[str, Any]]) -> pa.Table:
    """From the offset runs' table (usable rows), the filter loads and admin decisions."""
    touched = _touched(runs)
    loaded = _group(loads, lambda r: (r[_M],))
    admins = _group(admin_rows, lambda r: (r[_M],))
    untouched: dict[str, Any] = {
        "filter_names": [], "signer_key_ids": [], "proxy_instances": [], "proxy_hosts": [],
        "apis": [], "topics": [],
        "batches": 0, **dict.fromkeys(_DECISIONS, 0), "topic_partitions": 0,
        "first_seen": None, "last_seen": None,
    }
    out = []
    for key in {(m,) for m in touched} | set(loaded) | set(admins):
        t, lo, ad = touched.get(key[0], untouched), loaded.get(key, []), admins.get(key, [])
        out.append({
            **t,
            _M: key[0],
            "filter_names": sorted(set(t["filter_names"])
                                   | {r["filter_name"] for r in lo + ad
                                      if r["filter_name"] is not None}),
            "proxy_instances": sorted(set(t["proxy_instances"])
                                      | {r["instance_id"] for r in lo + ad
                                         if r["instance_id"] is not None}),
            "bound_topics": _union(lo, "topics"),
            "apply_to": _union(lo, "apply_to"),
            "admin_items": sum(r["count"] for r in ad),
            "admin_denied": sum(r["count"] for r in ad if r["decision"] == "deny"),
            "first_loaded": _min(r["first_ms"] for r in lo),
            "last_loaded": _max(r["last_ms"] for r in lo),
        })
    return to_table("audit_modules", out, [_M])


_BILLED = ("batches", "records_in", "records_out", "bytes_in", "bytes_out", "errors")
_BATCH_ROWS = pa.schema([("principal", _S), ("client_id", _S), ("topic", _S), ("api", _S),
                         ("bucket", _L), *[(c, _L) for c in _BILLED], ("filter_time_ns", _L)])


def _with_schema(table: pa.Table, schema: pa.Schema) -> pa.Table:
    """``table``'s columns of ``schema``, cast to its types (a column it lacks: nulls)."""
    return pa.Table.from_arrays([
        table[f.name].cast(f.type) if f.name in table.column_names
        else pa.nulls(table.num_rows, f.type) for f in schema
    ], schema=schema)


def billing(batches: pa.Table) -> pa.Table:
    """Per principal, client id, topic and hour: each API's batches, records, bytes and
    errors, and the filters' time, from the record batch rollup's table. Grouped in Arrow (the
    bench's 12,750 rollup rows: 0.03-0.04 s instead of 0.14-0.15 s grouping them in
    Python)."""
    rows = _with_schema(batches, _BATCH_ROWS)
    columns: dict[str, Any] = {"principal": rows["principal"], "client_id": rows["client_id"],
                               "topic": rows["topic"],
                               "hour": partials.floor_to(rows["bucket"], HOUR_MS)}
    zero = pa.scalar(0, _L)
    for api in ("produce", "fetch"):
        mine = pc.fill_null(pc.equal(rows["api"], api), False)
        for col in _BILLED:
            columns[f"{api}_{col}"] = pc.if_else(mine, rows[col], zero)
    columns["filter_time_ns"] = rows["filter_time_ns"]
    keys = ["principal", "client_id", "topic", "hour"]
    sums = [partials.Agg(c, "sum", c) for c in columns if c not in keys]
    read = partials.group(pa.table(columns), keys, sums).select(_as_read("billing").names)
    return sorted_report("billing", read, ["hour", "principal", "client_id", "topic"])


def billing_connections(rows: list[dict[str, Any]]) -> pa.Table:
    return to_table(
        "billing_connections",
        [{**r, "hour": r["hour_ms"]} for r in rows],
        ["hour", "principal", "client_id", "api"],
    )


def compliance(
    found: list[dict[str, Any]], admin_rows: list[dict[str, Any]], drop_rows: list[dict[str, Any]]
) -> pa.Table:
    rows = [{**r, "first_time": r["first_ms"], "last_time": r["last_ms"]} for r in found]
    denied = _group(
        (r for r in admin_rows if r["decision"] in ("deny", "error")),
        lambda r: (f"admin_{r['decision']}", r["resource"], r["op"], r["filter_name"],
                   r["module_sha256"], r["message"] or ""),
    )
    for (kind, topic, api, filter_name, module, name), group in denied.items():
        rows.append({
            "kind": kind, "topic": topic, "api": api, "filter_name": filter_name,
            "module_sha256": module, "name": name,
            "count": sum(r["count"] for r in group), "events": sum(r["count"] for r in group),
            "first_time": _min(r["first_ms"] for r in group),
            "last_time": _max(r["last_ms"] for r in group),
        })
    gaps = _group(drop_rows, lambda r: (r["instance_id"], r["reason"] or ""))
    for (instance, reason), group in gaps.items():
        rows.append({
            "kind": "telemetry_dropped", "topic": None, "api": None, "filter_name": instance,
            "module_sha256": None, "name": reason,
            "count": sum(r["count"] for r in group), "events": sum(r["events"] for r in group),
            "first_time": _min(r["first_ms"] for r in group),
            "last_time": _max(r["last_ms"] for r in group),
        })
    return to_table("compliance", rows, ["kind", "topic", "api", "filter_name", "name"])


def admin(admin_rows: list[dict[str, Any]]) -> pa.Table:
    groups = _group(
        admin_rows,
        lambda r: (r["module_sha256"], r["filter_name"], r["op"], r["resource_type"],
                   r["resource"], r["decision"], r["principal"], r["client_id"]),
    )
    out = []
    for key, group in groups.items():
        out.append({
            **dict(zip(("module_sha256", "filter_name", "op", "resource_type", "resource",
                        "decision", "principal", "client_id"), key, strict=True)),
            "count": sum(r["count"] for r in group),
            "proxy_instances": sorted({r["instance_id"] for r in group
                                       if r["instance_id"] is not None}),
            "messages": sorted({r["message"] for r in group if r["message"] is not None})[:5],
            "first_time": _min(r["first_ms"] for r in group),
            "last_time": _max(r["last_ms"] for r in group),
        })
    return to_table("admin", out, ["module_sha256", "op", "resource", "decision"])


def transforms(runs: list[dict[str, Any]]) -> pa.Table:
    rows = [{**r, "time_first": r["time_first_ms"], "time_last": r["time_last_ms"]}
            for r in runs]
    return to_table("transforms", rows, ["transform", "input_topic", "input_partition", "run",
                                         "module_sha256s", "output_topic", "output_partition"])


ANONYMOUS = "User:ANONYMOUS"
_READ = ("decrypted", "withheld", "unreadable")


def encryption(key_rows: list[dict[str, Any]], batches: pa.Table) -> pa.Table:
    """``encrypted`` rows: per topic-partition and KEK version, the range of the broker's
    offsets of records sealed under it (a produce batch uses one data key). ``read`` rows: per
    topic the encrypt filter ran on and principal, records decrypted, withheld (received as
    stored) and unreadable (KEK deleted), and ``failures``: fetches of that topic answered
    with a partition error (KMS down, tampering), from the ``record_batch`` rollup."""
    out: list[dict[str, Any]] = []
    sealed = _group((r for r in key_rows if r["api"] == "produce" and r["key_name"] is not None),
                    lambda r: (r["topic"], r["partition"], r["key_name"], r["key_version"]))
    for (topic, partition, key_name, key_version), group in sealed.items():
        out.append({
            "section": "encrypted", "topic": topic, "partition": partition,
            "key_name": key_name, "key_version": key_version,
            "offset_first": _min(r["offset_first"] for r in group),
            "offset_last": _max(r["offset_last"] for r in group),
            "records": sum(r["records"] for r in group),
            "batches": sum(r["batches"] for r in group),
        })
    topics = {r["topic"] for r in key_rows}
    reads: dict[tuple[Any, str], dict[str, int]] = defaultdict(
        lambda: dict.fromkeys((*_READ, "failures"), 0))
    for r in key_rows:
        if r["api"] == "fetch":
            acc = reads[(r["topic"], r["principal"] or ANONYMOUS)]
            for col in _READ:
                acc[col] += r[col]
    if batches.num_rows and topics:
        encrypted = pa.array(sorted(topics, key=lambda t: (t is None, t or "")), _S)
        failed = pc.and_(pc.and_(pc.equal(batches["api"], "fetch"),
                                 pc.is_in(batches["topic"], encrypted)),
                         pc.greater(batches["errors"], 0))
        for r in batches.filter(pc.fill_null(failed, False)).select(
                ["topic", "principal", "errors"]).to_pylist():
            reads[(r["topic"], r["principal"] or ANONYMOUS)]["failures"] += r["errors"]
    for (topic, principal), counts in reads.items():
        if any(counts.values()):
            out.append({"section": "read", "topic": topic, "principal": principal, **counts})
    return to_table("encryption", out, ["section", "topic", "partition", "key_name",
                                        "key_version", "principal"])
