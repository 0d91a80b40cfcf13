"""Sans-IO pieces of the proxy: node ports, endpoint rewriting, ApiVersions intersection."""

from __future__ import annotations

import pytest

from sluice.codec import entities, schemas
from sluice.codec.endpoints import carries_endpoints, endpoint_paths, rewrite_endpoints
from sluice.codec.messages import ApiKey, codec_version_range, decode_response, encode_response
from sluice.proxy.net.node_ports import BrokerMap, NodeRoute, PortsExhausted
from sluice.proxy.paths.apiversions import intersect_api_versions


def test_nodes_get_ports_after_the_bootstrap_port_in_discovery_order() -> None:
    learned: list[NodeRoute] = []
    bmap = BrokerMap("proxy.local", 9000, on_new_node=learned.append)
    assert bmap.local_endpoint(7, "b7", 9092) == ("proxy.local", 9001)
    assert bmap.local_endpoint(3, "b3", 9092) == ("proxy.local", 9002)
    assert bmap.local_endpoint(7, "b7", 9092) == ("proxy.local", 9001)
    assert [r.node_id for r in learned] == [7, 3]
    # A node that moves keeps its local port; the route follows the new upstream address.
    assert bmap.local_endpoint(7, "b7-new", 9093) == ("proxy.local", 9001)
    route = bmap.route(7)
    assert route is not None and (route.upstream_host, route.upstream_port) == ("b7-new", 9093)


def test_fixed_node_ports_are_used_and_skipped_by_allocation() -> None:
    bmap = BrokerMap("h", 9000, fixed_ports={2: 9001})
    assert bmap.local_endpoint(5, "b5", 1) == ("h", 9002)
    assert bmap.local_endpoint(2, "b2", 1) == ("h", 9001)


def test_broker_set_changes_are_reported_once_and_keep_the_routes() -> None:
    bmap = BrokerMap("h", 9000)
    for node in (1, 2, 3):
        bmap.local_endpoint(node, "b", 9090 + node)
    assert bmap.observe([1, 2, 3]) == ([], [1, 2, 3])  # the first view: all of them
    assert bmap.observe([3, 2, 1]) is None  # the same set, in any order: nothing to say
    assert bmap.observe([1, 3]) == ([2], [])  # node 2 fenced or stopped
    assert bmap.observe([1, 3]) is None
    assert bmap.route(2) is not None and bmap.route(2).local_port == 9002  # port kept
    assert bmap.observe([1, 2, 3]) == ([], [2])  # back


def test_running_out_of_node_ports_is_an_error() -> None:
    bmap = BrokerMap("h", 9000, max_nodes=2)
    bmap.local_endpoint(1, "a", 1)
    bmap.local_endpoint(2, "b", 1)
    with pytest.raises(PortsExhausted):
        bmap.local_endpoint(3, "c", 1)


@pytest.mark.parametrize(
    ("api", "version", "path"),
    [
        (ApiKey.METADATA, 12, "brokers"),
        (ApiKey.FIND_COORDINATOR, 3, ""),
        (ApiKey.FIND_COORDINATOR, 4, "coordinators"),
        (ApiKey.DESCRIBE_CLUSTER, 1, "brokers"),
        (ApiKey.PRODUCE, 10, "node_endpoints"),
        (ApiKey.FETCH, 16, "node_endpoints"),
    ],
)
def test_every_broker_address_a_client_can_learn_is_found(
    api: int, version: int, path: str
) -> None:
    paths = endpoint_paths(api, version)
    names = {".".join(step for step, _seq in p) for p in paths}
    assert path in names


def test_versions_without_endpoints_are_not_decoded() -> None:
    assert not carries_endpoints(ApiKey.PRODUCE, 9)
    assert not carries_endpoints(ApiKey.FETCH, 15)
    assert not carries_endpoints(ApiKey.JOIN_GROUP, 9)


def _metadata(version: int, brokers: list[tuple[int, str, int]]) -> object:
    cls = schemas.response_schema(ApiKey.METADATA, version)
    bcls = entities.element_class(cls, "brokers")
    return entities.build(
        cls,
        brokers=tuple(entities.build(bcls, node_id=n, host=h, port=p) for n, h, p in brokers),
        topics=(),
        cluster_id="c",
        controller_id=1,
    )


def test_metadata_brokers_are_rewritten_and_survive_encoding() -> None:
    bmap = BrokerMap("127.0.0.1", 19092)
    response = _metadata(12, [(1, "kafka-1.internal", 9092), (2, "kafka-2.internal", 9092)])
    rewritten = rewrite_endpoints(response, ApiKey.METADATA, 12, bmap.local_endpoint)
    again = decode_response(ApiKey.METADATA, 12, encode_response(rewritten))
    assert [(b.node_id, b.host, b.port) for b in again.brokers] == [
        (1, "127.0.0.1", 19093),
        (2, "127.0.0.1", 19094),
    ]


def test_nothing_to_rewrite_returns_the_same_object() -> None:
    response = _metadata(12, [(1, "127.0.0.1", 19093)])
    same = rewrite_endpoints(response, ApiKey.METADATA, 12, lambda n, h, p: (h, p))
    assert same is response


def test_api_versions_advertise_only_what_broker_and_codec_share() -> None:
    cls = schemas.response_schema(ApiKey.API_VERSIONS, 3)
    acls = entities.element_class(cls, "api_keys")
    produce_low, produce_high = codec_version_range(ApiKey.PRODUCE) or (0, 0)
    broker = entities.build(
        cls,
        error_code=0,
        api_keys=(
            entities.build(
                acls, api_key=ApiKey.PRODUCE, min_version=0, max_version=produce_high + 5
            ),
            entities.build(acls, api_key=ApiKey.METADATA, min_version=0, max_version=1),
            entities.build(acls, api_key=30_000, min_version=0, max_version=3),  # unknown to kio
        ),
    )
    ours = intersect_api_versions(broker)
    by_key = {int(a.api_key): (int(a.min_version), int(a.max_version)) for a in ours.api_keys}
    assert by_key[ApiKey.PRODUCE] == (produce_low, produce_high)
    assert by_key[ApiKey.METADATA] == (0, 1)
    assert 30_000 not in by_key


def test_bootstrap_connections_take_the_upstream_addresses_in_turn() -> None:
    from sluice.proxy.net.server import ProxyServer
    from sluice.proxy.ops.config import ProxyConfig

    server = ProxyServer(ProxyConfig(listen=("127.0.0.1", 0),
                                     upstream=[("10.0.0.1", 9092), ("10.0.0.2", 9092)]))
    # A broker that is down costs one connection, not every connection to the bootstrap port.
    assert [server._bootstrap_upstream() for _ in range(3)] == [
        ("10.0.0.1", 9092), ("10.0.0.2", 9092), ("10.0.0.1", 9092)]
