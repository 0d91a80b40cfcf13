"""The sans-IO `Connection` performs no side effect: telemetry, dead letters and learning a
broker node come out as actions, in order, and a response naming a new node is released only
after the I/O layer has learnt (bound) it. A response processed again after a reload asks
for its dead letters once."""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import wasmtime

from sluice.codec import entities, schemas
from sluice.codec.headers import response_header_bytes
from sluice.codec.messages import ApiKey, decode_response, encode_response
from sluice.filters.chain import FilterChain
from sluice.filters.config import FilterSpec
from sluice.proxy.contract import ClientInfo
from sluice.proxy.net.connection import (
    Close,
    Connection,
    DeadLetters,
    LearnNodes,
    SendToClient,
    StartJob,
    Telemetry,
)
from sluice.proxy.net.node_ports import BrokerMap, NodeRoute
from sluice.proxy.paths.addresses import AddressPath
from sluice.proxy.paths.base import Exchange, Forward, Frame, PathContext, Respond
from sluice.proxy.paths.fetch import FetchPath
from sluice.proxy.paths.registry import Routes, VersionTable
from sluice.proxy.paths.topics import TopicRegistry
from sluice.proxy.telemetry.metrics import Metrics
from tests.filters.test_native_path import make_batch
from tests.harness import raw_kafka as rk
from tests.proxy.net.test_connection import frame, request
from tests.proxy.net.unfiltered_routes import unfiltered_routes
from tests.proxy.paths.test_paths import fetch_response

WAT_MODULES = Path(__file__).resolve().parents[2] / "filters" / "modules"

DESCRIBE_GROUPS = int(ApiKey.DESCRIBE_GROUPS)


def connection(paths: list[Any], bmap: BrokerMap) -> Connection:
    metrics = Metrics()
    return Connection(ClientInfo("1.2.3.4:5", ("b", 9092)),
                      unfiltered_routes(paths, metrics, bmap.known), metrics)


def metadata_response(correlation_id: int, brokers: dict[int, tuple[str, int]]) -> bytes:
    cls = schemas.response_schema(ApiKey.METADATA, 12)
    bcls = entities.element_class(cls, "brokers")
    body = entities.build(cls, brokers=tuple(
        entities.build(bcls, node_id=n, host=h, port=p) for n, (h, p) in brokers.items()),
        topics=(), cluster_id="c", controller_id=1)
    return response_header_bytes(correlation_id, ApiKey.METADATA, 12) + encode_response(body)


def advertised(actions: list[Any]) -> list[tuple[int, str, int]]:
    (send,) = [a for a in actions if isinstance(a, SendToClient)]
    body = b"".join(bytes(b) for b in send.data)[4:]
    size = len(response_header_bytes(0, ApiKey.METADATA, 12))
    decoded = decode_response(ApiKey.METADATA, 12, body[size:])
    return [(int(b.node_id), str(b.host), int(b.port)) for b in decoded.brokers]


def test_a_new_node_is_learnt_by_the_io_layer_before_its_address_is_sent() -> None:
    bound: list[NodeRoute] = []
    bmap = BrokerMap("proxy.local", 9000, on_new_node=bound.append)
    conn = connection([AddressPath()], bmap)
    conn.client_data(rk.metadata_frame(5, version=12))
    actions = conn.broker_data(frame(metadata_response(5, {2: ("b2", 9092), 1: ("b1", 9092)})))
    # The core chose no port and bound nothing: it asks, and holds the response.
    assert [type(a) for a in actions if isinstance(a, (LearnNodes, SendToClient))] == [LearnNodes]
    (learn,) = [a for a in actions if isinstance(a, LearnNodes)]
    assert learn.nodes == ((1, "b1", 9092), (2, "b2", 9092))  # node id order, all at once
    assert bound == [] and bmap.routes() == []
    for node in learn.nodes:  # what the session does for LearnNodes
        bmap.local_endpoint(*node)
    assert [r.node_id for r in bound] == [1, 2]
    released = conn.nodes_learned()
    assert advertised(released) == [(2, "proxy.local", 9002), (1, "proxy.local", 9001)]
    # Known now: the next answer naming them is rewritten at once, nothing to learn.
    conn.client_data(rk.metadata_frame(6, version=12))
    again = conn.broker_data(frame(metadata_response(6, {1: ("b1", 9092)})))
    assert not [a for a in again if isinstance(a, LearnNodes)]
    assert advertised(again) == [(1, "proxy.local", 9001)]


def test_a_node_whose_port_cannot_be_bound_closes_rather_than_leak_an_address() -> None:
    bmap = BrokerMap("proxy.local", 9000)
    conn = connection([AddressPath()], bmap)
    conn.client_data(rk.metadata_frame(5, version=12))
    (learn,) = [a for a in conn.broker_data(frame(metadata_response(5, {1: ("b1", 9092)})))
                if isinstance(a, LearnNodes)]
    bmap.local_endpoint(*learn.nodes[0])
    bmap.forget(1)  # what the server does when the port cannot be bound
    actions = conn.nodes_learned()
    assert not [a for a in actions if isinstance(a, SendToClient)]
    (close,) = [a for a in actions if isinstance(a, Close)]
    assert "broker node(s) [1]" in close.reason


