"""The sans-IO connection driven without sockets: order, correlation, acks=0, local answers,
deferred work, chain changes in flight, back-pressure and refusals."""

from __future__ import annotations

import struct
import types
from dataclasses import dataclass, field
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from sluice.codec.headers import request_header_bytes
from sluice.codec.messages import ApiKey, codec_version_range
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
    SendToClient,
    StartJob,
    Wake,
)
from sluice.proxy.paths.base import (
    Answer,
    Defer,
    Exchange,
    Forward,
    Frame,
    Job,
    PathContext,
    Refuse,
    Respond,
)
from sluice.proxy.paths.registry import Routes, VersionTable
from sluice.proxy.telemetry.metrics import Metrics
from tests.proxy.net.unfiltered_routes import unfiltered_routes

METADATA = int(ApiKey.METADATA)  # relayed untouched by the test paths
LIST_OFFSETS = int(ApiKey.LIST_OFFSETS)  # answered by the test path itself
FETCH = int(ApiKey.FETCH)  # its response is rewritten by the test path (under a chain gen)
DESCRIBE_GROUPS = int(ApiKey.DESCRIBE_GROUPS)  # deferred to a job by the test path


def frame(body: bytes) -> bytes:
    return struct.pack(">i", len(body)) + body


def request(api_key: int, correlation_id: int, version: int | None = None) -> bytes:
    if version is None:
        span = codec_version_range(api_key)
        version = span[1] if span is not None else 0
    return request_header_bytes(api_key, version, correlation_id, "t") + b"payload"


def response(correlation_id: int, text: bytes = b"broker") -> bytes:
    return struct.pack(">i", correlation_id) + text


@dataclass
class ScriptedPath:
    """A path with fixed behaviour per API key, recording what it saw."""

    name: str = "scripted"
    api_keys: frozenset[int] = frozenset({LIST_OFFSETS, FETCH, DESCRIBE_GROUPS})
    seen: list[int] = field(default_factory=list)

    def wants_request(self, ctx: PathContext, api_key: int) -> bool:
        return api_key in (LIST_OFFSETS, DESCRIBE_GROUPS)

    def wants_response(self, ctx: PathContext, api_key: int, version: int) -> bool:
        return api_key == FETCH

    def on_request(self, ctx: PathContext, exchange: Exchange, frame: Frame) -> Any:
        cid = exchange.header.correlation_id
        self.seen.append(cid)
        if exchange.header.api_key == LIST_OFFSETS:
            return Answer(response(cid, b"local"))
        return Defer(Job(run=lambda: cid, finish=lambda r: Forward(state=r), what="test"))

    def on_response(self, ctx: PathContext, exchange: Exchange, frame: Frame) -> Any:
        done = Respond(bytes(frame) + b"/gen%d" % ctx.generation)
        if bytes(frame).endswith(b"slow") and ctx.generation == 0:
            return Defer(Job(run=lambda: None, finish=lambda _: done, what="slow"))
        return done


def make(
    limits: Limits | None = None, clock: Any = None
) -> tuple[Connection, Routes, ScriptedPath]:
    path = ScriptedPath()
    metrics = Metrics()
    routes = unfiltered_routes([path], metrics)
    conn = Connection(
        ClientInfo("1.2.3.4:5", ("b", 9092)), routes, metrics, limits,
        **({"clock": clock} if clock is not None else {}),
    )
    return conn, routes, path


def sent(actions: list[Any], kind: type) -> bytes:
    return b"".join(bytes(b) for a in actions if isinstance(a, kind) for b in a.data)


def frames_of(data: bytes) -> list[bytes]:
    out, pos = [], 0
    while pos < len(data):
        (size,) = struct.unpack_from(">i", data, pos)
        out.append(data[pos + 4 : pos + 4 + size])
        pos += 4 + size
    return out


def test_relayed_request_and_response_pass_as_their_bytes() -> None:
    conn, _, _ = make()
    req = request(METADATA, 7)
    actions = conn.client_data(frame(req))
    assert sent(actions, SendToBroker) == frame(req)
    actions = conn.broker_data(frame(response(7)))
    assert sent(actions, SendToClient) == frame(response(7))


def test_local_answer_waits_for_earlier_broker_response() -> None:
    conn, _, _ = make()
    actions = conn.client_data(frame(request(METADATA, 1)) + frame(request(LIST_OFFSETS, 2)))
    assert sent(actions, SendToClient) == b"", "the local answer must not overtake request 1"
    actions = conn.broker_data(frame(response(1)))
    assert frames_of(sent(actions, SendToClient)) == [response(1), response(2, b"local")]


