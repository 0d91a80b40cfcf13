"""The broker address map: each upstream broker node gets a local proxy port.

Clients learn broker addresses from responses (Metadata, FindCoordinator, DescribeCluster, the
node endpoints of Produce/Fetch). Each node id seen there is given a local port (by default the
bootstrap port + 1, + 2, ... in order of discovery, or a configured port), so that every address
a client can learn points back at the proxy.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass


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
    ) -> None:
        self.advertised_host = advertised_host
        self.bootstrap_port = bootstrap_port
        self._fixed = dict(fixed_ports or {})
        self._max_nodes = max_nodes
        self._routes: dict[int, NodeRoute] = {}
        self._next_offset = 1
        self._on_new_node = on_new_node

    def routes(self) -> list[NodeRoute]:
        return list(self._routes.values())

    def route(self, node_id: int) -> NodeRoute | None:
        return self._routes.get(node_id)

    def _allocate_port(self, node_id: int) -> int:
        if node_id in self._fixed:
            return self._fixed[node_id]
        used = {r.local_port for r in self._routes.values()} | set(self._fixed.values())
        while self._next_offset <= self._max_nodes:
            port = self.bootstrap_port + self._next_offset
            self._next_offset += 1
            if port not in used:
                return port
        raise PortsExhausted(f"more than {self._max_nodes} broker nodes; configure node_ports")

    def forget(self, node_id: int) -> None:
        """Drop a node's route (its local port could not be bound); the next response that
        names the node learns it again, on the next free port unless the port is fixed."""
        self._routes.pop(node_id, None)

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
