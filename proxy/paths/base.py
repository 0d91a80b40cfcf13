"""The contract of an API path, and what a path may answer.

An API path is the part of the proxy that looks into one kind of request or response
(Produce, Fetch, admin requests, SASL, ApiVersions, broker addresses, ...). The router
(`registry.py`) asks each path, for the filter chain in force, which API keys it must see; every
other frame is relayed as its original bytes, undecoded.

The contract (docs/ARCHITECTURE.md has the long form):

- **Ordering.** `on_request` is called once per request, in the client's order, and never for
  a request while an earlier request of the same connection is still deferred. `on_response`
  is called once per response (again, from the broker's bytes, when the chain changed before
  it was sent or once the nodes it met were learnt: see side effects); responses reach the
  client in request order whatever order
  their processing finishes in.
- **Threading.** `on_request`, `on_response` and every `Job.finish` run on the event loop
  thread. They must not block: no socket I/O, no sleeping, no Wasm. Work that may take long
  (running filters) goes into a `Job` with `in_thread=True`, whose `run` executes in the filter
  thread pool and must touch no loop-owned state (no telemetry emission, no dead-letter
  submission, no `ClientInfo` writes): it returns a value that `finish` applies on the loop.
  A small job of a kind that proved fast may run inline on the loop instead (`Job.inline_key`);
  `run` must be correct either way.
  Network look-ups go into a `Job` with `in_thread=False` whose `run` is a coroutine factory.
- **Failing closed.** A path never forwards what it could not inspect: a request or response
  it cannot decode is `Refuse`d (the connection is closed with the reason), never relayed.
- **Chain changes.** A path reads the chain from its `PathContext`, which is fixed for the life
  of the router that called it. A response is processed again, from its original bytes, when
  the router changed before the response was sent, unless the path `pin`ned it (filtered
  Produce, changed admin requests, DescribeConfigs under data policies and SASL: what their
  answer needs was decided when the request was forwarded).
- **Side effects.** A path performs none: it is bytes in, outcome out. What the world must
  learn goes on the exchange (`Exchange.emit` for telemetry, `Exchange.dead_letters` for dead
  letters) and the connection hands it to the I/O layer as actions, in order, after the call
  that produced it; telemetry about what a response carries is the `on_sent` of `Respond`,
  performed after the response's bytes, so a response processed twice counts once; what
  processing a response that is not pinned asks for (a Fetch's dead letters) waits for its
  bytes too and is dropped with `on_sent` when it is processed again. Broker
  addresses are rewritten from `ctx.node_address`, a pure look-up of the nodes already
  learnt: a node it does not know raises `UnknownNodes`, the connection asks the I/O layer to
  learn the nodes (`LearnNodes`: the port is chosen, with `--workers` under the shared table's
  lock, and bound) and calls the path again, so the port is bound before the client can see
  its address. A call that raises `UnknownNodes` has its effects dropped: the call that
  follows makes them.
"""

from __future__ import annotations

import sys
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from sluice.codec.batch_counts import expanded_size
from sluice.codec.batch_limits import DEFAULT_BATCH_LIMITS, BatchLimits
from sluice.codec.headers import RequestHeader
from sluice.codec.passthrough import produce_head_at, read_produce_topics, scan_layout
from sluice.codec.peek import produce_acks
from sluice.codec.produce_splice import (
    ProduceRequestLayout,
    ProduceTopics,
    scan_produce_request,
)
from sluice.filters import blocking
from sluice.filters.parallel import Helpers
from sluice.proxy.contract import INLINE_SCALED_MAX_BYTES, ClientInfo, Upstream

if TYPE_CHECKING:
    from sluice.filters.chain import DeadLetter, FilterChain
    from sluice.proxy.ops.policies import Policy, PolicyError
    from sluice.proxy.paths.protection import Protection
    from sluice.proxy.paths.topics import TopicRegistry
    from sluice.proxy.telemetry.metrics import Metrics
    from sluice.proxy.telemetry.recorder import TelemetryRecorder