def test_deferred_request_holds_later_requests_back_in_order() -> None:
    conn, _, path = make()
    actions = conn.client_data(frame(request(DESCRIBE_GROUPS, 1)) + frame(request(METADATA, 2)))
    (job,) = [a for a in actions if isinstance(a, StartJob)]
    assert sent(actions, SendToBroker) == b"", "request 2 must wait behind the deferred one"
    actions = conn.job_done(job.job_id, job.job.run())
    assert frames_of(sent(actions, SendToBroker)) == [
        request(DESCRIBE_GROUPS, 1),
        request(METADATA, 2),
    ]
    assert path.seen == [1], "the path saw the deferred request once, and nothing else"


def held_until_paused(conn: Connection, responses: dict[int, bytes]) -> int | None:
    """Feeds the broker's `responses` (correlation id: frame body) while an earlier one is in
    a job: none may reach the client; the id whose arrival paused the broker, if any."""
    for cid, body in responses.items():
        out = conn.broker_data(frame(body))
        assert sent(out, SendToClient) == b""
        if any(isinstance(a, PauseBroker) for a in out):
            return cid
    return None


def test_responses_behind_a_job_count_and_pause_the_broker() -> None:
    """A response held in a job blocks the ones behind it: they count against the held-bytes
    bound from the moment they arrive, and past it the broker is not read either."""
    conn, _, _ = make(Limits(max_held_response_bytes=1000))
    conn.client_data(frame(request(FETCH, 1)) + b"".join(
        frame(request(METADATA, cid)) for cid in range(2, 12)))
    out = conn.broker_data(frame(response(1, b"slow")))
    (job,) = [a for a in out if isinstance(a, StartJob)]
    paused_at = held_until_paused(conn, {cid: response(cid, b"x" * 300) for cid in range(2, 12)})
    assert paused_at == 5, "paused once 4 x 300 bytes (and the slow one) were held"
    out = conn.job_done(job.job_id, job.job.run())
    assert len(frames_of(sent(out, SendToClient))) == 5
    assert any(isinstance(a, ResumeBroker) for a in out)


def test_local_answers_never_pause_the_broker_while_the_first_answer_is_due() -> None:
    """Pausing the broker then would deadlock: only its next answer lets the others go."""
    conn, _, _ = make(Limits(max_held_response_bytes=10))
    out = conn.client_data(frame(request(METADATA, 1)) + b"".join(
        frame(request(LIST_OFFSETS, cid)) for cid in range(2, 6)))
    assert not any(isinstance(a, PauseBroker) for a in out)
    out = conn.broker_data(frame(response(1)))
    assert len(frames_of(sent(out, SendToClient))) == 5


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_a_job_that_never_finishes_closes_the_connection_at_its_deadline() -> None:
    clock = FakeClock()
    conn, _, _ = make(Limits(job_deadline=5.0), clock)
    out = conn.client_data(frame(request(DESCRIBE_GROUPS, 1)) + frame(request(METADATA, 2)))
    (job,) = [a for a in out if isinstance(a, StartJob)]
    (wake,) = [a for a in out if isinstance(a, Wake)]
    assert wake.delay == 5.0
    clock.now += 4.9
    assert not [a for a in conn.tick() if isinstance(a, Close)]
    clock.now += 0.2
    (close,) = [a for a in conn.tick() if isinstance(a, Close)]
    assert "did not finish within 5 s" in close.reason
    assert conn.closed is not None
    # The late result changes nothing: nothing is sent after the close.
    late = conn.job_done(job.job_id, job.job.run())
    assert sent(late, SendToBroker) == b"" and sent(late, SendToClient) == b""


def test_a_job_within_its_deadline_changes_nothing() -> None:
    clock = FakeClock()
    conn, _, _ = make(Limits(job_deadline=5.0), clock)
    out = conn.client_data(frame(request(DESCRIBE_GROUPS, 1)))
    (job,) = [a for a in out if isinstance(a, StartJob)]
    clock.now += 4.0
    out = conn.job_done(job.job_id, job.job.run())
    assert frames_of(sent(out, SendToBroker)) == [request(DESCRIBE_GROUPS, 1)]
    clock.now += 10.0
    assert not [a for a in conn.tick() if isinstance(a, Close)]
    assert conn.closed is None


