"""The connection's explicit state under any sequence of inputs (a hypothesis state machine):
each side's `paused` is what the last Pause/Resume action for it said, the request stream is
deferred exactly while a request job is out and nothing reaches the broker meanwhile, Produce
requests whose jobs overlap (`Job.overlap`) still reach the broker in the client's order and
never more than `Limits.overlap_jobs` are ahead, and a closed connection stays closed and says
nothing more."""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from sluice.codec.messages import ApiKey
from sluice.proxy.contract import ClientInfo
from sluice.proxy.net.connection import (
    Close,
    Connection,
    Limits,
    PauseBroker,
    PauseClient,
    ResumeBroker,
    ResumeClient,
    SendToBroker,
    StartJob,
    _Phase,
)
from sluice.proxy.paths.base import Defer, Exchange, Forward, Frame, Job, PathContext
from sluice.proxy.telemetry.metrics import Metrics
from tests.proxy.net.test_connection import (
    DESCRIBE_GROUPS,
    FETCH,
    LIST_OFFSETS,
    METADATA,
    ScriptedPath,
    frame,
    frames_of,
    request,
    response,
)
from tests.proxy.net.unfiltered_routes import unfiltered_routes

PRODUCE = int(ApiKey.PRODUCE)


@dataclass
class OverlappingPath(ScriptedPath):
    """ScriptedPath, and Produce: every third request forwarded at once (an unfiltered topic),
    the others deferred to a job that may overlap the next ones (`Job.overlap`)."""

    api_keys: frozenset[int] = frozenset({LIST_OFFSETS, FETCH, DESCRIBE_GROUPS, PRODUCE})

    def wants_request(self, ctx: PathContext, api_key: int) -> bool:
        return api_key == PRODUCE or super().wants_request(ctx, api_key)

    def on_request(self, ctx: PathContext, exchange: Exchange, frame: Frame) -> Any:
        cid = exchange.header.correlation_id
        if exchange.header.api_key != PRODUCE:
            return super().on_request(ctx, exchange, frame)
        self.seen.append(cid)
        if cid % 3 == 0:
            return Forward()
        return Defer(Job(run=lambda: cid, finish=lambda r: Forward(state=r), what="overlap",
                         overlap=True))

# Small limits, so that short sequences reach every back-pressure reason.
LIMITS = Limits(max_inflight=3, max_held_response_bytes=200, job_deadline=1e9)