@dataclass
class EffectfulPath:
    """Asks for telemetry and dead letters, and meets an unknown node once."""

    name: str = "effectful"
    api_keys: frozenset[int] = frozenset({DESCRIBE_GROUPS})
    calls: int = 0
    performed: list[str] = field(default_factory=list)

    def wants_request(self, ctx: PathContext, api_key: int) -> bool:
        return True

    def wants_response(self, ctx: PathContext, api_key: int, version: int) -> bool:
        return False

    def on_request(self, ctx: PathContext, exchange: Exchange, frame: Frame) -> Any:
        exchange.emit(lambda _recorder: self.performed.append("request telemetry"))
        return Forward(pin=self)

    def on_response(self, ctx: PathContext, exchange: Exchange, frame: Frame) -> Any:
        self.calls += 1
        exchange.dead_letters(["letter"])  # type: ignore[list-item]
        exchange.emit(lambda _recorder: self.performed.append("response telemetry"))
        ctx.node_address(9, "b9", 9092)  # raises the first time: node 9 is new
        return Respond(bytes(frame), lambda _recorder: self.performed.append("sent"))

    def on_unanswered(self, ctx: PathContext, exchange: Exchange, reason: str) -> None:
        exchange.emit(lambda _recorder: self.performed.append("lost"))


def test_effects_are_actions_in_order_and_a_retried_call_asks_once() -> None:
    path = EffectfulPath()
    bmap = BrokerMap("proxy.local", 9000)
    conn = connection([path], bmap)
    actions = conn.client_data(frame(request(DESCRIBE_GROUPS, 1)))
    assert [type(a).__name__ for a in actions] == ["Telemetry", "SendToBroker"]
    actions = conn.broker_data(frame(struct.pack(">i", 1) + b"answer"))
    # The effects of the call that met the unknown node are dropped: it is made again.
    assert [type(a).__name__ for a in actions] == ["LearnNodes"]
    bmap.local_endpoint(9, "b9", 9092)
    actions = conn.nodes_learned()
    assert path.calls == 2
    kinds = [type(a).__name__ for a in actions]
    assert kinds[:4] == ["DeadLetters", "Telemetry", "SendToClient", "Telemetry"], kinds
    assert path.performed == [], "the connection performed nothing itself"
    for action in (a for a in actions if isinstance(a, Telemetry)):
        action.call(None)  # type: ignore[arg-type]
    assert path.performed == ["response telemetry", "sent"]
    assert [a.letters for a in actions if isinstance(a, DeadLetters)] == [["letter"]]


def test_lost_requests_are_accounted_for_by_actions_before_the_close() -> None:
    path = EffectfulPath()
    conn = connection([path], BrokerMap("proxy.local", 9000))
    conn.client_data(frame(request(DESCRIBE_GROUPS, 1)))
    actions = conn.broker_eof()
    assert [type(a).__name__ for a in actions] == ["Telemetry", "Close"]
    assert path.performed == []



# ------------------------------------------------------------------ dead letters, counted once


def dead_letter_chain(tmp_path: Path, generation: int) -> FilterChain:
    """The chain of one install: sluice_upper traps on "TRAP", and the failure policy
    dead-letters the record (a reload builds a new chain from the same spec)."""
    wasm = tmp_path / "sluice_upper.wasm"
    if not wasm.exists():
        wasm.write_bytes(wasmtime.wat2wasm((WAT_MODULES / "sluice_upper.wat").read_text()))
    spec = FilterSpec(name="dl", module=str(wasm), topics=("orders",),
                      apply_to=frozenset({"fetch"}), on_error="dead-letter",
                      dead_letter_topic="orders.dlq")
    return FilterChain.from_specs([spec], cache_dir=tmp_path / f"cache{generation}")


def fetch_connection(tmp_path: Path) -> tuple[Connection, Routes, list[FilterChain]]:
    metrics = Metrics()
    topics = TopicRegistry()
    chains: list[FilterChain] = []

    def context(generation: int) -> PathContext:
        chains.append(dead_letter_chain(tmp_path, generation))
        return PathContext(
            chain=chains[-1], generation=generation, directions=frozenset({"fetch"}),
            topics=topics, metrics=metrics, node_address=lambda n, h, p: (h, p),
            open_upstream=None,  # type: ignore[arg-type]
        )

    routes = Routes([FetchPath()], context, VersionTable())
    conn = Connection(ClientInfo("1.2.3.4:5", ("b", 9092)), routes, metrics)
    return conn, routes, chains


def run_jobs(conn: Connection, actions: list[Any]) -> list[Any]:
    """Run every job handed out (in the test's thread) until none is left, as the session
    would; returns every action handed out on the way."""
    seen: list[Any] = list(actions)
    jobs = [a for a in actions if isinstance(a, StartJob)]
    while jobs:
        job = jobs.pop(0)
        more = conn.job_done(job.job_id, job.job.run())
        seen.extend(more)
        jobs.extend(a for a in more if isinstance(a, StartJob))
    return seen


def test_a_fetch_filtered_again_after_a_reload_dead_letters_its_records_once(
    tmp_path: Path,
) -> None:
    conn, routes, chains = fetch_connection(tmp_path)
    try:
        conn.client_data(rk.fetch_frame(3, "orders"))
        actions = conn.broker_data(frame(fetch_response("orders", make_batch([b"TRAP"]))))
        (job,) = [a for a in actions if isinstance(a, StartJob)]
        result = job.job.run()  # the filters ran under the first chain...
        routes.install()  # ...and a reload came before the response was sent
        seen = run_jobs(conn, conn.job_done(job.job_id, result))
        kinds = [type(a).__name__ for a in seen if not isinstance(a, StartJob)]
        # Processed again under the new chain, sent once, dead-lettered once, after its bytes.
        assert kinds.count("SendToClient") == 1, kinds
        letters = [a.letters for a in seen if isinstance(a, DeadLetters)]
        assert len(letters) == 1, f"the failed record was dead-lettered {len(letters)} times"
        ((letter,),) = letters
        assert (letter.topic, letter.value) == ("orders.dlq", b"TRAP")
        assert kinds.index("DeadLetters") > kinds.index("SendToClient"), kinds
    finally:
        for chain in chains:
            chain.close()

