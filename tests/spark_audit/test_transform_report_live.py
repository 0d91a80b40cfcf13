"""The ``transforms`` report from telemetry a real transform wrote (default Parquet sink) while
it ran against the real broker: its output offset ranges are where the records are."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from sluice.spark_audit.job import run_audit
from tests.harness.broker import TansuBroker
from tests.transforms.committed_log import committed_records
from tests.transforms.live_run import run_exactly_once_upper

pytestmark = [pytest.mark.spark, pytest.mark.timeout(900)]


def test_report_output_ranges_are_the_committed_offsets(
    spark: Any, broker: TansuBroker, tmp_path: Path
) -> None:
    bs = broker.bootstrap
    n = 300
    # record i: key-i, input partition i % 2, input offset i // 2; 3 output partitions, so
    # records of both inputs meet in each output
    run = run_exactly_once_upper(bs, tmp_path, n)
    src, dst, spec, sink = run.src, run.dst, run.spec, run.sink
    assert sink.stats()["dropped"] == 0

    # The broker's committed log: which output offsets hold which input record.
    truth: dict[tuple[int, int], list[tuple[int, int]]] = defaultdict(list)
    for q in range(3):
        for offset, key, _value in committed_records(bs, dst, q):
            assert key is not None
            i = int(key[4:])
            truth[(i % 2, q)].append((offset, i // 2))
    assert sum(len(v) for v in truth.values()) == n

    out = tmp_path / "report"
    result = run_audit(str(tmp_path / "tel"), str(out))
    rows = pq.read_table(out / "transforms.parquet").to_pylist()
    loaded = pq.read_table(next((tmp_path / "tel" / "transform_batch").rglob("*.parquet")))
    sha = loaded.column("module_sha256s")[0].as_py()
    assert result.events_by_type["transform_batch"] == len(
        {r["event_id"] for f in (tmp_path / "tel" / "transform_batch").rglob("*.parquet")
         for r in pq.read_table(f, columns=["event_id"]).to_pylist()})

    got = {(r["input_partition"], r["output_partition"]): r for r in rows}
    assert set(got) == set(truth)  # one run per input partition, split per output partition
    for (p, q), records in truth.items():
        r = got[(p, q)]
        out_offsets = [o for o, _i in records]
        in_offsets = [i for _o, i in records]
        assert (r["transform"], r["module_sha256s"], r["input_topic"], r["output_topic"]) == (
            spec.name, sha, src, dst)
        assert r["run"] == 1 and r["guarantees"] == ["exactly-once"]
        assert (r["output_offset_first"], r["output_offset_last"], r["output_records"]) == (
            min(out_offsets), max(out_offsets), len(records))
        # Batches are the grain: the run's input range holds every input offset written here.
        assert r["input_offset_first"] <= min(in_offsets)
        assert r["input_offset_last"] >= max(in_offsets)
    for p in (0, 1):
        mine = [r for r in rows if r["input_partition"] == p]
        assert min(r["input_offset_first"] for r in mine) == 0
        assert max(r["input_offset_last"] for r in mine) == n // 2 - 1