Frame = bytes | memoryview
#: A frame as consecutive pieces (views of the original frame and new bytes between them),
#: written with one `writev` and never joined (`Forward.frame`, `Respond.frame`).
Pieces = tuple[bytes | bytearray | memoryview, ...]

_tuple_new = tuple.__new__  # a NamedTuple built without its __new__ (a Python call)


class Refused(Exception):
    """Raised by a path for a frame it cannot relay safely; the connection is closed."""


@dataclass(slots=True)
class Exchange:
    """One request on its way through the proxy, and later its response."""

    header: RequestHeader
    client: ClientInfo
    state: Any = None  # whatever the path that handled the request keeps for its response
    # Quotas (proxy/ops/quotas.py): the monotonic time until which the client is held back for
    # this exchange (0.0: not throttled); the connection applies it when the response is sent.
    throttle_until: float = 0.0
    # The proxy's own topics this request named and the proxy answered itself, kept for the
    # response (paths/internal_topics.py); None for almost every request.
    guard: Any = None
    # What has been parsed of the request: (the frame, its parse), reused by every path (and
    # the quotas) that asks about the same frame through the methods below.
    parsed: tuple[Frame, Any] | None = None
    # Side effects a path asked for and the connection has not handed out yet, in order.
    effects: list[Telemetry | DeadLetters] | None = None

    # Each frame parsed once: the internal-topics path reads a Produce request's acks and
    # topic names, the Produce path needs its acks (unfiltered) or its layout (filtered), the
    # quotas its bytes per topic. The first parse is kept with the frame it was made from; a
    # path that hands another frame on (partitions taken out) gets that one parsed afresh.

    def produce_topics(self, frame: Frame) -> ProduceTopics:
        """The acks and topic keys of the Produce request `frame` (CodecError if malformed)."""
        kept = self.parsed
        if kept is not None and kept[0] is frame:
            value = kept[1]
            if type(value) is ProduceTopics:
                return value
            if type(value) is ProduceRequestLayout:
                # The scan refuses a topic with neither (a null name): no None here. Built
                # with tuple.__new__ (a NamedTuple's own __new__ is a Python call).
                keys = [t.topic_id if t.name is None else t.name for t in value.topics]
                return _tuple_new(ProduceTopics, (value.acks, keys))
        header = self.header
        # One topic (the common case): its name is read from the head, the rest is not walked
        # (natively where built: one C call; None hands anything else to the Python readers).
        read = produce_head_at(frame, header.header_size, header.api_version) or (
            read_produce_topics(frame, header.header_size, header.api_version))
        self.parsed = (frame, read)
        return read

    def produce_layout(self, frame: Frame) -> ProduceRequestLayout:
        """The layout of the Produce request `frame` (CodecError if malformed)."""
        kept = self.parsed
        if kept is not None and kept[0] is frame and type(kept[1]) is ProduceRequestLayout:
            return kept[1]
        version = self.header.api_version
        body = frame[self.header.header_size :]
        # Natively where built (one C call); None hands anything else to the Python scan, which
        # raises what it raises.
        layout = scan_layout(version, body) or scan_produce_request(version, body)
        self.parsed = (frame, layout)
        return layout

    def produce_acks(self, frame: Frame) -> int:
        """The acks of the Produce request `frame`: from what was parsed of it, or read alone."""
        kept = self.parsed
        if kept is not None and kept[0] is frame:
            return int(kept[1].acks)
        return produce_acks(frame[self.header.header_size :], self.header.flexible)

    def emit(self, call: TelemetryCall) -> None:
        """Ask the I/O layer to call `call(recorder)` (a telemetry event)."""
        if self.effects is None:
            self.effects = []
        self.effects.append(Telemetry(call))

    def dead_letters(self, letters: list[DeadLetter]) -> None:
        """Ask the I/O layer to submit `letters` to the dead-letter writer."""
        if self.effects is None:
            self.effects = []
        self.effects.append(DeadLetters(letters))


# ------------------------------------------------------------------ side effects, as data

#: A telemetry event to emit, given the recorder (performed by the I/O layer, never a path).
TelemetryCall = Callable[["TelemetryRecorder"], None]


