"""The pass-through fast path's readers: the native ones (codec/passthrough.c, built at
install as `sluice.codec._passthrough`) where built, else the Python readers they stand in
for. Every relayed request's header, and every Produce request's acks and topic name, are
read through here (issue 29: on a loaded machine a pass-through request costs what its
Python costs, bytecode by bytecode, and these readers were a third of it); so is a filtered
Produce request's layout (`scan_layout`: where each partition's records are).

The native readers answer only the common case and hand anything else back (None) to the
Python reader, which stays the reference for every error and rare encoding; so both give the
same answers (tests/codec/test_passthrough_native.py). The Produce and Fetch responses' tag
checks call the native module from their own modules (`produce_offsets.py`,
`fetch_splice.py`), which import it directly.
"""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType

from .errors import UnsupportedVersion
from .headers import RequestHeader, _request_flexible, parse_request_header
from .produce_splice import (
    PartitionSlot,
    ProduceRequestLayout,
    ProduceTopics,
    TopicSlot,
    _shape,
    produce_head,
    produce_topics,
    scan_produce_request,
)

Buffer = bytes | bytearray | memoryview

native: ModuleType | None
try:
    from . import _passthrough as native  # type: ignore[attr-defined, no-redef, unused-ignore]
except ImportError:  # not built (scripts/dev.sh install builds it): the Python readers
    native = None


def _produce_shapes() -> bytes:
    """Per Produce request version (index), what the native reader may read: 0 none (not
    supported, or topics by id), 1 the classic body, 2 the flexible one by name."""
    shapes = bytearray(64)
    for version in range(64):
        try:
            flexible, by_id = _shape(version)
        except UnsupportedVersion:
            continue
        shapes[version] = 0 if by_id else 2 if flexible else 1
    return bytes(shapes)


if native is not None:
    native.setup(RequestHeader, ProduceTopics, _request_flexible, _produce_shapes(),
                 ProduceRequestLayout, TopicSlot, PartitionSlot)

#: The request header of a frame, or None (then `parse_request_header` reads it, raising what
#: it raises). Without the native module it is `parse_request_header` itself (never None).
request_header: Callable[[Buffer], RequestHeader | None] = (
    native.request_header if native is not None else parse_request_header)


def _python_head(frame: Buffer, start: int, version: int) -> ProduceTopics | None:
    return produce_head(version, frame[start:])


#: The acks and one topic name of the Produce request body at `start` of `frame`, or None
#: (`read_produce_topics` then decides).
produce_head_at: Callable[[Buffer, int, int], ProduceTopics | None] = (
    native.produce_head if native is not None else _python_head)


def read_produce_topics(frame: Buffer, start: int, version: int) -> ProduceTopics:
    """The acks and topic keys of the Produce request body at `start` of `frame` (what
    `produce_head_at` handed back), through the Python readers."""
    body = frame[start:]
    return produce_head(version, body) or produce_topics(version, body)


#: The layout of a Produce request body (`version`, `body`: the arguments of
#: `scan_produce_request`), or None (then `scan_produce_request` scans it, raising what it
#: raises). The records are slices of `body` (itself when it is a memoryview), as there.
#: Without the native module it is `scan_produce_request` itself (never None).
scan_layout: Callable[[int, Buffer], ProduceRequestLayout | None] = (
    native.scan_produce_request if native is not None else scan_produce_request)
