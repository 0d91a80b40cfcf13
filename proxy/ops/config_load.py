"""Building a ProxyConfig from flags and the YAML config file.

Every problem is reported as ``ConfigFileError`` (a ValueError) whose message names the file,
the line and the field, e.g. ``sluice.yaml:12: filters[1].apply_to: unknown value 'prodcue'``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sluice.crypto.kms import parse_kms_section
from sluice.filters.config import parse_filter_specs
from sluice.filters.yaml_lines import ConfigError, LineMap, load_yaml_with_lines
from sluice.proxy.net.tls import parse_server_tls, parse_upstream_tls
from sluice.proxy.net.upstream_sasl import parse_upstream_sasl
from sluice.proxy.ops.config import ConfigFileError, DeadLetterSettings, ProxyConfig
from sluice.proxy.ops.fleet import parse_fleet_section
from sluice.proxy.ops.limits import parse_limits
from sluice.proxy.ops.policies import parse_policy_admins
from sluice.proxy.ops.quotas import parse_quotas
from sluice.proxy.ops.security import parse_security
from sluice.proxy.telemetry.metrics import parse_listen
from sluice.transforms.config import parse_transform_specs

__all__ = ["KNOWN_SECTIONS", "ConfigFileError", "build_config", "load_config_file"]

#: Top-level keys of the config file (docs/CONFIGURATION.md documents each).
KNOWN_SECTIONS = (
    "filters",
    "telemetry",
    "metrics",
    "proxy",
    "tls",
    "upstream_tls",
    "upstream_sasl",
    "dead_letters",
    "limits",
    "fleet",
    "module_cache_dir",
    "transforms",
    "kms",
    "quotas",
    "policy_admins",
    "security",
)
#: Keys of the ``proxy:`` section.
PROXY_KEYS = ("advertised_host", "node_ports", "filter_threads", "spread_fetch",
              "spread_produce", "filtered_fetch_max_bytes")
#: Keys of the ``dead_letters:`` section.
DEAD_LETTER_KEYS = ("max_queued_bytes", "shutdown_timeout_seconds")
#: Sections whose value must be a mapping (the others: a list, a path).
_MAPPING_SECTIONS = tuple(
    s for s in KNOWN_SECTIONS
    if s not in ("filters", "module_cache_dir", "transforms", "policy_admins")
)


def _dead_letters(raw: dict[str, Any], lines: LineMap) -> DeadLetterSettings:
    section = "dead_letters"
    for key in raw:
        if key not in DEAD_LETTER_KEYS:
            raise lines.error(
                (section, key), f"unknown key (expected one of {', '.join(DEAD_LETTER_KEYS)})"
            )
    defaults = DeadLetterSettings()
    size = raw.get("max_queued_bytes", defaults.max_queued_bytes)
    if isinstance(size, bool) or not isinstance(size, int) or size <= 0:
        raise lines.error(
            (section, "max_queued_bytes"), f"must be a positive integer, got {size!r}"
        )
    timeout = raw.get("shutdown_timeout_seconds", defaults.shutdown_timeout)
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout >= 0:
        raise lines.error(
            (section, "shutdown_timeout_seconds"), f"must be a number >= 0, got {timeout!r}"
        )
    return DeadLetterSettings(max_queued_bytes=size, shutdown_timeout=float(timeout))


def _metrics_listen(metrics: dict[str, Any], lines: LineMap) -> tuple[str, int] | None:
    for key in metrics:
        if key != "listen":
            raise lines.error(("metrics", key), "unknown key (expected listen)")
    if metrics.get("listen") is None:
        return None
    try:
        return parse_listen(metrics["listen"])
    except ValueError as exc:
        raise lines.error(("metrics", "listen"), str(exc)) from None


def load_config_file(path: Path, config: ProxyConfig) -> ProxyConfig:
    try:
        data, lines = load_yaml_with_lines(path)
    except ConfigError as exc:
        raise ConfigFileError(str(exc)) from None
    except OSError as exc:
        raise ConfigFileError(f"{path}: cannot read config file: {exc.strerror}") from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigFileError(f"{path}:1: the config file must be a mapping of sections")
    try:
        for key in data:
            if key not in KNOWN_SECTIONS:
                raise lines.error(
                    (key,), f"unknown section (expected one of {', '.join(KNOWN_SECTIONS)})"
                )
        # kms: is read before filters: builtin:encrypt filters carry it (docs/ENCRYPTION.md).
        kms = parse_kms_section(data.get("kms"), lines, path.resolve().parent)
        config.filters = parse_filter_specs(data.get("filters"), path, lines, kms=kms)
        config.transforms = parse_transform_specs(data.get("transforms"), path, lines)
        for section in _MAPPING_SECTIONS:
            value = data.get(section)
            if value is not None and not isinstance(value, dict):
                raise lines.error((section,), "must be a mapping")
        config.telemetry = dict(data.get("telemetry") or {})
        for key in ("dir", "key_file"):  # relative to the config file
            value = config.telemetry.get(key)
            if isinstance(value, str) and value and not Path(value).is_absolute():
                config.telemetry[key] = str(path.resolve().parent / value)
        config.metrics = dict(data.get("metrics") or {})
        proxy = dict(data.get("proxy") or {})
        for key in proxy:
            if key not in PROXY_KEYS:
                raise lines.error(
                    ("proxy", str(key)), f"unknown key (expected one of {', '.join(PROXY_KEYS)})"
                )
        if "advertised_host" in proxy:
            if not isinstance(proxy["advertised_host"], str):
                raise lines.error(("proxy", "advertised_host"), "must be a host name")
            config.advertised_host = proxy["advertised_host"]
        node_ports = proxy.get("node_ports") or {}
        if not isinstance(node_ports, dict):
            raise lines.error(("proxy", "node_ports"), "must map node ids to ports")
        for node, port in node_ports.items():
            if not isinstance(node, int) or not isinstance(port, int) or not 0 < port < 65536:
                raise lines.error(
                    ("proxy", "node_ports", node), f"node id {node!r} -> port {port!r} is not valid"
                )
        config.node_ports = dict(node_ports)
        if "filter_threads" in proxy:
            threads = proxy["filter_threads"]
            if not isinstance(threads, int) or isinstance(threads, bool) or not 0 <= threads <= 64:
                raise lines.error(
                    ("proxy", "filter_threads"), f"must be an integer 0..64, got {threads!r}"
                )
            config.filter_threads = threads
        if "spread_fetch" in proxy:
            spread = proxy["spread_fetch"]
            if not isinstance(spread, bool):
                raise lines.error(
                    ("proxy", "spread_fetch"), f"must be true or false, got {spread!r}"
                )
            config.spread_fetch = spread
        if "spread_produce" in proxy:
            spread = proxy["spread_produce"]
            if not isinstance(spread, bool):
                raise lines.error(
                    ("proxy", "spread_produce"), f"must be true or false, got {spread!r}"
                )
            config.spread_produce = spread
        if "filtered_fetch_max_bytes" in proxy:
            cap = proxy["filtered_fetch_max_bytes"]
            if not isinstance(cap, int) or isinstance(cap, bool) or not 0 <= cap < 1 << 31:
                raise lines.error(
                    ("proxy", "filtered_fetch_max_bytes"),
                    f"must be an integer 0..2147483647 (0: as the client asks), got {cap!r}",
                )
            config.filtered_fetch_max_bytes = cap
        limits = parse_limits(data.get("limits"), lines, config.max_frame_size)
        config.max_frame_size = limits.max_frame_size
        config.max_connections = limits.max_connections
        config.idle_timeout = limits.idle_timeout_seconds
        config.job_deadline = limits.job_deadline_seconds
        config.batch_limits = limits.batch
        config.quotas = parse_quotas(data.get("quotas"), lines)
        base = path.resolve().parent
        config.tls = parse_server_tls(data.get("tls"), lines, base)
        config.upstream_tls = parse_upstream_tls(data.get("upstream_tls"), lines, base)
        config.upstream_sasl = parse_upstream_sasl(data.get("upstream_sasl"), lines, base)
        config.dead_letters = _dead_letters(dict(data.get("dead_letters") or {}), lines)
        config.metrics_listen = _metrics_listen(config.metrics, lines)
        cache_dir = data.get("module_cache_dir")
        if cache_dir is not None and not isinstance(cache_dir, str):
            raise lines.error(("module_cache_dir",), "must be a directory path")
        if cache_dir is not None and not Path(cache_dir).expanduser().is_absolute():
            # Like telemetry.dir and the tls paths: relative to the config file.
            cache_dir = str(path.resolve().parent / cache_dir)
        config.module_cache_dir = cache_dir
        parse_fleet_section(data.get("fleet"), lines, base)  # reload.py reads it from raw
        config.policy_admins = parse_policy_admins(data.get("policy_admins"), lines)
        security = parse_security(data.get("security"), lines)
        config.operators = security.operators
        config.internal_topics = security.internal_topics
    except ConfigError as exc:
        raise ConfigFileError(str(exc)) from None
    config.raw = data
    config.path = path
    return config


def build_config(
    listen: tuple[str, int], upstream: list[tuple[str, int]], path: Path | None
) -> ProxyConfig:
    if not upstream:
        raise ConfigFileError("--upstream: at least one HOST:PORT is required")
    config = ProxyConfig(listen=listen, upstream=upstream)
    if path is None:
        return config
    return load_config_file(path, config)
