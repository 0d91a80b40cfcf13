"""The two seed ABIs: the in-place transform_record ABI and the Kafka Connect Wasm ABI."""

from __future__ import annotations

import base64
import json
from collections.abc import Callable

import pytest

from sluice.filters.abi_base import FilterLoadError
from sluice.filters.context import FilterRecord, RecordContext
from sluice.filters.decisions import Action
from sluice.filters.runtime import LoadedFilter

CTX = RecordContext("raw.events", 0, "produce", "c", None)
Load = Callable[..., LoadedFilter]


def rec(value: bytes | None, key: bytes | None = b"key", headers=None) -> FilterRecord:
    return FilterRecord(0, 0, key, value, list(headers or []))


# -- in-place ABI ------------------------------------------------------------------------


@pytest.mark.parametrize("module", ["inplace_upper", "inplace_alloc"])
def test_inplace_decisions(load_wat: Load, module: str) -> None:
    f = load_wat(module)
    assert f.abi == "inplace"
    records = [rec(b"hello", headers=[("h", b"1")]), rec(b"DROP"), rec(b"SHRINK-ME"),
               rec(b"UPPER", key=b"KEY"), rec(None, key=None), rec(b"x", key=None)]
    result = f.run_batch(CTX, records)
    d = result.decisions
    assert [x.action for x in d] == [Action.REWRITE, Action.DROP, Action.REWRITE, Action.KEEP,
                                     Action.KEEP, Action.REWRITE]
    # value and key edited in place; headers pass unchanged
    assert (d[0].key, d[0].value, d[0].headers) == (b"KEY", b"HELLO", [("h", b"1")])
    assert d[2].value == b"SHRINK"
    assert d[5].key is None and d[5].value == b"X"
    assert result.failure is None


@pytest.mark.parametrize("module", ["inplace_upper", "inplace_alloc"])
def test_inplace_errors_are_per_record(load_wat: Load, module: str) -> None:
    f = load_wat(module, on_error="pass")
    result = f.run_batch(CTX, [rec(b"FAIL"), rec(b"ok"), rec(b"LONG"), rec(b"TRAP"), rec(b"z")])
    d = result.decisions
    assert [x.action for x in d] == [Action.KEEP, Action.REWRITE, Action.KEEP, Action.KEEP,
                                     Action.REWRITE]
    assert d[0].failure == "error: transform_record returned -1"
    assert d[2].failure == ("invalid-output: transform_record returned length 14, beyond the "
                            "original 4")
    assert d[3].failure == "trap: wasm `unreachable` instruction executed"
    assert d[1].failure is None and d[4].value == b"Z"
    assert result.failed_records == 3 and result.failure is None
    assert f.failures["record"] == 3


def test_inplace_reuses_the_guest_allocator_buffer(load_wat: Load) -> None:
    f = load_wat("inplace_alloc")
    f.run_batch(CTX, [rec(b"a" * 10) for _ in range(50)])
    guest = f._runner.guest()
    allocs = guest.exports["allocs"].value(guest.store)
    assert allocs == 1  # one scratch buffer for 50 records of the same size
    f.run_batch(CTX, [rec(b"b" * 5000)])
    assert guest.exports["allocs"].value(guest.store) == 2


def test_inplace_without_allocator_grows_memory_once(load_wat: Load) -> None:
    f = load_wat("inplace_upper")
    guest = f._runner.guest()
    before = guest.memory_size()
    f.run_batch(CTX, [rec(b"a" * 100) for _ in range(20)])
    assert guest.memory_size() == before + 65536


def test_inplace_function_name_is_configurable(load_wat: Load) -> None:
    with pytest.raises(FilterLoadError, match="matches no supported ABI"):
        load_wat("inplace_upper", function="other_name")


def test_seed_abis_cannot_bind_admin(load_wat: Load) -> None:
    with pytest.raises(FilterLoadError, match="inplace ABI modules cannot act on admin"):
        load_wat("inplace_upper", apply_to=frozenset({"admin", "produce"}))
    with pytest.raises(FilterLoadError, match="connect ABI modules cannot act on admin"):
        load_wat("connect_funcs", function="to_upper", apply_to=frozenset({"admin"}))


# -- Kafka Connect ABI -------------------------------------------------------------------


def connect(load_wat: Load, function: str, **kw) -> LoadedFilter:
    f = load_wat("connect_funcs", name=function, function=function, **kw)
    assert f.abi == "connect"
    return f


