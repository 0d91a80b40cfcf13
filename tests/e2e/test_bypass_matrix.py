"""Every way a record could reach a filtered topic unfiltered is refused or filtered.

The proxy runs builtin:pii-mask on produce for ``pm-*`` and on fetch for ``fm-*``. Each case
sends raw frames (built with sluice.codec over a plain socket) that a well-behaved client would
never send, then reads the broker directly (raw Fetch, no proxy) to prove that no unmasked
value landed. A control case shows that the same raw produce to an unfiltered topic does land
unmasked, so the "nothing unmasked" checks can fail.
"""

from __future__ import annotations

import dataclasses
import datetime
import struct
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from bench import wire
from sluice.codec.compression import compress
from sluice.codec.messages import codec_version_range, encode_request
from sluice.codec.records import Record, crc32c, encode_records
from tests.e2e.clients import create_topic, unique
from tests.harness.broker import TansuBroker
from tests.harness.proxy import SluiceProxy

SECRET = b"mail alice@example.com today"
MASKED = b"mail *****@*******.*** today"
CONFIG = """
filters:
  - name: mask-in
    module: builtin:pii-mask
    topics: ["pm-*"]
    apply_to: [produce]
  - name: mask-out
    module: builtin:pii-mask
    topics: ["fm-*"]
    apply_to: [fetch]
"""
NONE, CORRUPT_MESSAGE, UNSUPPORTED_COMPRESSION, INVALID_RECORD, UNKNOWN_TOPIC_ID = 0, 2, 76, 87, 100


