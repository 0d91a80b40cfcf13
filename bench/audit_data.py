"""Generated telemetry for the audit benchmark, in the columnar layout, built with pyarrow.

``generate(n, directory)`` writes what a fleet of three proxies would have published for ``n``
events spread over 24 hours: the event datasets one row per event, and the rollups
(``offset_run`` segments, ``finding`` counters) as the proxy's columnar sink builds them, one
per key and rotation interval (``ROTATE_MS``, the sink's default 300 s), segments also cut at
offset gaps. Everything is vectorised (pyarrow compute, no per-event Python), so 10 million
events take seconds.

Event mix (as the JSON benchmark had it): 85 % record_batch (produce and fetch, 50 topics x 12
partitions, 3 proxy instances, 200 clients, one or two filters with detectors), 10 %
connection, 4 % admin, 1 % filter_loaded. Each topic-partition has one api and consecutive
offsets, with a 5-offset gap every 1000 batches.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from sluice.telemetry_schema.columns import SCHEMAS
from sluice.telemetry_schema.integrity import Tagger

T0_MS = 1_795_000_000_000
SPAN_MS = 24 * 3600 * 1000
ROTATE_MS = 300_000
PII_SHA = "9f" * 32
SCHEMA_SHA = "3c" * 32
POLICY_SHA = "a7" * 32

_L = pa.int64()


@dataclass(frozen=True)
class Clock:
    """The generated events' times: ``events`` spread evenly over ``span_ms`` from ``T0_MS``."""

    events: int
    span_ms: int = SPAN_MS


def _lit(value: object, n: int, type_: pa.DataType) -> pa.Array:
    return pa.repeat(pa.scalar(value, type_), n)


def _mod(a: pa.Array, m: int) -> pa.Array:
    return pc.subtract(a, pc.multiply(pc.divide(a, m), m))


def _names(prefix: str, count: int, index: pa.Array) -> pa.Array:
    """``prefix + str(index)`` for small index ranges (a lookup, not string building)."""
    return pa.array([f"{prefix}{k}" for k in range(count)], pa.string()).take(index)


def _ids(n: int) -> pa.Array:
    return pc.subtract(pc.cumulative_sum(_lit(1, n, _L)), 1)


def _table(dataset: str, columns: dict[str, pa.Array]) -> pa.Table:
    schema = SCHEMAS[dataset]
    n = len(next(iter(columns.values())))
    arrays = [
        columns[f.name].cast(f.type) if f.name in columns else pa.nulls(n, f.type) for f in schema
    ]
    return pa.Table.from_arrays(arrays, schema=schema)


def _envelope(i: pa.Array, clock: Clock) -> dict[str, pa.Array]:
    n = len(i)
    instance = _mod(i, 3)
    return {
        "schema_version": _lit(1, n, pa.int32()),
        "event_id": pc.binary_join_element_wise(
            _names("inst-", 3, instance), pc.cast(i, pa.string()), "-"
        ),
        "time_ms": pc.add(pc.divide(pc.multiply(i, clock.span_ms), clock.events), T0_MS),
        "host": _names("host-", 3, instance),
        "pid": pc.add(instance, 1000),
        "instance_id": _names("inst-", 3, instance),
    }


def _client(i: pa.Array) -> dict[str, pa.Array]:
    client_no = _mod(pc.multiply(i, 7919), 200)
    return {
        "connection_id": _names("c-", 5000, _mod(i, 5000)),
        "client_address": _lit("10.0.0.1:40000", len(i), pa.string()),
        "client_id": _names("client-", 200, client_no),
        "principal": _names("user-", 50, _mod(client_no, 50)),
    }


def _select(ids: pa.Array, lo: int, hi: int) -> pa.Array:
    kind = _mod(ids, 100)
    return ids.filter(pc.and_(pc.greater_equal(kind, lo), pc.less(kind, hi)))


