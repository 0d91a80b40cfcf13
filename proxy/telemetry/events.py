"""Builders for Sluice telemetry events (schema version 1, documented in docs/TELEMETRY.md).

Telemetry is data, not logs: each builder returns a plain ``dict`` ready for
``json.dumps`` and for the Spark job's explicit schema. The proxy passes values only; the
envelope (schema version, event type, time in two forms, proxy identity, event id) is added
here so that every event carries it the same way.

The builders never see record payloads: only counts, sizes, offsets and names.
Builders are cheap (no JSON encoding, no IO) because they run on the event loop; the sink
serialises in its own thread. A built event must not be mutated after ``emit``.
"""

from __future__ import annotations

import os
import socket
import time
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from time import time_ns
from typing import Any, Literal, Protocol

from sluice.telemetry_schema.integrity import EventIds

SCHEMA_VERSION = 1

EventType = Literal[
    "record_batch", "admin", "connection", "filter_loaded", "telemetry_dropped", "transform_batch"
]
Api = Literal["produce", "fetch"]
ConnectionPhase = Literal["open", "update", "close"]
AdminDecision = Literal["allow", "deny", "rewrite", "error"]

# Longest free-text field kept in an event (reject reasons, error messages, admin messages):
# filter authors write these strings, so a cap keeps a runaway message from bloating telemetry.
MAX_TEXT = 300

# Event ids are random (docs/TELEMETRY.md): a client that sees some cannot write events ahead
# of time under the ids of real ones.
_event_ids = EventIds()


@dataclass(frozen=True, slots=True)
class ProxyInfo:
    """Identity of the proxy process that emits events."""

    host: str
    pid: int
    instance_id: str

    def as_dict(self) -> dict[str, Any]:
        return {"host": self.host, "pid": self.pid, "instance_id": self.instance_id}


def new_instance_id() -> str:
    """A fresh proxy instance id: short, unique per process start, safe in file names."""
    return uuid.uuid4().hex[:16]


def proxy_info(instance_id: str | None = None) -> ProxyInfo:
    """The current process's identity (host name, pid, and the given or a new instance id)."""
    return ProxyInfo(
        host=socket.gethostname(),
        pid=os.getpid(),
        instance_id=instance_id or new_instance_id(),
    )


def now_ms() -> int:
    return time_ns() // 1_000_000


# (second, "YYYY-MM-DDTHH:MM:SS.") of the last formatted time: events of one second share it,
# and formatting a datetime costs tens of microseconds on the event loop.
_iso_cache: tuple[int, str] = (-1, "")


def iso_time(epoch_ms: int) -> str:
    """ISO-8601 UTC with millisecond precision and a ``Z`` suffix."""
    global _iso_cache
    second, millis = divmod(epoch_ms, 1000)
    cached_second, prefix = _iso_cache
    if cached_second != second:
        tm = time.gmtime(second)
        prefix = (
            f"{tm.tm_year:04d}-{tm.tm_mon:02d}-{tm.tm_mday:02d}T"
            f"{tm.tm_hour:02d}:{tm.tm_min:02d}:{tm.tm_sec:02d}."
        )
        _iso_cache = (second, prefix)
    return f"{prefix}{millis:03d}Z"


def _text(value: str | None) -> str | None:
    if value is None:
        return None
    return value if len(value) <= MAX_TEXT else value[: MAX_TEXT - 1] + "…"


def _envelope(event_type: EventType, proxy: ProxyInfo, time_ms: int | None) -> dict[str, Any]:
    t = now_ms() if time_ms is None else time_ms
    return {
        "schema_version": SCHEMA_VERSION,
        "type": event_type,
        # 128 random bits: lets the audit drop duplicates that an at-least-once sink (the
        # Kafka topic) may deliver twice, and no one can predict the next one.
        "event_id": _event_ids.next(),
        "time": iso_time(t),
        "time_ms": t,
        "proxy": proxy.as_dict(),
    }


class FilterStatsLike(Protocol):
    """What the filter pipeline reports per filter per batch (duck-typed)."""

    name: str
    sha256: str
    kept: int
    rewritten: int
    dropped: int
    rejected: int
    detector_counts: Mapping[str, int]
    time_ns: int
    # sluice.filters.chain.FilterStats counts failures (int) and keeps the last text in
    # ``failure``; a list of texts is accepted too.
    errors: int | Iterable[str]


def _error_texts(stats: FilterStatsLike) -> list[str]:
    errors = stats.errors
    if isinstance(errors, int):
        failure = getattr(stats, "failure", None)
        if not errors:
            return []
        return [failure] if failure else [f"{errors} filter failure(s)"]
    return [str(e) for e in errors]


