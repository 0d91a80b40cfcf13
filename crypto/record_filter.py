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
          accept_legacy: false          # read layout-1 records (older Sluice) under `key`
          data_key_max_records: 16777216
          data_key_max_age_seconds: 3600
          data_key_cache_seconds: 60

Produce: every record with a value gets the envelope of crypto/envelope.py (whole value, or
the listed JSON fields), bound to this filter's name, its KEK and the topic; record keys and
the producer's headers stay as they were; null values (tombstones) stay null. A batch's record
count, offsets, producer id, epoch and sequence are untouched (the pipeline rebuilds the batch
around the rewritten records). A value that is not a JSON object in fields mode is rejected
(the partition fails with INVALID_RECORD): storing it in the clear could leak the fields it
was meant to hide. Produced records carrying ``sluice.enc*`` headers are refused by the chain
(filters/chain.py) before this filter runs.

Fetch: for a principal matching ``decrypt_for`` each record this filter sealed becomes exactly
what was produced (value and headers); records sealed by another filter or under another KEK
(``foreign``), and layout-1 records unless ``accept_legacy`` (``legacy``), stay as stored.
Other principals get the stored records unchanged. ``User:ANONYMOUS`` is allowed only when
``decrypt_for`` names it exactly (no glob includes it).

Speed: with the native batch sealer built (crypto/batch_seal.py, at install) a batch is
sealed or opened in one call over its records section (`run_native`, the chain's native
path); this module's per-record code is the reference and takes every batch the native path
declines. Both write the same bytes.

Fail closed, with the Kafka error the pipeline puts on the partition:
- KMS unreachable or failing, a key or version it does not know, a damaged keyring, or any
  other internal error, on produce or while an allowed principal fetches: 56
  KAFKA_STORAGE_ERROR (retriable); nothing is stored or delivered in the clear, nothing is
  skipped.
- A stored record that fails authentication (edited in the broker, copied from another topic)
  while an allowed principal fetches: 2 CORRUPT_MESSAGE for the partition, counted, never
  delivered as data.
- A record whose KEK Sluice itself destroyed (``sluice keys delete``: crypto-shredding):
  delivered as stored (ciphertext with its ``sluice.enc`` headers), counted as ``unreadable``,
  so consumers move past it.

Counters (telemetry ``detectors``): produce ``encrypted``, ``fields_encrypted`` and
``kek:<name>:<version>`` (records sealed under that KEK version, so the event's offsets say
which key version encrypted which offsets); fetch ``decrypted``, ``withheld`` (encrypted
records a principal outside ``decrypt_for`` received as stored), ``unreadable``, ``foreign``
and ``legacy``.
"""

from __future__ import annotations

import os
import re
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from fnmatch import translate
from typing import Any, Final

from sluice.codec.records import Buffer
from sluice.crypto import batch_seal
from sluice.crypto.data_keys import (
    DEFAULT_CACHE_SECONDS,
    DEFAULT_MAX_AGE_SECONDS,
    DEFAULT_MAX_RECORDS,
    ActiveKey,
    DataKeys,
)
from sluice.crypto.envelope import (
    LAYOUT_VERSION,
    LEGACY_LAYOUT,
    MODE_FIELDS,
    MODE_VALUE,
    NONCE_SIZE,
    RESERVED_PREFIX,
    Envelope,
    EnvelopeError,
    aad_prefix_v2,
    find_envelope,
    group_start,
    headers_for,
    open_value,
    prefix_for,
    record_digest,
    seal_value,
)
from sluice.crypto.json_fields import (
    NotJsonObject,
    decrypt_fields,
    encrypt_fields,
    find_spans,
    parse_document,
)
from sluice.crypto.kms import KeyDestroyed, KmsError, UnwrapFailed
from sluice.crypto.kms_clients import open_kms
from sluice.filters.abi_base import FilterLoadError
from sluice.filters.config import FilterSpec
from sluice.filters.context import RecordContext, RecordLike
from sluice.filters.decisions import KEEP, Decision, PartitionError, reject, rewrite
from sluice.filters.host import HostRunner
from sluice.filters.native_io import NativeOutput
from sluice.filters.principal import ANONYMOUS
from sluice.telemetry_schema.host_identity import ENCRYPT_IMPLEMENTATION_VERSION, ENCRYPT_KIND

KAFKA_STORAGE_ERROR: Final = 56
CORRUPT_MESSAGE: Final = 2
CONFIG_KEYS: Final = ("key", "decrypt_for", "fields", "accept_legacy", "data_key_max_records",
                      "data_key_max_age_seconds", "data_key_cache_seconds")
#: What `_open_group` answers for a record this filter does not open.
_FOREIGN: Final = "foreign"
_LEGACY: Final = "legacy"
_SHREDDED: Final = "unreadable"
#: Entries of `EncryptRunner._sealings` (data key x topic) kept before it starts over.
_SEALINGS_KEPT: Final = 256


@dataclass(frozen=True, slots=True)
class _Opening:
    """A header group's parse for the native opener: its envelope, the AAD prefix on the
    topic, and (fields mode) the group's headers before ``sluice.enc.fields``, encoded."""

    env: Envelope
    prefix: bytes
    group3: bytes
    group3_count: int