def _record_batches(i: pa.Array, clock: Clock) -> tuple[pa.Table, pa.Table]:
    """record_batch rows, and the per-filter rows the proxy would roll up."""
    n = len(i)
    topic_no = _mod(i, 50)
    seq = pc.divide(i, 600)
    offset_first = pc.add(pc.multiply(seq, 10), pc.multiply(pc.divide(seq, 1000), 5))
    two_filters = pc.equal(_mod(topic_no, 3), 0)
    pii_ns = pc.add(_mod(i, 5000), 20_000)
    schema_ns = pc.add(_mod(i, 1000), 5_000)
    api = pc.if_else(
        pc.equal(_mod(topic_no, 2), 0),
        _lit("produce", n, pa.string()),
        _lit("fetch", n, pa.string()),
    )
    size = pc.add(_mod(i, 500), 1000)
    cols = {
        **_envelope(i, clock),
        **_client(i),
        "api": api,
        "topic": _names("topic-", 50, topic_no),
        "partition": _mod(pc.divide(i, 50), 12),
        "offset_first": offset_first,
        "offset_last": pc.add(offset_first, 9),
        "records_in": _lit(10, n, _L),
        "records_out": _lit(10, n, _L),
        "bytes_in": size,
        "bytes_out": size,
        "batches": _lit(1, n, _L),
        "filters": pc.if_else(two_filters, _lit(2, n, pa.int32()), _lit(1, n, pa.int32())),
        "filter_time_ns": pc.add(pii_ns, pc.if_else(two_filters, schema_ns, _lit(0, n, _L))),
        "error_code": _lit(0, n, pa.int32()),
        "dead_letters": _lit(0, n, _L),
    }
    batches = _table("record_batch", cols)
    base = {
        k: cols[k]
        for k in ("time_ms", "host", "instance_id", "api", "topic", "partition",
                  "offset_first", "offset_last")
    }
    base["gap"] = pc.divide(seq, 1000)
    mod3 = _mod(i, 3)
    email, phone = mod3, _mod(i, 2)
    pii = pa.table(
        {
            **base,
            "module_sha256": _lit(PII_SHA, n, pa.string()),
            "filter_name": _lit("pii", n, pa.string()),
            "kept": pc.subtract(10, mod3),
            "rewritten": mod3,
            "dropped": _lit(0, n, _L),
            "rejected": _lit(0, n, _L),
            "detections": pc.add(email, phone),
            "errors": pc.cast(pc.equal(_mod(i, 10007), 0), _L),
            "time_ns": pii_ns,
            "email": email,
            "phone": phone,
        }
    )
    mask = two_filters
    m = pc.sum(pc.cast(mask, _L)).as_py() or 0
    schema_rows = pa.table(
        {
            **{k: v.filter(mask) for k, v in base.items()},
            "module_sha256": _lit(SCHEMA_SHA, m, pa.string()),
            "filter_name": _lit("schema", m, pa.string()),
            "kept": _lit(10, m, _L),
            "rewritten": _lit(0, m, _L),
            "dropped": _lit(0, m, _L),
            "rejected": _lit(0, m, _L),
            "detections": _lit(0, m, _L),
            "errors": _lit(0, m, _L),
            "time_ns": schema_ns.filter(mask),
            "email": _lit(0, m, _L),
            "phone": _lit(0, m, _L),
        }
    )
    return batches, pa.concat_tables([pii, schema_rows])


_SEGMENT_KEYS = ["instance_id", "host", "module_sha256", "filter_name", "api", "topic",
                 "partition", "window", "gap"]


def _versions(groups: pa.Table, keys: list[str], sums: list[str], firsts: list[str]
              ) -> tuple[pa.Table, pa.Array, pa.Array]:
    """Per-flush rows of rollups (``groups``: one row per key and flush, with a ``flush``
    column) as the cumulative versions a live sink sends, one per flush in which the rollup
    changed: ``sums`` summed and ``firsts`` (minima) taken from the rollup's first flush,
    everything else as the flush has it (the maxima: offsets and times grow). Returns (the
    rows, each row's rollup number, its version from 1)."""
    # The rollups need only be contiguous: sorting by each key's number in a dictionary of
    # its values costs less than comparing strings.
    numbers = {
        k: pc.fill_null(pc.cast(pc.dictionary_encode(groups.column(k).combine_chunks()).indices,
                                _L), -1)
        for k in keys
    }
    order = pc.sort_indices(pa.table({**numbers, "flush": groups.column("flush")}),
                            [(k, "ascending") for k in [*numbers, "flush"]])
    groups = groups.take(order)
    n = groups.num_rows
    new = np.zeros(n, dtype=bool)
    new[:1] = True
    for col in numbers.values():
        ordered = col.take(order).to_numpy()
        new[1:] |= ordered[1:] != ordered[:-1]
    number = np.cumsum(new) - 1
    starts = np.flatnonzero(new)
    version = np.arange(n) - starts[number] + 1
    columns = {name: groups.column(name) for name in groups.column_names}
    for c in sums:
        total = np.cumsum(groups.column(c).to_numpy())
        before = np.concatenate([[0], total])[starts][number]
        columns[c] = pa.array(total - before)
    for c in firsts:
        columns[c] = pa.array(groups.column(c).to_numpy()[starts][number])
    return pa.table(columns), pa.array(number), pa.array(version, pa.int32())


