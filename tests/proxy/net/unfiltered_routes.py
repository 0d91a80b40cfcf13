"""Routes over test paths with no filter chain: what the connection and session tests build."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from sluice.proxy.paths.base import PathContext
from sluice.proxy.paths.registry import Routes, VersionTable
from sluice.proxy.paths.topics import TopicRegistry
from sluice.proxy.telemetry.metrics import Metrics


def unfiltered_routes(
    paths: Sequence[Any],
    metrics: Metrics,
    node_address: Callable[[int, str, int], Any] = lambda n, h, p: (h, p),
) -> Routes:
    """Routes whose every generation's context has no chain and no upstream look-ups."""
    topics = TopicRegistry()

    def context(generation: int) -> PathContext:
        return PathContext(
            chain=None, generation=generation, directions=frozenset(), topics=topics,
            metrics=metrics, node_address=node_address,
            open_upstream=None,  # type: ignore[arg-type]
        )

    return Routes(list(paths), context, VersionTable())