class ConnectionState(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        metrics = Metrics()
        self.conn = Connection(ClientInfo("1.2.3.4:5", ("b", 9092)),
                               unfiltered_routes([OverlappingPath()], metrics), metrics, LIMITS)
        self.next_cid = 0
        self.sent: list[int] = []  # every correlation id sent to the broker, in order
        self.jobs: list[StartJob] = []  # started and not yet done, in start order
        self.forwarded: list[int] = []  # correlation ids sent to the broker, not yet answered
        self.client_paused = False  # what the last PauseClient/ResumeClient said
        self.broker_paused = False
        self.closed = False

    def feed(self, out: list[Any]) -> None:
        if self.closed:
            assert out == [], "a closed connection hands out nothing"
        for i, action in enumerate(out):
            if isinstance(action, PauseClient):
                assert not self.client_paused, "two PauseClient in a row"
                self.client_paused = True
            elif isinstance(action, ResumeClient):
                assert self.client_paused, "ResumeClient while not paused"
                self.client_paused = False
            elif isinstance(action, PauseBroker):
                assert not self.broker_paused, "two PauseBroker in a row"
                self.broker_paused = True
            elif isinstance(action, ResumeBroker):
                assert self.broker_paused, "ResumeBroker while not paused"
                self.broker_paused = False
            elif isinstance(action, StartJob):
                self.jobs.append(action)
            elif isinstance(action, SendToBroker):
                data = b"".join(bytes(b) for b in action.data)
                cids = [struct.unpack_from(">i", f, 4)[0] for f in frames_of(data)]
                self.forwarded += cids
                self.sent += cids
            elif isinstance(action, Close):
                assert i == len(out) - 1, "Close is the last action"
                self.closed = True

    @rule(
        kind=st.sampled_from([METADATA, LIST_OFFSETS, DESCRIBE_GROUPS, FETCH, PRODUCE, PRODUCE]),
        n=st.integers(1, 4),
    )
    def client_sends(self, kind: int, n: int) -> None:
        data = b""
        for _ in range(n):
            data += frame(request(kind, self.next_cid))
            self.next_cid += 1
        self.feed(self.conn.client_data(data))

    @precondition(lambda self: bool(self.jobs))
    @rule(pick=st.integers(0, 10))
    def a_job_finishes(self, pick: int) -> None:
        job = self.jobs.pop(pick % len(self.jobs))
        self.feed(self.conn.job_done(job.job_id, job.job.run()))

    @precondition(lambda self: bool(self.forwarded))
    @rule(n=st.integers(1, 3), slow=st.booleans())
    def broker_answers(self, n: int, slow: bool) -> None:
        data = b""
        for cid in self.forwarded[:n]:
            data += frame(response(cid, b"slow" if slow else b"broker"))
        del self.forwarded[:n]
        self.feed(self.conn.broker_data(data))

    @rule(writable=st.booleans())
    def client_socket(self, writable: bool) -> None:
        self.feed(self.conn.client_writable(writable))
        if not self.closed and not writable:
            assert self.client_paused and self.broker_paused

    @rule(writable=st.booleans())
    def broker_socket(self, writable: bool) -> None:
        self.feed(self.conn.broker_writable(writable))
        if not self.closed and not writable:
            assert self.client_paused

    @rule()
    def client_half_closes(self) -> None:
        self.feed(self.conn.client_eof())

    @rule()
    def tick(self) -> None:
        self.feed(self.conn.tick())

    @invariant()
    def sides_are_what_the_actions_said(self) -> None:
        conn = self.conn
        assert conn.client_paused is self.client_paused
        assert conn._client_side.paused is self.client_paused
        assert conn._broker_side.paused is self.broker_paused
        if conn._queued and not self.closed:
            # What bounds the queue's memory (docs/ARCHITECTURE.md): no more is read while a
            # request waits in it, so it holds at most what one read brought.
            assert self.client_paused, "a request is queued and the client is still read"

    @invariant()
    def phase_matches_the_jobs_and_the_close(self) -> None:
        conn = self.conn
        assert (conn._phase is _Phase.CLOSED) is (conn.closed is not None) is self.closed
        if self.closed:
            return
        request_jobs = [j for j in self.jobs if j.job.what == "test"]
        assert len(request_jobs) <= 1, "one deferred request at a time"
        assert (conn._phase is _Phase.DEFERRED) is bool(request_jobs)
        if conn._phase is _Phase.DEFERRED:
            assert conn.busy
            # Everything read after the deferred request waits in the queue, unsent.
            deferred = request_jobs[0]
            later = [c for c in self.forwarded if c > deferred.job.run()]
            assert later == [], f"sent to the broker past a deferred request: {later}"

    @invariant()
    def overlapping_jobs_keep_the_client_order(self) -> None:
        conn = self.conn
        assert self.sent == sorted(self.sent), f"sent out of the client's order: {self.sent}"
        if self.closed:
            return
        assert (conn._phase is _Phase.AHEAD) is bool(conn._ahead)
        assert len(conn._ahead) <= LIMITS.overlap_jobs
        if conn._ahead:
            assert conn.busy
            first = conn._ahead[0].target[0].header.correlation_id
            later = [c for c in self.forwarded if c >= first]
            assert later == [], f"sent to the broker past a request still ahead: {later}"


TestConnectionState = ConnectionState.TestCase
TestConnectionState.settings = settings(max_examples=200, stateful_step_count=40, deadline=None)
