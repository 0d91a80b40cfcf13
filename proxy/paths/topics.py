"""Topic ids to names, learnt from Metadata responses and looked up on a miss.

Produce v13+ and Fetch v13+ name topics by id only. A filter is bound to topic names, so the
proxy must know every id's name before it can tell whether a filter applies. Names are learnt
from every Metadata response a client receives through this process; an id not seen yet is
resolved by the proxy's own Metadata request to the cluster (one at a time per process, at
most once a second), so a `--workers N` proxy never answers UNKNOWN_TOPIC_ID for a topic the
cluster knows merely because another worker saw its Metadata.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

from sluice.codec.errors import CodecError
from sluice.codec.messages import ApiKey
from sluice.proxy.contract import Upstream, UpstreamError
from sluice.proxy.telemetry.logs import log

_MIN_LOOKUP_INTERVAL = 1.0  # seconds between two look-ups for ids still unknown
_MAX_NAMES = 1_000_000  # ids come from the broker, but bound the table anyway


class TopicRegistry:
    def __init__(self) -> None:
        self.names: dict[Any, str] = {}
        self.ids: dict[str, Any] = {}  # the newest id learnt for each name
        self._lookup: asyncio.Future[None] | None = None
        self._last_lookup = 0.0
        self.lookups = 0

    def learn(self, response: Any) -> None:
        """Remember id -> name from a decoded Metadata response."""
        names = self.names
        for topic in getattr(response, "topics", ()) or ():
            topic_id = getattr(topic, "topic_id", None)
            name = getattr(topic, "name", None)
            if topic_id is not None and name and topic_id.int != 0 and len(names) < _MAX_NAMES:
                names[topic_id] = name
                self.ids[name] = topic_id

    def name(self, topic_id: Any) -> str | None:
        return self.names.get(topic_id)

    def id_of(self, name: str) -> Any:
        """The id learnt for topic `name` (None: not seen yet)."""
        return self.ids.get(name)

    def unknown(self, topic_ids: Iterable[Any]) -> list[Any]:
        return [t for t in topic_ids if t is not None and t not in self.names]

    def resolve(self, open_upstream: Callable[[], Awaitable[Upstream]]) -> Any:
        """An awaitable that refreshes the table from the cluster's Metadata (all topics).

        Concurrent callers share one look-up; a look-up right after another is skipped, so a
        client sending made-up ids cannot make the proxy flood the broker.
        """
        if self._lookup is not None and not self._lookup.done():
            return asyncio.shield(self._lookup)
        if time.monotonic() - self._last_lookup < _MIN_LOOKUP_INTERVAL:
            return asyncio.sleep(0)
        self._last_lookup = time.monotonic()
        self._lookup = asyncio.ensure_future(self._fetch(open_upstream))
        return asyncio.shield(self._lookup)

    async def refresh(self, open_upstream: Callable[[], Awaitable[Upstream]]) -> None:
        """`resolve`, with a failed look-up logged instead of raised: the Produce and Fetch
        paths then go on with the names they know."""
        try:
            await self.resolve(open_upstream)
        except (OSError, UpstreamError, TimeoutError, CodecError) as exc:
            log.warning("topic_id_lookup_failed", error=str(exc))

    async def _fetch(self, open_upstream: Callable[[], Awaitable[Upstream]]) -> None:
        self.lookups += 1
        conn = await open_upstream()
        try:
            version = conn.pick_version(ApiKey.METADATA, ceiling=12)
            response = await conn.request(
                ApiKey.METADATA,
                version,
                topics=None,
                allow_auto_topic_creation=False,
                include_topic_authorized_operations=False,
            )
        finally:
            await conn.close()
        self.learn(response)


def is_null_id(topic_id: Any) -> bool:
    """Kafka's null topic id (all zeros), which requests send when they name topics by name."""
    return topic_id is None or (isinstance(topic_id, uuid.UUID) and topic_id.int == 0)
