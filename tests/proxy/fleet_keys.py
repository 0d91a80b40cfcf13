"""Key pairs for fleet tests: one operator key (signs `sluice filter deploy/remove`) and one
proxy key (signs the data policies set through the proxies), made once per test session."""

from __future__ import annotations

import functools
import json
import tempfile
from pathlib import Path

from sluice.proxy.ops.fleet_signing import SigningKey, generate_key_files


@functools.cache
def _dir() -> Path:
    return Path(tempfile.mkdtemp(prefix="sluice-fleet-keys-"))


@functools.cache
def operator() -> SigningKey:
    return generate_key_files(_dir() / "operator.key", "operator")


@functools.cache
def proxy_key() -> SigningKey:
    return generate_key_files(_dir() / "proxy.key", "proxy")


@functools.cache
def intruder() -> SigningKey:
    """A key no proxy trusts."""
    return generate_key_files(_dir() / "intruder.key", "intruder")


def trust_yaml(indent: str = "  ") -> str:
    """The lines of a ``fleet:`` section that trust the operator and sign with the proxy key."""
    keys = json.dumps([operator().public, f"{proxy_key().path}.pub"])
    return (f"{indent}trusted_keys: {keys}\n"
            f"{indent}signing_key: {json.dumps(proxy_key().path)}\n")
