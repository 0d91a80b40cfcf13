"""One client connection as a sans-IO state machine: bytes in, actions out.

`Connection` is fed the bytes the client sent (`client_data`), the bytes the broker sent
(`broker_data`), the results of jobs it asked for (`job_done`), end-of-stream on either side,
and whether each side's socket can take more bytes (`client_writable`, `broker_writable`). It
answers with a list of actions for the I/O layer (`net/session.py`) to perform: send these
bytes to the broker or to the client, pause or resume reading a side, start a job, call
`tick` later (`Wake`), perform a side effect (below), close.

What lives here, and only here:

- **Correlation and order.** Every request that expects a response gets a slot, in the
  client's order. Responses are matched to forwarded requests by correlation id (the broker
  answers in order); answers the proxy makes itself fill their slot at once. Bytes go to the
  client strictly in slot order. acks=0 Produce requests get no slot (Kafka sends no
  response; a broker that answers anyway is tolerated and its answer dropped).
- **Request order towards the broker.** While a request is deferred (a filter job, a config
  look-up), later requests wait behind it, so the broker sees them in the client's order.
  Except behind a job that may overlap others (`Job.overlap`: filters that keep no state):
  later Produce requests, up to `Limits.overlap_jobs` requests at a time, go to their path
  at once and their jobs run beside it; what each leads to (bytes to the broker, a slot, an
  answer, telemetry, dead letters) waits in `_ahead` and is applied in the client's order,
  so the broker, the client and the side effects see what a serial pass would give.
- **Back-pressure.** Reading from the client pauses while any request it sent waits in the
  queue (behind a deferred one, past the in-flight limit, or during a quota wait), too many
  requests are in flight, too many response bytes are held (from arrival until sent: being
  decided, in a job, or ready behind an earlier slot), or either socket's send buffer is
  full; reading from the broker pauses while the client's socket does not drain or too many
  response bytes are held (never while the first slot still waits for the broker).
  Per-connection memory is therefore bounded (see `Limits` and docs/ARCHITECTURE.md).
- **State, named.** Each socket is a `_Side` (writable, paused, ended) whose reading is
  paused and resumed only by `_Side.steer`, the one place Pause/Resume actions are made; the
  request stream is in one `_Phase`: flowing, deferred (one request in a job, later ones
  queued behind it), ahead (overlapping jobs, outcomes applied in order) or closed (`closed`
  holds the reason).
- **Chain changes in flight.** A response is sent only if it was processed by the router in
  force at send time, or its request pinned the path that handles it (`Forward.pin`);
  otherwise it is processed again from the broker's bytes (a Fetch that waited across a
  reload that added a fetch filter is filtered by it), and what the first processing asked
  for (`on_sent`, dead letters) is dropped: the second asks for its own.
- **Quota throttling.** With quotas configured (`ops/quotas.py`), a Produce request read or a
  Fetch response received is counted against the client's budgets, and an exchange over
  quota carries the time until which the client is held back. From then on the client's later
  requests wait (reading pauses), as behind a broker that reads a connection's next request
  only after answering and muting it (KIP-219). The response gets what is left of the wait in
  `throttle_time_ms` (the larger of it and the broker's) and is sent at once (Produce v6+,
  Fetch v8+); older versions get their response held back until the wait is over instead.
  The wait is one more reason in the same back-pressure decision, so neither resumes reading
  early for the other; a `Wake` action asks the I/O layer to call `tick` when a wait ends.
- **No side effects.** Telemetry, dead letters and learning a broker node are actions too
  (`Telemetry`, `DeadLetters`, `LearnNodes`): a path puts the first two on its exchange and
  the connection hands them out after the call (those of an unpinned response after its
  bytes, and only those of the processing that was sent: see chain changes); a path that
  meets a node it does not know raises `UnknownNodes`, the connection hands out
  `LearnNodes` and calls the path again on `nodes_learned`, so a response carrying a node's
  address is released only after the I/O layer has bound the node's port.
- **Refusals.** A frame that cannot be parsed, a request version the router refuses
  (`Router.refusal`: one the broker does not serve, or one a path must inspect that the codec
  cannot decode), a response that matches no request, a job past its deadline: the
  connection closes with the reason.
"""

from __future__ import annotations

import enum
import math
import struct
import time
from bisect import bisect_left
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sluice.codec.errors import CodecError, FrameTooLarge
from sluice.codec.frames import CLIENT_RESERVE, FrameBuffer
from sluice.codec.headers import parse_request_header
from sluice.codec.messages import ApiKey
from sluice.codec.passthrough import request_header
from sluice.codec.throttle import sends_before_throttling, with_throttle
from sluice.proxy.contract import ClientInfo, QuotaGate
from sluice.proxy.paths.base import (
    Answer,
    DeadLetters,
    Defer,
    Exchange,
    Forward,
    Frame,
    Job,
    NoReply,
    Pieces,
    Pin,
    Refuse,
    Refused,
    RequestOutcome,
    Respond,
    Telemetry,
    TelemetryCall,
    UnknownNodes,
)
from sluice.proxy.paths.registry import Routes, lease, release
from sluice.proxy.telemetry.metrics import LATENCY_BUCKETS, Metrics

_SIZE = struct.Struct(">i")
_pack_size = _SIZE.pack
_unpack_size = _SIZE.unpack_from  # a response's correlation id (`_on_response`)
_UNKNOWN: Any = object()  # not in the router's memo of response paths yet
#: Makes an action without a Python call: a slotted dataclass's `__init__` is a Python frame,
#: and every request and response makes one send action (issue 29, call budgets).
_new = object.__new__
_PRODUCE = int(ApiKey.PRODUCE)
_FETCH = int(ApiKey.FETCH)


