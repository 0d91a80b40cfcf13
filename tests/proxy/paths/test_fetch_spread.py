"""A Fetch response's partitions filtered on several pool threads give the serial pass's bytes.

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
from sluice.filters.chain import FilterChain
from sluice.filters.config import FilterSpec
from sluice.filters.context import RecordContext
from sluice.filters.parallel import Helpers
from sluice.filters.pipeline import filter_produce
from sluice.proxy.paths import fetch as fetch_path
from tests.filters.test_native_path import make_batch

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
    assert bytes(spread.frame) == bytes(serial.frame)
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
        assert bytes(out.frame) == bytes(serial.frame)
        if pii.instances == 2:
            break
    assert pii.poolable and pii.instances == 2


def test_proxy_spread_fetch_and_filter_threads_decide_whether_jobs_get_helpers(
    tmp_path: Path,
) -> None:
    from sluice.proxy.net.server import ProxyServer
    from sluice.proxy.ops.config import ConfigFileError, ProxyConfig
    from sluice.proxy.ops.config_load import load_config_file

    def helpers_of(text: str) -> Helpers | None:
        path = tmp_path / "sluice.yaml"
        path.write_text(text, encoding="utf-8")
        config = load_config_file(path, ProxyConfig(listen=("127.0.0.1", 0),
                                                     upstream=[("127.0.0.1", 1)]))
        server = ProxyServer(config)
        try:
            return server._context(1).helpers
        finally:
            if server.executor is not None:
                server.executor.shutdown()

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
            assert b"ann@example.com" in bytes(out.frame)
            assert bytes(out.frame).count(b"sluice.enc") == 0
    finally:
        for c in (*sealers, reader):
            c.close()
