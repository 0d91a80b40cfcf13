"""Who is on the other end of one client connection, and what it has moved so far.

A `ClientInfo` is created by the connection and handed to the API paths and to telemetry: the
paths learn the client id and the SASL principal into it; telemetry reads it. It is owned by
the event-loop thread; jobs running in the filter thread pool get copies of what they need.
"""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass, field
from typing import Any

_ids = itertools.count(1)


@dataclass(slots=True)
class ConnectionStats:
    bytes_in: int = 0
    bytes_out: int = 0
    requests: dict[int, int] = field(default_factory=dict)  # api key -> count (known keys only)
    throttle_ms: int = 0  # quota throttle time given to the client (telemetry: billing)


@dataclass(slots=True)
class ClientInfo:
    client_address: str
    upstream_address: tuple[str, int]
    node_id: int | None = None
    id: int = field(default_factory=lambda: next(_ids))
    client_id: str | None = None
    principal: str | None = None
    sasl: Any = None  # the SASL path's per-connection state, once SASL starts
    opened: float = field(default_factory=time.time)
    stats: ConnectionStats = field(default_factory=ConnectionStats)
