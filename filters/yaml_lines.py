"""YAML loading that remembers where each value came from, for error messages users can act on.

`load_yaml_with_lines(path)` returns the plain Python data (dicts, lists, scalars, as PyYAML's
safe loader builds them) together with a `LineMap` that answers "on which line of which file is
``filters[1].apply_to``?". Every config section (filters:, telemetry:, metrics:, tls:, ...)
reports its errors through `LineMap.error(path, reason)`, which builds a `ConfigError` whose
message reads ``sluice.yaml:12: filters[1].apply_to: unknown value 'prodcue' (...)``.

Duplicate mapping keys are an error here (PyYAML silently keeps the last one, which hides typos
such as two ``config:`` blocks in one filter).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

PathPart = str | int
FieldPath = tuple[PathPart, ...]


class ConfigError(ValueError):
    """A configuration problem; the message names the file, the line (when known) and the field.

    Attributes: ``source`` (file as given), ``line`` (1-based or None), ``field`` (dotted path
    such as ``filters[1].apply_to``, or "" for the whole document) and ``reason``.
    """

    def __init__(self, source: str, line: int | None, field: str, reason: str) -> None:
        self.source = source
        self.line = line
        self.field = field
        self.reason = reason
        where = source if line is None else f"{source}:{line}"
        super().__init__(f"{where}: {field}: {reason}" if field else f"{where}: {reason}")


def format_field(path: Sequence[PathPart]) -> str:
    """Render ``("filters", 1, "apply_to")`` as ``filters[1].apply_to``."""
    out: list[str] = []
    for part in path:
        if isinstance(part, int):
            out.append(f"[{part}]")
        else:
            out.append(f".{part}" if out else part)
    return "".join(out)


class LineMap:
    """Line numbers (1-based) of the values of a loaded YAML document, by field path.

    For a mapping entry the line is that of its key (where the user typed the field name); for
    a sequence item, the line where the item starts.
    """

    def __init__(self, source: str, lines: dict[FieldPath, int] | None = None) -> None:
        self.source = source
        self._lines: dict[FieldPath, int] = dict(lines or {})

    def line(self, path: Sequence[PathPart]) -> int | None:
        """Line of `path`, or of its deepest ancestor that has one (a missing field's parent)."""
        key = tuple(path)
        while True:
            found = self._lines.get(key)
            if found is not None:
                return found
            if not key:
                return None
            key = key[:-1]

    def error(self, path: Sequence[PathPart], reason: str) -> ConfigError:
        """A ConfigError located at `path` (raise it)."""
        return ConfigError(self.source, self.line(path), format_field(path), reason)

    def sub(self, prefix: Sequence[PathPart]) -> dict[FieldPath, int]:
        """Lines under `prefix`, re-keyed relative to it (for sections parsed elsewhere)."""
        n = len(prefix)
        pre = tuple(prefix)
        return {k[n:]: v for k, v in self._lines.items() if k[:n] == pre}


class _Walker:
    """Builds Python data from composed nodes while recording the line of every value."""

    def __init__(self, loader: yaml.SafeLoader, source: str) -> None:
        self.loader = loader
        self.source = source
        self.lines: dict[FieldPath, int] = {}

    def build(self, node: Node, path: FieldPath) -> Any:
        if isinstance(node, MappingNode):
            # Merge keys (<<) and other exotic constructs: let PyYAML flatten them first.
            self.loader.flatten_mapping(node)
            out: dict[Any, Any] = {}
            for key_node, value_node in node.value:
                key = self.loader.construct_object(key_node, deep=True)
                try:
                    hash(key)
                except TypeError:
                    raise ConfigError(
                        self.source, key_node.start_mark.line + 1, _render(path),
                        "mapping keys must be plain values",
                    ) from None
                child = (*path, key if isinstance(key, (str, int)) else str(key))
                if key in out:
                    raise ConfigError(
                        self.source, key_node.start_mark.line + 1, _render(child),
                        "duplicate key",
                    )
                self.lines[child] = key_node.start_mark.line + 1
                out[key] = self.build(value_node, child)
            return out
        if isinstance(node, SequenceNode):
            items = []
            for i, item in enumerate(node.value):
                child = (*path, i)
                self.lines[child] = item.start_mark.line + 1
                items.append(self.build(item, child))
            return items
        if isinstance(node, ScalarNode):
            return self.loader.construct_object(node, deep=True)
        return self.loader.construct_object(node, deep=True)


def _render(path: FieldPath) -> str:
    return format_field(path)


def load_yaml_text_with_lines(text: str, source: str) -> tuple[Any, LineMap]:
    """Like `load_yaml_with_lines` for text already in memory; `source` names it in errors."""
    loader = yaml.SafeLoader(text)
    try:
        try:
            node = loader.get_single_node()
        except yaml.MarkedYAMLError as exc:
            mark = exc.problem_mark or exc.context_mark
            line = mark.line + 1 if mark is not None else None
            reason = " ".join(p for p in (exc.context, exc.problem) if p) or "invalid YAML"
            raise ConfigError(source, line, "", f"invalid YAML: {reason}") from None
        except yaml.YAMLError as exc:
            raise ConfigError(source, None, "", f"invalid YAML: {exc}") from None
        if node is None:
            return None, LineMap(source)
        walker = _Walker(loader, source)
        try:
            data = walker.build(node, ())
        except yaml.MarkedYAMLError as exc:
            mark = exc.problem_mark or exc.context_mark
            line = mark.line + 1 if mark is not None else None
            raise ConfigError(source, line, "", f"invalid YAML: {exc.problem}") from None
        walker.lines[()] = node.start_mark.line + 1
        return data, LineMap(source, walker.lines)
    finally:
        loader.dispose()


def load_yaml_with_lines(path: str | Path) -> tuple[Any, LineMap]:
    """Load one YAML document with the safe loader; return (data, LineMap).

    Raises ConfigError (never a raw yaml or OS error) when the file cannot be read or parsed.
    """
    source = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(source, None, "", f"cannot read file: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise ConfigError(source, None, "", "file is not UTF-8 text") from None
    return load_yaml_text_with_lines(text, source)
