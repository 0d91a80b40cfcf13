"""Thin asyncio glue around one `Connection`: two protocols (client side, broker side) that
feed it bytes and perform the actions it returns.

Nothing here decides anything about Kafka: correlation, order, back-pressure and refusals are
the sans-IO `Connection`'s (`connection.py`). This module owns the sockets, the filter
thread pool hand-off and the side effects the connection asks for (telemetry, dead letters,
learning a broker node: `SideEffects`), performed in the order of the actions; when a
connection ends it closes both sockets once and tells the server
(`SessionHooks.session_closed`), which counts it, logs it and records its telemetry.
"""

from __future__ import annotations

import asyncio
import contextvars
import socket
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Executor, Future
from dataclasses import dataclass
from time import perf_counter
from typing import TYPE_CHECKING, Any, Protocol, cast

import structlog

from sluice.proxy.contract import ClientInfo, ConnectionStats
from sluice.proxy.net.connection import (
    Action,
    Close,
    Connection,
    DeadLetters,
    LearnNodes,
    PauseBroker,
    PauseClient,
    ResumeBroker,
    ResumeClient,
    SendToBroker,
    SendToClient,
    StartJob,
    Telemetry,
    Wake,
)
from sluice.proxy.net.filter_pool import FilterPool
from sluice.proxy.net.job_placement import JobPlacement
from sluice.proxy.net.low_water import MIN_MARK, LowWater, low_water
from sluice.proxy.net.write_queue import QueuedWrites, tls_writes
from sluice.proxy.ops.gc_pauses import thread_gc_time
from sluice.proxy.paths.base import IN_POOL, try_inline
from sluice.proxy.telemetry.logs import log, repeats

if TYPE_CHECKING:
    from sluice.filters.chain import DeadLetter
    from sluice.proxy.telemetry.recorder import TelemetryRecorder

#: Bytes a socket's send buffer may hold before the connection stops reading the other side.
WRITE_HIGH_WATER = 4 * 1024 * 1024
_CONNECT_TIMEOUT = 10.0
#: What one read takes before the broker connection is up (`Session.get_buffer`): the client
#: is paused after it, so its first requests, at most, land here.
_SPARE_SIZE = 64 * 1024
#: That buffer, one per thread (`_spare_buffer`), not one per session: uvloop reads every new
#: client once before the broker connection can be up, and a session's own 64 KiB was held
#: (zeroed, resident) until it was, up to `_CONNECT_TIMEOUT` (found in review, round 43).
_spares = threading.local()
#: Inline jobs one call of `_run_inline_jobs` runs before the rest wait for the loop's next
#: turn: pipelined requests start one another's jobs, so without a bound one read of a few
#: thousand tiny filtered requests ran every job back to back while other connections waited
#: (round 39 review). 16 keeps the loop turn's own cost (a poll, a handle) under a 16th of a
#: one-record job's, and a turn's filter work to 16 fast jobs.
INLINE_JOBS_PER_TURN = 16


class DeadLetterSink(Protocol):
    def submit(self, letters: list[DeadLetter]) -> None: ...


@dataclass(frozen=True, slots=True)
class SideEffects:
    """What performs the side effects a `Connection` hands out as actions."""

    telemetry: TelemetryRecorder
    dead_letters: DeadLetterSink
    #: Learn a broker node: choose its local port (under the shared table's lock) and bind it.
    learn_node: Callable[[int, str, int], object]


class SessionHooks(Protocol):
    """What a session tells the process about itself (the listener implements it)."""

    def admit(self, session: Session) -> bool: ...

    def session_opened(self, session: Session) -> None: ...

    def session_closed(self, session: Session, close: Close) -> None: ...


