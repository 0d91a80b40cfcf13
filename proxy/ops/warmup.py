"""Preparing the codec for the APIs every client uses, in small steps, after start-up.

The first Produce of each version through a fresh proxy used to take 30-70 ms while kio
imported its schema modules and the codec generated the guard's scanners and kio's reader.
`warm` does that work on the event loop once the listeners are open, one message version per
loop iteration, so a client is never kept waiting more than one step (a few ms). A thread was
tried first: its imports held the GIL in long stretches and a request arriving at start-up
waited over a second. A request that arrives before its schema's turn prepares it itself, as
before. When all are done the proxy freezes its heap out of the cyclic GC, schemas included.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator

from sluice.codec.messages import ApiKey, codec_version_range, prepare
from sluice.proxy.telemetry.logs import log

# (api key, request side?, encoded by the proxy too?): what the proxy decodes on its hot
# paths: Produce requests (filters) and responses (telemetry, endpoint check), Fetch responses
# (filters), Metadata and ApiVersions responses (rewritten for every client).
HOT: tuple[tuple[ApiKey, bool, bool], ...] = (
    (ApiKey.API_VERSIONS, False, True),
    (ApiKey.METADATA, True, False),
    (ApiKey.METADATA, False, True),
    (ApiKey.PRODUCE, True, True),
    (ApiKey.PRODUCE, False, False),
    (ApiKey.FETCH, False, True),
)


def hot_messages() -> Iterator[tuple[ApiKey, int, bool, bool]]:
    """(api key, version, request?, encode?) for every version of the HOT messages."""
    for key, request, encode in HOT:
        versions = codec_version_range(key)
        if versions is None:
            continue
        for version in range(versions[0], versions[1] + 1):
            yield key, version, request, encode


async def warm(on_done: Callable[[int], None]) -> int:
    """Prepare every HOT message version, yielding to the loop after each; then call
    ``on_done(count)``. Returns the count."""
    count = 0
    try:
        for key, version, request, encode in hot_messages():
            prepare(key, version, request, encode)
            count += 1
            await asyncio.sleep(0)
    except Exception as exc:  # a warm-up failure only costs the lazy path its first use
        log.warning("codec_warmup_failed", error=repr(exc), prepared=count)
    on_done(count)
    return count
