"""A Fetch response's partitions, and runs of one partition's batches, filtered on several pool
threads give the serial pass's bytes.

Real chains (the shipped pii-mask build, a hand-written test module declared stateless that
traps or rejects on marked records, one left stateful, and builtin:encrypt over a local
keyring, whole value and fields), real frames built by the codec, a real ThreadPoolExecutor;
no sockets."""

from __future__ import annotations

import dataclasses
import datetime
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import wasmtime
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sluice.codec import entities, schemas
from sluice.codec.compression import CODEC_LZ4, CODEC_NONE
from sluice.codec.fetch_splice import scan_fetch_response
from sluice.codec.headers import response_header_bytes
from sluice.codec.messages import ApiKey, encode_response
from sluice.crypto.kms import KmsSettings
from sluice.crypto.kms_local import LocalKeyring
from sluice.crypto.record_filter import EncryptRunner
from sluice.filters import pipeline
from sluice.filters.chain import FilterChain
from sluice.filters.config import FilterSpec
from sluice.filters.context import RecordContext
from sluice.filters.parallel import Helpers
from sluice.filters.pipeline import filter_produce
from sluice.proxy.paths import fetch as fetch_path
from tests.filters.test_native_path import make_batch
from tests.proxy.paths.frames import joined

MODULES = Path(__file__).resolve().parents[2] / "filters" / "modules"
VERSION = 12
EMAIL = b'{"user": "ann@example.com", "card": "4111 1111 1111 1111", "note": "%d"}'
# Topics: pii.* masked by pii-mask; up.* upper-cased by the test module (TRAP traps the
# instance, REJECT rejects: dead letters); keep.* has a stateful filter; plain passes as bytes.
TOPICS = ("pii.a", "pii.b", "up.c", "plain", "keep.d")


@pytest.fixture(scope="module")
def chain(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FilterChain]:
    tmp = tmp_path_factory.mktemp("spread")
    upper = tmp / "sluice_upper.wasm"
    upper.write_bytes(wasmtime.wat2wasm((MODULES / "sluice_upper.wat").read_text()))
    specs = [
        FilterSpec(name="pii", module="builtin:pii-mask", topics=("pii.*",),
                   apply_to=frozenset({"fetch"})),
        FilterSpec(name="upper", module=str(upper), topics=("up.*",),
                   apply_to=frozenset({"fetch"}), stateless=True, on_error="dead-letter",
                   dead_letter_topic="dlq"),
        FilterSpec(name="stateful", module=str(upper), topics=("keep.*",),
                   apply_to=frozenset({"fetch"})),
    ]
    built = FilterChain.from_specs(specs, cache_dir=tmp / "cache")
    yield built
    built.close()


@pytest.fixture(scope="module")
def pool() -> Iterator[ThreadPoolExecutor]:
    executor = ThreadPoolExecutor(2, thread_name_prefix="spread-test")
    yield executor
    executor.shutdown(wait=True)


def values_for(topic: str, n: int, marks: list[int], seed: int) -> list[bytes | None]:
    out: list[bytes | None] = []
    for i in range(n):
        if topic.startswith("up.") and i in marks:
            out.append(b"TRAP now" if (i + seed) % 2 else b"REJECT this")
        elif topic.startswith("up."):
            out.append(b"lower case %d" % i)
        else:
            out.append(EMAIL % (i + seed))
    return out


def fetch_frame(parts: dict[str, list[bytes]]) -> bytes:
    cls = schemas.response_schema(ApiKey.FETCH, VERSION)
    tcls = entities.element_class(cls, "responses")
    pcls = entities.element_class(tcls, "partitions")
    response = entities.build(
        cls, throttle_time=datetime.timedelta(0), error_code=0, session_id=0,
        responses=tuple(
            entities.build(tcls, topic=topic, partitions=tuple(
                entities.build(pcls, partition_index=p, high_watermark=100, records=records,
                               aborted_transactions=None)
                for p, records in enumerate(blobs)
            ))
            for topic, blobs in parts.items()
        ),
    )
    return response_header_bytes(3, ApiKey.FETCH, VERSION) + encode_response(response)


