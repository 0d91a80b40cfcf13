"""A path's response frame as one bytes object, whether it came as one buffer or as `Pieces`
(a spliced Fetch response, written in order and never joined by the proxy)."""

from __future__ import annotations

from sluice.proxy.paths.base import Frame, Pieces


def joined(frame: Frame | Pieces) -> bytes:
    """The bytes the client gets for `frame`."""
    return b"".join(frame) if isinstance(frame, tuple) else bytes(frame)