def test_connect_to_upper(load_wat: Load) -> None:
    f = connect(load_wat, "to_upper")
    result = f.run_batch(CTX, [rec(b"the-value"), rec(b"SAME"), rec(None)])
    d = result.decisions
    assert d[0].action is Action.REWRITE
    assert (d[0].key, d[0].value) == (b"key", b"THE-VALUE")
    assert d[1].action is Action.KEEP
    assert d[2].action is Action.KEEP  # a null value read as empty and written back stays null


def test_connect_value_to_key(load_wat: Load) -> None:
    f = connect(load_wat, "value_to_key")
    (d,) = f.run_batch(CTX, [rec(b"the-value", key=None)]).decisions
    assert (d.action, d.key, d.value) == (Action.REWRITE, b"the-value", b"the-value")


def test_connect_headers(load_wat: Load) -> None:
    f = connect(load_wat, "header_to_key")
    (d,) = f.run_batch(CTX, [rec(b"v", headers=[("the-key", b"old"), ("the-key", b"new")])]
                       ).decisions
    assert d.key == b"new"  # the last header of that name
    f = connect(load_wat, "copy_header")
    (d,) = f.run_batch(CTX, [rec(b"v", headers=[("the-header-in", b"payload")])]).decisions
    assert d.headers == [("the-header-in", b"payload"), ("the-header-out", b"payload")]


def test_connect_record_json_round_trip_changes_nothing(load_wat: Load) -> None:
    f = connect(load_wat, "record_echo")
    records = [rec(b"\x00\xffbinary", headers=[("h", b"\x01")]), rec(b"v", key=None)]
    result = f.run_batch(CTX, records)
    assert [d.action for d in result.decisions] == [Action.KEEP, Action.KEEP]
    assert result.failure is None and result.failed_records == 0


def test_connect_get_record_layout(load_wat: Load) -> None:
    f = connect(load_wat, "to_upper")
    runner = f._runner
    from sluice.filters.abi_connect import _Current

    runner.guest()
    runner._cur = _Current("raw.events", rec(b"v", key=None, headers=[("h", b"x")]))
    packed = runner._h_get_record()
    doc = json.loads(runner.guest().read(packed >> 32, packed & 0xFFFFFFFF))
    assert doc == {"topic": "raw.events", "value": base64.b64encode(b"v").decode(),
                   "headers": {"h": base64.b64encode(b"x").decode()}}
    runner._cur = None


def test_connect_topic_changes_are_refused(load_wat: Load) -> None:
    assert connect(load_wat, "topic_same").run_batch(CTX, [rec(b"v")]).decisions[0].action \
        is Action.KEEP
    f = connect(load_wat, "topic_other")
    (d,) = f.run_batch(CTX, [rec(b"v")]).decisions
    assert d.action is Action.REJECT
    assert d.failure == ("invalid-output: set_topic cannot move a record to another topic "
                         "through a proxy")


def test_connect_error_result_and_dealloc(load_wat: Load) -> None:
    f = connect(load_wat, "fail", on_error="dead-letter", dead_letter_topic="dlq")
    (d,) = f.run_batch(CTX, [rec(b"v")]).decisions
    assert d.action is Action.REJECT and d.dead_letter
    assert d.failure == "error: boom"
    f = connect(load_wat, "done_i64")
    assert f.run_batch(CTX, [rec(b"v"), rec(b"w")]).decisions[0].action is Action.KEEP
    guest = f._runner.guest()
    assert guest.exports["deallocs"].value(guest.store) == 2


def test_connect_trap_is_per_record_and_reinstantiates(load_wat: Load) -> None:
    f = connect(load_wat, "trap", on_error="pass")
    result = f.run_batch(CTX, [rec(b"a"), rec(b"b")])
    assert [d.action for d in result.decisions] == [Action.KEEP, Action.KEEP]
    assert result.failed_records == 2
    # Loaded once; the trap in record 0 killed that instance, record 1 got a fresh one (which
    # trapped too); the next call instantiates again.
    assert f.instantiations == 2
    f.run_batch(CTX, [rec(b"c")])
    assert f.instantiations == 3


def test_connect_needs_a_function_name(load_wat: Load) -> None:
    with pytest.raises(FilterLoadError, match="matches no supported ABI"):
        load_wat("connect_funcs")