def test_responses_processed_under_an_old_chain_are_processed_again_before_sending() -> None:
    conn, routes, _ = make()
    conn.client_data(frame(request(FETCH, 1)) + frame(request(FETCH, 2)))
    # Response 1 goes to a job (gen 0); response 2 is ready (gen 0) but waits behind it.
    out = conn.broker_data(frame(response(1, b"slow")) + frame(response(2)))
    (job,) = [a for a in out if isinstance(a, StartJob)]
    assert sent(out, SendToClient) == b""
    routes.install()  # a chain change while both are in flight
    out = conn.job_done(job.job_id, job.job.run())
    assert frames_of(sent(out, SendToClient)) == [
        response(1, b"slow") + b"/gen1",
        response(2) + b"/gen1",
    ]


def test_acks0_answer_from_broker_is_dropped() -> None:
    conn, _, _ = make()

    class Acks0Path(ScriptedPath):
        def wants_request(self, ctx: PathContext, api_key: int) -> bool:
            return api_key == LIST_OFFSETS

        def on_request(self, ctx: PathContext, exchange: Exchange, frame: Frame) -> Any:
            return Forward(expect_response=False)

    routes = Routes([Acks0Path()], conn._routes._make_context, VersionTable())
    conn = Connection(ClientInfo("c", ("b", 1)), routes, Metrics())
    conn.client_data(frame(request(LIST_OFFSETS, 5)) + frame(request(METADATA, 6)))
    out = conn.broker_data(frame(response(5)) + frame(response(6)))
    assert frames_of(sent(out, SendToClient)) == [response(6)]
    assert conn.closed is None


def test_version_the_broker_lacks_is_refused() -> None:
    conn, _, _ = make()
    out = conn.client_data(frame(request(METADATA, 1, version=999)))
    (close,) = [a for a in out if isinstance(a, Close)]
    assert close.violation and "not supported by the broker" in close.reason
    assert sent(out, SendToBroker) == b""


CREATE_TOPICS = int(ApiKey.CREATE_TOPICS)
DESCRIBE_CONFIGS = int(ApiKey.DESCRIBE_CONFIGS)


def test_uninspected_old_version_passes_as_bytes_when_the_broker_serves_it() -> None:
    """Sarama 1.22 and kafka-go 0.2 send CreateTopics v0 and DescribeConfigs v0 without
    asking ApiVersions; Kafka 3.x serves them, the codec does not decode them."""
    conn, routes, _ = make()
    codec = codec_version_range(CREATE_TOPICS)
    assert codec is not None and codec[0] > 0  # the case under test: below the codec's range
    routes.versions.learn({CREATE_TOPICS: (0, 7), DESCRIBE_CONFIGS: (0, 4), METADATA: (0, 12)})
    requests = request(CREATE_TOPICS, 1, version=0) + request(DESCRIBE_CONFIGS, 2, version=0)
    out = conn.client_data(frame(request(CREATE_TOPICS, 1, version=0)) + frame(
        request(DESCRIBE_CONFIGS, 2, version=0)))
    assert not [a for a in out if isinstance(a, Close)]
    assert b"".join(frames_of(sent(out, SendToBroker))) == requests
    out = conn.broker_data(frame(response(1)) + frame(response(2)))
    assert frames_of(sent(out, SendToClient)) == [response(1), response(2)]


def test_uninspected_old_version_passes_before_any_api_versions_answer() -> None:
    conn, _, _ = make()
    out = conn.client_data(frame(request(CREATE_TOPICS, 1, version=0)))
    assert not [a for a in out if isinstance(a, Close)]
    assert frames_of(sent(out, SendToBroker)) == [request(CREATE_TOPICS, 1, version=0)]


def test_inspected_key_outside_the_codec_range_is_refused() -> None:
    """LIST_OFFSETS has a request path here: a version the codec cannot decode never passes,
    even though the broker serves it."""
    conn, routes, path = make()
    codec = codec_version_range(LIST_OFFSETS)
    assert codec is not None and codec[0] > 0
    routes.versions.learn({LIST_OFFSETS: (0, codec[1])})
    out = conn.client_data(frame(request(LIST_OFFSETS, 1, version=0)))
    (close,) = [a for a in out if isinstance(a, Close)]
    assert close.violation and "must be inspected" in close.reason
    assert sent(out, SendToBroker) == b"" and path.seen == []


def test_response_inspected_key_outside_the_codec_range_is_refused() -> None:
    """FETCH's responses are rewritten by the test path: an old version is refused at request
    time, since its response could not be inspected."""
    conn, routes, _ = make()
    codec = codec_version_range(FETCH)
    assert codec is not None and codec[0] > 0
    routes.versions.learn({FETCH: (0, codec[1])})
    out = conn.client_data(frame(request(FETCH, 1, version=codec[0] - 1)))
    (close,) = [a for a in out if isinstance(a, Close)]
    assert "must be inspected" in close.reason


