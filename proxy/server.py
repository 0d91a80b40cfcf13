"""The proxy server: the bootstrap listener, one listener per broker node, and the hooks that
decide which requests and responses are decoded.

Everything not listed in ``request_handler``/``response_hook`` is forwarded as raw bytes.
"""

from __future__ import annotations

import asyncio
import functools
import os
import socket
import uuid
from collections.abc import Callable
from typing import Any

from sluice.codec.errors import CodecError
from sluice.codec.headers import RequestHeader, response_header_size
from sluice.codec.messages import ApiKey, decode_response, encode_response
from sluice.proxy.addresses import BrokerMap, NodeRoute
from sluice.proxy.apiversions import rewrite_api_versions_response
from sluice.proxy.config import ProxyConfig
from sluice.proxy.endpoints import carries_endpoints, rewrite_endpoints
from sluice.proxy.logs import log
from sluice.proxy.session import Pending, ProtocolViolation, ResponseHook, Session

RequestHandler = Callable[[Session, RequestHeader, memoryview | bytes], Any]


class ProxyServer:
    def __init__(self, config: ProxyConfig) -> None:
        self.config = config
        self.instance_id = uuid.uuid4().hex[:12]
        self.hostname = socket.gethostname()
        self.pid = os.getpid()
        self.broker_map = BrokerMap(
            config.advertised,
            config.listen[1],
            fixed_ports=config.node_ports,
            on_new_node=self._on_new_node,
        )
        self.topic_names: dict[Any, str] = {}
        self.sessions: set[Session] = set()
        self._servers: list[asyncio.Server] = []
        self._node_servers: dict[int, asyncio.Server] = {}
        self._unstarted: dict[int, tuple[NodeRoute, socket.socket]] = {}
        self._request_handlers: dict[int, RequestHandler] = {}
        self._hooks: dict[tuple[int, int], ResponseHook | None] = {}
        self._session_tasks: set[asyncio.Task[None]] = set()
        self.closing = False

    # ------------------------------------------------------------------ routing tables
    def set_request_handler(self, api_key: int, handler: RequestHandler | None) -> None:
        if handler is None:
            self._request_handlers.pop(api_key, None)
        else:
            self._request_handlers[api_key] = handler

    def request_handler(self, api_key: int) -> RequestHandler | None:
        return self._request_handlers.get(api_key)

    def response_hook(self, api_key: int, version: int) -> ResponseHook | None:
        key = (api_key, version)
        try:
            return self._hooks[key]
        except KeyError:
            hook = self._make_hook(api_key, version)
            self._hooks[key] = hook
            return hook

    def _make_hook(self, api_key: int, version: int) -> ResponseHook | None:
        if api_key == ApiKey.API_VERSIONS:
            return _api_versions_hook
        if carries_endpoints(api_key, version):
            return self._endpoint_hook
        return None

    # ------------------------------------------------------------------ response hooks
    def map_endpoint(self, node_id: int, host: str, port: int) -> tuple[str, int]:
        return self.broker_map.local_endpoint(node_id, host, port)

    def decode_response_of(self, pending: Pending, body: memoryview | bytes) -> tuple[int, Any]:
        """(header size, decoded body) of a response; a ProtocolViolation if it cannot decode."""
        hdr = pending.header
        size = response_header_size(body, hdr.api_key, hdr.api_version)
        try:
            return size, decode_response(hdr.api_key, hdr.api_version, body[size:])
        except CodecError as exc:
            # Forwarding it undecoded could leak a broker address or unfiltered records.
            raise ProtocolViolation(
                f"cannot decode {ApiKey(hdr.api_key).name} v{hdr.api_version} response: {exc}"
            ) from None

    def learn_topics(self, response: Any) -> None:
        for topic in getattr(response, "topics", ()) or ():
            topic_id = getattr(topic, "topic_id", None)
            name = getattr(topic, "name", None)
            if topic_id is not None and name and topic_id.int != 0:
                self.topic_names[topic_id] = name

    def _endpoint_hook(self, session: Session, pending: Pending, body: memoryview | bytes) -> Any:
        hdr = pending.header
        size, response = self.decode_response_of(pending, body)
        if hdr.api_key == ApiKey.METADATA:
            self.learn_topics(response)
        rewritten = rewrite_endpoints(response, hdr.api_key, hdr.api_version, self.map_endpoint)
        if rewritten is response:
            return body
        return bytes(body[:size]) + encode_response(rewritten)

    # ------------------------------------------------------------------ listeners
    def _bound_socket(self, port: int) -> socket.socket:
        host = self.config.listen[0]
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(512)
        sock.setblocking(False)
        return sock

    def _on_new_node(self, route: NodeRoute) -> None:
        if route.node_id not in self._node_servers and route.node_id not in self._unstarted:
            # Listen now, synchronously: the client may dial this port as soon as it reads the
            # response that taught us the node, and the kernel backlog holds it until we serve.
            self._unstarted[route.node_id] = (route, self._bound_socket(route.local_port))
        log.info(
            "broker_learned",
            node=route.node_id,
            upstream=f"{route.upstream_host}:{route.upstream_port}",
            local_port=route.local_port,
        )

    def has_unstarted_listeners(self) -> bool:
        return bool(self._unstarted)

    async def start_pending_listeners(self) -> None:
        while self._unstarted:
            node_id, (_route, sock) = self._unstarted.popitem()
            server = await self._listen(
                sock, functools.partial(self._node_upstream, node_id), node_id
            )
            self._node_servers[node_id] = server

    def _node_upstream(self, node_id: int) -> tuple[str, int]:
        route = self.broker_map.route(node_id)
        assert route is not None
        return route.upstream_host, route.upstream_port

    def _bootstrap_upstream(self) -> tuple[str, int]:
        return self.config.upstream[0]

    async def _listen(
        self, sock: socket.socket, upstream: Callable[[], tuple[str, int]], node_id: int | None
    ) -> asyncio.Server:

        async def on_client(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            if self.closing:
                writer.close()
                return
            sock = writer.get_extra_info("socket")
            if sock is not None:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            session = Session(self, reader, writer, upstream(), node_id)
            task = asyncio.current_task()
            if task is not None:
                self._session_tasks.add(task)
            try:
                await session.run()
            except asyncio.CancelledError:
                pass  # shutdown
            finally:
                if task is not None:
                    self._session_tasks.discard(task)

        server = await asyncio.start_server(on_client, sock=sock, limit=256 * 1024)
        self._servers.append(server)
        return server

    async def start(self) -> None:
        await self._listen(
            self._bound_socket(self.config.listen[1]), self._bootstrap_upstream, None
        )

    async def close(self) -> None:
        self.closing = True
        for server in self._servers:
            server.close()
        for task in list(self._session_tasks):
            task.cancel()
        await asyncio.gather(*self._session_tasks, return_exceptions=True)
        for server in self._servers:
            await server.wait_closed()

    # ------------------------------------------------------------------ observation
    def session_opened(self, session: Session) -> None:
        self.sessions.add(session)

    def session_closed(self, session: Session) -> None:
        self.sessions.discard(session)

    def observe_latency(self, api_key: int, seconds: float) -> None:
        del api_key, seconds  # metrics are wired by the observability layer


def _api_versions_hook(session: Session, pending: Pending, body: memoryview | bytes) -> bytes:
    # ApiVersions responses always use header v0: the 4-byte correlation id.
    try:
        return bytes(body[:4]) + rewrite_api_versions_response(pending.header.api_version, body[4:])
    except CodecError as exc:
        raise ProtocolViolation(f"cannot decode ApiVersions response: {exc}") from None