def _offset_runs(rows: pa.Table, flush_ms: int | None = None) -> tuple[pa.Table, pa.Table]:
    """The offset-run segments and findings of the filter ``rows``: their final state (one
    row each, as published files hold them), or with ``flush_ms`` every version a live Kafka
    sink flushing that often sends."""
    rows = rows.append_column("window", pc.divide(rows.column("time_ms"), ROTATE_MS))
    flush = (pc.divide(rows.column("time_ms"), flush_ms) if flush_ms
             else _lit(0, rows.num_rows, _L))  # one flush: the final state
    rows = rows.append_column("flush", flush)
    sums = ["kept", "rewritten", "dropped", "rejected", "detections", "errors", "time_ns"]
    seg = rows.group_by([*_SEGMENT_KEYS, "flush"], use_threads=False).aggregate(
        [("offset_first", "min"), ("offset_last", "max"), ("time_ms", "min"),
         ("time_ms", "max"), ("kept", "count"), *[(c, "sum") for c in sums]]
    )
    seg, number, version = _versions(
        seg, _SEGMENT_KEYS, ["kept_count", *[f"{c}_sum" for c in sums]],
        ["offset_first_min", "time_ms_min"])
    n = seg.num_rows
    runs = _table(
        "offset_run",
        {
            "schema_version": _lit(1, n, pa.int32()),
            "id": pc.binary_join_element_wise(
                _lit("bench-r", n, pa.string()), pc.cast(number, pa.string()), ""
            ),
            "version": version,
            **{k: seg.column(k) for k in _SEGMENT_KEYS[:7]},
            "offset_first": seg.column("offset_first_min"),
            "offset_last": seg.column("offset_last_max"),
            "batches": seg.column("kept_count"),
            **{c: seg.column(f"{c}_sum") for c in sums},
            "time_first_ms": seg.column("time_ms_min"),
            "time_last_ms": seg.column("time_ms_max"),
        },
    )
    finding_parts = []
    for detector in ("email", "phone"):
        hits = rows.filter(pc.greater(rows.column(detector), 0))
        finding_parts.append(_findings(hits, "detection", detector, hits.column(detector)))
    errors = rows.filter(pc.greater(rows.column("errors"), 0))
    finding_parts.append(
        _findings(errors, "filter_error", "trap: unreachable", errors.column("errors"))
    )
    return runs, pa.concat_tables(finding_parts)


def _findings(rows: pa.Table, kind: str, name: str, n: pa.Array) -> pa.Table:
    keys = ["instance_id", "api", "topic", "filter_name", "module_sha256", "window"]
    t = rows.select([*keys, "time_ms", "flush"]).append_column("n", n)
    g = t.group_by([*keys, "flush"], use_threads=False).aggregate(
        [("n", "sum"), ("n", "count"), ("time_ms", "min"), ("time_ms", "max")]
    )
    g, number, version = _versions(g, keys, ["n_sum", "n_count"], ["time_ms_min"])
    m = g.num_rows
    return _table(
        "finding",
        {
            "schema_version": _lit(1, m, pa.int32()),
            "id": pc.binary_join_element_wise(
                _lit(f"bench-{kind}-{name}-", m, pa.string()), pc.cast(number, pa.string()), ""
            ),
            "version": version,
            **{k: g.column(k) for k in keys[:5]},
            "kind": _lit(kind, m, pa.string()),
            "name": _lit(name, m, pa.string()),
            "n": g.column("n_sum"),
            "events": g.column("n_count"),
            "time_first_ms": g.column("time_ms_min"),
            "time_last_ms": g.column("time_ms_max"),
        },
    )


