"""The ``sluice filter`` subcommand: the filter author's loop.

    sluice filter new NAME [--lang c|zig|rust|assemblyscript|go|js|python] [--dir PARENT]
                                                            write a ready-to-build template
    sluice filter build PATH [-o OUT.wasm]                  compile PATH/filter.{c,zig,rs,ts,go,
                                                            js,py}
    sluice filter test MODULE --input FILE.jsonl [--config FILE] [--output FILE.jsonl]
                                                            run a module over sample records

``test`` loads the module with the production filter runtime (the code the proxy runs), so
what it prints is what the proxy would do. Input: one JSON object per line,
``{"topic", "key", "value", "headers", "partition", "timestamp"}``; a bytes field is null, a
string (its UTF-8 bytes) or ``{"base64": "..."}``; headers are an object or a list of
``[name, value]`` pairs. ``--output`` writes the records in the same format plus ``decision``,
``reason`` and ``filter_error`` fields (dropped and rejected records keep their input form).

    sluice filter keygen KEYFILE                    a key pair that signs fleet records
    sluice filter deploy NAME MODULE --topics T1,T2 --on produce,fetch --bootstrap HOST:PORT
    sluice filter remove NAME --bootstrap HOST:PORT
    sluice filter resign|restore ...                key rotation, recovery after fleet loss
    sluice filter list --bootstrap HOST:PORT        the filter fleet: see sluice/fleet_cli.py
"""

from __future__ import annotations

import argparse
import base64
import binascii
import hashlib
import json
import re
import sys
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any, TextIO

_NAME = re.compile(r"^[a-z0-9][a-z0-9_-]{0,62}$")
_LANG_ENTRY = {"c": "filter.c", "zig": "filter.zig", "rust": "filter.rs",
               "assemblyscript": "filter.ts", "go": "filter.go", "js": "filter.js",
               "python": "filter.py"}


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "filter", help="write, build, test and deploy Wasm filters",
        description="The filter author's loop: new -> build -> test; then deploy, remove "
                    "and list filters of the fleet topic that proxies follow, signed with an "
                    "operator's key (keygen; resign to rotate keys; restore after the fleet "
                    "topic was lost; docs/SECURITY.md).")
    sub = parser.add_subparsers(dest="filter_command", metavar="ACTION")
    parser.set_defaults(func=lambda _args: _usage(parser))

    new = sub.add_parser("new", help="write a ready-to-build filter template directory")
    new.add_argument("name", help="filter name (lower case letters, digits, - and _)")
    new.add_argument("--lang", choices=sorted(_LANG_ENTRY), default="c",
                     help="language of the template (default: c)")
    new.add_argument("--dir", type=Path, default=Path("."),
                     help="parent directory for the new NAME/ directory (default: .)")
    new.set_defaults(func=cmd_new)

    build = sub.add_parser("build", help="compile a filter directory to a .wasm module")
    build.add_argument("path", type=Path,
                       help="directory holding filter.c, filter.zig, filter.rs, filter.ts, "
                            "filter.go or filter.js")
    build.add_argument("-o", "--output", type=Path,
                       help="output file (default: PATH/NAME.wasm, NAME = the directory name)")
    build.set_defaults(func=cmd_build)

    test = sub.add_parser(
        "test", help="run a module over sample records, without a broker",
        description="Run MODULE over the records of a JSONL file with the proxy's filter "
                    "runtime and print what each record became and why.")
    test.add_argument("module", help="a .wasm file or builtin:NAME")
    test.add_argument("--input", "-i", type=Path, required=True,
                      help="JSONL records: {topic, key, value, headers, partition, timestamp}")
    test.add_argument("--config", "-c", type=Path,
                      help="YAML or JSON file holding the filter's config mapping")
    test.add_argument("--output", "-o", type=Path, help="write the results as JSONL here")
    test.add_argument("--function", help="entry point for the in-place and Kafka Connect ABIs")
    test.add_argument("--direction", choices=("produce", "fetch"), default="produce")
    test.add_argument("--topic", default="test", help="topic for lines without one")
    test.add_argument("--client-id", default="sluice-filter-test")
    test.add_argument("--principal", default="User:test")
    test.add_argument("--quiet", "-q", action="store_true", help="print only the summary")
    test.set_defaults(func=cmd_test)

    from sluice.fleet_cli import add_subcommands

    add_subcommands(sub)  # deploy, remove, list: the filter fleet (sluice/fleet_cli.py)


def _usage(parser: argparse.ArgumentParser) -> int:
    parser.print_help(sys.stderr)
    return 2


def _err(message: str) -> None:
    print(f"sluice filter: {message}", file=sys.stderr)


# ------------------------------------------------------------------------------------------
# new
# ------------------------------------------------------------------------------------------