def filter_entry(
    name: str,
    module_sha256: str,
    *,
    kept: int = 0,
    rewritten: int = 0,
    dropped: int = 0,
    rejected: int = 0,
    detectors: Mapping[str, int] | None = None,
    time_ns: int = 0,
    errors: Iterable[str] = (),
    signer_key_id: str | None = None,
) -> dict[str, Any]:
    """One element of a ``record_batch`` event's ``filters`` list (``signer_key_id``, the key
    that signed a fleet filter's record, only when there is one)."""
    entry: dict[str, Any] = {
        "name": name,
        "module_sha256": module_sha256,
        "kept": kept,
        "rewritten": rewritten,
        "dropped": dropped,
        "rejected": rejected,
        "detectors": dict(detectors) if detectors else {},
        "time_ns": time_ns,
        "errors": [_text(e) for e in errors],
    }
    if signer_key_id is not None:
        entry["signer_key_id"] = signer_key_id
    return entry


def filter_entries(stats: Iterable[FilterStatsLike]) -> list[dict[str, Any]]:
    """Convert the pipeline's per-filter stats objects into ``filters`` entries."""
    return [
        filter_entry(
            s.name,
            s.sha256,
            kept=s.kept,
            rewritten=s.rewritten,
            dropped=s.dropped,
            rejected=s.rejected,
            detectors=s.detector_counts,
            time_ns=s.time_ns,
            errors=_error_texts(s),
            signer_key_id=getattr(s, "signer", None),
        )
        for s in stats
    ]


def reject_reason_counts(record_errors: Iterable[tuple[int, str]]) -> dict[str, int]:
    """Count the pipeline's ``record_errors`` ``(batch_index, message)`` by message."""
    counts: dict[str, int] = {}
    for _index, message in record_errors:
        key = _text(message) or ""
        counts[key] = counts.get(key, 0) + 1
    return counts


def record_batch_event(
    proxy: ProxyInfo,
    *,
    connection_id: str,
    client_address: str,
    client_id: str | None,
    principal: str | None,
    api: Api,
    topic: str,
    partition: int,
    offset_first: int | None,
    offset_last: int | None,
    records_in: int,
    records_out: int,
    bytes_in: int,
    bytes_out: int,
    filters: list[dict[str, Any]],
    error_code: int = 0,
    error_message: str | None = None,
    reject_reasons: Mapping[str, int] | None = None,
    dead_letters: int = 0,
    batches: int = 1,
    time_ms: int | None = None,
) -> dict[str, Any]:
    """One topic-partition of one Produce request / Fetch response that the proxy handled.

    Produce: ``offset_first`` is the broker's base offset from the response and
    ``offset_last = offset_first + records_out - 1``; both are ``None`` when the broker
    assigned none (acks=0, an error, or no record reached it).
    Fetch: first and last offsets of the record batches returned (``None`` when empty).
    ``bytes_*`` are record-batch bytes before (``in``) and after (``out``) the filters.
    """
    event = _envelope("record_batch", proxy, time_ms)
    event.update(
        connection_id=connection_id,
        client_address=client_address,
        client_id=client_id,
        principal=principal,
        api=api,
        topic=topic,
        partition=partition,
        offset_first=offset_first,
        offset_last=offset_last,
        records_in=records_in,
        records_out=records_out,
        bytes_in=bytes_in,
        bytes_out=bytes_out,
        batches=batches,
        filters=filters,
        error_code=error_code,
        error_message=_text(error_message),
        reject_reasons=dict(reject_reasons) if reject_reasons else {},
        dead_letters=dead_letters,
    )
    return event


def produce_offsets(base_offset: int | None, records_out: int) -> tuple[int | None, int | None]:
    """``(offset_first, offset_last)`` from a Produce response partition's base offset.

    Kafka answers ``base_offset = -1`` when it assigned no offsets (errors, acks=0).
    """
    if base_offset is None or base_offset < 0 or records_out <= 0:
        return None, None
    return base_offset, base_offset + records_out - 1


def admin_event(
    proxy: ProxyInfo,
    *,
    connection_id: str,
    client_address: str,
    client_id: str | None,
    principal: str | None,
    op: str,
    resource_type: str,
    resource: str,
    decision: AdminDecision,
    message: str | None,
    filter_name: str,
    module_sha256: str,
    error_code: int = 0,
    time_ns: int = 0,
    time_ms: int | None = None,
) -> dict[str, Any]:
    """One admin item (a topic in CreateTopics, a resource in AlterConfigs...) a filter judged."""
    event = _envelope("admin", proxy, time_ms)
    event.update(
        connection_id=connection_id,
        client_address=client_address,
        client_id=client_id,
        principal=principal,
        op=op,
        resource_type=resource_type,
        resource=resource,
        decision=decision,
        message=_text(message),
        filter={"name": filter_name, "module_sha256": module_sha256},
        error_code=error_code,
        time_ns=time_ns,
    )
    return event


@dataclass(slots=True)
class ApiCounters:
    """Per-API traffic on one connection: requests and frame bytes each way."""

    requests: int = 0
    bytes_in: int = 0
    bytes_out: int = 0

    def as_dict(self) -> dict[str, int]:
        return {"requests": self.requests, "bytes_in": self.bytes_in, "bytes_out": self.bytes_out}


