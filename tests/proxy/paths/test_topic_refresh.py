"""The topic-id refresh that Produce and Fetch run when a request names an unknown id: a
broker that cannot be reached leaves the names as they were instead of failing the path."""

from __future__ import annotations

import asyncio
import uuid

import pytest
import structlog

from sluice.proxy.contract import Upstream, UpstreamError
from sluice.proxy.paths.topics import TopicRegistry


@pytest.mark.parametrize("error", [OSError("connection refused"), UpstreamError("no broker"),
                                   TimeoutError()])
def test_a_failed_lookup_is_logged_not_raised(error: Exception) -> None:
    registry = TopicRegistry()
    known = uuid.uuid4()
    registry.names[known] = "orders"

    async def open_upstream() -> Upstream:
        raise error

    with structlog.testing.capture_logs() as logs:
        asyncio.run(registry.refresh(open_upstream))
    assert [e["event"] for e in logs] == ["topic_id_lookup_failed"]
    assert registry.lookups == 1 and registry.name(known) == "orders"
