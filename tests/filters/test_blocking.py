"""filters/blocking.py: what a filter job running inline on the event loop may not wait for."""

from __future__ import annotations

import threading

import pytest

from sluice.crypto.data_keys import DataKeys
from sluice.crypto.kms_local import LocalKeyring
from sluice.filters import blocking
from sluice.proxy.paths.base import IN_POOL, try_inline


def test_check_raises_only_inside_forbidden() -> None:
    blocking.check()
    with blocking.forbidden():
        with pytest.raises(blocking.WouldBlock):
            blocking.check()
        assert not blocking.allowed()
    assert blocking.allowed()


def test_would_block_passes_through_except_exception() -> None:
    # Filters' failure policies catch Exception: the signal must reach try_inline untouched.
    def filter_like() -> None:
        try:
            blocking.check()
        except Exception:  # pragma: no cover - the point is that this does not run
            raise AssertionError("WouldBlock was caught as an error") from None

    assert try_inline(filter_like) is IN_POOL
    assert try_inline(lambda: 42) == 42


def test_forbidden_is_per_thread() -> None:
    seen: list[bool] = []
    with blocking.forbidden():
        t = threading.Thread(target=lambda: seen.append(blocking.allowed()))
        t.start()
        t.join()
    assert seen == [True]


def test_a_lock_held_elsewhere_is_not_waited_for_on_the_loop() -> None:
    lock = threading.Lock()
    lock.acquire()
    with blocking.forbidden(), pytest.raises(blocking.WouldBlock):
        blocking.acquire(lock)
    lock.release()
    with blocking.forbidden():
        blocking.acquire(lock)
    lock.release()


def test_data_keys_ask_the_kms_only_where_they_may_wait(tmp_path) -> None:  # type: ignore[no-untyped-def]
    kms = LocalKeyring(tmp_path / "keys.json")
    kms.create_key("k")
    keys = DataKeys(kms)
    with blocking.forbidden(), pytest.raises(blocking.WouldBlock):
        keys.for_encrypt("k", 1)  # no data key yet: that is a KMS call
    assert keys.generated == 0
    key = keys.for_encrypt("k", 1)
    with blocking.forbidden():
        assert keys.for_encrypt("k", 1) is key  # cached: no wait
    other = DataKeys(kms)
    with blocking.forbidden():
        # Another cache's key must be unwrapped through the KMS: not on the loop.
        with pytest.raises(blocking.WouldBlock):
            other.unwrap("k", key.key_version, key.wrapped)
    assert other.unwrap("k", key.key_version, key.wrapped)[1] == key.raw
    with blocking.forbidden():
        assert other.unwrap("k", key.key_version, key.wrapped)[1] == key.raw
