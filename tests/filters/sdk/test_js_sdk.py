"""The JavaScript SDK (filters/sdk/js): seed 001's uppercase example and seed 002's batch
shape as the guide prints them, what a filter's return values mean, its errors, and the
sandbox's limits (call deadline, memory cap) holding for the interpreter as for any module.

Each filter here is built from source with `sluice filter build`'s builder (the QuickJS-ng
engine is compiled once per machine, so a build is a link of a few seconds)."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from sluice.filters.admin import AdminResource
from sluice.filters.build import build_filter
from sluice.filters.config import FilterSpec
from sluice.filters.context import FilterRecord, RecordContext
from sluice.filters.decisions import Action
from sluice.filters.runtime import FilterLoadError, LoadedFilter, load_filter

GUIDE = Path(__file__).resolve().parents[3] / "docs" / "WRITING_FILTERS.md"
CTX = RecordContext(topic="events", partition=2, direction="produce", client_id="app",
                    principal="User:ann")


@pytest.fixture(scope="module")
def js(tmp_path_factory: pytest.TempPathFactory) -> Callable[..., LoadedFilter]:
    """Builds `source` as a JavaScript filter and loads it with the spec's extra fields."""
    built: dict[str, Path] = {}

    def make(source: str, **spec: Any) -> LoadedFilter:
        if source not in built:
            d = tmp_path_factory.mktemp("jsf") / "f"
            d.mkdir()
            (d / "filter.js").write_text(source)
            built[source] = build_filter(d, d / "f.wasm")
        # The deadline counts the engine's epochs, which tick by the wall clock, and a call
        # includes instantiating the 1 MB QuickJS module (~17 ms quiet): on a loaded CI
        # machine the default 100 ms was seen exceeded. Tests not about the deadline get room.
        spec.setdefault("timeout_ms", 2000)
        return load_filter(FilterSpec(name="js", module=str(built[source]), **spec))

    return make


def run(f: LoadedFilter, *values: bytes | None, headers: list[Any] | None = None) -> Any:
    recs = [FilterRecord(i, i, b"k", v, list(headers or [])) for i, v in enumerate(values)]
    return f.run_batch(CTX, recs, timestamp_base=1_700_000_000_000)


def test_seed_001_uppercase_runs_as_the_guide_prints_it(js: Callable[..., LoadedFilter]) -> None:
    (code,) = re.findall(r"```javascript\n(.*?)```", GUIDE.read_text(), flags=re.DOTALL)
    assert "record.value.map((char) =>" in code and "async (record)" in code
    res = run(js(code), b"hello, world", b"ALREADY", b"")
    assert [d.action for d in res.decisions] == [Action.REWRITE, Action.KEEP, Action.KEEP]
    assert res.decisions[0].value == b"HELLO, WORLD"
    assert res.decisions[0].key == b"k"  # members the filter left out stay as they were


SEED_002 = """
import { engine } from "sluice";
const uppercase = (record) => ({ ...record, value: record.value.text().toUpperCase() });
engine.processRecord((recordBatch) => {
  const result = new Map();
  const transformedRecord = recordBatch.map(({ header, records }) => {
    return {
      header,
      records: records.filter((r) => r.value.text() !== "drop me").map(uppercase),
    };
  });
  result.set("uppercase_result_topic", transformedRecord);
  return Promise.resolve(result);
});
"""


def test_seed_002_batch_in_batch_out(js: Callable[..., LoadedFilter]) -> None:
    res = run(js(SEED_002), b"abc", b"drop me", b"x y")
    assert [d.action for d in res.decisions] == [Action.REWRITE, Action.DROP, Action.REWRITE]
    assert [res.decisions[0].value, res.decisions[2].value] == [b"ABC", b"X Y"]


