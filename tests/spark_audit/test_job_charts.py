"""The HTML summary's traffic chart and topology from the record batch rollup's Arrow table
(``job._batch_traffic``, ``job._edges``), against the rule written plainly over its rows:
records out of the proxy, and bytes on the client's side (produce: in, fetch: out)."""

from __future__ import annotations

from typing import Any

import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from sluice.spark_audit import job

HOUR = 3_600_000
_ROW = st.fixed_dictionaries({
    "principal": st.sampled_from([None, "alice", "bob"]),
    "client_id": st.sampled_from([None, "app", ""]),
    "host": st.sampled_from([None, "h1"]),
    "instance_id": st.sampled_from([None, "i1", "i2"]),
    "topic": st.sampled_from([f"t{i}" for i in range(20)]),
    "api": st.sampled_from(["produce", "fetch"]),
    "bucket": st.integers(0, 50).map(lambda h: 1_795_000_000_000 // HOUR * HOUR + h * HOUR),
    "records_out": st.integers(0, 2**40),
    "bytes_in": st.integers(0, 2**40),
    "bytes_out": st.integers(0, 2**40),
})


def _client_bytes(r: dict[str, Any]) -> int:
    return int(r["bytes_in"] if r["api"] == "produce" else r["bytes_out"])


def _plain_edges(rows: list[dict[str, Any]]) -> list[job.Edge]:
    """Edges per (client, proxy, topic, API), the lightest names of each kind merged into
    "other ..." as ``job.TOPOLOGY_LIMITS`` says."""
    edges: dict[tuple[str, str, str, str], list[int]] = {}
    for r in rows:
        client = "/".join(p for p in (r["principal"], r["client_id"]) if p is not None)
        proxy = " ".join(p for p in (r["host"], r["instance_id"]) if p is not None)
        acc = edges.setdefault((client or "(anonymous)", proxy, r["topic"], r["api"]), [0, 0])
        acc[0] += r["records_out"]
        acc[1] += _client_bytes(r)
    weight: dict[str, dict[str, int]] = {"client": {}, "proxy": {}, "topic": {}}
    for (client, proxy, topic, _api), (records, _bytes) in edges.items():
        for kind, name in (("client", client), ("proxy", proxy), ("topic", topic)):
            weight[kind][name] = weight[kind].get(name, 0) + records
    keep = {kind: set(sorted(w, key=lambda n, w=w: (-w[n], n))[:job.TOPOLOGY_LIMITS[kind]])
            for kind, w in weight.items()}
    merged: dict[tuple[str, str, str, str], list[int]] = {}
    for (client, proxy, topic, api), (records, nbytes) in edges.items():
        acc = merged.setdefault((client if client in keep["client"] else "other clients",
                                 proxy if proxy in keep["proxy"] else "other proxies",
                                 topic if topic in keep["topic"] else "other topics", api),
                                [0, 0])
        acc[0] += records
        acc[1] += nbytes
    return [job.Edge(client=c, proxy=p, topic=t, api=a, records=v[0], bytes=v[1])
            for (c, p, t, a), v in sorted(merged.items())]


@settings(max_examples=100, deadline=None)
@given(st.lists(_ROW, max_size=40))
def test_edges_sum_records_and_client_side_bytes(rows: list[dict[str, Any]]) -> None:
    edges = job._edges(pa.Table.from_pylist(rows))
    assert edges == _plain_edges(rows)
    assert sum(e.records for e in edges) == sum(r["records_out"] for r in rows)
    assert sum(e.bytes for e in edges) == sum(_client_bytes(r) for r in rows)


@settings(max_examples=100, deadline=None)
@given(st.lists(_ROW, max_size=40), st.sampled_from([HOUR, 86_400_000]))
def test_batch_traffic_is_client_bytes_per_bucket(rows: list[dict[str, Any]],
                                                  bucket_ms: int) -> None:
    got = job._batch_traffic(pa.Table.from_pylist(rows), bucket_ms)
    plain: dict[tuple[Any, ...], int] = {}
    for r in rows:
        key = (r["principal"], r["client_id"], r["bucket"] // bucket_ms * bucket_ms)
        plain[key] = plain.get(key, 0) + _client_bytes(r)
    assert {(r["principal"], r["client_id"], r["bucket"]): r["bytes"] for r in got} == plain
    assert len(got) == len(plain)
