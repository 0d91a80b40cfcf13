"""The filters: section of the proxy config: valid entries, and errors that name file/line/field."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from sluice.filters.config import (
    BUILTIN_DIR,
    DEFAULT_MAX_MEMORY_MB,
    DEFAULT_TIMEOUT_MS,
    ConfigError,
    FilterSpec,
    load_filter_specs,
    parse_filter_specs,
    resolve_module,
)
from sluice.filters.yaml_lines import load_yaml_with_lines


def write(tmp_path: Path, text: str) -> Path:
    (tmp_path / "upper.wasm").write_bytes(b"\0asm\1\0\0\0")
    path = tmp_path / "sluice.yaml"
    path.write_text(textwrap.dedent(text).lstrip("\n"))
    return path


def error_of(tmp_path: Path, text: str) -> ConfigError:
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as info:
        load_filter_specs(path)
    return info.value


def test_full_entry_parses_with_defaults_and_resolution(tmp_path: Path) -> None:
    path = write(tmp_path, """
        listen: 127.0.0.1:9092
        filters:
          - name: seed-style
            module: ./upper.wasm
            topics: ["raw.*"]
            apply_to: [produce]
            function: to_upper
          - name: dlq
            module: upper.wasm
            topics: orders
            apply_to: [produce, fetch]
            on_error: dead-letter
            dead_letter_topic: orders.dlq
            config: {mask: "*", keep_last: 4, nested: {list: [1, 2.5, null, true]}}
            principals: ["User:*"]
            timeout_ms: 250
            max_memory_mb: 16
    """)
    first, second = load_filter_specs(path)
    assert first.name == "seed-style"
    assert first.module_path == tmp_path / "upper.wasm"
    assert first.topics == ("raw.*",)
    assert first.apply_to == frozenset({"produce"})
    assert first.on_error == "reject"
    assert first.function == "to_upper"
    assert first.config == {}
    assert first.config_json == b"{}"
    assert (first.timeout_ms, first.max_memory_mb) == (DEFAULT_TIMEOUT_MS, DEFAULT_MAX_MEMORY_MB)
    assert first.where == f"{path}:3"
    assert second.topics == ("orders",)  # a single string is accepted as a one-item list
    assert second.on_error == "dead-letter" and second.dead_letter_topic == "orders.dlq"
    assert second.config_json == (b'{"mask":"*","keep_last":4,'
                                  b'"nested":{"list":[1,2.5,null,true]}}')
    assert second.principals == ("User:*",)
    assert (second.timeout_ms, second.max_memory_mb) == (250, 16)
    assert second.line == 8


def test_absent_or_empty_section_means_no_filters(tmp_path: Path) -> None:
    assert load_filter_specs(write(tmp_path, "listen: x\n")) == []
    assert load_filter_specs(write(tmp_path, "filters:\n")) == []
    assert load_filter_specs(write(tmp_path, "")) == []


def test_apply_to_typo_names_file_line_and_field(tmp_path: Path) -> None:
    err = error_of(tmp_path, """
        filters:
          - name: a
            module: upper.wasm
            topics: ["*"]
            apply_to: [produce]
          - name: b
            module: upper.wasm
            topics: ["*"]
            apply_to:
              - fetch
              - prodcue
    """)
    assert str(err) == (f"{tmp_path / 'sluice.yaml'}:11: filters[1].apply_to[1]: unknown value "
                        "'prodcue' (expected produce, fetch, admin)")
    assert (err.line, err.field) == (11, "filters[1].apply_to[1]")


@pytest.mark.parametrize(("body", "line", "field", "reason"), [
    ("  - module: upper.wasm\n    topics: [a]\n    apply_to: [produce]\n",
     2, "filters[0].name", "required field is missing"),
    ("  - name: a\n    module: upper.wasm\n    topics: [a]\n    apply_to: [produce]\n"
     "    on_error: drop\n", 6, "filters[0].on_error", "unknown value 'drop'"),
    ("  - name: a\n    module: upper.wasm\n    topics: [a]\n    apply_to: [produce]\n"
     "    on_error: dead-letter\n", 2, "filters[0].dead_letter_topic",
     "required when on_error is dead-letter"),
    ("  - name: a\n    module: missing.wasm\n    topics: [a]\n    apply_to: [produce]\n",
     3, "filters[0].module", "module file not found"),
    ("  - name: a\n    module: builtin:no-such-filter\n    topics: [a]\n    apply_to: [fetch]\n",
     3, "filters[0].module", "unknown builtin 'no-such-filter'"),
    ("  - name: a\n    module: builtin:../etc\n    topics: [a]\n    apply_to: [fetch]\n",
     3, "filters[0].module", "invalid builtin name"),
    ("  - name: a\n    module: upper.wasm\n    topics: []\n    apply_to: [produce]\n",
     4, "filters[0].topics", "must not be empty"),
    ("  - name: a\n    module: upper.wasm\n    topics: [a, 3]\n    apply_to: [produce]\n",
     4, "filters[0].topics[1]", "must be a non-empty string, got an integer"),
    ("  - name: a\n    module: upper.wasm\n    topics: [a]\n",
     2, "filters[0].apply_to", "required field is missing"),
    ("  - name: a\n    module: upper.wasm\n    topics: [a]\n    apply_to: [produce]\n"
     "    config: [1, 2]\n", 6, "filters[0].config", "must be a mapping, got a list"),
    ("  - name: a\n    module: upper.wasm\n    topics: [a]\n    apply_to: [produce]\n"
     "    config:\n      when: 2024-01-01\n", 7, "filters[0].config.when",
     "cannot be passed as JSON"),
    ("  - name: a\n    module: upper.wasm\n    topics: [a]\n    apply_to: [produce]\n"
     "    config:\n      x: .nan\n", 7, "filters[0].config.x", "finite number"),
    ("  - name: a\n    module: upper.wasm\n    topics: [a]\n    apply_to: [produce]\n"
     "    on_eror: pass\n", 6, "filters[0].on_eror", "unknown field"),
    ("  - name: a\n    module: upper.wasm\n    topics: [a]\n    apply_to: [produce]\n"
     "    timeout_ms: 0\n", 6, "filters[0].timeout_ms", "must be between 1 and"),
    ("  - name: a\n    module: upper.wasm\n    topics: [a]\n    apply_to: [produce]\n"
     "    max_memory_mb: lots\n", 6, "filters[0].max_memory_mb", "must be an integer"),
    ("  - name: a\n    module: upper.wasm\n    topics: [a]\n    apply_to: [produce]\n"
     "    function: 'bad name'\n", 6, "filters[0].function", "not a valid export name"),
    ("  - name: a\n    module: upper.wasm\n    topics: [a]\n    apply_to: [produce]\n"
     "  - name: a\n    module: upper.wasm\n    topics: [b]\n    apply_to: [fetch]\n",
     6, "filters[1].name", "duplicate filter name 'a' (also filters[0])"),
    ("  - just a string\n", 2, "filters[0]", "each filter must be a mapping"),
])
def test_errors_are_located(tmp_path: Path, body: str, line: int, field: str,
                            reason: str) -> None:
    err = error_of(tmp_path, "filters:\n" + body)
    assert err.line == line, str(err)
    assert err.field == field, str(err)
    assert reason in err.reason, str(err)
    assert str(err).startswith(f"{tmp_path / 'sluice.yaml'}:{line}: {field}: ")


def test_filters_must_be_a_list(tmp_path: Path) -> None:
    err = error_of(tmp_path, "filters: {name: a}\n")
    assert (err.line, err.field) == (1, "filters")


def test_duplicate_yaml_key_is_an_error(tmp_path: Path) -> None:
    err = error_of(tmp_path, """
        filters:
          - name: a
            module: upper.wasm
            name: b
    """)
    assert (err.line, err.field, err.reason) == (4, "filters[0].name", "duplicate key")


def test_yaml_syntax_error_has_a_line(tmp_path: Path) -> None:
    err = error_of(tmp_path, "filters:\n  - name: [unclosed\n")
    assert err.line is not None and err.reason.startswith("invalid YAML")


def test_unreadable_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read file"):
        load_filter_specs(tmp_path / "absent.yaml")


def test_builtin_resolves_into_the_package() -> None:
    assert resolve_module("builtin:pii-mask", Path("/elsewhere")) == BUILTIN_DIR / "pii-mask.wasm"
    assert resolve_module("/abs/x.wasm", Path("/elsewhere")) == Path("/abs/x.wasm")
    assert resolve_module("rel/x.wasm", Path("/base")) == Path("/base/rel/x.wasm")


def test_parse_without_line_map_and_file_checks(tmp_path: Path) -> None:
    raw = [{"name": "a", "module": "nowhere.wasm", "topics": ["t"], "apply_to": ["admin"]}]
    (spec,) = parse_filter_specs(raw, tmp_path / "conf.yaml", None, check_files=False)
    assert spec.module_path == tmp_path / "nowhere.wasm"
    with pytest.raises(ConfigError) as info:
        parse_filter_specs([{"name": "a"}], "conf.yaml", None, check_files=False)
    assert str(info.value) == "conf.yaml: filters[0].module: required field is missing"


def test_programmatic_spec_is_validated() -> None:
    with pytest.raises(ValueError, match="dead_letter_topic"):
        FilterSpec(name="x", module="m.wasm", on_error="dead-letter")
    with pytest.raises(ValueError, match="apply_to"):
        FilterSpec(name="x", module="m.wasm", apply_to=frozenset({"produc"}))


def test_line_map_is_reusable_for_other_sections(tmp_path: Path) -> None:
    path = write(tmp_path, """
        telemetry:
          sink: files
          files:
            dir: /tmp/x
        metrics: {port: 9100}
    """)
    data, lines = load_yaml_with_lines(path)
    assert data["telemetry"]["files"]["dir"] == "/tmp/x"
    assert lines.line(("telemetry", "files", "dir")) == 4
    assert lines.line(("metrics", "port")) == 5
    # A missing field is located at its closest existing parent.
    assert lines.line(("telemetry", "files", "rotate_mb")) == 3
    err = lines.error(("metrics", "port"), "must be above 1024")
    assert str(err) == f"{path}:5: metrics.port: must be above 1024"
    assert lines.sub(("telemetry",))[("files", "dir")] == 4
