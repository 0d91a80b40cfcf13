"""atheris target: record batches (split, CRC, decompress, decode, rebuild).

    python fuzz/fuzz_records.py -max_total_time=600 fuzz/corpus/records

Properties: split_batches/decode_records raise nothing but CodecError (decompression bombs
are capped, legacy magic and unknown codecs refused); a batch that decodes rebuilds (as a
plain list, so it is re-compressed) into a batch that decodes to the same records with the
same header fields.
"""

from __future__ import annotations

import _common
import atheris

with atheris.instrument_imports(include=["sluice"]):
    from sluice.codec.errors import CodecError
    from sluice.codec.records import (
        Record,
        build_batch,
        decode_records,
        split_batches,
        verify_crc,
    )


def _fields(records: list[Record]) -> list[tuple[object, ...]]:
    return [(r.offset_delta, r.timestamp_delta, r.key, r.value, list(r.headers)) for r in records]


def test_one_input(data: bytes) -> None:
    try:
        batches, _tail = split_batches(data)
    except CodecError:
        return
    for batch in batches:
        verify_crc(batch.data)
        try:
            records = decode_records(batch)
        except CodecError:
            continue
        rebuilt = build_batch(batch.header, list(records))
        (again,), tail = split_batches(rebuilt)
        assert not len(tail)
        assert verify_crc(rebuilt)
        assert _fields(decode_records(again)) == _fields(records), "rebuild changed records"
        h1, h2 = batch.header, again.header
        assert (h1.base_offset, h1.producer_id, h1.base_sequence, h1.last_offset_delta) == (
            h2.base_offset,
            h2.producer_id,
            h2.base_sequence,
            h2.last_offset_delta,
        )


if __name__ == "__main__":
    _common.run(test_one_input)
