"""Request and response bodies, via kio (dataclasses generated from Kafka's message specs).

Bodies here exclude the request/response header (see `headers`). Decoding uses kio's compiled
reader; encoding kio's pure-Python writer, which is slow, so callers should re-encode only the
messages they change. Everything that goes wrong surfaces as a `CodecError` subclass, so that the
proxy can fall back to relaying the original bytes.

kio raises on tagged fields its schemas do not define, where Kafka's spec says to skip them;
such bodies are decoded again by `tolerant` (unknown tags dropped).
"""

from __future__ import annotations

import io
from enum import IntEnum
from functools import cache
from typing import Any

from kio.serial import entity_reader, entity_writer

from . import guard, tolerant
from .errors import DecodeError, EncodeError
from .schemas import known_versions, request_schema, response_schema

__all__ = [
    "ApiKey",
    "Entity",
    "codec_version_range",
    "decode_request",
    "decode_response",
    "encode_request",
    "encode_response",
    "prepare",
]

Entity = Any
"""A kio payload dataclass instance (e.g. kio.schema.produce.v9.request.ProduceRequest)."""

Buffer = bytes | bytearray | memoryview


class ApiKey(IntEnum):
    """Kafka API keys (names as in Kafka's message specs)."""

    PRODUCE = 0
    FETCH = 1
    LIST_OFFSETS = 2
    METADATA = 3
    OFFSET_COMMIT = 8
    OFFSET_FETCH = 9
    FIND_COORDINATOR = 10
    JOIN_GROUP = 11
    HEARTBEAT = 12
    LEAVE_GROUP = 13
    SYNC_GROUP = 14
    DESCRIBE_GROUPS = 15
    LIST_GROUPS = 16
    SASL_HANDSHAKE = 17
    API_VERSIONS = 18
    CREATE_TOPICS = 19
    DELETE_TOPICS = 20
    DELETE_RECORDS = 21
    INIT_PRODUCER_ID = 22
    OFFSET_FOR_LEADER_EPOCH = 23
    ADD_PARTITIONS_TO_TXN = 24
    ADD_OFFSETS_TO_TXN = 25
    END_TXN = 26
    WRITE_TXN_MARKERS = 27
    TXN_OFFSET_COMMIT = 28
    DESCRIBE_ACLS = 29
    CREATE_ACLS = 30
    DELETE_ACLS = 31
    DESCRIBE_CONFIGS = 32
    ALTER_CONFIGS = 33
    ALTER_REPLICA_LOG_DIRS = 34
    DESCRIBE_LOG_DIRS = 35
    SASL_AUTHENTICATE = 36
    CREATE_PARTITIONS = 37
    CREATE_DELEGATION_TOKEN = 38
    RENEW_DELEGATION_TOKEN = 39
    EXPIRE_DELEGATION_TOKEN = 40
    DESCRIBE_DELEGATION_TOKEN = 41
    DELETE_GROUPS = 42
    ELECT_LEADERS = 43
    INCREMENTAL_ALTER_CONFIGS = 44
    ALTER_PARTITION_REASSIGNMENTS = 45
    LIST_PARTITION_REASSIGNMENTS = 46
    OFFSET_DELETE = 47
    DESCRIBE_CLIENT_QUOTAS = 48
    ALTER_CLIENT_QUOTAS = 49
    DESCRIBE_USER_SCRAM_CREDENTIALS = 50
    ALTER_USER_SCRAM_CREDENTIALS = 51
    VOTE = 52
    BEGIN_QUORUM_EPOCH = 53
    END_QUORUM_EPOCH = 54
    DESCRIBE_QUORUM = 55
    ALTER_PARTITION = 56
    UPDATE_FEATURES = 57
    ENVELOPE = 58
    FETCH_SNAPSHOT = 59
    DESCRIBE_CLUSTER = 60
    DESCRIBE_PRODUCERS = 61
    BROKER_REGISTRATION = 62
    BROKER_HEARTBEAT = 63
    UNREGISTER_BROKER = 64
    DESCRIBE_TRANSACTIONS = 65
    LIST_TRANSACTIONS = 66
    ALLOCATE_PRODUCER_IDS = 67
    CONSUMER_GROUP_HEARTBEAT = 68
    CONSUMER_GROUP_DESCRIBE = 69
    CONTROLLER_REGISTRATION = 70
    GET_TELEMETRY_SUBSCRIPTIONS = 71
    PUSH_TELEMETRY = 72
    ASSIGN_REPLICAS_TO_DIRS = 73
    LIST_CONFIG_RESOURCES = 74
    DESCRIBE_TOPIC_PARTITIONS = 75
    SHARE_GROUP_HEARTBEAT = 76
    SHARE_GROUP_DESCRIBE = 77
    SHARE_FETCH = 78
    SHARE_ACKNOWLEDGE = 79
    ADD_RAFT_VOTER = 80
    REMOVE_RAFT_VOTER = 81
    UPDATE_RAFT_VOTER = 82
    INITIALIZE_SHARE_GROUP_STATE = 83
    READ_SHARE_GROUP_STATE = 84
    WRITE_SHARE_GROUP_STATE = 85
    DELETE_SHARE_GROUP_STATE = 86
    READ_SHARE_GROUP_STATE_SUMMARY = 87
    STREAMS_GROUP_HEARTBEAT = 88
    STREAMS_GROUP_DESCRIBE = 89
    DESCRIBE_SHARE_GROUP_OFFSETS = 90
    ALTER_SHARE_GROUP_OFFSETS = 91
    DELETE_SHARE_GROUP_OFFSETS = 92


