"""The seed examples under filters/examples, run through the production filter runtime.

They double as tests of the three ABIs from the guest side: Sluice ABI v1 (enrich in C, Rust,
AssemblyScript, Go and JavaScript; upper in Zig, C, Rust, AssemblyScript, Go and JavaScript:
each port must behave exactly like the original), the Kafka Connect ABI (connect-functions)
and the in-place ABI (inplace-enrich).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from sluice.filters.config import FilterSpec
from sluice.filters.context import FilterRecord, RecordContext
from sluice.filters.decisions import Action, Decision
from sluice.filters.runtime import LoadedFilter, load_filter

EXAMPLES = Path(__file__).resolve().parents[3] / "filters" / "examples"
CTX = RecordContext(topic="raw-events", partition=0, direction="produce", client_id="t")


def example(name: str, function: str | None = None, **kw: Any) -> LoadedFilter:
    # The deadline counts ticks of wall time while the guest runs: on CI's two loaded cores a
    # Python or JavaScript guest's call can pass the default 100 ms without looping. These
    # tests check what filters answer, not the deadline (tests/filters/test_guest.py does).
    kw.setdefault("timeout_ms", 5000)
    spec = FilterSpec(name=name, module=str(EXAMPLES / name / f"{name}.wasm"),
                      function=function, **kw)
    return load_filter(spec)


def run(f: LoadedFilter, *values: bytes | None, key: bytes | None = None,
        timestamp_ms: int = 0) -> list[Decision]:
    recs = [FilterRecord(i, 0, key, v, [("h", b"1")]) for i, v in enumerate(values)]
    return f.run_batch(CTX, recs, timestamp_base=timestamp_ms).decisions


ENRICH = ["enrich", "enrich-rust", "enrich-as", "enrich-go", "enrich-js", "enrich-py"]
UPPER = ["upper", "upper-c", "upper-rust", "upper-as", "upper-go", "upper-js", "upper-py"]


@pytest.mark.parametrize("name", ENRICH)
def test_enrich_adds_timestamp_drops_without_user_id_rejects_non_json(name: str) -> None:
    f = example(name)
    ts = 1_700_000_123_456  # 2023-11-14T22:15:23.456Z
    got = run(f, b'{"user_id": 7, "event": "click"}', b'{"event": "click"}',
              b'{"user_id": 8, "timestamp": "x"}', b"not json", b"[1]", None, timestamp_ms=ts)
    assert got[0].action == Action.REWRITE
    assert got[0].value is not None
    assert json.loads(got[0].value) == {"user_id": 7, "event": "click",
                                        "timestamp": "2023-11-14T22:15:23.456Z"}
    assert got[0].headers == [("h", b"1")]
    assert got[1].action == Action.DROP
    assert got[2].action == Action.KEEP
    assert got[3].action == Action.REJECT
    assert got[3].reason is not None and got[3].reason.startswith("value is not a JSON object")
    assert got[4].action == Action.REJECT
    assert got[5].action == Action.REJECT


@pytest.mark.parametrize("name", ENRICH)
@pytest.mark.parametrize(("ms", "text"), [(0, "1970-01-01T00:00:00.000Z"),
                                          (951_782_400_000, "2000-02-29T00:00:00.000Z"),
                                          (-1, "1969-12-31T23:59:59.999Z"),
                                          (-62_135_596_800_000, "0001-01-01T00:00:00.000Z"),
                                          (253_402_300_799_999, "9999-12-31T23:59:59.999Z")])
def test_enrich_timestamp_formatting(name: str, ms: int, text: str) -> None:
    (d,) = run(example(name), b'{"user_id":1}', timestamp_ms=ms)
    assert d.value == b'{"user_id":1,"timestamp":"' + text.encode() + b'"}'


JSONISH = [b'{"user_id": 7}', b'{"user_id": 1, "timestamp": 2}', b"{}", b'{"a": [1, 2.5e3]}',
           b'{"user_id": "\\ud83d\\ude00 \\u0041"}', b'{"user_id": 1,}', b'{"user_id" 1}',
           b"[1, 2", b'"str"', b"nul", b"-", b"01", b'{"a": "\x01"}', b'{"a": "\xff"}',
           b'{"a": "\\x"}', b'{"user_id": 1} x', b"", b"  ", b"[" * 70 + b"]" * 70,
           b'{"user_id": tru}', b'{"k": "\\ud800"}', b'{"user_id":1}  ', None]


@pytest.mark.parametrize("name", ENRICH[1:])
def test_enrich_ports_decide_like_the_c_original(name: str) -> None:
    """Same decisions, values, reasons (parser messages included) and counters as C."""
    def outcome(f: LoadedFilter) -> list[tuple[object, ...]]:
        recs = [FilterRecord(i, i * 1000, None, v, []) for i, v in enumerate(JSONISH)]
        res = f.run_batch(CTX, recs, timestamp_base=1_700_000_000_000)
        return [(d.action, d.value, d.reason) for d in res.decisions] + [
            tuple(sorted(res.detector_counts.items()))]
    assert outcome(example(name)) == outcome(example("enrich"))


@pytest.mark.parametrize("name", UPPER)
def test_upper_ports(name: str) -> None:
    f = example(name)
    got = run(f, b"hello w\xc3\xb6rld", b"ABC", None)
    assert got[0].action == Action.REWRITE
    assert got[0].value == b"HELLO W\xc3\xb6RLD"
    assert got[1].action == Action.KEEP
    assert got[2].action == Action.KEEP
    res = f.run_batch(CTX, [FilterRecord(0, 0, None, b"a" * 100_000)] * 20)
    assert res.detector_counts == {"upper_cased": 20}


def test_connect_abi_to_upper_and_value_to_key() -> None:
    upper = example("connect-functions", function="to_upper")
    assert upper.abi == "connect"
    (d,) = run(upper, b"the-value", key=b"the-key")
    assert (d.action, d.key, d.value) == (Action.REWRITE, b"the-key", b"THE-VALUE")
    v2k = example("connect-functions", function="value_to_key")
    (d,) = run(v2k, b"the-value", key=b"the-key")
    assert (d.action, d.key, d.value) == (Action.REWRITE, b"the-value", b"the-value")
    # many records: the guest's allocator must not leak
    decisions = run(upper, *[b"x" * 5000] * 400)
    assert all(d.value == b"X" * 5000 for d in decisions)


def test_inplace_abi_transform_record() -> None:
    f = example("inplace-enrich")
    assert f.abi == "inplace"
    got = run(f, b'{ "user_id" : 1,\n  "tags": [ "a b", 2 ] }', b'{"name": "user_id"}',
              b"garbage", b'{"user_id": 1} trailing')
    assert got[0].action == Action.REWRITE
    assert got[0].value == b'{"user_id":1,"tags":["a b",2]}'
    assert got[1].action == Action.DROP
    assert got[2].action == Action.REJECT and got[2].failure is not None
    assert got[3].action == Action.REJECT


def test_go_pii_mask_masks_seed_004s_lines() -> None:
    f = example("pii-mask-go")
    got = run(f, b"AWS_SECRET_ACCESS_KEY=myawssecretkeyvalue", b"My email is example@email.com",
              b"user=ann password=hunter2; token='abc' nothing@here x@y.z", b"plain", None)
    assert got[0].value == b"AWS_SECRET_ACCESS_KEY=*******************"
    assert got[1].value == b"My email is *******@*****.***"
    assert got[2].value == b"user=ann password=*******; token='abc' nothing@here x@y.z"
    assert [d.action for d in got[3:]] == [Action.KEEP, Action.KEEP]
    res = f.run_batch(CTX, [FilterRecord(0, 0, None, b"a@b.io PASSWORD=x", [])])
    assert res.detector_counts == {"email": 1, "secret": 1}


def test_go_pii_mask_emails_like_the_builtin() -> None:
    values = [b"write to ann.lee+tag@mail.example.com.", b"two: a@b.de, c_d@e-f.org"]
    go = run(example("pii-mask-go"), *values)
    builtin = run(load_filter(FilterSpec(name="b", module="builtin:pii-mask")), *values)
    assert [d.value for d in go] == [d.value for d in builtin]
    assert go[0].value == b"write to ***.***+***@****.*******.***."


def test_go_pii_mask_config() -> None:
    f = example("pii-mask-go", config={"mask": "#", "email": False, "secret_words": ["pin"]})
    (d,) = run(f, b"a@b.io PIN=1234 secret=x")
    assert d.value == b"a@b.io PIN=#### secret=x"
    with pytest.raises(ValueError, match="mask must be one ASCII character"):
        example("pii-mask-go", config={"mask": "##"})
    with pytest.raises(ValueError, match="secret_words must be a non-empty list"):
        example("pii-mask-go", config={"secret_words": []})
