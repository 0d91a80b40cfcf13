"""Data keys: the current one per KEK name for encrypting, a bounded cache for decrypting.

Encrypting uses one data key per KEK name until it has sealed `max_records` values (a record,
or one field of a record) or is `max_age_seconds` old, or `cache_seconds` old (so that a
deleted KEK stops being used for new records as soon as it stops decrypting old ones); then
the next batch gets a fresh one from the KMS. The count bound keeps AES-GCM's random 96-bit
nonces far from their collision limit (NIST SP 800-38D: at most 2^32 messages per key) and
limits what one leaked data key exposes.
A batch uses a single data key, taken before its first record, unless it alone holds more
values than `max_records`: then the caller splits it across data keys (`for_encrypt` never
grants more than `max_records` seals to one key).

Decrypting unwraps each wrapped data key once through the KMS and keeps the result for
`cache_seconds` (at most `cache_entries` keys, least recently used dropped first). The time
bound is what makes a deleted KEK effective in a running proxy: after it, nothing wrapped by
that KEK can be read any more.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from sluice.crypto.kms import Kms
from sluice.filters import blocking

DEFAULT_MAX_RECORDS: Final = 1 << 24
DEFAULT_MAX_AGE_SECONDS: Final = 3600.0
DEFAULT_CACHE_SECONDS: Final = 60.0
DEFAULT_CACHE_ENTRIES: Final = 1000


@dataclass(slots=True)
class ActiveKey:
    """The data key a batch encrypts with (its `aead` holds the plaintext key)."""

    key_name: str
    key_version: str
    wrapped: bytes
    aead: AESGCM
    created: float
    used: int = 0
    #: The plaintext key itself, for the native batch sealer (crypto/batch_seal.py).
    raw: bytes = b""


class DataKeys:
    """Data-key cache of one encryption filter. Thread-safe; KMS errors propagate."""

    def __init__(self, kms: Kms, *, max_records: int = DEFAULT_MAX_RECORDS,
                 max_age_seconds: float = DEFAULT_MAX_AGE_SECONDS,
                 cache_seconds: float = DEFAULT_CACHE_SECONDS,
                 cache_entries: int = DEFAULT_CACHE_ENTRIES,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.kms = kms
        self.max_records = max_records
        self.max_age_seconds = max_age_seconds
        self.cache_seconds = cache_seconds
        self.cache_entries = cache_entries
        self.clock = clock
        self._lock = threading.Lock()
        self._active: dict[str, ActiveKey] = {}
        self._unwrapped: OrderedDict[tuple[str, str, bytes], tuple[float, AESGCM, bytes]] = (
            OrderedDict())
        #: Data keys made (rotations included) and KMS unwraps, for tests and metrics.
        self.generated = 0
        self.unwrapped = 0

    def for_encrypt(self, name: str, seals: int) -> ActiveKey:
        """The data key for a batch (or a part of one) that will seal `seals` values, at most
        `max_records` (rotating when due, so no key seals more than `max_records`)."""
        if seals > self.max_records:
            raise ValueError(f"{seals} seals exceed data_key_max_records ({self.max_records}); "
                             "split the batch")
        # On the event loop (a job run inline) neither the lock nor the KMS may be waited
        # for: filters/blocking.py gives the job back to the thread pool instead.
        blocking.acquire(self._lock)
        try:
            now = self.clock()
            key = self._active.get(name)
            max_age = min(self.max_age_seconds, self.cache_seconds)
            if key is None or key.used + seals > self.max_records or (
                    now - key.created >= max_age):
                blocking.check()
                fresh = self.kms.generate_data_key(name)
                key = ActiveKey(name, fresh.key_version, fresh.wrapped, AESGCM(fresh.plaintext),
                                now, raw=bytes(fresh.plaintext))
                self._active[name] = key
                self.generated += 1
            key.used += seals
            return key
        finally:
            self._lock.release()

    def for_decrypt(self, name: str, version: str, wrapped: bytes) -> AESGCM:
        """The cipher for a wrapped data key (one KMS call per key per `cache_seconds`)."""
        return self.unwrap(name, version, wrapped)[0]

    def unwrap(self, name: str, version: str, wrapped: bytes) -> tuple[AESGCM, bytes]:
        """`for_decrypt`'s cipher with the plaintext key (for the native batch sealer)."""
        cache_key = (name, version, wrapped)
        blocking.acquire(self._lock)
        try:
            # Read once the lock is held: a produce may hold it through a KMS call, and a time
            # read before that wait would serve a destroyed KEK's key past cache_seconds.
            now = self.clock()
            hit = self._unwrapped.get(cache_key)
            if hit is not None and now - hit[0] < self.cache_seconds:
                self._unwrapped.move_to_end(cache_key)
                return hit[1], hit[2]
            active = self._active.get(name)
        finally:
            self._lock.release()
        if active is not None and active.wrapped == wrapped and (
                now - active.created < self.cache_seconds):
            return active.aead, active.raw
        blocking.check()
        raw = bytes(self.kms.decrypt_data_key(name, version, wrapped))
        aead = AESGCM(raw)
        with self._lock:
            self.unwrapped += 1
            self._unwrapped[cache_key] = (now, aead, raw)
            self._unwrapped.move_to_end(cache_key)
            while len(self._unwrapped) > self.cache_entries:
                self._unwrapped.popitem(last=False)
        return aead, raw

    def forget(self) -> None:
        """Drop every cached key (the next batch asks the KMS again)."""
        with self._lock:
            self._active.clear()
            self._unwrapped.clear()
