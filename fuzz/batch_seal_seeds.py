"""Seeds for fuzz/batch_seal_fuzz.c: fields-mode sections sealed by the real filter (with their
plaintext sections and documents) in fuzz/corpus/batch_seal, and the data key, AAD prefix and
header group the opener needs in fuzz/corpus/batch_seal.ctx (fuzz/README.md)."""

from __future__ import annotations

import struct
import tempfile
from pathlib import Path
from typing import Any

from sluice.codec.records import Record, encode_records
from sluice.crypto import batch_seal, record_filter
from sluice.crypto.kms import KmsSettings
from sluice.crypto.record_filter import EncryptRunner
from sluice.filters.config import FilterSpec
from sluice.filters.context import RecordContext

OUT = Path(__file__).resolve().parent / "corpus" / "batch_seal"
DOCS = [
    b'{"card": "4111 1111 1111 0007", "note": "xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx", '
    b'"a": {"b": [1, 2, "\xc3\xa9"]}}',
    b'{"a": {"b": "x"}, "card": 12}',
    b'{"card": {"z": [true, null, -1.5e3]}}',
    b'{"pad": "\\u00e9\\n", "card": ""}',
]


def main() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    seen: dict[str, Any] = {}
    opener = batch_seal.open_fields

    def spy(section: Any, count: int, key: bytes, prefix: bytes, group3: bytes,
            group3_count: int) -> Any:
        seen.update(key=key, prefix=prefix, group=group3, count=group3_count)
        return opener(section, count, key, prefix, group3, group3_count)

    record_filter.batch_seal.open_fields = spy  # type: ignore[assignment]
    with tempfile.TemporaryDirectory() as tmp:
        spec = FilterSpec(name="enc", module="builtin:encrypt", topics=("t",),
                          apply_to=frozenset({"produce", "fetch"}),
                          kms=KmsSettings("local", path=str(Path(tmp) / "keys.json")),
                          config={"key": "k", "decrypt_for": ["User:b"],
                                  "fields": ["card", "a.b"]})
        runner = EncryptRunner(spec, "enc")
        produce = RecordContext("t", 0, "produce", principal="User:a")
        fetch = RecordContext("t", 0, "fetch", principal="User:b")
        for n in range(1, 4):
            records = [Record(j, j, b"k%d" % j, DOCS[(n + j) % len(DOCS)], [("h", b"v" * j)], 0)
                       for j in range(n)]
            section = bytes(encode_records(records))
            sealed = runner.run_native(produce, section, n, 0, 0)
            assert sealed is not None and sealed.records is not None
            opened = runner.run_native(fetch, bytes(sealed.records), n, 0, 0)
            assert opened is not None and opened.records == section
            # first byte: the target (0 JSON scan, 1 opener, 2 sealer's plan) and the count
            (OUT / f"open{n}").write_bytes(bytes([1 | (n - 1) << 2]) + bytes(sealed.records))
            (OUT / f"seal{n}").write_bytes(bytes([2 | (n - 1) << 2]) + section)
    for k, doc in enumerate(DOCS):
        (OUT / f"json{k}").write_bytes(b"\x00" + doc)
    ctx = (seen["key"] + struct.pack("<I", len(seen["prefix"])) + seen["prefix"]
           + struct.pack("<II", len(seen["group"]), seen["count"]) + seen["group"])
    (OUT.parent / "batch_seal.ctx").write_bytes(ctx)
    print(f"{len(list(OUT.iterdir()))} seeds in {OUT}")


if __name__ == "__main__":
    main()
