"""Exception hierarchy of the codec.

Every failure the codec reports derives from `CodecError`, so that the proxy can catch one
type and fall back to forwarding raw bytes (or answer with a Kafka error) instead of crashing.
"""

from __future__ import annotations


class CodecError(Exception):
    """Base of every error raised by sluice.codec."""


class DecodeError(CodecError):
    """Bytes that do not parse as the expected protocol structure."""


class EncodeError(CodecError):
    """A value that cannot be serialised (wrong types, out-of-range integers, ...)."""


class UnsupportedVersion(CodecError):
    """An API key or version for which the codec has no schema."""


class CorruptBatch(DecodeError):
    """A record batch with bad lengths, a legacy magic byte or undecodable records."""


class BatchTooLarge(CorruptBatch):
    """A record batch that declares or decompresses to more than the limits allow
    (`batch_limits.BatchLimits`): refused before the work, not because it is malformed. A
    `CorruptBatch`, so that every caller that refuses corrupt batches refuses these too."""


class UnsupportedCompression(CodecError):
    """A record batch compressed with a codec id the codec does not know (> 4)."""


class FrameError(CodecError, ValueError):
    """A frame whose declared size is not acceptable."""


class FrameTooLarge(FrameError):
    """A frame whose declared size exceeds the configured maximum (or is negative)."""
