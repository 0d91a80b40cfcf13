"""The proxy server: the bootstrap listener, one listener per broker node, and the hooks that
decide which requests and responses are decoded.

Everything not listed in ``request_handler``/``response_hook`` is forwarded as raw bytes.
"""

from __future__ import annotations

import asyncio
import functools
import os
import socket
import time
import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import structlog

from sluice.codec.endpoints import carries_endpoints, endpoints_only_in_tags, rewrite_endpoints
from sluice.codec.errors import CodecError
from sluice.codec.guard import fields_end
from sluice.codec.headers import RequestHeader, response_header_size
from sluice.codec.messages import ApiKey, decode_response, encode_response
from sluice.codec.schemas import response_schema
from sluice.proxy import telemetry
from sluice.proxy.net.addresses import BrokerMap, NodeRoute
from sluice.proxy.net.session import Pending, ProtocolViolation, ResponseHook, Session
from sluice.proxy.net.tls import peer_principal
from sluice.proxy.ops.config import ProxyConfig
from sluice.proxy.ops.limits import IdleReaper
from sluice.proxy.paths.apiversions import rewrite_api_versions_response
from sluice.proxy.telemetry.dead_letters import DeadLetterWriter
from sluice.proxy.telemetry.logs import log
from sluice.proxy.telemetry.metrics import Metrics

if TYPE_CHECKING:
    from sluice.filters.chain import FilterChain, FilterStats
    from sluice.proxy.paths.produce import ProduceState