@dataclass(slots=True)
class Telemetry:
    """Emit a telemetry event: `call(recorder)`."""

    call: TelemetryCall


@dataclass(slots=True)
class DeadLetters:
    """Submit records to the dead-letter writer."""

    letters: list[DeadLetter]


class UnknownNodes(Exception):
    """Raised by `PathContext.node_address` (and the paths) for broker nodes not learnt yet:
    (node id, upstream host, upstream port) each. The connection has them learnt and calls
    the path again."""

    def __init__(self, nodes: Sequence[tuple[int, str, int]]) -> None:
        super().__init__(f"broker node(s) not learnt yet: {[n[0] for n in nodes]}")
        self.nodes = tuple(nodes)


# ------------------------------------------------------------------ what a path may answer


@dataclass(slots=True)
class Forward:
    """Send the request to the broker: its original bytes, or `frame` instead (one buffer, or
    `Pieces` the connection writes one after the other behind one size prefix: a spliced
    Produce is never joined into one buffer, which would copy every byte of it)."""

    frame: Frame | Pieces | None = None
    expect_response: bool = True
    state: Any = None
    pin: Pin | None = None  # this path handles the response, whatever the router


@dataclass(slots=True)
class Answer:
    """Answer the request from the proxy (a whole response frame body, header included)."""

    response: bytes
    on_sent: TelemetryCall | None = None


@dataclass(slots=True)
class Respond:
    """The response frame body to send to the client: one buffer, or `Pieces` the
    connection writes one after the other behind one size prefix (a spliced Fetch response
    is never joined into one buffer, which would copy every byte of it)."""

    frame: Frame | Pieces
    on_sent: TelemetryCall | None = None


@dataclass(slots=True)
class NoReply:
    """Nothing goes to the broker and no response is due (an acks=0 Produce whose partitions
    the proxy answered itself: Kafka sends no response to acks=0)."""


@dataclass(slots=True)
class Refuse:
    """Close the connection: the frame cannot be relayed safely (a protocol violation)."""

    reason: str


@dataclass(slots=True)
class Job:
    """Work that must not run inline on the event loop.

    `in_thread=True`: `run()` runs in the filter thread pool. `in_thread=False`: `run()`
    returns an awaitable the loop awaits. `finish(result)` then runs on the loop and says what
    to do, possibly with another Job. An exception from `run` closes the connection.

    A thread job with an `inline_key` (the kind of work: direction and the filters that
    run) and a small `size` (bytes) may run inline on the loop instead, once jobs of that
    kind have proved fast (net/job_placement.py): for a one-record batch the hop to a thread
    costs more than the filter. Inline, `run` goes through `try_inline`: where it would wait
    (a host filter's KMS call, a filter lock another thread holds) it is given back and runs
    in the pool. A path
    leaves `inline_key` unset when `run` may wait otherwise. `scales`: the job's cost follows
    its `size` alone (only the proxy's own native code runs), so a larger one may run inline
    when its estimated cost is small.

    `overlap`: later requests' jobs may run while this one runs (every filter it calls keeps
    no state between calls, `LoadedFilter.concurrent`). The connection then gives the next
    Produce requests to their path at once instead of queueing them behind it, and still
    applies every outcome (forwarding, answers, effects) in client order (net/connection.py).
    """

    run: Callable[[], Any]
    finish: Callable[[Any], Any]
    in_thread: bool = True
    what: str = "job"
    inline_key: str | None = None
    size: int = 0
    scales: bool = False
    overlap: bool = False


class _InPool:
    def __repr__(self) -> str:
        return "IN_POOL"


#: What `try_inline` answers for a job that would have waited on the loop.
IN_POOL: Any = _InPool()


def try_inline(run: Callable[[], Any]) -> Any:
    """`run()` on a thread that may not wait (the event loop), or `IN_POOL` when it would
    have waited: the caller then runs it again in the filter thread pool, from its start
    (filters/blocking.py says why that is safe)."""
    before = blocking.forbid()
    try:
        return run()
    except blocking.WouldBlock:
        return IN_POOL
    finally:
        blocking.restore(before)


