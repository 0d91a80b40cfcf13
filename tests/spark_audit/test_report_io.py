"""The report CSV writer (``spark_audit.report_io.csv_bytes``): it writes a table column-wise
in Arrow, and must write exactly what the per-field rule (``_csv_field``: nulls empty, empty
strings and fields with commas, quotes, line breaks or outer whitespace quoted, lists joined
with ``;``, times as ISO-8601 UTC milliseconds with ``Z``) gives field by field."""

from __future__ import annotations

import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from sluice.spark_audit import report_io

_TS = pa.timestamp("us", tz="UTC")
_TEXT = st.one_of(st.none(), st.text(max_size=6),
                  st.sampled_from(["", " a", "a ", "a,b", 'q"', "x\ny", "\xa0a", "a\u3000", "ok"]))


def _by_field(table: pa.Table) -> bytes:
    lines = [",".join(report_io._csv_field(n) for n in table.column_names)]
    for row in table.to_pylist():
        lines.append(",".join(report_io._csv_field(row[n]) for n in table.column_names))
    return ("\n".join(lines) + "\n").encode("utf-8")


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_column_wise_equals_field_by_field(data: st.DataObject) -> None:
    n = data.draw(st.integers(0, 8))
    table = pa.table({
        "count": pa.array(data.draw(st.lists(st.one_of(st.none(), st.integers(-2**63, 2**63 - 1)),
                                             min_size=n, max_size=n)), pa.int64()),
        "text": pa.array(data.draw(st.lists(_TEXT, min_size=n, max_size=n)), pa.string()),
        "names": pa.array(
            data.draw(st.lists(st.one_of(st.none(), st.lists(_TEXT.filter(lambda v: v is not None),
                                                             max_size=3)),
                               min_size=n, max_size=n)),
            pa.list_(pa.string())),
        "time": pa.array(data.draw(st.lists(
            st.one_of(st.none(), st.integers(0, 4_102_444_800_000_000)), min_size=n, max_size=n)),
            pa.int64()).cast(_TS),
    })
    assert report_io.csv_bytes(table) == _by_field(table)


def test_fields_as_documented() -> None:
    table = pa.table({
        "n": pa.array([5, None], pa.int64()),
        "s": pa.array(["a,b", ""], pa.string()),
        "l": pa.array([["x", "y"], []], pa.list_(pa.string())),
        "t": pa.array([1_795_575_331_123_456, None], pa.int64()).cast(_TS),
    })
    assert report_io.csv_bytes(table) == (
        b'n,s,l,t\n5,"a,b",x;y,2026-11-25T02:55:31.123Z\n,"","",\n'
    )