_readers: dict[object, Any] = {}
_writers: dict[object, Any] = {}


def _reader(schema: type[Any]) -> Any:
    reader = _readers.get(schema)
    if reader is None:
        reader = _readers[schema] = entity_reader(schema)
    return reader


def _writer(schema: type[Any]) -> Any:
    writer = _writers.get(schema)
    if writer is None:
        writer = _writers[schema] = entity_writer(schema)
    return writer


def _decode(schema: type[Any], body: Buffer, what: str) -> Entity:
    # Must run first: kio's native reader aborts the process on huge declared array sizes.
    guard.check_body(schema, body)
    try:
        entity, size = _reader(schema)(body, 0)
    except KeyError as exc:
        # kio's way of saying "unknown tagged field"; retry with the spec's skip rule.
        if "tagged field" not in str(exc):
            raise DecodeError(f"{what}: {exc!r}") from exc
        try:
            entity, size = tolerant.read_entity_tolerant(schema, body, 0)
        except DecodeError:
            raise
        except Exception as exc2:
            raise DecodeError(f"{what}: {exc2!r}") from exc2
    except Exception as exc:
        # kio's SerialError family, ValueError/OverflowError from primitive readers, ...
        raise DecodeError(f"{what}: {exc!r}") from exc
    except BaseException as exc:
        # A Rust panic inside kio surfaces as pyo3's PanicException, a BaseException.
        if isinstance(exc, KeyboardInterrupt | SystemExit | GeneratorExit):
            raise
        raise DecodeError(f"{what}: {exc!r}") from exc
    if size != len(body):
        raise DecodeError(f"{what}: {len(body) - size} trailing bytes after the body")
    return entity


def _encode(entity: Entity) -> bytes:
    try:
        writer = _writer(type(entity))
        buf = io.BytesIO()
        writer(buf, entity)
    except Exception as exc:
        raise EncodeError(f"{type(entity).__name__}: {exc!r}") from exc
    return buf.getvalue()


_METADATA_KEY = 3
_LIBRDKAFKA_PLACEHOLDER = b"\x00\x00\x00\x00"


def decode_request(api_key: int, version: int, body: Buffer) -> Entity:
    """Decode a request body (the frame after the request header)."""
    schema = request_schema(api_key, version)
    what = f"request api_key={api_key} v{version}"
    try:
        return _decode(schema, body, what)
    except DecodeError:
        if not (api_key == _METADATA_KEY and version >= 9):
            raise
        if bytes(body[:4]) != _LIBRDKAFKA_PLACEHOLDER:
            raise
        # librdkafka asks for all topics (v9+) by leaving its 4-byte placeholder for the
        # topic count unfinalised: a compact null (0x00) followed by three stray zero bytes.
        # Read naively, those zeros become allow_auto_topic_creation, authorized-operations
        # and the tag count, and the real values show up as "trailing bytes".
        return _decode(schema, memoryview(body)[3:], what)


def decode_response(api_key: int, version: int, body: Buffer) -> Entity:
    """Decode a response body (the frame after the response header)."""
    schema = response_schema(api_key, version)
    return _decode(schema, body, f"response api_key={api_key} v{version}")


def encode_request(entity: Entity) -> bytes:
    """Encode a kio request entity to body bytes (no header)."""
    if getattr(type(entity), "__api_key__", None) is None:
        raise EncodeError(f"{type(entity).__name__} is not a kio payload")
    return _encode(entity)


def encode_response(entity: Entity) -> bytes:
    """Encode a kio response entity to body bytes (no header)."""
    if getattr(type(entity), "__api_key__", None) is None:
        raise EncodeError(f"{type(entity).__name__} is not a kio payload")
    return _encode(entity)


@cache
def codec_version_range(api_key: int) -> tuple[int, int] | None:
    """(min, max) versions of `api_key` whose request and response the codec can both decode
    and encode, or None. The range is contiguous: it is the run of such versions that ends at
    the newest one."""
    both = set(known_versions(api_key, True)) & set(known_versions(api_key, False))
    if not both:
        return None
    high = max(both)
    low = high
    while low - 1 in both:
        low -= 1
    return low, high


def prepare(api_key: int, version: int, request: bool, encode: bool = False) -> None:
    """Load and compile everything decoding one message needs: kio's schema modules, the
    guard's scanners, kio's reader (and writer with `encode`).

    Done lazily this costs 30-70 ms on the first message of each version; a proxy calls this
    after start-up instead."""
    schema = (request_schema if request else response_schema)(api_key, version)
    guard.prepare(schema)
    _reader(schema)
    if encode:
        _writer(schema)
