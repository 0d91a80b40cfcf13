"""A connection's pipelined Produce requests whose filters keep no state are filtered side by
side (`Job.overlap`), and still give what a serial pass gives: the same bytes to the broker in
the same order (an idempotent producer's sequence numbers never reordered), the same responses
to the client, the same telemetry and dead letters. A stateful filter's requests stay serial.

Real chains (the shipped pii-mask build, a test module declared stateless that rejects or traps
on marked records with dead letters, the same module left stateful), the real Produce path and
sans-IO `Connection`, a real thread pool that runs the jobs at once; the jobs' results are
handed to the connection in an order hypothesis chooses. No sockets."""

from __future__ import annotations

import datetime
import struct
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import wasmtime
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bench.produce_overlap import routes
from sluice.codec import entities, schemas
from sluice.codec.batch_counts import count_records
from sluice.codec.headers import parse_request_header, response_header_bytes
from sluice.codec.messages import ApiKey, encode_response
from sluice.codec.produce_splice import scan_produce_request
from sluice.codec.records import BatchHeader, Record, build_batch
from sluice.filters.chain import FilterChain
from sluice.filters.config import FilterSpec
from sluice.proxy.contract import ClientInfo
from sluice.proxy.net.connection import (
    Close,
    Connection,
    DeadLetters,
    SendToBroker,
    SendToClient,
    StartJob,
    Telemetry,
)
from sluice.proxy.paths.base import PathContext
from sluice.proxy.paths.produce import ProducePath
from sluice.proxy.paths.registry import Routes, VersionTable
from sluice.proxy.paths.topics import TopicRegistry
from sluice.proxy.telemetry.metrics import Metrics
from tests.harness.raw_kafka import request_frame

MODULES = Path(__file__).resolve().parents[2] / "filters" / "modules"
VERSION = 9
PRODUCER_ID = 4242
# pii.* masked by pii-mask; up.* upper-cased by the test module declared stateless (REJECT
# rejects, TRAP traps: dead letters); keep.* the same module, stateful; plain has no filter.
TOPICS = ("pii.a", "up.b", "keep.c", "plain")
EMAIL = b'{"user": "ann%d@example.com", "card": "4111 1111 1111 1111"}'
_SIZE = struct.Struct(">i")


@pytest.fixture(scope="module")
def chain(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FilterChain]:
    tmp = tmp_path_factory.mktemp("overlap")
    upper = tmp / "sluice_upper.wasm"
    upper.write_bytes(wasmtime.wat2wasm((MODULES / "sluice_upper.wat").read_text()))
    produce = frozenset({"produce"})
    specs = [
        FilterSpec(name="pii", module="builtin:pii-mask", topics=("pii.*",), apply_to=produce),
        FilterSpec(name="upper", module=str(upper), topics=("up.*",), apply_to=produce,
                   stateless=True, on_error="dead-letter", dead_letter_topic="dlq"),
        FilterSpec(name="stateful", module=str(upper), topics=("keep.*",), apply_to=produce,
                   on_error="dead-letter", dead_letter_topic="dlq"),
    ]
    built = FilterChain.from_specs(specs, cache_dir=tmp / "cache")
    yield built
    built.close()


@pytest.fixture(scope="module")
def pool() -> Iterator[ThreadPoolExecutor]:
    executor = ThreadPoolExecutor(2, thread_name_prefix="overlap-test")
    yield executor
    executor.shutdown(wait=True)


def reloadable_routes(chains: list[FilterChain], metrics: Metrics) -> Routes:
    """Routes whose paths always see the last chain of `chains`: a test appends one to reload."""
    topics = TopicRegistry()

    def context(generation: int) -> PathContext:
        return PathContext(
            chain=chains[-1], generation=generation, directions=frozenset({"produce"}),
            topics=topics, metrics=metrics, node_address=lambda n, h, p: (h, p),
            open_upstream=None,  # type: ignore[arg-type]
            overlap_produce=True,
        )

    return Routes([ProducePath()], context, VersionTable())


