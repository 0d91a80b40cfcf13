"""Test helpers that read or edit the proxy's header group of a stored record, whatever its
layout (crypto/envelope.py), so tests that tamper with a field of the envelope (the wrapped
data key, the KEK version, the filter's name) say which field, not where a layout keeps it."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from sluice.crypto.envelope import Header, find_envelope, headers_for


def wrapped_dek(headers: Sequence[Header]) -> bytes:
    """The wrapped data key a stored record names."""
    env = find_envelope(headers)
    assert env is not None, "record has no encryption headers"
    return env.wrapped_dek


def edit_envelope(headers: Sequence[Header], **changes: Any) -> list[Header]:
    """`headers` with the proxy's group rewritten (same layout) with `changes` applied to its
    Envelope fields (`key_version`, `wrapped_dek`, `filter_name`, ...)."""
    env = find_envelope(headers)
    assert env is not None, "record has no encryption headers"
    edited = dataclasses.replace(env, **changes)
    return [*headers[:env.start], *headers_for(edited)]
