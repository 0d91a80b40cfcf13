"""Property tests of the audit job's Arrow aggregations (``spark_audit.partials``) and of the
task planning and row classification around them (``spark_audit.rollups``).

- split invariance: for every rollup, ``final`` over the partials of any split of the input
  into contiguous chunks equals ``final`` over one partial of all rows, and ``final_table``
  gives the same rows (hypothesis);
- offset runs against a pure-Python island computation;
- connections split at time cut points: the same result, and every ``open`` counted under the
  identity its connection's other rows carry; the same from dictionary columns as files give
  them;
- ``plan_tasks``: every file in exactly one unit per rollup, whole hours of both connection
  datasets together, at most ``TASKS_PER_CORE`` tasks per core;
- ``classify``: which rows are malformed, of an unknown version, or usable;
- ``floor_to`` against Python's floor division, over chunks, nulls and times before 1970.

Pure pyarrow: no Spark session is started.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Callable, Mapping, Sequence
from itertools import pairwise
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sluice.spark_audit import partials
from sluice.spark_audit.partials import Rollup
from sluice.spark_audit.schema import MALFORMED, SKIP, UNKNOWN_VERSION
from sluice.telemetry_schema.columns import HOUR_MS, SCHEMAS, time_column

pytest.importorskip("pyspark")  # rollups imports pyspark (no session is started)

from sluice.spark_audit import rollups
from sluice.spark_audit.sources import LocalFile, Window

SETTINGS = settings(max_examples=60, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

# Few distinct values per column, so that groups collide; None is always one of them.
_STRINGS = [None, "a", "b"]
_SKIPS = [None, None, None, None, MALFORMED, UNKNOWN_VERSION]
_LISTS = st.one_of(st.none(), st.lists(st.sampled_from(["x", "y", "z"]), max_size=3))
_SMALL = st.one_of(st.none(), st.integers(0, 5))
_TIME = st.integers(0, 3 * HOUR_MS)

# -- building tables -------------------------------------------------------------------------


def _schema(dataset: str, columns: Sequence[str]) -> pa.Schema:
    fields = [SCHEMAS[dataset].field(c) for c in columns if c != SKIP]
    return pa.schema([*fields, pa.field(SKIP, pa.string())])


def _table(dataset: str, columns: Sequence[str], rows: list[dict[str, Any]]) -> pa.Table:
    return pa.Table.from_pylist(rows, schema=_schema(dataset, columns))


def _value(dtype: pa.DataType) -> st.SearchStrategy[Any]:
    if pa.types.is_string(dtype):
        return st.sampled_from(_STRINGS)
    if pa.types.is_integer(dtype):
        return _SMALL
    if pa.types.is_list(dtype):
        return _LISTS
    raise AssertionError(f"no strategy for {dtype}")


# Offset pairs: both null, or first <= last in a narrow range (so that ranges overlap, touch
# and leave gaps).
_OFFSETS = st.one_of(
    st.just((None, None)),
    st.tuples(st.integers(0, 30), st.integers(0, 4)).map(lambda p: (p[0], p[0] + p[1])),
)
_OFFSET_PAIRS = {
    "offset_run": ("offset_first", "offset_last"),
    "encryption": ("offset_first", "offset_last"),
    "transform_batch": ("input_offset_first", "input_offset_last"),
}


@st.composite
def _row(draw: st.DrawFn, dataset: str, columns: Sequence[str]) -> dict[str, Any]:
    schema = SCHEMAS[dataset]
    skip = draw(st.sampled_from(_SKIPS))
    row: dict[str, Any] = {}
    for c in columns:
        if c != SKIP:
            row[c] = draw(_value(schema.field(c).type))
    pair = _OFFSET_PAIRS.get(dataset)
    if pair is not None:
        row[pair[0]], row[pair[1]] = draw(_OFFSETS)
    tcol = time_column(dataset)
    if tcol in row:
        row[tcol] = draw(_TIME if skip is None else st.one_of(st.none(), _TIME))
    if "time_last_ms" in row and row.get("time_first_ms") is not None:
        row["time_last_ms"] = row["time_first_ms"] + draw(st.integers(0, HOUR_MS))
    row[SKIP] = skip
    return row


def _cut(n: int, draw: st.DrawFn) -> list[tuple[int, int]]:
    """Random contiguous (start, stop) chunks covering 0..n (some may be empty)."""
    cuts = sorted(draw(st.lists(st.integers(0, n), max_size=4)))
    bounds = [0, *cuts, n]
    return list(pairwise(bounds))


def _sorted_rows(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return sorted(rows, key=lambda r: repr(sorted(r.items())))


def _final(rollup: Rollup, tables: Sequence[Mapping[str, pa.Table]]) -> list[dict[str, Any]]:
    got: dict[str, list[pa.Table]] = {}
    for t in tables:
        for name, part in rollup.partial(t).items():
            got.setdefault(name, []).append(part)
    return _sorted_rows(rollup.final(got))


# -- 1. split invariance ---------------------------------------------------------------------

SINGLE = {
    "record_batches": partials.record_batches,
    "offset_runs": partials.offset_runs,
    "findings": partials.findings,
    "admin": partials.admin,
    "drops": partials.drops,
    "encryption": partials.encryption,
    "transform_runs": partials.transform_runs,
    "filter_loads": partials.filter_loads,
}


@st.composite
def _split_case(draw: st.DrawFn, make: Callable[[], Rollup]
                ) -> tuple[Rollup, pa.Table, list[pa.Table]]:
    rollup = make()
    (dataset,) = rollup.datasets
    columns = rollup.columns[dataset]
    rows = draw(st.lists(_row(dataset, columns), max_size=30))
    table = _table(dataset, columns, rows)
    chunks = [table.slice(a, b - a) for a, b in _cut(len(rows), draw)]
    return rollup, table, chunks


@pytest.mark.parametrize("name", sorted(SINGLE))
@SETTINGS
@given(data=st.data())
def test_split_invariance(name: str, data: st.DataObject) -> None:
    rollup, table, chunks = data.draw(_split_case(SINGLE[name]))
    (dataset,) = rollup.datasets
    whole = _final(rollup, [{dataset: table}])
    split = _final(rollup, [{dataset: c} for c in chunks])
    assert split == whole
    # ``final_table``: the same rows as one Arrow table (Arrow-built or from the dicts).
    for parts in ([{dataset: table}], [{dataset: c} for c in chunks]):
        got: dict[str, list[pa.Table]] = {}
        for t in parts:
            for part_name, part in rollup.partial(t).items():
                got.setdefault(part_name, []).append(part)
        assert _sorted_rows(rollup.final_table(got).to_pylist()) == whole
    if rollup.merges_in_arrow:  # a task merges its chunks' partials before the driver does
        merged = rollup.merge_partials([rollup.partial({dataset: c}) for c in chunks])
        assert _sorted_rows(rollup.final({k: [v] for k, v in merged.items()})) == whole
    # Every row (usable or skipped) is counted once.
    if name != "transform_runs":  # counts events, not rows (``_first_row``)
        assert sum(r["_rows"] for r in whole) == table.num_rows


def test_split_invariance_example_batches() -> None:
    """Two chunks of the same group: sums add, minima and maxima combine, skipped rows fall
    into one group per reason with blank keys."""
    rollup = partials.record_batches()
    cols = rollup.columns["record_batch"]
    base = {c: None for c in cols}
    rows = [
        {**base, "principal": "p", "api": "produce", "time_ms": 10, "records_in": 2,
         "bytes_in": 5, "error_code": 0},
        {**base, "principal": "p", "api": "produce", "time_ms": 20, "records_in": 3,
         "bytes_in": 7, "error_code": 3},
        {**base, "principal": "q", "time_ms": 30, SKIP: MALFORMED},
        {**base, "principal": "r", "time_ms": None, SKIP: MALFORMED},
    ]
    table = _table("record_batch", cols, rows)
    split = _final(rollup, [{"record_batch": table.slice(0, 1)},
                            {"record_batch": table.slice(1)}])
    assert split == _final(rollup, [{"record_batch": table}])
    usable = [r for r in split if r[SKIP] is None]
    assert len(usable) == 1
    (u,) = usable
    assert (u["principal"], u["batches"], u["records_in"], u["bytes_in"], u["errors"]) == (
        "p", 2, 5, 12, 1)
    assert (u["_first_ms"], u["_last_ms"], u["bucket"]) == (10, 20, 0)
    (s,) = [r for r in split if r[SKIP] == MALFORMED]
    assert (s["principal"], s["_rows"], s["_first_ms"], s["_last_ms"]) == (None, 2, 30, 30)


# -- 2. offset runs against a reference ------------------------------------------------------


def _reference_runs(rows: list[dict[str, Any]]
                    ) -> tuple[dict[tuple[Any, ...], tuple[int, int, int, list[str]]],
                               Counter[Any]]:
    """({(key..., run): (offset_first, offset_last, rows, signer key ids)}, rows without
    offsets per key)."""
    by_key: dict[tuple[Any, ...], list[tuple[int, int, str | None]]] = defaultdict(list)
    no_offsets: Counter[Any] = Counter()
    for r in rows:
        if r[SKIP] is not None:
            continue
        key = tuple(r[k] for k in partials.RUN_KEYS)
        if r["offset_first"] is None:
            no_offsets[key] += 1
        else:
            by_key[key].append((r["offset_first"], r["offset_last"], r["signer_key_id"]))
    runs: dict[tuple[Any, ...], tuple[int, int, int, list[str]]] = {}
    for key, intervals in by_key.items():
        number, lo, hi, n, signers = 0, 0, 0, 0, set()
        for first, last, signer in sorted(intervals, key=lambda i: (i[0], i[1])):
            if number and first <= hi + 1:
                hi, n = max(hi, last), n + 1
            else:
                if number:
                    runs[(*key, number)] = (lo, hi, n, sorted(signers - {None}))
                number, lo, hi, n, signers = number + 1, first, last, 1, set()
            signers.add(signer)
        runs[(*key, number)] = (lo, hi, n, sorted(signers - {None}))
    return runs, no_offsets


def _check_runs(rows: list[dict[str, Any]], got: list[dict[str, Any]]) -> None:
    runs, no_offsets = _reference_runs(rows)
    usable = [r for r in got if r[SKIP] is None]
    got_runs = {(*(r[k] for k in partials.RUN_KEYS), r["run"]):
                (r["offset_first"], r["offset_last"], r["_rows"], r["signer_key_ids"])
                for r in usable if r["run"] is not None}
    assert got_runs == runs
    got_none = Counter({tuple(r[k] for k in partials.RUN_KEYS): r["_rows"]
                        for r in usable if r["run"] is None})
    assert got_none == no_offsets
    skipped = Counter(r[SKIP] for r in rows if r[SKIP] is not None)
    assert {r[SKIP]: r["_rows"] for r in got if r[SKIP] is not None} == skipped
    assert all(r["run"] is None for r in got if r[SKIP] is not None)


@SETTINGS
@given(data=st.data())
def test_offset_runs_reference(data: st.DataObject) -> None:
    rollup = partials.offset_runs()
    cols = rollup.columns["offset_run"]
    rows = data.draw(st.lists(_row("offset_run", cols), max_size=30))
    table = _table("offset_run", cols, rows)
    _check_runs(rows, _final(rollup, [{"offset_run": table}]))
    chunks = [table.slice(a, b - a) for a, b in _cut(len(rows), data.draw)]
    _check_runs(rows, _final(rollup, [{"offset_run": c} for c in chunks]))


def _numbered_one_by_one(rows: list[dict[str, Any]]) -> list[int | None]:
    """``number_runs``'s rule row by row, over rows sorted as it sorts them."""
    out: list[int | None] = []
    prev_key, reach, number = object(), None, 0
    for r in rows:
        if (r["k"], r[SKIP]) != prev_key:
            prev_key, reach, number = (r["k"], r[SKIP]), None, 0
        lo, hi = r["lo"], r["hi"]
        if lo is None:
            out.append(None)
            continue
        if reach is None or lo > reach + 1:
            number += 1
        out.append(number if r[SKIP] is None else None)
        if hi is not None and (reach is None or hi > reach):
            reach = hi
    return out


