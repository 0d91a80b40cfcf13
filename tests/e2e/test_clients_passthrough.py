"""Real clients through a filterless proxy behave exactly as they do against the broker."""

from __future__ import annotations

import pytest
from confluent_kafka.admin import AdminClient, ConfigResource, NewTopic

from tests.e2e.clients import (
    QUIET,
    aiokafka_consume,
    aiokafka_produce,
    confluent_consume,
    confluent_produce,
    create_topic,
    kafka_python_consume,
    kafka_python_produce,
    kcat,
    unique,
)
from tests.harness.broker import TansuBroker
from tests.harness.proxy import SluiceProxy
from tests.proxy.test_reload import wait_for

CODECS = ["none", "gzip", "snappy", "lz4", "zstd"]


def records(n: int, tag: str) -> list[tuple[bytes | None, bytes | None]]:
    return [(f"k{i}".encode(), f'{{"n": {i}, "tag": "{tag}"}}'.encode()) for i in range(n)]


@pytest.mark.parametrize("idempotent", [True, False], ids=["idempotent", "plain"])
@pytest.mark.parametrize("codec", CODECS)
def test_confluent_produce_consume(
    broker: TansuBroker, shared_proxy: SluiceProxy, codec: str, idempotent: bool
) -> None:
    topic = unique(f"cf-{codec}")
    create_topic(shared_proxy.bootstrap, topic, partitions=3)
    sent = records(300, codec)
    offsets = confluent_produce(
        shared_proxy.bootstrap,
        topic,
        sent,
        **{"compression.type": codec, "enable.idempotence": idempotent},
    )
    assert len(offsets) == len(sent)
    via_proxy = confluent_consume(shared_proxy.bootstrap, topic, len(sent))
    direct = confluent_consume(broker.bootstrap, topic, len(sent))
    assert sorted(via_proxy) == sorted(sent)
    assert sorted(direct) == sorted(via_proxy)


def test_confluent_consumer_group(shared_proxy: SluiceProxy) -> None:
    topic = unique("cf-group")
    create_topic(shared_proxy.bootstrap, topic, partitions=2)
    sent = records(200, "group")
    confluent_produce(shared_proxy.bootstrap, topic, sent)
    got = confluent_consume(shared_proxy.bootstrap, topic, len(sent), group=unique("g"))
    assert sorted(got) == sorted(sent)


def test_kafka_python_produce_consume_group(broker: TansuBroker, shared_proxy: SluiceProxy) -> None:
    topic = unique("kp")
    create_topic(shared_proxy.bootstrap, topic, partitions=2)
    sent = records(150, "kafka-python")
    assert kafka_python_produce(shared_proxy.bootstrap, topic, sent, compression_type="gzip") == 150
    got = kafka_python_consume(shared_proxy.bootstrap, topic, len(sent), group=unique("g"))
    assert sorted(got) == sorted(sent)
    assert sorted(confluent_consume(broker.bootstrap, topic, len(sent))) == sorted(sent)


def test_aiokafka_produce_consume_group(broker: TansuBroker, shared_proxy: SluiceProxy) -> None:
    topic = unique("aio")
    create_topic(shared_proxy.bootstrap, topic, partitions=2)
    sent = records(150, "aiokafka")
    assert aiokafka_produce(shared_proxy.bootstrap, topic, sent, compression_type="lz4") == 150
    got = aiokafka_consume(shared_proxy.bootstrap, topic, len(sent), group=unique("g"))
    assert sorted(got) == sorted(sent)
    assert sorted(confluent_consume(broker.bootstrap, topic, len(sent))) == sorted(sent)


def test_kcat_metadata_produce_consume(shared_proxy: SluiceProxy) -> None:
    topic = unique("kcat")
    create_topic(shared_proxy.bootstrap, topic)
    listing = kcat("-b", shared_proxy.bootstrap, "-L", "-t", topic)
    assert listing.returncode == 0, listing.stderr
    # Every broker kcat learns is an address of the proxy.
    proxy_host = shared_proxy.bootstrap.split(":")[0]
    broker_lines = [
        ln for ln in listing.stdout.decode().splitlines() if "broker " in ln and " at " in ln
    ]
    assert broker_lines, listing.stdout
    for line in broker_lines:
        addr = line.split(" at ")[1].split()[0]
        assert addr.startswith(proxy_host + ":")
        assert int(addr.rsplit(":", 1)[1]) != 0
    lines = b"".join(f"key{i}:value-{i}\n".encode() for i in range(50))
    produced = kcat(
        "-b", shared_proxy.bootstrap, "-t", topic, "-P", "-K:", "-z", "snappy", input=lines
    )
    assert produced.returncode == 0, produced.stderr
    consumed = kcat(
        "-b", shared_proxy.bootstrap, "-t", topic, "-C", "-e", "-o", "beginning", "-f", "%k=%s\n"
    )
    assert consumed.returncode == 0, consumed.stderr
    got = sorted(consumed.stdout.decode().splitlines())
    assert got == sorted(f"key{i}=value-{i}" for i in range(50))