def inline_key(
    chain: FilterChain, direction: str, topics: Sequence[str | None], principal: str | None
) -> str | None:
    """The `Job.inline_key` of filtering `topics`: None (never inline) when a topic is not
    named yet or a host filter applies that may wait otherwise than through
    filters/blocking.py.

    The kind is the filters that run (each topic's sequence, once per distinct sequence), not
    the topics' names: names are the client's to choose (a pattern binding matches endless
    names; a topic no filter applies to costs the job nothing), and a key per name let a
    client mint fresh kinds, each inline after `learn` fast runs and allowed one slow run on
    the loop: a stall every ~9 jobs instead of once per the longest back-off."""
    runs: list[str] = []
    for topic in topics:
        if topic is None:
            return None
        bound = chain.filters_for(topic, direction, principal)
        for f in bound:
            if not f.never_waits:
                return None
        if bound:
            run = "\x01".join(f.name for f in bound)
            if run not in runs:
                runs.append(run)
    runs.sort()
    return "\x00".join([direction, *runs])


def cost_follows_size(
    chain: FilterChain, direction: str, topics: Sequence[str | None], principal: str | None
) -> bool:
    """The `Job.scales` of filtering `topics`: every filter that applies is the proxy's own
    code whose cost follows the records' size (no guest: a crafted record can slow one)."""
    found = False
    for topic in topics:
        if topic is None:
            return False
        for f in chain.filters_for(topic, direction, principal):
            if not f.cost_follows_size:
                return False
            found = True
    return found


def job_size(frame_size: int, records: Iterable[bytes | memoryview | None]) -> int:
    """The `Job.size` of filtering the `records` blobs of a frame of `frame_size` bytes: the
    frame with each blob counted at the size its batches declare they decompress to.

    A blob whose codec declares no binding size (gzip, zstd) makes the job unbounded: a few
    hundred bytes of zstd can hold 10 MiB of records, so only the decompressor can tell, and
    that is work the event loop must not do (such a batch goes to the pool). An LZ4 frame
    counts as what its block headers allow, which the decompressor holds it to. Frames
    already too large to run inline, even as a job whose cost follows its size, are not
    looked into."""
    if frame_size > INLINE_SCALED_MAX_BYTES:
        return frame_size
    size = frame_size
    for blob in records:
        if not blob:
            continue
        grown = expanded_size(blob)
        if grown is None:
            return sys.maxsize
        size += grown - len(blob)
    return size


@dataclass(slots=True)
class Defer:
    job: Job


def with_topic_ids(
    ctx: PathContext, topics: Iterable[Any], then: Callable[[], Any]
) -> Any:
    """`then()`, once the topic registry knows the ids of `topics` (items with `name` and
    `topic_id`) that carry no name: now, or after a look-up job (Produce v13+, Fetch v13+)."""
    if not ctx.topics.unknown(t.topic_id for t in topics if not t.name):
        return then()
    return Defer(
        Job(
            run=lambda: ctx.topics.refresh(ctx.open_upstream),
            finish=lambda _: then(),
            in_thread=False,
            what="topic id look-up",
        )
    )


RequestOutcome = Forward | Answer | NoReply | Refuse | Defer
ResponseOutcome = Respond | Refuse | Defer


# ------------------------------------------------------------------ what a path gets


#: (node id, upstream host, upstream port) -> the address clients get. Pure: a node not
#: learnt yet raises `UnknownNodes` (net/node_ports.py `BrokerMap.known`).
EndpointMapper = Callable[[int, str, int], tuple[str, int]]


class UpstreamOpener(Protocol):
    def __call__(self) -> Awaitable[Upstream]: ...


