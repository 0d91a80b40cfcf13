"""Which topics are the proxy's own, and who may still reach them through the proxy.

One `Protection` per installed chain (the chain's dead-letter topics are among them); the
internal-topics path (paths/internal_topics.py) enforces it.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from sluice.proxy.paths.topics import TopicRegistry

#: A connection without SASL or a client certificate, as Kafka names it.
ANONYMOUS = "User:ANONYMOUS"


class Protection:
    """The internal topics of one installed chain, and who may still reach them."""

    __slots__ = ("_key", "_known", "_pattern", "_sorted", "names", "operators")

    def __init__(self, names: frozenset[str], operators: frozenset[str]) -> None:
        self.names = names
        self.operators = operators
        self._sorted = tuple(sorted(names))
        self._key: tuple[Any, ...] | None = None
        self._pattern: re.Pattern[bytes] | None = None
        self._known = False  # every id in `_key` is known (worked out when `_key` changes)

    def exempts(self, principal: str | None) -> bool:
        return (principal or ANONYMOUS) in self.operators

    def pattern(self, topics: TopicRegistry) -> tuple[re.Pattern[bytes] | None, bool]:
        """A pattern matching the names and known ids of the internal topics as they appear
        in a frame, and whether every internal topic's id is known."""
        # `id_of` per name through C (`map` over the dict's `get`): asked on every request
        # that names topics, where a generator and a method call per name cost Python calls.
        ids = tuple(map(topics.ids.get, self._sorted))
        if ids != self._key:
            parts = [re.escape(n.encode("utf-8")) for n in self.names]
            parts += [re.escape(i.bytes) for i in ids if i is not None]
            self._pattern = re.compile(b"|".join(parts)) if parts else None
            self._key = ids
            self._known = all(i is not None for i in ids)
        return self._pattern, self._known