def value(topic: str, i: int, mark: str | None) -> bytes:
    if mark is not None:
        return f"{mark} record {i}".encode()
    if topic.startswith("pii"):
        return EMAIL % i
    return b"lower case %d" % i


def produce_frame(correlation_id: int, topic: str, values: list[bytes], acks: int,
                  sequence: int) -> bytes:
    """One idempotent batch of `values` for partition 0 of `topic`, first sequence `sequence`."""
    n = len(values)
    header = BatchHeader(0, 0, -1, 2, 0, 0, n - 1, 1_700_000_000_000, 1_700_000_000_000 + n,
                         PRODUCER_ID, 0, sequence, n)
    batch = build_batch(header, [Record(i, i, b"k%d" % i, v, []) for i, v in enumerate(values)])
    cls = schemas.request_schema(ApiKey.PRODUCE, VERSION)
    tcls = entities.element_class(cls, "topic_data")
    pcls = entities.element_class(tcls, "partition_data")
    part = entities.build(pcls, index=0, records=batch)
    return request_frame(
        ApiKey.PRODUCE, VERSION, correlation_id, transactional_id=None, acks=acks,
        timeout=datetime.timedelta(seconds=10),
        topic_data=(entities.build(tcls, name=topic, partition_data=(part,)),),
    )


class Broker:
    """Answers every forwarded Produce that expects an answer, offsets counted per partition."""

    def __init__(self) -> None:
        self.offsets: dict[tuple[str, int], int] = {}
        self.answers: list[bytes] = []
        self.sequences: dict[str, list[int]] = {}

    def take(self, body: bytes) -> None:
        header = parse_request_header(body)
        layout = scan_produce_request(VERSION, body[header.header_size:])
        cls = schemas.response_schema(ApiKey.PRODUCE, VERSION)
        tcls = entities.element_class(cls, "responses")
        pcls = entities.element_class(tcls, "partition_responses")
        topics = []
        for t in layout.topics:
            parts = []
            for p in t.partitions:
                records = bytes(p.records or b"")
                key = (str(t.name), int(p.partition))
                base = self.offsets.get(key, 0)
                self.offsets[key] = base + count_records(records)
                if records:
                    # base sequence of the batch: bytes 53..57 of a v2 batch
                    self.sequences.setdefault(str(t.name), []).append(
                        struct.unpack_from(">i", records, 53)[0])
                parts.append(entities.build(pcls, index=p.partition, error_code=0,
                                            base_offset=base, log_start_offset=0))
            topics.append(entities.build(tcls, name=t.name, partition_responses=tuple(parts)))
        if layout.acks != 0:
            body_out = response_header_bytes(header.correlation_id, ApiKey.PRODUCE, VERSION)
            body_out += encode_response(entities.build(cls, responses=tuple(topics)))
            self.answers.append(_SIZE.pack(len(body_out)) + body_out)


class Recorder:
    """Stands in for the telemetry recorder: keeps each record_batch event's fields."""

    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []

    def stats_only(self, stats: Any) -> bool:
        return False

    def record_batch(self, client: Any, **fields: Any) -> None:
        fields["stats"] = [(s.name, s.kept, s.rewritten, s.dropped, s.rejected,
                            dict(s.detector_counts), s.errors, s.failure)
                           for s in fields["stats"]]
        self.events.append(fields)


def frames_of(chunks: list[bytes | memoryview]) -> list[bytes]:
    data = b"".join(bytes(c) for c in chunks)
    out = []
    while data:
        (n,) = _SIZE.unpack_from(data)
        out.append(data[4:4 + n])
        data = data[4 + n:]
    return out