def cmd_new(args: argparse.Namespace) -> int:
    name: str = args.name
    if not _NAME.match(name):
        _err(f"invalid name {name!r}: use lower case letters, digits, '-' and '_'")
        return 2
    target = Path(args.dir) / name
    if target.exists():
        _err(f"{target} already exists")
        return 2
    template = resources.files("sluice.filters").joinpath("sdk", "templates", args.lang)
    target.mkdir(parents=True)
    written = []
    for item in sorted(template.iterdir(), key=lambda t: t.name):
        if not item.is_file():
            continue
        text = item.read_text(encoding="utf-8").replace("{{NAME}}", name)
        (target / item.name).write_text(text, encoding="utf-8")
        written.append(item.name)
    print(f"created {target}/ ({', '.join(written)})")
    print(f"next:  sluice filter build {target}")
    wasm, sample = target / f"{name}.wasm", target / "sample.jsonl"
    print(f"       sluice filter test {wasm} --input {sample}")
    return 0


# ------------------------------------------------------------------------------------------
# build
# ------------------------------------------------------------------------------------------

def cmd_build(args: argparse.Namespace) -> int:
    from sluice.filters.build import BuildError, build_filter

    path: Path = args.path
    if not path.is_dir():
        _err(f"{path} is not a directory")
        return 2
    output: Path = args.output or path / f"{path.resolve().name}.wasm"
    try:
        out = build_filter(path, output)
    except BuildError as exc:
        _err(str(exc))
        return 1
    data = out.read_bytes()
    print(f"built {output} ({len(data)} bytes, sha256 {hashlib.sha256(data).hexdigest()})")
    return 0


# ------------------------------------------------------------------------------------------
# test
# ------------------------------------------------------------------------------------------

class InputError(ValueError):
    """A line of the input file does not follow the format (message names the line)."""


@dataclass
class SampleRecord:
    """One input line."""

    line: int
    topic: str
    partition: int
    key: bytes | None
    value: bytes | None
    headers: list[tuple[str, bytes | None]] = field(default_factory=list)
    timestamp: int = 0


def _bytes_field(obj: Any, what: str, line: int) -> bytes | None:
    if obj is None:
        return None
    if isinstance(obj, str):
        return obj.encode("utf-8")
    if isinstance(obj, dict) and set(obj) == {"base64"} and isinstance(obj["base64"], str):
        try:
            return base64.b64decode(obj["base64"], validate=True)
        except binascii.Error as exc:
            raise InputError(f"line {line}: {what}: bad base64 ({exc})") from None
    raise InputError(f"line {line}: {what} must be null, a string or {{\"base64\": \"...\"}}")


def _headers_field(obj: Any, line: int) -> list[tuple[str, bytes | None]]:
    if obj is None:
        return []
    pairs: list[Any]
    if isinstance(obj, dict):
        pairs = list(obj.items())
    elif isinstance(obj, list):
        pairs = obj
    else:
        raise InputError(f"line {line}: headers must be an object or a list of [name, value]")
    out = []
    for pair in pairs:
        if not (isinstance(pair, (list, tuple)) and len(pair) == 2 and isinstance(pair[0], str)):
            raise InputError(f"line {line}: each header must be [name, value]")
        out.append((pair[0], _bytes_field(pair[1], f"header {pair[0]!r}", line)))
    return out


def read_records(path: Path, default_topic: str) -> list[SampleRecord]:
    """Parse the JSONL input (InputError names the offending line)."""
    records = []
    with path.open(encoding="utf-8") as fh:
        for n, raw in enumerate(fh, start=1):
            if not raw.strip():
                continue
            try:
                obj = json.loads(raw)
            except ValueError as exc:
                raise InputError(f"line {n}: not JSON ({exc})") from None
            if not isinstance(obj, dict):
                raise InputError(f"line {n}: expected a JSON object")
            topic = obj.get("topic", default_topic)
            partition = obj.get("partition", 0)
            timestamp = obj.get("timestamp", 0)
            if not isinstance(topic, str) or not topic:
                raise InputError(f"line {n}: topic must be a non-empty string")
            if not isinstance(partition, int) or not isinstance(timestamp, int):
                raise InputError(f"line {n}: partition and timestamp must be integers")
            records.append(SampleRecord(
                line=n, topic=topic, partition=partition,
                key=_bytes_field(obj.get("key"), "key", n),
                value=_bytes_field(obj.get("value"), "value", n),
                headers=_headers_field(obj.get("headers"), n), timestamp=timestamp))
    return records


