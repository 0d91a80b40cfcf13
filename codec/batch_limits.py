"""How far one record batch may expand: decompressed bytes and records (`BatchLimits`), and the
checks made on a batch's header before any of its records are decompressed or parsed.

Why: a batch is cheap to send and dear to open. 976 bytes of zstd inflate to 10 MiB of
Kafka's smallest records (7 bytes each: 1.5 million of them), and the decoding path builds
Python objects per record (several hundred bytes each). So a batch declaring more records than
`max_records` is refused from its header alone, decompression stops at `max_bytes`, and a
declared count the bytes cannot hold is refused before anything parses it.

Defaults, and why:
- `max_bytes` 32 MiB: Kafka's brokers and producers cap a batch at about 1 MiB on the wire
  (`message.max.bytes`, `max.request.size`, librdkafka's `message.max.bytes`); 32 MiB leaves
  room for a compression ratio of 32 over that, beyond what real text and JSON reach, and
  bounds the memory of one batch in a filter thread.
- `max_records` 100 000: a default-sized batch holds at most ~2 300 records (16 KiB, Java
  and the Python clients) or 10 000 (librdkafka's `batch.num.messages`). At 100 000 records
  of 30 bytes that a filter rewrites, the native path costs ~0.05 s of CPU and ~30 MiB, the
  decoding path (Python objects per record) ~0.7 s and ~40 MiB; 1.5 million cost it 10 s
  and 900 MiB.

- `max_headers` 200 000 (all records' headers together): a header takes only 2 bytes, so
  within the other two limits one record can carry 16 million of them, and the decoding path
  builds an object per header (~90 bytes: 3 million cost +280 MiB). Real batches carry a few
  per record (tracing, content type): 200 000 is 20 per record at librdkafka's 10 000.

`max_records` applies to every batch; `max_bytes` only to what decompression produces
(uncompressed bytes are bounded by the frame size limit already); `max_headers` is counted by
the record check that every batch passes before a filter sees it (codec/record_check.c).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from .errors import BatchTooLarge, CorruptBatch

__all__ = [
    "DEFAULT_BATCH_LIMITS",
    "DEFAULT_MAX_BATCH_BYTES",
    "DEFAULT_MAX_BATCH_HEADERS",
    "DEFAULT_MAX_BATCH_RECORDS",
    "MIN_RECORD_SIZE",
    "BatchLimits",
    "check_count",
    "check_section_size",
    "headers_too_many",
]

DEFAULT_MAX_BATCH_BYTES: Final = 32 * 1024 * 1024
DEFAULT_MAX_BATCH_RECORDS: Final = 100_000
DEFAULT_MAX_BATCH_HEADERS: Final = 200_000

#: Kafka's smallest record: a length, attributes, timestamp delta, offset delta, null key,
#: null value and header count, one byte each.
MIN_RECORD_SIZE: Final = 7


@dataclass(frozen=True, slots=True)
class BatchLimits:
    """What one batch may expand into (the proxy's `limits.max_batch_bytes`,
    `limits.max_batch_records` and `limits.max_batch_headers`)."""

    max_bytes: int = DEFAULT_MAX_BATCH_BYTES
    max_records: int = DEFAULT_MAX_BATCH_RECORDS
    max_headers: int = DEFAULT_MAX_BATCH_HEADERS

    def __post_init__(self) -> None:
        if self.max_bytes < 1 or self.max_records < 1 or self.max_headers < 0:
            raise ValueError("batch limits must be at least 1")


DEFAULT_BATCH_LIMITS: Final = BatchLimits()


def check_count(count: int, limits: BatchLimits) -> None:
    """Refuse a declared record count before any record is read: negative is `CorruptBatch`,
    above `limits.max_records` is `BatchTooLarge`."""
    if count < 0:
        raise CorruptBatch(f"negative record count {count}")
    if count > limits.max_records:
        raise BatchTooLarge(
            f"record batch declares {count} records; at most {limits.max_records} per batch "
            "are accepted (limits.max_batch_records)"
        )


def check_section_size(count: int, size: int) -> None:
    """Refuse a records section of `size` bytes that cannot hold `count` records (each takes
    at least MIN_RECORD_SIZE bytes), or that holds bytes while declaring no record."""
    if count * MIN_RECORD_SIZE > size:
        raise CorruptBatch(
            f"record batch declares {count} records in {size} bytes (a record takes at least "
            f"{MIN_RECORD_SIZE})"
        )
    if count == 0 and size:
        raise CorruptBatch(f"record batch declares no record but holds {size} bytes of records")


def headers_too_many(max_headers: int) -> BatchTooLarge:
    """The refusal of a batch whose records carry more than `max_headers` headers."""
    return BatchTooLarge(
        f"record batch holds more than {max_headers} record headers "
        "(limits.max_batch_headers)"
    )