class Session(asyncio.BufferedProtocol):
    """The client side of one proxied connection (asyncio calls it), and the owner of the
    broker side."""

    def __init__(
        self,
        make_connection: Callable[[ClientInfo], Connection],
        upstream: tuple[str, int],
        upstream_ssl: dict[str, Any],
        node_id: int | None,
        hooks: SessionHooks,
        executor: FilterPool | Executor | None,
        effects: SideEffects,
        principal_of: Callable[[Any], str | None] | None = None,
        placement: JobPlacement | None = None,
    ) -> None:
        self._make_connection = make_connection
        self._effects = effects
        self.upstream_address = upstream
        self._upstream_ssl = upstream_ssl
        self.node_id = node_id
        self._hooks = hooks
        self._executor = executor
        self._principal_of = principal_of
        self._placement = placement
        self._client: asyncio.Transport | None = None
        self._broker: asyncio.Transport | None = None
        # Each socket's receive low-water mark (one wake-up per large frame, low_water.py).
        self._client_mark: LowWater | None = None
        self._broker_mark: LowWater | None = None
        self._client_queue: QueuedWrites | None = None
        self._broker_queue: QueuedWrites | None = None
        # A side under TLS gets its pieces joined into record-sized writes (`tls_writes`).
        self._client_tls = False
        self._broker_tls = False
        self._early: list[bytes] = []  # client bytes before the broker connection is up
        self._early_eof = False
        self._live = False  # the broker connection is up and the early bytes replayed
        self.conn: Connection | None = None
        self.client = ClientInfo("?", upstream, node_id)
        self._ended = False
        self._opened = False
        self._connecting: asyncio.Task[None] | None = None
        self._timer: asyncio.TimerHandle | None = None  # the pending `Wake` (quota waits)
        # What logs on this connection's behalf (filters, look-ups) says which connection:
        # these variables bound once, in a context each thread job runs in a copy of.
        self._job_context: contextvars.Context | None = None
        # The loop this session runs on, asked of asyncio once: `get_running_loop` makes a
        # getpid system call each time (its fork check), twice per filter job otherwise.
        self._loop: asyncio.AbstractEventLoop | None = None
        # Inline jobs started by the actions `_do` is performing, run once the outermost
        # `_do` is done with its list (`_run_inline_jobs`), and whether they are running.
        self._inline_jobs: deque[tuple[int, Callable[[], Any]]] = deque()
        self._doing = 0
        self._running_inline = False
        self._inline_later = False  # `_run_inline_jobs` is asked for at the loop's next turn

    # ------------------------------------------------------------ observed by limits
    @property
    def stats(self) -> ConnectionStats:
        return self.client.stats

    @property
    def busy(self) -> bool:
        return self.conn is not None and self.conn.busy

    @property
    def bytes_waiting(self) -> int:
        """Client bytes held in the kernel by the receive low-water mark, not read yet: they
        moved, though no read counted them (the idle check adds them)."""
        mark = self._client_mark
        return 0 if mark is None else mark.waiting()

    def close(self, reason: str, **fields: Any) -> None:
        """Close from the proxy's side (a limit, shutdown)."""
        log.info("connection_closed_by_proxy", conn=self.client.id, reason=reason, **fields)
        if self.conn is not None:
            self._do(self.conn.abort(reason))
        else:
            self._end(Close(reason))

    # ------------------------------------------------------------ client side (asyncio)
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are not subclasses of asyncio.Transport, only compatible.
        transport = cast(asyncio.Transport, transport)
        self._client = transport
        if not self._hooks.admit(self):
            self._ended = True  # never admitted: nothing to account for
            transport.close()
            return
        try:
            self._set_up(transport)
        except Exception as exc:
            log.error("session_setup_failed", error=repr(exc), exc_info=True)
            self._end(Close(f"connection set-up failed: {type(exc).__name__}"))

    def _set_up(self, transport: asyncio.Transport) -> None:
        peer = transport.get_extra_info("peername")
        self.client.client_address = f"{peer[0]}:{peer[1]}" if peer else "?"
        sock = transport.get_extra_info("socket")
        if sock is not None:
            try:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            except OSError:
                pass  # not TCP (a test's socketpair) or already gone
        self._client_queue = QueuedWrites(transport, WRITE_HIGH_WATER)
        self._client_tls = transport.get_extra_info("sslcontext") is not None
        self._client_mark = low_water(transport)
        if self._principal_of is not None:
            # A verified client certificate names the principal (SASL, if any, overrides).
            self.client.principal = self._principal_of(transport.get_extra_info("peercert"))
        self.conn = self._make_connection(self.client)
        transport.pause_reading()  # until the broker connection is up
        self._connecting = self._running_loop().create_task(self._connect())

    async def _connect(self) -> None:
        host, port = self.upstream_address
        loop = asyncio.get_running_loop()
        try:
            _transport, _ = await asyncio.wait_for(
                loop.create_connection(lambda: _BrokerSide(self), host, port, **self._upstream_ssl),
                _CONNECT_TIMEOUT,
            )
        except (OSError, TimeoutError) as exc:
            # Clients reconnect in a loop while the broker is down: one line per interval.
            repeats.warning(
                log,
                ("upstream_connect_failed", host, port),
                "upstream_connect_failed",
                conn=self.client.id,
                upstream=f"{host}:{port}",
                error=str(exc) or type(exc).__name__,
            )
            self._end(Close("broker unreachable"))
            return
        if self._ended:
            _transport.close()
            return
        self._opened = True
        self._hooks.session_opened(self)
        assert self.conn is not None
        self._live = True
        while self._early and not self._ended:
            self._do(self.conn.client_data(self._early.pop(0)))
        if self._client_mark is not None and not self._ended:
            self._client_mark.wait_for(self.conn.request_missing)
        if self._early_eof and not self._ended:
            self._do(self.conn.client_eof())
        assert self._client is not None
        if not self._ended and not self._client.is_closing() and not self.conn.client_paused:
            self._client.resume_reading()

    def broker_connected(self, transport: asyncio.Transport) -> None:
        self._broker = transport
        self._broker_queue = QueuedWrites(transport, WRITE_HIGH_WATER)
        self._broker_tls = transport.get_extra_info("sslcontext") is not None
        self._broker_mark = low_water(transport)
        sock = transport.get_extra_info("socket")
        if sock is not None:
            try:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            except OSError:
                pass

    def get_buffer(self, sizehint: int) -> memoryview:
        """Where the client's socket is read into: the connection's frame buffer
        (`FrameBuffer.get_buffer`), so a large Produce request is read straight into a
        buffer of its own, the one it is filtered and forwarded from. Fed as chunks, each
        read was copied into a `bytes` and again onto the end of the frame in assembly, a
        `bytearray` that grew by reallocation (copied anew as it grew): about a fifth of the
        event loop's CPU under a workload-1 producer's ~0.8 MB requests (issue 29). Before
        the broker connection is up (or after the end) the thread's spare buffer takes the
        read (`buffer_updated` copies its bytes out at once, as `data_received` keeps them)."""
        conn = self.conn
        if self._live and conn is not None and not self._ended:
            return conn.client_frames.get_buffer(sizehint)
        return _spare_buffer()

    def buffer_updated(self, nbytes: int) -> None:
        """`nbytes` were read into the buffer `get_buffer` gave (the same state decided both:
        nothing runs between the two calls)."""
        conn = self.conn
        if self._live and conn is not None and not self._ended:
            self._do(conn.client_data(nbytes))
            mark = self._client_mark
            if mark is not None and not self._ended:
                # Attributes, not calls, in the common case (no mark, nothing large
                # missing): after every read, on cold caches (issue 29, workload 2).
                missing = conn.client_frames.missing
                if missing >= MIN_MARK or mark.mark != 1:
                    mark.wait_for(missing)
            return
        self.data_received(bytes(_spare_buffer()[:nbytes]))

    def data_received(self, data: bytes) -> None:
        conn = self.conn
        if conn is None or self._ended:
            return
        if not self._live:
            # Bytes read before the broker connection is up (uvloop may deliver what it had
            # read after pause_reading, and starts reading after connection_made): kept, in
            # order, until `_connect` replays them; pausing again bounds them to one read.
            self._early.append(data)
            if self._client is not None:
                self._client.pause_reading()
            return
        # A chunk handed over whole (tests and benchmarks call this; the event loop reads
        # into `get_buffer`): read as the socket would be.
        view = memoryview(data)
        while view and self.conn is conn and not self._ended:
            buf = self.get_buffer(-1)
            n = min(len(buf), len(view))
            buf[:n] = view[:n]
            # Let go of it, as the loop does after a read: held into the next `get_buffer`,
            # a large request's buffer could not grow in place (a copy at each doubling).
            del buf
            view = view[n:]
            self.buffer_updated(n)

    def eof_received(self) -> bool:
        if not self._live:
            self._early_eof = True
        elif self.conn is not None and not self._ended:
            self._do(self.conn.client_eof())
        return True  # keep our side open: responses still in flight go out (half-close)

    def connection_lost(self, exc: Exception | None) -> None:
        if not self._ended:
            if self.conn is not None:
                self._do(self.conn.abort("client connection lost"))
            else:
                self._end(Close("client connection lost"))

    def pause_writing(self) -> None:
        if self.conn is not None and not self._ended:
            self._do(self.conn.client_writable(False))

    def resume_writing(self) -> None:
        if self._client_queue is not None:
            self._client_queue.resumed()
        if self.conn is not None and not self._ended:
            self._do(self.conn.client_writable(True))

    # ------------------------------------------------------------ broker side (from _BrokerSide)
    def broker_data(self, data: bytes | int) -> None:
        """Bytes the broker sent: a chunk, or how many its socket read into the connection's
        frame buffer (`_BrokerSide`, a buffered protocol)."""
        conn = self.conn
        if conn is not None and not self._ended:
            self._do(conn.broker_data(data))
            mark = self._broker_mark
            if mark is not None and not self._ended:
                missing = conn.broker_frames.missing
                if missing >= MIN_MARK or mark.mark != 1:
                    mark.wait_for(missing)

    def broker_eof(self) -> None:
        if self.conn is not None and not self._ended:
            self._do(self.conn.broker_eof())

    def broker_writable(self, writable: bool) -> None:
        if writable and self._broker_queue is not None:
            self._broker_queue.resumed()
        if self.conn is not None and not self._ended:
            self._do(self.conn.broker_writable(writable))

    # ------------------------------------------------------------ actions
    def _do(self, actions: list[Action]) -> None:
        # Counted (the inline jobs it starts run once the outermost `_do` is done); the loop
        # below is written out rather than called: this runs on every read of either side.
        self._doing += 1
        try:
            learnt = False
            for action in actions:
                kind = type(action)
                if kind is SendToBroker:
                    broker = self._broker
                    assert broker is not None
                    if broker.get_write_buffer_size():
                        # Queued, not sent: one piece (each costs a write context, and a
                        # view in it holds its whole chunk), counted (`write_queue.py`).
                        broker.write(b"".join(action.data))  # type: ignore[union-attr]
                        self._broker_queue.wrote()  # type: ignore[union-attr]
                    else:
                        data = action.data  # type: ignore[union-attr]
                        # Pieces (a spliced Produce): a TLS record each unless joined.
                        broker.writelines(tls_writes(data) if self._broker_tls else data)
                        self._broker_queue.pieces = 0  # type: ignore[union-attr]
                elif kind is SendToClient:
                    client = self._client
                    assert client is not None
                    if client.get_write_buffer_size():
                        # A client that is not reading: as above.
                        client.write(b"".join(action.data))  # type: ignore[union-attr]
                        self._client_queue.wrote()  # type: ignore[union-attr]
                    else:
                        data = action.data  # type: ignore[union-attr]
                        # Pieces (a spliced Fetch): a TLS record each unless joined.
                        client.writelines(tls_writes(data) if self._client_tls else data)
                        self._client_queue.pieces = 0  # type: ignore[union-attr]
                elif kind is StartJob:
                    self._start(action)  # type: ignore[arg-type]
                elif kind is PauseClient:
                    if self._client is not None and not self._client.is_closing():
                        self._client.pause_reading()
                elif kind is ResumeClient:
                    if self._client is not None and not self._client.is_closing():
                        self._client.resume_reading()
                elif kind is PauseBroker:
                    if self._broker is not None and not self._broker.is_closing():
                        self._broker.pause_reading()
                elif kind is ResumeBroker:
                    if self._broker is not None and not self._broker.is_closing():
                        self._broker.resume_reading()
                elif kind is Wake:
                    self._arm(action.delay)  # type: ignore[union-attr]
                elif kind is Telemetry:
                    action.call(self._effects.telemetry)  # type: ignore[union-attr]
                elif kind is DeadLetters:
                    self._effects.dead_letters.submit(action.letters)  # type: ignore[union-attr]
                elif kind is LearnNodes:
                    # Bound now, synchronously: the response naming these nodes goes out only
                    # after `nodes_learned`, so a client dialling a node's port finds it bound.
                    for node in action.nodes:  # type: ignore[union-attr]
                        self._effects.learn_node(*node)
                    learnt = True
                elif kind is Close:
                    self._end(action)  # type: ignore[arg-type]
            if learnt and self.conn is not None and not self._ended:
                self._do(self.conn.nodes_learned())
        finally:
            self._doing -= 1
            # In `finally`: an action that raised must not leave a started job unrun (its
            # request, and every later one of the connection, would wait for ever).
            # Not while the rest wait for the loop's next turn (`INLINE_JOBS_PER_TURN`):
            # they run first then, with the ones started here behind them.
            if self._inline_jobs and not self._doing and not self._inline_later:
                self._run_inline_jobs()

    def _arm(self, delay: float) -> None:
        # The connection asks only for a wake-up earlier than the one it has: replace it.
        if self._timer is not None:
            self._timer.cancel()
        self._timer = self._running_loop().call_later(delay, self._tick)

    def _tick(self) -> None:
        self._timer = None
        if self.conn is not None and not self._ended:
            self._do(self.conn.tick())

    def _start(self, action: StartJob) -> None:
        job = action.job
        placement = self._placement
        key = job.inline_key
        record = placement.record if placement is not None and key is not None else None
        fast = placement.max_seconds if placement is not None else 0.0
        bound = self._job_context
        if bound is None:
            # Bound once per connection, not per job (structlog's bound_contextvars costs
            # ~4 µs a job, a few % of a one-record filtered Produce, issue 29). Each job runs
            # in a copy: a job's own bindings end with it, and pool jobs of one connection
            # may run at the same time (a Context is entered by one thread at a time).
            bound = self._job_context = contextvars.Context()
            bound.run(structlog.contextvars.bind_contextvars, **self._log_context())

        def work_of(inline: bool) -> Any:
            if record is None:
                return try_inline(job.run) if inline else job.run()
            # CPU time of this thread, not wall time: in the pool, wall time counts the
            # wait for the GIL under load, and a job eligible to run inline does not wait
            # (inline, it is given back where it would: try_inline), so its CPU time is
            # what it would stall the loop for. Less any collection that ran meanwhile: it
            # holds the GIL wherever the job runs, and says nothing about the filter.
            # Inline, the thread's CPU time is at most the wall time it took (the loop's
            # thread runs nothing else meanwhile), so a job whose wall time is within the
            # fast bound is charged that, without a second read of the thread's CPU clock
            # (a system call, ~1.4 µs; a one-record job is ~40 µs). Either way the run
            # counts as fast, so placement is unchanged. Not for a job whose cost follows
            # its size: its CPU time per byte is learnt, and must stay that.
            gc_before = thread_gc_time.seconds()
            started = time.thread_time()
            by_wall = inline and not job.scales
            wall = perf_counter() if by_wall else 0.0
            result = IN_POOL
            try:
                result = try_inline(job.run) if inline else job.run()
                return result
            finally:
                if result is not IN_POOL:
                    spent = -1.0
                    if by_wall:
                        spent = perf_counter() - wall
                        if spent > fast:
                            spent = -1.0
                    if spent < 0.0:
                        spent = time.thread_time() - started
                    spent -= thread_gc_time.seconds() - gc_before
                    record(key, max(0.0, spent), job.size, job.scales, inline)

        def run(inline: bool = False) -> Any:
            assert bound is not None
            return bound.copy().run(work_of, inline)

        if not job.in_thread:

            async def run_async() -> Any:
                with structlog.contextvars.bound_contextvars(**self._log_context()):
                    return await job.run()

            self._in_pool(action.job_id, asyncio.ensure_future(run_async()))
        elif self._executor is None:
            # No filter threads configured: everything runs on the loop (and may wait there).
            self._run_on_loop(action.job_id, run)
        elif placement is not None and placement.inline(key, job.size, job.scales):
            # A small or cheap job of a kind that has proved fast (job_placement.py): on the
            # loop, unless it would wait there (then in the pool after all).
            inline_at = placement

            def inline_or_pool() -> Any:
                # `run(inline=True)` written out: a call fewer per inline job.
                result = bound.copy().run(work_of, True)
                if result is IN_POOL:
                    inline_at.gave_back()
                    self._to_pool(action.job_id, run)
                    return IN_POOL
                return result

            self._inline_jobs.append((action.job_id, inline_or_pool))
            return
        else:
            self._to_pool(action.job_id, run)

    def _running_loop(self) -> asyncio.AbstractEventLoop:
        loop = self._loop
        if loop is None:
            loop = self._loop = asyncio.get_running_loop()
        return loop

    def _log_context(self) -> dict[str, Any]:
        """What logs on this connection's behalf (filters, look-ups) say: which connection."""
        client = self.client
        return {"conn": client.id, "client": client.client_address, "node": self.node_id}

    def _inline_job(self, job_id: int, run: Callable[[], Any]) -> Callable[[], None]:
        """`run` as a job inline: its outcome to the connection (`IN_POOL`: it went to the
        pool, which hands it over)."""

        def run_inline() -> None:
            try:
                result = run()
            except Exception as exc:
                self._job_done(job_id, None, exc)
            else:
                if result is not IN_POOL:
                    self._job_done(job_id, result, None)

        return run_inline

    def _run_inline_jobs(self) -> None:
        """The inline jobs `_do` started, in order, each once the actions listed with it are
        performed (the forwarding of the requests before it goes first). Run here rather
        than in a callback of the loop's next turn: that turn cost a poll of the sockets, a
        handle and a pass of the loop per one-record filtered request (issue 29). A job's
        outcome may start the next (a request waiting behind it): the loop below runs it,
        not a nested call, so pipelined requests do not deepen the stack."""
        if self._running_inline:
            return
        self._running_inline = True
        try:
            jobs = self._inline_jobs
            budget = INLINE_JOBS_PER_TURN
            while jobs:
                if not budget:
                    # The rest at the loop's next turn (other connections first), in order.
                    if not self._inline_later:
                        self._inline_later = True
                        self._running_loop().call_soon(self._inline_turn)
                    return
                budget -= 1
                job_id, run = jobs.popleft()
                error: BaseException | None = None
                if self._ended:
                    # The connection closed (an earlier job's outcome, a limit): the filter
                    # is not run for nothing; the job still ends, releasing its chain lease.
                    result, error = None, asyncio.CancelledError()
                else:
                    try:
                        result = run()
                    except Exception as exc:
                        result, error = None, exc
                try:
                    if result is not IN_POOL:
                        self._job_done(job_id, result, error)
                except Exception:
                    # As the loop logs a callback that raised; the jobs behind it still run.
                    log.exception("inline_job_failed", conn=self.client.id)
        finally:
            self._running_inline = False

    def _inline_turn(self) -> None:
        self._inline_later = False
        self._run_inline_jobs()

    def _run_on_loop(self, job_id: int, run: Callable[[], Any]) -> None:
        """`run` on the loop in a callback of its own (no filter threads: every job, which
        may wait there), never from inside `_do`: the actions after this StartJob (the
        forwarding of requests that came before the deferred one) must be performed before
        the job's own."""
        self._running_loop().call_soon(self._inline_job(job_id, run))

    def _to_pool(self, job_id: int, run: Callable[[], Any]) -> None:
        """`run` in the filter thread pool; its outcome handed to the connection on the loop.

        The pool's thread hands it back itself, with one `call_soon_threadsafe`, rather than
        through `loop.run_in_executor`'s asyncio future chained to the pool's (a future
        made, its state copied across on the loop, and its done callback run on a further
        turn of the loop): on a loaded machine, where each such call finds the caches cold,
        that chain was ~40 µs of a pool job's ~100 µs hand-off (issue 29). The proxy's pool
        is a `FilterPool` (no future per job); any other executor (tests) gets a future,
        read only if the job never ran."""
        executor = self._executor
        assert executor is not None
        soon = self._running_loop().call_soon_threadsafe
        job_done = self._job_done

        def work() -> None:
            try:
                result = run()
            except BaseException as exc:  # the connection closes, naming the error
                _hand_back(soon, job_done, job_id, None, exc)
            else:
                _hand_back(soon, job_done, job_id, result, None)

        if isinstance(executor, FilterPool):
            try:
                executor.run(work, lambda: _hand_back(soon, job_done, job_id, None,
                                                      asyncio.CancelledError()))
            except RuntimeError as exc:  # the pool shut down: the proxy is stopping
                self._job_done(job_id, None, exc)
            return

        def never_ran(fut: Future[None]) -> None:
            # Only a job still queued when the pool shuts down (`cancel_futures`): `work`
            # hands back every job that ran.
            if fut.cancelled():
                _hand_back(soon, job_done, job_id, None, asyncio.CancelledError())

        try:
            future = executor.submit(work)
        except RuntimeError as exc:  # the pool shut down: the proxy is stopping
            self._job_done(job_id, None, exc)
            return
        future.add_done_callback(never_ran)

    def _in_pool(self, job_id: int, future: asyncio.Future[Any]) -> None:
        """Hands the outcome of a job running off the loop to the connection."""

        def done(fut: asyncio.Future[Any]) -> None:
            if fut.cancelled():
                self._job_done(job_id, None, asyncio.CancelledError())
                return
            error = fut.exception()
            self._job_done(job_id, None if error else fut.result(), error)

        future.add_done_callback(done)

    def _job_done(self, job_id: int, result: Any, error: BaseException | None) -> None:
        if self.conn is None:
            return
        if error is not None and not isinstance(error, asyncio.CancelledError):
            log.error("job_failed", conn=self.client.id, error=repr(error), exc_info=error)
        try:
            self._do(self.conn.job_done(job_id, result, error))
        except Exception as exc:
            # A fault of the proxy's own (not of the filter: that is `error`) left this
            # outcome half performed: its request, and every later one of the connection,
            # would wait for ever. Closed instead, so the client sees it and reconnects.
            log.exception("job_outcome_failed", conn=self.client.id)
            self._end(Close(f"internal error: {type(exc).__name__}"))

    def _end(self, close: Close) -> None:
        if self._ended:
            return
        self._ended = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._connecting is not None and not self._connecting.done():
            self._connecting.cancel()
        # transport.close() sends what is buffered first (a reply before a close).
        if self._client is not None:
            self._client.close()
        if self._broker is not None:
            self._broker.close()
        self._hooks.session_closed(self, close)

    @property
    def opened(self) -> bool:
        """The broker connection came up (telemetry has an `open` event for it)."""
        return self._opened