_EDGE_OFFSETS = st.one_of(st.none(), st.integers(-3, 12),
                          st.sampled_from([-(2**63), -(2**63) + 1, 2**63 - 2, 2**63 - 1]))


@SETTINGS
@given(rows=st.lists(st.fixed_dictionaries({
    "k": st.one_of(st.none(), st.sampled_from(["a", "b"])),
    SKIP: st.one_of(st.none(), st.just(MALFORMED)),
    "lo": _EDGE_OFFSETS, "hi": _EDGE_OFFSETS,
}), max_size=40))
def test_number_runs_one_by_one(rows: list[dict[str, Any]]) -> None:
    """Any offsets (a last offset missing or below the first, int64's ends): the vectorised
    numbering equals the rule applied row by row."""
    table = pa.Table.from_pylist(rows, schema=pa.schema([
        ("k", pa.string()), (SKIP, pa.string()), ("lo", pa.int64()), ("hi", pa.int64())]))
    got = partials.number_runs(table, ["k"], "lo", "hi").to_pylist()
    assert [r["run"] for r in got] == _numbered_one_by_one(got)


def test_offset_runs_example() -> None:
    """Overlap and touch merge, a gap starts run 2; split so that the bridge is in another
    chunk than the two ranges it joins."""
    rollup = partials.offset_runs()
    cols = rollup.columns["offset_run"]
    base = {c: None for c in cols}
    key = {"module_sha256": "m", "api": "produce", "topic": "t", "partition": 0}

    def seg(first: int | None, last: int | None, **kw: Any) -> dict[str, Any]:
        return {**base, **key, "offset_first": first, "offset_last": last, "batches": 1,
                "time_first_ms": 1, **kw}

    rows = [seg(0, 4), seg(10, 12), seg(5, 9), seg(14, 15), seg(None, None),
            seg(0, 100, **{SKIP: UNKNOWN_VERSION})]
    table = _table("offset_run", cols, rows)
    got = _final(rollup, [{"offset_run": table.slice(0, 2)}, {"offset_run": table.slice(2)}])
    assert got == _final(rollup, [{"offset_run": table}])
    usable = {r["run"]: (r["offset_first"], r["offset_last"], r["batches"])
              for r in got if r[SKIP] is None}
    assert usable == {1: (0, 12, 3), 2: (14, 15, 1), None: (None, None, 1)}
    (skipped,) = [r for r in got if r[SKIP] is not None]
    assert (skipped["run"], skipped["module_sha256"], skipped["_rows"]) == (None, None, 1)


