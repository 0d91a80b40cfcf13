"""AWS KMS (``kms.type: aws``) through boto3.

Each Sluice key name is an alias, ``alias/<alias_prefix><name>`` (prefix ``sluice/`` by
default), pointing at the KMS key that is its current version; a version is a KMS key id, and
every KMS key behind a name carries the tags ``sluice:key-name=<name>`` and
``sluice:alias-prefix=<alias_prefix>`` (the deployment it belongs to: ``sluice keys`` touches
only keys of its own prefix; a key made by an older Sluice, without the prefix tag, counts as
the deployment's only while its alias points at it). Data keys come from
GenerateDataKey (AES_256) with the encryption context ``{"sluice:key": name}`` and are unwrapped
with Decrypt against the exact key id that wrapped them.

- rotate: a new KMS key tagged with the name, the alias moved to it; older keys keep
  decrypting what they wrapped. (AWS's own automatic rotation is transparent to Sluice and
  needs nothing here.)
- delete: every key of the name (and prefix) is recorded as destroyed, disabled at once and
  scheduled for deletion (7 days, the AWS minimum), and the alias removed. The record is
  twofold: the tag ``sluice:destroyed=<time>`` on the key, and an alias
  ``alias/<prefix>_destroyed/<key id>`` pointing at the deployment's registry key
  (``alias/<prefix>_registry``, a KMS key Sluice creates once and never uses to encrypt), which
  outlives the deleted key. Only a key recorded so reads as destroyed: a disabled or
  pending-deletion key with the tag, or a key id KMS no longer knows that has such an alias
  (checked with DescribeKey before each unwrap, so it holds even where a KMS would still
  decrypt for a disabled key). A key disabled by anyone else, an unknown key id (the wrong
  region) or an access refusal is a retriable error: never taken for shredding. AWS makes the
  deletion final only when the 7-day window ends; until then ``CancelKeyDeletion`` can undo
  it.

Calls time out after ``timeout_seconds`` (connect and read) with one retry; connection
failures, throttling and KMS internal errors are `KmsUnavailable`.
"""

from __future__ import annotations

import re
import time
from typing import Any, Final

from sluice.crypto.kms import (
    DataKey,
    KeyDestroyed,
    KeyInfo,
    KeyNotFound,
    KmsError,
    KmsSettings,
    KmsUnavailable,
    UnwrapFailed,
)

TAG: Final = "sluice:key-name"
PREFIX_TAG: Final = "sluice:alias-prefix"
DESTROYED_TAG: Final = "sluice:destroyed"
#: Alias suffixes of the deployment's registry of destroyed keys (under the alias prefix;
#: "_" cannot start a key name, so they never collide with one).
REGISTRY: Final = "_registry"
DESTROYED_DIR: Final = "_destroyed/"
_KEY_ID: Final = re.compile(r"^[A-Za-z0-9-]{1,128}$")
_KEY_NAME: Final = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,99}$")
_NOT_FOUND: Final = ("NotFoundException",)
_UNWRAP: Final = ("InvalidCiphertextException", "IncorrectKeyException")


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