def connection_event(
    proxy: ProxyInfo,
    *,
    phase: ConnectionPhase,
    connection_id: str,
    client_address: str,
    listener: str | None = None,
    upstream: str | None = None,
    client_id: str | None = None,
    principal: str | None = None,
    tls: bool = False,
    bytes_in: int = 0,
    bytes_out: int = 0,
    apis: Mapping[str, ApiCounters | Mapping[str, int]] | None = None,
    duration_ms: int | None = None,
    throttle_ms: int = 0,
    time_ms: int | None = None,
) -> dict[str, Any]:
    """A client connection opened, is still open (``update``), or closed.

    Counters are deltas since the previous event of the same connection, so summing them
    over any time window is exact; a proxy that emits ``update`` events periodically gets
    hour-exact billing for long-lived connections. ``bytes_in`` = client to proxy,
    ``bytes_out`` = proxy to client. ``apis`` maps an API name (``produce``, ``fetch``,
    ``metadata``...) to its request count and bytes. ``duration_ms`` is set on close.
    ``throttle_ms`` is the quota throttle time the client was given (docs/QUOTAS.md), a delta
    like the other counters.
    """
    event = _envelope("connection", proxy, time_ms)
    api_dict: dict[str, dict[str, int]] = {}
    for name, counters in (apis or {}).items():
        if isinstance(counters, ApiCounters):
            api_dict[name] = counters.as_dict()
        else:
            api_dict[name] = {
                "requests": int(counters.get("requests", 0)),
                "bytes_in": int(counters.get("bytes_in", 0)),
                "bytes_out": int(counters.get("bytes_out", 0)),
            }
    event.update(
        phase=phase,
        connection_id=connection_id,
        client_address=client_address,
        listener=listener,
        upstream=upstream,
        client_id=client_id,
        principal=principal,
        tls=tls,
        bytes_in=bytes_in,
        bytes_out=bytes_out,
        apis=api_dict,
        duration_ms=duration_ms,
        throttle_ms=throttle_ms,
    )
    return event


def filter_loaded_event(
    proxy: ProxyInfo,
    *,
    name: str,
    module_sha256: str,
    topics: Iterable[str],
    apply_to: Iterable[str],
    on_error: str | None = None,
    module: str | None = None,
    function: str | None = None,
    principals: Iterable[str] | None = None,
    time_ms: int | None = None,
) -> dict[str, Any]:
    """A filter module was loaded (at start or on reload) on this proxy instance."""
    event = _envelope("filter_loaded", proxy, time_ms)
    event.update(
        filter={"name": name, "module_sha256": module_sha256},
        module=module,
        function=function,
        topics=list(topics),
        apply_to=sorted(apply_to),
        on_error=on_error,
        principals=list(principals) if principals is not None else None,
    )
    return event


def telemetry_dropped_event(
    proxy: ProxyInfo,
    *,
    dropped: int,
    reason: str,
    since_ms: int,
    until_ms: int,
    time_ms: int | None = None,
) -> dict[str, Any]:
    """Written by a sink itself when it had to drop events, so the gap shows in the data."""
    event = _envelope("telemetry_dropped", proxy, time_ms)
    event.update(dropped=dropped, reason=_text(reason), since_ms=since_ms, until_ms=until_ms)
    return event


def transform_batch_event(
    proxy: ProxyInfo,
    *,
    transform: str,
    guarantee: str,
    group: str,
    input_topic: str,
    input_partition: int,
    input_offset_first: int,
    input_offset_last: int,
    output_topic: str,
    outputs: list[dict[str, int]],
    records_in: int,
    records_out: int,
    filters: list[dict[str, Any]],
    reject_reasons: Mapping[str, int] | None = None,
    dropped: int = 0,
    dead_letters: int = 0,
    transactional_id: str | None = None,
    time_ms: int | None = None,
) -> dict[str, Any]:
    """One input partition's batch that a transform (docs/TRANSFORMS.md) wrote and committed.

    ``outputs`` holds ``{partition, offset_first, offset_last, records}`` per output partition
    written; with ``filters`` (each naming its ``module_sha256``) it says which module version
    produced which output offsets from which input offsets.
    """
    event = _envelope("transform_batch", proxy, time_ms)
    event.update(
        transform=transform,
        guarantee=guarantee,
        group=group,
        transactional_id=transactional_id,
        input={"topic": input_topic, "partition": input_partition,
               "offset_first": input_offset_first, "offset_last": input_offset_last},
        output_topic=output_topic,
        outputs=[dict(o) for o in outputs],
        records_in=records_in,
        records_out=records_out,
        dropped=dropped,
        dead_letters=dead_letters,
        filters=filters,
        reject_reasons=dict(reject_reasons or {}),
    )
    return event