FATES = """
import { count, drop, onRecord, reject, utf8 } from "sluice";
onRecord((r) => {
  const v = r.value === null ? null : r.value.text();
  count("seen");
  if (v !== null && v.startsWith("{")) return { value: JSON.stringify(r.value.json()) };
  switch (v) {
    case "keep": return r;
    case "nothing": return;
    case "drop": return drop();
    case "null": return null;
    case "reject": return reject(`no ${r.topic}/${r.partition} ${r.principal} ${r.direction}`);
    case "bytes": return { value: utf8("\\u00e9") };
    case "key": return { key: null, headers: [["h", "1"], { key: "n", value: null }] };
    case "same": return { value: r.value.array(), key: "k" };
    case "ctx": return { value: `${r.offset}|${r.timestamp}|${r.clientId}|${r.header("h")}` };
    case "json": return { value: JSON.stringify(r.value.json()) };
    case "async": return Promise.resolve({ value: "later" });
  }
  return { value: 42 };
});
"""


def test_what_a_record_function_returns(js: Callable[..., LoadedFilter]) -> None:
    f = js(FATES)
    res = run(f, b"keep", b"nothing", b"drop", b"null", b"reject", b"bytes", b"key", b"same",
              b"ctx", b'{"a": [1, 2]}', b"async")
    acts = [d.action for d in res.decisions]
    assert acts == [Action.KEEP, Action.KEEP, Action.DROP, Action.DROP, Action.REJECT,
                    Action.REWRITE, Action.REWRITE, Action.KEEP, Action.REWRITE, Action.REWRITE,
                    Action.REWRITE]
    d = res.decisions
    assert d[4].reason == "no events/2 User:ann produce"
    assert d[5].value == "é".encode()
    assert (d[6].key, d[6].value, d[6].headers) == (None, b"key", [("h", b"1"), ("n", None)])
    assert d[8].value == b"8|1700000000008|app|undefined"
    assert d[9].value == b'{"a":[1,2]}'
    assert d[10].value == b"later"
    assert res.detector_counts == {"seen": 11}
    # json() of a value that is not JSON: the strict parser's SyntaxError fails the batch.
    bad = run(f, b"json")
    assert bad.failure is not None
    assert "SyntaxError: unexpected character at filter.js:" in bad.failure
    wrong = run(f, b"other")
    assert wrong.failure is not None and "value must be a string, Uint8Array" in wrong.failure


def test_a_throw_fails_the_batch_with_its_message_and_line(
        js: Callable[..., LoadedFilter]) -> None:
    f = js('import { onRecord } from "sluice";\n\nonRecord((r) => {\n'
           '  throw new Error("boom");\n});\n')
    res = run(f, b"x")
    assert res.failure is not None
    assert "Error: boom at filter.js:4" in res.failure
    assert res.decisions[0].action == Action.REJECT


def test_load_errors_name_the_problem(js: Callable[..., LoadedFilter]) -> None:
    with pytest.raises(FilterLoadError, match="a filter can import only 'sluice'"):
        js('import { x } from "./other.js";\n')
    with pytest.raises(FilterLoadError, match="registers no handler"):
        js('import { count } from "sluice";\n')
    with pytest.raises(FilterLoadError, match="SyntaxError"):
        js('import { onRecord } from "sluice";\nonRecord((r) => {\n')
    refusing = ('import { config, onRecord } from "sluice";\n'
                'if (!config().limit) throw new Error("config.limit is required");\n'
                'onRecord((r) => undefined);\n')
    with pytest.raises(FilterLoadError, match=r"config\.limit is required"):
        js(refusing)
    assert run(js(refusing, config={"limit": 3}), b"x").decisions[0].action == Action.KEEP


def test_record_data_is_valid_during_its_batch_only(js: Callable[..., LoadedFilter]) -> None:
    f = js('import { onRecord } from "sluice";\nlet last = null;\n'
           'onRecord((r) => { const before = last; last = r.value;\n'
           '  return before === null ? undefined : { value: before.text() }; });\n')
    assert run(f, b"a").failure is None
    res = run(f, b"b")
    assert res.failure is not None and "belongs to an earlier batch" in res.failure


def test_cpu_deadline_stops_a_runaway_script(js: Callable[..., LoadedFilter]) -> None:
    f = js('import { onRecord } from "sluice";\n'
           'onRecord((r) => { if (r.value.text() === "loop") for (;;) {} });\n', timeout_ms=300)
    res = run(f, b"loop")
    assert res.failure is not None and res.failure.startswith("timeout")
    assert run(f, b"fine").failure is None  # a fresh instance serves the next batch