@pytest.fixture(scope="module")
def filtering_proxy(
    broker: TansuBroker, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[SluiceProxy]:
    cfg = tmp_path_factory.mktemp("bypass") / "sluice.yaml"
    cfg.write_text(CONFIG)
    with SluiceProxy(upstream=broker.bootstrap, config=cfg) as proxy:
        yield proxy


def values_on_broker(broker: TansuBroker, topic: str, partition: int = 0) -> list[bytes | None]:
    return [r.value for r in wire.read_partition(broker.bootstrap, topic, partition)]


def assert_nothing_unmasked(broker: TansuBroker, topic: str) -> list[bytes | None]:
    stored = values_on_broker(broker, topic)
    assert not any(v is not None and b"alice@example.com" in v for v in stored), stored
    return stored


def produce_errors(response: Any) -> list[int]:
    return [int(p.error_code) for t in response.responses for p in t.partition_responses]


def with_attributes(batch: bytes, attributes: int) -> bytes:
    """The batch with other attribute bits and a valid CRC (so only the attributes are wrong)."""
    data = bytearray(batch)
    data[21:23] = attributes.to_bytes(2, "big")
    data[17:21] = crc32c(bytes(data[21:])).to_bytes(4, "big")
    return bytes(data)


def produce_and_expect(
    proxy: SluiceProxy | str, version: int, topic: str, records: bytes
) -> tuple[list[int], bool]:
    """(partition error codes, connection closed) for one raw Produce."""
    address = proxy if isinstance(proxy, str) else proxy.bootstrap
    with wire.RawConnection(address) as conn:
        try:
            response = conn.call(0, version, wire.produce_request(version, [(topic, 0, records)]))
        except ConnectionError:
            return [], True
        return produce_errors(response), False


@pytest.fixture
def pm_topic(filtering_proxy: SluiceProxy) -> str:
    name = unique("pm")
    create_topic(filtering_proxy.bootstrap, name, partitions=1)
    return name


# ------------------------------------------------------------------ control
def test_control_unfiltered_topic_lands_as_sent(
    broker: TansuBroker, filtering_proxy: SluiceProxy
) -> None:
    topic = unique("plain")
    create_topic(filtering_proxy.bootstrap, topic)
    errors, closed = produce_and_expect(filtering_proxy, 9, topic, wire.batch([SECRET]))
    assert (errors, closed) == ([NONE], False)
    assert values_on_broker(broker, topic) == [SECRET]


@pytest.mark.parametrize("version", [3, 7, 9, 11])
def test_every_supported_produce_version_is_filtered(
    broker: TansuBroker, filtering_proxy: SluiceProxy, pm_topic: str, version: int
) -> None:
    errors, closed = produce_and_expect(filtering_proxy, version, pm_topic, wire.batch([SECRET]))
    assert (errors, closed) == ([NONE], False)
    assert assert_nothing_unmasked(broker, pm_topic) == [MASKED]


# ------------------------------------------------------------------ versions
def test_produce_versions_outside_the_codec_range_are_refused(
    broker: TansuBroker, filtering_proxy: SluiceProxy, pm_topic: str
) -> None:
    low, high = codec_version_range(0) or (0, 0)
    v3 = wire.produce_request(3, [(pm_topic, 0, wire.batch([SECRET]))])
    body_v3 = encode_request(v3)
    # Produce v2 is v3 without the transactional_id (a null string, two bytes of -1).
    assert body_v3[:2] == b"\xff\xff"
    below = wire.raw_request(0, low - 1, body_v3[2:], 7)
    top = wire.produce_request(high, [(pm_topic, 0, wire.batch([SECRET]))])
    above = wire.raw_request(0, high + 1, encode_request(top), 8)
    for frame in (below, above):
        with wire.RawConnection(filtering_proxy.bootstrap) as conn:
            conn.send_raw(frame)
            assert conn.closed_by_peer(), "an undecodable Produce must close the connection"
    assert_nothing_unmasked(broker, pm_topic)
    assert any(
        "connection_closed_protocol_violation" in line and f"v{low - 1}" in line
        for line in filtering_proxy.output
    )


def test_api_versions_never_advertise_what_the_codec_cannot_decode(
    filtering_proxy: SluiceProxy,
) -> None:
    with wire.RawConnection(filtering_proxy.bootstrap) as conn:
        response = conn.call(18, 3, wire.api_versions_request(3))
    assert response.api_keys
    for entry in response.api_keys:
        ours = codec_version_range(int(entry.api_key))
        assert ours is not None, int(entry.api_key)
        assert ours[0] <= int(entry.min_version) <= int(entry.max_version) <= ours[1]


# ------------------------------------------------------------------ batches
@pytest.mark.parametrize("magic", [0, 1])
def test_legacy_message_format_is_refused(
    broker: TansuBroker, filtering_proxy: SluiceProxy, pm_topic: str, magic: int
) -> None:
    legacy = wire.legacy_message_set([SECRET, SECRET], magic)
    errors, closed = produce_and_expect(filtering_proxy, 3, pm_topic, legacy)
    assert closed or errors == [INVALID_RECORD]
    assert assert_nothing_unmasked(broker, pm_topic) == []


@pytest.mark.parametrize("codec", [5, 6, 7])
def test_unknown_compression_is_refused(
    broker: TansuBroker, filtering_proxy: SluiceProxy, pm_topic: str, codec: int
) -> None:
    bad = with_attributes(wire.batch([SECRET]), codec)
    errors, closed = produce_and_expect(filtering_proxy, 9, pm_topic, bad)
    assert (errors, closed) == ([UNSUPPORTED_COMPRESSION], False)
    assert assert_nothing_unmasked(broker, pm_topic) == []


@pytest.mark.parametrize(("claimed", "actual"), [(1, 0), (4, 1), (2, 3)])
def test_mismatched_compression_is_refused(
    broker: TansuBroker, filtering_proxy: SluiceProxy, pm_topic: str, claimed: int, actual: int
) -> None:
    """The attribute bits name one codec, the payload is plain or another codec's output."""
    bad = with_attributes(wire.batch([SECRET], compression=actual), claimed)
    errors, closed = produce_and_expect(filtering_proxy, 9, pm_topic, bad)
    assert (errors, closed) == ([CORRUPT_MESSAGE], False)
    assert assert_nothing_unmasked(broker, pm_topic) == []


def test_record_count_lower_than_the_records_present_is_refused(
    broker: TansuBroker, filtering_proxy: SluiceProxy, pm_topic: str
) -> None:
    """A filter that saw only the counted records must not let the extra ones through."""
    data = bytearray(wire.batch([b"harmless", SECRET]))
    data[57:61] = (1).to_bytes(4, "big")  # record_count
    data[23:27] = (0).to_bytes(4, "big")  # last_offset_delta
    data[17:21] = crc32c(bytes(data[21:])).to_bytes(4, "big")
    errors, closed = produce_and_expect(filtering_proxy, 9, pm_topic, bytes(data))
    assert closed or errors == [CORRUPT_MESSAGE]
    assert assert_nothing_unmasked(broker, pm_topic) == []


@pytest.mark.parametrize("codec", [1, 2, 3, 4])
def test_records_hidden_after_the_counted_ones_in_the_compressed_payload_are_refused(
    broker: TansuBroker, filtering_proxy: SluiceProxy, pm_topic: str, codec: int
) -> None:
    """Two compressed streams back to back (gzip members, lz4/zstd frames, snappy streams),
    record_count covering the first only: a decoder that stopped after the first stream or
    after record_count records would let the filter miss the second record."""
    first = bytes(encode_records([Record(0, 0, None, b"harmless", [])]))
    second = bytes(encode_records([Record(1, 0, None, SECRET, [])]))
    payload = bytes(compress(codec, first)) + bytes(compress(codec, second))
    header = struct.pack(">qiibIhiqqqhii", 0, 0, -1, 2, 0, codec, 0, 1000, 1000, -1, -1, -1, 1)
    data = bytearray(header + payload)
    struct.pack_into(">i", data, 8, len(data) - 12)
    struct.pack_into(">I", data, 17, crc32c(bytes(data[21:])))
    errors, closed = produce_and_expect(filtering_proxy, 9, pm_topic, bytes(data))
    assert (errors, closed) == ([CORRUPT_MESSAGE], False)
    assert assert_nothing_unmasked(broker, pm_topic) == []


def test_bad_crc_is_refused(
    broker: TansuBroker, filtering_proxy: SluiceProxy, pm_topic: str
) -> None:
    data = bytearray(wire.batch([SECRET]))
    data[-1] ^= 0x01
    errors, closed = produce_and_expect(filtering_proxy, 9, pm_topic, bytes(data))
    assert (errors, closed) == ([CORRUPT_MESSAGE], False)
    assert assert_nothing_unmasked(broker, pm_topic) == []


def test_several_batches_in_one_partition_are_refused(
    broker: TansuBroker, filtering_proxy: SluiceProxy, pm_topic: str
) -> None:
    two = wire.batch([b"harmless"]) + wire.batch([SECRET])
    errors, closed = produce_and_expect(filtering_proxy, 9, pm_topic, two)
    assert (errors, closed) == ([INVALID_RECORD], False)
    assert assert_nothing_unmasked(broker, pm_topic) == []


def test_truncated_batch_is_refused(
    broker: TansuBroker, filtering_proxy: SluiceProxy, pm_topic: str
) -> None:
    full = wire.batch([b"harmless"]) + wire.batch([SECRET])
    errors, closed = produce_and_expect(filtering_proxy, 9, pm_topic, full[:-5])
    assert (errors, closed) == ([CORRUPT_MESSAGE], False)
    assert assert_nothing_unmasked(broker, pm_topic) == []


def test_acks_zero_is_filtered_too(
    broker: TansuBroker, filtering_proxy: SluiceProxy, pm_topic: str
) -> None:
    with wire.RawConnection(filtering_proxy.bootstrap) as conn:
        conn.send(0, 9, wire.produce_request(9, [(pm_topic, 0, wire.batch([SECRET]))], acks=0))
        # acks=0 has no response; an ApiVersions after it proves the connection still works.
        conn.call(18, 0, wire.api_versions_request(0))
    deadline = time.monotonic() + 10
    stored: list[bytes | None] = []
    while time.monotonic() < deadline and not stored:
        stored = assert_nothing_unmasked(broker, pm_topic)
        time.sleep(0.1)
    assert stored == [MASKED]


# ------------------------------------------------------------------ topic ids
def test_produce_by_topic_id(broker: TansuBroker, start_proxy: Any, tmp_path: Path) -> None:
    """Produce v13 names topics by id. An id the cluster knows is filtered, whether or not a
    Metadata through the proxy taught it (the proxy looks it up); an id the cluster does not
    know is answered UNKNOWN_TOPIC_ID by the proxy itself. Once the proxy knows the broker's
    ranges it no longer advertises Produce v13 (Tansu 0.6 does not speak it) and closes a
    connection that sends it: refused too."""
    cfg = tmp_path / "sluice.yaml"
    cfg.write_text(CONFIG)
    proxy = start_proxy(config=cfg)
    known, unseen = unique("pm-known"), unique("pm-unseen")
    create_topic(broker.bootstrap, known)
    create_topic(broker.bootstrap, unseen)
    with wire.RawConnection(broker.bootstrap) as conn:
        ids = {
            t.name: t.topic_id for t in conn.call(3, 12, wire.metadata_request(12, [unseen])).topics
        }
    high = (codec_version_range(0) or (0, 0))[1]
    assert high >= 13, "the codec covers Produce v13 (topic ids)"

    def produce(topic_id: Any) -> list[int]:
        with wire.RawConnection(proxy.bootstrap) as conn:
            request = wire.produce_request(high, [(topic_id, 0, wire.batch([SECRET]))])
            try:
                return produce_errors(conn.call(0, high, request))
            except ConnectionError:
                return []  # refused: not advertised, or Tansu hung up on v13

    # Before any ApiVersions through the proxy, v13 is within what it may relay.
    assert produce(uuid.uuid4()) in ([UNKNOWN_TOPIC_ID], [])
    errors = produce(ids[unseen])  # never seen through the proxy: looked up, then filtered
    assert errors in ([], [NONE]) or NONE not in errors
    assert assert_nothing_unmasked(broker, unseen) in ([], [MASKED])
    with wire.RawConnection(proxy.bootstrap) as conn:
        (learned,) = conn.call(3, 12, wire.metadata_request(12, [known])).topics
    assert learned.topic_id.int != 0
    errors = produce(learned.topic_id)
    stored = assert_nothing_unmasked(broker, known)
    assert stored in ([], [MASKED]), stored
    assert errors in ([], [NONE]) or NONE not in errors


def test_fetch_by_unknown_topic_id_returns_no_records(
    broker: TansuBroker, start_proxy: Any, tmp_path: Path
) -> None:
    cfg = tmp_path / "sluice.yaml"
    cfg.write_text(CONFIG)
    proxy = start_proxy(config=cfg)
    topic = unique("fm-unseen")
    create_topic(broker.bootstrap, topic)
    with wire.RawConnection(broker.bootstrap) as conn:
        conn.call(0, 9, wire.produce_request(9, [(topic, 0, wire.batch([SECRET]))]))
        (md,) = conn.call(3, 12, wire.metadata_request(12, [topic])).topics
    with wire.RawConnection(proxy.bootstrap) as conn:
        conn.send(1, 13, wire.fetch_request(13, md.topic_id, 0, 0))
        raw = conn.read_frame()
    assert b"alice@example.com" not in raw
    # The proxy looked the id up on its own: the records come back filtered.
    assert MASKED in raw
    with wire.RawConnection(proxy.bootstrap) as conn:
        response = conn.call(1, 13, wire.fetch_request(13, uuid.uuid4(), 0, 0))
    ((part,),) = [t.partitions for t in response.responses]
    assert int(part.error_code) == UNKNOWN_TOPIC_ID, "an id the cluster does not know"
    assert not part.records
    # With the id learned from a Metadata through it, the same fetch is filtered too.
    with wire.RawConnection(proxy.bootstrap) as conn:
        conn.call(3, 12, wire.metadata_request(12, [topic]))
        conn.send(1, 13, wire.fetch_request(13, md.topic_id, 0, 0))
        raw = conn.read_frame()
    assert b"alice@example.com" not in raw and MASKED in raw


def test_fetch_version_outside_the_codec_range_never_returns_records(
    tansu_broker: TansuBroker, tmp_path: Path
) -> None:
    # On Tansu: Apache Kafka 4 no longer serves Fetch v3 (KIP-896) and closes the connection
    # itself, so only Tansu, which still answers it with records, shows that the proxy does
    # not pass a version it cannot filter.
    topic = unique("fm-old")
    create_topic(tansu_broker.bootstrap, topic)
    with wire.RawConnection(tansu_broker.bootstrap) as conn:
        conn.call(0, 9, wire.produce_request(9, [(topic, 0, wire.batch([SECRET]))]))
    low = (codec_version_range(1) or (0, 0))[0]
    body = encode_request(wire.fetch_request(low, topic, 0, 0))
    # Fetch v3 is v4 without isolation_level (the int8 after max_bytes: 4+4+4+4 bytes in).
    older = body[:16] + body[17:]
    frame = wire.raw_request(1, low - 1, older, 5)
    with wire.RawConnection(tansu_broker.bootstrap) as conn:
        conn.send_raw(frame)
        assert SECRET in conn.read_frame(), "control: the broker answers this frame with records"
    cfg = tmp_path / "sluice.yaml"
    cfg.write_text(CONFIG)
    received = b""
    with SluiceProxy(upstream=tansu_broker.bootstrap, config=cfg) as proxy, \
            wire.RawConnection(proxy.bootstrap) as conn:
        conn.send_raw(frame)
        conn.sock.settimeout(5)
        try:
            while chunk := conn.sock.recv(65536):
                received += chunk
        except (TimeoutError, ConnectionError):
            pass
    assert b"alice@example.com" not in received
    assert received == b"", "the proxy cannot filter this version: no response at all"


def test_fetch_v3_is_refused_by_kafka_and_by_the_proxy(
    broker: TansuBroker, filtering_proxy: SluiceProxy
) -> None:
    """Against Kafka the same frame gets no answer from either (KIP-896 removed Fetch v3)."""
    topic = unique("fm-old-k")
    create_topic(broker.bootstrap, topic)
    low = (codec_version_range(1) or (0, 0))[0]
    body = encode_request(wire.fetch_request(low, topic, 0, 0))
    frame = wire.raw_request(1, low - 1, body[:16] + body[17:], 5)
    for address in (broker.bootstrap, filtering_proxy.bootstrap):
        received = b""
        with wire.RawConnection(address) as conn:
            conn.send_raw(frame)
            conn.sock.settimeout(5)
            try:
                while chunk := conn.sock.recv(65536):
                    received += chunk
            except (TimeoutError, ConnectionError):
                pass
        assert received == b"", address


# ------------------------------------------------------------------ framing
def test_frames_split_at_every_byte(
    broker: TansuBroker, filtering_proxy: SluiceProxy, pm_topic: str
) -> None:
    request = wire.produce_request(9, [(pm_topic, 0, wire.batch([SECRET]))])
    frames = [wire.request_bytes(0, 9, request, cid) for cid in range(1, 200)]
    size = len(frames[0])
    with wire.RawConnection(filtering_proxy.bootstrap) as conn:
        # One request a byte at a time...
        for i in range(size):
            conn.send_raw(frames[0][i : i + 1])
            time.sleep(0.001)
        cid, response = conn.read_response(0, 9)
        assert (cid, produce_errors(response)) == (1, [NONE])
        # ...then one request per split point, each in two writes.
        for k in range(1, size):
            frame = frames[k]
            conn.send_raw(frame[:k])
            time.sleep(0.002)
            conn.send_raw(frame[k:])
            cid, response = conn.read_response(0, 9)
            assert (cid, produce_errors(response)) == (k + 1, [NONE])
    stored = assert_nothing_unmasked(broker, pm_topic)
    assert stored == [MASKED] * size


def test_pipelined_requests_are_answered_in_order_and_filtered(
    broker: TansuBroker, filtering_proxy: SluiceProxy, pm_topic: str
) -> None:
    """Produce requests (some answered by the broker, some refused by the proxy itself) and
    other requests, all written before reading a single response."""
    plain = unique("plain")
    create_topic(filtering_proxy.bootstrap, plain)
    plan: list[tuple[int, int, Any, list[int] | None]] = []
    for i in range(30):
        kind = i % 5
        if kind == 0:
            plan.append((18, 3, wire.api_versions_request(3), None))
        elif kind == 1:
            legacy = wire.legacy_message_set([SECRET], 1)
            plan.append((0, 9, wire.produce_request(9, [(pm_topic, 0, legacy)]), [INVALID_RECORD]))
        elif kind == 2:
            plan.append((3, 12, wire.metadata_request(12, [pm_topic]), None))
        elif kind == 3:
            both = [(pm_topic, 0, wire.batch([SECRET])), (plain, 0, wire.batch([b"p"]))]
            plan.append((0, 9, wire.produce_request(9, both), [NONE, NONE]))
        else:
            plan.append(
                (0, 9, wire.produce_request(9, [(pm_topic, 0, wire.batch([SECRET]))]), [NONE])
            )
    blob = b"".join(
        wire.request_bytes(key, version, entity, cid)
        for cid, (key, version, entity, _) in enumerate(plan, start=100)
    )
    with wire.RawConnection(filtering_proxy.bootstrap) as conn:
        conn.send_raw(blob)
        for cid, (key, version, _, expected) in enumerate(plan, start=100):
            got, response = conn.read_response(key, version)
            assert got == cid
            if expected is not None:
                assert sorted(produce_errors(response)) == sorted(expected)
    stored = assert_nothing_unmasked(broker, pm_topic)
    assert stored == [MASKED] * 12
    assert values_on_broker(broker, plain) == [b"p"] * 6


# ------------------------------------------------------------------ addresses
def _proxy_ports(proxy: SluiceProxy) -> range:
    base = int(proxy.bootstrap.rsplit(":", 1)[1])
    return range(base, base + 9)


def _endpoints(entity: Any) -> Iterator[tuple[str, int]]:
    """Every (host, port) pair anywhere inside a decoded response."""
    if dataclasses.is_dataclass(entity) and not isinstance(entity, type):
        names = {f.name for f in dataclasses.fields(entity)}
        if "host" in names and "port" in names:
            yield getattr(entity, "host"), int(getattr(entity, "port"))  # noqa: B009
        for name in names:
            yield from _endpoints(getattr(entity, name))
    elif isinstance(entity, tuple):
        for item in entity:
            yield from _endpoints(item)


def _advertised(conn: wire.RawConnection, key: int) -> range:
    response = conn.call(18, 3, wire.api_versions_request(3))
    for entry in response.api_keys:
        if int(entry.api_key) == key:
            return range(int(entry.min_version), int(entry.max_version) + 1)
    return range(0)


def test_every_broker_address_points_at_the_proxy(
    broker: TansuBroker, filtering_proxy: SluiceProxy, pm_topic: str
) -> None:
    from sluice.codec import entities
    from sluice.codec.schemas import request_schema

    broker_port = int(broker.bootstrap.rsplit(":", 1)[1])
    ports = _proxy_ports(filtering_proxy)
    seen: dict[str, int] = {}
    with wire.RawConnection(filtering_proxy.bootstrap) as conn:
        for version in _advertised(conn, 3):
            for endpoint in _endpoints(
                conn.call(3, version, wire.metadata_request(version, [pm_topic]))
            ):
                assert endpoint[1] in ports and endpoint[1] != broker_port, (version, endpoint)
                seen["metadata"] = seen.get("metadata", 0) + 1
        for version in _advertised(conn, 10):
            cls = request_schema(10, version)
            if "coordinator_keys" in {f.name for f in dataclasses.fields(cls)}:
                request = entities.build(cls, key_type=0, coordinator_keys=(unique("g"),))
            else:
                request = entities.build(cls, key=unique("g"), key_type=0)
            # Kafka answers COORDINATOR_NOT_AVAILABLE with no node (host "", port -1) while it
            # creates its offsets topic: ask again until a coordinator is named.
            deadline = time.monotonic() + 20
            while True:
                found = [e for e in _endpoints(conn.call(10, version, request)) if e[1] != -1]
                if found or time.monotonic() > deadline:
                    break
                time.sleep(0.2)
            for endpoint in found:
                assert endpoint[1] in ports, (version, endpoint)
                seen["find_coordinator"] = seen.get("find_coordinator", 0) + 1
        for version in _advertised(conn, 60):
            request = entities.build(request_schema(60, version))
            for endpoint in _endpoints(conn.call(60, version, request)):
                assert endpoint[1] in ports, (version, endpoint)
                seen["describe_cluster"] = seen.get("describe_cluster", 0) + 1
        produce_high = max(_advertised(conn, 0))
        response = conn.call(
            0, produce_high, wire.produce_request(produce_high, [(pm_topic, 0, wire.batch([b"x"]))])
        )
        for endpoint in _endpoints(response):
            assert endpoint[1] in ports, endpoint
    assert set(seen) == {"metadata", "find_coordinator", "describe_cluster"}, seen


def test_node_listeners_filter_like_the_bootstrap_port(
    broker: TansuBroker, filtering_proxy: SluiceProxy, pm_topic: str
) -> None:
    with wire.RawConnection(filtering_proxy.bootstrap) as conn:
        (node,) = conn.call(3, 12, wire.metadata_request(12, [pm_topic])).brokers
    assert int(node.port) != int(filtering_proxy.bootstrap.rsplit(":", 1)[1])
    errors, closed = produce_and_expect(
        f"{node.host}:{int(node.port)}", 9, pm_topic, wire.batch([SECRET])
    )
    assert (errors, closed) == ([NONE], False)
    assert assert_nothing_unmasked(broker, pm_topic) == [MASKED]


def test_random_uuid_is_not_a_known_topic(filtering_proxy: SluiceProxy) -> None:
    with wire.RawConnection(filtering_proxy.bootstrap) as conn:
        high = (codec_version_range(0) or (0, 0))[1]
        request = wire.produce_request(high, [(uuid.uuid4(), 0, wire.batch([SECRET]))])
        try:
            errors = produce_errors(conn.call(0, high, request))
        except ConnectionError:
            errors = []  # v13 not advertised once the broker's ranges are known: refused
        assert errors in ([UNKNOWN_TOPIC_ID], [])


# ------------------------------------------------------------------ share groups
@pytest.mark.parametrize(("api_key", "name"), [(78, "SHARE_FETCH"), (79, "SHARE_ACKNOWLEDGE")])
def test_share_record_apis_are_refused_while_fetch_filters_run(
    filtering_proxy: SluiceProxy, api_key: int, name: str
) -> None:
    """ShareFetch (KIP-932) returns records outside the Fetch path, and ShareAcknowledge
    acknowledges them: neither is relayed at all, in any version."""
    from sluice.codec import entities
    from sluice.codec.schemas import request_schema

    high = (codec_version_range(api_key) or (0, 0))[1]
    fields: dict[str, Any] = {"group_id": "g", "member_id": unique("m")}
    if api_key == 78:
        fields["max_wait"] = datetime.timedelta(milliseconds=100)
    request = entities.build(request_schema(api_key, high), **fields)
    with wire.RawConnection(filtering_proxy.bootstrap) as conn:
        conn.send(api_key, high, request)
        assert conn.closed_by_peer()
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and not any(
        name in line and "refused" in line for line in filtering_proxy.output
    ):
        time.sleep(0.1)
    assert any(name in line and "refused" in line for line in filtering_proxy.output)


def test_share_group_apis_are_not_advertised_with_fetch_filters() -> None:
    """A broker that offers ShareFetch/ShareAcknowledge: the proxy's ApiVersions rewrite
    drops them when asked to (fetch filters configured) and keeps them otherwise."""
    from sluice.codec import entities
    from sluice.codec.messages import decode_response, encode_response
    from sluice.codec.schemas import response_schema
    from sluice.proxy.paths.apiversions import rewrite_api_versions_response
    from sluice.proxy.paths.share import UNFILTERED_RECORD_APIS as _UNFILTERED_RECORD_APIS

    cls = response_schema(18, 3)
    kcls = entities.element_class(cls, "api_keys")
    offered = tuple(
        entities.build(kcls, api_key=key, min_version=lo, max_version=hi)
        for key, lo, hi in ((1, 4, 17), (78, 1, 2), (79, 1, 2))
    )
    body = encode_response(
        entities.build(cls, api_keys=offered, throttle_time=datetime.timedelta(0))
    )
    hidden = decode_response(18, 3, rewrite_api_versions_response(3, body, _UNFILTERED_RECORD_APIS))
    shown = decode_response(18, 3, rewrite_api_versions_response(3, body))
    assert [int(k.api_key) for k in hidden.api_keys] == [1]
    assert [int(k.api_key) for k in shown.api_keys] == [1, 78, 79]


# ------------------------------------------------------------------ KIP-951 node_endpoints
@pytest.mark.parametrize(("api_key", "version"), [(0, 11), (0, 13), (1, 16), (1, 17)])
def test_node_endpoints_are_rewritten_and_absent_ones_cost_no_decode(
    api_key: int, version: int
) -> None:
    """Produce v10+ and Fetch v16+ carry broker addresses only in the tagged node_endpoints.
    The proxy skips decoding responses without top-level tagged fields (a fast path) and
    must still rewrite every endpoint when they are present."""
    from sluice.codec import entities
    from sluice.codec.headers import RequestHeader, response_header_bytes
    from sluice.codec.messages import decode_response, encode_response
    from sluice.codec.schemas import response_schema
    from sluice.proxy.contract import ClientInfo
    from sluice.proxy.net.server import ProxyServer
    from sluice.proxy.ops.config import ProxyConfig
    from sluice.proxy.paths import addresses
    from sluice.proxy.paths.base import Exchange, UnknownNodes
    from sluice.proxy.paths.internal_topics import InternalTopicsPath
    from tests.harness.ports import free_port_block

    base = free_port_block(9)
    server = ProxyServer(ProxyConfig(listen=("127.0.0.1", base), upstream=[("127.0.0.1", 1)]))
    router = server.routes.current
    # The internal-topics path sees every Fetch response first and hands it to the address
    # path; an unpinned Produce response goes to the address path directly (Produce is not a
    # listing). The fast path below must hold on both routes.
    path = router.response_path(api_key, version)
    if api_key == 0:
        assert isinstance(path, addresses.AddressPath)
    else:
        assert isinstance(path, InternalTopicsPath)
        assert isinstance(path._inner_response(router.ctx, api_key, version),
                          addresses.AddressPath)
    exchange = Exchange(
        RequestHeader(api_key, version, 42, "c", 0, True), ClientInfo("c", ("b", 1))
    )
    cls = response_schema(api_key, version)
    ecls = entities.element_class(cls, "node_endpoints")
    times = {"throttle_time": datetime.timedelta(0)}

    def frame(**values: Any) -> bytes:
        body = encode_response(entities.build(cls, **times, **values))
        return response_header_bytes(42, api_key, version) + body

    plain = frame(responses=())
    decode = addresses.responses.decode

    def no_decode(*args: Any) -> Any:
        raise AssertionError("a response without tagged fields was decoded")

    addresses.responses.decode = no_decode  # type: ignore[assignment]
    try:
        relayed = path.on_response(router.ctx, exchange, plain)
    finally:
        addresses.responses.decode = decode  # type: ignore[assignment]
    assert relayed.frame is plain, "no tagged fields: relayed as is"
    remote = entities.build(ecls, node_id=7, host="broker-7.internal", port=9092, rack=None)
    tagged = frame(responses=(), node_endpoints=(remote,))
    # A node not learnt yet: the path asks for it (the connection hands that out as an action
    # and the session binds the node's port), then answers when called again.
    with pytest.raises(UnknownNodes) as unknown:
        path.on_response(router.ctx, exchange, tagged)
    assert [n[0] for n in unknown.value.nodes] == [7]
    for node in unknown.value.nodes:
        server.side_effects.learn_node(*node)
    out = path.on_response(router.ctx, exchange, tagged).frame
    size = len(response_header_bytes(42, api_key, version))
    (endpoint,) = decode_response(api_key, version, out[size:]).node_endpoints
    assert endpoint.host == "127.0.0.1" and int(endpoint.port) in range(base, base + 9), endpoint
    for sock in server._unstarted.values():
        sock[1].close()