def drive(chain: FilterChain, pool: ThreadPoolExecutor, frames: list[bytes], overlap: bool,
          pick: Any) -> dict[str, Any]:
    """Feeds `frames` in one read, runs every job in the pool, hands their results back in the
    order `pick(list of running job ids)` chooses, then the broker's answers."""
    conn = Connection(ClientInfo("1.2.3.4:5", ("b", 9092)), routes(chain, overlap), Metrics())
    broker = Broker()
    recorder = Recorder()
    seen: dict[str, Any] = {"to_broker": [], "to_client": b"", "dead": [], "closed": None,
                            "most_at_once": 0}
    running: dict[int, Future[Any]] = {}

    def perform(actions: list[Any]) -> None:
        for a in actions:
            if isinstance(a, SendToBroker):
                for body in frames_of(a.data):
                    seen["to_broker"].append(body)
                    broker.take(body)
            elif isinstance(a, SendToClient):
                seen["to_client"] += b"".join(bytes(c) for c in a.data)
            elif isinstance(a, StartJob):
                running[a.job_id] = pool.submit(a.job.run)
                seen["most_at_once"] = max(seen["most_at_once"], len(running))
            elif isinstance(a, Telemetry):
                a.call(recorder)  # type: ignore[call-arg]
            elif isinstance(a, DeadLetters):
                seen["dead"].append([(d.topic, d.key, d.value) for d in a.letters])
            elif isinstance(a, Close):
                seen["closed"] = a.reason

    perform(conn.client_data(b"".join(frames)))
    while running:
        job_id = pick(sorted(running))
        future = running.pop(job_id)
        perform(conn.job_done(job_id, future.result()))
    assert not running
    for answer in broker.answers:
        perform(conn.broker_data(answer))
    seen["telemetry"] = recorder.events
    seen["sequences"] = broker.sequences
    return seen


requests = st.lists(
    st.tuples(
        st.sampled_from(TOPICS),
        st.integers(1, 40),  # records
        st.sampled_from([-1, 1, 0]),  # acks
        st.lists(st.tuples(st.integers(0, 39), st.sampled_from(["REJECT", "TRAP"])),
                 max_size=2),  # marked records (the test module rejects or traps on them)
    ),
    min_size=1, max_size=8,
)


def build(spec: list[tuple[str, int, int, list[tuple[int, str]]]]) -> list[bytes]:
    sequence: dict[str, int] = {}
    frames = []
    for cid, (topic, n, acks, marks) in enumerate(spec, start=1):
        marked = {i: m for i, m in marks if i < n and not topic.startswith("pii")}
        values = [value(topic, i, marked.get(i)) for i in range(n)]
        frames.append(produce_frame(cid, topic, values, acks, sequence.get(topic, 0)))
        sequence[topic] = sequence.get(topic, 0) + n
    return frames


def same_as_serial(chain: FilterChain, pool: ThreadPoolExecutor, frames: list[bytes],
                   pick: Any) -> dict[str, Any]:
    serial = drive(chain, pool, frames, overlap=False, pick=lambda ids: ids[0])
    assert serial["most_at_once"] <= 1
    side = drive(chain, pool, frames, overlap=True, pick=pick)
    assert side["closed"] is None and serial["closed"] is None
    assert side["to_broker"] == serial["to_broker"]
    assert side["to_client"] == serial["to_client"]
    assert side["telemetry"] == serial["telemetry"]
    assert side["dead"] == serial["dead"]
    for topic, seqs in side["sequences"].items():
        assert seqs == sorted(seqs), f"{topic}: sequence numbers reordered"
    return side


@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(spec=requests, data=st.data())
def test_overlapping_produce_jobs_give_what_a_serial_pass_gives(
    chain: FilterChain, pool: ThreadPoolExecutor,
    spec: list[tuple[str, int, int, list[tuple[int, str]]]], data: st.DataObject,
) -> None:
    same_as_serial(chain, pool, build(spec), lambda ids: data.draw(st.sampled_from(ids)))


