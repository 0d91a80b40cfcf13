"""Inline filter jobs run within the read that brought their requests (issue 29, round 39),
but a read does not run an unbounded chain of them before the loop gets a turn: a client
pipelining hundreds of tiny filtered requests in one write would otherwise have every one
of their jobs (each starting the next as its request completes) run back to back on the
loop, while every other connection waits."""

from __future__ import annotations

import asyncio
import itertools
import struct
from typing import Any

import pytest

from sluice.codec.messages import ApiKey
from sluice.proxy.net.connection import Connection
from sluice.proxy.net.filter_pool import FilterPool
from sluice.proxy.net.job_placement import JobPlacement
from sluice.proxy.net.session import INLINE_JOBS_PER_TURN, Session, SideEffects
from sluice.proxy.paths.base import (
    Defer,
    Exchange,
    Forward,
    Frame,
    Job,
    PathContext,
    Refused,
    Respond,
)
from sluice.proxy.telemetry.events import proxy_info
from sluice.proxy.telemetry.metrics import Metrics
from sluice.proxy.telemetry.recorder import TelemetryRecorder
from tests.proxy.net.test_connection import frame, request
from tests.proxy.net.test_session_jobs import Hooks, _broker
from tests.proxy.net.unfiltered_routes import unfiltered_routes

DESCRIBE_GROUPS = int(ApiKey.DESCRIBE_GROUPS)


class TickPath:
    """Defers each DescribeGroups to an inline-eligible job that notes the loop's turn."""

    name = "ticks"
    api_keys = frozenset({DESCRIBE_GROUPS})

    def __init__(self, turn: list[int]) -> None:
        self.turn = turn
        self.seen: list[int] = []

    def wants_request(self, ctx: PathContext, api_key: int) -> bool:
        return True

    def wants_response(self, ctx: PathContext, api_key: int, version: int) -> bool:
        return False

    def on_request(self, ctx: PathContext, exchange: Exchange, frame: Frame) -> Any:
        def run() -> int:
            self.seen.append(self.turn[0])
            return 0

        return Defer(Job(run=run, finish=lambda _: Forward(), inline_key="k", size=10))

    def on_response(self, ctx: PathContext, exchange: Exchange, frame: Frame) -> Any:
        raise AssertionError("responses are relayed")


async def _served(path: Any, broker_port: int) -> tuple[
        Session, JobPlacement, FilterPool, asyncio.AbstractServer, asyncio.StreamReader,
        asyncio.StreamWriter]:
    """A session routing through `path` to the broker at `broker_port`, one filter thread,
    a client connected to it, and three requests answered: the path's job kind has learnt
    to run inline."""
    loop = asyncio.get_running_loop()
    metrics = Metrics()
    routes = unfiltered_routes([path], metrics)
    pool = FilterPool(1)
    placement = JobPlacement(learn=3)
    effects = SideEffects(TelemetryRecorder(proxy_info("t"), metrics),
                          None,  # type: ignore[arg-type]  # no dead letters here
                          lambda *node: None)
    session = Session(
        lambda client: Connection(client, routes, metrics), ("127.0.0.1", broker_port), {}, 7,
        Hooks(), pool, effects, None, placement,
    )
    listener = await loop.create_server(lambda: session, "127.0.0.1", 0)
    port = listener.sockets[0].getsockname()[1]
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    for i in range(3):  # the kind learns in the pool, then runs inline
        writer.write(frame(request(DESCRIBE_GROUPS, i, 0)))
        size = struct.unpack(">i", await reader.readexactly(4))[0]
        await reader.readexactly(size)
    return session, placement, pool, listener, reader, writer


async def _burst(pipelined: int) -> tuple[TickPath, JobPlacement, list[int]]:
    turn = [0]
    stop = False

    async def ticker() -> None:  # another connection's work: one step per turn of the loop
        while not stop:
            turn[0] += 1
            await asyncio.sleep(0)

    broker = await asyncio.start_server(_broker, "127.0.0.1", 0)
    broker_port = broker.sockets[0].getsockname()[1]
    path = TickPath(turn)
    _session, placement, pool, listener, reader, writer = await _served(path, broker_port)
    ticking = asyncio.ensure_future(ticker())
    writer.write(b"".join(frame(request(DESCRIBE_GROUPS, 3 + i, 0)) for i in range(pipelined)))
    ids = []
    for _ in range(pipelined):
        size = struct.unpack(">i", await reader.readexactly(4))[0]
        ids.append(struct.unpack(">i", (await reader.readexactly(size))[:4])[0])
    stop = True
    await ticking
    writer.close()
    listener.close()
    broker.close()
    pool.shutdown()
    return path, placement, ids