def test_a_version_that_passed_is_refused_once_the_broker_no_longer_serves_it() -> None:
    """The gate remembers what passed (one look-up per request), but only under the broker
    ranges it was decided with: an ApiVersions answer that drops the version refuses it."""
    conn, routes, _ = make()
    routes.versions.learn({METADATA: (0, 12)})
    out = conn.client_data(frame(request(METADATA, 1, version=12)))
    assert frames_of(sent(out, SendToBroker)) == [request(METADATA, 1, version=12)]
    conn.broker_data(frame(response(1)))
    routes.versions.learn({METADATA: (0, 11)})
    out = conn.client_data(frame(request(METADATA, 2, version=12)))
    (close,) = [a for a in out if isinstance(a, Close)]
    assert close.violation and "not supported by the broker" in close.reason
    assert sent(out, SendToBroker) == b""


def test_the_gate_remembers_passes_not_refusals() -> None:
    """What passed is remembered per (key, version); a refusal is never remembered, and a
    negative version never lands on another version's entry."""
    _, routes, _ = make()
    routes.versions.learn({METADATA: (0, 12)})
    router = routes.current
    header = types.SimpleNamespace(api_key=METADATA, api_version=12, header_size=0)
    assert router.refusal(header, b"") is None
    assert router.passed == {METADATA << 16 | 12}
    for version in (-1, 13):
        refused = types.SimpleNamespace(api_key=METADATA, api_version=version, header_size=0)
        assert router.refusal(refused, b"") is not None
        assert router.refusal(refused, b"") is not None  # asked again, refused again
    assert router.passed == {METADATA << 16 | 12}


@given(api_key=st.integers(0, 200), version=st.integers(-5, 2000))
@settings(max_examples=300, deadline=None)
def test_every_accepted_version_is_bounded(api_key: int, version: int) -> None:
    """Whatever a client sends, what passes the gate is a key the codec knows (or the broker
    lists) in a version the broker lists or up to the codec's newest: tables stay bounded."""
    _, routes, _ = make()
    routes.versions.learn({METADATA: (0, 12)})
    header = types.SimpleNamespace(api_key=api_key, api_version=version, header_size=0)
    refusal = routes.current.refusal(header, b"")
    span = codec_version_range(api_key)
    if api_key == int(ApiKey.API_VERSIONS):
        assert (refusal is None) == (version >= 0)
    elif api_key == METADATA:
        assert (refusal is None) == (0 <= version <= 12)
    elif span is None:
        assert refusal is not None
    elif refusal is None:
        assert 0 <= version <= span[1]


def test_unknown_api_key_is_refused_and_not_counted() -> None:
    conn, _, _ = make()
    unknown = struct.pack(">hhih", 3000, 0, 1, 1) + b"t" + b"payload"
    out = conn.client_data(frame(unknown))
    assert any(isinstance(a, Close) and a.violation for a in out)
    assert conn._metrics.requests == {}


def test_mismatched_correlation_id_closes() -> None:
    conn, _, _ = make()
    conn.client_data(frame(request(METADATA, 1)))
    out = conn.broker_data(frame(response(2)))
    assert any(isinstance(a, Close) and a.violation for a in out)


def test_refuse_outcome_closes() -> None:
    conn, _, _ = make()

    class RefusingPath(ScriptedPath):
        def on_request(self, ctx: PathContext, exchange: Exchange, frame: Frame) -> Any:
            return Refuse("no")

    routes = Routes([RefusingPath()], conn._routes._make_context, VersionTable())
    conn = Connection(ClientInfo("c", ("b", 1)), routes, Metrics())
    out = conn.client_data(frame(request(LIST_OFFSETS, 1)))
    assert out[-1] == Close("no", violation=True)


def test_half_close_still_delivers_responses_in_flight() -> None:
    conn, _, _ = make()
    conn.client_data(frame(request(METADATA, 1)) + frame(request(METADATA, 2)))
    assert conn.client_eof() == []
    out = conn.broker_data(frame(response(1)) + frame(response(2)))
    assert frames_of(sent(out, SendToClient)) == [response(1), response(2)]
    assert out[-1] == Close("client closed")


def test_client_reading_pauses_at_inflight_limit_and_resumes() -> None:
    conn, _, _ = make(Limits(max_inflight=3))
    out = conn.client_data(b"".join(frame(request(METADATA, i)) for i in range(3)))
    assert any(isinstance(a, PauseClient) for a in out)
    out = conn.broker_data(frame(response(0)))
    assert any(isinstance(a, ResumeClient) for a in out)