# -- 3. connections --------------------------------------------------------------------------

_CONN = partials.connections()
_IDENTITIES = st.tuples(st.sampled_from([None, "alice", "bob"]),
                        st.sampled_from([None, "c1", "c2"]))


@st.composite
def _connections(draw: st.DrawFn) -> tuple[list[dict[str, Any]], Counter[Any]]:
    """Rows (tagged ``_ds``) of a few connections, and how many were opened per identity."""
    rows: list[dict[str, Any]] = []
    opened: Counter[Any] = Counter()
    for n in range(draw(st.integers(0, 6))):
        instance = draw(st.sampled_from(["i1", "i2"]))
        principal, client_id = draw(_IDENTITIES)
        ident = {"instance_id": instance, "connection_id": f"c{n}", "principal": principal,
                 "client_id": client_id}
        t = draw(st.integers(0, 3 * HOUR_MS))
        rows.append({**ident, "_ds": "connection", "principal": None, "client_id": None,
                     "phase": "open", "time_ms": t, SKIP: None})
        later = 0
        for _ in range(draw(st.integers(0, 3))):
            t += draw(st.integers(1, HOUR_MS))
            later += 1
            rows.append({**ident, "_ds": "connection_api", "time_ms": t, SKIP: None,
                         "api": draw(st.sampled_from(["produce", "fetch"])),
                         "requests": draw(_SMALL), "bytes_in": draw(_SMALL),
                         "bytes_out": draw(_SMALL)})
        if draw(st.integers(0, 4)) > 0:  # usually closed
            t += draw(st.integers(1, HOUR_MS))
            later += 1
            rows.append({**ident, "_ds": "connection", "phase": "close", "time_ms": t,
                         SKIP: None, "requests": draw(_SMALL), "bytes_in": draw(_SMALL),
                         "duration_ms": draw(_SMALL), "throttle_ms": draw(_SMALL)})
        # An open with no later row has nothing to take an identity from.
        opened[(principal, client_id) if later else (None, None)] += 1
    for _ in range(draw(st.integers(0, 3))):  # skipped rows, anywhere
        rows.append({"_ds": draw(st.sampled_from(["connection", "connection_api"])),
                     "instance_id": "i1", "connection_id": draw(st.sampled_from(["c0", "x"])),
                     "principal": "mallory", "phase": draw(st.sampled_from(["open", "close"])),
                     "time_ms": draw(st.one_of(st.none(), _TIME)),
                     SKIP: draw(st.sampled_from([MALFORMED, UNKNOWN_VERSION]))})
    return rows, opened