def test_memory_cap_holds(js: Callable[..., LoadedFilter]) -> None:
    f = js('import { onRecord } from "sluice";\nconst keep = [];\n'
           'onRecord((r) => { if (r.value.text() === "grow") '
           'for (;;) keep.push(new Uint8Array(1 << 20)); });\n', max_memory_mb=24,
           timeout_ms=2000)
    res = run(f, b"grow")
    assert res.failure is not None
    assert res.failure.startswith(("memory", "error")), res.failure
    assert run(f, b"fine").failure is None


def test_deep_recursion_fails_the_batch_not_the_host(js: Callable[..., LoadedFilter]) -> None:
    f = js('import { onRecord } from "sluice";\nfunction down(n) { return down(n + 1) + 1; }\n'
           'onRecord((r) => { if (r.value.text() === "deep") down(0); });\n')
    res = run(f, b"deep")
    assert res.failure is not None
    # QuickJS's own stack check (a RangeError) or the host's Wasm stack limit (a trap)
    assert "RangeError" in res.failure or res.failure.startswith("trap"), res.failure
    assert run(f, b"fine").failure is None


ADMIN_POLICY = """
import { onAdmin, onRecord, allow, deny, config } from "sluice";
const max = config().max_partitions ?? 4;
onRecord((r) => undefined);
onAdmin(async (req) => {
  if (req.op !== "create_topics") return allow();
  const retention = req.configs["retention.ms"];
  if (retention == null || Number(retention) < 3600000) {
    return deny(`retention.ms ${retention} is below the minimum 3600000 for ${req.name}`);
  }
  if (req.name === "explode") throw new Error("asked to fail");
  if (req.partitions > max) {
    return { decision: "rewrite", message: "capped", partitions: max };
  }
});
"""


def test_an_admin_function_answers_each_resource(js: Callable[..., LoadedFilter]) -> None:
    f = js(ADMIN_POLICY, apply_to=frozenset({"produce", "admin"}))
    assert "admin" in f.capabilities and f.supports_admin

    def ask(name: str, partitions: int, configs: dict[str, str | None]) -> Any:
        return f.run_admin(AdminResource("create_topics", name, partitions=partitions,
                                         replication_factor=1, configs=configs))

    short = ask("t.short", 1, {"retention.ms": "1000"})
    assert (short.decision, short.message) == (
        "deny", "retention.ms 1000 is below the minimum 3600000 for t.short")
    assert ask("t.none", 1, {}).decision == "deny"
    ok = ask("t.ok", 2, {"retention.ms": "7200000"})
    assert (ok.decision, ok.partitions) == ("allow", None)
    capped = ask("t.big", 50, {"retention.ms": "7200000"})
    assert (capped.decision, capped.partitions, capped.message) == ("rewrite", 4, "capped")
    failed = ask("explode", 1, {"retention.ms": "7200000"})
    assert failed.decision == "deny" and failed.failure is not None
    assert "Error: asked to fail at filter.js:11" in failed.failure
    assert ask("t.after", 1, {"retention.ms": "7200000"}).decision == "allow"
    assert run(f, b"x").decisions[0].action == Action.KEEP  # records pass as before


def test_admin_answers_are_checked_and_only_admin_filters_export_it(
        js: Callable[..., LoadedFilter]) -> None:
    f = js('import { onAdmin } from "sluice";\nonAdmin((req) => req.name);\n',
           apply_to=frozenset({"admin"}))
    v = f.run_admin(AdminResource("create_topics", "t", partitions=1))
    assert v.decision == "deny" and v.failure is not None
    assert "TypeError: an admin function returns allow(), deny(message)" in v.failure
    # a filter with only an admin function keeps every record
    assert run(f, b"x").decisions[0].action == Action.KEEP
    # the build exports sluice_admin only for a filter that calls onAdmin
    source = 'import { onRecord } from "sluice";\nonRecord((r) => undefined);\n'
    assert "admin" not in js(source).capabilities
    with pytest.raises(FilterLoadError, match="does not export"):
        js(source, apply_to=frozenset({"admin"}))