_KEY_NAME: Final = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,99}$")


class EncryptRunner(HostRunner):
    """The ``builtin:encrypt`` host filter (see the module docstring)."""

    kind = ENCRYPT_KIND
    implementation_version = ENCRYPT_IMPLEMENTATION_VERSION
    nests = True
    reserved_header_prefix = RESERVED_PREFIX
    # Its only waits are the KMS and the data keys' lock, both behind filters/blocking.py.
    never_waits = True
    # Opening may run on several threads at once (a Fetch response's partitions spread over
    # the filter pool): the data keys and KMS clients lock what they share, the native
    # opener's scratch and output buffers are per thread (crypto/batch_seal.py), `_openings`
    # is a cache whose entries are immutable (a lost insert or a clear costs one re-parse),
    # and nothing else outlives a call. Produce stays serialised.
    concurrent = frozenset({"fetch"})

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
        # No glob lets in a connection without a principal: it must be named as such.
        self._anonymous_reads = ANONYMOUS in self.decrypt_for
        fields = _strings(cfg, "fields", bad)
        if fields is not None and any(not part for f in fields for part in f.split(".")):
            raise bad("config.fields: paths are member names separated by dots")
        self.fields = fields
        self.mode = MODE_FIELDS if fields else MODE_VALUE
        legacy = cfg.get("accept_legacy", False)
        if not isinstance(legacy, bool):
            raise bad("config.accept_legacy: must be true or false")
        self.accept_legacy = legacy
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
        if spec.on_error in ("pass", "dead-letter"):
            where = ("store or deliver records in the clear" if spec.on_error == "pass" else
                     "send the batch's plaintext to the dead-letter topic")
            raise FilterLoadError(f"{who}: on_error: builtin:encrypt cannot use on_error: "
                                  f"{spec.on_error} (a failure would {where}); use reject")
        if spec.kms is None:
            raise FilterLoadError(f"{who}: builtin:encrypt needs the top-level kms: section "
                                  "(e.g. kms: {type: local, path: keys.json})")
        self.max_records = int(max_records)
        self.keys = DataKeys(open_kms(spec.kms), max_records=self.max_records,
                             max_age_seconds=max_age, cache_seconds=cache_s)
        #: Where nonces come from (n bytes per call); tests inject a deterministic source to
        #: compare the native and reference paths byte for byte. None: a CSPRNG, drawn once
        #: per batch (native calls: OpenSSL's RAND_bytes, `batch_seal.fresh_nonces`; the
        #: per-record path: os.urandom).
        self.nonces: Callable[[int], bytes] | None = None
        #: Whether the native batch sealer serves whole-value batches (crypto/batch_seal.py).
        self.use_native = batch_seal.AVAILABLE
        self._packed_paths = batch_seal.pack_paths(fields or ())
        self._scans = threading.local()
        # (KEK name, version, wrapped data key, topic) -> `_sealing`'s answer.
        self._sealings: dict[tuple[str, str, bytes, str], tuple[bytes, bytes, int, str]] = {}
        # (a header group as stored, topic) -> `_opening`'s answer (native fetch).
        self._openings: dict[tuple[bytes, str], _Opening] = {}

    # ------------------------------------------------------------------ entry point
    def run(self, ctx: RecordContext, records: Sequence[RecordLike], offset_base: int,
            timestamp_base: int) -> tuple[list[Decision], dict[str, int]]:
        try:
            if ctx.direction == "produce":
                if self.mode == MODE_VALUE:
                    return self._encrypt_values(ctx, records)
                return self._encrypt_fields(ctx, records)
            return self._decrypt(ctx, records, offset_base)
        except PartitionError:
            raise
        except Exception as exc:
            # Not a KMS answer and not tampering (a damaged keyring entry, a bug): never let
            # the failure policy drop records on fetch or refuse a produce for good. The
            # message names the type only: exception texts may quote data.
            raise PartitionError(
                KAFKA_STORAGE_ERROR, f"filter {self.spec.name}: internal error "
                f"({type(exc).__name__}) on {ctx.direction}; nothing was stored or delivered, "
                "retry", self.spec.name) from None

    def allowed(self, principal: str | None) -> bool:
        """Whether `principal` may read plaintext (matches a ``decrypt_for`` glob; a
        connection without a principal only when ``User:ANONYMOUS`` is listed as such)."""
        if principal is None or principal == ANONYMOUS:
            return self._anonymous_reads
        return self._readers is not None and self._readers.fullmatch(principal) is not None

    # ------------------------------------------------------------------ native path
    @property
    def has_native(self) -> bool:
        return self.use_native

    @property
    def cost_follows_size(self) -> bool:  # type: ignore[override]
        # The native calls are one linear pass (parse, AES-GCM; fields: one JSON scan).
        return self.use_native

    @property
    def can_screen(self) -> bool:
        return self.use_native

    def screen_native(self, records: Buffer, count: int) -> tuple[int, str] | None:
        found = batch_seal.scan(records, count, RESERVED_PREFIX)
        # The chain screens a produced section just before this filter seals it: the seal
        # reuses this pass over the records instead of parsing them again (`_scan`).
        self._scans.last = (records, count, found)
        return found.reserved

    def _scan(self, records: Buffer, count: int) -> batch_seal.Scan:
        """`batch_seal.scan` of `records`, or the screen's pass over this very section on
        this thread (the same object, not changed since: sections are never written to)."""
        last = getattr(self._scans, "last", None)
        self._scans.last = None
        if last is not None and last[0] is records and last[1] == count:
            return last[2]
        return batch_seal.scan(records, count)

    def run_native(self, ctx: RecordContext, records: Buffer, count: int, offset_base: int,
                   timestamp_base: int) -> NativeOutput | None:
        """Whole-value mode over a records section in one native call (crypto/batch_seal.py):
        the same bytes, counters and errors as `run`. None hands the batch to `run`: a batch
        larger than data_key_max_records, records under more than one header group, one
        this filter does not open (foreign, layout 1, shredded) or one that fails
        authentication (`run` names its offset)."""
        try:
            if ctx.direction == "produce":
                if self.mode == MODE_FIELDS:
                    return self._seal_fields_native(ctx, records, count)
                return self._seal_native(ctx, records, count)
            return self._open_native(ctx, records, count, offset_base)
        except batch_seal.Slow:
            return None

    def _seal_native(self, ctx: RecordContext, records: Buffer, count: int
                     ) -> NativeOutput | None:
        found = self._scan(records, count)
        if not found.values:
            return NativeOutput(bytes(count), None)
        if found.values > self.max_records:
            return None  # `run` splits it across data keys
        key = self._data_key(found.values)
        if not key.raw:
            return None
        prefix, group, group_count, counter = self._sealing(key, ctx.topic)
        section, fates, sealed = batch_seal.seal_section(
            records, count, key.raw, self._native_nonces(NONCE_SIZE * found.values), prefix,
            group=group, group_count=group_count)
        # Whole values sealed: ciphertext does not compress, so the batch takes its codec's
        # stored blocks; what compression found was the header group that ends every
        # sealed record (~30 %), which LZ4 writes as matches (codec/lz4_sealed.c).
        return NativeOutput(fates, section, {}, {"encrypted": sealed, counter: sealed},
                            trusted=True, incompressible=True, tail=group)

    def _native_nonces(self, n: int) -> Any:
        """`n` bytes of nonces for one native seal call, used at once (see `nonces`)."""
        return batch_seal.fresh_nonces(n) if self.nonces is None else self.nonces(n)

    def _sealing(self, key: ActiveKey, topic: str) -> tuple[bytes, bytes, int, str]:
        """Whole-value mode: (AAD prefix, the proxy's header group in Kafka's encoding, its
        header count, the ``kek:`` counter's name) for batches sealed under `key` on `topic`.
        Derived from nothing but the data key's identity (KEK name, version, wrapped key),
        this filter's name and the topic, so it is kept per (data key, topic) and not built
        again for every batch (a few microseconds each, per partition of every request)."""
        ident = (key.key_name, key.key_version, key.wrapped, topic)
        hit = self._sealings.get(ident)
        if hit is None:
            env = self._envelope(key, MODE_VALUE)
            ours = headers_for(env)
            hit = (aad_prefix_v2(MODE_VALUE, env.key_name, env.key_version, env.wrapped_dek,
                                 self.spec.name, topic),
                   batch_seal.encode_headers(ours), len(ours),
                   f"kek:{env.key_name}:{env.key_version}")
            if len(self._sealings) >= _SEALINGS_KEPT:
                self._sealings.clear()  # bounded: rotated keys and many topics start over
            self._sealings[ident] = hit
        return hit

    def _seal_fields_native(self, ctx: RecordContext, records: Buffer, count: int
                            ) -> NativeOutput | None:
        assert self.fields is not None
        packed, npaths = self._packed_paths, len(self.fields)
        plan = batch_seal.plan_fields(records, count, packed, npaths, self.max_records)
        seals = plan.seals
        if not seals:
            return NativeOutput(bytes(count), None)
        if seals > self.max_records:
            return None  # `run` splits it across data keys
        key = self._data_key(seals)
        if not key.raw:
            return None
        env = self._envelope(key, MODE_FIELDS)
        prefix = aad_prefix_v2(MODE_FIELDS, env.key_name, env.key_version, env.wrapped_dek,
                               self.spec.name, ctx.topic)
        section, fates, sealed, fields = batch_seal.seal_fields(
            records, count, key.raw, self._native_nonces(NONCE_SIZE * seals), prefix, packed,
            npaths,
            headers_for(env)[:-1], self.max_records, plan)
        return NativeOutput(fates, section, {}, {
            "encrypted": sealed, "fields_encrypted": fields,
            f"kek:{env.key_name}:{env.key_version}": sealed}, trusted=True)

    def _open_native(self, ctx: RecordContext, records: Buffer, count: int, offset_base: int
                     ) -> NativeOutput | None:
        allowed = self.allowed(ctx.principal)
        # An allowed reader needs only the first group (the opener counts what it opens); a
        # withheld one, how many records are encrypted.
        found = (batch_seal.first_group(records, count) if allowed
                 else batch_seal.scan(records, count))
        if not found.encrypted:
            return NativeOutput(bytes(count), None)
        if not allowed:
            return NativeOutput(bytes(count), None, {}, {"withheld": found.encrypted})
        offset = offset_base + found.first
        opening = self._openings.get((found.group, ctx.topic))
        try:
            if opening is None:
                known = self._open_group(ctx, batch_seal.decode_headers(
                    found.group, found.group_count), offset)
                if isinstance(known, str):
                    return None
                env, _aead, prefix, raw = known
                if env.layout == LEGACY_LAYOUT:
                    return None
                opening = self._opening(found.group, found.group_count, ctx.topic, env, prefix)
            else:
                # The group was parsed before (layout, filter, KEK checked): only the data key
                # is looked up again (its cache decides, as for any batch: deletion, expiry).
                unwrapped = self._unwrap(ctx, opening.env, offset)
                if isinstance(unwrapped, str):
                    return None
                raw = unwrapped[1]
        except PartitionError as exc:
            if exc.code == CORRUPT_MESSAGE:
                return None  # `run` reports it with the record's offset
            raise
        if not raw:
            return None
        try:
            if opening.env.mode == MODE_VALUE:
                section, fates = batch_seal.open_section(records, count, raw, opening.prefix,
                                                         found.group, found.group_count)
            else:
                section, fates, _n = batch_seal.open_fields(
                    records, count, raw, opening.prefix, opening.group3, opening.group3_count)
        except batch_seal.Tampered:
            return None
        # Written by the native opener over the checked section: the pipeline skips its check.
        return NativeOutput(fates, section, {}, {"decrypted": fates.count(1)}, trusted=True)

    def _opening(self, group: bytes, group_count: int, topic: str, env: Envelope,
                 prefix: bytes) -> _Opening:
        """What the native opener needs of a header group on `topic`, kept for the next batch
        that carries the same group bytes (every batch under one data key): parsing the group,
        building the AAD prefix and the fields-mode group again cost more per batch than a
        small batch's records."""
        group3 = b""
        if env.mode == MODE_FIELDS:  # the group without sluice.enc.fields
            group3 = batch_seal.encode_headers(batch_seal.decode_headers(
                group, group_count)[:-1])
        opening = _Opening(env, prefix, group3, group_count - 1)
        if len(self._openings) >= _SEALINGS_KEPT:
            self._openings.clear()  # bounded: rotated keys and many topics start over
        self._openings[(group, topic)] = opening
        return opening

    # ------------------------------------------------------------------ produce
    def _data_key(self, seals: int) -> ActiveKey:
        try:
            return self.keys.for_encrypt(self.key_name, seals)
        except KmsError as exc:
            raise PartitionError(
                KAFKA_STORAGE_ERROR, f"filter {self.spec.name}: no data key for "
                f"{self.key_name!r} ({type(exc).__name__}: {exc}); nothing was stored",
                self.spec.name) from None

    def _envelope(self, key: ActiveKey, mode: str, fields: tuple[str, ...] = ()) -> Envelope:
        return Envelope(mode, key.key_name, key.key_version, key.wrapped, fields, 0,
                        LAYOUT_VERSION, self.spec.name)

    def _encrypt_values(self, ctx: RecordContext, records: Sequence[RecordLike]
                        ) -> tuple[list[Decision], dict[str, int]]:
        todo = [i for i, r in enumerate(records) if r.value is not None]
        out: list[Decision] = [KEEP] * len(records)
        counts: dict[str, int] = {}
        # A batch larger than data_key_max_records is split across data keys.
        for at in range(0, len(todo), self.max_records):
            chunk = todo[at:at + self.max_records]
            key = self._data_key(len(chunk))
            env = self._envelope(key, MODE_VALUE)
            ours = headers_for(env)
            prefix = aad_prefix_v2(MODE_VALUE, env.key_name, env.key_version, env.wrapped_dek,
                                   self.spec.name, ctx.topic)
            nonces = (self.nonces or os.urandom)(NONCE_SIZE * len(chunk))  # one call per chunk
            aead = key.aead
            for n, i in enumerate(chunk):
                rec = records[i]
                headers = list(rec.headers)
                nonce = nonces[n * NONCE_SIZE:(n + 1) * NONCE_SIZE]
                sealed = seal_value(aead, prefix, rec.key, bytes(rec.value or b""), nonce,
                                    record_digest(headers))
                out[i] = rewrite(rec.key, sealed, [*headers, *ours])
            _add(counts, "encrypted", len(chunk))
            _add(counts, f"kek:{env.key_name}:{env.key_version}", len(chunk))
        return out, counts

    def _encrypt_fields(self, ctx: RecordContext, records: Sequence[RecordLike]
                        ) -> tuple[list[Decision], dict[str, int]]:
        assert self.fields is not None
        out: list[Decision] = [KEEP] * len(records)
        planned: list[tuple[int, str, list[tuple[int, int, str]]]] = []
        for i, rec in enumerate(records):
            if rec.value is None:
                continue
            try:
                doc = parse_document(bytes(rec.value))
            except NotJsonObject as exc:
                out[i] = reject(f"value is not a JSON object ({exc}); field encryption refuses "
                                "to store it")
                continue
            spans = find_spans(doc, self.fields)
            if len(spans) > self.max_records:
                out[i] = reject(f"{len(spans)} fields to seal in one record, more than "
                                f"data_key_max_records ({self.max_records})")
            elif spans:
                planned.append((i, doc.text, spans))
        counts: dict[str, int] = {}
        # Records go to data keys in order; one record's fields share one key, and no key
        # seals more than data_key_max_records fields.
        at = 0
        while at < len(planned):
            end, seals = at, 0
            while end < len(planned) and seals + len(planned[end][2]) <= self.max_records:
                seals += len(planned[end][2])
                end += 1
            key = self._data_key(seals)
            nonces = (self.nonces or os.urandom)(NONCE_SIZE * seals)  # one call per data key
            used = 0
            for i, text, spans in planned[at:end]:
                rec = records[i]
                paths = tuple(dict.fromkeys(p for _s, _e, p in spans))
                env = self._envelope(key, MODE_FIELDS, paths)
                headers = list(rec.headers)
                mine = nonces[used * NONCE_SIZE:(used + len(spans)) * NONCE_SIZE]
                used += len(spans)
                value = encrypt_fields(key.aead, env, rec.key, text, spans, topic=ctx.topic,
                                       headers=headers, nonces=mine)
                out[i] = rewrite(rec.key, value, [*headers, *headers_for(env)])
            _add(counts, "encrypted", end - at)
            _add(counts, "fields_encrypted", seals)
            _add(counts, f"kek:{key.key_name}:{key.key_version}", end - at)
            at = end
        return out, counts

    # ------------------------------------------------------------------ fetch
    def _decrypt(self, ctx: RecordContext, records: Sequence[RecordLike], offset_base: int
                 ) -> tuple[list[Decision], dict[str, int]]:
        allowed = self.allowed(ctx.principal)
        out: list[Decision] = []
        counts: dict[str, int] = {}
        # Records of one batch share a data key: parse each distinct header group, and unwrap
        # its key, once per batch.
        seen: dict[tuple[Any, ...], tuple[Envelope, Any, bytes, bytes] | str] = {}
        for rec in records:
            headers = rec.headers
            start = group_start(headers)
            if start < 0:
                out.append(KEEP)
                continue
            if not allowed:
                _add(counts, "withheld", 1)
                out.append(KEEP)
                continue
            group = tuple(headers[start:])
            known = seen.get(group)
            if known is None:
                known = seen[group] = self._open_group(ctx, headers, offset_base
                                                       + rec.offset_delta)
            if isinstance(known, str):  # not ours, or shredded: the record as stored
                _add(counts, known, 1)
                out.append(KEEP)
                continue
            env, aead, prefix, _raw = known
            stored = bytes(rec.value or b"")
            own = list(headers[:start])
            try:
                if env.mode == MODE_VALUE:
                    digest = None if env.layout == LEGACY_LAYOUT else record_digest(own)
                    plain = open_value(aead, env, rec.key, stored, prefix, digest)
                else:
                    plain = decrypt_fields(aead, env, rec.key, stored, topic=ctx.topic,
                                           headers=own)
            except EnvelopeError as exc:
                raise self._tampered(ctx, offset_base + rec.offset_delta, exc) from None
            out.append(rewrite(rec.key, plain, own))
            _add(counts, "decrypted", 1)
        return out, counts

    def _open_group(self, ctx: RecordContext, headers: Sequence[Any], offset: int
                    ) -> tuple[Envelope, Any, bytes, bytes] | str:
        """(envelope, cipher, AAD prefix, plaintext key) of a record's header group, or why it
        stays as stored: `_FOREIGN` (another filter's or KEK's), `_LEGACY` (layout 1 without
        accept_legacy), `_SHREDDED` (its KEK was destroyed by Sluice). PartitionError when
        the KMS fails (56) or the group is forged (2)."""
        try:
            env = find_envelope(headers)
        except EnvelopeError as exc:
            raise self._tampered(ctx, offset, exc) from None
        if env is None:  # cannot happen after group_start found the header; stay closed
            raise self._tampered(ctx, offset, EnvelopeError("encryption headers vanished"))
        if env.layout == LEGACY_LAYOUT:
            # Layout 1 binds neither filter nor topic: only a filter told to trusts it, and
            # only under its own KEK.
            if not self.accept_legacy or env.key_name != self.key_name:
                return _LEGACY
        elif env.filter_name != self.spec.name or env.key_name != self.key_name:
            return _FOREIGN
        unwrapped = self._unwrap(ctx, env, offset)
        if isinstance(unwrapped, str):
            return unwrapped
        aead, raw = unwrapped
        return env, aead, prefix_for(env, ctx.topic), raw

    def _unwrap(self, ctx: RecordContext, env: Envelope, offset: int) -> tuple[Any, bytes] | str:
        """(cipher, plaintext key) of `env`'s data key, or `_SHREDDED`; PartitionError when
        the KMS fails (56) or the wrapped key is forged (2)."""
        try:
            return self.keys.unwrap(env.key_name, env.key_version, env.wrapped_dek)
        except KeyDestroyed:
            return _SHREDDED
        except UnwrapFailed as exc:
            raise self._tampered(ctx, offset, exc) from None
        except KmsError as exc:  # unavailable, or a key/version it does not know: retriable
            raise PartitionError(
                KAFKA_STORAGE_ERROR, f"filter {self.spec.name}: cannot unwrap the data key "
                f"of {env.key_name!r} version {env.key_version} ({type(exc).__name__}: "
                f"{exc})", self.spec.name) from None

    def _tampered(self, ctx: RecordContext, offset: int, exc: Exception) -> PartitionError:
        return PartitionError(
            CORRUPT_MESSAGE, f"filter {self.spec.name}: encrypted record at offset {offset} of "
            f"{ctx.topic}-{ctx.partition} failed authentication ({exc}); not delivered",
            self.spec.name)


def _add(counts: dict[str, int], name: str, n: int) -> None:
    counts[name] = counts.get(name, 0) + n

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