def _conn_tables(rows: list[dict[str, Any]]) -> dict[str, pa.Table]:
    out = {}
    for ds in ("connection", "connection_api"):
        cols = _CONN.columns[ds]
        out[ds] = _table(ds, cols, [{c: r.get(c) for c in cols if c != SKIP} | {SKIP: r[SKIP]}
                                    for r in rows if r["_ds"] == ds])
    return out


@SETTINGS
@given(data=st.data())
def test_connections_split_by_time(data: st.DataObject) -> None:
    rows, opened = data.draw(_connections())
    cuts = sorted(data.draw(st.lists(_TIME, max_size=4)))
    bounds = [None, *cuts, None]
    chunks: list[list[dict[str, Any]]] = [[] for _ in range(len(bounds) - 1)]
    for r in rows:
        t = r["time_ms"]
        if t is None:  # a malformed row: any task may read it
            chunks[data.draw(st.integers(0, len(chunks) - 1))].append(r)
            continue
        for i, (lo, hi) in enumerate(pairwise(bounds)):
            if (lo is None or t >= lo) and (hi is None or t < hi):
                chunks[i].append(r)
    assert sum(map(len, chunks)) == len(rows)
    whole = _final(_CONN, [_conn_tables(rows)])
    split = _final(_CONN, [_conn_tables(c) for c in chunks])
    assert split == whole
    got: Counter[Any] = Counter()
    for r in split:
        if r[SKIP] is None and r["_type"] == "connection" and r["connections_opened"]:
            got[(r["principal"], r["client_id"])] += r["connections_opened"]
    assert got == +opened
    # Every row is counted once, skipped or not.
    assert sum(r["_rows"] for r in split) == len(rows)
    # The summary's counts of the rows as one Arrow table (``collect``'s ``tables``).
    got_parts: dict[str, list[pa.Table]] = {}
    for c in chunks:
        for name, part in _CONN.partial(_conn_tables(c)).items():
            got_parts.setdefault(name, []).append(part)
    as_table = rollups.split_counts({"conns": _CONN.final_table(got_parts)})
    as_rows = rollups.split_counts({"conns": _CONN.final(got_parts)})
    assert as_table[1] == as_rows[1]
    assert _sorted_rows(as_table[0]["conns"].to_pylist()) == _sorted_rows(as_rows[0]["conns"])


