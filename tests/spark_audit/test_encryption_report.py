"""The ``encryption`` report over telemetry events made by the proxy's own event builders."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from sluice.proxy.telemetry.events import filter_entry, proxy_info, record_batch_event

pytestmark = pytest.mark.spark
PROXY = proxy_info("enc-test")
SHA = "00993fe2"


def batch(api: str, offsets: tuple[int, int] | None, detectors: dict[str, int],
          principal: str | None = None, topic: str = "payments", error_code: int = 0
          ) -> dict[str, Any]:
    first, last = offsets if offsets else (None, None)
    n = (last - first + 1) if first is not None and last is not None else 0
    return record_batch_event(
        PROXY, connection_id="c1", client_address="127.0.0.1:5", client_id="app",
        principal=principal, api=api, topic=topic, partition=0, offset_first=first,
        offset_last=last, records_in=n, records_out=n, bytes_in=0, bytes_out=0,
        filters=[filter_entry("encrypt-payments", SHA, rewritten=n, detectors=detectors)],
        error_code=error_code)


def test_key_versions_offsets_and_reads(spark: Any, tmp_path: Path) -> None:
    from sluice.spark_audit import load
    from sluice.spark_audit.encryption import encryption

    events = [
        batch("produce", (0, 99), {"encrypted": 100, "kek:payments:1": 100}),
        batch("produce", (100, 149), {"encrypted": 50, "kek:payments:1": 50}),
        batch("produce", (150, 159), {"encrypted": 10, "kek:payments:2": 10}),
        batch("produce", (0, 4), {}, topic="plain"),  # not encrypted: not in the report
        batch("fetch", (0, 159), {"decrypted": 160}, principal="User:billing-eu"),
        batch("fetch", (0, 159), {"withheld": 160}, principal="User:bob"),
        batch("fetch", None, {}, principal="User:billing-eu", error_code=56),
        batch("fetch", (0, 4), {}, principal="User:bob", topic="plain"),
    ]
    path = tmp_path / "events.jsonl"
    path.write_text("".join(json.dumps(e) + "\n" for e in events))
    df = load.prepare(load.read_raw(spark, str(path)))
    rows = [r.asDict() for r in encryption(df).collect()]
    encrypted = [(r["topic"], r["key_name"], r["key_version"], r["offset_first"],
                  r["offset_last"], r["records"], r["batches"])
                 for r in rows if r["section"] == "encrypted"]
    assert encrypted == [("payments", "payments", "1", 0, 149, 150, 2),
                         ("payments", "payments", "2", 150, 159, 10, 1)]
    read = {r["principal"]: (r["decrypted"], r["withheld"], r["unreadable"], r["failures"])
            for r in rows if r["section"] == "read"}
    assert read == {"User:billing-eu": (160, 0, 0, 1), "User:bob": (0, 160, 0, 0)}
