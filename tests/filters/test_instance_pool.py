"""Instances per filter: one for a filter that may keep state, a few for a stateless one.

Real modules (the shipped pii-mask build, the hand-written sluice_upper test module) on real
threads. A thread holding an instance is made to wait inside its call with `_instance()`, so
that whether a second caller waits or gets an instance of its own is certain, not a race."""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from sluice.codec.records import decode_section, records_section, split_batches
from sluice.filters import blocking, host_sha256, native_call
from sluice.filters.abi_sluice import SluiceAbi
from sluice.filters.config import FilterSpec, parse_filter_specs
from sluice.filters.context import RecordContext
from sluice.filters.runtime import MAX_INSTANCES, LoadedFilter
from sluice.filters.yaml_lines import ConfigError
from tests.filters.test_native_path import make_batch

EMAIL = b'{"user": "ann@example.com", "note": "hi"}'
CTX = RecordContext("t", 0, "fetch", "client", None)


def section(values: list[bytes | None]) -> tuple[bytes, int]:
    (batch,), _ = split_batches(make_batch(values))
    return bytes(records_section(batch)), len(values)


def held(f: LoadedFilter) -> tuple[threading.Event, threading.Event, threading.Thread]:
    """A thread that takes an instance of `f` and keeps it until `release` is set."""
    taken, release = threading.Event(), threading.Event()

    def hold() -> None:
        with f._instance():
            taken.set()
            release.wait(10)

    thread = threading.Thread(target=hold)
    thread.start()
    assert taken.wait(10)
    return taken, release, thread


def test_pii_mask_and_rules_are_stateless_and_other_modules_are_not(
    make_spec: Callable[..., FilterSpec],
) -> None:
    assert make_spec("builtin:pii-mask").poolable
    assert not make_spec("builtin:pii-mask", stateless=False).poolable
    assert make_spec("builtin:rules").poolable
    assert not make_spec("builtin:rules", stateless=False).poolable
    assert not make_spec("builtin:json-validate").poolable
    assert not make_spec("sluice_upper").poolable
    assert make_spec("sluice_upper", stateless=True).poolable
    assert not FilterSpec(name="e", module="builtin:block").poolable


# builtin:rules with a hash rule: a second instance makes its own host_sha256 handshake.
RULES_CONFIG = {"rules": [{"field": "user", "action": "hash", "salt": "s"},
                          {"field": "note", "action": "remove"}]}


@pytest.mark.parametrize(("module", "config"), [("builtin:pii-mask", {}),
                                                ("builtin:rules", RULES_CONFIG)])
def test_a_busy_stateless_filter_gets_a_second_instance_with_the_same_output(
    load_wat: Callable[..., LoadedFilter], module: str, config: dict[str, Any],
) -> None:
    f = load_wat(module, config=config)
    data, n = section([EMAIL] * 3)
    first = f.run_native(CTX, data, n)
    assert first is not None and f.instances == 1
    assert bytes(first.records) != data  # the filter changed the records
    _, release, thread = held(f)
    try:
        second = f.run_native(CTX, data, n)  # not waiting: an instance of its own
    finally:
        release.set()
        thread.join()
    assert second is not None and f.instances == 2
    assert bytes(second.records) == bytes(first.records)
    assert f.instantiations == 2
    if module == "builtin:rules" and host_sha256.AVAILABLE and native_call.AVAILABLE:
        # Each instance took the capability: its digests come from the host's pass.
        slots = [r._hash_slot for r in f._made if isinstance(r, SluiceAbi)]
        assert len(slots) == 2 and all(slots)


def test_a_stateful_filter_keeps_one_instance_and_callers_wait(
    load_wat: Callable[..., LoadedFilter],
) -> None:
    f = load_wat("sluice_upper")
    data, n = section([b"abc"])
    records = decode_section(data, n)
    _, release, thread = held(f)
    with ThreadPoolExecutor(1) as pool:
        waiting = pool.submit(f.run_batch, CTX, records)
        with pytest.raises(TimeoutError):
            waiting.result(0.3)  # waits for the one instance
        release.set()
        thread.join()
        out = waiting.result(10)
    assert out.decisions[0].value == b"ABC"
    assert f.instances == 1 and not f.poolable