def _spare_buffer() -> memoryview:
    """The calling thread's spare read buffer (`_SPARE_SIZE`): shared by its sessions, as the
    frame buffers share theirs (codec/frames.py `_read_buffer`), because a loop fills one
    buffer and reports it (`buffer_updated`, which copies the bytes out) before it asks any
    protocol for another."""
    spare: memoryview | None = getattr(_spares, "buffer", None)
    if spare is None:
        spare = _spares.buffer = memoryview(bytearray(_SPARE_SIZE))
    return spare


def _hand_back(soon: Callable[..., Any], job_done: Callable[[int, Any, BaseException | None], None],
               job_id: int, result: Any, error: BaseException | None) -> None:
    """From a pool thread: `job_done(job_id, result, error)` on the loop (`soon` is its
    `call_soon_threadsafe`); nothing once the loop has closed (the proxy stopped)."""
    try:
        soon(job_done, job_id, result, error)
    except RuntimeError:  # the loop closed meanwhile
        pass


class _BrokerSide(asyncio.BufferedProtocol):
    """The broker's socket, read straight into the connection's frame buffer
    (`FrameBuffer.get_buffer`): a large response is read into the buffer it is forwarded
    from, with no copy in Python (uvloop, like asyncio, supports buffered protocols). The
    event loop calls the frame buffer and the session itself, one Python call less per read
    each (the loop looks both up once, when the transport is made)."""

    def __init__(self, session: Session) -> None:
        self._session = session
        conn = session.conn
        assert conn is not None
        self.get_buffer = conn.broker_frames.get_buffer  # type: ignore[method-assign]
        self.buffer_updated = session.broker_data  # type: ignore[method-assign, assignment]

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._session.broker_connected(cast(asyncio.Transport, transport))

    def eof_received(self) -> bool:
        self._session.broker_eof()
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self._session.broker_eof()

    def pause_writing(self) -> None:
        self._session.broker_writable(False)

    def resume_writing(self) -> None:
        self._session.broker_writable(True)
