"""One input partition's batch through a transform's filter chain (no IO).

`process_batch` takes the records a consumer read from one partition, runs them through the
chain as the proxy runs a batch (same modules, ABIs, failure policies and dead letters; a
failing batch is retried record by record, so a policy hits only the failing records), and
returns what to write: each kept or rewritten record with its key, value,
headers and the input record's timestamp, the dead letters, and the per-filter stats.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from sluice.filters.chain import ChainResult, DeadLetter, FilterChain, FilterStats
from sluice.filters.context import FilterRecord, Header, RecordContext
from sluice.filters.pipeline import _merge as merge_filter_stats
from sluice.transforms.config import TRANSFORM_DIRECTION
from sluice.transforms.partitioning import output_partition


@dataclass(frozen=True, slots=True)
class InputRecord:
    """A record read from an input partition (what the consumer handed over)."""

    offset: int
    timestamp: int | None  # milliseconds; None when the broker gave none
    key: bytes | None
    value: bytes | None
    headers: list[Header]


@dataclass(frozen=True, slots=True)
class OutputRecord:
    """A record to write to the output topic; `source_offset` is the input offset it came
    from."""

    partition: int
    key: bytes | None
    value: bytes | None
    headers: list[Header]
    timestamp: int | None
    source_offset: int


@dataclass(slots=True)
class BatchOutcome:
    """What one input batch became."""

    outputs: list[OutputRecord]
    dead_letters: list[DeadLetter]
    stats: list[FilterStats]
    rejected: list[tuple[int, str]]  # (index in the batch, reason)
    dropped: int


def process_batch(chain: FilterChain, ctx_name: str, topic: str, partition: int,
                  records: Sequence[InputRecord], *, input_partitions: int,
                  output_partitions: int) -> BatchOutcome:
    """Run one partition's records (in offset order) through `chain`.

    `ctx_name` is the client id the filters see (``sluice-transform:NAME``). A filter failure
    (trap, timeout, memory cap, bad output) fails the whole call, which inline means the whole
    batch; here the batch is then run again one record at a time, so the failure policy hits
    only the records the filter fails on, as a per-record stream processor would.
    """
    ctx = RecordContext(topic, partition, TRANSFORM_DIRECTION, client_id=ctx_name)
    if not records:
        return BatchOutcome([], [], [], [], 0)
    result = _run(chain, ctx, records)
    if len(records) > 1 and any(st.failure or st.errors for st in result.stats):
        parts = [_run(chain, ctx, [r]) for r in records]
        result = ChainResult(
            [p.records[0] for p in parts], [p.fates[0] for p in parts],
            {i: p.reasons[0] for i, p in enumerate(parts) if 0 in p.reasons},
            {i: p.by[0] for i, p in enumerate(parts) if 0 in p.by},
            [d for p in parts for d in p.dead_letters],
            _summed_stats(parts))
    outputs: list[OutputRecord] = []
    dropped = 0
    for i, out in enumerate(result.records):
        if out is None:
            if i not in result.reasons:
                dropped += 1
            continue
        source = records[i]
        outputs.append(OutputRecord(
            output_partition(out.key, partition, input_partitions, output_partitions),
            out.key, out.value, list(out.headers), source.timestamp, source.offset))
    return BatchOutcome(outputs, result.dead_letters, result.stats, result.rejected, dropped)


def _run(chain: FilterChain, ctx: RecordContext, records: Sequence[InputRecord]) -> ChainResult:
    base_offset = records[0].offset
    base_ts = records[0].timestamp or 0
    batch = [FilterRecord(r.offset - base_offset,
                          (r.timestamp - base_ts) if r.timestamp is not None else 0,
                          r.key, r.value, list(r.headers))
             for r in records]
    return chain.run_records(ctx, batch, offset_base=base_offset, timestamp_base=base_ts)


def _summed_stats(parts: list[ChainResult]) -> list[FilterStats]:
    """Per-filter stats of runs of the same chain, summed in filter order."""
    stats: list[FilterStats] = []
    for part in parts:
        merge_filter_stats(stats, part.stats)  # the pipeline's own sum over batches
    return stats
