"""The proxy server of one process: listeners, admission, and the parts a connection needs.

`ProxyServer` opens the bootstrap listener and one listener per broker node (learnt from
responses through the broker map), admits connections (`limits.max_connections`), and builds
for each one a `Session` (asyncio glue) around a sans-IO `Connection`. It also assembles what
the API paths get (`PathContext`: the chain, the topic registry, metrics, the pure look-up of
learnt node addresses, an upstream opener) and what sessions perform for their connections
(`SideEffects`: the telemetry recorder, dead letters, learning a node), and rebuilds the
router when a chain is installed. It names no API path: `paths/catalog.py` lists them.
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

from sluice.filters.parallel import Helpers
from sluice.proxy.contract import ClientInfo
from sluice.proxy.net.connection import Close, Connection, Limits
from sluice.proxy.net.filter_pool import FilterPool
from sluice.proxy.net.job_placement import JobPlacement
from sluice.proxy.net.node_ports import BrokerMap, NodeRoute, PortTable
from sluice.proxy.net.session import Session, SideEffects
from sluice.proxy.net.tls import peer_principal
from sluice.proxy.net.upstream_client import UpstreamConnection, UpstreamDialer
from sluice.proxy.ops.config import ProxyConfig
from sluice.proxy.ops.gc_pauses import thread_gc_time
from sluice.proxy.ops.limits import IdleReaper
from sluice.proxy.ops.quotas import Quotas
from sluice.proxy.ops.security import own_topics
from sluice.proxy.paths.base import PathContext, PolicyBook
from sluice.proxy.paths.catalog import standard_paths
from sluice.proxy.paths.protection import Protection
from sluice.proxy.paths.registry import Routes, VersionTable
from sluice.proxy.paths.topics import TopicRegistry
from sluice.proxy.telemetry import events
from sluice.proxy.telemetry.dead_letters import DeadLetterWriter
from sluice.proxy.telemetry.logs import log
from sluice.proxy.telemetry.metrics import Metrics
from sluice.proxy.telemetry.recorder import TelemetryRecorder
from sluice.proxy.telemetry.sinks import TelemetrySink

if TYPE_CHECKING:
    from sluice.filters.chain import FilterChain


class ProxyServer:
    def __init__(self, config: ProxyConfig) -> None:
        self.config = config
        self.instance_id = uuid.uuid4().hex[:12]
        self.hostname = socket.gethostname()
        self.pid = os.getpid()
        shared = PortTable(config.node_port_table) if config.node_port_table else None
        self.broker_map = BrokerMap(
            config.advertised,
            config.listen[1],
            fixed_ports=config.node_ports,
            on_new_node=self._on_new_node,
            shared=shared,
        )
        self.sessions: set[Session] = set()
        self._servers: list[asyncio.AbstractServer] = []
        self._node_servers: dict[int, asyncio.AbstractServer] = {}
        self._unstarted: dict[int, tuple[NodeRoute, socket.socket]] = {}
        self._starting: set[asyncio.Task[None]] = set()
        self.closing = False
        self.chain: FilterChain | None = None
        self.policies: PolicyBook | None = None  # set by the fleet (proxy/ops/reload.py)
        self.proxy_info = events.proxy_info(self.instance_id)
        self.metrics = Metrics(
            active_connections=lambda: len(self.sessions),
            sink_stats=lambda: self.telemetry.stats(),
            worker=str(config.worker_index),
        )
        self.recorder = TelemetryRecorder(self.proxy_info, self.metrics)
        self.topics = TopicRegistry()
        # Each of `--workers N` enforces 1/N of every quota (ops/quotas.py: "divided").
        self.quotas = Quotas(config.workers, self.topics.name)
        self.quotas.update(config.quotas)
        self.metrics.quota_stats = self.quotas.stats
        self.server_ssl = config.tls.context() if config.tls is not None else None
        self.upstream_ssl = (
            config.upstream_tls.context() if config.upstream_tls is not None else None
        )
        self.dialer = UpstreamDialer(config)
        self.dead_letters = DeadLetterWriter.from_config(config)
        self.metrics.dead_letter_stats = self.dead_letters.stats
        self.clients = 0  # accepted client connections being served (limits.max_connections)
        self._rejected_logged = 0.0
        self.idle_reaper = IdleReaper(config.idle_timeout, lambda: self.sessions, self._idle_closed)
        threads = config.filter_threads
        self.executor = FilterPool(threads) if threads > 0 else None
        # Small filter jobs of kinds that proved fast run inline (net/job_placement.py).
        self.placement = JobPlacement() if self.executor is not None else None
        if self.placement is not None:
            # Jobs are charged their CPU time less the collections inside them.
            thread_gc_time.install()
            placement = self.placement
            self.metrics.job_placement = lambda: (placement.inline_runs, placement.pool_runs)
        self.limits = Limits(
            max_frame_size=config.max_frame_size,
            job_deadline=config.job_deadline,
            # A connection's overlapping Produce jobs: one per filter thread.
            overlap_jobs=config.filter_threads,
        )
        # The proxy's own topics (paths/internal_topics.py); the chain adds its dead letters.
        self.own_topics = own_topics(config.raw, config.internal_topics)
        self.versions = VersionTable()
        self._bootstrap_turn = -1  # the last --upstream address a bootstrap connection got
        self.routes = Routes(standard_paths(self.versions), self._context, self.versions)
        # What sessions perform for their connections (net/session.py).
        self.side_effects = SideEffects(
            self.recorder, self.dead_letters, self.broker_map.local_endpoint
        )

    # ------------------------------------------------------------------ the paths' context
    def _context(self, generation: int) -> PathContext:
        chain = self.chain
        directions: set[str] = set()
        own = set(self.own_topics)
        for f in chain.filters if chain is not None else ():
            directions |= set(f.spec.apply_to)
            if f.spec.dead_letter_topic:
                own.add(f.spec.dead_letter_topic)
        return PathContext(
            chain=chain,
            generation=generation,
            directions=frozenset(directions),
            topics=self.topics,
            metrics=self.metrics,
            node_address=self.broker_map.known,
            open_upstream=self.open_upstream,
            observe_brokers=self._brokers_seen,
            policies=self.policies,
            batch_limits=self.config.batch_limits,
            protection=Protection(frozenset(own), self.config.operators),
            helpers=(
                Helpers(self.executor.submit, self.config.filter_threads)
                if self.executor is not None and self.config.filter_threads > 1
                and self.config.spread_fetch else None
            ),
            overlap_produce=(
                self.executor is not None and self.config.filter_threads > 1
                and self.config.spread_produce
            ),
            fetch_max_bytes=self.config.filtered_fetch_max_bytes,
        )

    def _brokers_seen(self, node_ids: list[int]) -> None:
        """Log the cluster's membership as clients' Metadata shows it: a broker gone (fenced
        or stopped) and a broker back. Their routes and ports stay as they are."""
        change = self.broker_map.observe(node_ids)
        if change is None:
            return
        gone, added = change
        log.info("brokers_changed", brokers=sorted(node_ids), gone=gone, added=added)

    async def open_upstream(self) -> UpstreamConnection:
        """A connection to a bootstrap broker for the proxy's own look-ups (topic ids, current
        configs), with the broker's TLS and SASL settings (`upstream_tls`, `upstream_sasl`)."""
        return await self.dialer.connect()

    def set_policies(self, book: PolicyBook | None) -> None:
        """Start (or stop) intercepting data policies (paths/policy.py): a new router."""
        self.policies = book
        self.routes.install()

    def install_chain(self, chain: FilterChain | None) -> FilterChain | None:
        """Switch to a new filter chain; returns the old one.

        Requests handled after the switch, and responses sent after it, use the new chain.
        The old chain is closed by the router once no job runs with it any more; callers
        must not close it themselves.
        """
        old, self.chain = self.chain, chain
        self.routes.install()
        for f in chain.filters if chain is not None else ():
            self.recorder.filter_loaded(
                name=f.name,
                module_sha256=f.sha256,
                topics=list(f.spec.topics),
                apply_to=sorted(f.spec.apply_to),
            )
        return old

    def filters_on(self, direction: str) -> bool:
        return self.routes.current.ctx.filters_on(direction)

    @property
    def telemetry(self) -> TelemetrySink:
        return self.recorder.sink

    @telemetry.setter
    def telemetry(self, sink: TelemetrySink) -> None:
        self.recorder.sink = sink

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
            try:
                task = asyncio.get_running_loop().create_task(self.start_pending_listeners())
            except RuntimeError:
                pass  # no loop (a unit test): start_pending_listeners is called by hand
            else:
                self._starting.add(task)
                task.add_done_callback(self._starting.discard)
        log.info(
            "broker_learned",
            node=route.node_id,
            upstream=f"{route.upstream_host}:{route.upstream_port}",
            local_port=route.local_port,
        )

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
        """The broker a new bootstrap-port connection relays to: the `--upstream` addresses in
        turn, so that one broker down (killed, restarting) costs a client one retry, not every
        connection to the bootstrap port."""
        upstream = self.config.upstream
        self._bootstrap_turn = (self._bootstrap_turn + 1) % len(upstream)
        return upstream[self._bootstrap_turn]

    async def _listen(
        self, sock: socket.socket, upstream: Callable[[], tuple[str, int]], node_id: int | None
    ) -> asyncio.AbstractServer:
        loop = asyncio.get_running_loop()
        server = await loop.create_server(
            functools.partial(self._new_session, upstream, node_id), sock=sock, ssl=self.server_ssl
        )
        self._servers.append(server)
        return server

    def _new_session(
        self, upstream: Callable[[], tuple[str, int]], node_id: int | None
    ) -> asyncio.BufferedProtocol:
        address = upstream()
        return Session(
            self._make_connection,
            address,
            self.upstream_tls_args(address[0]),
            node_id,
            self,
            self.executor,
            self.side_effects,
            peer_principal if self.server_ssl is not None else None,
            self.placement,
        )

    def _make_connection(self, client: ClientInfo) -> Connection:
        return Connection(client, self.routes, self.metrics, self.limits, self.quotas)

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
        for session in list(self.sessions):
            session.close("shutdown")
        for server in self._servers:
            await server.wait_closed()
        for _route, sock in self._unstarted.values():
            sock.close()
        await self.dead_letters.close()
        if self.executor is not None:
            self.executor.shutdown(wait=False, cancel_futures=True)
        if self.chain is not None:
            self.chain.close()

    # ------------------------------------------------------------------ session hooks
    def admit(self, session: Session) -> bool:
        """A client connection is up (after its TLS handshake): serve it, or refuse it.

        Counted from here to `session_closed`, which every admitted session reaches exactly
        once, whatever fails in between (no slot leaks).
        """
        if self.closing or not self._admit():
            return False
        self.sessions.add(session)
        return True

    def session_opened(self, session: Session) -> None:
        self.recorder.connection_opened(session.client)

    def session_closed(self, session: Session, close: Close) -> None:
        if session not in self.sessions:
            return
        self.sessions.discard(session)
        self.clients -= 1
        if close.violation:
            self.metrics.protocol_violations += 1
            log.warning(
                "connection_closed_protocol_violation", conn=session.client.id, reason=close.reason
            )
        else:
            log.debug("connection_closed", conn=session.client.id, reason=close.reason)
        if session.opened:
            self.recorder.connection_closed(session.client)

    # ------------------------------------------------------------------ limits and TLS
    def _admit(self) -> bool:
        """Count a new client connection, or refuse it if limits.max_connections is hit."""
        limit = self.config.max_connections
        if limit and self.clients >= limit:
            self.metrics.connections_rejected += 1
            now = time.monotonic()
            if now - self._rejected_logged >= 1.0:  # at most one line a second under a flood
                self._rejected_logged = now
                log.warning(
                    "connection_rejected",
                    reason="max_connections",
                    limit=limit,
                    rejected_total=self.metrics.connections_rejected,
                )
            return False
        self.clients += 1
        self.metrics.connections_total += 1
        return True

    def _idle_closed(self, session: Any) -> None:
        self.metrics.connections_idle_closed += 1

    def upstream_tls_args(self, host: str) -> dict[str, Any]:
        """Keyword arguments for a connection to a broker at `host`."""
        tls = self.config.upstream_tls
        if self.upstream_ssl is None or tls is None:
            return {}
        return {"ssl": self.upstream_ssl, "server_hostname": tls.hostname_for(host)}
