"""``builtin:encrypt``: the host filter that encrypts records on produce and decrypts them on
fetch for the principals in ``decrypt_for``.

    filters:
      - name: encrypt-payments
        module: builtin:encrypt
        topics: ["payments.*"]
        apply_to: [produce, fetch]
        config:
          key: payments                 # KEK name in the KMS (letters, digits, _ and -)
          decrypt_for: ["User:billing-*"]
          fields: ["card", "iban"]      # optional: JSON fields only (dotted paths)
          data_key_max_records: 16777216
          data_key_max_age_seconds: 3600
          data_key_cache_seconds: 60

Produce: every record with a value gets the envelope of crypto/envelope.py (whole value, or
the listed JSON fields); record keys and the producer's headers stay as they were; null values
(tombstones) stay null. A batch's record count, offsets, producer id, epoch and sequence are
untouched (the pipeline rebuilds the batch around the rewritten records). A value that is not
a JSON object in fields mode is rejected (the partition fails with INVALID_RECORD): storing it
in the clear could leak the fields it was meant to hide.

Fetch: for a principal matching ``decrypt_for`` each encrypted record becomes exactly what was
produced (value and headers); other principals get the stored records unchanged.

Fail closed, with the Kafka error the pipeline puts on the partition:
- KMS unreachable on produce, or while an allowed principal fetches: 56 KAFKA_STORAGE_ERROR
  (retriable); nothing is stored or delivered in the clear.
- A stored record that fails authentication (edited in the broker) while an allowed principal
  fetches: 2 CORRUPT_MESSAGE for the partition, counted, never delivered as data.
- A record whose KEK was deleted (crypto-shredding): delivered as stored (ciphertext with its
  ``sluice.enc`` headers), counted as ``unreadable``, so consumers move past it.

Counters (telemetry ``detectors``): produce ``encrypted``, ``fields_encrypted`` and
``kek:<name>:<version>`` (records sealed under that KEK version, so the event's offsets say
which key version encrypted which offsets); fetch ``decrypted``, ``withheld`` (encrypted
records a principal outside ``decrypt_for`` received as stored) and ``unreadable``.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from fnmatch import translate
from typing import Any, Final

from sluice.crypto.data_keys import (
    DEFAULT_CACHE_SECONDS,
    DEFAULT_MAX_AGE_SECONDS,
    DEFAULT_MAX_RECORDS,
    DataKeys,
)
from sluice.crypto.envelope import (
    MODE_FIELDS,
    MODE_VALUE,
    NONCE_SIZE,
    Envelope,
    EnvelopeError,
    aad_prefix,
    find_envelope,
    group_start,
    headers_for,
    open_value,
    seal_value,
)
from sluice.crypto.json_fields import (
    NotJsonObject,
    decrypt_fields,
    encrypt_fields,
    find_spans,
    parse_document,
)
from sluice.crypto.kms import (
    KeyDestroyed,
    KeyNotFound,
    KmsError,
    UnwrapFailed,
)
from sluice.crypto.kms_clients import open_kms
from sluice.filters.abi_base import FilterLoadError
from sluice.filters.config import FilterSpec
from sluice.filters.context import RecordContext, RecordLike
from sluice.filters.decisions import KEEP, Decision, PartitionError, reject, rewrite
from sluice.filters.host import HostRunner
from sluice.filters.host_identity import ENCRYPT_IMPLEMENTATION_VERSION, ENCRYPT_KIND
from sluice.filters.principal import ANONYMOUS

KAFKA_STORAGE_ERROR: Final = 56
CORRUPT_MESSAGE: Final = 2
CONFIG_KEYS: Final = ("key", "decrypt_for", "fields", "data_key_max_records",
                      "data_key_max_age_seconds", "data_key_cache_seconds")
_KEY_NAME: Final = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,99}$")


class EncryptRunner(HostRunner):
    """The ``builtin:encrypt`` host filter (see the module docstring)."""

    kind = ENCRYPT_KIND
    implementation_version = ENCRYPT_IMPLEMENTATION_VERSION

    def __init__(self, spec: FilterSpec, who: str) -> None:
        super().__init__(spec, who)
        cfg = spec.config

        def bad(reason: str) -> FilterLoadError:
            return FilterLoadError(f"{who}: builtin:encrypt rejected the config: {reason}")

        for k in cfg:
            if k not in CONFIG_KEYS:
                raise bad(f"config.{k}: unknown key (expected one of {', '.join(CONFIG_KEYS)})")
        key = cfg.get("key")
        if not isinstance(key, str) or not _KEY_NAME.match(key):
            raise bad("config.key: required, 1-100 letters, digits, '_' or '-' (the KEK's "
                      "name in the KMS)")
        self.key_name = key
        self.decrypt_for = _strings(cfg, "decrypt_for", bad) or ()
        self._readers = (re.compile("|".join(f"(?:{translate(p)})" for p in self.decrypt_for))
                         if self.decrypt_for else None)
        fields = _strings(cfg, "fields", bad)
        if fields is not None and any(not part for f in fields for part in f.split(".")):
            raise bad("config.fields: paths are member names separated by dots")
        self.fields = fields
        self.mode = MODE_FIELDS if fields else MODE_VALUE
        max_records = _number(cfg, "data_key_max_records", DEFAULT_MAX_RECORDS, bad,
                              integer=True, maximum=1 << 32)
        max_age = _number(cfg, "data_key_max_age_seconds", DEFAULT_MAX_AGE_SECONDS, bad)
        cache_s = _number(cfg, "data_key_cache_seconds", DEFAULT_CACHE_SECONDS, bad,
                          allow_zero=True)
        if spec.principals is not None:
            raise FilterLoadError(
                f"{who}: builtin:encrypt must apply to every principal (a producer outside "
                "'principals' would store records in the clear); remove 'principals' and "
                "choose readers with config.decrypt_for")
        if spec.on_error == "pass":
            raise FilterLoadError(f"{who}: builtin:encrypt cannot use on_error: pass (a failure "
                                  "would store or deliver records in the clear)")
        if spec.kms is None:
            raise FilterLoadError(f"{who}: builtin:encrypt needs the top-level kms: section "
                                  "(e.g. kms: {type: local, path: keys.json})")
        self.keys = DataKeys(open_kms(spec.kms), max_records=int(max_records),
                             max_age_seconds=max_age, cache_seconds=cache_s)

    # ------------------------------------------------------------------ entry point
    def run(self, ctx: RecordContext, records: Sequence[RecordLike], offset_base: int,
            timestamp_base: int) -> tuple[list[Decision], dict[str, int]]:
        if ctx.direction == "produce":
            if self.mode == MODE_VALUE:
                return self._encrypt_values(records)
            return self._encrypt_fields(records)
        return self._decrypt(ctx, records, offset_base)

    def allowed(self, principal: str | None) -> bool:
        """Whether `principal` may read plaintext (matches a ``decrypt_for`` glob)."""
        return self._readers is not None and self._readers.fullmatch(
            principal or ANONYMOUS) is not None

    # ------------------------------------------------------------------ produce
    def _data_key(self, seals: int) -> tuple[Envelope, Any]:
        try:
            key = self.keys.for_encrypt(self.key_name, seals)
        except KmsError as exc:
            raise PartitionError(
                KAFKA_STORAGE_ERROR, f"filter {self.spec.name}: no data key for "
                f"{self.key_name!r} ({type(exc).__name__}: {exc}); nothing was stored",
                self.spec.name) from None
        return Envelope(self.mode, key.key_name, key.key_version, key.wrapped), key.aead

    def _encrypt_values(self, records: Sequence[RecordLike]
                        ) -> tuple[list[Decision], dict[str, int]]:
        seals = sum(1 for r in records if r.value is not None)
        if not seals:
            return [KEEP] * len(records), {}
        env, aead = self._data_key(seals)
        ours = headers_for(env)
        prefix = aad_prefix(MODE_VALUE, env.key_name, env.key_version, env.wrapped_dek)
        nonces = os.urandom(NONCE_SIZE * seals)  # one system call per batch
        out: list[Decision] = []
        at = 0
        for rec in records:
            value = rec.value
            if value is None:
                out.append(KEEP)
                continue
            key = rec.key
            nonce = nonces[at:at + NONCE_SIZE]
            at += NONCE_SIZE
            out.append(rewrite(key, seal_value(aead, prefix, key, bytes(value), nonce),
                               [*rec.headers, *ours]))
        return out, {"encrypted": seals, f"kek:{env.key_name}:{env.key_version}": seals}

    def _encrypt_fields(self, records: Sequence[RecordLike]
                        ) -> tuple[list[Decision], dict[str, int]]:
        assert self.fields is not None
        plans: list[tuple[str, list[tuple[int, int, str]]] | str | None] = []
        seals = 0
        for rec in records:
            if rec.value is None:
                plans.append(None)
                continue
            try:
                doc = parse_document(bytes(rec.value))
            except NotJsonObject as exc:
                plans.append(f"value is not a JSON object ({exc}); field encryption refuses "
                             "to store it")
                continue
            spans = find_spans(doc, self.fields)
            seals += len(spans)
            plans.append((doc.text, spans) if spans else None)
        env: Envelope | None = None
        aead: Any = None
        if seals:
            env, aead = self._data_key(seals)
        out: list[Decision] = []
        encrypted = 0
        for rec, plan in zip(records, plans, strict=True):
            if plan is None:
                out.append(KEEP)
            elif isinstance(plan, str):
                out.append(reject(plan))
            else:
                assert env is not None
                text, spans = plan
                paths = tuple(dict.fromkeys(p for _s, _e, p in spans))
                rec_env = Envelope(MODE_FIELDS, env.key_name, env.key_version, env.wrapped_dek,
                                   paths)
                value = encrypt_fields(aead, rec_env, rec.key, text, spans)
                out.append(rewrite(rec.key, value, [*rec.headers, *headers_for(rec_env)]))
                encrypted += 1
        counts: dict[str, int] = {}
        if encrypted:
            assert env is not None
            counts = {"encrypted": encrypted, "fields_encrypted": seals,
                      f"kek:{env.key_name}:{env.key_version}": encrypted}
        return out, counts

    # ------------------------------------------------------------------ fetch
    def _decrypt(self, ctx: RecordContext, records: Sequence[RecordLike], offset_base: int
                 ) -> tuple[list[Decision], dict[str, int]]:
        allowed = self.allowed(ctx.principal)
        out: list[Decision] = []
        decrypted = withheld = unreadable = 0
        # Records of one batch share a data key: parse each distinct header group, and unwrap
        # its key, once per batch.
        seen: dict[tuple[Any, ...], tuple[Envelope, Any, bytes] | None] = {}
        for rec in records:
            headers = rec.headers
            start = group_start(headers)
            if start < 0:
                out.append(KEEP)
                continue
            if not allowed:
                withheld += 1
                out.append(KEEP)
                continue
            group = tuple(headers[start:])
            if group in seen:
                known = seen[group]
            else:
                known = seen[group] = self._open_group(ctx, headers, start, offset_base
                                                       + rec.offset_delta)
            if known is None:
                unreadable += 1
                out.append(KEEP)
                continue
            env, aead, prefix = known
            stored = bytes(rec.value or b"")
            try:
                if env.mode == MODE_VALUE:
                    plain = open_value(aead, env, rec.key, stored, prefix)
                else:
                    plain = decrypt_fields(aead, env, rec.key, stored)
            except EnvelopeError as exc:
                raise self._tampered(ctx, offset_base + rec.offset_delta, exc) from None
            out.append(rewrite(rec.key, plain, list(headers[:start])))
            decrypted += 1
        counts = {k: v for k, v in (("decrypted", decrypted), ("withheld", withheld),
                                    ("unreadable", unreadable)) if v}
        return out, counts

    def _open_group(self, ctx: RecordContext, headers: Sequence[Any], start: int,
                    offset: int) -> tuple[Envelope, Any, bytes] | None:
        """(envelope, cipher, AAD prefix) of a record's header group; None when its KEK is
        gone (crypto-shredded). PartitionError when the KMS fails or the group is forged."""
        try:
            env = find_envelope(headers)  # starts at `start`: both use group_start
        except EnvelopeError as exc:
            raise self._tampered(ctx, offset, exc) from None
        if env is None:  # cannot happen after group_start found the header; stay closed
            raise self._tampered(ctx, offset, EnvelopeError("encryption headers vanished"))
        try:
            aead = self.keys.for_decrypt(env.key_name, env.key_version, env.wrapped_dek)
        except (KeyNotFound, KeyDestroyed):
            return None
        except UnwrapFailed as exc:
            raise self._tampered(ctx, offset, exc) from None
        except KmsError as exc:
            raise PartitionError(
                KAFKA_STORAGE_ERROR, f"filter {self.spec.name}: cannot unwrap the data key "
                f"of {env.key_name!r} version {env.key_version} ({type(exc).__name__}: "
                f"{exc})", self.spec.name) from None
        return env, aead, aad_prefix(env.mode, env.key_name, env.key_version, env.wrapped_dek)

    def _tampered(self, ctx: RecordContext, offset: int, exc: Exception) -> PartitionError:
        return PartitionError(
            CORRUPT_MESSAGE, f"filter {self.spec.name}: encrypted record at offset {offset} of "
            f"{ctx.topic}-{ctx.partition} failed authentication ({exc}); not delivered",
            self.spec.name)


def _strings(cfg: Mapping[str, Any], key: str, bad: Any) -> tuple[str, ...] | None:
    value = cfg.get(key)
    if value is None:
        return None
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not value or not all(
            isinstance(v, str) and v for v in value):
        raise bad(f"config.{key}: must be a non-empty list of non-empty strings")
    return tuple(value)


def _number(cfg: Mapping[str, Any], key: str, default: float, bad: Any, *,
            integer: bool = False, maximum: float = 1e12, allow_zero: bool = False) -> float:
    value = cfg.get(key)
    if value is None:
        return default
    ok_type = isinstance(value, int) if integer else isinstance(value, (int, float))
    if isinstance(value, bool) or not ok_type or value > maximum or value < 0 or (
            value == 0 and not allow_zero):
        kind = "an integer" if integer else "a number"
        raise bad(f"config.{key}: must be {kind} above 0 and at most {maximum:g}")
    return float(value)