def test_inline_on_the_loop_a_busy_pool_gives_the_job_back_without_instantiating(
    load_wat: Callable[..., LoadedFilter],
) -> None:
    f = load_wat("builtin:pii-mask")
    data, n = section([EMAIL])
    _, release, thread = held(f)
    try:
        with blocking.forbidden(), pytest.raises(blocking.WouldBlock):
            f.run_native(CTX, data, n)
    finally:
        release.set()
        thread.join()
    assert f.instances == 1


def test_instances_are_bounded(load_wat: Callable[..., LoadedFilter]) -> None:
    f = load_wat("builtin:pii-mask")
    data, n = section([EMAIL])
    holders = [held(f) for _ in range(MAX_INSTANCES)]
    assert f.instances == MAX_INSTANCES
    with ThreadPoolExecutor(1) as pool:
        waiting = pool.submit(f.run_native, CTX, data, n)
        with pytest.raises(TimeoutError):
            waiting.result(0.3)  # every instance busy, none more may be made
        for _, release, _ in holders:
            release.set()
        for _, _, thread in holders:
            thread.join()
        assert waiting.result(10) is not None
    assert f.instances == MAX_INSTANCES


def test_a_trap_on_one_instance_leaves_the_other_serving(
    load_wat: Callable[..., LoadedFilter],
) -> None:
    f = load_wat("sluice_upper", stateless=True, on_error="pass")
    trap, n = section([b"TRAP"])
    good, m = section([b"abc"])
    _, release, thread = held(f)
    try:
        result = f.run_batch(CTX, decode_section(trap, n))  # the second instance traps
    finally:
        release.set()
        thread.join()
    assert result.failure is not None and result.failure.startswith("trap")
    assert f.failures["trap"] == 1 and f.instances == 2
    # Both instances serve on: the trapped one is made afresh on its next call.
    _, release, thread = held(f)
    try:
        out = f.run_batch(CTX, decode_section(good, m))
    finally:
        release.set()
        thread.join()
    assert out.failure is None and out.decisions[0].value == b"ABC"
    assert f.instances == 2 and f.instantiations == 3


def test_stateless_key_in_the_config() -> None:
    specs = parse_filter_specs(
        [{"name": "m", "module": "builtin:pii-mask", "topics": ["*"], "apply_to": ["fetch"],
          "stateless": False}], "cfg.yaml", check_files=False)
    assert specs[0].stateless is False and not specs[0].poolable
    with pytest.raises(ConfigError, match=r"filters\[0\]\.stateless: must be true or false"):
        parse_filter_specs([{"name": "m", "module": "builtin:pii-mask", "topics": ["*"],
                             "apply_to": ["fetch"], "stateless": "yes"}], "cfg.yaml",
                           check_files=False)
    with pytest.raises(ConfigError, match=r"host filter"):
        parse_filter_specs([{"name": "m", "module": "builtin:block", "topics": ["*"],
                             "apply_to": ["fetch"], "stateless": True}], "cfg.yaml",
                           check_files=False)


def test_an_instance_that_cannot_be_made_leaves_the_calls_to_the_ones_there(
    load_wat: Callable[..., LoadedFilter],
) -> None:
    f = load_wat("builtin:pii-mask")
    data, n = section([EMAIL])

    def broken() -> Any:
        raise RuntimeError("out of address space")

    f._more = broken
    _, release, thread = held(f)
    with ThreadPoolExecutor(1) as pool:
        waiting = pool.submit(f.run_native, CTX, data, n)
        with pytest.raises(TimeoutError):
            waiting.result(0.3)  # no second instance: it waits for the first
        release.set()
        thread.join()
        assert waiting.result(10) is not None
    assert f.instances == 1
    _, release, thread = held(f)  # and does not try again
    with ThreadPoolExecutor(1) as pool:
        waiting = pool.submit(f.run_native, CTX, data, n)
        with pytest.raises(TimeoutError):
            waiting.result(0.3)
        release.set()
        thread.join()
        assert waiting.result(10) is not None
