"""Building a ProxyConfig from flags and the YAML config file."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from sluice.proxy.config import ConfigFileError, ProxyConfig

__all__ = ["ConfigFileError", "build_config"]


def _read_yaml(path: Path) -> dict[str, Any]:
    try:
        text = path.read_text()
    except OSError as exc:
        raise ConfigFileError(f"{path}: cannot read config file: {exc.strerror}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{path}:{mark.line + 1}" if mark is not None else str(path)
        raise ConfigFileError(f"{where}: invalid YAML: {getattr(exc, 'problem', exc)}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigFileError(f"{path}:1: the config file must be a mapping")
    return data


def build_config(
    listen: tuple[str, int], upstream: list[tuple[str, int]], path: Path | None
) -> ProxyConfig:
    if not upstream:
        raise ConfigFileError("--upstream: at least one HOST:PORT is required")
    config = ProxyConfig(listen=listen, upstream=upstream)
    if path is None:
        return config
    raw = _read_yaml(path)
    config.raw = raw
    config.path = path
    return config
