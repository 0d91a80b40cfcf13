"""The broker address map: each upstream broker node gets a local proxy port.

Clients learn broker addresses from responses (Metadata, FindCoordinator, DescribeCluster, the
node endpoints of Produce/Fetch). Each node id seen there is given a local port (by default the
bootstrap port + 1, + 2, ... in order of discovery, or a configured port), so that every address
a client can learn points back at the proxy.

With `--workers N`, every worker must give a node the same port (they share the ports through
SO_REUSEPORT, and a client may reach any of them). The order of discovery differs between
workers, so the allocation is made in a `PortTable`: a small file the supervisor creates before
forking, read and extended under an exclusive `flock` by whichever worker first meets a node.
"""

from __future__ import annotations

import fcntl
import json
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from sluice.proxy.paths.base import UnknownNodes


class PortTable:
    """Node id -> local port, shared by the worker processes of one proxy through a file."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)

    @classmethod
    def create(cls, directory: str | Path) -> PortTable:
        path = Path(directory) / "node-ports.json"
        path.write_text("{}", encoding="utf-8")
        return cls(path)

    def assign(self, node_id: int, choose: Callable[[set[int]], int]) -> int:
        """The port of `node_id`, choosing one with `choose(ports in use)` if it has none."""
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            with os.fdopen(os.dup(fd), "r+", encoding="utf-8") as f:
                text = f.read()
                table: dict[str, int] = json.loads(text) if text.strip() else {}
                port = table.get(str(node_id))
                if port is None:
                    port = choose(set(table.values()))
                    table[str(node_id)] = port
                    f.seek(0)
                    f.truncate()
                    f.write(json.dumps(table))
                    f.flush()
                return int(port)
        finally:
            os.close(fd)  # closing drops the lock


@dataclass(frozen=True, slots=True)
class NodeRoute:
    node_id: int
    upstream_host: str
    upstream_port: int
    local_port: int


class PortsExhausted(RuntimeError):
    pass


class BrokerMap:
    """Node id -> upstream address and local port; thread-unsafe, owned by the event loop."""

    def __init__(
        self,
        advertised_host: str,
        bootstrap_port: int,
        fixed_ports: dict[int, int] | None = None,
        max_nodes: int = 64,
        on_new_node: Callable[[NodeRoute], None] | None = None,
        shared: PortTable | None = None,
    ) -> None:
        self.advertised_host = advertised_host
        self.bootstrap_port = bootstrap_port
        self._fixed = dict(fixed_ports or {})
        self._max_nodes = max_nodes
        self._routes: dict[int, NodeRoute] = {}
        self._on_new_node = on_new_node
        self._shared = shared
        self._unusable: set[int] = set()  # ports that could not be bound
        self._live: frozenset[int] | None = None  # brokers the last Metadata listed

    def routes(self) -> list[NodeRoute]:
        return list(self._routes.values())

    def observe(self, node_ids: Iterable[int]) -> tuple[list[int], list[int]] | None:
        """The brokers a Metadata response lists; (gone, added) node ids when that set differs
        from the last one seen (the first set seen is all `added`), else None. A node that is
        gone keeps its route and port: clients may still hold its address, and it may return."""
        now = frozenset(node_ids)
        before = self._live
        if now == before:
            return None
        self._live = now
        if before is None:
            return [], sorted(now)
        return sorted(before - now), sorted(now - before)

    def route(self, node_id: int) -> NodeRoute | None:
        return self._routes.get(node_id)

    def _allocate_port(self, node_id: int) -> int:
        if node_id in self._fixed:
            return self._fixed[node_id]
        if self._shared is not None:
            return self._shared.assign(node_id, self._next_free)
        return self._next_free(set())

    def _next_free(self, taken: set[int]) -> int:
        used = (
            {r.local_port for r in self._routes.values()}
            | set(self._fixed.values())
            | taken
            | self._unusable
        )
        for offset in range(1, self._max_nodes + 1):
            port = self.bootstrap_port + offset
            if port not in used:
                return port
        raise PortsExhausted(f"more than {self._max_nodes} broker nodes; configure node_ports")

    def forget(self, node_id: int) -> None:
        """Drop a node's route (its local port could not be bound); the next response that
        names the node learns it again, on the next free port unless the port is fixed."""
        route = self._routes.pop(node_id, None)
        if route is not None and node_id not in self._fixed and self._shared is None:
            self._unusable.add(route.local_port)

    def known(self, node_id: int, upstream_host: str, upstream_port: int) -> tuple[str, int]:
        """The (host, port) to advertise for a node already learnt at this upstream address.

        Pure (a dict look-up): the sans-IO core calls it. A node not learnt yet, or now at
        another upstream address, raises `UnknownNodes`; `local_endpoint` learns it."""
        route = self._routes.get(node_id)
        if route is None or route.upstream_host != upstream_host or (
            route.upstream_port != upstream_port
        ):
            raise UnknownNodes([(node_id, upstream_host, upstream_port)])
        return self.advertised_host, route.local_port

    def local_endpoint(
        self, node_id: int, upstream_host: str, upstream_port: int
    ) -> tuple[str, int]:
        """The (host, port) to advertise for a node, learning it (and its address) if new."""
        route = self._routes.get(node_id)
        if route is None or (route.upstream_host, route.upstream_port) != (
            upstream_host,
            upstream_port,
        ):
            port = route.local_port if route is not None else self._allocate_port(node_id)
            route = NodeRoute(node_id, upstream_host, upstream_port, port)
            self._routes[node_id] = route
            if self._on_new_node is not None:
                self._on_new_node(route)
        return self.advertised_host, route.local_port