RequestHandler = Callable[[Session, RequestHeader, memoryview | bytes], Any]
#: APIs whose responses carry records outside the Fetch path (hidden when fetch filters run).
_UNFILTERED_RECORD_APIS = frozenset({ApiKey.SHARE_FETCH, ApiKey.SHARE_ACKNOWLEDGE})


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
        self.chain: FilterChain | None = None
        self._filter_directions: frozenset[str] = frozenset()
        self.proxy_info = telemetry.proxy_info(self.instance_id)
        self.telemetry: telemetry.TelemetrySink = telemetry.NullSink()
        self.dead_letters = DeadLetterWriter.from_config(config)
        self.metrics = Metrics(
            active_connections=lambda: len(self.sessions),
            sink_stats=lambda: self.telemetry.stats(),
            worker=str(config.worker_index),
        )
        self.server_ssl = config.tls.context() if config.tls is not None else None
        self.upstream_ssl = (
            config.upstream_tls.context() if config.upstream_tls is not None else None
        )
        self.clients = 0  # accepted client connections being served (limits.max_connections)
        self._rejected_logged = 0.0
        self.idle_reaper = IdleReaper(config.idle_timeout, lambda: self.sessions, self._idle_closed)
        from sluice.proxy.paths import sasl
        from sluice.proxy.paths.produce import handle_produce

        sasl.install(self)

        # Always: even unfiltered Produce needs its acks read (acks=0 gets no response).
        self.set_request_handler(ApiKey.PRODUCE, handle_produce)

    # ------------------------------------------------------------------ filters
    def install_chain(self, chain: FilterChain | None) -> FilterChain | None:
        """Switch to a new filter chain; batches after the switch use it. Returns the old one."""
        from sluice.proxy.paths.admin import ADMIN_APIS, handle_admin

        old, self.chain = self.chain, chain
        directions: set[str] = set()
        for f in chain.filters if chain is not None else ():
            directions |= set(f.spec.apply_to)
        self._filter_directions = frozenset(directions)
        for api_key in ADMIN_APIS:
            self.set_request_handler(api_key, handle_admin if "admin" in directions else None)
        # ShareFetch (KIP-932 share groups) carries records the fetch path does not filter:
        # with fetch filters it is neither advertised nor relayed (fail closed).
        self.set_request_handler(
            ApiKey.SHARE_FETCH, _refuse_unfiltered_records if "fetch" in directions else None
        )
        self._hooks.clear()
        for f in chain.filters if chain is not None else ():
            self.telemetry.emit(
                telemetry.filter_loaded_event(
                    self.proxy_info,
                    name=f.name,
                    module_sha256=f.sha256,
                    topics=list(f.spec.topics),
                    apply_to=sorted(f.spec.apply_to),
                )
            )
        return old

    def filters_on(self, direction: str) -> bool:
        return direction in self._filter_directions

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
        if api_key == ApiKey.FETCH and self.filters_on("fetch"):
            from sluice.proxy.paths.fetch import on_fetch_response

            return on_fetch_response
        if carries_endpoints(api_key, version):
            if endpoints_only_in_tags(api_key, version):
                return self._tagged_endpoint_hook
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

    def _tagged_endpoint_hook(
        self, session: Session, pending: Pending, body: memoryview | bytes
    ) -> Any:
        """Produce v10+ / Fetch v16+ without fetch filters: their only endpoints are the
        KIP-951 node_endpoints, a top-level tagged field. Most responses carry no top-level
        tagged field at all; a scan of the regular fields proves it without decoding (the
        full decode of every Produce response was the largest Python cost of pass-through)."""
        hdr = pending.header
        size = response_header_size(body, hdr.api_key, hdr.api_version)
        try:
            end = fields_end(response_schema(hdr.api_key, hdr.api_version), body[size:])
        except CodecError:
            end = -1  # the full decode below reports it
        if end == len(body) - size - 1 and body[-1] == 0:
            return body
        return self._endpoint_hook(session, pending, body)

    def _endpoint_hook(self, session: Session, pending: Pending, body: memoryview | bytes) -> Any:
        hdr = pending.header
        size, response = self.decode_response_of(pending, body)
        if hdr.api_key == ApiKey.METADATA:
            self.learn_topics(response)
            # Learn brokers in node id order, not response order, so that every worker of a
            # `--workers N` proxy gives each node the same local port.
            for b in sorted(getattr(response, "brokers", ()) or (), key=lambda b: int(b.node_id)):
                self.map_endpoint(int(b.node_id), str(b.host), int(b.port))
        rewritten = rewrite_endpoints(response, hdr.api_key, hdr.api_version, self.map_endpoint)
        if rewritten is response:
            return body
        return bytes(body[:size]) + encode_response(rewritten)

    def transform_response(
        self, pending: Pending, frame: memoryview | bytes, transform: Callable[[Any], Any]
    ) -> Any:
        """Decode a response, rewrite its endpoints, apply `transform`, re-encode if changed."""
        hdr = pending.header
        size, response = self.decode_response_of(pending, frame)
        final = transform(
            rewrite_endpoints(response, hdr.api_key, hdr.api_version, self.map_endpoint)
        )
        if final is response:
            return frame
        return bytes(frame[:size]) + encode_response(final)

    # ------------------------------------------------------------------ telemetry
    def connection_id(self, session: Session) -> str:
        return f"{self.instance_id}-{session.id}"

    def emit_record_telemetry(self, session: Session, **fields: Any) -> None:
        self.metrics.filter_stats(fields.get("stats") or [])
        try:
            self._emit_record_telemetry(session, **fields)
        except Exception as exc:  # telemetry must never break client traffic
            log.error("telemetry_event_failed", error=repr(exc))

    def _emit_record_telemetry(
        self,
        session: Session,
        *,
        api: str,
        topic: str,
        partition: int,
        offset_first: int | None,
        offset_last: int | None,
        records_in: int,
        records_out: int,
        bytes_in: int,
        bytes_out: int,
        stats: list[FilterStats],
        error_code: int = 0,
        error_message: str | None = None,
        record_errors: list[tuple[int, str]] | None = None,
        dead_letters: int = 0,
    ) -> None:
        self.telemetry.emit(
            telemetry.record_batch_event(
                self.proxy_info,
                connection_id=self.connection_id(session),
                client_address=session.client_address,
                client_id=session.client_id,
                principal=session.principal,
                api=api,  # type: ignore[arg-type]
                topic=topic,
                partition=partition,
                offset_first=offset_first,
                offset_last=offset_last,
                records_in=records_in,
                records_out=records_out,
                bytes_in=bytes_in,
                bytes_out=bytes_out,
                filters=[_filter_entry(st) for st in stats],
                error_code=error_code,
                error_message=error_message,
                reject_reasons=telemetry.reject_reason_counts(record_errors or []),
                dead_letters=dead_letters,
            )
        )

    def emit_produce_telemetry(self, session: Session, state: ProduceState, response: Any) -> None:
        base: dict[tuple[str, int], tuple[int, int]] = {}
        if response is not None:
            for t in response.responses:
                name = getattr(t, "name", None) or self.topic_names.get(
                    getattr(t, "topic_id", None)
                )
                for p in t.partition_responses:
                    base[(name or "", int(p.index))] = (int(p.base_offset), int(p.error_code))
        for info in state.filtered:
            offset, code = base.get((info.topic, info.index), (-1, info.error_code))
            first, last = telemetry.produce_offsets(
                offset if info.forwarded else None, info.records_out
            )
            self.emit_record_telemetry(
                session,
                api="produce",
                topic=info.topic,
                partition=info.index,
                offset_first=first,
                offset_last=last,
                records_in=info.records_in,
                records_out=info.records_out if info.forwarded else 0,
                bytes_in=info.bytes_in,
                bytes_out=info.bytes_out,
                stats=info.stats,
                error_code=info.error_code or code,
                error_message=info.error_message,
                record_errors=info.record_errors,
                dead_letters=info.dead_letters,
            )

    # ------------------------------------------------------------------ listeners
    def _bound_socket(self, port: int) -> socket.socket:
        host = self.config.listen[0]
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if self.config.workers > 1:
            # All workers bind the same ports; the kernel spreads new connections over them.
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind((host, port))
        sock.listen(512)
        sock.setblocking(False)
        return sock

    def _on_new_node(self, route: NodeRoute) -> None:
        if route.node_id not in self._node_servers and route.node_id not in self._unstarted:
            # Listen now, synchronously: the client may dial this port as soon as it reads the
            # response that taught us the node, and the kernel backlog holds it until we serve.
            try:
                sock = self._bound_socket(route.local_port)
            except OSError as exc:
                # Say which port and why, and let the next Metadata response try again rather
                # than leave the node unreachable for good.
                log.error(
                    "node_port_unavailable",
                    node=route.node_id,
                    local_port=route.local_port,
                    error=exc.strerror,
                    hint="free the port or set proxy.node_ports; retried on the next response",
                )
                self.broker_map.forget(route.node_id)
                return
            self._unstarted[route.node_id] = (route, sock)
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
            if not self._admit(writer):
                return
            sock = writer.get_extra_info("socket")
            if sock is not None:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            session = Session(self, reader, writer, upstream(), node_id)
            if self.server_ssl is not None:
                # A verified client certificate names the principal (SASL, if any, overrides).
                session.principal = peer_principal(writer.get_extra_info("peercert"))
            # This task's own context: whatever logs on this connection's behalf (filters,
            # dead letters, admin look-ups) carries which connection it was.
            structlog.contextvars.bind_contextvars(
                conn=session.id, client=session.client_address, node=node_id
            )
            task = asyncio.current_task()
            if task is not None:
                self._session_tasks.add(task)
            try:
                await session.run()
            except asyncio.CancelledError:
                pass  # shutdown
            finally:
                self.clients -= 1
                if task is not None:
                    self._session_tasks.discard(task)

        server = await asyncio.start_server(
            on_client, sock=sock, limit=256 * 1024, ssl=self.server_ssl
        )
        self._servers.append(server)
        return server

    async def start(self) -> None:
        await self._listen(
            self._bound_socket(self.config.listen[1]), self._bootstrap_upstream, None
        )
        self.idle_reaper.start()
        self.metrics.ready = True

    async def close(self) -> None:
        self.closing = True
        self.metrics.ready = False
        await self.idle_reaper.stop()
        for server in self._servers:
            server.close()
        for task in list(self._session_tasks):
            task.cancel()
        await asyncio.gather(*self._session_tasks, return_exceptions=True)
        for server in self._servers:
            await server.wait_closed()
        await self.dead_letters.close()
        if self.chain is not None:
            self.chain.close()

    # ------------------------------------------------------------------ observation
    def session_opened(self, session: Session) -> None:
        self.sessions.add(session)
        self.telemetry.emit(
            telemetry.connection_event(
                self.proxy_info,
                phase="open",
                connection_id=self.connection_id(session),
                client_address=session.client_address,
                upstream="{}:{}".format(*session.upstream_address),
            )
        )

    def session_closed(self, session: Session) -> None:
        if session not in self.sessions:
            return
        self.sessions.discard(session)
        apis = {}
        for key, count in session.stats.requests.items():
            try:
                name = ApiKey(key).name.lower()
            except ValueError:
                name = f"api_{key}"
            apis[name] = {"requests": count}
        self.telemetry.emit(
            telemetry.connection_event(
                self.proxy_info,
                phase="close",
                connection_id=self.connection_id(session),
                client_address=session.client_address,
                client_id=session.client_id,
                principal=session.principal,
                upstream="{}:{}".format(*session.upstream_address),
                bytes_in=session.stats.bytes_in,
                bytes_out=session.stats.bytes_out,
                apis=apis,
                duration_ms=int((time.time() - session.opened) * 1000),
            )
        )

    # ------------------------------------------------------------------ limits and TLS
    def _admit(self, writer: asyncio.StreamWriter) -> bool:
        """Count a new client connection, or close it at once if limits.max_connections is hit."""
        limit = self.config.max_connections
        if limit and self.clients >= limit:
            self.metrics.connections_rejected += 1
            now = time.monotonic()
            if now - self._rejected_logged >= 1.0:  # at most one line a second under a flood
                self._rejected_logged = now
                peer = writer.get_extra_info("peername")
                log.warning(
                    "connection_rejected",
                    reason="max_connections",
                    limit=limit,
                    client=f"{peer[0]}:{peer[1]}" if peer else "?",
                    rejected_total=self.metrics.connections_rejected,
                )
            writer.close()
            return False
        self.clients += 1
        self.metrics.connections_total += 1
        return True

    def _idle_closed(self, session: Session) -> None:
        self.metrics.connections_idle_closed += 1

    def upstream_tls_args(self, host: str) -> dict[str, Any]:
        """Keyword arguments for `asyncio.open_connection` to a broker at `host`."""
        tls = self.config.upstream_tls
        if self.upstream_ssl is None or tls is None:
            return {}
        return {"ssl": self.upstream_ssl, "server_hostname": tls.hostname_for(host)}