@SETTINGS
@given(data=st.data())
def test_connections_any_split_without_whole_connections(data: st.DataObject) -> None:
    """Kafka tasks hold whatever their partition held: rows of one connection in any tasks,
    in any order. Without ``whole_connections`` the result is still the whole table's."""
    rows, opened = data.draw(_connections())
    n = data.draw(st.integers(1, 4))
    chunks: list[list[dict[str, Any]]] = [[] for _ in range(n)]
    for r in data.draw(st.permutations(rows)):
        chunks[data.draw(st.integers(0, n - 1))].append(r)
    got_parts: dict[str, list[pa.Table]] = {}
    for chunk in chunks:
        for name, part in _CONN.partial(_conn_tables(chunk), whole_connections=False).items():
            got_parts.setdefault(name, []).append(part)
    split = _sorted_rows(_CONN.final(got_parts))
    assert split == _final(_CONN, [_conn_tables(rows)])
    got: Counter[Any] = Counter()
    for r in split:
        if r[SKIP] is None and r["_type"] == "connection" and r["connections_opened"]:
            got[(r["principal"], r["client_id"])] += r["connections_opened"]
    assert got == +opened


def _as_files(table: pa.Table, columns: Sequence[str], cuts: Sequence[int],
              repeat: bool) -> pa.Table:
    """``table`` as read from several files: ``columns`` dictionary-encoded per piece (cut at
    ``cuts``), as Parquet's reader gives them; with ``repeat``, each piece's dictionary holds
    its first value twice and the rows use both."""
    bounds = [0, *sorted({c for c in cuts if 0 < c < table.num_rows}), table.num_rows]
    pieces = []
    for lo, hi in pairwise(bounds):
        piece = table.slice(lo, hi - lo)
        for c in columns:
            encoded = piece[c].combine_chunks().dictionary_encode()
            if repeat and len(encoded.dictionary):
                values = pa.concat_arrays([encoded.dictionary, encoded.dictionary.slice(0, 1)])
                twin = len(encoded.dictionary)
                indices = [None if i is None else twin if i == 0 and n % 2 else i
                           for n, i in enumerate(encoded.indices.to_pylist())]
                encoded = pa.DictionaryArray.from_arrays(pa.array(indices, pa.int32()), values)
            piece = piece.set_column(piece.schema.get_field_index(c), c, encoded)
        pieces.append(piece)
    if not pieces:
        return table
    schema = pieces[0].schema
    return pa.concat_tables([t.cast(schema) for t in pieces])


