"""The types the proxy's rooms share, so that their imports go one way.

`net` (sockets, the sans-IO `Connection`) drives `paths` (what each API means) through the path
contract (`paths/base.py`) and the router (`paths/registry.py`); `paths` never imports `net`.
What both sides (and telemetry) must name lives here, with no dependency of its own:

- `ClientInfo`: who is on the other end of one client connection, and what it has moved so
  far. Created by the connection; the paths learn the client id and the SASL principal into
  it; telemetry reads it. Owned by the event-loop thread: jobs running in the filter thread
  pool get copies of what they need.
- `Upstream` and `UpstreamError`: the proxy's own connection to a broker, as the paths use it
  for look-ups (`net/upstream_client.py` implements it).
- `QuotaGate`: the byte-rate quotas as the connection asks them (`ops/quotas.py` implements
  it), so that the sans-IO core does not import the configuration room.
- `INLINE_MAX_BYTES`, `INLINE_SCALED_MAX_BYTES`: the largest job that may run inline on the
  loop, and the largest whose cost follows its size (`net/job_placement.py`), which the paths'
  `job_size` is measured against.
"""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from sluice.codec.headers import RequestHeader
    from sluice.codec.produce_splice import ProduceRequestLayout

_ids = itertools.count(1)

#: A job larger than this (its frame, with filtered records counted at their declared size)
#: always goes to the filter thread pool...
INLINE_MAX_BYTES = 16 * 1024
#: ...unless its cost follows its size (the proxy's own native code), up to this size.
INLINE_SCALED_MAX_BYTES = 1 << 20


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
    # Fetch requests forwarded under a fetch filter's cap so far (paths/fetch.py's ramp).
    capped_fetches: int = 0


class UpstreamError(Exception):
    """The proxy's own request to a broker failed (connection, version or broker error)."""


class Upstream(Protocol):
    """One of the proxy's own connections to a broker, as a look-up uses it."""

    def pick_version(self, api_key: int, ceiling: int | None = None) -> int:
        """The highest version of `api_key` both the codec and the broker serve."""
        ...

    async def request(
        self, api_key: int, version: int, timeout: float = 15, /, **fields: Any
    ) -> Any:
        """Send one request built from `fields` and return the decoded response."""
        ...

    async def close(self) -> None: ...


class ProduceRequest(Protocol):
    """A Produce request on its way (the paths' `Exchange`), as the quotas read it: parsed
    once, whoever asks first (the quotas, then the paths, reuse the same layout)."""

    header: RequestHeader

    def produce_layout(self, frame: bytes | memoryview) -> ProduceRequestLayout: ...


class QuotaGate(Protocol):
    """Byte-rate quotas as the connection asks them: each call counts the frame and returns
    the monotonic time until which the client must wait (0: no wait)."""

    active: bool

    def produce(self, principal: str | None, client_id: str | None,
                request: ProduceRequest, frame: bytes | memoryview) -> float: ...

    def fetch(self, principal: str | None, client_id: str | None,
              header: RequestHeader, frame: bytes | memoryview) -> float: ...
