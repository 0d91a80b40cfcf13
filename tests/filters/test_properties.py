"""Properties across the whole host path: any mix of decisions gives Kafka-valid batches, logs
never carry payloads, concurrent callers are serialised, YAML config to running chain."""

from __future__ import annotations

import textwrap
import threading
from collections.abc import Callable
from pathlib import Path

import pytest
import structlog
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sluice.codec.records import (
    BatchHeader,
    Record,
    build_batch,
    decode_records,
    split_batches,
    verify_crc,
)
from sluice.filters.chain import FilterChain
from sluice.filters.config import load_filter_specs
from sluice.filters.context import FilterRecord, RecordContext
from sluice.filters.pipeline import INVALID_RECORD, filter_fetch, filter_produce
from sluice.filters.runtime import LoadedFilter

# The chain fixture is reused across examples on purpose: loading is cached.
_FIXTURE_OK = [HealthCheck.function_scoped_fixture]

_value = st.one_of(
    st.none(),
    st.sampled_from([b"DROP", b"REJECT", b"UPPER", b"lower", b"MiXeD 123", b""]),
    st.binary(max_size=30).filter(lambda b: not b.startswith((b"TRAP", b"LOOP", b"GROW",
                                                              b"BADO", b"ERR", b"CFGL",
                                                              b"DROP", b"REJE"))),
)


def _batch(values: list[bytes | None], codec: int, pid: int, base_offset: int) -> bytes:
    recs = [Record(i, i * 3, b"k", v, []) for i, v in enumerate(values)]
    n = len(recs)
    header = BatchHeader(base_offset, 0, -1, 2, 0, codec, n - 1, 1000, 1000 + 3 * (n - 1),
                         pid, 0 if pid >= 0 else -1, 0 if pid >= 0 else -1, n)
    return build_batch(header, recs)


def _expected(v: bytes | None) -> bytes | str | None:
    if v is not None and v.startswith(b"DROP"):
        return "drop"
    if v is not None and v.startswith(b"REJECT"):
        return "reject"
    if v is None:
        return None
    return bytes(c - 32 if 97 <= c <= 122 else c for c in v)


@settings(max_examples=60, deadline=None, suppress_health_check=_FIXTURE_OK)
@given(values=st.lists(_value, min_size=1, max_size=12), codec=st.integers(0, 4),
       idempotent=st.booleans())
def test_produce_output_is_always_kafka_valid(make_chain: Callable[..., FilterChain],
                                              values: list[bytes | None], codec: int,
                                              idempotent: bool) -> None:
    chain = make_chain("sluice_upper")
    expected = [_expected(v) for v in values]
    out = filter_produce(chain, RecordContext("t", 0, "produce"),
                         _batch(values, codec, 77 if idempotent else -1, 0))
    if "reject" in expected or (idempotent and "drop" in expected):
        assert out.error_code == INVALID_RECORD and out.records is None
        assert out.record_errors and all(0 <= i < len(values) for i, _ in out.record_errors)
        return
    assert out.error_code == 0
    kept = [e for e in expected if e != "drop"]
    if not kept:
        assert out.all_dropped and out.records is None
        return
    assert out.records is not None
    (b,), tail = split_batches(out.records)
    assert len(tail) == 0 and verify_crc(b.data)
    h = b.header
    recs = decode_records(b)
    assert h.base_offset == 0 and h.record_count == len(recs) == h.last_offset_delta + 1
    assert [r.offset_delta for r in recs] == list(range(len(recs)))
    assert h.max_timestamp == h.base_timestamp + max(r.timestamp_delta for r in recs)
    assert [r.value for r in recs] == kept
    assert h.producer_id == (77 if idempotent else -1)


@settings(max_examples=40, deadline=None, suppress_health_check=_FIXTURE_OK)
@given(batches=st.lists(st.lists(_value, min_size=1, max_size=6), min_size=1, max_size=4),
       codec=st.integers(0, 4), cut=st.integers(0, 30))
