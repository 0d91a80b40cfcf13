"""Read a topic's raw log and keep only records of committed transactions (and of
non-transactional producers): the read_committed view the bundled broker does not give.

Tansu returns aborted records to read_committed consumers and never lists aborted
transactions in Fetch responses, so this reader replays the log itself: records of a
transactional batch are held per producer id until that producer's control record says COMMIT
(kept) or ABORT (discarded). It is the oracle of the exactly-once tests.
"""

from __future__ import annotations

import asyncio
import datetime
import struct

from sluice.codec import entities, schemas
from sluice.codec.messages import ApiKey
from sluice.codec.records import decode_records, split_batches
from sluice.proxy.net.upstream_client import UpstreamConnection

_CONTROL_KEY = struct.Struct(">hh")  # version, type (0 abort, 1 commit)
Rec = tuple[int, bytes | None, bytes | None]  # offset, key, value


async def _fetch_all(host: str, port: int, topic: str, partition: int) -> list[Rec]:
    conn = await UpstreamConnection.open(host, port)
    try:
        cls = schemas.request_schema(ApiKey.FETCH, 12)
        tcls = entities.element_class(cls, "topics")
        pcls = entities.element_class(tcls, "partitions")
        kept: list[Rec] = []
        pending: dict[int, list[Rec]] = {}
        offset = 0
        while True:
            part = entities.build(pcls, partition=partition, fetch_offset=offset,
                                  partition_max_bytes=1 << 20)
            response = await conn.request(
                ApiKey.FETCH, 12, replica_id=-1, max_wait=datetime.timedelta(milliseconds=10),
                min_bytes=0, max_bytes=1 << 22, isolation_level=0,
                topics=(entities.build(tcls, topic=topic, partitions=(part,)),))
            data = response.responses[0].partitions[0]
            high = int(data.high_watermark)
            batches, _tail = split_batches(data.records or b"")
            if not batches:
                if offset >= high:
                    break
                raise AssertionError(f"no batch at offset {offset} below high watermark {high}")
            for batch in batches:
                h = batch.header
                if h.last_offset < offset:
                    continue
                records = decode_records(batch)
                if h.is_control:
                    _version, kind = _CONTROL_KEY.unpack(bytes(records[0].key or b"")[:4])
                    held = pending.pop(h.producer_id, [])
                    if kind == 1:
                        kept.extend(held)
                elif h.is_transactional:
                    pending.setdefault(h.producer_id, []).extend(
                        (h.base_offset + r.offset_delta, r.key, r.value) for r in records)
                else:
                    kept.extend((h.base_offset + r.offset_delta, r.key, r.value)
                                for r in records)
                offset = h.next_offset
        return sorted(kept)
    finally:
        await conn.close()


def committed_records(bootstrap: str, topic: str, partition: int) -> list[Rec]:
    """Committed records of one partition in offset order (open transactions left out)."""
    host, port = bootstrap.rsplit(":", 1)
    return asyncio.run(_fetch_all(host, int(port), topic, partition))