def run_scanned(chain: FilterChain, frame: bytes, helpers: Helpers | None,
                principal: str | None = None) -> Any:
    size = len(response_header_bytes(3, ApiKey.FETCH, VERSION))
    layout = scan_fetch_response(VERSION, frame, size)
    assert layout is not None
    names: list[str | None] = [t.name for t in layout.topics]
    applied = [n is not None and chain.applies(n, "fetch", principal) for n in names]
    return fetch_path._filter_scanned(chain, frame, layout, names, applied, "consumer",
                                      principal, helpers=helpers)


def telemetry(batches: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The record_batch fields, with each filter's run time (never the same twice) zeroed."""
    return [
        {**b, "stats": [dataclasses.replace(s, time_ns=0) for s in b["stats"]]}
        for b in batches
    ]


def failures(chain: FilterChain) -> dict[str, dict[str, int]]:
    return {f.name: dict(f.failures) for f in chain.filters}


def serial_and_spread_agree(chain: FilterChain, frame: bytes, pool: ThreadPoolExecutor,
                            principal: str | None = None) -> tuple[Any, list[object]]:
    """Run `frame` serially, then spread over `pool`; assert both passes give the same bytes,
    telemetry, dead letters and failure-counter moves. Returns the serial pass and the
    helpers the spread pass spawned."""
    before = failures(chain)
    serial = run_scanned(chain, frame, None, principal)
    middle = failures(chain)
    spawned: list[object] = []

    def spawn(fn: Any) -> object:
        spawned.append(fn)
        return pool.submit(fn)

    spread = run_scanned(chain, frame, Helpers(spawn, 2), principal)
    after = failures(chain)
    assert joined(spread.frame) == joined(serial.frame)
    assert telemetry(spread.batches) == telemetry(serial.batches)
    assert spread.dead_letters == serial.dead_letters
    # The filters' failure counters moved by the same amounts in both passes.
    assert {n: {k: after[n].get(k, 0) - middle[n].get(k, 0) for k in after[n]}
            for n in after} == {n: {k: middle[n].get(k, 0) - before[n].get(k, 0)
                                    for k in after[n]} for n in after}
    return serial, spawned


partition_st = st.tuples(st.integers(1, 40), st.lists(st.integers(0, 39), max_size=3),
                         st.sampled_from([CODEC_NONE, CODEC_LZ4]), st.integers(1, 3))


@settings(max_examples=25, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(layout=st.dictionaries(st.sampled_from(TOPICS), st.lists(partition_st, min_size=1,
                                                                max_size=4), min_size=1),
       seed=st.integers(0, 9))
def test_spread_pass_gives_the_serial_pass_bytes_telemetry_and_dead_letters(
    chain: FilterChain, pool: ThreadPoolExecutor, layout: dict[str, list[Any]], seed: int,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(fetch_path, "SPREAD_MIN_BYTES", 0)
    parts: dict[str, list[bytes]] = {}
    for topic, partitions in layout.items():
        blobs = []
        for n, marks, codec, batches in partitions:
            # Several batches per partition, with offsets that follow on.
            blob = b"".join(
                make_batch(values_for(topic, n, marks, seed + b), codec=codec,
                           base_offset=b * n)
                for b in range(batches)
            )
            blobs.append(blob)
        parts[topic] = blobs
    frame = fetch_frame(parts)
    _serial, spawned = serial_and_spread_agree(chain, frame, pool)
    filtered = [t for t in parts if not t.startswith(("plain", "keep."))]
    n_filtered = sum(len(parts[t]) for t in filtered)
    stateful = "keep.d" in parts
    # Spread only with two or more partitions of stateless filters and none stateful.
    assert bool(spawned) == (n_filtered + len(parts.get("keep.d", ())) >= 2 and not stateful)


# One partition's batches cut into runs (pipeline.plan_fetch): up to 6 batches, optionally one
# with a bad CRC (the serial pass stops there: what the runs after it did must leave no trace,
# e.g. the traps of up.* batches behind it in the filters' failure counters).
split_partition_st = st.tuples(st.integers(1, 40), st.lists(st.integers(0, 39), max_size=3),
                               st.sampled_from([CODEC_NONE, CODEC_LZ4]), st.integers(1, 6),
                               st.one_of(st.none(), st.integers(0, 5)))
CRC_AT = 17  # base offset 8, length 4, leader epoch 4, magic 1


def corrupted(batch: bytes) -> bytes:
    return batch[:CRC_AT] + bytes([batch[CRC_AT] ^ 0xFF]) + batch[CRC_AT + 1:]


@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(layout=st.dictionaries(st.sampled_from(TOPICS),
                              st.lists(split_partition_st, min_size=1, max_size=2), min_size=1),
       seed=st.integers(0, 9), runs_per_thread=st.integers(1, 4),
       run_target=st.sampled_from([1, 300, fetch_path.RUN_TARGET_BYTES]))
def test_split_partitions_give_the_serial_pass_bytes_telemetry_and_counters(
    chain: FilterChain, pool: ThreadPoolExecutor, layout: dict[str, list[Any]], seed: int,
    runs_per_thread: int, run_target: int, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(fetch_path, "SPREAD_MIN_BYTES", 0)
    monkeypatch.setattr(pipeline, "RUN_MIN_BYTES", 0)
    monkeypatch.setattr(fetch_path, "RUNS_PER_THREAD", runs_per_thread)
    monkeypatch.setattr(fetch_path, "RUN_TARGET_BYTES", run_target)
    parts: dict[str, list[bytes]] = {}
    for topic, partitions in layout.items():
        parts[topic] = [
            b"".join(
                (corrupted if b == bad else bytes)(
                    make_batch(values_for(topic, n, marks, seed + b), codec=codec,
                               base_offset=b * n))
                for b in range(batches)
            )
            for n, marks, codec, batches, bad in partitions
        ]
    frame = fetch_frame(parts)
    serial, spawned = serial_and_spread_agree(chain, frame, pool)
    if "keep.d" in parts:
        assert spawned == [], "a stateful filter's partition was shared out"
    elif sum(len(parts[t]) for t in parts if t != "plain") == 1:
        # One filtered partition: shared out only as runs of its batches.
        (batches,) = [p[3] for t, ps in layout.items() if t != "plain" for p in ps]
        assert not spawned or batches >= 2
    for b in serial.batches:
        bad = layout[b["topic"]][b["partition"]][4]
        if bad is not None and bad < layout[b["topic"]][b["partition"]][3]:
            assert b["error_code"] == 2  # CORRUPT_MESSAGE, from the batch with the bad CRC


def outcome_fields(outcome: Any) -> tuple[Any, ...]:
    """What a partition's FetchOutcome hands on (its stats' run times zeroed)."""
    return (bytes(outcome.records), outcome.error_code, outcome.error_message, outcome.changed,
            outcome.records_in, outcome.records_out, outcome.offsets, outcome.dead_letters,
            [dataclasses.replace(s, time_ns=0) for s in outcome.stats])


def runs_in_order(chain: FilterChain, ctx: RecordContext, blob: bytes, runs: int,
                  order: list[int]) -> Any:
    """The partition cut into `runs` runs, filtered one after another in `order` (as threads
    may finish them), with their effects held, then joined."""
    plan = pipeline.plan_fetch(chain, ctx, blob, checked=True, runs=runs)
    done: dict[int, Any] = {}
    for i in order:
        if i < plan.runs:
            done[i] = pipeline.run_fetch(chain, plan, i, defer=True)
    return pipeline.finish_fetch(plan, [done[i] for i in range(plan.runs)])


@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(topic=st.sampled_from(["pii.a", "up.c"]), n=st.integers(1, 20),
       marks=st.lists(st.integers(0, 19), max_size=3), batches=st.integers(2, 6),
       bad=st.one_of(st.none(), st.integers(0, 5)), codec=st.sampled_from([CODEC_NONE, CODEC_LZ4]),
       order=st.permutations(range(6)), seed=st.integers(0, 9))
def test_runs_finished_in_any_order_give_the_serial_pass(
    chain: FilterChain, topic: str, n: int, marks: list[int], batches: int, bad: int | None,
    codec: int, order: list[int], seed: int, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A run behind a failing batch (bad CRC) that finished first, trapping the upper filter
    on its marked records: a serial pass stops at the failing batch, so those traps must not
    be counted (the run's held effects are dropped), and the outcome is the serial one."""
    monkeypatch.setattr(pipeline, "RUN_MIN_BYTES", 0)
    blob = b"".join(
        (corrupted if b == bad else bytes)(
            make_batch(values_for(topic, n, marks, seed + b), codec=codec, base_offset=b * n))
        for b in range(batches)
    )
    ctx = RecordContext(topic, 0, "fetch", "consumer")
    before = failures(chain)
    serial = pipeline.filter_fetch(chain, ctx, blob, checked=True)
    middle = failures(chain)
    split = runs_in_order(chain, ctx, blob, batches, order)
    after = failures(chain)
    assert outcome_fields(split) == outcome_fields(serial)
    assert {k: after["upper"].get(k, 0) - middle["upper"].get(k, 0) for k in after["upper"]} == {
        k: middle["upper"].get(k, 0) - before["upper"].get(k, 0) for k in after["upper"]}


def test_one_large_partition_is_filtered_in_runs_on_two_instances(
    chain: FilterChain, pool: ThreadPoolExecutor,
) -> None:
    """Workload 1's shape: one uncompressed partition of 200-byte JSON values in batches of a
    few thousand records. Its runs of batches go to the job's thread and a pool helper, each
    on a pii-mask instance of its own, and the frame is the serial pass's."""
    blob = b"".join(make_batch([EMAIL % (b * 2000 + i) for i in range(2000)],
                               base_offset=b * 2000) for b in range(8))
    frame = fetch_frame({"pii.a": [blob]})
    assert len(blob) >= 2 * pipeline.RUN_MIN_BYTES
    (pii,) = [f for f in chain.filters if f.name == "pii"]
    instances = pii.instances
    serial = run_scanned(chain, frame, None)
    assert not serial.spread
    for _ in range(20):  # the two threads overlap on some run (they race on a busy machine)
        spawned: list[object] = []

        def spawn(fn: Any, spawned: list[object] = spawned) -> object:
            spawned.append(fn)
            return pool.submit(fn)

        out = pool.submit(run_scanned, chain, frame, Helpers(spawn, 2)).result()
        assert spawned and out.spread
        assert joined(out.frame) == joined(serial.frame)
        assert telemetry(out.batches) == telemetry(serial.batches)
        if pii.instances >= max(2, instances):
            break
    assert pii.instances >= 2
    (fields,) = out.batches
    assert (fields["offset_first"], fields["offset_last"], fields["records_in"]) == (
        0, 8 * 2000 - 1, 8 * 2000)


@given(sizes=st.lists(st.integers(0, 1 << 24), min_size=1, max_size=8),
       want=st.integers(1, 16))
def test_a_partition_asks_for_its_share_of_runs_and_runs_of_bounded_size(
    sizes: list[int], want: int,
) -> None:
    total = sum(sizes)
    for size in sizes:
        runs = fetch_path._runs(size, total, want)
        assert runs >= 1
        assert runs * fetch_path.RUN_TARGET_BYTES >= size  # none much over the target
        assert runs >= want * size // max(1, total)  # at least its share
        assert runs <= max(1, want * size // max(1, total),
                           size // fetch_path.RUN_TARGET_BYTES + 1)


def test_unequal_lz4_partitions_are_cut_into_runs_near_the_target_size(
    chain: FilterChain, pool: ThreadPoolExecutor, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The benchmark's workload 2 as Apache Kafka answers it: partitions of unequal size, each
    several runs' worth. Cut by share alone, the largest was one run, which one thread still
    filtered while the other had nothing left; each is now cut into runs of about
    RUN_TARGET_BYTES, and the frame is the serial pass's."""
    monkeypatch.setattr(pipeline, "RUN_MIN_BYTES", 16 * 1024)
    monkeypatch.setattr(fetch_path, "RUN_TARGET_BYTES", 64 * 1024)
    parts = [b"".join(make_batch([EMAIL % (b * 1000 + i) for i in range(1000)],
                                 codec=CODEC_LZ4, base_offset=b * 1000) for b in range(n))
             for n in (24, 6)]
    frame = fetch_frame({"pii.a": parts})
    runs: list[int] = []
    plan_fetch = pipeline.plan_fetch

    def spy(*args: Any, **kwargs: Any) -> Any:
        plan = plan_fetch(*args, **kwargs)
        runs.append(plan.runs)
        return plan

    monkeypatch.setattr(fetch_path, "plan_fetch", spy)
    serial = run_scanned(chain, frame, None)
    out = pool.submit(run_scanned, chain, frame, Helpers(pool.submit, 2)).result()
    assert out.spread and joined(out.frame) == joined(serial.frame)
    sizes = [len(p) for p in parts]
    want = 2 * fetch_path.RUNS_PER_THREAD
    # The target, not the share, decides both here.
    assert -(-sizes[0] // fetch_path.RUN_TARGET_BYTES) > want * sizes[0] // sum(sizes)
    assert runs == [-(-size // fetch_path.RUN_TARGET_BYTES) for size in sizes]


def test_a_stateful_filter_never_splits_a_partition(
    chain: FilterChain, pool: ThreadPoolExecutor, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(fetch_path, "SPREAD_MIN_BYTES", 0)
    monkeypatch.setattr(pipeline, "RUN_MIN_BYTES", 0)
    blob = b"".join(make_batch([b"abc %d" % i] * 50, base_offset=i * 50) for i in range(8))
    spawned: list[object] = []
    out = run_scanned(chain, fetch_frame({"keep.d": [blob]}),
                      Helpers(lambda fn: spawned.append(fn) or pool.submit(fn), 2))
    assert spawned == [] and not out.spread
    assert b"ABC 7" in joined(out.frame)


def test_a_stateful_filter_keeps_the_response_on_one_thread(
    chain: FilterChain, pool: ThreadPoolExecutor, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(fetch_path, "SPREAD_MIN_BYTES", 0)
    frame = fetch_frame({
        "pii.a": [make_batch([EMAIL % 1] * 5)] * 3,
        "keep.d": [make_batch([b"abc"])],
    })
    spawned: list[object] = []
    run_scanned(chain, frame, Helpers(lambda fn: spawned.append(fn) or pool.submit(fn), 2))
    assert spawned == []
    (stateful,) = [f for f in chain.filters if f.name == "stateful"]
    assert not stateful.poolable and stateful.instances == 1


def test_small_responses_stay_on_one_thread(
    chain: FilterChain, pool: ThreadPoolExecutor,
) -> None:
    frame = fetch_frame({"pii.a": [make_batch([EMAIL % 1])] * 3})
    assert len(frame) < fetch_path.SPREAD_MIN_BYTES
    spawned: list[object] = []
    run_scanned(chain, frame, Helpers(lambda fn: spawned.append(fn) or pool.submit(fn), 2))
    assert spawned == []


def test_a_large_masked_response_runs_on_two_instances(
    chain: FilterChain, pool: ThreadPoolExecutor,
) -> None:
    """Six lz4 partitions of 200-byte JSON values, as the benchmark's workload 2: the job's
    thread and a pool helper filter them at once, each on an instance of its own."""
    blob = make_batch([EMAIL % i for i in range(2000)], codec=CODEC_LZ4)
    frame = fetch_frame({"pii.b": [blob] * 6})
    assert len(frame) >= fetch_path.SPREAD_MIN_BYTES
    (pii,) = [f for f in chain.filters if f.name == "pii"]
    serial = run_scanned(chain, frame, None)
    for _ in range(20):  # the two threads overlap on some run (they race on a busy machine)
        out = pool.submit(run_scanned, chain, frame, Helpers(pool.submit, 2)).result()
        assert joined(out.frame) == joined(serial.frame)
        if pii.instances == 2:
            break
    assert pii.poolable and pii.instances == 2


def test_proxy_spread_fetch_and_filter_threads_decide_whether_jobs_get_helpers(
    tmp_path: Path,
) -> None:
    from sluice.proxy.ops.config import ConfigFileError
    from tests.proxy.server_context import context_of

    def helpers_of(text: str) -> Helpers | None:
        return context_of(tmp_path, text).helpers

    spread = helpers_of("proxy:\n  filter_threads: 3\n")
    assert spread is not None and spread.threads == 3
    assert helpers_of("proxy:\n  filter_threads: 3\n  spread_fetch: false\n") is None
    assert helpers_of("proxy:\n  filter_threads: 1\n") is None
    with pytest.raises(ConfigFileError,
                       match=r"sluice\.yaml:2: proxy\.spread_fetch: must be true or false"):
        helpers_of("proxy:\n  spread_fetch: 'no'\n")


# ------------------------------------------------------------------ builtin:encrypt
# encv.*: whole values under KEK "vkey"; encf.*: the JSON fields user and card under "fkey".
# Readers matching User:reader-* get plaintext, others the stored records (withheld).
ENC_TOPICS = ("encv.a", "encv.b", "encf.a", "plain")
READER = "User:reader-1"


def enc_specs(keyring: Path) -> list[FilterSpec]:
    kms = KmsSettings("local", path=str(keyring))
    return [
        FilterSpec(name="encv", module="builtin:encrypt", topics=("encv.*",),
                   apply_to=frozenset({"produce", "fetch"}), kms=kms,
                   config={"key": "vkey", "decrypt_for": ["User:reader-*"]}),
        FilterSpec(name="encf", module="builtin:encrypt", topics=("encf.*",),
                   apply_to=frozenset({"produce", "fetch"}), kms=kms,
                   config={"key": "fkey", "decrypt_for": ["User:reader-*"],
                           "fields": ["user", "card"]}),
    ]


@dataclasses.dataclass
class EncSetup:
    reader: FilterChain  # the proxy that fetches (keyring A)
    sealer: FilterChain  # another proxy on keyring A: its data keys come from A's KMS
    stale: FilterChain  # a proxy on keyring B, whose KEKs are at version 2: unknown to A


@pytest.fixture(scope="module")
def enc(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EncSetup]:
    tmp = tmp_path_factory.mktemp("spread-enc")
    sealer = FilterChain.from_specs(enc_specs(tmp / "a.json"), cache_dir=tmp / "cache")
    # The reader is a second chain over the same keyring file (its own KMS client: a path
    # spelt differently), so it unwraps the sealer's data keys through the KMS.
    (tmp / "a").mkdir()
    reader = FilterChain.from_specs(enc_specs(tmp / "a" / ".." / "a.json"),
                                    cache_dir=tmp / "cache")
    other = LocalKeyring(tmp / "b.json")
    for name in ("vkey", "fkey"):
        other.create_key(name)
        other.rotate_key(name)
    stale = FilterChain.from_specs(enc_specs(tmp / "b.json"), cache_dir=tmp / "cache")
    yield EncSetup(reader, sealer, stale)
    for c in (reader, sealer, stale):
        c.close()


def sealed(chain: FilterChain, topic: str, partition: int, n: int, codec: int, batches: int,
           seed: int) -> bytes:
    """`batches` batches of `n` JSON values as `chain` stores them on produce."""
    out = []
    for b in range(batches):
        blob = make_batch([EMAIL % (seed + b * n + i) for i in range(n)], codec=codec,
                          base_offset=b * n)
        if topic == "plain":
            out.append(blob)
            continue
        stored = filter_produce(chain, RecordContext(topic, partition, "produce",
                                                     principal="User:app"), blob)
        assert stored.error_code == 0 and stored.records is not None
        out.append(bytes(stored.records))
    return b"".join(out)


enc_partition_st = st.tuples(st.integers(1, 30), st.sampled_from([CODEC_NONE, CODEC_LZ4]),
                             st.integers(1, 3), st.booleans())


@settings(max_examples=25, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(layout=st.dictionaries(st.sampled_from(ENC_TOPICS),
                              st.lists(enc_partition_st, min_size=1, max_size=4), min_size=1),
       principal=st.sampled_from([READER, "User:other", None]), seed=st.integers(0, 9))
def test_spread_encrypt_gives_the_serial_pass_bytes_telemetry_and_counters(
    enc: EncSetup, pool: ThreadPoolExecutor, layout: dict[str, list[Any]],
    principal: str | None, seed: int, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Whole value and fields, allowed and withheld readers, and partitions sealed under a
    KEK version the reader's KMS does not know (the KMS fails them: 56 for allowed readers)."""
    monkeypatch.setattr(fetch_path, "SPREAD_MIN_BYTES", 0)
    parts = {
        topic: [sealed(enc.stale if stale else enc.sealer, topic, p, n, codec, batches, seed)
                for p, (n, codec, batches, stale) in enumerate(partitions)]
        for topic, partitions in layout.items()
    }
    frame = fetch_frame(parts)
    serial, spawned = serial_and_spread_agree(enc.reader, frame, pool, principal)
    n_filtered = sum(len(v) for t, v in parts.items() if t != "plain")
    assert bool(spawned) == (n_filtered >= 2)
    if principal == READER:
        # The partitions sealed under the unknown KEK version failed retriably (56, the KMS
        # does not know it), every other one opened.
        failed = {(b["topic"], b["partition"]): b["error_code"] for b in serial.batches
                  if b["error_code"]}
        assert failed == {(t, p): 56 for t, ps in layout.items() if t != "plain"
                          for p, x in enumerate(ps) if x[3]}


enc_split_st = st.tuples(st.integers(1, 30), st.sampled_from([CODEC_NONE, CODEC_LZ4]),
                         st.integers(2, 5), st.one_of(st.none(), st.integers(0, 4)))


def _split_blob(enc: EncSetup, topic: str, partition: Any, seed: int) -> bytes:
    """One partition of `enc_split_st`: its batches sealed one by one, from batch `stale_from`
    on under the KEK version the reader's KMS does not know; each batch at its own offsets
    (sealed() numbers every call's from 0)."""
    n, codec, batches, stale_from = partition
    return b"".join(
        _at_offset(sealed(enc.stale if stale_from is not None and b >= stale_from
                          else enc.sealer, topic, 0, n, codec, 1, seed + b * n), b * n)
        for b in range(batches)
    )


@settings(max_examples=25, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(topic=st.sampled_from(["encv.a", "encf.a"]), partition=enc_split_st,
       principal=st.sampled_from([READER, "User:other"]), seed=st.integers(0, 9))
def test_one_encrypted_partition_split_in_runs_gives_the_serial_pass(
    enc: EncSetup, pool: ThreadPoolExecutor, topic: str, partition: Any, principal: str,
    seed: int, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """One partition, its batches opened in runs on two threads; from batch `stale_from` on
    they were sealed under a KEK version the reader's KMS does not know, so the serial pass
    fails the partition there (56) and counts one failure: the runs behind it, which fail too,
    must not count theirs."""
    monkeypatch.setattr(fetch_path, "SPREAD_MIN_BYTES", 0)
    monkeypatch.setattr(pipeline, "RUN_MIN_BYTES", 0)
    _n, _codec, batches, stale_from = partition
    blob = _split_blob(enc, topic, partition, seed)
    frame = fetch_frame({topic: [blob]})
    serial, spawned = serial_and_spread_agree(enc.reader, frame, pool, principal)
    assert spawned
    (fields,) = serial.batches
    failing = principal == READER and stale_from is not None and stale_from < batches
    assert fields["error_code"] == (56 if failing else 0)


@settings(max_examples=25, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(topic=st.sampled_from(["encv.a", "encf.a"]), partition=enc_split_st,
       order=st.permutations(range(5)), seed=st.integers(0, 9))
def test_encrypted_runs_finished_in_any_order_count_one_refusal(
    enc: EncSetup, topic: str, partition: Any, order: list[int], seed: int,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The runs behind the first batch the reader's KMS cannot open also fail (56); when they
    finish first, their refusals are held and dropped: one failure counted, as serially."""
    monkeypatch.setattr(pipeline, "RUN_MIN_BYTES", 0)
    _n, _codec, batches, stale_from = partition
    blob = _split_blob(enc, topic, partition, seed)
    ctx = RecordContext(topic, 0, "fetch", "consumer", READER)
    before = failures(enc.reader)
    serial = pipeline.filter_fetch(enc.reader, ctx, blob, checked=True)
    middle = failures(enc.reader)
    split = runs_in_order(enc.reader, ctx, blob, batches, order)
    after = failures(enc.reader)
    assert outcome_fields(split) == outcome_fields(serial)
    moved = {f: {k: after[f].get(k, 0) - middle[f].get(k, 0) for k in after[f]} for f in after}
    assert moved == {f: {k: middle[f].get(k, 0) - before[f].get(k, 0) for k in after[f]}
                     for f in after}
    failing = stale_from is not None and stale_from < batches
    assert serial.error_code == (56 if failing else 0)
    assert sum(moved[topic[:4]].values()) == (1 if failing else 0)


def _at_offset(batch: bytes, base_offset: int) -> bytes:
    """`batch` moved to `base_offset` (the base offset is outside the CRC)."""
    return base_offset.to_bytes(8, "big") + batch[8:]


class _MeetingKms:
    """The reader's real keyring, whose unwraps wait until `parties` of them are under way
    at once: shows that two partitions are opened on two threads at the same time."""

    def __init__(self, inner: Any, parties: int) -> None:
        self.inner = inner
        self.barrier = threading.Barrier(parties, timeout=10)
        self.threads: set[int] = set()

    def decrypt_data_key(self, name: str, version: str, wrapped: bytes) -> bytes:
        self.threads.add(threading.get_ident())
        self.barrier.wait()
        return bytes(self.inner.decrypt_data_key(name, version, wrapped))

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def test_two_encrypted_partitions_are_opened_on_two_threads_at_once(
    tmp_path: Path, pool: ThreadPoolExecutor, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(fetch_path, "SPREAD_MIN_BYTES", 0)
    specs = enc_specs(tmp_path / "k.json")
    # Two sealers (two proxies): two data keys, each unwrapped once by the reader.
    sealers = [FilterChain.from_specs(specs, cache_dir=tmp_path / "c") for _ in range(2)]
    (tmp_path / "r").mkdir()
    reader = FilterChain.from_specs(enc_specs(tmp_path / "r" / ".." / "k.json"),
                                    cache_dir=tmp_path / "c")
    try:
        for topic in ("encv.a", "encf.a"):
            (flt,) = [f for f in reader.filters if f.name == topic.split(".")[0]]
            runner = flt._runner
            assert isinstance(runner, EncryptRunner) and flt.concurrent("fetch")
            meeting = _MeetingKms(runner.keys.kms, 2)
            monkeypatch.setattr(runner.keys, "kms", meeting)
            blobs = [sealed(s, topic, p, 50, CODEC_LZ4, 1, 0) for p, s in enumerate(sealers)]
            frame = fetch_frame({topic: blobs})
            out = pool.submit(run_scanned, reader, frame, Helpers(pool.submit, 2),
                              READER).result()
            assert len(meeting.threads) == 2
            assert out.spread
            assert [b.get("error_code", 0) for b in out.batches] == [0, 0]
            assert b"ann@example.com" in joined(out.frame)
            assert joined(out.frame).count(b"sluice.enc") == 0
    finally:
        for c in (*sealers, reader):
            c.close()
