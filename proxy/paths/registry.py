"""The one registry of API paths: which path sees which request and which response.

`Router` is built from the list of paths and a `PathContext` each time a filter chain is
installed (`Routes.install`); the connection asks the current router at the moment it handles
a frame. A path is consulted only when its decode predicate says the chain in force needs it;
everything else is relayed as its original bytes.

The router also says which request versions a client may send (`refusal`), one rule for
every API key:

- ApiVersions passes in any version (KIP-511: the broker answers an unknown one in v0).
- The version must be one the broker supports: within the range it lists in ApiVersions, or,
  for a key it does not list or before any ApiVersions answer was seen, within 0 and the
  codec's newest version of a key the codec knows.
- A key some path inspects under the chain in force (a request path, or a response path that
  wants some version of it) passes only in the versions the codec decodes: a frame that must
  be inspected is never relayed uninspected. One exception, for versions older than the
  codec's: a request path that can vouch from the raw bytes that it has nothing to inspect
  (`UndecodableGate`: the internal-topics path, when no protected topic's name occurs in the
  frame and no other path inspects the key) lets it pass. Keys no path inspects pass as their
  bytes in any version the broker supports (older clients that skip ApiVersions send v0 admin
  requests).

What the proxy advertises (`apiversions.py`) is the codec's range intersected with the
broker's, so clients that read ApiVersions always pick a version that passes. Every
per-(key, version) table and metric label is bounded by the broker's list and the codec's
keys, whatever a client sends.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from sluice.codec.messages import ApiKey, codec_version_range
from sluice.proxy.paths.base import ApiPath, Frame, PathContext, ResponsePath, UndecodableGate

_API_VERSIONS = int(ApiKey.API_VERSIONS)


def advertised_range(api_key: int, broker: tuple[int, int]) -> tuple[int, int] | None:
    """The versions the proxy advertises for a key the broker lists: codec ∩ broker."""
    ours = codec_version_range(api_key)
    if ours is None:
        return None
    low, high = max(ours[0], broker[0]), min(ours[1], broker[1])
    return (low, high) if low <= high else None


class VersionTable:
    """The broker's version ranges, as learnt from ApiVersions answers; one per process."""

    def __init__(self) -> None:
        self._broker: dict[int, tuple[int, int]] = {}
        #: The broker's ranges as learnt; a new dict whenever they change (never mutated).
        #: An attribute: `Router.refusal` reads it on every request.
        self.ranges = self._broker

    def learn(self, ranges: dict[int, tuple[int, int]]) -> None:
        """The broker's ranges from an ApiVersions response (the full list of its keys)."""
        if ranges != self._broker:
            self._broker = self.ranges = dict(ranges)

    def broker_supports(self, api_key: int, version: int) -> bool:
        """Whether the broker serves this version, as far as the proxy knows.

        A key the broker lists: its range. A key it does not list, or before any ApiVersions
        answer: a key the codec knows, from v0 to the codec's newest (the broker refuses what
        it lacks). Unknown keys never pass, which bounds every per-key table.
        """
        theirs = self._broker.get(api_key)
        if theirs is not None:
            return theirs[0] <= version <= theirs[1]
        ours = codec_version_range(api_key)
        return ours is not None and 0 <= version <= ours[1]


def pick_request_path(paths: Sequence[ApiPath], ctx: PathContext, api_key: int) -> ApiPath | None:
    """The first of `paths` that handles `api_key` and wants its requests under `ctx`."""
    for path in paths:
        if api_key in path.api_keys and path.wants_request(ctx, api_key):
            return path
    return None


def pick_response_path(
    paths: Sequence[ApiPath], ctx: PathContext, api_key: int, version: int
) -> ResponsePath | None:
    """The first of `paths` that handles `api_key` and wants its responses of `version`."""
    for path in paths:
        if api_key in path.api_keys and path.wants_response(ctx, api_key, version):
            return path
    return None