def _filter_entry(st: FilterStats) -> dict[str, Any]:
    # The chain counts failures (errors) and keeps the last failure text; telemetry lists texts.
    errors = [st.failure] * min(st.errors, 1) if st.failure else []
    if st.errors and not errors:
        errors = [f"{st.errors} filter failure(s)"]
    return telemetry.filter_entry(
        st.name,
        st.sha256,
        kept=st.kept,
        rewritten=st.rewritten,
        dropped=st.dropped,
        rejected=st.rejected,
        detectors=st.detector_counts,
        time_ns=st.time_ns,
        errors=errors,
    )


def _refuse_unfiltered_records(session: Session, header: RequestHeader, body: Any) -> None:
    raise ProtocolViolation(
        f"{ApiKey(header.api_key).name} v{header.api_version} returns records the fetch "
        "filters do not see; refused while fetch filters are configured"
    )


def _api_versions_hook(session: Session, pending: Pending, body: memoryview | bytes) -> bytes:
    # ApiVersions responses always use header v0: the 4-byte correlation id.
    hidden = _UNFILTERED_RECORD_APIS if session.server.filters_on("fetch") else frozenset()
    try:
        return bytes(body[:4]) + rewrite_api_versions_response(
            pending.header.api_version, body[4:], hidden
        )
    except CodecError as exc:
        raise ProtocolViolation(f"cannot decode ApiVersions response: {exc}") from None
