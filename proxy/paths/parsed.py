"""What has been parsed of a request, kept on its exchange so that no frame is parsed twice.

The internal-topics path reads a Produce request's acks and topic names; the Produce path
needs its acks (unfiltered) or its whole layout (filtered); the internal-topics path needs
the layout again to answer a protected topic's partitions. Each asks here: the first parse
is kept on the `Exchange` with the frame it was made from, and any later ask about the same
frame reuses it (a path that hands another frame on, with partitions taken out, gets that
frame parsed afresh).
"""

from __future__ import annotations

from sluice.codec.peek import produce_acks
from sluice.codec.produce_splice import (
    ProduceRequestLayout,
    ProduceTopics,
    produce_head,
    produce_topics,
    scan_produce_request,
)
from sluice.proxy.paths.base import Exchange, Frame


def produce_topics_of(exchange: Exchange, frame: Frame) -> ProduceTopics:
    """The acks and topic keys of the Produce request `frame` (CodecError if malformed)."""
    kept = exchange.parsed
    if kept is not None and kept[0] is frame:
        value = kept[1]
        if type(value) is ProduceTopics:
            return value
        if type(value) is ProduceRequestLayout:
            keys = [t.name if t.name is not None else t.topic_id for t in value.topics]
            # The scan refuses a topic with neither (a null name): no None here.
            return ProduceTopics(value.acks, [k for k in keys if k is not None])
    header = exchange.header
    body = frame[header.header_size :]
    # One topic (the common case): its name is read from the head, the rest is not walked.
    read = produce_head(header.api_version, body) or produce_topics(header.api_version, body)
    exchange.parsed = (frame, read)
    return read


def produce_layout_of(exchange: Exchange, frame: Frame) -> ProduceRequestLayout:
    """The layout of the Produce request `frame` (CodecError if malformed)."""
    kept = exchange.parsed
    if kept is not None and kept[0] is frame and type(kept[1]) is ProduceRequestLayout:
        return kept[1]
    header = exchange.header
    layout = scan_produce_request(header.api_version, frame[header.header_size :])
    exchange.parsed = (frame, layout)
    return layout


def produce_acks_of(exchange: Exchange, frame: Frame) -> int:
    """The acks of the Produce request `frame`: from what was parsed of it, or read alone."""
    kept = exchange.parsed
    if kept is not None and kept[0] is frame:
        return int(kept[1].acks)
    header = exchange.header
    return produce_acks(frame[header.header_size :], header.flexible)