def _connections(i: pa.Array, clock: Clock) -> tuple[pa.Table, pa.Table]:
    """Connections as the proxy records them: every connection has its own id, an ``open`` row
    without client id or principal (it precedes the first request) and a ``close`` row, on
    the same instance, that carries them (the job finds the identity of the open row)."""
    n = len(i)
    pos = _ids(n)
    closing = pc.equal(_mod(pos, 2), 1)
    # The open row of each pair names the connection (its id, instance and client).
    opener = i.take(pc.subtract(pos, _mod(pos, 2)))
    requests = _mod(i, 20)
    size = pc.add(_mod(i, 500), 1000)
    pair = _envelope(opener, clock)
    client = _client(opener)
    cols = {
        **_envelope(i, clock),
        **{k: pair[k] for k in ("instance_id", "host", "pid")},
        **client,
        "connection_id": pc.binary_join_element_wise(
            _lit("c", n, pa.string()), pc.cast(opener, pa.string()), "-"),
        "client_id": pc.if_else(closing, client["client_id"], pa.nulls(n, pa.string())),
        "principal": pc.if_else(closing, client["principal"], pa.nulls(n, pa.string())),
        "phase": pc.if_else(closing, _lit("close", n, pa.string()), _lit("open", n, pa.string())),
        "tls": _lit(False, n, pa.bool_()),
        "bytes_in": size,
        "bytes_out": size,
        "requests": pc.if_else(closing, pc.add(requests, 2), _lit(0, n, _L)),
        "duration_ms": pc.if_else(closing, _mod(i, 600_000), pa.nulls(n, _L)),
    }
    conn = _table("connection", cols)
    c = i.filter(closing)
    m = len(c)
    shared = {k: cols[k].filter(closing) for k in
              ("schema_version", "event_id", "time_ms", "instance_id", "connection_id",
               "client_id", "principal")}
    r = _mod(c, 20)
    produce = _table("connection_api", {**shared, "api": _lit("produce", m, pa.string()),
                                        "requests": r, "bytes_in": pc.multiply(r, 1000),
                                        "bytes_out": pc.multiply(r, 50)})
    metadata = _table("connection_api", {**shared, "api": _lit("metadata", m, pa.string()),
                                         "requests": _lit(2, m, _L), "bytes_in": _lit(120, m, _L),
                                         "bytes_out": _lit(900, m, _L)})
    return conn, pa.concat_tables([produce, metadata])


def _admin(i: pa.Array, clock: Clock) -> pa.Table:
    n = len(i)
    deny = pc.equal(_mod(i, 7), 0)
    return _table(
        "admin",
        {
            **_envelope(i, clock),
            **_client(i),
            "op": _lit("create_topics", n, pa.string()),
            "resource_type": _lit("topic", n, pa.string()),
            "resource": _names("new-topic-", 97, _mod(i, 97)),
            "decision": pc.if_else(deny, _lit("deny", n, pa.string()),
                                   _lit("allow", n, pa.string())),
            "message": pc.if_else(deny, _lit("partitions > 12", n, pa.string()),
                                  pa.nulls(n, pa.string())),
            "filter_name": _lit("policy", n, pa.string()),
            "module_sha256": _lit(POLICY_SHA, n, pa.string()),
            "error_code": _lit(0, n, pa.int32()),
            "time_ns": _lit(1000, n, _L),
        },
    )


def _filter_loaded(i: pa.Array, clock: Clock) -> pa.Table:
    n = len(i)
    return _table(
        "filter_loaded",
        {
            **_envelope(i, clock),
            "filter_name": _lit("pii", n, pa.string()),
            "module_sha256": _lit(PII_SHA, n, pa.string()),
            "topics": pa.array([["topic-*"]] * n, pa.list_(pa.string())),
            "apply_to": pa.array([["fetch", "produce"]] * n, pa.list_(pa.string())),
        },
    )


def tables(n: int, flush_ms: int | None = None, span_ms: int = SPAN_MS
           ) -> dict[str, pa.Table]:
    """Every dataset of ``n`` generated events spread over ``span_ms``, as the fleet's sinks
    would publish them in files, or with ``flush_ms`` as a Kafka sink flushing that often sends
    them (every version of the rollups: see ``_offset_runs``)."""
    ids = _ids(n)
    clock = Clock(n, span_ms)
    batches, filter_rows = _record_batches(_select(ids, 0, 85), clock)
    runs, found = _offset_runs(filter_rows, flush_ms)
    conn, per_api = _connections(_select(ids, 85, 95), clock)
    return {
        "record_batch": batches,
        "offset_run": runs,
        "finding": found,
        "connection": conn,
        "connection_api": per_api,
        "admin": _admin(_select(ids, 95, 99), clock),
        "filter_loaded": _filter_loaded(_select(ids, 99, 100), clock),
    }


def write_layout(data: dict[str, pa.Table], directory: Path, tagger: Tagger | None = None
                 ) -> None:
    """One Parquet file per dataset and hour, in the sink's ``date=/hour=`` folders; with
    ``tagger`` each with its tag, as the sink writes them with a telemetry key."""
    from sluice.proxy.telemetry.parquet import publish_table

    if directory.exists():
        shutil.rmtree(directory)
    for dataset, table in data.items():
        publish_table(directory, dataset, table, "bench-000001", fsync=False, tagger=tagger)


def generate(n: int, directory: Path, tagger: Tagger | None = None) -> int:
    """Write ``n`` events' telemetry under ``directory``; returns the number of events."""
    write_layout(tables(n), directory, tagger)
    return n