@dataclass(frozen=True, slots=True)
class Limits:
    """Per-connection bounds (see docs/ARCHITECTURE.md, "Back-pressure")."""

    max_frame_size: int = 100 * 1024 * 1024
    max_inflight: int = 256  # requests awaiting their response
    max_held_response_bytes: int = 8 * 1024 * 1024  # responses held: being decided, in jobs, ready
    max_unanswered_acks0: int = 1024  # correlation ids of acks=0 requests remembered
    #: seconds a job (a filter run, a config look-up) may take before the connection closes
    job_deadline: float = 20.0
    #: requests given to their path while an earlier one's overlapping job runs, the first
    #: included (`Job.overlap`; the server sets proxy.filter_threads; below 2: never)
    overlap_jobs: int = 2


# ------------------------------------------------------------------ actions


#: What a call hands the broker's socket: size prefixes and frames (or their pieces), in order.
_Outgoing = list[bytes | bytearray | memoryview]


@dataclass(slots=True)
class SendToBroker:
    data: list[bytes | bytearray | memoryview]  # size prefixes and frame bodies, in order


@dataclass(slots=True)
class SendToClient:
    data: list[bytes | bytearray | memoryview]


@dataclass(slots=True)
class StartJob:
    job_id: int
    job: Job


@dataclass(slots=True)
class PauseClient:
    pass


@dataclass(slots=True)
class ResumeClient:
    pass


@dataclass(slots=True)
class PauseBroker:
    pass


@dataclass(slots=True)
class ResumeBroker:
    pass


@dataclass(slots=True)
class Wake:
    """Call `Connection.tick` in `delay` seconds (a quota wait ends then)."""

    delay: float


@dataclass(slots=True)
class LearnNodes:
    """Learn these broker nodes ((node id, upstream host, upstream port) each): choose their
    local ports and bind them, then call `Connection.nodes_learned`. A response that names one
    of them is held until then."""

    nodes: tuple[tuple[int, str, int], ...]


@dataclass(slots=True)
class Close:
    reason: str
    violation: bool = False  # the peer broke the protocol (counted, logged as a warning)


Action = (
    SendToBroker
    | SendToClient
    | StartJob
    | PauseClient
    | ResumeClient
    | PauseBroker
    | (ResumeBroker | Close | Wake)
    | (Telemetry | DeadLetters | LearnNodes)
)


@dataclass(slots=True)
class _Side:
    """One socket as the connection sees it: can it take more bytes, is reading it paused,
    has it ended. Reading is paused and resumed only through `steer`, which hands out the
    action on a change, so `paused` is always what the last Pause/Resume action said."""

    pause: Callable[[], Action]
    resume: Callable[[], Action]
    writable: bool = True
    paused: bool = False
    eof: bool = False

    def steer(self, pause: bool, out: list[Action]) -> None:
        if pause != self.paused:
            self.paused = pause
            out.append(self.pause() if pause else self.resume())


class _Phase(enum.Enum):
    """Where the stream of requests stands."""

    #: requests go to their paths as they are read (past a limit they wait in the queue)
    FLOWING = "flowing"
    #: one request is in a job (a filter run, a config look-up); every later one waits in
    #: the queue behind it, so the broker sees them in the client's order
    DEFERRED = "deferred"
    #: requests whose jobs overlap (`Job.overlap`) are in `_ahead`: later Produce requests
    #: still go to their path (up to `Limits.overlap_jobs`, never past a serial one), anything
    #: else waits in the queue; outcomes are applied in the client's order
    AHEAD = "ahead"
    #: the connection is closed (`Connection.closed` says why); inputs are ignored
    CLOSED = "closed"


# Module constants: compared by identity on the hot path.
_FLOWING = _Phase.FLOWING
_DEFERRED = _Phase.DEFERRED
_AHEAD = _Phase.AHEAD
_CLOSED = _Phase.CLOSED


# A call to make again once nodes are learnt: given the actions list and the nodes asked for.
_Retry = Callable[[list[Action], frozenset[int]], None]


class _Slot:
    """One request awaiting its response, in client order."""

    __slots__ = (
        "effects",
        "exchange",
        "generation",
        "held",
        "held_since",
        "on_sent",
        "pin",
        "raw",
        "response",
        "started",
        "waiting_job",
    )

    def __init__(self, exchange: Exchange, pin: Pin | None) -> None:
        self.exchange = exchange
        self.pin = pin
        self.raw: bytes | memoryview | None = None  # the broker's response frame body
        # What the client gets: one buffer, or `Pieces` written in order (a spliced Fetch).
        self.response: bytes | memoryview | Pieces | None = None
        self.on_sent: TelemetryCall | None = None
        # What processing `response` asked for (dead letters, telemetry), handed out after
        # its bytes like `on_sent` and dropped with it if the response is processed again.
        self.effects: list[Telemetry | DeadLetters] | None = None
        self.generation = -1  # router generation that produced `response` (-1: not routed)
        self.waiting_job = False
        self.held = 0  # bytes of `response` counted as held
        self.held_since = 0.0  # when a pre-KIP-219 throttled response started waiting
        self.started = time.monotonic()


class _Ahead:
    """A request given to its path while requests before it still had jobs running: what it
    leads to waits here until every earlier one is applied (`Connection._advance`)."""

    __slots__ = ("ctx", "effects", "generation", "outcome", "serial", "target", "waiting")

    def __init__(self, target: tuple[Exchange, bytes | memoryview], ctx: Any) -> None:
        self.target = target
        self.ctx = ctx
        self.generation: int = ctx.generation  # the chain its path call ran under
        #: the outcome to apply; None while its job runs
        self.outcome: Any = None
        #: a job that must not overlap later ones (a stateful filter, a look-up), or a
        #: refusal: no later request goes to its path before this one is applied
        self.serial = False
        #: what its path asked for (telemetry, dead letters), handed out when it is applied
        self.effects: list[Telemetry | DeadLetters] | None = None
        #: a serial job not started yet: it starts once this request is at the head (every
        #: earlier one applied), as in a serial pass
        self.waiting: Job | None = None