@SETTINGS
@given(data=st.data())
def test_connections_from_dictionary_columns(data: st.DataObject) -> None:
    """The connections' string columns read as dictionaries (``Rollup.dictionary``, one
    dictionary per file, the same value in several of them or twice in one) give what the
    plain strings give."""
    rows, _opened = data.draw(_connections())
    repeat = data.draw(st.booleans())
    plain = _conn_tables(rows)
    read = {ds: _as_files(t, [c for c in _CONN.dictionary if c in t.column_names],
                          data.draw(st.lists(st.integers(0, t.num_rows), max_size=3)), repeat)
            for ds, t in plain.items()}
    assert any(pa.types.is_dictionary(f.type) for t in read.values() for f in t.schema) or \
        not any(t.num_rows for t in plain.values())
    assert _final(_CONN, [read]) == _final(_CONN, [plain])


def test_encoded_unifies_file_dictionaries() -> None:
    one = pa.array(["b", "a", None, "b"]).dictionary_encode()
    two = pa.array(["c", "a"]).dictionary_encode()
    encoded = partials._encoded(pa.chunked_array([one, two]))
    assert encoded.to_pylist() == ["b", "a", None, "b", "c", "a"]
    assert sorted(encoded.dictionary.to_pylist()) == ["a", "b", "c"]
    twice = pa.DictionaryArray.from_arrays(pa.array([0, 1, 0], pa.int32()), pa.array(["x", "x"]))
    encoded = partials._encoded(pa.chunked_array([twice]))
    assert encoded.dictionary.to_pylist() == ["x"]  # encoded again from the values
    assert encoded.indices.to_pylist() == [0, 0, 0]


def test_connections_example() -> None:
    """A connection open in one chunk and closed in the next is resolved by the driver; one
    whose rows are all in one chunk by the task."""
    rows = [
        {"_ds": "connection", "instance_id": "i", "connection_id": "1", "phase": "open",
         "time_ms": 0, SKIP: None},
        {"_ds": "connection_api", "instance_id": "i", "connection_id": "1", "principal": "p",
         "client_id": "c", "api": "produce", "requests": 3, "time_ms": 5, SKIP: None},
        {"_ds": "connection", "instance_id": "i", "connection_id": "2", "phase": "open",
         "time_ms": 6, SKIP: None},
        {"_ds": "connection", "instance_id": "i", "connection_id": "2", "phase": "close",
         "principal": "q", "client_id": "d", "time_ms": 7, SKIP: None},
        {"_ds": "connection", "instance_id": "i", "connection_id": "1", "phase": "close",
         "principal": "p", "client_id": "c", "time_ms": HOUR_MS + 1, SKIP: None},
    ]
    split = _final(_CONN, [_conn_tables(rows[:4]), _conn_tables(rows[4:])])
    assert split == _final(_CONN, [_conn_tables(rows)])
    conn = {(r["principal"], r["client_id"], r["hour_ms"]):
            (r["connections_opened"], r["connections_closed"])
            for r in split if r["_type"] == "connection"}
    assert conn == {("p", "c", 0): (1, 0), ("p", "c", HOUR_MS): (0, 1), ("q", "d", 0): (1, 1)}
    (api,) = [r for r in split if r["_type"] == "connection_api"]
    assert (api["principal"], api["api"], api["requests"], api["_instances"]) == (
        "p", "produce", 3, ["i"])


