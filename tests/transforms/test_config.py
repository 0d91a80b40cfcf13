"""The transforms: section: accepted shapes and errors that name file, line and field."""

from __future__ import annotations

from pathlib import Path

import pytest

from sluice.filters.yaml_lines import ConfigError
from sluice.proxy.ops.config_load import ConfigFileError, build_config
from sluice.transforms.config import load_transform_specs
from tests.transforms.runner_proc import UPPER_WASM


def _write(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "sluice.yaml"
    path.write_text(body)
    return path


GOOD = f"""transforms:
  - name: uppercase
    input: lowercase
    output: uppercase
    filters: [ {{module: {UPPER_WASM}, name: upper, on_error: dead-letter,
                 dead_letter_topic: dlq}} ]
"""


def test_minimal_entry(tmp_path: Path) -> None:
    (spec,) = load_transform_specs(_write(tmp_path, GOOD))
    assert spec.inputs == ("lowercase",)
    assert spec.output == "uppercase"
    assert spec.group == "sluice-transform-uppercase"
    assert spec.guarantee == "auto"
    assert spec.transactional_id("lowercase", 2) == "sluice-transform-uppercase.lowercase.2"
    (f,) = spec.filters
    assert f.apply_to == frozenset({"fetch"}) and f.topics == ("*",)
    assert f.on_error == "dead-letter" and f.dead_letter_topic == "dlq"


def test_proxy_config_loads_the_section(tmp_path: Path) -> None:
    config = build_config(("127.0.0.1", 0), [("127.0.0.1", 9092)], _write(tmp_path, GOOD))
    assert [s.name for s in config.transforms] == ["uppercase"]


@pytest.mark.parametrize(("edit", "message"), [
    (("    output: uppercase\n", ""), ":2: transforms[0].output: required field is missing"),
    (("output: uppercase", "output: lowercase"), ":4: transforms[0].output: 'lowercase' is "
                                                  "also an input"),
    (("name: upper,", "name: upper, topics: [x],"),
     ":5: transforms[0].filters[0].topics: not used in a transform"),
    (("input: lowercase", "input: []"), ":3: transforms[0].input: must be a topic name"),
    (("input: lowercase", "input: [a, 'b c']"), "transforms[0].input[1]: 'b c' is not a "
                                                 "valid Kafka topic name"),
    (("    output:", "    guarantee: twice\n    output:"),
     ":4: transforms[0].guarantee: unknown value 'twice'"),
    (("    output:", "    client_config: {transactional.id: x}\n    output:"),
     "transforms[0].client_config.transactional.id: set by the transform runner"),
    (("dead_letter_topic: dlq", "dead_letter_topic: dlq, timeout_ms: 0"),
     "transforms[0].filters[0].timeout_ms: must be between"),
    (("module: ", "module: missing-"), "transforms[0].filters[0].module: module file not found"),
])
def test_errors_name_line_and_field(tmp_path: Path, edit: tuple[str, str], message: str) -> None:
    path = _write(tmp_path, GOOD.replace(*edit))
    with pytest.raises(ConfigError) as err:
        load_transform_specs(path)
    assert message in str(err.value)
    assert str(err.value).startswith(str(path))


def test_duplicate_names_and_groups(tmp_path: Path) -> None:
    body = GOOD + GOOD.split("\n", 1)[1].replace("output: uppercase", "output: other")
    with pytest.raises(ConfigError, match="duplicate transform name 'uppercase'"):
        load_transform_specs(_write(tmp_path, body))
    body = GOOD + GOOD.split("\n", 1)[1].replace("name: uppercase",
                                                 "name: two\n    group: sluice-transform-uppercase")
    with pytest.raises(ConfigError, match="consumer group 'sluice-transform-uppercase' is also"):
        load_transform_specs(_write(tmp_path, body))


def test_serve_reports_config_errors_with_location(tmp_path: Path) -> None:
    path = _write(tmp_path, GOOD.replace("input: lowercase", "input: 5"))
    with pytest.raises(ConfigFileError, match=r"sluice.yaml:3: transforms\[0\].input"):
        build_config(("127.0.0.1", 0), [("127.0.0.1", 9092)], path)
