"""Connection and batch limits: the `limits:` config section and the idle-connection reaper.

`max_frame_size` is enforced by the frame reader of each session; `max_connections` by the
listeners (a connection beyond it is closed as soon as it is accepted); `idle_timeout_seconds`
by `IdleReaper`, which looks at each session's byte counters on a timer instead of arming a
timeout on every read, so the data path pays nothing for it. `max_batch_bytes`,
`max_batch_records` and `max_batch_headers` bound what one record batch of a filtered
partition may expand into (`codec.batch_limits`; the filter pipeline checks them before
decompressing or parsing).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from sluice.codec.batch_limits import (
    DEFAULT_MAX_BATCH_BYTES,
    DEFAULT_MAX_BATCH_HEADERS,
    DEFAULT_MAX_BATCH_RECORDS,
    BatchLimits,
)
from sluice.codec.frames import DEFAULT_MAX_FRAME_SIZE
from sluice.filters.yaml_lines import LineMap

if TYPE_CHECKING:
    from sluice.proxy.net.session import Session

_KEYS = ("max_connections", "max_frame_size", "idle_timeout_seconds", "job_deadline_seconds",
         "max_batch_bytes", "max_batch_records", "max_batch_headers")


@dataclass(frozen=True)
class Limits:
    max_connections: int = 0  # 0 = unlimited
    max_frame_size: int = DEFAULT_MAX_FRAME_SIZE
    idle_timeout_seconds: float = 0  # 0 = never
    job_deadline_seconds: float = 20.0  # a filter or look-up job longer than this closes
    max_batch_bytes: int = DEFAULT_MAX_BATCH_BYTES  # what one batch may decompress to
    max_batch_records: int = DEFAULT_MAX_BATCH_RECORDS  # records one batch may declare
    max_batch_headers: int = DEFAULT_MAX_BATCH_HEADERS  # headers of all its records together

    @property
    def batch(self) -> BatchLimits:
        return BatchLimits(self.max_batch_bytes, self.max_batch_records, self.max_batch_headers)


def parse_limits(raw: Any, lines: LineMap, default_frame_size: int) -> Limits:
    """The `limits:` section; raises ConfigError naming the file, line and field."""
    if raw is None:
        return Limits(max_frame_size=default_frame_size)
    if not isinstance(raw, dict):
        raise lines.error(("limits",), "must be a mapping")
    for key in raw:
        if key not in _KEYS:
            raise lines.error(("limits", key), f"unknown key (expected one of {', '.join(_KEYS)})")

    def number(key: str, default: float, integer: bool, minimum: float) -> Any:
        value = raw.get(key, default)
        ok_type = isinstance(value, int) if integer else isinstance(value, int | float)
        if not ok_type or isinstance(value, bool) or value < minimum:
            kind = "an integer" if integer else "a number"
            raise lines.error(("limits", key), f"must be {kind} >= {minimum}, got {value!r}")
        return value

    return Limits(
        max_connections=number("max_connections", 0, True, 0),
        # Below 1 KiB not even an ApiVersions exchange fits.
        max_frame_size=number("max_frame_size", default_frame_size, True, 1024),
        idle_timeout_seconds=float(number("idle_timeout_seconds", 0, False, 0)),
        job_deadline_seconds=float(number("job_deadline_seconds", 20.0, False, 0.1)),
        # Below 1 KiB a single ordinary record may not fit.
        max_batch_bytes=number("max_batch_bytes", DEFAULT_MAX_BATCH_BYTES, True, 1024),
        max_batch_records=number("max_batch_records", DEFAULT_MAX_BATCH_RECORDS, True, 1),
        max_batch_headers=number("max_batch_headers", DEFAULT_MAX_BATCH_HEADERS, True, 0),
    )


class IdleReaper:
    """Closes sessions that moved no bytes either way for `timeout` seconds.

    A session with requests still awaiting a response is busy (a long-poll Fetch, a slow
    broker), never idle.
    """

    def __init__(
        self,
        timeout: float,
        sessions: Callable[[], Iterable[Session]],
        on_close: Callable[[Session], None] | None = None,
    ) -> None:
        self.timeout = timeout
        self._sessions = sessions
        self._on_close = on_close
        self._seen: dict[Session, tuple[int, int, float]] = {}
        self._task: asyncio.Task[None] | None = None

    @property
    def interval(self) -> float:
        return max(0.05, min(self.timeout / 4, 5.0))

    def start(self) -> None:
        if self.timeout > 0 and self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.interval)
            self.sweep(time.monotonic())

    def sweep(self, now: float) -> list[Session]:
        """One pass: returns the sessions closed for idleness."""
        closed: list[Session] = []
        seen: dict[Session, tuple[int, int, float]] = {}
        for session in list(self._sessions()):
            # Bytes a receive low-water mark holds in the kernel moved too (net/low_water.py).
            counters = (session.stats.bytes_in + session.bytes_waiting, session.stats.bytes_out)
            previous = self._seen.get(session)
            if previous is None or previous[:2] != counters or session.busy:
                seen[session] = (*counters, now)
                continue
            if now - previous[2] >= self.timeout:
                session.close("idle_timeout", idle_seconds=round(now - previous[2], 1))
                if self._on_close is not None:
                    self._on_close(session)
                closed.append(session)
            else:
                seen[session] = previous
        self._seen = seen
        return closed
