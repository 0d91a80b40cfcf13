"""The KMS contract the encryption filter and ``sluice keys`` use, its errors, and the
top-level ``kms:`` config section.

A KMS holds key-encryption keys (KEKs) by name, each with versions; it makes data keys
(`generate_data_key`: a fresh 256-bit key plus that key wrapped by the name's current KEK
version) and unwraps them (`decrypt_data_key`). The proxy never sees KEK material from AWS;
the `local` keyring keeps it in a 0600 file.

    kms:
      type: local                 # or aws
      path: keys.json             # local: the keyring file (relative to the config file)
      auto_create: true           # create a KEK the first time a name is used
      # aws: region, endpoint_url, alias_prefix, timeout_seconds (credentials: boto3's usual
      # chain: environment, profile, instance role)

Errors say what the caller may do: `KmsUnavailable` is retriable (refuse with a retriable
Kafka error, never store or deliver anything in the clear). `KeyDestroyed` is raised only for
a KEK Sluice itself recorded as destroyed (``sluice keys delete``): its records are unreadable
for good (crypto-shredding). `KeyNotFound` means the KMS does not know the name or version
(the wrong keyring file or region, a restored backup, not created yet): the proxy treats it
as retriable too, never as shredding. `UnwrapFailed` means the wrapped data key is not one
this KMS made (tampering).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, Protocol

from sluice.filters.yaml_lines import ConfigError, FieldPath, LineMap

KMS_TYPES: Final = ("local", "aws")
_LOCAL_KEYS: Final = ("type", "path", "auto_create")
_AWS_KEYS: Final = ("type", "region", "endpoint_url", "alias_prefix", "auto_create",
                    "timeout_seconds")
DEFAULT_ALIAS_PREFIX: Final = "sluice/"


class KmsError(Exception):
    """Base of KMS failures. Messages name keys, never key material."""


class KmsUnavailable(KmsError):
    """The KMS could not be reached or answered with a transient error: retry later."""


class KeyNotFound(KmsError):
    """No KEK of that name (or that version) is known here (not proof of deletion)."""


class KeyDestroyed(KmsError):
    """The KEK (version) was destroyed by ``sluice keys delete``: what it wrapped cannot be
    read any more."""


class UnwrapFailed(KmsError):
    """The wrapped data key failed authentication under the named KEK."""


@dataclass(frozen=True, slots=True)
class DataKey:
    """A fresh data key: `plaintext` (32 bytes, kept in memory only) and `wrapped`."""

    key_name: str
    key_version: str
    plaintext: bytes
    wrapped: bytes

    def __repr__(self) -> str:  # never print key material
        return f"DataKey({self.key_name!r}, version={self.key_version!r})"


@dataclass(frozen=True, slots=True)
class KeyInfo:
    """One KEK as ``sluice keys list`` shows it."""

    name: str
    current_version: str | None
    versions: tuple[str, ...]
    destroyed_versions: tuple[str, ...] = ()
    created: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return {"name": self.name, "current_version": self.current_version,
                "versions": list(self.versions),
                "destroyed_versions": list(self.destroyed_versions), "created": self.created}


class Kms(Protocol):
    """What a KMS offers (implementations: kms_local.LocalKeyring, kms_aws.AwsKms)."""

    kind: str

    def generate_data_key(self, name: str) -> DataKey: ...

    def decrypt_data_key(self, name: str, version: str, wrapped: bytes) -> bytes: ...

    def list_keys(self) -> list[KeyInfo]: ...

    def create_key(self, name: str) -> KeyInfo: ...

    def rotate_key(self, name: str) -> KeyInfo: ...

    def delete_key(self, name: str) -> KeyInfo: ...


@dataclass(frozen=True, slots=True)
class KmsSettings:
    """The validated ``kms:`` section (hashable: one client per distinct settings)."""

    type: str
    path: str | None = None
    auto_create: bool = True
    region: str | None = None
    endpoint_url: str | None = None
    alias_prefix: str = DEFAULT_ALIAS_PREFIX
    timeout_seconds: float = 5.0


def parse_kms_section(raw: Any, lines: LineMap, base_dir: Path | None,
                      prefix: FieldPath = ("kms",)) -> KmsSettings | None:
    """Validate ``kms:`` (None when absent); ConfigError names file, line and field."""
    if raw is None:
        return None
    if not isinstance(raw, Mapping):
        raise lines.error(prefix, "must be a mapping")
    kind = raw.get("type", "local")
    if kind not in KMS_TYPES:
        raise lines.error((*prefix, "type"),
                          f"unknown KMS type {kind!r} (expected {', '.join(KMS_TYPES)})")
    allowed = _LOCAL_KEYS if kind == "local" else _AWS_KEYS
    for key in raw:
        if key not in allowed:
            raise lines.error((*prefix, str(key)),
                              f"unknown key for type {kind} (expected {', '.join(allowed)})")

    def text(key: str, required: bool = False) -> str | None:
        value = raw.get(key)
        if value is None:
            if required:
                raise lines.error((*prefix, key), f"required for type {kind}")
            return None
        if not isinstance(value, str) or not value.strip():
            raise lines.error((*prefix, key), "must be a non-empty string")
        return value

    auto_create = raw.get("auto_create", kind == "local")
    if not isinstance(auto_create, bool):
        raise lines.error((*prefix, "auto_create"), "must be true or false")
    if kind == "local":
        path = text("path", required=True)
        assert path is not None
        p = Path(path).expanduser()
        if not p.is_absolute() and base_dir is not None:
            p = base_dir / p
        return KmsSettings("local", path=str(p), auto_create=auto_create)
    timeout = raw.get("timeout_seconds", 5.0)
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not (
            0 < timeout <= 60):
        raise lines.error((*prefix, "timeout_seconds"), "must be a number of seconds in (0, 60]")
    endpoint = text("endpoint_url")
    if endpoint is not None and not endpoint.startswith(("http://", "https://")):
        raise lines.error((*prefix, "endpoint_url"), "must be an http:// or https:// URL")
    alias_prefix = raw.get("alias_prefix", DEFAULT_ALIAS_PREFIX)
    if not isinstance(alias_prefix, str):
        raise lines.error((*prefix, "alias_prefix"), "must be a string")
    return KmsSettings("aws", auto_create=auto_create, region=text("region"),
                       endpoint_url=endpoint, alias_prefix=alias_prefix,
                       timeout_seconds=float(timeout))


def settings_from_mapping(raw: Mapping[str, Any], source: str = "<kms>") -> KmsSettings:
    """`parse_kms_section` for code and tests (relative paths stay as given)."""
    settings = parse_kms_section(raw, LineMap(source), None, ())
    if settings is None:
        raise ConfigError(source, None, "kms", "missing")
    return settings