def test_client_reading_pauses_when_local_answers_pile_up() -> None:
    conn, _, _ = make(Limits(max_held_response_bytes=100))
    data = frame(request(METADATA, 0)) + b"".join(
        frame(request(LIST_OFFSETS, i)) for i in range(1, 40)
    )
    out = conn.client_data(data)
    assert any(isinstance(a, PauseClient) for a in out)


def test_slow_client_socket_pauses_both_directions() -> None:
    conn, _, _ = make()
    out = conn.client_writable(False)
    assert any(isinstance(a, PauseClient) for a in out)
    assert any(isinstance(a, PauseBroker) for a in out)


# ------------------------------------------------------------------ property


@st.composite
def scenario(draw: Any) -> tuple[list[int], list[int], list[int]]:
    kinds = draw(
        st.lists(st.sampled_from([METADATA, LIST_OFFSETS, DESCRIBE_GROUPS, FETCH]), max_size=25)
    )
    cuts = draw(st.lists(st.integers(1, 60), max_size=30))
    broker_cuts = draw(st.lists(st.integers(1, 60), max_size=30))
    return kinds, cuts, broker_cuts


def chunks(data: bytes, cuts: list[int]) -> list[bytes]:
    out, pos = [], 0
    for c in cuts:
        if pos >= len(data):
            break
        out.append(data[pos : pos + c])
        pos += c
    if pos < len(data):
        out.append(data[pos:])
    return out


@settings(max_examples=150, deadline=None)
@given(scenario())
def test_any_chunking_and_mix_gives_responses_in_request_order(
    case: tuple[list[int], list[int], list[int]],
) -> None:
    kinds, cuts, broker_cuts = case
    conn, _, _ = make()
    stream = b"".join(frame(request(k, i)) for i, k in enumerate(kinds))
    to_client = b""
    to_broker = b""
    for piece in chunks(stream, cuts):
        pending = [conn.client_data(piece)]
        while pending:  # a finished job may start the next one (a queued deferred request)
            out = pending.pop()
            to_broker += sent(out, SendToBroker)
            to_client += sent(out, SendToClient)
            for job in [a for a in out if isinstance(a, StartJob)]:
                pending.append(conn.job_done(job.job_id, job.job.run()))
    # The broker answers, in order, every request forwarded to it.
    forwarded = frames_of(to_broker)
    answers = b"".join(frame(response(struct.unpack_from(">i", f, 4)[0])) for f in forwarded)
    for piece in chunks(answers, broker_cuts):
        to_client += sent(conn.broker_data(piece), SendToClient)
    expected = []
    for i, k in enumerate(kinds):
        if k == LIST_OFFSETS:
            expected.append(response(i, b"local"))
        elif k == FETCH:
            expected.append(response(i) + b"/gen0")
        else:
            expected.append(response(i))
    assert frames_of(to_client) == expected
    assert [struct.unpack_from(">i", f, 4)[0] for f in forwarded] == [
        i for i, k in enumerate(kinds) if k != LIST_OFFSETS
    ]
    assert conn.closed is None and not conn.busy


def test_a_frame_forwarded_as_pieces_goes_out_as_one_frame_unjoined() -> None:
    # A spliced Produce reaches the connection as its pieces (views of the client's frame
    # and the new batches): one size prefix for all of them, each piece handed to the
    # socket as it is (one writev), in order, and the frame after it unharmed.
    conn, _, _ = make()
    new_batch = bytearray(b"NEW-BATCH")
    seen: list[bytes] = []

    class PiecesPath(ScriptedPath):
        def wants_request(self, ctx: PathContext, api_key: int) -> bool:
            return api_key == LIST_OFFSETS

        def on_request(self, ctx: PathContext, exchange: Exchange, frame: Frame) -> Any:
            view = memoryview(frame)
            seen.append(bytes(frame))
            return Forward(frame=(view[:4], view[4:], new_batch))

    routes = Routes([PiecesPath()], conn._routes._make_context, VersionTable())
    conn = Connection(ClientInfo("c", ("b", 1)), routes, Metrics())
    req = request(LIST_OFFSETS, 5)
    out = conn.client_data(frame(req) + frame(request(METADATA, 6)))
    (send,) = [a for a in out if isinstance(a, SendToBroker)]
    assert any(piece is new_batch for piece in send.data)
    assert frames_of(sent(out, SendToBroker)) == [seen[0] + b"NEW-BATCH", request(METADATA, 6)]
    back = conn.broker_data(frame(response(5)) + frame(response(6)))
    assert frames_of(sent(back, SendToClient)) == [response(5), response(6)]