class PolicyBook(Protocol):
    """Data policies (the ``x-data-policy`` topic config; proxy/ops/policies.py), as the admin
    paths need them. Present in the context only while the proxy follows a fleet."""

    def allows(self, principal: str | None) -> bool:
        """Whether `principal` may set or delete policies (``policy_admins``)."""
        ...

    def value(self, topic: str) -> str | None:
        """The ``x-data-policy`` value set on `topic`, if any."""
        ...

    def check(self, topic: str, policy: Policy) -> PolicyError | None:
        """Why `policy` cannot run on `topic` (None: it can). Blocking: call it in a thread."""
        ...

    async def publish(self, topic: str, value: str | None, principal: str | None) -> None:
        """Store (None: delete) the policy of `topic` in the fleet topic."""
        ...


@dataclass(slots=True)
class PathContext:
    """Everything a path may use, and nothing else: never the server or a socket.

    One context per installed chain; `generation` counts installs, so that a response
    processed under an older chain can be recognised at send time.
    """

    chain: FilterChain | None
    generation: int
    directions: frozenset[str]
    topics: TopicRegistry
    metrics: Metrics
    node_address: EndpointMapper
    open_upstream: UpstreamOpener  # a connection to a bootstrap broker, for look-ups
    # Told the node ids of every Metadata response's brokers (the proxy logs changes).
    observe_brokers: Callable[[list[int]], None] = field(default=lambda _ids: None)
    policies: PolicyBook | None = None  # data policies, while the proxy follows a fleet
    # What one record batch of a filtered partition may expand into (limits.max_batch_*).
    batch_limits: BatchLimits = DEFAULT_BATCH_LIMITS
    # The proxy's own topics and who may still reach them (paths/internal_topics.py).
    protection: Protection | None = None
    # The filter thread pool, for a job to run independent pieces on several of its threads
    # (filters/parallel.py); None when there is at most one thread or proxy.spread_fetch is
    # false.
    helpers: Helpers | None = None
    # Whether a Produce request's filter job may overlap the jobs of the connection's later
    # Produce requests (`Job.overlap`): proxy.filter_threads of 2 or more and
    # proxy.spread_produce.
    overlap_produce: bool = False
    # While a fetch filter is in force, what a Fetch request may ask for at most (its
    # max_bytes; proxy.filtered_fetch_max_bytes, 0: as the client asks; paths/fetch.py).
    fetch_max_bytes: int = 0
    leases: int = field(default=0)  # jobs still running with this chain
    retired: bool = field(default=False)

    def filters_on(self, direction: str) -> bool:
        return direction in self.directions


# ------------------------------------------------------------------ the path interface


class RequestPath(Protocol):
    def on_request(self, ctx: PathContext, exchange: Exchange, frame: Frame) -> RequestOutcome: ...


class ResponsePath(Protocol):
    def on_response(
        self, ctx: PathContext, exchange: Exchange, frame: Frame
    ) -> ResponseOutcome: ...


class ApiPath(RequestPath, ResponsePath, Protocol):
    """One path: the API keys it looks at, and when it needs to look (decode predicates).

    `wants_request`/`wants_response` are asked when the router is built (once per chain) and,
    for responses, once per API version; a path that answers False is not called, and the
    frames it would have seen pass as their original bytes.
    """

    name: str
    api_keys: frozenset[int]

    def wants_request(self, ctx: PathContext, api_key: int) -> bool: ...

    def wants_response(self, ctx: PathContext, api_key: int, version: int) -> bool: ...


class Pin(ResponsePath, Protocol):
    """A path that handles the response of a request it forwarded (`Forward.pin`), whatever
    the router says later. It also accounts for a request the broker never answered: when the
    connection closes first, the connection calls `on_unanswered` for each such request, in
    order (the Produce path records its batches as lost, not as never sent; others do
    nothing). Its effects go out like those of any other call."""

    def on_unanswered(self, ctx: PathContext, exchange: Exchange, reason: str) -> None: ...


@runtime_checkable
class UndecodableGate(Protocol):
    """A request path that can vouch for a request version the codec cannot decode.

    The router refuses such versions of a key some path inspects; a path that inspects a key
    only to look for something it can find in the raw bytes (the internal-topics path: a
    protected topic's name) may let one through when it is provably not there.
    """

    def relays_undecodable(self, ctx: PathContext, header: Any, frame: Frame) -> bool: ...
