"""The pending produce path (`pipeline.filter_produce` with lz4 batches decompressed into
guest memory) against the opened path, through chains of several filters and filters that
drop, reject, trap or return a section the check refuses, and batches whose declared count
and last offset delta agree with each other but not with their records."""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import Any

import pytest

from sluice.codec import lz4_section
from sluice.codec.batch_limits import BatchLimits
from sluice.codec.compression import CODEC_LZ4
from sluice.codec.records import BatchHeader, Record, build_batch, crc32c
from sluice.filters import pipeline
from sluice.filters.chain import FilterChain
from sluice.filters.config import FilterSpec
from sluice.filters.context import RecordContext
from sluice.filters.pipeline import ProduceOutcome, filter_produce

pytestmark = pytest.mark.skipif(not lz4_section.AVAILABLE,
                                reason="no liblz4.so.1 or native module on this host")

def _batch(values: list[bytes], producer_id: int = -1) -> bytes:
    recs = [Record(j, j, None, v, [("h", b"v")]) for j, v in enumerate(values)]
    n = len(recs)
    seq = 0 if producer_id >= 0 else -1
    return build_batch(BatchHeader(0, 0, 0, 2, 0, CODEC_LZ4, n - 1, 1_700_000_000,
                                   1_700_000_000 + n - 1, producer_id, seq, seq, n), recs)


def _recounted(batch: bytes, count: int) -> bytes:
    """`batch` declaring `count` records and a last offset delta to match (the CRC right)."""
    out = bytearray(batch)
    struct.pack_into(">i", out, 23, count - 1)
    struct.pack_into(">i", out, 57, count)
    struct.pack_into(">I", out, 17, crc32c(memoryview(out)[21:]))
    return bytes(out)


def _summary(outcome: ProduceOutcome) -> tuple[Any, ...]:
    return (None if outcome.records is None else bytes(outcome.records), outcome.error_code,
            outcome.error_message, outcome.record_errors, outcome.changed, outcome.all_dropped,
            outcome.records_in, outcome.records_out,
            [(s.name, s.kept, s.rewritten, s.dropped, s.rejected, s.errors, s.failure)
             for s in outcome.stats],
            [(d.topic, d.key, d.value, d.headers) for d in outcome.dead_letters])


def _both(chain: FilterChain, data: bytes, monkeypatch: pytest.MonkeyPatch,
          limits: BatchLimits, topic: str = "orders"
          ) -> tuple[tuple[Any, ...], tuple[Any, ...], int]:
    """(outcome with pending sections, outcome opened in Python, pending sections written)."""
    written: list[int] = []
    real_write = lz4_section.PendingSection.write_into

    def spy(self: lz4_section.PendingSection, address: int) -> int:
        written.append(self.count)
        return real_write(self, address)

    ctx = RecordContext(topic, 0, "produce", "app", None)
    with monkeypatch.context() as m:
        m.setattr(lz4_section.PendingSection, "write_into", spy)
        pending = _summary(filter_produce(chain, ctx, data, limits=limits))
    with monkeypatch.context() as m:
        m.setattr(pipeline, "PENDING_AVAILABLE", False)
        m.setattr(pipeline, "_finisher", lambda header, fetch=True: lambda section, n: None)
        opened = _summary(filter_produce(chain, ctx, data, limits=limits))
    return pending, opened, len(written)


def _builtin(name: str) -> FilterSpec:
    """A shipped filter; "locked" is rules with one instance under its lock, which is not
    offered the finish (the others are stateless: pooled, offered it)."""
    drop = {"rules": [{"field": "type", "action": "drop", "when": {"equals": "debug"}}]}
    module, config = {
        "mask": ("builtin:pii-mask", {}),
        "rules": ("builtin:rules", drop),
        "locked": ("builtin:rules", drop),
        "valid": ("builtin:json-validate", {"action": "reject"}),
    }[name]
    return FilterSpec(name=name, module=module, config=config, topics=("orders", "trap"),
                      apply_to=frozenset({"produce"}), timeout_ms=10_000,
                      stateless=name != "locked")


VALUES = {
    "rewrite": [b'{"email": "ann@example.com", "type": "click"}', b'{"type": "click"}'],
    "keep": [b'{"type": "click"}', b'{"n": 1}'],
    "drop": [b'{"email": "bo@example.com", "type": "debug"}', b'{"type": "click"}'],
    "reject": [b'{"email": "cy@example.com"}', b"not json"],
}


CHAINS = [(order, "orders") for order in ("mask", "rules", "valid", "mask,rules", "rules,mask",
                                         "mask,valid,rules", "locked", "mask,locked", "upper",
                                         "mask,upper")]
CHAINS += [(order, topic) for order in ("bad", "mask,bad", "bad,mask") for topic in ("orders",
                                                                                 "trap")]


@pytest.mark.parametrize(("order", "topic"), CHAINS)
@pytest.mark.parametrize("producer_id", [-1, 7])
@pytest.mark.parametrize("kind", sorted(VALUES))
def test_chains_and_failing_filters_give_the_same_outcome(
        make_spec: Callable[..., FilterSpec], make_chain: Callable[..., FilterChain],
        monkeypatch: pytest.MonkeyPatch, order: str, topic: str, producer_id: int,
        kind: str) -> None:
    """native_bad ("bad") answers every records call with a section the check refuses (its
    sluice_filter keeps every record), and traps on the topic "trap"; sluice_upper
    ("upper") has no records entry point, so its chains take no pending section."""
    specs = []
    for name in order.split(","):
        if name in ("bad", "upper"):
            module = "native_bad" if name == "bad" else "sluice_upper"
            specs.append(make_spec(module, name=name, topics=("orders", "trap"),
                                   apply_to=frozenset({"produce"}), on_error="dead-letter",
                                   dead_letter_topic="dlq", stateless=True, timeout_ms=10_000))
        else:
            specs.append(_builtin(name))
    chain = make_chain(*specs)
    native = "upper" not in order
    assert (chain.pending_room(topic, "produce") > 0) == native
    data = _batch(VALUES[kind], producer_id)
    pending, opened, written = _both(chain, data, monkeypatch, BatchLimits(), topic)
    assert pending == opened
    assert written >= native


@pytest.mark.parametrize("count", [1, 2, 4, 5])
@pytest.mark.parametrize("max_headers", [1000, 1])
def test_a_count_and_offset_delta_that_agree_but_not_with_the_records(
        make_chain: Callable[..., FilterChain], monkeypatch: pytest.MonkeyPatch,
        count: int, max_headers: int) -> None:
    """Declared 1-5 records (last offset delta to match) in a section of 3: the section's
    own check refuses it before any filter runs, with the opened path's code and message."""
    chain = make_chain(_builtin("mask"))
    data = _recounted(_batch([b"a", b'{"email": "ann@example.com"}', b"c"]), count)
    limits = BatchLimits(max_headers=max_headers)
    pending, opened, written = _both(chain, data, monkeypatch, limits)
    assert pending == opened and written == 1
    assert pending[1] in (pipeline.CORRUPT_MESSAGE, pipeline.MESSAGE_TOO_LARGE)
    assert pending[0] is None and not pending[8]