@pytest.mark.serial
def test_a_pipelined_burst_of_inline_jobs_lets_the_loop_turn() -> None:
    pipelined = 600
    path, placement, ids = asyncio.run(_burst(pipelined))
    assert ids == list(range(3, 3 + pipelined)), "responses in request order"
    assert placement.inline_runs >= pipelined - 10, "the burst ran inline"
    burst = path.seen[3:]
    longest = run = 1
    for before, after in itertools.pairwise(burst):
        run = run + 1 if after == before else 1
        longest = max(longest, run)
    # Before: 256 (the in-flight limit's worth of the read, each job's outcome starting the
    # next) in one turn. Now a callback runs at most INLINE_JOBS_PER_TURN; in one turn, the
    # continuation and then a read of the broker's responses may each run that many.
    assert longest <= 2 * INLINE_JOBS_PER_TURN, f"{longest} inline jobs ran in one turn"


class RefusingResponses:
    """Relays DescribeGroups requests; each response goes to an inline-eligible job (counted),
    and the response to correlation id 100 is refused once its job is done."""

    name = "refusing"
    api_keys = frozenset({DESCRIBE_GROUPS})

    def __init__(self) -> None:
        self.ran: list[int] = []

    def wants_request(self, ctx: PathContext, api_key: int) -> bool:
        return False

    def wants_response(self, ctx: PathContext, api_key: int, version: int) -> bool:
        return True

    def on_request(self, ctx: PathContext, exchange: Exchange, frame: Frame) -> Any:
        raise AssertionError("requests are relayed")

    def on_response(self, ctx: PathContext, exchange: Exchange, frame: Frame) -> Any:
        cid = exchange.header.correlation_id
        raw = bytes(frame)

        def run() -> int:
            self.ran.append(cid)
            return cid

        def finish(_: Any) -> Any:
            if cid == 100:
                raise Refused("refused by the test's path")
            return Respond(raw)

        return Defer(Job(run=run, finish=finish, inline_key="r", size=10))


async def _paired_broker(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    # Answers one request at a time, except correlation ids 100 and 101: both at once, so
    # their responses arrive in one read and start two jobs in one call of `_do`.
    held = b""
    while True:
        try:
            size = struct.unpack(">i", await reader.readexactly(4))[0]
            body = await reader.readexactly(size)
        except asyncio.IncompleteReadError:
            break
        answer = frame(body[4:8] + b"answer")
        if struct.unpack(">i", body[4:8])[0] == 100:
            held = answer
            continue
        writer.write(held + answer)
        held = b""
        await writer.drain()
    writer.close()


async def _refused_pair() -> tuple[RefusingResponses, Session, bytes]:
    broker = await asyncio.start_server(_paired_broker, "127.0.0.1", 0)
    broker_port = broker.sockets[0].getsockname()[1]
    path = RefusingResponses()
    session, placement, pool, listener, reader, writer = await _served(path, broker_port)
    assert placement.inline("r", 10), "the response jobs' kind runs inline now"
    writer.write(frame(request(DESCRIBE_GROUPS, 100, 0)) + frame(request(DESCRIBE_GROUPS, 101, 0)))
    rest = await asyncio.wait_for(reader.read(), 5)  # the proxy closes the connection
    writer.close()
    listener.close()
    broker.close()
    pool.shutdown()
    return path, session, rest


def test_a_job_behind_one_that_closed_the_connection_is_not_run_and_ends() -> None:
    path, session, rest = asyncio.run(_refused_pair())
    assert rest == b"", "nothing answered once the response to 100 was refused"
    assert path.ran[:3] == [0, 1, 2]
    # Before: the filter ran for 101 too, on a connection already closed.
    assert path.ran[3:] == [100], f"jobs run after the close: {path.ran[3:]}"
    assert session.conn is not None and not session.conn._jobs, "every job ended (leases)"