# -- 4. plan_tasks ---------------------------------------------------------------------------

_HOURS = [f"2024-01-01/{h:02d}" for h in range(6)]


@st.composite
def _files(draw: st.DrawFn) -> tuple[list[LocalFile], dict[str, int]]:
    picks = draw(st.lists(st.tuples(st.sampled_from(sorted(SCHEMAS)), st.sampled_from(_HOURS),
                                    st.integers(0, 1000)), max_size=40))
    files, sizes = [], {}
    for n, (dataset, hour, size) in enumerate(picks):
        path = f"/data/{dataset}/{hour}/{n}.parquet"
        files.append(LocalFile(dataset, hour, path))
        sizes[path] = size
    return files, sizes


@SETTINGS
@given(case=_files(), cores=st.integers(1, 5))
def test_plan_tasks(case: tuple[list[LocalFile], dict[str, int]], cores: int) -> None:
    files, sizes = case
    standard = partials.standard()
    tasks = rollups.plan_tasks(files, standard, cores, size=sizes.__getitem__)
    assert len(tasks) <= rollups.TASKS_PER_CORE * cores
    assert all(t.units for t in tasks)
    by_path = {f.path: f for f in files}
    seen: dict[str, Counter[str]] = {name: Counter() for name in standard}
    for task in tasks:
        for name, unit in task.units:
            datasets = standard[name].datasets
            in_unit = set()
            for dataset, paths in unit:
                assert dataset in datasets
                for p in paths:
                    assert by_path[p].dataset == dataset
                    seen[name][p] += 1
                    in_unit.add(p)
            # A unit holds whole hours of all the rollup's datasets.
            hours = {by_path[p].hour for p in in_unit}
            whole = {f.path for f in files if f.dataset in datasets and f.hour in hours}
            assert in_unit == whole
    for name, rollup in standard.items():
        expected = Counter(f.path for f in files if f.dataset in rollup.datasets)
        assert seen[name] == expected


def test_plan_tasks_connection_hours() -> None:
    files = [LocalFile(ds, h, f"/{ds}/{h}") for ds in ("connection", "connection_api")
             for h in _HOURS[:4]]
    tasks = rollups.plan_tasks(files, {"conns": _CONN}, 2, size=lambda p: 100)
    units = [dict(unit) for t in tasks for _name, unit in t.units]
    assert len(units) > 1  # the hours are split over several units
    for unit in units:
        hours = {p.rsplit("/", 1)[1] for p in unit["connection"]}
        assert hours == {p.rsplit("/", 1)[1] for p in unit["connection_api"]}


# -- 5. classify -----------------------------------------------------------------------------


@pytest.mark.parametrize("dataset", ["record_batch", "offset_run"])
def test_classify(dataset: str) -> None:
    tcol = time_column(dataset)
    table = pa.table({
        "schema_version": pa.array([None, 1, 2, 1, 2, None], pa.int32()),
        tcol: pa.array([5, None, 5, 5, None, None], pa.int64()),
    })
    got = rollups.classify(table, dataset)
    assert got.to_pylist() == [MALFORMED, MALFORMED, UNKNOWN_VERSION, None, UNKNOWN_VERSION,
                               MALFORMED]


@SETTINGS
@given(rows=st.lists(st.tuples(st.sampled_from([None, 1, 1, 1, 2]),
                               st.sampled_from([None, 5, 7, 9])), max_size=20))
def test_classify_is_the_plain_rule(rows: list[tuple[int | None, int | None]]) -> None:
    """Whatever the mix (every row usable takes a shortcut): no version or, of this version,
    no time is malformed; another version is unknown; the rest usable."""
    table = pa.table({"schema_version": pa.array([v for v, _ in rows], pa.int32()),
                      "time_ms": pa.array([t for _, t in rows], pa.int64())})
    got = rollups.classify(table, "record_batch")
    assert got.type == pa.string()
    assert got.to_pylist() == [
        MALFORMED if v is None or (v == 1 and t is None) else None if v == 1 else UNKNOWN_VERSION
        for v, t in rows
    ]


