"""Fail closed: records for a filtered topic that the proxy cannot filter never reach the broker.

Raw Produce frames (built with sluice.codec) go over a plain socket to the proxy: a legacy
(magic 1) message set, a batch with unknown compression bits, a corrupt or truncated batch, two
batches in one partition, and an undecodable request. Each is refused with a Kafka error code
(or, for a request that does not decode at all, a closed connection), and the validating relay
shows that no Produce for the topic ever reached the broker.
"""

from __future__ import annotations

import struct
import time
import zlib
from collections.abc import Iterator

import pytest
import yaml

from sluice.codec.records import BatchHeader, Record, build_batch, crc32c
from tests.e2e.clients import create_topic, unique
from tests.harness.proxy import SluiceProxy
from tests.harness.session_builds import session_module_cache
from tests.harness.validating_relay import (
    Relayed,
    exchange,
    fetch_stored,
    produce_frame,
    produce_response,
    relayed,
)

VERSION = 9
CORRUPT_MESSAGE = 2
UNSUPPORTED_COMPRESSION_TYPE = 76
INVALID_RECORD = 87


@pytest.fixture(scope="module")
def stack(broker: object) -> Iterator[Relayed]:
    with relayed(broker) as s:
        yield s


@pytest.fixture(scope="module")
def proxy(
    stack: Relayed, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[SluiceProxy]:
    config = {
        "module_cache_dir": str(session_module_cache(tmp_path_factory)),
        "filters": [
            {
                "name": "mask",
                "module": "builtin:pii-mask",
                "topics": ["fc-*"],
                "apply_to": ["produce"],
            }
        ],
    }
    path = tmp_path_factory.mktemp("failclosed") / "sluice.yaml"
    path.write_text(yaml.safe_dump(config))
    with SluiceProxy(upstream=stack.bootstrap, config=path) as p:
        yield p


def v2_batch(values: list[bytes], attributes: int = 0) -> bytes:
    now = int(time.time() * 1000)
    records = [Record(i, 0, None, v, []) for i, v in enumerate(values)]
    n = len(records)
    return build_batch(
        BatchHeader(0, 0, -1, 2, 0, attributes, n - 1, now, now, -1, -1, -1, n), records
    )


def legacy_message_set(value: bytes) -> bytes:
    """One magic-1 message (the pre-0.11 format): offset, size, CRC32, magic, attributes,
    timestamp, key, value."""
    body = struct.pack(">bbqi", 1, 0, int(time.time() * 1000), -1)
    body += struct.pack(">i", len(value)) + value
    message = struct.pack(">I", zlib.crc32(body)) + body
    return struct.pack(">qi", 0, len(message)) + message


def with_compression_bits(batch: bytes, codec: int) -> bytes:
    """`batch` with compression `codec` in its attributes and a CRC that matches again."""
    raw = bytearray(batch)
    (attributes,) = struct.unpack_from(">h", raw, 21)
    struct.pack_into(">h", raw, 21, (attributes & ~0x07) | codec)
    struct.pack_into(">I", raw, 17, crc32c(bytes(raw[21:])))
    return bytes(raw)


def refused(stack: Relayed, proxy: SluiceProxy, records: bytes) -> int:
    """Send `records` for a fresh filtered topic; the error code it got (nothing may be
    stored and no Produce for the topic may reach the broker)."""
    topic = unique("fc")
    create_topic(stack.bootstrap, topic)
    (body,) = exchange(proxy.bootstrap, [produce_frame(1, VERSION, {(topic, 0): records})])
    (answer,) = produce_response(VERSION, body).responses[0].partition_responses
    assert topic not in stack.relay.validator.topics_seen
    assert fetch_stored(stack.bootstrap, topic, 1)[0] == []
    return int(answer.error_code)


def test_well_formed_batch_is_accepted(stack: Relayed, proxy: SluiceProxy) -> None:
    # The control case: the same path with a valid batch stores (masked) records.
    topic = unique("fc")
    create_topic(stack.bootstrap, topic)
    records = v2_batch([b"mail bob@example.com"])
    (body,) = exchange(proxy.bootstrap, [produce_frame(1, VERSION, {(topic, 0): records})])
    (answer,) = produce_response(VERSION, body).responses[0].partition_responses
    assert int(answer.error_code) == 0
    assert [r.value for r in fetch_stored(stack.bootstrap, topic, 1)[0]] == [
        b"mail ***@*******.***"
    ]
    stack.relay.assert_clean()


def test_legacy_message_format_is_refused(stack: Relayed, proxy: SluiceProxy) -> None:
    assert refused(stack, proxy, legacy_message_set(b"mail bob@example.com")) == INVALID_RECORD


@pytest.mark.parametrize("codec", [5, 6, 7])
def test_unknown_compression_is_refused(
    stack: Relayed, proxy: SluiceProxy, codec: int
) -> None:
    batch = with_compression_bits(v2_batch([b"mail bob@example.com"]), codec)
    assert refused(stack, proxy, batch) == UNSUPPORTED_COMPRESSION_TYPE


def test_bad_crc_is_refused(stack: Relayed, proxy: SluiceProxy) -> None:
    raw = bytearray(v2_batch([b"mail bob@example.com"]))
    raw[-3] ^= 0x55
    assert refused(stack, proxy, bytes(raw)) == CORRUPT_MESSAGE


def test_truncated_batch_is_refused(stack: Relayed, proxy: SluiceProxy) -> None:
    batch = v2_batch([b"mail bob@example.com", b"call +1 415 555 2671"])
    assert refused(stack, proxy, batch[:-7]) == CORRUPT_MESSAGE


def test_two_batches_in_one_partition_are_refused(
    stack: Relayed, proxy: SluiceProxy
) -> None:
    two = v2_batch([b"a@example.com"]) + v2_batch([b"b@example.com"])
    assert refused(stack, proxy, two) == INVALID_RECORD


def test_undecodable_request_closes_the_connection(
    stack: Relayed, proxy: SluiceProxy
) -> None:
    topic = unique("fc")
    create_topic(stack.bootstrap, topic)
    frame = produce_frame(1, VERSION, {(topic, 0): v2_batch([b"mail bob@example.com"])})
    (size,) = struct.unpack_from(">i", frame)
    # Cut the request inside its records: the size prefix still matches the shortened body.
    cut = frame[4 : 4 + size - 30]
    assert exchange(proxy.bootstrap, [struct.pack(">i", len(cut)) + cut]) == []
    assert topic not in stack.relay.validator.topics_seen
    assert fetch_stored(stack.bootstrap, topic, 1)[0] == []
    # The proxy itself is fine.
    assert proxy.process is not None and proxy.process.poll() is None
