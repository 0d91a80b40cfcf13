"""The address-rewriting path: every broker endpoint a client can learn points at the proxy.

Handles the responses whose schema carries broker endpoints (Metadata, FindCoordinator,
DescribeCluster, the KIP-951 node endpoints of Produce v10+ and Fetch v16+, ...; found by
`sluice.codec.endpoints` from the schemas, not listed by hand). Metadata responses also teach
the topic registry its topic ids. Produce and Fetch responses whose only endpoints sit in a
top-level tagged field are scanned first and pass undecoded when they carry none. Metadata's
broker list and FindCoordinator's coordinators are written in bytes (kio decodes a Metadata
answer for what it teaches, a FindCoordinator answer not at all).
"""

from __future__ import annotations

import functools
from typing import Any

from sluice.codec.coordinators import rewrite_coordinators
from sluice.codec.endpoints import carries_endpoints, endpoint_paths, rewrite_endpoints
from sluice.codec.errors import DecodeError
from sluice.codec.headers import response_header_size
from sluice.codec.messages import ApiKey, codec_version_range
from sluice.codec.metadata_brokers import Broker, brokers_end, brokers_start, encode_brokers
from sluice.proxy.paths import responses
from sluice.proxy.paths.base import (
    Exchange,
    Frame,
    PathContext,
    RequestOutcome,
    Respond,
    ResponseOutcome,
    UnknownNodes,
)

_new = object.__new__  # an outcome made without its dataclass __init__ (`on_response`)


def _keys_with_endpoints() -> frozenset[int]:
    keys = set()
    for key in ApiKey:
        span = codec_version_range(int(key))
        if span is not None and any(
            carries_endpoints(int(key), v) for v in range(span[0], span[1] + 1)
        ):
            keys.add(int(key))
    return frozenset(keys)


class AddressPath:
    name = "addresses"

    def __init__(self) -> None:
        self.api_keys = _keys_with_endpoints()

    def wants_request(self, ctx: PathContext, api_key: int) -> bool:
        return False

    def wants_response(self, ctx: PathContext, api_key: int, version: int) -> bool:
        return carries_endpoints(api_key, version)

    def on_request(self, ctx: PathContext, exchange: Exchange, frame: Frame) -> RequestOutcome:
        raise AssertionError("the address path handles no request")

    def on_response(self, ctx: PathContext, exchange: Exchange, frame: Frame) -> ResponseOutcome:
        hdr = exchange.header
        if not responses.may_carry_endpoints(hdr.api_key, hdr.api_version, frame):
            # `Respond(frame)` without its __init__'s Python frame: every pass-through Produce
            # and Fetch response comes here (issue 29, call budgets).
            respond = _new(Respond)
            respond.frame = frame
            respond.on_sent = None
            return respond
        if hdr.api_key == ApiKey.FIND_COORDINATOR:
            spliced = _splice_coordinators(ctx, hdr.api_version, frame)
            if spliced is not None:
                return Respond(spliced)
        size, response = responses.decode(hdr, frame)
        if hdr.api_key == ApiKey.METADATA:
            learn_metadata(ctx, response)
            if _brokers_only(hdr.api_version):
                spliced = _splice_brokers(ctx, hdr.api_version, frame, size, response)
                if spliced is not None:
                    return Respond(spliced)
        rewritten = rewrite_endpoints(response, hdr.api_key, hdr.api_version, ctx.node_address)
        if rewritten is response:
            return Respond(frame)
        return Respond(responses.encode(frame, size, rewritten))


@functools.cache
def _brokers_only(version: int) -> bool:
    """Whether the broker list is the only place a Metadata response of `version` carries
    endpoints (what `_splice_brokers` rewrites); read from the schema as the kio path is."""
    return endpoint_paths(int(ApiKey.METADATA), version) == ((("brokers", True),),)


def _splice_brokers(ctx: PathContext, version: int, frame: Frame, size: int, response: Any
                    ) -> Frame | None:
    """The Metadata answer with its brokers' addresses mapped, as `rewrite_endpoints` and a
    kio encoding make it, but written in bytes: a new broker list between the answer's own
    bytes (its topics pass as the broker wrote them). The frame itself when no address
    changes; None when the list's entries carry tagged fields (the kio path takes those)."""
    mapped: list[Broker] = []
    changed = False
    # `or ()`: kio decodes a null list (not nullable, yet sent) as None; it passes unchanged.
    for b in response.brokers or ():
        node_id, host, port = int(b.node_id), b.host, b.port
        # As `codec.endpoints._rewrite_at`: an entry without a usable endpoint stays.
        if node_id >= 0 and host and port is not None and port >= 0:
            new_host, new_port = ctx.node_address(node_id, host, int(port))
            if (new_host, new_port) != (host, port):
                changed = True
                host, port = new_host, new_port
        mapped.append((node_id, host, int(port), getattr(b, "rack", None)))  # Rack: v1+
    if not changed:
        return frame
    body = frame[size:]
    end = brokers_end(version, body)
    if end is None:
        return None
    start = brokers_start(version)
    return b"".join((frame[:size], body[:start], encode_brokers(version, mapped), body[end:]))


def _splice_coordinators(ctx: PathContext, version: int, frame: Frame) -> Frame | None:
    """The FindCoordinator answer with its coordinators' addresses mapped in bytes
    (codec/coordinators.py), as `rewrite_endpoints` and a kio encoding make it; the frame
    itself when no address changes; None for anything but a plain answer (the kio path
    decides, and refuses what it cannot decode)."""
    try:
        size = response_header_size(frame, ApiKey.FIND_COORDINATOR, version)
    except DecodeError:
        return None
    body = frame[size:]
    out = rewrite_coordinators(version, body, ctx.node_address)
    if out is None:
        return None
    if out is body:
        return frame
    return b"".join((frame[:size], out))


def learn_metadata(ctx: PathContext, response: Any) -> None:
    """What a decoded Metadata response teaches: topic ids, and its brokers, every node not
    learnt yet raised at once (`UnknownNodes`, in node id order: a stable order of discovery)
    before any address is rewritten."""
    ctx.topics.learn(response)
    brokers = sorted(getattr(response, "brokers", ()) or (), key=lambda b: int(b.node_id))
    unknown = []
    for b in brokers:
        node = (int(b.node_id), str(b.host), int(b.port))
        try:
            ctx.node_address(*node)
        except UnknownNodes:
            unknown.append(node)
    if unknown:
        # All at once: the connection has them learnt, in this order, and asks again.
        raise UnknownNodes(unknown)
    if brokers:
        ctx.observe_brokers([int(b.node_id) for b in brokers])