def test_pipelined_masked_requests_run_side_by_side_finished_in_any_order(
    chain: FilterChain, pool: ThreadPoolExecutor,
) -> None:
    spec = [("pii.a", 30, -1, []), ("pii.a", 30, -1, []), ("up.b", 10, 1, [(3, "REJECT")]),
            ("pii.a", 5, -1, [])]
    # The newest job's result first: everything still goes out in the client's order.
    side = same_as_serial(chain, pool, build(spec), lambda ids: ids[-1])
    assert side["most_at_once"] == 2
    # The up.b batch is idempotent and a record of it was rejected: the proxy answers it.
    assert len(side["to_broker"]) == 3
    assert len(frames_of([side["to_client"]])) == 4


def test_a_stateful_filter_keeps_its_requests_serial(
    chain: FilterChain, pool: ThreadPoolExecutor,
) -> None:
    spec = [("keep.c", 10, -1, []), ("keep.c", 10, -1, []), ("keep.c", 5, 1, [(2, "TRAP")])]
    side = same_as_serial(chain, pool, build(spec), lambda ids: ids[-1])
    assert side["most_at_once"] == 1


def test_proxy_spread_produce_and_filter_threads_decide_whether_produce_jobs_overlap(
    tmp_path: Path,
) -> None:
    from sluice.proxy.ops.config import ConfigFileError
    from tests.proxy.server_context import server_of

    def overlap_of(text: str) -> tuple[bool, int]:
        server = server_of(tmp_path, text)
        try:
            return server._context(1).overlap_produce, server.limits.overlap_jobs
        finally:
            if server.executor is not None:
                server.executor.shutdown()

    assert overlap_of("proxy:\n  filter_threads: 3\n") == (True, 3)
    assert overlap_of("proxy:\n  filter_threads: 3\n  spread_produce: false\n")[0] is False
    assert overlap_of("proxy:\n  filter_threads: 1\n")[0] is False
    assert overlap_of("proxy:\n  filter_threads: 0\n")[0] is False
    with pytest.raises(ConfigFileError,
                       match=r"sluice\.yaml:2: proxy\.spread_produce: must be true or false"):
        overlap_of("proxy:\n  spread_produce: 'no'\n")


def test_other_requests_wait_behind_overlapping_jobs_and_keep_their_place(
    chain: FilterChain, pool: ThreadPoolExecutor,
) -> None:
    """Only Produce requests go ahead: a Metadata request (no path here: its bytes pass) read
    between two masked Produce requests waits, and so does everything behind it."""
    metadata = request_frame(ApiKey.METADATA, 12, 2, topics=None, allow_auto_topic_creation=False)
    first = build([("pii.a", 5, -1, [])])[0]
    second = produce_frame(3, "pii.a", [value("pii.a", i, None) for i in range(5)], -1, 5)
    conn = Connection(ClientInfo("1.2.3.4:5", ("b", 9092)), routes(chain, True), Metrics())
    actions = conn.client_data(first + metadata + second)
    jobs = [a for a in actions if isinstance(a, StartJob)]
    assert len(jobs) == 1 and not [a for a in actions if isinstance(a, SendToBroker)]
    out = conn.job_done(jobs[0].job_id, jobs[0].job.run())
    (send,) = [a for a in out if isinstance(a, SendToBroker)]
    forwarded = frames_of(send.data)
    assert len(forwarded) == 2 and forwarded[1] == metadata[4:]
    (job,) = [a for a in out if isinstance(a, StartJob)]
    (send,) = [a for a in conn.job_done(job.job_id, job.job.run()) if isinstance(a, SendToBroker)]
    assert parse_request_header(frames_of(send.data)[0]).correlation_id == 3


