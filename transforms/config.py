"""The ``transforms:`` section of the config file: parsing and validation.

Public contract (key names users and scripts rely on): ``name``, ``input``, ``output``,
``filters`` (each entry takes the keys of a ``filters[]`` entry less ``topics`` and
``apply_to``), ``guarantee`` (``auto``, ``exactly-once``, ``at-least-once``), ``group``,
``batch_records``, ``client_config``.

Errors are `ConfigError`s naming file, line and field, like the ``filters:`` section's, e.g.
``sluice.yaml:7: transforms[0].output: required field is missing``.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from sluice.filters.config import FilterSpec, parse_filter_specs
from sluice.filters.yaml_lines import ConfigError, FieldPath, LineMap, load_yaml_with_lines

__all__ = [
    "GUARANTEES",
    "TRANSFORM_DIRECTION",
    "ConfigError",
    "TransformSpec",
    "load_transform_specs",
    "parse_transform_specs",
]

GUARANTEES: Final = ("auto", "exactly-once", "at-least-once")
#: The direction a transform's filters are bound to: they see records read from the input.
TRANSFORM_DIRECTION: Final = "fetch"
DEFAULT_BATCH_RECORDS: Final = 500
MAX_BATCH_RECORDS: Final = 100_000
_KEYS: Final = ("name", "input", "output", "filters", "guarantee", "group", "batch_records",
                "client_config")
# Kafka's rule for topic names (and the group names we derive from transform names).
_TOPIC = re.compile(r"^[A-Za-z0-9._-]{1,249}$")
# Settings the runner owns: a user value would break offsets, transactions or partitioning.
_RESERVED_CLIENT_KEYS: Final = frozenset({
    "bootstrap.servers", "group.id", "enable.auto.commit", "enable.auto.offset.store",
    "transactional.id", "isolation.level", "enable.idempotence", "on_commit", "error_cb",
})


def with_security(spec: TransformSpec, security: Mapping[str, Any] | None) -> TransformSpec:
    """`spec` whose clients connect with `security` (librdkafka settings of the config's
    ``upstream_tls:``/``upstream_sasl:``) unless its own ``client_config`` says otherwise."""
    if not security:
        return spec
    return dataclasses.replace(spec, client_config={**security, **spec.client_config})


@dataclass(frozen=True, slots=True)
class TransformSpec:
    """One validated ``transforms[i]`` entry."""

    name: str
    inputs: tuple[str, ...]
    output: str
    filters: tuple[FilterSpec, ...]
    guarantee: str = "auto"
    group: str = ""
    batch_records: int = DEFAULT_BATCH_RECORDS
    client_config: Mapping[str, Any] = field(default_factory=dict)
    source: str = "<transforms>"
    line: int | None = None

    def __post_init__(self) -> None:
        if self.guarantee not in GUARANTEES:
            raise ValueError(f"guarantee must be one of {', '.join(GUARANTEES)}")
        if not self.group:
            object.__setattr__(self, "group", f"sluice-transform-{self.name}")

    def transactional_id(self, topic: str, partition: int) -> str:
        """The transactional id owning one input partition (exactly-once mode).

        One id per input partition, not per process: a new owner of the partition fences the
        old one with InitProducerId alone, which the bundled broker enforces (it does not
        check the consumer group generation of KIP-447; docs/TRANSFORMS.md).
        """
        return f"{self.group}.{topic}.{partition}"


def _kind(value: Any) -> str:
    return {dict: "a mapping", list: "a list", str: "a string", bool: "a boolean",
            int: "an integer", float: "a number"}.get(type(value), type(value).__name__)


class _Entry:
    def __init__(self, raw: Mapping[Any, Any], path: FieldPath, lines: LineMap,
                 source_path: str | Path, check_files: bool) -> None:
        self.raw = raw
        self.path = path
        self.lines = lines
        self.source_path = source_path
        self.check_files = check_files

    def fail(self, *sub: str | int, reason: str) -> ConfigError:
        return self.lines.error((*self.path, *sub), reason)

    def topic(self, value: Any, *sub: str | int) -> str:
        if not isinstance(value, str):
            raise self.fail(*sub, reason=f"must be a topic name, got {_kind(value)}")
        if not _TOPIC.match(value) or value in (".", ".."):
            raise self.fail(*sub, reason=f"{value!r} is not a valid Kafka topic name")
        return value

    def parse(self) -> TransformSpec:
        raw = self.raw
        for key in raw:
            if key not in _KEYS:
                raise self.fail(str(key), reason=f"unknown field (expected one of "
                                                 f"{', '.join(_KEYS)})")
        for key in ("name", "input", "output", "filters"):
            if raw.get(key) is None:
                raise self.fail(key, reason="required field is missing")
        name = raw["name"]
        if not isinstance(name, str) or not _TOPIC.match(name):
            raise self.fail("name", reason="must be a name of letters, digits, '.', '_', '-'")
        inputs_raw = raw["input"]
        inputs: tuple[str, ...]
        if isinstance(inputs_raw, str):
            inputs = (self.topic(inputs_raw, "input"),)
        elif isinstance(inputs_raw, list) and inputs_raw:
            inputs = tuple(self.topic(t, "input", i) for i, t in enumerate(inputs_raw))
            if len(set(inputs)) != len(inputs):
                raise self.fail("input", reason="lists a topic twice")
        else:
            raise self.fail("input", reason="must be a topic name or a non-empty list of them")
        output = self.topic(raw["output"], "output")
        if output in inputs:
            raise self.fail("output", reason=f"{output!r} is also an input (the transform "
                                              "would read its own output forever)")
        guarantee = raw.get("guarantee", "auto")
        if guarantee not in GUARANTEES:
            raise self.fail("guarantee", reason=f"unknown value {guarantee!r} "
                                                 f"(expected {', '.join(GUARANTEES)})")
        group = raw.get("group")
        if group is not None and (not isinstance(group, str) or not group.strip()):
            raise self.fail("group", reason="must be a non-empty consumer group name")
        batch = raw.get("batch_records", DEFAULT_BATCH_RECORDS)
        if isinstance(batch, bool) or not isinstance(batch, int) or not \
                0 < batch <= MAX_BATCH_RECORDS:
            raise self.fail("batch_records",
                            reason=f"must be an integer between 1 and {MAX_BATCH_RECORDS}")
        client = raw.get("client_config") or {}
        if not isinstance(client, dict):
            raise self.fail("client_config", reason=f"must be a mapping, got {_kind(client)}")
        for key, value in client.items():
            if key in _RESERVED_CLIENT_KEYS:
                raise self.fail("client_config", str(key),
                                reason="set by the transform runner; it cannot be overridden")
            if not isinstance(value, (str, int, float, bool)):
                raise self.fail("client_config", str(key),
                                reason=f"must be a scalar, got {_kind(value)}")
        return TransformSpec(
            name=name, inputs=inputs, output=output, filters=self.filters(),
            guarantee=guarantee, group=group or "", batch_records=batch,
            client_config=dict(client), source=self.lines.source,
            line=self.lines.line(self.path))

    def filters(self) -> tuple[FilterSpec, ...]:
        raw_list = self.raw["filters"]
        if not isinstance(raw_list, list) or not raw_list:
            raise self.fail("filters", reason="must be a non-empty list of filters")
        bound: list[Any] = []
        for i, entry in enumerate(raw_list):
            if isinstance(entry, dict):
                for key in ("topics", "apply_to"):
                    if key in entry:
                        raise self.fail("filters", i, key, reason=(
                            "not used in a transform (its filters see the transform's "
                            "input records)"))
                # Bound to every topic the transform reads, on the read side.
                entry = {**entry, "topics": ["*"], "apply_to": [TRANSFORM_DIRECTION]}
            bound.append(entry)
        specs = parse_filter_specs(bound, self.source_path, self.lines,
                                   field_prefix=(*self.path, "filters"),
                                   check_files=self.check_files)
        return tuple(specs)


def parse_transform_specs(raw_list: Any, source_path: str | Path,
                          line_map: LineMap | None = None, *,
                          check_files: bool = True) -> list[TransformSpec]:
    """Validate the value of ``transforms:`` into TransformSpecs (None: no transforms)."""
    lines = line_map if line_map is not None else LineMap(str(source_path))
    if raw_list is None:
        return []
    if not isinstance(raw_list, list):
        raise lines.error(("transforms",), f"must be a list of transforms, got {_kind(raw_list)}")
    specs: list[TransformSpec] = []
    names: dict[str, int] = {}
    groups: dict[str, int] = {}
    for i, raw in enumerate(raw_list):
        path: FieldPath = ("transforms", i)
        if not isinstance(raw, dict):
            raise lines.error(path, f"each transform must be a mapping, got {_kind(raw)}")
        spec = _Entry(raw, path, lines, source_path, check_files).parse()
        if spec.name in names:
            raise lines.error((*path, "name"), f"duplicate transform name {spec.name!r} "
                                               f"(also transforms[{names[spec.name]}])")
        if spec.group in groups:
            # Two transforms in one group would steal each other's partitions and offsets.
            raise lines.error((*path, "group"), f"consumer group {spec.group!r} is also used "
                                                f"by transforms[{groups[spec.group]}]")
        names[spec.name] = i
        groups[spec.group] = i
        specs.append(spec)
    return specs


def load_transform_specs(path: str | Path, *, check_files: bool = True) -> list[TransformSpec]:
    """Read a config file and return its ``transforms:`` (empty if the section is absent)."""
    data, lines = load_yaml_with_lines(path)
    if data is None:
        return []
    if not isinstance(data, dict):
        raise lines.error((), "the config must be a mapping")
    return parse_transform_specs(data.get("transforms"), path, lines, check_files=check_files)
