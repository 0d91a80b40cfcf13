"""The data-key cache under threads: builtin:encrypt's fetch side runs beside its produce side
(and beside other fetch calls) without the filter's lock, so a cache look-up may wait for the
cache's lock while another thread holds it for a KMS round trip."""

from __future__ import annotations

import threading
from pathlib import Path

from sluice.crypto.data_keys import DataKeys
from sluice.crypto.kms import DataKey, KeyDestroyed
from sluice.crypto.kms_local import LocalKeyring


class _Clock:
    """A settable clock that tells when it was last read."""

    def __init__(self) -> None:
        self.now = 1000.0
        self.asked = threading.Event()

    def __call__(self) -> float:
        self.asked.set()
        return self.now


class _SlowGenerate:
    """The keyring, whose generate_data_key waits until the test lets it go (a slow KMS)."""

    def __init__(self, ring: LocalKeyring) -> None:
        self.ring = ring
        self.entered = threading.Event()
        self.go = threading.Event()

    def generate_data_key(self, name: str) -> DataKey:
        self.entered.set()
        assert self.go.wait(10)
        return self.ring.generate_data_key(name)

    def decrypt_data_key(self, name: str, version: str, wrapped: bytes) -> bytes:
        return self.ring.decrypt_data_key(name, version, wrapped)


def test_a_lookup_waiting_behind_a_kms_call_does_not_outlive_the_cache_time(
        tmp_path: Path) -> None:
    """A produce holding the cache's lock through a slow KMS call used to make a fetch's
    look-up judge the cache by the time it read before waiting: a data key whose KEK was
    destroyed stayed readable past `cache_seconds` by as long as the KMS call took."""
    clock = _Clock()
    ring = LocalKeyring(tmp_path / "k.json")
    dk = ring.generate_data_key("p")
    kms = _SlowGenerate(ring)
    keys = DataKeys(kms, cache_seconds=30, clock=clock)  # type: ignore[arg-type]
    keys.for_decrypt("p", dk.key_version, dk.wrapped)  # cached at t=1000
    ring.delete_key("p")
    clock.now += 29  # within the cache time

    def produce() -> None:
        try:
            keys.for_encrypt("q", 1)
        except Exception:  # the produce's outcome is not what is tested
            pass

    producer = threading.Thread(target=produce)
    producer.start()
    assert kms.entered.wait(10)  # the producer holds the cache's lock in the KMS call
    clock.asked.clear()
    got: list[object] = []

    def fetch() -> None:
        try:
            got.append(keys.unwrap("p", dk.key_version, dk.wrapped))
        except KeyDestroyed as exc:
            got.append(exc)

    reader = threading.Thread(target=fetch)
    reader.start()
    clock.asked.wait(0.5)  # the reader reads the clock now, or after the lock
    clock.now += 2  # the KMS call takes 2 s: the cache time is over when the lock is free
    kms.go.set()
    producer.join(10)
    reader.join(10)
    assert len(got) == 1
    assert isinstance(got[0], KeyDestroyed), "a destroyed KEK's data key was served past " \
        "cache_seconds"
