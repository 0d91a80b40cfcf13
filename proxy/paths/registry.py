"""The one registry of API paths: which path sees which request and which response.

`Router` is built from the list of paths and a `PathContext` each time a filter chain is
installed (`Routes.install`); the connection asks the current router at the moment it handles
a frame. A path is consulted only when its decode predicate says the chain in force needs it;
everything else is relayed as its original bytes.

The router also says which request versions a client may send (`accepts`): the versions the
proxy advertised, i.e. the codec's range intersected with the broker's (as learnt from
ApiVersions answers). Every per-(key, version) table is therefore bounded by the codec's
schemas, whatever a client sends.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from sluice.codec.messages import ApiKey, codec_version_range
from sluice.proxy.paths.base import ApiPath, PathContext, ResponsePath

_API_VERSIONS = int(ApiKey.API_VERSIONS)


class VersionTable:
    """The request versions a client may send: codec range ∩ broker range per API key.

    Shared by every connection of a process. For a key the broker has not listed (yet, or at
    all), the codec's range applies: the broker answers or refuses it itself.
    """

    def __init__(self) -> None:
        self._broker: dict[int, tuple[int, int]] = {}
        self._allowed: dict[int, tuple[int, int] | None] = {}

    def learn(self, ranges: dict[int, tuple[int, int]]) -> None:
        """The broker's ranges from an ApiVersions response (the full list of its keys)."""
        if ranges != self._broker:
            self._broker = dict(ranges)
            self._allowed.clear()

    def allowed(self, api_key: int) -> tuple[int, int] | None:
        try:
            return self._allowed[api_key]
        except KeyError:
            pass
        ours = codec_version_range(api_key)
        # A key the broker does not list is the broker's to refuse (Tansu answers
        # CreatePartitions and AlterConfigs without listing them); the codec's range bounds it.
        theirs = self._broker.get(api_key, ours)
        result = None
        if ours is not None and theirs is not None:
            low, high = max(ours[0], theirs[0]), min(ours[1], theirs[1])
            result = (low, high) if low <= high else None
        if len(self._allowed) < 1024:  # keys come from clients: bound the memo
            self._allowed[api_key] = result
        return result

    def accepts(self, api_key: int, version: int) -> bool:
        if api_key == _API_VERSIONS:
            # Any ApiVersions version: the broker answers an unknown one with v0 and
            # UNSUPPORTED_VERSION, which is how clients discover versions (KIP-511).
            return version >= 0
        allowed = self.allowed(api_key)
        return allowed is not None and allowed[0] <= version <= allowed[1]


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

    __slots__ = ("_requests", "_response_paths", "_responses", "ctx", "versions")

    def __init__(self, paths: Sequence[ApiPath], ctx: PathContext, versions: VersionTable):
        self.ctx = ctx
        self.versions = versions
        self._requests: dict[int, ApiPath] = {}
        self._response_paths: dict[int, list[ApiPath]] = {}
        for path in paths:  # earlier paths win
            for key in path.api_keys:
                if key not in self._requests and path.wants_request(ctx, key):
                    self._requests[key] = path
                self._response_paths.setdefault(key, []).append(path)
        # Filled lazily per (key, version); versions are bounded by `accepts`.
        self._responses: dict[int, ResponsePath | None] = {}

    @property
    def generation(self) -> int:
        return self.ctx.generation

    def request_path(self, api_key: int) -> ApiPath | None:
        return self._requests.get(api_key)

    def response_path(self, api_key: int, version: int) -> ResponsePath | None:
        key = api_key << 16 | (version & 0xFFFF)
        try:
            return self._responses[key]
        except KeyError:
            pass
        found = pick_response_path(self._response_paths.get(api_key, ()), self.ctx, api_key,
                                   version)
        self._responses[key] = found
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
