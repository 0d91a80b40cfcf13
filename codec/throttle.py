"""`throttle_time_ms` of Produce and Fetch responses, read and set in place.

Quota throttling (proxy/ops/quotas.py) tells a client how long it is held back the way a Kafka
broker does: in the response's `throttle_time_ms`. The response is otherwise relayed as the
broker's bytes, so the field is found without decoding the response:

- Fetch (every version the codec supports, v4+): the first field of the body, right after the
  response header (whose tagged fields, in flexible versions, are skipped).
- Produce (v3+): just after the `responses` array, found by the Produce response scan
  (`produce_offsets.produce_responses_end`); flexible versions put the top-level tagged fields
  (KIP-951 node endpoints) after it.

`with_throttle` keeps the larger of the broker's value and the proxy's, so a client throttled
by both waits for the longer of the two, as it would facing either alone.

Since KIP-219 (Produce v6, Fetch v8) a broker sends a throttled response at once and then
stops reading from the connection for the throttle time, and clients back off too; before,
the broker held the response back instead. `sends_before_throttling` says which applies.
"""

from __future__ import annotations

import struct

from .errors import DecodeError
from .headers import response_header_size
from .messages import ApiKey
from .produce_offsets import produce_responses_end

__all__ = ["sends_before_throttling", "throttle_offset", "with_throttle"]

Buffer = bytes | bytearray | memoryview

_PRODUCE = int(ApiKey.PRODUCE)
_FETCH = int(ApiKey.FETCH)
_I32 = struct.Struct(">i")
#: First versions whose responses are sent before the broker throttles (KIP-219).
_KIP219 = {_PRODUCE: 6, _FETCH: 8}


def sends_before_throttling(api_key: int, api_version: int) -> bool:
    """True: respond at once, then mute the connection; False: delay the response."""
    return api_version >= _KIP219[api_key]


def throttle_offset(api_key: int, api_version: int, frame: Buffer) -> int:
    """Position of `throttle_time_ms` in a Produce or Fetch response frame (header included).

    Raises DecodeError for a frame too short or inconsistent to hold it."""
    header = response_header_size(frame, api_key, api_version)
    if api_key == _FETCH:
        at = header
    elif api_key == _PRODUCE:
        at = header + produce_responses_end(api_version, memoryview(frame)[header:])
    else:
        raise ValueError(f"api key {api_key} has no throttle time here")
    if at + 4 > len(frame):
        raise DecodeError("response ends before throttle_time_ms")
    return at


def with_throttle(
    api_key: int, api_version: int, frame: Buffer, throttle_ms: int
) -> tuple[bytes | memoryview, int]:
    """The frame with `throttle_time_ms` set to max(the broker's, `throttle_ms`), and that
    value. The original when the broker's value is already the larger; otherwise a copy (the
    original may be a read-only view of the broker's bytes)."""
    at = throttle_offset(api_key, api_version, frame)
    broker_ms = _I32.unpack_from(frame, at)[0]
    value = max(broker_ms, min(throttle_ms, 2**31 - 1))
    if value == broker_ms:
        return frame if isinstance(frame, bytes) else memoryview(frame), value
    out = bytearray(frame)
    _I32.pack_into(out, at, value)
    return memoryview(out), value