class AwsKms:
    """A Kms backed by AWS KMS (or anything speaking its API at `endpoint_url`)."""

    kind = "aws"

    def __init__(self, settings: KmsSettings) -> None:
        try:
            import boto3
            from botocore.config import Config
        except ImportError:
            raise KmsUnavailable("kms.type aws needs boto3 (pip install boto3)") from None
        self.settings = settings
        self.prefix = settings.alias_prefix
        config = Config(connect_timeout=settings.timeout_seconds,
                        read_timeout=settings.timeout_seconds,
                        retries={"max_attempts": 2, "mode": "standard"})
        self._client: Any = boto3.client("kms", region_name=settings.region or "us-east-1",
                                         endpoint_url=settings.endpoint_url, config=config)

    def alias(self, name: str) -> str:
        return f"alias/{self.prefix}{name}"

    def _call(self, op: str, **kwargs: Any) -> Any:
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            return getattr(self._client, op)(**kwargs)
        except ClientError as exc:
            code = str(exc.response.get("Error", {}).get("Code", ""))
            text = f"AWS KMS {op}: {code}"
            if code in _NOT_FOUND:
                raise KeyNotFound(text) from None
            if code in _UNWRAP:
                raise UnwrapFailed(text) from None
            raise KmsUnavailable(text) from None
        except BotoCoreError as exc:
            raise KmsUnavailable(f"AWS KMS {op}: {type(exc).__name__}") from None

    # ------------------------------------------------------------------ data keys
    def generate_data_key(self, name: str) -> DataKey:
        try:
            out = self._call("generate_data_key", KeyId=self.alias(name), KeySpec="AES_256",
                             EncryptionContext={"sluice:key": name})
        except KeyNotFound:
            if not self.settings.auto_create:
                raise KeyNotFound(f"no KMS alias {self.alias(name)} (create it with `sluice "
                                  "keys create`, or set kms.auto_create)") from None
            self.create_key(name)
            out = self._call("generate_data_key", KeyId=self.alias(name), KeySpec="AES_256",
                             EncryptionContext={"sluice:key": name})
        version = str(out["KeyId"]).rsplit("/", 1)[-1]
        return DataKey(name, version, bytes(out["Plaintext"]), bytes(out["CiphertextBlob"]))

    def decrypt_data_key(self, name: str, version: str, wrapped: bytes) -> bytes:
        try:
            meta = self._call("describe_key", KeyId=version)["KeyMetadata"]
        except KeyNotFound:
            if self._recorded_destroyed(version):
                raise KeyDestroyed(f"KMS key {version} of {name!r} was deleted by sluice keys "
                                   "(AWS has completed the deletion)") from None
            raise
        state = meta.get("KeyState")
        if state != "Enabled":
            tags = self._call("list_resource_tags", KeyId=version).get("Tags", [])
            if state in ("Disabled", "PendingDeletion") and any(
                    t.get("TagKey") == DESTROYED_TAG for t in tags) and any(
                    t.get("TagKey") == TAG and t.get("TagValue") == name for t in tags):
                raise KeyDestroyed(f"KMS key {version} of {name!r} was deleted by sluice keys "
                                   f"({state})")
            raise KmsUnavailable(f"KMS key {version} of {name!r} is {state} (not deleted by "
                                 "sluice keys: enable it, or delete it with sluice keys)")
        out = self._call("decrypt", CiphertextBlob=wrapped, KeyId=version,
                         EncryptionContext={"sluice:key": name})
        return bytes(out["Plaintext"])

    # ------------------------------------------------------------------ destroyed keys
    def _destroyed_alias(self, key_id: str) -> str:
        return f"alias/{self.prefix}{DESTROYED_DIR}{key_id}"

    def _recorded_destroyed(self, key_id: str) -> bool:
        """Whether `sluice keys delete` recorded `key_id` in this deployment's registry."""
        if not _KEY_ID.match(key_id):
            return False  # not a key id (an edited header): no such record can exist
        try:
            self._call("describe_key", KeyId=self._destroyed_alias(key_id))
        except KeyNotFound:
            return False
        return True

    def _registry_key(self) -> str:
        """The deployment's registry key id (created on first use)."""
        alias = f"alias/{self.prefix}{REGISTRY}"
        try:
            return str(self._call("describe_key", KeyId=alias)["KeyMetadata"]["KeyId"])
        except KeyNotFound:
            pass
        key_id = str(self._call(
            "create_key", Description="Sluice: registry of destroyed key-encryption keys "
            "(holds no data; do not delete)", KeyUsage="ENCRYPT_DECRYPT",
            Tags=[{"TagKey": PREFIX_TAG, "TagValue": self.prefix}])["KeyMetadata"]["KeyId"])
        try:
            self._call("create_alias", AliasName=alias, TargetKeyId=key_id)
        except KmsError:
            # Another process created it first: use theirs, retire ours.
            self._call("schedule_key_deletion", KeyId=key_id, PendingWindowInDays=7)
            return str(self._call("describe_key", KeyId=alias)["KeyMetadata"]["KeyId"])
        return key_id

    def _record_destroyed(self, key_id: str) -> None:
        """Record `key_id` as destroyed by Sluice, in a form that outlives the key."""
        if self._recorded_destroyed(key_id):
            return
        self._call("create_alias", AliasName=self._destroyed_alias(key_id),
                   TargetKeyId=self._registry_key())

    # ------------------------------------------------------------------ management
    def _keys_of(self, name: str) -> list[dict[str, Any]]:
        """KeyMetadata of every KMS key of `name` in this deployment (tagged with `name` and
        this alias prefix, or an untagged older key the alias points at), oldest first."""
        current = self._aliases().get(name)
        found: list[dict[str, Any]] = []
        paginator = self._client.get_paginator("list_keys")
        try:
            pages = list(paginator.paginate())
        except Exception as exc:
            raise KmsUnavailable(f"AWS KMS list_keys: {type(exc).__name__}") from None
        for page in pages:
            for key in page.get("Keys", []):
                tags = {t.get("TagKey"): t.get("TagValue") for t in self._call(
                    "list_resource_tags", KeyId=key["KeyId"]).get("Tags", [])}
                if tags.get(TAG) != name:
                    continue
                prefix = tags.get(PREFIX_TAG)
                if prefix == self.prefix or (prefix is None and key["KeyId"] == current):
                    found.append(self._call("describe_key", KeyId=key["KeyId"])["KeyMetadata"])
        found.sort(key=lambda m: str(m.get("CreationDate", "")))
        return found

    def _aliases(self) -> dict[str, str]:
        """Sluice key name -> current KMS key id, from the aliases under the prefix."""
        out: dict[str, str] = {}
        marker: dict[str, Any] = {}
        while True:
            page = self._call("list_aliases", **marker)
            for a in page.get("Aliases", []):
                alias = str(a.get("AliasName", ""))
                rest = alias[len(f"alias/{self.prefix}"):]
                if alias.startswith(f"alias/{self.prefix}") and a.get("TargetKeyId") and (
                        _KEY_NAME.match(rest)):  # not the registry's own aliases
                    out[rest] = str(a["TargetKeyId"])
            if not page.get("Truncated"):
                return out
            marker = {"Marker": page["NextMarker"]}

    def _info(self, name: str, current: str | None) -> KeyInfo:
        metas = self._keys_of(name)
        live = tuple(str(m["KeyId"]) for m in metas if m.get("KeyState") == "Enabled")
        dead = tuple(str(m["KeyId"]) for m in metas if m.get("KeyState") != "Enabled")
        created = str(metas[0].get("CreationDate")) if metas else None
        return KeyInfo(name, current, live, dead, created)

    def list_keys(self) -> list[KeyInfo]:
        return [self._info(name, key_id) for name, key_id in sorted(self._aliases().items())]

    def _new_key(self, name: str) -> str:
        meta = self._call("create_key", Description=f"Sluice key-encryption key {name}",
                          KeyUsage="ENCRYPT_DECRYPT",
                          Tags=[{"TagKey": TAG, "TagValue": name},
                                {"TagKey": PREFIX_TAG, "TagValue": self.prefix}])["KeyMetadata"]
        return str(meta["KeyId"])

    def create_key(self, name: str) -> KeyInfo:
        current = self._aliases().get(name)
        if current is None:
            current = self._new_key(name)
            try:
                self._call("create_alias", AliasName=self.alias(name), TargetKeyId=current)
            except KmsError:
                # Another process created the alias first: use theirs, retire ours.
                self._call("schedule_key_deletion", KeyId=current, PendingWindowInDays=7)
                current = self._aliases().get(name)
        return self._info(name, current)

    def rotate_key(self, name: str) -> KeyInfo:
        if name not in self._aliases():
            raise KeyNotFound(f"no KMS alias {self.alias(name)}")
        current = self._new_key(name)
        self._call("update_alias", AliasName=self.alias(name), TargetKeyId=current)
        return self._info(name, current)

    def delete_key(self, name: str) -> KeyInfo:
        metas = self._keys_of(name)
        if name not in self._aliases() and not metas:
            raise KeyNotFound(f"no KMS alias {self.alias(name)}")
        for meta in metas:
            if meta.get("KeyState") in ("Enabled", "Disabled"):
                # Recorded first: only a key Sluice marked reads as shredded, and the
                # registry alias keeps saying so once AWS has deleted the key.
                self._record_destroyed(str(meta["KeyId"]))
                self._call("tag_resource", KeyId=meta["KeyId"],
                           Tags=[{"TagKey": DESTROYED_TAG, "TagValue": _now()}])
            if meta.get("KeyState") == "Enabled":
                self._call("disable_key", KeyId=meta["KeyId"])
            if meta.get("KeyState") != "PendingDeletion":
                self._call("schedule_key_deletion", KeyId=meta["KeyId"], PendingWindowInDays=7)
        if name in self._aliases():
            self._call("delete_alias", AliasName=self.alias(name))
        return self._info(name, None)