def test_a_request_ahead_is_filtered_again_under_a_chain_installed_meanwhile(
    tmp_path: Path,
) -> None:
    """Two masked requests in jobs side by side; the chain is replaced by one that filters
    nothing on their topic before either is forwarded: both go out as the client sent them,
    as a serial pass that gave them to their path after the reload would have sent them."""
    # A chain of its own: the reload closes it once its jobs are done.
    chain = FilterChain.from_specs(
        [FilterSpec(name="pii", module="builtin:pii-mask", topics=("pii.*",),
                    apply_to=frozenset({"produce"}))],
        cache_dir=tmp_path / "cache",
    )
    other = FilterChain.from_specs(
        [FilterSpec(name="pii", module="builtin:pii-mask", topics=("elsewhere",),
                    apply_to=frozenset({"produce"}))],
        cache_dir=tmp_path / "cache",
    )
    chains = [chain]
    metrics = Metrics()
    table = reloadable_routes(chains, metrics)
    frames = build([("pii.a", 5, -1, []), ("pii.a", 5, -1, [])])
    conn = Connection(ClientInfo("1.2.3.4:5", ("b", 9092)), table, metrics)
    jobs = [a for a in conn.client_data(b"".join(frames)) if isinstance(a, StartJob)]
    assert len(jobs) == 2
    results = [job.job.run() for job in jobs]  # filtered (masked) under the first chain
    chains.append(other)
    table.install()
    sent: list[bytes] = []
    for job, result in zip(reversed(jobs), reversed(results), strict=True):
        for a in conn.job_done(job.job_id, result):
            if isinstance(a, SendToBroker):
                sent += frames_of(a.data)
    assert sent == [f[4:] for f in frames]  # unmasked: the chain in force decided
    other.close()


def test_a_stateful_filter_installed_meanwhile_sees_the_requests_in_client_order(
    tmp_path: Path,
) -> None:
    """A masked request is in its job (stateless: it overlaps); the chain is replaced by one
    whose stateful filter covers both its topic and the next request's. The next request is
    given to its path under the new chain: its stateful job must not start while the first
    request, which the new chain's stateful filter will also see (filtered again), is not yet
    applied, or the filter sees the connection's requests out of order (and two of them at
    once). Found in review: the serial job started at once, before the first one's."""
    upper = tmp_path / "sluice_upper.wasm"
    upper.write_bytes(wasmtime.wat2wasm((MODULES / "sluice_upper.wat").read_text()))
    produce = frozenset({"produce"})
    first_chain = FilterChain.from_specs(
        [FilterSpec(name="pii", module="builtin:pii-mask", topics=("pii.*",),
                    apply_to=produce)],
        cache_dir=tmp_path / "cache",
    )
    stateful_chain = FilterChain.from_specs(
        [FilterSpec(name="stateful", module=str(upper), topics=("pii.*", "keep.*"),
                    apply_to=produce)],
        cache_dir=tmp_path / "cache",
    )
    chains = [first_chain]
    metrics = Metrics()
    table = reloadable_routes(chains, metrics)
    first, second = build([("pii.a", 3, -1, []), ("keep.c", 3, -1, [])])
    conn = Connection(ClientInfo("1.2.3.4:5", ("b", 9092)), table, metrics)
    (job_a,) = [a for a in conn.client_data(first) if isinstance(a, StartJob)]
    chains.append(stateful_chain)
    table.install()
    started = [a for a in conn.client_data(second) if isinstance(a, StartJob)]
    assert started == [], "a stateful job started before an earlier request was applied"
    # The first request's result (masked under the old chain) arrives: it is filtered again
    # under the stateful chain first, and the second one's job starts only once it is applied.
    pending = [a for a in conn.job_done(job_a.job_id, job_a.job.run())
               if isinstance(a, StartJob)]
    sent: list[bytes] = []
    order: list[int] = []
    while pending:
        job = pending.pop(0)
        assert not pending, "two stateful jobs of one connection at once"
        for a in conn.job_done(job.job_id, job.job.run()):
            if isinstance(a, StartJob):
                pending.append(a)
            elif isinstance(a, SendToBroker):
                for body in frames_of(a.data):
                    sent.append(body)
                    order.append(parse_request_header(body).correlation_id)
    assert order == [1, 2]
    # both upper-cased by the new chain's filter
    assert b'"USER"' in sent[0] and b"LOWER CASE" in sent[1]
    stateful_chain.close()
