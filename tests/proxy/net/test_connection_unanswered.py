"""Requests the broker never answered: the connection tells their pins, declared in the path
contract (`Pin.on_unanswered`), so that the Produce path can record its batches as lost."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from sluice.codec.messages import ApiKey
from sluice.proxy.contract import ClientInfo
from sluice.proxy.net.connection import Connection
from sluice.proxy.paths.base import (
    Exchange,
    Forward,
    Frame,
    PathContext,
    Pin,
    Respond,
)
from sluice.proxy.paths.internal_topics import InternalTopicsPath
from sluice.proxy.paths.produce import ProducePath
from sluice.proxy.telemetry.metrics import Metrics
from tests.proxy.net.test_connection import frame, request, response
from tests.proxy.net.unfiltered_routes import unfiltered_routes

DESCRIBE_GROUPS = int(ApiKey.DESCRIBE_GROUPS)


@dataclass
class PinningPath:
    """Forwards DescribeGroups pinned to itself and records what it is told was lost."""

    name: str = "pinning"
    api_keys: frozenset[int] = frozenset({DESCRIBE_GROUPS})
    lost: list[tuple[int, str]] = field(default_factory=list)

    def wants_request(self, ctx: PathContext, api_key: int) -> bool:
        return True

    def wants_response(self, ctx: PathContext, api_key: int, version: int) -> bool:
        return False

    def on_request(self, ctx: PathContext, exchange: Exchange, frame: Frame) -> Any:
        return Forward(pin=self)

    def on_response(self, ctx: PathContext, exchange: Exchange, frame: Frame) -> Any:
        return Respond(bytes(frame))

    def on_unanswered(self, ctx: PathContext, exchange: Exchange, reason: str) -> None:
        self.lost.append((exchange.header.correlation_id, reason))


def _connection(path: PinningPath) -> Connection:
    metrics = Metrics()
    routes = unfiltered_routes([path], metrics)
    return Connection(ClientInfo("1.2.3.4:5", ("b", 9092)), routes, metrics)


def test_pins_hear_of_the_requests_left_unanswered_in_order() -> None:
    path = PinningPath()
    conn = _connection(path)
    conn.client_data(b"".join(frame(request(DESCRIBE_GROUPS, cid)) for cid in (1, 2, 3)))
    conn.broker_data(frame(response(1)))
    conn.abort("shutdown")
    assert path.lost == [(2, "shutdown"), (3, "shutdown")]


def test_the_contract_declares_who_accounts_for_lost_requests() -> None:
    # Every pin declares `on_unanswered` (the `Pin` protocol; mypy checks each `pin=`).
    declared = {name for name in dir(Pin) if not name.startswith("_")}
    assert "on_unanswered" in declared
    produce, internal = ProducePath(), InternalTopicsPath.__new__(InternalTopicsPath)
    assert callable(produce.on_unanswered) and callable(internal.on_unanswered)