def _load_config(path: Path | None) -> dict[str, Any]:
    if path is None:
        return {}
    import yaml

    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as exc:
        raise InputError(f"{path}: {exc}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise InputError(f"{path}: the filter config must be a mapping")
    return data


def _show(b: bytes | None) -> Any:
    """Bytes as the JSONL format writes them."""
    if b is None:
        return None
    try:
        return b.decode("utf-8")
    except UnicodeDecodeError:
        return {"base64": base64.b64encode(b).decode("ascii")}


def _short(b: bytes | None, limit: int = 120) -> str:
    if b is None:
        return "null"
    text = json.dumps(_show(b), ensure_ascii=False)
    return text if len(text) <= limit else text[:limit] + f"... ({len(b)} bytes)"


def _describe(rec: SampleRecord, decision: Any, out: TextIO) -> None:
    action = decision.action.name
    where = f"line {rec.line} {rec.topic}/{rec.partition}"
    if decision.failure is not None:
        print(f"{where}: ERROR    filter failed: {decision.failure}", file=out)
    elif action == "KEEP":
        print(f"{where}: KEEP", file=out)
    elif action == "DROP":
        print(f"{where}: DROP", file=out)
    elif action == "REJECT":
        print(f"{where}: REJECT   {decision.reason}", file=out)
    else:
        print(f"{where}: REWRITE", file=out)
        if decision.key != rec.key:
            print(f"    key:     {_short(rec.key)} -> {_short(decision.key)}", file=out)
        if decision.value != rec.value:
            print(f"    value:   {_short(rec.value)} -> {_short(decision.value)}", file=out)
        if list(decision.headers) != rec.headers:
            before = [(k, _show(v)) for k, v in rec.headers]
            after = [(k, _show(v)) for k, v in decision.headers]
            print(f"    headers: {json.dumps(before, ensure_ascii=False)} -> "
                  f"{json.dumps(after, ensure_ascii=False)}", file=out)


def _result_line(rec: SampleRecord, decision: Any) -> dict[str, Any]:
    action = decision.action.name.lower()
    rewritten = action == "rewrite" and decision.failure is None
    key = decision.key if rewritten else rec.key
    value = decision.value if rewritten else rec.value
    headers = list(decision.headers) if rewritten else rec.headers
    return {
        "topic": rec.topic, "partition": rec.partition, "timestamp": rec.timestamp,
        "key": _show(key), "value": _show(value),
        "headers": [[k, _show(v)] for k, v in headers],
        "decision": "error" if decision.failure is not None else action,
        "reason": decision.reason if action == "reject" and decision.failure is None else None,
        "filter_error": decision.failure,
    }


def cmd_test(args: argparse.Namespace) -> int:
    from sluice.filters.config import FilterSpec
    from sluice.filters.context import FilterRecord, RecordContext
    from sluice.filters.runtime import FilterLoadError, load_filter

    try:
        records = read_records(args.input, args.topic)
        config = _load_config(args.config)
    except (InputError, OSError) as exc:
        _err(str(exc))
        return 2
    module: str = args.module
    name = module.split(":", 1)[1] if module.startswith("builtin:") else Path(module).stem
    try:
        spec = FilterSpec(name=name or "filter", module=module, config=config,
                          function=args.function, apply_to=frozenset({args.direction}),
                          base_dir=Path.cwd(), source="sluice filter test")
        loaded = load_filter(spec)
    except (FilterLoadError, ValueError) as exc:
        _err(str(exc))
        return 1
    out = sys.stdout
    totals: dict[str, int] = {}
    detectors: dict[str, int] = {}
    results: list[dict[str, Any]] = []
    print(f"{module}: sha256 {loaded.sha256}, {loaded.abi} ABI, {len(records)} record(s)",
          file=out)
    # Consecutive lines of one topic/partition form one batch, as in a Produce request.
    i = 0
    while i < len(records):
        j = i
        while (j < len(records) and records[j].topic == records[i].topic
               and records[j].partition == records[i].partition):
            j += 1
        batch = records[i:j]
        ctx = RecordContext(topic=batch[0].topic, partition=batch[0].partition,
                            direction=args.direction, client_id=args.client_id,
                            principal=args.principal)
        inputs = [FilterRecord(k, r.timestamp, r.key, r.value, list(r.headers))
                  for k, r in enumerate(batch)]
        result = loaded.run_batch(ctx, inputs, apply_policy=False)
        for name_, count in result.detector_counts.items():
            detectors[name_] = detectors.get(name_, 0) + count
        for rec, decision in zip(batch, result.decisions, strict=True):
            if not args.quiet:
                _describe(rec, decision, out)
            line = _result_line(rec, decision)
            totals[line["decision"]] = totals.get(line["decision"], 0) + 1
            results.append(line)
        i = j
    loaded.close()
    summary = ", ".join(f"{k} {totals[k]}" for k in ("keep", "rewrite", "drop", "reject", "error")
                        if k in totals) or "no records"
    print(f"summary: {summary}", file=out)
    if detectors:
        print("counters: " + ", ".join(f"{k}={v}" for k, v in sorted(detectors.items())),
              file=out)
    if args.output is not None:
        with args.output.open("w", encoding="utf-8") as fh:
            for line in results:
                fh.write(json.dumps(line, ensure_ascii=False) + "\n")
    return 0