def test_fetch_keeps_offsets_whatever_the_decisions(make_chain: Callable[..., FilterChain],
                                                    batches: list[list[bytes | None]],
                                                    codec: int, cut: int) -> None:
    chain = make_chain("sluice_upper")
    raw_parts = []
    offset = 100
    for values in batches:
        raw_parts.append(_batch(values, codec, -1, offset))
        offset += len(values)
    tail = _batch([b"tail"], codec, -1, offset)[:cut + 12]
    out = filter_fetch(chain, RecordContext("t", 0, "fetch"), b"".join(raw_parts) + tail)
    assert out.error_code == 0
    got, got_tail = split_batches(out.records)
    assert bytes(got_tail) == tail
    assert len(got) == len(batches)
    offset = 100
    for b, values in zip(got, batches, strict=True):
        assert verify_crc(b.data)
        assert (b.header.base_offset, b.header.last_offset_delta) == (offset, len(values) - 1)
        kept = [(i, _expected(v)) for i, v in enumerate(values)
                if _expected(v) not in ("drop", "reject")]
        assert [(r.offset_delta, r.value) for r in decode_records(b)] == kept
        offset += len(values)


def test_failure_logs_never_contain_payloads(load_wat: Callable[..., LoadedFilter]) -> None:
    f = load_wat("sluice_upper", timeout_ms=20)
    secret = b"4111-1111-1111-1111 john@example.com"
    with structlog.testing.capture_logs() as logs:
        for marker in (b"TRAP ", b"LOOP ", b"BADOUT ", b"ERROR "):
            f.run_batch(RecordContext("t", 0, "produce"),
                        [FilterRecord(0, 0, secret, marker + secret, [("h", secret)])])
    assert len(logs) == 4
    text = repr(logs)
    assert "4111" not in text and "john@" not in text
    assert {e["kind"] for e in logs} == {"trap", "timeout", "invalid-output", "error"}
    assert all(e["filter"] == "sluice_upper" and e["sha256"] == f.sha256[:16] for e in logs)


def test_concurrent_callers_are_serialised(load_wat: Callable[..., LoadedFilter]) -> None:
    f = load_wat("sluice_upper")
    errors: list[str] = []

    def work(n: int) -> None:
        for i in range(50):
            value = f"t{n}-{i}".encode()
            result = f.run_batch(RecordContext("t", n, "produce"),
                                 [FilterRecord(0, 0, None, value, [])])
            if result.decisions[0].value != value.upper():
                errors.append(f"{n}/{i}: {result.decisions[0]!r}")

    threads = [threading.Thread(target=work, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert f.instantiations == 1


def test_yaml_config_to_running_chain(tmp_path: Path, wasm_dir: Path,
                                      module_cache) -> None:
    (tmp_path / "mods").mkdir()
    (tmp_path / "mods" / "upper.wasm").write_bytes((wasm_dir / "sluice_upper.wasm").read_bytes())
    conf = tmp_path / "sluice.yaml"
    conf.write_text(textwrap.dedent("""
        filters:
          - name: mask-pii
            module: builtin:pii-mask
            topics: ["payments.*"]
            apply_to: [produce, fetch]
            config: {}
          - name: upper
            module: mods/upper.wasm
            topics: ["payments.*", "raw"]
            apply_to: [produce]
            on_error: dead-letter
            dead_letter_topic: raw.dlq
    """))
    chain = FilterChain.from_specs(load_filter_specs(conf), cache=module_cache)
    try:
        assert [d["name"] for d in chain.describe()] == ["mask-pii", "upper"]
        assert chain.describe()[0]["abi"] == "sluice-v1"
        ctx = RecordContext("payments.eu", 0, "produce")
        result = chain.run_records(ctx, [FilterRecord(0, 0, None, b"mail a@example.com", [])])
        rec = result.records[0]
        assert rec is not None and rec.value is not None
        assert b"A@EXAMPLE.COM" not in rec.value and rec.value.startswith(b"MAIL ")
        assert [s.name for s in result.stats] == ["mask-pii", "upper"]
        assert not chain.applies("raw", "fetch") and chain.applies("raw", "produce")
    finally:
        chain.close()


@pytest.mark.parametrize("value", [b"x" * 300_000])
def test_large_records_cross_the_boundary(load_wat: Callable[..., LoadedFilter],
                                          value: bytes) -> None:
    f = load_wat("sluice_upper")
    result = f.run_batch(RecordContext("t", 0, "produce"),
                         [FilterRecord(i, 0, None, value, []) for i in range(4)])
    assert result.failure is None
    assert all(d.value == value.upper() for d in result.decisions)
