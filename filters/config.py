"""The ``filters:`` section of the proxy config: parsing, validation and module resolution.

Public contract (key names users and scripts rely on): ``name``, ``module``, ``topics``,
``apply_to``, ``on_error``, ``dead_letter_topic``, ``config``, ``function``, ``principals``.
Added by Sluice: ``timeout_ms`` (deadline per call: wall time while the guest runs, in epoch
ticks), ``max_memory_mb`` (linear memory cap per instance) and ``stateless`` (the module keeps
nothing from one call to the next, so the host may run it on several instances at once:
`FilterSpec.poolable`).

Errors are `ConfigError`s naming file, line and field, e.g.
``sluice.yaml:12: filters[1].apply_to: unknown value 'prodcue' (expected produce, fetch, admin)``.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from sluice.crypto.kms import KmsSettings, parse_kms_section
from sluice.filters.rules_config import check_rules_config
from sluice.filters.yaml_lines import (
    ConfigError,
    FieldPath,
    LineMap,
    load_yaml_with_lines,
)

__all__ = [
    "APPLY_TO_VALUES",
    "BUILTIN_DIR",
    "DEFAULT_MAX_MEMORY_MB",
    "DEFAULT_TIMEOUT_MS",
    "HOST_BUILTINS",
    "ON_ERROR_VALUES",
    "ConfigError",
    "FilterSpec",
    "builtin_names",
    "load_filter_specs",
    "parse_filter_specs",
    "resolve_module",
]

APPLY_TO_VALUES: Final = ("produce", "fetch", "admin")
ON_ERROR_VALUES: Final = ("reject", "pass", "dead-letter")
DEFAULT_TIMEOUT_MS: Final = 100
DEFAULT_MAX_MEMORY_MB: Final = 64
MAX_TIMEOUT_MS: Final = 60_000
MAX_MEMORY_MB: Final = 4096
BUILTIN_PREFIX: Final = "builtin:"
BUILTIN_DIR: Final = Path(__file__).resolve().parent / "builtin"
#: ``builtin:NAME`` values served by host code (filters/host.py) rather than a packaged .wasm.
HOST_BUILTINS: Final = ("encrypt", "block")
#: Packaged modules whose output depends on their config and the call's input alone (no state
#: kept from one call to the next), so they may run on several instances at once; any other
#: module gets one instance unless its entry says ``stateless: true``. builtin:rules keeps its
#: parsed rules from load and resets every per-call queue, buffer and counter when a call begins
#: (its `begin_batch`).
STATELESS_BUILTINS: Final = ("pii-mask", "rules")

_KNOWN_KEYS: Final = (
    "name", "module", "topics", "apply_to", "on_error", "dead_letter_topic", "config",
    "function", "principals", "timeout_ms", "max_memory_mb", "stateless",
)
_BUILTIN_NAME = re.compile(r"^[a-z0-9][a-z0-9-]*$")
_FUNCTION_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_.$-]*$")


@dataclass(frozen=True, slots=True)
class FilterSpec:
    """One entry of ``filters:``, validated. Build directly in code or via parse_filter_specs.

    ``module`` is the string as written (a path or ``builtin:NAME``); ``base_dir`` is the
    directory relative paths are resolved against (the config file's directory). ``source``
    and ``line`` locate the entry for load-time errors.
    """

    name: str
    module: str
    topics: tuple[str, ...] = ("*",)
    apply_to: frozenset[str] = frozenset({"produce"})
    on_error: str = "reject"
    dead_letter_topic: str | None = None
    config: Mapping[str, Any] = field(default_factory=dict)
    function: str | None = None
    principals: tuple[str, ...] | None = None
    timeout_ms: int = DEFAULT_TIMEOUT_MS
    max_memory_mb: int = DEFAULT_MAX_MEMORY_MB
    base_dir: Path | None = None
    source: str = "<filters>"
    line: int | None = None
    #: Line of each top-level ``config`` key, so that a module refusing ``config.KEY`` is
    #: reported at that key's line (not part of the spec's identity).
    config_lines: Mapping[str, int] = field(default_factory=dict, compare=False)
    #: The config's top-level ``kms:`` section, for host filters that need keys
    #: (``builtin:encrypt``); None when the config has none.
    kms: KmsSettings | None = None
    #: Id of the key that signed the fleet record this filter came from (None: the config
    #: file, or an unsigned fleet); telemetry names it beside the module's sha256.
    signer: str | None = None
    #: ``stateless`` as written (None: not written; the module's default, `poolable`, holds).
    stateless: bool | None = None

    def __post_init__(self) -> None:
        # Guard programmatic construction with the same rules as the YAML path.
        if self.on_error not in ON_ERROR_VALUES:
            raise ValueError(f"on_error must be one of {', '.join(ON_ERROR_VALUES)}")
        if self.on_error == "dead-letter" and not self.dead_letter_topic:
            raise ValueError("dead_letter_topic is required when on_error is dead-letter")
        unknown = set(self.apply_to) - set(APPLY_TO_VALUES)
        if unknown:
            raise ValueError(f"unknown apply_to value(s): {', '.join(sorted(unknown))}")

    @property
    def host_builtin(self) -> str | None:
        """The NAME of ``builtin:NAME`` when host code implements it (see HOST_BUILTINS)."""
        if self.module.startswith(BUILTIN_PREFIX):
            name = self.module[len(BUILTIN_PREFIX):]
            if name in HOST_BUILTINS:
                return name
        return None

    @property
    def poolable(self) -> bool:
        """Whether the host may run this filter on more than one instance at once: the entry
        says ``stateless: true``, or it names a packaged module known to keep no state
        (STATELESS_BUILTINS) and does not say ``stateless: false``. Host filters never."""
        if self.host_builtin is not None:
            return False
        if self.stateless is not None:
            return self.stateless
        return self.module.startswith(BUILTIN_PREFIX) and \
            self.module[len(BUILTIN_PREFIX):] in STATELESS_BUILTINS

    @property
    def module_path(self) -> Path:
        """The .wasm file this spec names (builtin modules resolve into the package)."""
        return resolve_module(self.module, self.base_dir)

    @property
    def config_json(self) -> bytes:
        """The ``config`` mapping as the UTF-8 JSON handed to ``sluice_init``."""
        return json.dumps(self.config, separators=(",", ":"), ensure_ascii=False,
                          allow_nan=False).encode("utf-8")

    @property
    def where(self) -> str:
        """``file:line`` of this entry, for load-time error messages."""
        return self.source if self.line is None else f"{self.source}:{self.line}"


def builtin_names() -> list[str]:
    """Names usable as ``builtin:NAME`` (the packaged .wasm files and the host filters)."""
    packaged = [p.stem for p in BUILTIN_DIR.glob("*.wasm")] if BUILTIN_DIR.is_dir() else []
    return sorted({*packaged, *HOST_BUILTINS})


def resolve_module(module: str, base_dir: Path | None) -> Path:
    """Map ``builtin:NAME`` to the packaged module and a relative path to `base_dir`."""
    if module.startswith(BUILTIN_PREFIX):
        return BUILTIN_DIR / f"{module[len(BUILTIN_PREFIX):]}.wasm"
    path = Path(module).expanduser()
    if not path.is_absolute() and base_dir is not None:
        path = base_dir / path
    return path


class _EntryParser:
    """Validates one ``filters[i]`` mapping; every error is located through the LineMap."""

    def __init__(self, raw: Mapping[Any, Any], path: FieldPath, lines: LineMap,
                 base_dir: Path | None, check_files: bool,
                 kms: KmsSettings | None = None) -> None:
        self.kms = kms
        self.raw = raw
        self.path = path
        self.lines = lines
        self.base_dir = base_dir
        self.check_files = check_files

    def fail(self, key: str | int | tuple[str | int, ...], reason: str) -> ConfigError:
        sub = key if isinstance(key, tuple) else (key,)
        return self.lines.error((*self.path, *sub), reason)

    def string(self, key: str, required: bool) -> str | None:
        if key not in self.raw or self.raw[key] is None:
            if required:
                raise self.fail(key, "required field is missing")
            return None
        value = self.raw[key]
        if not isinstance(value, str):
            raise self.fail(key, f"must be a string, got {_kind(value)}")
        if not value.strip():
            raise self.fail(key, "must not be empty")
        return value

    def string_list(self, key: str, required: bool) -> tuple[str, ...] | None:
        if key not in self.raw or self.raw[key] is None:
            if required:
                raise self.fail(key, "required field is missing")
            return None
        value = self.raw[key]
        if isinstance(value, str):
            value = [value]
        if not isinstance(value, list):
            raise self.fail(key, f"must be a list of strings, got {_kind(value)}")
        if not value:
            raise self.fail(key, "must not be empty")
        out: list[str] = []
        for i, item in enumerate(value):
            if not isinstance(item, str) or not item:
                raise self.fail((key, i), f"must be a non-empty string, got {_kind(item)}")
            out.append(item)
        return tuple(out)

    def positive_int(self, key: str, default: int, maximum: int) -> int:
        value = self.raw.get(key)
        if value is None:
            return default
        if isinstance(value, bool) or not isinstance(value, int):
            raise self.fail(key, f"must be an integer, got {_kind(value)}")
        if value <= 0 or value > maximum:
            raise self.fail(key, f"must be between 1 and {maximum}, got {value}")
        return value

    def parse(self) -> FilterSpec:
        for key in self.raw:
            if key not in _KNOWN_KEYS:
                raise self.fail(str(key),
                                f"unknown field (expected one of {', '.join(_KNOWN_KEYS)})")
        name = self.string("name", required=True)
        assert name is not None
        module = self.string("module", required=True)
        assert module is not None
        self.check_module(module)
        topics = self.string_list("topics", required=True)
        assert topics is not None
        apply_raw = self.string_list("apply_to", required=True)
        assert apply_raw is not None
        for i, value in enumerate(apply_raw):
            if value not in APPLY_TO_VALUES:
                raise self.fail(("apply_to", i) if isinstance(self.raw["apply_to"], list)
                                else "apply_to",
                                f"unknown value {value!r} (expected {', '.join(APPLY_TO_VALUES)})")
        on_error = self.string("on_error", required=False) or "reject"
        if on_error not in ON_ERROR_VALUES:
            raise self.fail("on_error",
                            f"unknown value {on_error!r} (expected {', '.join(ON_ERROR_VALUES)})")
        if module == "builtin:encrypt" and on_error in ("pass", "dead-letter"):
            # A failure would store plaintext (pass) or copy the batch's plaintext to the
            # dead-letter topic: the encryption filter only fails closed.
            raise self.fail("on_error", f"builtin:encrypt cannot use {on_error!r}: a failure "
                                        "would put plaintext where ciphertext belongs; use "
                                        "reject")
        dead_letter_topic = self.string("dead_letter_topic", required=False)
        if on_error == "dead-letter" and dead_letter_topic is None:
            raise self.fail("dead_letter_topic", "required when on_error is dead-letter")
        config = self.raw.get("config")
        if config is None:
            config = {}
        if not isinstance(config, dict):
            raise self.fail("config", f"must be a mapping, got {_kind(config)}")
        self.check_json(config, ("config",))
        if module == f"{BUILTIN_PREFIX}rules":
            check_rules_config(config, lambda sub, reason: self.fail(("config", *sub), reason))
        function = self.string("function", required=False)
        if function is not None and not _FUNCTION_NAME.match(function):
            raise self.fail("function", f"not a valid export name: {function!r}")
        principals = self.string_list("principals", required=False)
        timeout_ms = self.positive_int("timeout_ms", DEFAULT_TIMEOUT_MS, MAX_TIMEOUT_MS)
        max_memory_mb = self.positive_int("max_memory_mb", DEFAULT_MAX_MEMORY_MB, MAX_MEMORY_MB)
        stateless = self.raw.get("stateless")
        if stateless is not None and not isinstance(stateless, bool):
            raise self.fail("stateless", f"must be true or false, got {_kind(stateless)}")
        if stateless and module.removeprefix(BUILTIN_PREFIX) in HOST_BUILTINS:
            raise self.fail("stateless", f"{module} is a host filter and runs on one instance")
        return FilterSpec(
            name=name, module=module, topics=topics, apply_to=frozenset(apply_raw),
            on_error=on_error, dead_letter_topic=dead_letter_topic, config=config,
            function=function, principals=principals, timeout_ms=timeout_ms,
            max_memory_mb=max_memory_mb, stateless=stateless, base_dir=self.base_dir,
            source=self.lines.source,
            line=self.lines.line(self.path), kms=self.kms,
            config_lines={k: line for k in config
                          if (line := self.lines.line((*self.path, "config", k))) is not None},
        )

    def check_module(self, module: str) -> None:
        if module.startswith(BUILTIN_PREFIX):
            builtin = module[len(BUILTIN_PREFIX):]
            if not _BUILTIN_NAME.match(builtin):
                raise self.fail("module", f"invalid builtin name {builtin!r}")
            if builtin in HOST_BUILTINS:
                return
            if self.check_files and not resolve_module(module, None).is_file():
                known = ", ".join(builtin_names()) or "none packaged"
                raise self.fail("module", f"unknown builtin {builtin!r} (available: {known})")
            return
        if self.check_files:
            path = resolve_module(module, self.base_dir)
            if not path.is_file():
                raise self.fail("module", f"module file not found: {path}")

    def check_json(self, value: Any, sub: tuple[str | int, ...]) -> None:
        # The config reaches the guest as JSON: refuse what JSON cannot say (dates, NaN, ...).
        if value is None or isinstance(value, (str, bool, int)):
            return
        if isinstance(value, float):
            if not math.isfinite(value):
                raise self.fail(sub, "must be a finite number (the config is passed as JSON)")
            return
        if isinstance(value, list):
            for i, item in enumerate(value):
                self.check_json(item, (*sub, i))
            return
        if isinstance(value, dict):
            for k, item in value.items():
                if not isinstance(k, str):
                    raise self.fail(sub, f"keys must be strings (got {k!r}); quote it in YAML")
                self.check_json(item, (*sub, k))
            return
        raise self.fail(sub, f"{_kind(value)} cannot be passed as JSON; quote it in YAML")


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    return {dict: "a mapping", list: "a list", str: "a string", bool: "a boolean",
            int: "an integer", float: "a number"}.get(type(value), type(value).__name__)


def parse_filter_specs(
    raw_list: Any,
    source_path: str | Path,
    line_map: LineMap | None = None,
    *,
    field_prefix: Sequence[str | int] = ("filters",),
    check_files: bool = True,
    kms: KmsSettings | None = None,
) -> list[FilterSpec]:
    """Validate the value of ``filters:`` (a list of mappings) into FilterSpecs.

    `source_path` is the config file (relative module paths resolve against its directory);
    `line_map` comes from `load_yaml_with_lines` over that file (None: errors carry no line).
    `check_files` verifies that module files and builtins exist. `kms` is the config's
    validated ``kms:`` section, handed to every spec (host filters that need keys use it).
    """
    source = str(source_path)
    lines = line_map if line_map is not None else LineMap(source)
    prefix: FieldPath = tuple(field_prefix)
    base_dir = Path(source_path).resolve().parent
    if raw_list is None:
        return []
    if not isinstance(raw_list, list):
        raise lines.error(prefix, f"must be a list of filters, got {_kind(raw_list)}")
    specs: list[FilterSpec] = []
    seen: dict[str, int] = {}
    for i, raw in enumerate(raw_list):
        path = (*prefix, i)
        if not isinstance(raw, dict):
            raise lines.error(path, f"each filter must be a mapping, got {_kind(raw)}")
        spec = _EntryParser(raw, path, lines, base_dir, check_files, kms).parse()
        if spec.name in seen:
            raise lines.error((*path, "name"), f"duplicate filter name {spec.name!r} "
                                               f"(also filters[{seen[spec.name]}])")
        seen[spec.name] = i
        specs.append(spec)
    return specs


def load_filter_specs(path: str | Path, *, check_files: bool = True) -> list[FilterSpec]:
    """Read a proxy config file and return its ``filters:`` (empty if the section is absent)."""
    data, lines = load_yaml_with_lines(path)
    if data is None:
        return []
    if not isinstance(data, dict):
        raise lines.error((), "the config must be a mapping")
    kms = parse_kms_section(data.get("kms"), lines, Path(path).resolve().parent)
    return parse_filter_specs(data.get("filters"), path, lines, check_files=check_files,
                              kms=kms)
