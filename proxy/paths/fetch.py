"""Fetch responses from filtered topics: filter records before the consumer sees them.

Only partitions of topics with fetch filters are touched; batch boundaries, base offsets, last
offset deltas, control batches and a truncated trailing batch survive (sluice.filters.pipeline).
A filter failure is reported on that partition, never as a top-level error (consumers treat a
top-level error like an empty topic and loop quietly).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from sluice.codec.batch_counts import count_records, offset_range
from sluice.filters.context import RecordContext
from sluice.filters.pipeline import filter_fetch
from sluice.proxy.net.session import Pending, Session

UNKNOWN_TOPIC_ID = 100


def on_fetch_response(session: Session, pending: Pending, frame: memoryview | bytes) -> Any:
    server = session.server

    def transform(response: Any) -> Any:
        chain = server.chain
        if chain is None:
            return response
        topics = []
        changed = False
        for topic in response.responses:
            name = getattr(topic, "topic", None) or server.topic_names.get(
                getattr(topic, "topic_id", None)
            )
            if name is None:
                if server.filters_on("fetch"):
                    # Unknown topic id: it may be filtered, so its records must not pass.
                    changed = True
                    topic = dataclasses.replace(
                        topic,
                        partitions=tuple(
                            dataclasses.replace(
                                p, records=None, error_code=type(p.error_code)(UNKNOWN_TOPIC_ID)
                            )
                            for p in topic.partitions
                        ),
                    )
                topics.append(topic)
                continue
            if not chain.applies(name, "fetch", session.principal):
                topics.append(topic)
                continue
            parts = []
            for part in topic.partitions:
                records = part.records
                if not records:
                    parts.append(part)
                    continue
                ctx = RecordContext(
                    name, int(part.partition_index), "fetch", session.client_id, session.principal
                )
                outcome = filter_fetch(chain, ctx, records)
                if outcome.dead_letters:
                    server.dead_letters.submit(outcome.dead_letters)
                if outcome.error_code:
                    changed = True
                    part = dataclasses.replace(
                        part, records=None, error_code=type(part.error_code)(outcome.error_code)
                    )
                elif outcome.changed:
                    changed = True
                    part = dataclasses.replace(part, records=bytes(outcome.records))
                first, last = offset_range(records)
                server.emit_record_telemetry(
                    session,
                    api="fetch",
                    topic=name,
                    partition=int(part.partition_index),
                    offset_first=first,
                    offset_last=last,
                    records_in=count_records(records),
                    records_out=count_records(part.records)
                    if outcome.changed
                    else count_records(records),
                    bytes_in=len(records),
                    bytes_out=len(part.records or b""),
                    stats=outcome.stats,
                    error_code=outcome.error_code,
                    error_message=outcome.error_message,
                    record_errors=outcome.record_errors,
                    dead_letters=len(outcome.dead_letters),
                )
                parts.append(part)
            topics.append(dataclasses.replace(topic, partitions=tuple(parts)))
        if not changed:
            return response
        return dataclasses.replace(response, responses=tuple(topics))

    return server.transform_response(pending, frame, transform)