def test_kcat_cannot_talk_to_tansu_directly_but_can_through_proxy(
    tansu_broker: TansuBroker,
) -> None:
    """Documents why the proxy re-encodes ApiVersions: Debian's kcat rejects Tansu's encoding.

    Kept on Tansu, the demo's default broker: Kafka's own encoding suits kcat (next test)."""
    with SluiceProxy(upstream=tansu_broker.bootstrap) as proxy:
        direct = kcat("-b", tansu_broker.bootstrap, "-L", "-m", "5", timeout=30)
        through = kcat("-b", proxy.bootstrap, "-L", "-m", "5", timeout=30)
    assert through.returncode == 0, through.stderr
    assert direct.returncode != 0 or b"broker" not in direct.stdout


def test_kcat_lists_the_same_topics_directly_and_through_the_proxy(
    broker: TansuBroker, shared_proxy: SluiceProxy
) -> None:
    topic = unique("kcat-list")
    create_topic(broker.bootstrap, topic, partitions=2)
    direct = kcat("-b", broker.bootstrap, "-L", "-t", topic, "-m", "5", timeout=30)
    through = kcat("-b", shared_proxy.bootstrap, "-L", "-t", topic, "-m", "5", timeout=30)
    assert direct.returncode == 0 and through.returncode == 0, (direct.stderr, through.stderr)
    for out in (direct.stdout, through.stdout):
        assert f'topic "{topic}" with 2 partitions'.encode() in out, out
    # The proxy's answer names its own address, the broker's names the broker.
    assert shared_proxy.bootstrap.encode() in through.stdout
    assert broker.bootstrap.encode() not in through.stdout


def test_admin_calls_match_direct(broker: TansuBroker, shared_proxy: SluiceProxy) -> None:
    via = AdminClient({"bootstrap.servers": shared_proxy.bootstrap, **QUIET})
    direct = AdminClient({"bootstrap.servers": broker.bootstrap, **QUIET})
    topic = unique("admin")
    for fut in via.create_topics([NewTopic(topic, 4, 1)]).values():
        fut.result(15)
    # Kafka applies a change through its metadata log: a new topic, a new config value or a
    # deletion shows a moment later, directly as through the proxy (docs/COMPATIBILITY.md).
    wait_for(lambda: topic in direct.list_topics(timeout=10).topics, 15, "the topic")
    assert len(via.list_topics(timeout=10).topics[topic].partitions) == 4

    cluster_via = via.describe_cluster().result(15)
    cluster_direct = direct.describe_cluster().result(15)
    assert cluster_via.cluster_id == cluster_direct.cluster_id
    assert [n.id for n in cluster_via.nodes] == [n.id for n in cluster_direct.nodes]
    proxy_port = int(shared_proxy.bootstrap.rsplit(":", 1)[1])
    for node in cluster_via.nodes:
        assert node.host == "127.0.0.1" and proxy_port < node.port <= proxy_port + 8
    assert cluster_via.controller is None or cluster_via.controller.port != int(
        broker.bootstrap.rsplit(":")[1]
    )

    from confluent_kafka.admin import AlterConfigOpType, ConfigEntry

    resource = ConfigResource(
        ConfigResource.Type.TOPIC,
        topic,
        incremental_configs=[
            ConfigEntry("retention.ms", "3600000", incremental_operation=AlterConfigOpType.SET)
        ],
    )
    for fut in via.incremental_alter_configs([resource]).values():
        fut.result(15)

    def retention() -> str:
        described = direct.describe_configs([ConfigResource(ConfigResource.Type.TOPIC, topic)])
        return str(next(iter(described.values())).result(15)["retention.ms"].value)

    wait_for(lambda: retention() == "3600000", 15, "retention.ms set through the proxy")

    for fut in via.delete_topics([topic]).values():
        fut.result(15)
    wait_for(lambda: topic not in direct.list_topics(timeout=10).topics, 15, "the deletion")


def test_large_fetch_responses_spanning_many_reads(
    broker: TansuBroker, shared_proxy: SluiceProxy
) -> None:
    """Fetch responses of megabytes arrive in many TCP reads and are decoded (KIP-951 check)."""
    topic = unique("large")
    create_topic(shared_proxy.bootstrap, topic, partitions=1)
    sent = [(None, (f"{i:08d}" * 40).encode()) for i in range(20_000)]
    confluent_produce(broker.bootstrap, topic, sent, **{"compression.type": "none"})
    got = confluent_consume(
        shared_proxy.bootstrap, topic, len(sent), **{"fetch.max.bytes": 4 * 1024 * 1024}
    )
    assert got == sent
