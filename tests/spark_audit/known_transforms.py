"""Known transform and encryption telemetry, built with the proxy's own event builders, and the
report rows it must give (derived by hand from the events below).

Transform ``upper`` reads ``lower`` (2 partitions) and writes ``upper-out``: module version UP1
on instance A, a reload to UP2 for the last batch of partition 0, an at-least-once replay of
input offsets 50-99 by instance B (it overlaps, so it joins the run), a batch whose records were
all dropped (no output partition), and a gap in partition 1's input offsets (a second run).

The ``builtin:encrypt`` filter seals ``payments/0`` offsets 0-149 under KEK ``payments``
version 1 and 150-159 under version 2; ``billing-eu`` reads them decrypted, ``bob`` as stored,
and one fetch of ``billing-eu`` fails with a partition error. ``plain`` is not encrypted.
"""

from __future__ import annotations

import functools
import hashlib
from typing import Any

from sluice.proxy import telemetry as t
from sluice.telemetry_schema.host_identity import ENCRYPT_SHA256

# The same two instances and clock as the other known data set.
from tests.spark_audit.known_telemetry import MIN, T0, A, B

UP1 = hashlib.sha256(b"upper module v1").hexdigest()
UP2 = hashlib.sha256(b"upper module v2").hexdigest()


def _out(partition: int, first: int, last: int) -> dict[str, int]:
    return {"partition": partition, "offset_first": first, "offset_last": last,
            "records": last - first + 1}


def _transform(proxy: t.ProxyInfo, minute: int, module: str, partition: int, first: int,
               last: int, outputs: list[dict[str, int]], **extra: Any) -> dict[str, Any]:
    n = last - first + 1
    return t.transform_batch_event(
        proxy, transform="upper", guarantee=extra.pop("guarantee", "exactly-once"),
        group="upper-group", input_topic="lower", input_partition=partition,
        input_offset_first=first, input_offset_last=last, output_topic="upper-out",
        outputs=outputs, records_in=n, records_out=sum(o["records"] for o in outputs),
        filters=[t.filter_entry("upper", module, rewritten=n, time_ns=100)],
        time_ms=T0 + minute * MIN, **extra)


def _encrypt(api: str, minute: int, offsets: tuple[int, int] | None,
             detectors: dict[str, int], principal: str | None = None,
             topic: str = "payments", error_code: int = 0,
             encrypted: bool = True) -> dict[str, Any]:
    first, last = offsets if offsets else (None, None)
    n = last - first + 1 if first is not None and last is not None else 0
    filters = [t.filter_entry("encrypt-payments", ENCRYPT_SHA256, rewritten=n,
                              detectors=detectors)] if encrypted else []
    return t.record_batch_event(
        A, connection_id="c1", client_address="127.0.0.1:5", client_id="app",
        principal=principal, api=api, topic=topic, partition=0, offset_first=first,
        offset_last=last, records_in=n, records_out=n, bytes_in=10 * n, bytes_out=10 * n,
        filters=filters, error_code=error_code,
        error_message="KAFKA_STORAGE_ERROR" if error_code else None,
        time_ms=T0 + minute * MIN)


@functools.cache
def events() -> list[dict[str, Any]]:
    """Built once: event ids come from a process-wide counter. Do not mutate."""
    return [
        _transform(A, 1, UP1, 0, 0, 49, [_out(0, 100, 120), _out(1, 200, 228)]),
        # 121 is the first transaction's commit marker
        _transform(A, 2, UP1, 0, 50, 99, [_out(0, 122, 146), _out(1, 230, 254)]),
        _transform(A, 3, UP2, 0, 100, 149, [_out(0, 148, 197)]),
        _transform(B, 4, UP1, 0, 50, 99, [_out(0, 300, 349)], guarantee="at-least-once"),
        _transform(A, 5, UP1, 1, 0, 9, [], dropped=10),
        _transform(A, 6, UP1, 1, 10, 19, [_out(1, 256, 265)]),
        _transform(A, 7, UP1, 1, 30, 39, [_out(1, 266, 275)]),
        _encrypt("produce", 10, (0, 99), {"encrypted": 100, "kek:payments:1": 100}),
        _encrypt("produce", 11, (100, 149), {"encrypted": 50, "kek:payments:1": 50}),
        _encrypt("produce", 12, (150, 159), {"encrypted": 10, "kek:payments:2": 10}),
        _encrypt("produce", 13, (0, 4), {}, topic="plain", encrypted=False),
        _encrypt("fetch", 14, (0, 159), {"decrypted": 160}, principal="User:billing-eu"),
        _encrypt("fetch", 15, (0, 159), {"withheld": 160}, principal="User:bob"),
        _encrypt("fetch", 16, None, {}, principal="User:billing-eu", error_code=56),
        _encrypt("fetch", 17, (0, 4), {}, principal="User:bob", topic="plain",
                 encrypted=False),
    ]


# (module_sha256s, input_partition, run, output_partition) -> (input_offset_first,
# input_offset_last, output_offset_first, output_offset_last, batches, input_records,
# output_records, dropped, guarantees, proxy_instances)
EXPECTED_TRANSFORMS = {
    ((UP1,), 0, 1, 0): (0, 99, 100, 349, 3, 150, 21 + 25 + 50, 0,
                        ["at-least-once", "exactly-once"], ["inst-a", "inst-b"]),
    ((UP1,), 0, 1, 1): (0, 99, 200, 254, 2, 100, 29 + 25, 0, ["exactly-once"], ["inst-a"]),
    ((UP2,), 0, 1, 0): (100, 149, 148, 197, 1, 50, 50, 0, ["exactly-once"], ["inst-a"]),
    ((UP1,), 1, 1, None): (0, 9, None, None, 1, 10, 0, 10, ["exactly-once"], ["inst-a"]),
    ((UP1,), 1, 1, 1): (10, 19, 256, 265, 1, 10, 10, 0, ["exactly-once"], ["inst-a"]),
    ((UP1,), 1, 2, 1): (30, 39, 266, 275, 1, 10, 10, 0, ["exactly-once"], ["inst-a"]),
}

# (topic, partition, key_name, key_version) -> (offset_first, offset_last, records, batches)
EXPECTED_ENCRYPTED = {
    ("payments", 0, "payments", "1"): (0, 149, 150, 2),
    ("payments", 0, "payments", "2"): (150, 159, 10, 1),
}
# (topic, principal) -> (decrypted, withheld, unreadable, failures)
EXPECTED_READS = {
    ("payments", "User:billing-eu"): (160, 0, 0, 1),
    ("payments", "User:bob"): (0, 160, 0, 0),
}
