"""Rate limiting of repeated warnings: the first occurrence of each kind is logged, then at most
one line per interval, carrying how many were suppressed since the last line.

A warning that fires per batch or per record (a filter failing, a partition blocked by a data
policy) repeats as fast as clients retry: one unreadable policy once wrote thousands of lines in
seconds. The limiter keys each warning by what makes it distinct (event, filter, topic, error
kind), never by record content, and keeps a bounded number of keys so that many topics cannot
grow it without limit. Pure code with an injectable clock (no asyncio): the filter runtime and
the proxy's telemetry share it.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Any, Protocol

#: Seconds between two lines of the same repeated warning.
REPEAT_INTERVAL_SECONDS = 10.0
#: Keys remembered at most; the least recently logged one is forgotten first (it is then logged
#: again at its next occurrence, which is harmless).
MAX_KEYS = 1024


class _WarningLogger(Protocol):
    def warning(self, event: str, **fields: Any) -> Any: ...


class RepeatLimiter:
    """Decides which occurrences of repeated warnings are logged (see the module docstring)."""

    def __init__(self, interval: float = REPEAT_INTERVAL_SECONDS, *, max_keys: int = MAX_KEYS,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if interval < 0 or max_keys < 1:
            raise ValueError("interval must be >= 0 and max_keys >= 1")
        self._interval = interval
        self._max_keys = max_keys
        self._clock = clock
        # key -> [time of the last line, occurrences suppressed since]
        self._seen: OrderedDict[Hashable, list[float]] = OrderedDict()
        self._lock = threading.Lock()

    def admit(self, key: Hashable) -> int | None:
        """None when this occurrence of `key` is to be suppressed; else the number of
        occurrences suppressed since the last one logged (0 for the first)."""
        now = self._clock()
        with self._lock:
            entry = self._seen.get(key)
            if entry is not None and now - entry[0] < self._interval:
                entry[1] += 1
                return None
            suppressed = int(entry[1]) if entry is not None else 0
            self._seen[key] = [now, 0]
            self._seen.move_to_end(key)
            while len(self._seen) > self._max_keys:
                self._seen.popitem(last=False)
            return suppressed

    def warning(self, logger: _WarningLogger, key: Hashable, event: str, /,
                **fields: Any) -> bool:
        """Log `event` on `logger` unless `key` was logged less than an interval ago; a logged
        line carries ``suppressed`` (repeats not logged since the previous line). Returns
        whether a line was written."""
        suppressed = self.admit(key)
        if suppressed is None:
            return False
        logger.warning(event, suppressed=suppressed, **fields)
        return True