def _is_produce(frame: bytes | memoryview) -> bool:
    return len(frame) >= 2 and frame[0] == 0 and frame[1] == _PRODUCE


class Connection:
    """The sans-IO state of one client connection (see the module docstring)."""

    def __init__(
        self,
        client: ClientInfo,
        routes: Routes,
        metrics: Metrics,
        limits: Limits | None = None,
        quotas: QuotaGate | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.client = client
        self.limits = limits or Limits()
        self._quotas = quotas
        self._clock = clock
        self._mute_until = 0.0  # quota throttling: no reading from the client before this
        self._wake_at: float | None = None  # the earliest `Wake` asked for and not yet ticked
        self._pending_wake: float | None = None  # delay of a `Wake` to hand out
        self._routes = routes
        self._metrics = metrics
        # Read by the I/O layer only for their `missing` bytes (the receive low-water mark).
        # The client's socket is read into it too (net/session.py `Session.get_buffer`); a
        # large request reserves less at once than a response (`CLIENT_RESERVE`).
        # A read of whole large requests is handed over, not copied (`hand_over`): a request
        # is let go of once forwarded (`_apply_request`), unlike a response, which is held
        # until sent (a 256 KB read buffer per 32 KB response, against the held-bytes limit).
        self.client_frames = FrameBuffer(self.limits.max_frame_size, reserve=CLIENT_RESERVE,
                                         hand_over=True)
        self._hand_over = self.client_frames.hand_over  # where the codec can (`client_data`)
        self.broker_frames = FrameBuffer(self.limits.max_frame_size)
        self._slots: deque[_Slot] = deque()  # awaiting the client, in request order
        self._awaiting: deque[_Slot] = deque()  # forwarded, awaiting the broker, in order
        self._unanswered: deque[int] = deque(maxlen=self.limits.max_unanswered_acks0)
        # Requests behind a deferred one: at most one read's worth, as reading pauses while
        # any waits here (see `_finish`), so they need no byte bound of their own.
        self._queued: deque[bytes | memoryview] = deque()
        self._held_bytes = 0  # response bytes held (see `_account`)
        self._phase = _FLOWING
        # Requests given to their path behind overlapping jobs, in client order (phase AHEAD).
        self._ahead: deque[_Ahead] = deque()
        # job id -> (kind, what it is for, its finish, the context it runs with)
        self._jobs: dict[int, tuple[str, Any, Callable[[Any], Any], Any]] = {}
        # job id -> (its deadline on the clock, Job.what), in start order
        self._job_deadlines: dict[int, tuple[float, str]] = {}
        self._next_job = 1
        self._client_side = _Side(PauseClient, ResumeClient)
        self._broker_side = _Side(PauseBroker, ResumeBroker)
        # Calls to make again once the I/O layer has learnt nodes (`LearnNodes`), in order,
        # each with the nodes it asked for (asked twice: the port could not be bound).
        self._parked: list[tuple[_Retry, frozenset[int]]] = []
        self._closed: Close | None = None  # set with the CLOSED phase, by `_close` only

    # ================================================================ inputs

    def client_data(self, data: bytes | int) -> list[Action]:
        """Bytes the client sent: a chunk read, or (an int) how many bytes its socket read
        into `client_frames.get_buffer()` (as `broker_data`: a large Produce request is read
        into the buffer it is forwarded from)."""
        out: list[Action] = []
        if self._phase is _CLOSED:
            return out
        frames_in = self.client_frames
        try:
            if type(data) is int:
                self.client.stats.bytes_in += data
                if self._hand_over:
                    # Not while Produce filters are in force: a request in a filter job (or
                    # queued for the pool, among every connection's) would keep the read
                    # buffer it was handed over with, up to ~8x its bytes (a 32 KiB request:
                    # 261 KB held against 38 KB copied; tests/proxy/net/test_session_reads.py).
                    frames_in.hand_over = "produce" not in self._routes.current.ctx.directions
                frames = frames_in.filled(data)
            else:
                self.client.stats.bytes_in += len(data)  # type: ignore[arg-type]
                frames = frames_in.feed(data)  # type: ignore[arg-type]
        except FrameTooLarge as exc:
            return self._close(out, f"request frame too large: {exc}", violation=True)
        if not frames:
            return out  # a read inside a large request: as in `broker_data`
        to_broker: _Outgoing = []
        limit = self.limits.max_inflight
        for frame in frames:
            if (
                self._phase is _DEFERRED
                or self._queued
                or len(self._slots) >= limit
                or (self._mute_until and self._held_back())
                or (self._phase is _AHEAD and not self._may_go_ahead(frame))
            ):
                # One read can hold thousands of small requests: those past the in-flight
                # limit (or behind a deferred one, or read while the client is held back by
                # a quota) wait here, and reading pauses.
                self._queued.append(frame)
                continue
            self._on_request(frame, out, to_broker)
            if self._phase is _CLOSED:
                break
        return self._finish(out, to_broker)

    def broker_data(self, data: bytes | int) -> list[Action]:
        """Bytes the broker sent: a chunk read, or (an int) how many bytes its socket read into
        `broker_frames.get_buffer()` (the I/O layer reads into the frame buffer: a large
        response is read into the buffer it is forwarded from, `FrameBuffer.filled`)."""
        out: list[Action] = []
        if self._phase is _CLOSED:
            return out
        frames_in = self.broker_frames
        try:
            frames = (frames_in.filled(data) if type(data) is int
                      else frames_in.feed(data))  # type: ignore[arg-type]
        except FrameTooLarge as exc:
            return self._close(out, f"response frame too large: {exc}", violation=True)
        if not frames:
            # A read inside a large response: nothing changed that `_finish` looks at (bytes
            # in assembly are not held responses), so nothing to decide (issue 29: a 1 MB
            # Fetch response is ~16 reads).
            return out
        for frame in frames:
            self._on_response(frame, out)
            if self._phase is _CLOSED:
                return out
        return self._finish(out, None)

    def job_done(
        self, job_id: int, result: Any, error: BaseException | None = None
    ) -> list[Action]:
        out: list[Action] = []
        kind, subject, finish, ctx = self._jobs.pop(job_id)
        self._job_deadlines.pop(job_id, None)
        release(ctx)
        if self._phase is _CLOSED:
            return out
        if error is not None:
            return self._close(out, f"{kind} job failed: {type(error).__name__}: {error}")
        to_broker: _Outgoing = []
        if kind == "request":
            exchange = subject[0]
            try:
                outcome = finish(result)
            except (CodecError, Refused, UnknownNodes) as exc:
                return self._close(out, str(exc), violation=True)
            self._effects(exchange, out)
            self._phase = _FLOWING
            self._apply_request(subject, outcome, ctx, out, to_broker)
            self._drain_queue(out, to_broker)
        elif kind == "ahead":
            entry: _Ahead = subject
            try:
                outcome = finish(result)
            except (CodecError, Refused, UnknownNodes) as exc:
                return self._close(out, str(exc), violation=True)
            self._keep_effects(entry, entry.target[0])
            self._settle(entry, outcome, out)
            self._advance(out, to_broker)
            self._drain_queue(out, to_broker)
        else:
            self._finish_response(subject, finish, result, ctx, out, frozenset())
        return self._finish(out, to_broker)

    def _finish_response(
        self,
        slot: _Slot,
        finish: Callable[[Any], Any],
        result: Any,
        ctx: Any,
        out: list[Action],
        asked: frozenset[int],
    ) -> None:
        try:
            outcome = finish(result)
        except (CodecError, Refused) as exc:
            self._close(out, str(exc), violation=True)
            return
        except UnknownNodes as exc:
            # Called again with the result it already has: a response's `finish` only
            # rewrites and encodes (the filters ran in `run`), so the released chain is not used.
            self._park(
                slot.exchange,
                exc,
                asked,
                lambda o, known: self._finish_response(slot, finish, result, ctx, o, known),
                out,
            )
            return
        self._response_effects(slot, out)
        self._apply_response(slot, outcome, ctx, out)

    def nodes_learned(self) -> list[Action]:
        """The I/O layer performed the `LearnNodes` actions handed out: the calls that met
        those nodes are made again, in order."""
        out: list[Action] = []
        parked, self._parked = self._parked, []
        for call, asked in parked:
            if self._phase is _CLOSED:
                return out
            call(out, asked)
        return self._finish(out, None)

    def client_eof(self) -> list[Action]:
        """The client half-closed: answer what it asked, then close."""
        out: list[Action] = []
        self._client_side.eof = True
        if self._phase is not _CLOSED and self._idle():
            self._close(out, "client closed")
        return out

    def broker_eof(self) -> list[Action]:
        out: list[Action] = []
        self._broker_side.eof = True
        if self._phase is not _CLOSED:
            reason = "broker closed"
            if self._awaiting:
                reason += f" with {len(self._awaiting)} request(s) unanswered"
            self._close(out, reason)
        return out

    def tick(self) -> list[Action]:
        """A `Wake` came due: a quota wait may have ended, or a job's deadline passed."""
        self._wake_at = None
        if self._phase is _CLOSED:
            return []
        if self._job_deadlines:
            now = self._clock()
            # Deadlines are in start order and all jobs get the same allowance: the first
            # one is the earliest.
            deadline, what = next(iter(self._job_deadlines.values()))
            if deadline <= now:
                # The job itself cannot be stopped from here (a filter's own timeout_ms stops
                # a guest); its result is dropped when it ends. The client sees its connection
                # close, as Kroxylicious does for a filter that never completes, and retries.
                return self._close(
                    [],
                    f"{what} did not finish within {self.limits.job_deadline:g} s",
                )
            self._wake(deadline, now)
        return self._finish([], None)

    def client_writable(self, writable: bool) -> list[Action]:
        self._client_side.writable = writable
        return self._finish([], None)

    def broker_writable(self, writable: bool) -> list[Action]:
        self._broker_side.writable = writable
        return self._finish([], None)

    # ================================================================ state for observers

    @property
    def busy(self) -> bool:
        """Requests are waiting for their responses (a long-poll Fetch is not idleness), or
        the client is held back by a quota."""
        return (
            bool(self._slots)
            or self._phase is _DEFERRED
            or self._phase is _AHEAD
            or (self._mute_until > 0 and self._mute_until > self._clock())
        )

    @property
    def client_paused(self) -> bool:
        return self._client_side.paused

    @property
    def request_missing(self) -> int:
        """Bytes of the client's frame in assembly not read yet (0: none in assembly). The I/O
        layer may wait for that many before its next read (`net/low_water.py`); it reads
        the frame buffer's attribute (`client_frames.missing`) on its hot path."""
        return self.client_frames.missing

    @property
    def response_missing(self) -> int:
        """Likewise for the broker's frame in assembly (`broker_frames.missing`)."""
        return self.broker_frames.missing

    @property
    def closed(self) -> Close | None:
        """Why the connection closed; None while it is open."""
        return self._closed

    def _idle(self) -> bool:
        return not self._slots and self._phase is _FLOWING and not self._queued

    # ================================================================ requests

    def _drain_queue(self, out: list[Action], to_broker: _Outgoing) -> None:
        limits = self.limits
        while (
            self._queued
            and (
                self._phase is _FLOWING
                or (self._phase is _AHEAD and self._may_go_ahead(self._queued[0]))
            )
            and len(self._slots) < limits.max_inflight
            # Answers go out as soon as they are made: not while the client does not read.
            and self._client_side.writable
            and self._broker_side.writable
            and self._held_bytes < limits.max_held_response_bytes
            and not (self._mute_until and self._held_back())
        ):
            frame = self._queued.popleft()
            self._on_request(frame, out, to_broker)

    def _on_request(
        self, frame: bytes | memoryview, out: list[Action], to_broker: _Outgoing
    ) -> None:
        if type(frame) is memoryview and not frame.readonly:
            # Frames reassembled across reads are views of a bytearray; kio's native decoder
            # only takes read-only buffers (toreadonly is zero-copy).
            frame = frame.toreadonly()
        try:
            # The native reader (one C call); None for anything it leaves to the Python one.
            header = request_header(frame) or parse_request_header(frame)
        except CodecError as exc:
            self._close(out, f"malformed request header: {exc}", violation=True)
            return
        router = self._routes.current
        api_key, version = header.api_key, header.api_version
        key = api_key << 16 | version
        # `refusal`'s memo read first: a (key, version) passed under the broker's ranges now
        # passes again (one call less per request).
        if router.passed_under is not router.versions.ranges or key not in router.passed:
            refusal = router.refusal(header, frame)
            if refusal is not None:
                # A version the broker lacks (it would close too), or one a path must inspect
                # and the codec cannot decode. Also keeps every per-(key, version) table
                # bounded.
                self._close(out, refusal, violation=True)
                return
        client = self.client
        if header.client_id is not None:
            client.client_id = header.client_id
        counts = client.stats.requests
        counts[api_key] = counts.get(api_key, 0) + 1
        # `Metrics.request`, written out once its (key, version) is counted (bounded by
        # `refusal`): one call less per request.
        counted = self._metrics.requests.get(key)
        if counted is None:
            self._metrics.request(api_key, version, len(frame))
        else:
            counted[0] += 1
            counted[1] += len(frame)
        # `Exchange(header, client)` without its __init__'s frame: every field set here
        # (tests/proxy/net/test_passthrough_calls.py holds the two to the same fields).
        exchange = _new(Exchange)
        exchange.header = header
        exchange.client = client
        exchange.state = exchange.guard = exchange.parsed = exchange.effects = None
        exchange.throttle_until = 0.0
        quotas = self._quotas
        if api_key == _PRODUCE and quotas is not None and quotas.active:
            exchange.throttle_until = until = quotas.produce(
                client.principal, client.client_id, exchange, frame
            )
            # Like a broker, which reads a connection's next request only once it has
            # answered this one: requests after it wait until the client is within quota.
            self._mute(until)
        path = router.requests.get(api_key)  # `request_path`, one call less
        if path is None and self._ahead:
            self._go_ahead((exchange, frame), Forward(), router.ctx, out)
            return
        if path is None:
            slot = _Slot(exchange, None)
            self._slots.append(slot)
            self._awaiting.append(slot)
            to_broker.append(_pack_size(len(frame)))
            to_broker.append(frame)
            return
        # What `_path_request` does, inline: every Produce and Fetch request gets here.
        try:
            outcome = path.on_request(router.ctx, exchange, frame)
        except (CodecError, Refused, UnknownNodes) as exc:
            self._close(out, str(exc), violation=True)
            return
        if self._ahead:
            # Behind overlapping jobs: applied once every earlier request is.
            self._go_ahead((exchange, frame), outcome, router.ctx, out)
            return
        if exchange.effects:  # tested here: almost no request asks for any
            self._effects(exchange, out)
        self._apply_request((exchange, frame), outcome, router.ctx, out, to_broker)

    def _apply_request(
        self,
        target: tuple[Exchange, bytes | memoryview],
        outcome: Any,
        ctx: Any,
        out: list[Action],
        to_broker: _Outgoing,
    ) -> None:
        exchange, frame = target
        header = exchange.header
        if type(outcome) is Forward:
            sent = frame if outcome.frame is None else outcome.frame
            exchange.state = outcome.state
            # What the paths parsed of it is theirs only until now: not kept with the slot,
            # so the frame (a view of the read buffer it was read into, `FrameBuffer`'s
            # `hand_over`) is let go of once written.
            exchange.parsed = None
            if outcome.expect_response:
                slot = _Slot(exchange, outcome.pin)
                self._slots.append(slot)
                self._awaiting.append(slot)
            else:
                self._unanswered.append(header.correlation_id)
            if isinstance(sent, tuple):  # Pieces: written in order, not joined (one writev)
                to_broker.append(_pack_size(sum(map(len, sent))))
                to_broker.extend(sent)
            else:
                to_broker.append(_pack_size(len(sent)))
                to_broker.append(sent)
        elif type(outcome) is Answer:
            slot = _Slot(exchange, None)
            slot.response = outcome.response
            slot.on_sent = outcome.on_sent
            slot.generation = self._routes.current.generation
            self._hold(slot)
            self._slots.append(slot)
        elif type(outcome) is Refuse:
            self._close(out, outcome.reason, violation=True)
        elif type(outcome) is Defer:
            if outcome.job.overlap and self.limits.overlap_jobs > 1:
                # Later Produce requests may go to their path while this job runs.
                self._go_ahead(target, outcome, ctx, out)
                return
            # Later requests wait: the broker must see them in the client's order.
            self._phase = _DEFERRED
            self._start_job("request", target, outcome.job, ctx, out)
        elif type(outcome) is NoReply:
            return
        else:
            raise TypeError(f"unknown request outcome {outcome!r}")

    # ------------------------------------------------------------ overlapping jobs

    def _may_go_ahead(self, frame: bytes | memoryview) -> bool:
        """Whether `frame` may go to its path now, in phase AHEAD: a Produce request, fewer
        than `overlap_jobs` requests ahead, none of them serial."""
        ahead = self._ahead
        if len(ahead) >= self.limits.overlap_jobs or not _is_produce(frame):
            return False
        return not any(entry.serial for entry in ahead)

    def _go_ahead(
        self,
        target: tuple[Exchange, bytes | memoryview],
        outcome: Any,
        ctx: Any,
        out: list[Action],
    ) -> None:
        """Queue what a request's path call gave in `_ahead` (starting its job, if any)."""
        entry = _Ahead(target, ctx)
        self._keep_effects(entry, target[0])
        self._ahead.append(entry)
        self._phase = _AHEAD
        self._settle(entry, outcome, out)

    @staticmethod
    def _keep_effects(entry: _Ahead, exchange: Exchange) -> None:
        effects = exchange.effects
        if effects:
            exchange.effects = None
            if entry.effects is None:
                entry.effects = effects
            else:
                entry.effects.extend(effects)

    def _settle(self, entry: _Ahead, outcome: Any, out: list[Action]) -> None:
        if type(outcome) is Defer:
            entry.outcome = None
            entry.serial = not outcome.job.overlap
            if self._ahead[0] is not entry:
                if entry.serial:
                    # A stateful filter (or a look-up) must see the connection's requests one
                    # at a time in client order: an earlier request still ahead may yet meet
                    # the same filter (filtered again under a chain installed meanwhile), so
                    # the job starts once every earlier request is applied (`_advance`).
                    entry.waiting = outcome.job
                    return
                self._metrics.produce_overlapped += 1  # an earlier request is still in its job
            self._start_job("ahead", entry, outcome.job, entry.ctx, out)
        else:
            entry.outcome = outcome
            entry.serial = type(outcome) is Refuse

    def _advance(self, out: list[Action], to_broker: _Outgoing) -> None:
        """Apply the outcomes at the head of `_ahead` that are known, in client order."""
        ahead = self._ahead
        while ahead and self._phase is not _CLOSED:
            entry = ahead[0]
            outcome = entry.outcome
            router = self._routes.current
            if outcome is None:
                job = entry.waiting
                if job is not None:  # a serial job, now first: started (or made again)
                    entry.waiting = None
                    if entry.generation != router.generation:
                        self._reroute(entry, router, out)
                    else:
                        self._start_job("ahead", entry, job, entry.ctx, out)
                return  # its job still runs: everything behind it waits
            if entry.generation != router.generation:
                # The chain changed since its path call: a serial pass would have made that
                # call under the chain in force now, so it is made again (what the first one
                # asked for is dropped; a filter job runs again under the new chain).
                self._reroute(entry, router, out)
                continue
            ahead.popleft()
            if entry.effects:
                out.extend(entry.effects)
            self._apply_request(entry.target, outcome, entry.ctx, out, to_broker)
        if not ahead and self._phase is _AHEAD:
            self._phase = _FLOWING

    def _path_request(self, path: Any, ctx: Any, exchange: Exchange, frame: Frame,
                      out: list[Action]) -> RequestOutcome | None:
        """The path's outcome for a request, or None once a request it cannot take has
        closed the connection."""
        try:
            return path.on_request(ctx, exchange, frame)
        except (CodecError, Refused, UnknownNodes) as exc:
            self._close(out, str(exc), violation=True)
            return None

    def _reroute(self, entry: _Ahead, router: Any, out: list[Action]) -> None:
        exchange, frame = entry.target
        exchange.effects = None
        entry.effects = None
        entry.ctx = router.ctx
        entry.generation = router.generation
        path = router.request_path(exchange.header.api_key)
        if path is None:
            self._settle(entry, Forward(), out)
            return
        outcome = self._path_request(path, router.ctx, exchange, frame, out)
        if outcome is None:
            return
        self._keep_effects(entry, exchange)
        self._settle(entry, outcome, out)

    def _start_job(self, kind: str, subject: Any, job: Job, ctx: Any, out: list[Action]) -> None:
        job_id = self._next_job
        self._next_job += 1
        lease(ctx)  # the chain it runs with stays open until job_done
        self._jobs[job_id] = (kind, subject, job.finish, ctx)
        now = self._clock()
        deadline = now + self.limits.job_deadline
        self._job_deadlines[job_id] = (deadline, job.what)
        self._wake(deadline, now)
        out.append(StartJob(job_id, job))

    # ================================================================ side effects

    def _effects(self, exchange: Exchange, out: list[Action]) -> None:
        """Hand out what the path just asked for on `exchange`, in order."""
        effects = exchange.effects
        if effects:
            out.extend(effects)
            exchange.effects = None

    def _response_effects(self, slot: _Slot, out: list[Action]) -> None:
        """Effects of processing a response. A pinned one is never processed again: handed
        out now. Otherwise they wait on the slot until the response is sent, because a reload
        before then processes it again and that processing asks for its own (a record a
        filter failed on would be dead-lettered twice, or by a filter no longer in force)."""
        exchange = slot.exchange
        effects = exchange.effects
        if not effects:
            return
        exchange.effects = None
        if slot.pin is not None:
            out.extend(effects)
        elif slot.effects is None:
            slot.effects = effects
        else:
            slot.effects.extend(effects)  # a Defer's finish after the call that deferred

    def _park(
        self,
        exchange: Exchange,
        exc: UnknownNodes,
        asked: frozenset[int],
        call: Callable[[list[Action], frozenset[int]], None],
        out: list[Action],
    ) -> None:
        """A path met nodes not learnt yet: drop what the call asked for (the call is made
        again), hand out `LearnNodes`, and make the call again on `nodes_learned`."""
        exchange.effects = None
        ids = frozenset(n[0] for n in exc.nodes)
        if ids & asked:
            # Learnt once already and still unknown: its local port could not be bound (the
            # server logged why). Closing makes the client ask again; it never gets an
            # address nobody listens on.
            self._close(out, f"cannot serve broker node(s) {sorted(ids & asked)}: no local port")
            return
        out.append(LearnNodes(exc.nodes))
        self._parked.append((call, asked | ids))

    # ================================================================ responses

    def _on_response(self, frame: bytes | memoryview, out: list[Action]) -> None:
        if type(frame) is memoryview and not frame.readonly:
            frame = frame.toreadonly()
        try:
            # `read_correlation_id`, unpacked here: one Python call less on every response.
            correlation_id = _unpack_size(frame, 0)[0]
        except struct.error:
            self._close(out, "malformed response: frame shorter than a correlation id",
                        violation=True)
            return
        awaiting = self._awaiting
        if (
            not awaiting or awaiting[0].exchange.header.correlation_id != correlation_id
        ) and correlation_id in self._unanswered:
            # Tansu 0.6 answers acks=0 Produce requests, which Kafka never does; clients
            # ignore such answers, so the proxy drops them instead of closing the connection.
            self._unanswered.remove(correlation_id)
            return
        if not awaiting:
            self._close(
                out, f"unsolicited response, correlation id {correlation_id}", violation=True
            )
            return
        slot = awaiting[0]
        expected = slot.exchange.header.correlation_id
        if expected != correlation_id:
            self._close(
                out,
                f"response correlation id {correlation_id} does not match request {expected}",
                violation=True,
            )
            return
        awaiting.popleft()
        slot.raw = frame
        # Counted from now on, while routed, parked, in a job or ready: by the outcome's
        # branch in `_route_response`/`_apply_response` (one call per response, not two).
        hdr = slot.exchange.header
        quotas = self._quotas
        if hdr.api_key == _FETCH and quotas is not None and quotas.active:
            client = slot.exchange.client
            slot.exchange.throttle_until = until = quotas.fetch(
                client.principal, client.client_id, hdr, frame
            )
            self._mute(until)
        # `Metrics.response`, written out once its (key, version) is counted (bounded by
        # `refusal`): one call less per response.
        seconds = time.monotonic() - slot.started
        metrics = self._metrics
        key = hdr.api_key << 16 | hdr.api_version
        counted = metrics.responses.get(key)
        if counted is None:
            metrics.response(hdr.api_key, hdr.api_version, len(frame), seconds)
        else:
            counted[0] += 1
            counted[1] += len(frame)
            hist = metrics.latency_of[key]
            hist.counts[bisect_left(LATENCY_BUCKETS, seconds)] += 1
            hist.sum += seconds
        self._route_response(slot, out)

    def _route_response(
        self, slot: _Slot, out: list[Action], asked: frozenset[int] = frozenset()
    ) -> None:
        router = self._routes.current
        hdr = slot.exchange.header
        path: Any = slot.pin
        if path is None:
            # `response_path`'s memo read first: one call less on every response.
            path = router.responses.get(hdr.api_key << 16 | (hdr.api_version & 0xFFFF), _UNKNOWN)
            if path is _UNKNOWN:
                path = router.response_path(hdr.api_key, hdr.api_version)
        raw = slot.raw
        assert raw is not None
        if path is None:
            self._apply_response(slot, Respond(raw), router.ctx, out)
            return
        try:
            outcome = path.on_response(router.ctx, slot.exchange, raw)
        except (CodecError, Refused) as exc:
            self._close(out, str(exc), violation=True)
            return
        except UnknownNodes as exc:
            self._account(slot)  # held while its nodes are learnt
            self._park(
                slot.exchange,
                exc,
                asked,
                lambda o, known: self._route_response(slot, o, known),
                out,
            )
            return
        if slot.exchange.effects:
            self._response_effects(slot, out)
        if type(outcome) is not Respond:
            self._apply_response(slot, outcome, router.ctx, out)
            return
        # `_apply_response`'s first case written out (every pass-through response comes here:
        # one call less), and `_account` in it: the broker's frame, and the client's response
        # when it is another buffer (`Pieces` at their full size).
        slot.response = response = outcome.frame
        slot.on_sent = outcome.on_sent
        slot.waiting_job = False
        slot.generation = router.ctx.generation
        raw = slot.raw
        held = len(raw) if raw is not None else 0
        if response is not raw:
            held += sum(map(len, response)) if type(response) is tuple else len(response)
        self._held_bytes += held - slot.held
        slot.held = held

    def _apply_response(self, slot: _Slot, outcome: Any, ctx: Any, out: list[Action]) -> None:
        if type(outcome) is Respond:
            slot.response = outcome.frame
            slot.on_sent = outcome.on_sent
            slot.waiting_job = False
            slot.generation = ctx.generation
            self._account(slot)
        elif type(outcome) is Refuse:
            self._close(out, outcome.reason, violation=True)
        elif type(outcome) is Defer:
            slot.waiting_job = True
            self._account(slot)  # the broker's frame, held while the job runs
            self._start_job("response", slot, outcome.job, ctx, out)
        else:
            raise TypeError(f"unknown response outcome {outcome!r}")

    def _hold(self, slot: _Slot) -> None:
        assert slot.response is not None
        self._account(slot)

    def _account(self, slot: _Slot) -> None:
        """Count what the slot keeps: the broker's frame (kept until sent, to process it again
        under a new chain) and the client's response when it is another buffer."""
        raw, response = slot.raw, slot.response
        held = len(raw) if raw is not None else 0
        if response is not None and response is not raw:
            # Pieces: mostly views of `raw`, counted at their full size all the same.
            held += sum(map(len, response)) if isinstance(response, tuple) else len(response)
        self._held_bytes += held - slot.held
        slot.held = held

    # ================================================================ output

    def _flush(self, out: list[Action]) -> None:
        slots = self._slots
        if not slots or slots[0].response is None:
            return  # nothing ready (after every request read): no lists made
        data: list[bytes | bytearray | memoryview] = []
        sent: list[Action] = []  # telemetry of what was sent, after the bytes
        current = self._routes.current.ctx.generation  # the attribute: no property call
        while slots:
            slot = slots[0]
            response = slot.response
            if response is None:
                break
            if slot.generation != current and slot.pin is None and slot.raw is not None:
                # The chain changed since this response was processed: the filters in force
                # now decide what the client gets (issue 11, hole 1).
                slot.response = None
                slot.on_sent = None
                slot.effects = None  # the new processing asks for its own
                self._account(slot)
                self._route_response(slot, out)
                if self._phase is _CLOSED or slot.response is None:
                    break
                continue
            if slot.exchange.throttle_until:
                held = self._throttle(slot, response)
                if held is None:
                    break  # a pre-KIP-219 response waits out the throttle time
                response = held
            slots.popleft()
            self._held_bytes -= slot.held
            if isinstance(response, tuple):  # Pieces: written in order, not joined (one writev)
                size = sum(map(len, response))
                data.append(_pack_size(size))
                data.extend(response)
            else:
                size = len(response)
                data.append(_pack_size(size))
                data.append(response)
            self.client.stats.bytes_out += size + 4
            if slot.effects is not None:
                sent.extend(slot.effects)
            if slot.on_sent is not None:
                sent.append(Telemetry(slot.on_sent))
        if data:
            send = _new(SendToClient)  # `SendToClient(data)` without its __init__'s frame
            send.data = data
            out.append(send)
            out.extend(sent)

    def _throttle(self, slot: _Slot,
                  response: bytes | memoryview | Pieces) -> bytes | memoryview | Pieces | None:
        """The response to send to a throttled client, with its throttle time; None while a
        pre-KIP-219 response must still be held back."""
        exchange = slot.exchange
        hdr = exchange.header
        until = exchange.throttle_until
        now = self._clock()
        before = sends_before_throttling(hdr.api_key, hdr.api_version)
        if before:
            wait = until - now  # the pause starts now: the client is told what is left of it
        else:
            if until > now:
                if not slot.held_since:
                    slot.held_since = now
                self._wake(until, now)
                return None
            # How long the response was held back (0 if it came after the wait was over).
            wait = until - slot.held_since if slot.held_since else 0.0
        ms = math.ceil(wait * 1000)
        if ms <= 0:
            return response
        if isinstance(response, tuple):  # Pieces: the throttle time is written into one buffer
            response = b"".join(response)
        try:
            response, ms = with_throttle(hdr.api_key, hdr.api_version, response, ms)
        except CodecError:
            pass  # unreadable here: relayed as it is (its path decided that), still paused
        self.client.stats.throttle_ms += ms
        return response

    def _mute(self, until: float) -> None:
        if until > self._mute_until:
            self._mute_until = until

    def _held_back(self) -> bool:
        """The client is held back by a quota now (asks for a `Wake` when that ends)."""
        now = self._clock()
        if self._mute_until > now:
            self._wake(self._mute_until, now)
            return True
        self._mute_until = 0.0
        return False

    def _wake(self, when: float, now: float) -> None:
        if self._wake_at is None or when < self._wake_at:
            self._wake_at = when
            self._pending_wake = max(0.0, when - now)

    def _finish(
        self, out: list[Action], to_broker: _Outgoing | None
    ) -> list[Action]:
        if self._phase is _CLOSED:
            return out
        if to_broker is None:
            to_broker = []
        slots = self._slots
        if slots and slots[0].response is not None:  # tested here: no call when none is ready
            self._flush(out)
        if self._queued and self._phase is not _CLOSED:
            self._drain_queue(out, to_broker)
            self._flush(out)
        if to_broker:
            send_on = _new(SendToBroker)  # as `_flush` makes a SendToClient
            send_on.data = to_broker
            out.append(send_on)
        if self._phase is _CLOSED:
            return out
        client_side, broker_side = self._client_side, self._broker_side
        if client_side.eof and self._idle():
            self._close(out, "client closed")
            return out
        limits = self.limits
        pause_client = (
            bool(self._queued)
            or len(self._slots) >= limits.max_inflight
            or self._held_bytes >= limits.max_held_response_bytes
            or not client_side.writable
            or not broker_side.writable
        )
        if self._mute_until and self._held_back():
            pause_client = True
        if self._pending_wake is not None:
            out.append(Wake(self._pending_wake))
            self._pending_wake = None
        if pause_client != client_side.paused:  # compared here: no call on the hot path
            client_side.steer(pause_client, out)
        # Responses are counted from the moment they arrive (in a job or ready): past the
        # bound the broker is not read either. Never while the first slot still waits for the
        # broker's answer: later broker answers cannot have arrived, the bytes held are the
        # proxy's own answers, and only the broker's next answer can let them go.
        slots = self._slots
        pause_broker = not client_side.writable or (
            self._held_bytes >= limits.max_held_response_bytes
            and not (slots and self._awaiting and self._awaiting[0] is slots[0])
        )
        if pause_broker != broker_side.paused:
            broker_side.steer(pause_broker, out)
        return out

    def _close(self, out: list[Action], reason: str, violation: bool = False) -> list[Action]:
        if self._phase is not _CLOSED:
            # What is ready in order still goes out first (a close after a half-close).
            if not violation:
                self._flush(out)
            self._closed = closed = Close(reason, violation)
            self._phase = _CLOSED
            self._ahead.clear()  # their jobs' late results are dropped
            # Told before the close, so that the I/O layer performs them.
            self._lost(reason, out)
            out.append(closed)
        return out

    def abort(self, reason: str) -> list[Action]:
        """Close from the proxy's side (shutdown, a limit): nothing more is sent."""
        return self._close([], reason)

    def _lost(self, reason: str, out: list[Action]) -> None:
        # Requests the broker never answered: paths that account for them (produce
        # telemetry) are told, so an audit shows the batches as lost, not as never sent.
        ctx = self._routes.current.ctx
        for slot in self._awaiting:
            if slot.pin is not None:
                slot.pin.on_unanswered(ctx, slot.exchange, reason)
                self._effects(slot.exchange, out)
        self._awaiting.clear()