class Router:
    """Which path handles a request or a response, for one installed chain."""

    __slots__ = (
        "_inspected",
        "_response_paths",
        "ctx",
        "passed",
        "passed_under",
        "requests",
        "responses",
        "versions",
    )

    def __init__(self, paths: Sequence[ApiPath], ctx: PathContext, versions: VersionTable):
        self.ctx = ctx
        self.versions = versions
        #: The path of each request's API key (read, never changed, by the connection: one
        #: call less per request than `request_path`).
        self.requests: dict[int, ApiPath] = {}
        self._response_paths: dict[int, list[ApiPath]] = {}
        for path in paths:  # earlier paths win
            for key in path.api_keys:
                if key not in self.requests and path.wants_request(ctx, key):
                    self.requests[key] = path
                self._response_paths.setdefault(key, []).append(path)
        #: `response_path`'s memo, filled lazily per (key << 16 | version); versions are
        #: bounded by `refusal`. The connection reads it before it calls `response_path`.
        self.responses: dict[int, ResponsePath | None] = {}
        #: (key << 16 | version) that `refusal` passed on the header alone, under the ranges
        #: `passed_under` (the connection reads both before it calls `refusal`: one call less
        #: per request).
        self.passed: set[int] = set()
        self.passed_under: dict[int, tuple[int, int]] | None = None
        self._inspected = frozenset(self.requests) | frozenset(
            key for key, found in self._response_paths.items() if self._any_response(key, found)
        )

    def _any_response(self, api_key: int, found: list[ApiPath]) -> bool:
        span = codec_version_range(api_key)
        if span is None:
            return False
        return any(
            path.wants_response(self.ctx, api_key, version)
            for path in found
            for version in range(span[0], span[1] + 1)
        )

    def refusal(self, header: Any, frame: Frame) -> str | None:
        """None if a request with this header may be handled, else why not."""
        api_key, version = header.api_key, header.api_version
        # A (key, version) that passed on its header alone passes again while the broker's
        # ranges are the same (one set look-up per request instead of the checks below).
        # `learn` replaces the ranges' dict when they change, which empties this memo.
        ranges = self.versions.ranges
        if ranges is self.passed_under:
            if api_key << 16 | version in self.passed:
                return None
        else:
            self.passed = set()
            self.passed_under = ranges
        if api_key == _API_VERSIONS:
            return None if version >= 0 else "ApiVersions with a negative version"
        if not self.versions.broker_supports(api_key, version):
            return f"request api key {api_key} v{version} is not supported by the broker"
        if api_key in self._inspected:
            ours = codec_version_range(api_key)
            if ours is None or not ours[0] <= version <= ours[1]:
                gate = self.requests.get(api_key)
                if (
                    ours is not None
                    and version < ours[0]
                    and isinstance(gate, UndecodableGate)
                    and gate.relays_undecodable(self.ctx, header, frame)
                ):
                    return None
                return (
                    f"request api key {api_key} v{version} must be inspected by the proxy, "
                    "which cannot decode that version"
                )
        if 0 <= version <= 0xFFFF:  # i16 on the wire: never negative here, but keys stay apart
            self.passed.add(api_key << 16 | version)
        return None

    @property
    def generation(self) -> int:
        return self.ctx.generation

    def request_path(self, api_key: int) -> ApiPath | None:
        return self.requests.get(api_key)

    def response_path(self, api_key: int, version: int) -> ResponsePath | None:
        key = api_key << 16 | (version & 0xFFFF)
        try:
            return self.responses[key]
        except KeyError:
            pass
        found: ResponsePath | None = None
        ours = codec_version_range(api_key)
        if ours is None or not ours[0] <= version <= ours[1]:
            # Only keys no path inspects get here in such versions (`refusal`): relayed.
            self.responses[key] = None
            return None
        found = pick_response_path(self._response_paths.get(api_key, ()), self.ctx, api_key,
                                   version)
        self.responses[key] = found
        return found


class Routes:
    """The router in force, replaced as a whole when a chain is installed."""

    def __init__(
        self,
        paths: Sequence[ApiPath],
        make_context: Callable[[int], PathContext],
        versions: VersionTable | None = None,
    ) -> None:
        self._paths = tuple(paths)
        self._make_context = make_context
        self.versions = versions or VersionTable()
        self.generation = 0
        self.current = Router(self._paths, make_context(0), self.versions)

    def install(self) -> Router:
        """Rebuild the router from a fresh context (the chain now in force); returns the old.

        The old context's chain is closed once no job runs with it any more (see `release`).
        """
        old = self.current
        self.generation += 1
        self.current = Router(self._paths, self._make_context(self.generation), self.versions)
        old.ctx.retired = True
        if old.ctx.chain is self.current.ctx.chain:
            old.ctx.chain = None  # still in force: not ours to close
        release(old.ctx, 0)
        return old


def lease(ctx: PathContext) -> None:
    """A job starts with this context's chain: keep the chain open until `release`."""
    ctx.leases += 1


def release(ctx: PathContext, count: int = 1) -> None:
    ctx.leases -= count
    if ctx.retired and ctx.leases <= 0 and ctx.chain is not None:
        chain, ctx.chain = ctx.chain, None
        chain.close()