# -- 5. run_file_task: files read in chunks, older files ------------------------------------


def test_file_task_in_chunks_equals_one_read(tmp_path: Any, monkeypatch: Any) -> None:
    """Record batch files read a chunk at a time, their partials merged in the task, give
    what one read of all of them gives; a file written before a column existed reads it as
    nulls."""
    import pyarrow.parquet as pq

    schema = SCHEMAS["record_batch"]
    paths = []
    for n in range(4):
        rows = [{"schema_version": 1, "time_ms": n * 1000 + i, "principal": "pq"[i % 2],
                 "client_id": "c", "topic": f"t{i % 3}", "api": "produce", "host": "h",
                 "instance_id": "i", "records_in": i, "bytes_in": 10 * i,
                 "filter_time_ns": 7} for i in range(50)]
        table = pa.Table.from_pylist(rows, schema=schema)
        if n == 2:  # an older file: no filter time column at all
            table = table.drop_columns(["filter_time_ns"])
        path = str(tmp_path / f"{n}.parquet")
        pq.write_table(table, path)
        paths.append(path)
    wanted = {"batches": partials.record_batches()}
    task = rollups.FileTask((("batches", (("record_batch", tuple(paths)),)),))

    def finals(chunk_bytes: int) -> list[dict[str, Any]]:
        monkeypatch.setattr(rollups, "CHUNK_BYTES", chunk_bytes)
        got: dict[str, list[pa.Table]] = {}
        for part, data in rollups.run_file_task(task, wanted, Window()):
            got.setdefault(part, []).append(pa.ipc.open_stream(data).read_all())
        return _sorted_rows(wanted["batches"].final(got))

    whole = finals(1 << 40)
    assert finals(1) == whole  # one file at a time
    assert sum(r["batches"] for r in whole) == 200
    assert sum(r["filter_time_ns"] for r in whole) == 150 * 7
    assert sum(r["bytes_in"] for r in whole) == 4 * 10 * sum(range(50))


_TIMES = st.lists(st.one_of(st.none(), st.integers(-(2**52), 2**52)), max_size=30)


@given(chunks=st.lists(_TIMES, max_size=4), step=st.sampled_from([1, 60_000, HOUR_MS, 86_400_000]),
       int32=st.booleans())
@SETTINGS
def test_floor_to_is_floor_division(chunks: list[list[int | None]], step: int,
                                    int32: bool) -> None:
    if int32:
        chunks = [[None if t is None else t % 2**31 for t in c] for c in chunks]
    times = pa.chunked_array(chunks, pa.int32() if int32 else pa.int64())
    got = partials.floor_to(times, step)
    assert got.type == pa.int64()
    assert got.to_pylist() == [None if t is None else t // step * step
                               for c in chunks for t in c]


@given(lists=st.lists(st.one_of(st.none(), st.lists(st.one_of(st.none(), st.sampled_from(
    ["b", "a", "é", "B", "", "a b"])), max_size=5)), max_size=12))
@SETTINGS
def test_sorted_lists(lists: list[list[str | None] | None]) -> None:
    got = partials.sorted_lists(pa.chunked_array([lists[:3], lists[3:]], pa.list_(pa.string())))
    assert got.to_pylist() == [sorted(v for v in (items or []) if v is not None)
                               for items in lists]


@pytest.mark.parametrize("name", sorted(SINGLE))
@SETTINGS
@given(data=st.data())
def test_split_counts_of_a_table_equal_those_of_its_rows(name: str,
                                                         data: st.DataObject) -> None:
    rollup, _table, chunks = data.draw(_split_case(SINGLE[name]))
    (dataset,) = rollup.datasets
    got: dict[str, list[pa.Table]] = {}
    for c in chunks:
        for part_name, part in rollup.partial({dataset: c}).items():
            got.setdefault(part_name, []).append(part)
    final = rollup.final_table(got)
    usable_t, counts_t = rollups.split_counts({rollup.name: final})
    usable_r, counts_r = rollups.split_counts({rollup.name: final.to_pylist()})
    assert counts_t == counts_r
    assert _sorted_rows(usable_t[rollup.name].to_pylist()) == _sorted_rows(usable_r[rollup.name])
