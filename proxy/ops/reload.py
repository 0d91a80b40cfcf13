"""Changing the filter chain of a running proxy without dropping a connection.

Three things rebuild the chain: SIGHUP, a change of the config file (or of a module file it
names; polled every second), and the filter fleet (proxy/ops/fleet.py). The new chain is built in
a worker thread (compiling a module takes milliseconds to seconds) and switched in on the event
loop with ``server.install_chain``: requests handled and responses sent after the switch use
it (a response processed under the old chain is processed again before it is sent), open
connections stay open. The old chain is closed by the router once no filter job that started
with it is still running in the filter thread pool (`paths/registry.py`, lease/release).

An invalid new config (bad YAML, bad field, a module that does not load) is refused with one
``config_reload_refused`` log line naming file, line and field, and the old chain keeps
running. Only ``filters`` (and ``module_cache_dir``, ``policy_admins``) and ``quotas`` take
effect on reload; a change to a section of `RESTART_SECTIONS` is reported by
``config_reload_needs_restart``. New quotas apply to the next request of every open connection
(ops/quotas.py).

The effective chain is the config file's filters, in file order, followed by the fleet's
filters, by name, followed by the bindings of the fleet's data policies (proxy/ops/policies.py),
by topic. A fleet filter whose name is also used in the config file is left out
(``fleet_filter_shadowed``): the operator's file wins. A policy binding that cannot run (its
filter is not deployed, or does not load with the policy's config) is replaced by a
``builtin:block`` filter for that topic (``policy_blocked``): the topic fails closed.

`FleetPolicies` is what the admin path (proxy/paths/policy.py) asks about policies: who may set
them, whether a policy can run, the value in force, and it writes policy records.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hashlib
import re
import signal
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from sluice.filters.abi_base import FilterLoadError
from sluice.filters.chain import FilterChain
from sluice.filters.config import FilterSpec
from sluice.filters.runtime import LoadedFilter, load_filter, shared_cache
from sluice.filters.yaml_lines import ConfigError, load_yaml_with_lines
from sluice.proxy.net.kafka_settings import cluster_settings
from sluice.proxy.ops.config import ConfigFileError, ProxyConfig
from sluice.proxy.ops.fleet import (
    FilterRecord,
    FleetCatalog,
    FleetFollower,
    FleetSettings,
    parse_fleet_section,
    state_path,
)
from sluice.proxy.ops.fleet_signing import next_seq, sign
from sluice.proxy.ops.policies import (
    POLICY_PREFIX,
    AdminMatcher,
    Binding,
    Policy,
    PolicyError,
    PolicyRecord,
    bind_spec,
    block_spec,
    policy_bindings,
    policy_key,
    policy_payload,
    policy_record_value,
)
from sluice.proxy.telemetry.logs import log

if TYPE_CHECKING:
    from sluice.proxy.net.server import ProxyServer

__all__ = [
    "ChainBuildError",
    "ChainManager",
    "FleetPolicies",
    "build_chain",
    "check_telemetry",
    "error_fields",
    "fleet_settings",
    "load_checked_config",
]

#: How often the config file is checked for changes.
WATCH_SECONDS: Final = 1.0
#: Sections whose changes need a restart (the running proxy keeps the values it started with).
RESTART_SECTIONS: Final = ("telemetry", "metrics", "proxy", "tls", "upstream_tls", "limits",
                           "fleet", "security")
FLEET_SOURCE_PREFIX: Final = "fleet:"
#: How a module's refusal names the config key it refused: "... rejected the config ...
#: config.KEY: reason" (builtin:pii-mask, the host builtins).
_CONFIG_KEY: Final = re.compile(r"rejected the config.*?\bconfig\.([A-Za-z0-9_-]+):")


class ChainBuildError(ConfigError):
    """A filter that does not load; names the config file, line and ``filters[i]`` entry (or
    ``fleet.NAME`` for a fleet filter)."""


def _load_error(spec: FilterSpec, index: int, exc: FilterLoadError) -> ChainBuildError:
    message = str(exc)
    who = f"filter {spec.name!r} ({spec.where}): "
    reason = f"filter {spec.name!r}: {message[len(who):]}" if message.startswith(who) else message
    # Which key to blame, for the log line and `sluice config check`.
    if "rejected the config" in message:
        key = "config"
    elif "bound to admin" in message or "act on admin" in message:
        key = "apply_to"
    elif "function" in message and "export" in message and spec.function:
        key = "function"
    else:
        key = "module"
    line = spec.line
    # A module that names the refused key ("config.keys: must be true or false") is blamed
    # at that key, on its own line.
    named = _CONFIG_KEY.search(message) if key == "config" else None
    if named is not None and named.group(1) in spec.config:
        key = f"config.{named.group(1)}"
        line = spec.config_lines.get(named.group(1), line)
    if spec.source.startswith(FLEET_SOURCE_PREFIX):
        return ChainBuildError(spec.source, None, f"fleet.{spec.name}.{key}", reason)
    return ChainBuildError(spec.source, line, f"filters[{index}].{key}", reason)


def build_chain(specs: Sequence[FilterSpec],
                cache_dir: str | Path | None = None) -> FilterChain | None:
    """Load every filter of `specs` (None if there are none); ChainBuildError names the first
    that cannot run. Blocking: call it from a worker thread on a running proxy."""
    if not specs:
        return None
    cache = shared_cache(None, cache_dir)
    loaded: list[LoadedFilter] = []
    try:
        for i, spec in enumerate(specs):
            try:
                loaded.append(load_filter(spec, cache=cache))
            except FilterLoadError as exc:
                raise _load_error(spec, i, exc) from None
    except BaseException:
        for f in loaded:
            f.close()
        raise
    return FilterChain(loaded)


def check_loads(spec: FilterSpec, cache_dir: str | Path | None = None) -> None:
    """Raise FilterLoadError unless `spec`'s module loads and initialises with its config."""
    load_filter(spec, cache=shared_cache(None, cache_dir)).close()


_MESSAGE = re.compile(r"^(?P<file>.+?)(?::(?P<line>\d+))?: (?:(?P<field>[\w.\[\]-]+): )?"
                      r"(?P<reason>.*)$", re.S)


def error_fields(exc: BaseException) -> dict[str, Any]:
    """``file``, ``line``, ``field`` and ``reason`` of a config problem, for structured logs."""
    for candidate in (exc, exc.__cause__, exc.__context__):
        if isinstance(candidate, ConfigError):
            return {"file": candidate.source, "line": candidate.line,
                    "field": candidate.field or None, "reason": candidate.reason}
    text = str(exc)
    m = _MESSAGE.match(text)
    if m is None:
        return {"file": None, "line": None, "field": None, "reason": text}
    line = m.group("line")
    return {"file": m.group("file"), "line": int(line) if line else None,
            "field": m.group("field"), "reason": m.group("reason")}


# ------------------------------------------------------------------------------------------
# loading a config the way `sluice serve` does, plus the checks serve makes later
# ------------------------------------------------------------------------------------------

def check_telemetry(cfg: Mapping[str, Any] | None) -> str:
    """Validate ``telemetry:`` exactly as ``telemetry.make_sink`` does, without opening files
    or connections; returns a one-line description. Raises TelemetryConfigError."""
    from sluice.proxy.telemetry.sinks import parse_telemetry_config

    settings = parse_telemetry_config(cfg)
    settings.tagger()  # the key file must hold a key
    return settings.describe()


def locate_telemetry_error(path: Path | None, exc: Exception) -> ConfigError:
    """Turn ``telemetry.kafka.topic: reason`` into a ConfigError with the file line."""
    message = str(exc)
    field_text, _, reason = message.partition(": ")
    keys: tuple[str | int, ...] = tuple(field_text.split("."))
    source = str(path) if path is not None else "<config>"
    line: int | None = None
    if path is not None:
        with contextlib.suppress(ConfigError):
            _data, lines = load_yaml_with_lines(path)
            line = lines.line(keys)
    return ConfigError(source, line, field_text, reason or message)


def load_checked_config(path: Path, base: ProxyConfig) -> ProxyConfig:
    """`load_config_file` on a copy of `base`, plus the telemetry check (ConfigFileError)."""
    from sluice.proxy.ops.config_load import load_config_file
    from sluice.proxy.telemetry.sinks import TelemetryConfigError

    config = load_config_file(path, dataclasses.replace(base))
    try:
        check_telemetry(config.telemetry)
    except TelemetryConfigError as exc:
        located = locate_telemetry_error(path, exc)
        raise ConfigFileError(str(located)) from located
    return config


def fleet_settings(config: ProxyConfig) -> FleetSettings | None:
    """The ``fleet:`` section of an already loaded config (None: no fleet)."""
    base = config.path.resolve().parent if config.path is not None else None
    return parse_fleet_section(config.raw.get("fleet"), None, base)


def _stat(path: Path) -> tuple[int, int, int] | None:
    try:
        st = path.stat()
    except OSError:
        return None
    return (st.st_mtime_ns, st.st_size, st.st_ino)


def _origin(source: str) -> str:
    """``file``, ``fleet`` or ``policy`` (a data policy's copy of a fleet filter)."""
    if source.startswith(f"{FLEET_SOURCE_PREFIX}{POLICY_PREFIX}"):
        return "policy"
    return "fleet" if source.startswith(FLEET_SOURCE_PREFIX) else "file"


def _describe(chain: FilterChain | None) -> list[dict[str, Any]]:
    if chain is None:
        return []
    return [{"name": f.name, "sha256": f.sha256,
             "config_sha256": hashlib.sha256(f.spec.config_json).hexdigest(),
             "source": _origin(f.spec.source),
             "topics": list(f.spec.topics), "apply_to": sorted(f.spec.apply_to)}
            for f in chain.filters]


# ------------------------------------------------------------------------------------------
# the manager
# ------------------------------------------------------------------------------------------

class ChainManager:
    """Owns chain changes of one running proxy: config reloads and fleet updates, one at a
    time, in a single worker task (requests arriving meanwhile are coalesced)."""

    def __init__(self, server: ProxyServer, config: ProxyConfig, *,
                 watch_seconds: float = WATCH_SECONDS) -> None:
        self.server = server
        self.started_config = config
        self.config = config
        self.watch_seconds = watch_seconds
        self.generation = 0
        self.fleet = fleet_settings(config)
        self.catalog: FleetCatalog | None = None
        self.follower: FleetFollower | None = None
        self.fleet_applied = asyncio.Event()
        self._wake = asyncio.Event()
        self._reload_trigger: str | None = None
        self._fleet_desired: dict[str, FilterRecord] | None = None
        self._policies_desired: dict[str, PolicyRecord] | None = None
        #: The policies the installed chain binds, and their bindings (blocks included).
        self.policies: dict[str, PolicyRecord] = {}
        self.bindings: list[Binding] = []
        self.policy_book: FleetPolicies | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._signature: tuple[Any, ...] | None = None
        self._shadowed: frozenset[str] = frozenset()
        self._sighup = False
        self.started_at = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())

    # ------------------------------------------------------------------ life cycle
    async def start(self) -> None:
        """Start watching; with a fleet, wait (up to fleet.startup_wait_seconds) until the
        fleet's filters are installed, so the first client already meets them."""
        loop = asyncio.get_running_loop()
        self._tasks.append(asyncio.create_task(self._worker(), name="chain-worker"))
        if self.config.path is not None:
            self._signature = self._current_signature()
            self._tasks.append(asyncio.create_task(self._watch(), name="config-watch"))
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(signal.SIGHUP, self.request_reload, "sighup")
            self._sighup = True
        if self.fleet is not None:
            await self._start_fleet(self.fleet)

    async def _start_fleet(self, settings: FleetSettings) -> None:
        cache_dir = self.config.module_cache_dir
        self.catalog = FleetCatalog(settings.topic, cache_dir,
                                    lambda spec: check_loads(spec, cache_dir))
        upstream = ",".join(f"{h}:{p}" for h, p in self.config.upstream)
        metrics = self.server.metrics
        self.follower = FleetFollower(settings, upstream, self.server.instance_id,
                                      self._on_fleet, self.heartbeat,
                                      state_file=state_path(self.catalog.module_dir,
                                                            settings.topic),
                                      on_refused=metrics.fleet_record_refused,
                                      on_lost=metrics.fleet_topic_lost,
                                      security=cluster_settings(self.config))
        trust = settings.trust()
        if settings.allow_unsigned:
            log.warning("fleet_unsigned_allowed", topic=settings.topic,
                        effect="fleet.allow_unsigned is true: unsigned records and bare "
                               "tombstones change the filters and policies this proxy runs; "
                               "anyone who can write the fleet topic can too")
        log.info("fleet_trust", topic=settings.topic, trusted_key_ids=sorted(trust.keys),
                 signing_key_id=settings.signing_key.key_id if settings.signing_key else None,
                 allow_unsigned=settings.allow_unsigned)
        if self.follower.restored():
            # The last verified state applies at once, whatever the topic holds now.
            await self._on_fleet(dict(self.follower.view.filters),
                                 dict(self.follower.view.policies))
        self.follower.start()
        self.policy_book = FleetPolicies(self)
        self.server.set_policies(self.policy_book)
        log.info("fleet_following", topic=settings.topic,
                 bootstrap=self.follower.bootstrap, poll_seconds=settings.poll_seconds)
        if settings.startup_wait_seconds > 0:
            try:
                await asyncio.wait_for(self._fleet_or_denied(), settings.startup_wait_seconds)
            except TimeoutError:
                log.warning("fleet_not_synced", topic=settings.topic,
                            waited_seconds=settings.startup_wait_seconds,
                            note="serving with the config file's filters until the fleet "
                                 "topic is read")

    async def _fleet_or_denied(self) -> None:
        """Until the fleet is applied; ConfigFileError if the cluster refuses the proxy's
        user first (wrong credentials, missing ACLs): the proxy fails closed, it does not
        start without the fleet's filters because of a configuration mistake."""
        assert self.follower is not None
        applied = asyncio.ensure_future(self.fleet_applied.wait())
        denied = asyncio.ensure_future(self.follower.access_denied.wait())
        try:
            await asyncio.wait({applied, denied}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            applied.cancel()
            denied.cancel()
        if not self.fleet_applied.is_set() and self.follower.access_error is not None:
            raise ConfigFileError(f"fleet: the cluster refused the proxy's own connection: "
                                  f"{self.follower.access_error}")

    async def stop(self) -> None:
        if self._sighup:
            with contextlib.suppress(RuntimeError):
                asyncio.get_running_loop().remove_signal_handler(signal.SIGHUP)
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self.follower is not None:
            await self.follower.stop()

    # ------------------------------------------------------------------ requests
    def request_reload(self, trigger: str = "request") -> None:
        """Re-read the config file soon (SIGHUP handler, watcher, tests)."""
        if self.config.path is None:
            log.warning("config_reload_unavailable", trigger=trigger,
                        reason="the proxy was started without --config")
            return
        self._reload_trigger = trigger
        self._wake.set()

    async def _on_fleet(self, filters: dict[str, FilterRecord],
                        policies: dict[str, PolicyRecord]) -> None:
        self._fleet_desired = filters
        self._policies_desired = policies
        self._wake.set()

    def heartbeat(self) -> dict[str, Any]:
        """This proxy as `sluice filter list` shows it."""
        host, port = self.server.config.listen
        accepted = self.catalog.accepted if self.catalog is not None else {}
        refused = self.catalog.refused.values() if self.catalog is not None else ()
        filters = _describe(self.server.chain)
        for f in filters:
            got = accepted.get(f["name"]) if f["source"] == "fleet" else None
            if got is not None:
                # The record's position identifies the deploy (a new config keeps the sha256).
                f["fleet_partition"], f["fleet_offset"] = got.record.version
        return {
            "host": self.server.hostname, "pid": self.server.pid, "listen": f"{host}:{port}",
            "started": self.started_at, "generation": self.generation, "filters": filters,
            "refused": [{"name": r.name, "sha256": r.sha256, "fleet_partition": r.version[0],
                         "fleet_offset": r.version[1], "reason": r.reason[:500]}
                        for r in refused],
            "policies": [{"topic": b.topic, "filter": b.filter,
                          "fleet_offset": self.policies[b.topic].offset
                          if b.topic in self.policies else None,
                          "blocked": b.blocked[:500] if b.blocked else None}
                         for b in self.bindings],
        }

    # ------------------------------------------------------------------ the worker
    async def _worker(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            trigger, self._reload_trigger = self._reload_trigger, None
            desired, self._fleet_desired = self._fleet_desired, None
            policies, self._policies_desired = self._policies_desired, None
            try:
                if trigger is not None:
                    await self._reload_config(trigger)
                if desired is not None:
                    await self._apply_fleet(desired, policies)
            except Exception as exc:  # a bug here must not end hot reload for good
                log.error("chain_update_failed", error=f"{type(exc).__name__}: {exc}",
                          exc_info=True)

    def _combine(self, file_specs: Sequence[FilterSpec], fleet_specs: Sequence[FilterSpec],
                 bindings: Sequence[Binding] | None = None) -> list[FilterSpec]:
        names = {s.name for s in file_specs}
        shadowed = frozenset(s.name for s in fleet_specs if s.name in names)
        if shadowed != self._shadowed and shadowed:
            log.warning("fleet_filter_shadowed", names=sorted(shadowed),
                        reason="a filter of the config file has the same name; it wins")
        self._shadowed = shadowed
        return [*file_specs, *(s for s in fleet_specs if s.name not in names),
                *(b.spec for b in (self.bindings if bindings is None else bindings))]

    def _check_bindings(self, bindings: list[Binding], cache_dir: str | None) -> list[Binding]:
        """Replace each binding that does not load by a block (blocking: runs modules' init)."""
        out: list[Binding] = []
        for b in bindings:
            if b.blocked is None:
                try:
                    check_loads(b.spec, cache_dir)
                except (FilterLoadError, ValueError, OSError) as exc:
                    reason = f"filter {b.filter!r} does not load with the policy's config: {exc}"
                    b = Binding(b.topic, b.filter, block_spec(b.topic, b.filter,
                                                              sorted(b.spec.apply_to), reason),
                                reason)
            out.append(b)
        return out

    def _report_bindings(self, bindings: list[Binding]) -> None:
        before = {(b.topic, b.filter): b.blocked for b in self.bindings}
        for b in bindings:
            if b.blocked is not None and before.get((b.topic, b.filter)) != b.blocked:
                log.error("policy_blocked", topic=b.topic, filter=b.filter, reason=b.blocked,
                          effect="the topic's partitions fail with KAFKA_STORAGE_ERROR in the "
                                 "policy's directions until the filter can run")

    def _switch(self, chain: FilterChain | None, trigger: str, started: float,
                build_seconds: float) -> None:
        before = time.perf_counter()
        # The server closes the old chain once no filter job runs with it any more.
        self.server.install_chain(chain)
        switched = time.perf_counter()
        self.generation += 1
        log.info("chain_installed", instance=self.server.instance_id, trigger=trigger,
                 generation=self.generation,
                 filters=_describe(chain), build_ms=round(build_seconds * 1000, 3),
                 switch_us=round((switched - before) * 1e6, 1),
                 total_ms=round((switched - started) * 1000, 3))
        if self.follower is not None:
            self.follower.poke()

    async def _reload_config(self, trigger: str) -> bool:
        started = time.perf_counter()
        path = self.config.path
        assert path is not None
        self._signature = self._current_signature()
        fleet_specs = self.catalog.specs if self.catalog is not None else []

        def load_and_build() -> tuple[ProxyConfig, list[FilterSpec], FilterChain | None, float]:
            config = load_checked_config(path, self.started_config)
            t0 = time.perf_counter()
            specs = self._combine(config.filters, fleet_specs)
            chain = build_chain(specs, config.module_cache_dir)
            return config, specs, chain, time.perf_counter() - t0

        try:
            config, _specs, chain, build_s = await asyncio.to_thread(load_and_build)
        except (ConfigFileError, ConfigError) as exc:
            log.error("config_reload_refused", instance=self.server.instance_id,
                      trigger=trigger, **error_fields(exc),
                      keeping=[f["sha256"][:12] + " " + f["name"]
                               for f in _describe(self.server.chain)])
            return False
        self.config = config
        self._signature = self._current_signature()
        self._switch(chain, trigger, started, build_s)
        if config.quotas != self.server.quotas.settings:
            self.server.quotas.update(config.quotas)
            log.info("quotas_installed", instance=self.server.instance_id, trigger=trigger,
                     rules=[r.name for r in config.quotas.rules])
        changed = [s for s in RESTART_SECTIONS
                   if config.raw.get(s) != self.started_config.raw.get(s)]
        if changed:
            log.warning("config_reload_needs_restart", sections=changed,
                        reason="only filters, module_cache_dir, quotas and policy_admins "
                               "change without a restart")
        return True

    async def _apply_fleet(self, desired: dict[str, FilterRecord],
                           policies: dict[str, PolicyRecord] | None = None) -> None:
        catalog = self.catalog
        assert catalog is not None
        started = time.perf_counter()
        plan = await asyncio.to_thread(catalog.plan, desired)
        for bad in plan.newly_refused:
            keep = catalog.accepted.get(bad.name)
            log.error("fleet_filter_refused", name=bad.name, sha256=bad.sha256,
                      reason=bad.reason, keeping=keep.record.sha256 if keep else None)
        if policies is None:
            policies = self.policies
        policies_changed = ({t: r.version for t, r in policies.items()}
                            != {t: r.version for t, r in self.policies.items()})
        if not plan.changed and not policies_changed:
            catalog.commit(plan)
            self.fleet_applied.set()
            if plan.newly_refused and self.follower is not None:
                self.follower.poke()
            return
        file_specs = list(self.config.filters)
        cache_dir = self.config.module_cache_dir
        bindings = policy_bindings(policies, {n: a.spec for n, a in plan.accepted.items()})

        def build() -> tuple[FilterChain | None, list[Binding], float]:
            t0 = time.perf_counter()
            checked = self._check_bindings(bindings, cache_dir)
            chain = build_chain(self._combine(file_specs, plan.specs, checked), cache_dir)
            return chain, checked, time.perf_counter() - t0

        try:
            chain, checked, build_s = await asyncio.to_thread(build)
        except ConfigError as exc:
            log.error("fleet_update_refused", **error_fields(exc))
            return
        self._report_bindings(checked)
        self.bindings = checked
        self.policies = dict(policies)
        catalog.commit(plan)
        self._switch(chain, "fleet", started, build_s)
        self.fleet_applied.set()
        if self.fleet is not None:
            removed = await asyncio.to_thread(catalog.prune, self.fleet.cache_max_bytes)
            if removed:
                log.info("fleet_cache_pruned", removed=len(removed),
                         max_bytes=self.fleet.cache_max_bytes)

    # ------------------------------------------------------------------ the file watcher
    def _current_signature(self) -> tuple[Any, ...]:
        path = self.config.path
        assert path is not None
        try:
            digest: str | None = hashlib.sha256(path.read_bytes()).hexdigest()
        except OSError:
            digest = None
        modules = tuple(
            (str(p), _stat(p)) for p in sorted({
                s.module_path for s in self.config.filters if not s.module.startswith("builtin:")
            }))
        return (digest, modules)

    async def _watch(self) -> None:
        while True:
            await asyncio.sleep(self.watch_seconds)
            now = self._current_signature()
            if now == self._signature or now[0] is None:
                continue  # unchanged, or the file is being replaced right now
            # Let a writer finish: reload once the file has stayed the same for a moment.
            await asyncio.sleep(min(0.2, self.watch_seconds))
            if self._current_signature() != now:
                continue
            self._signature = now
            self.request_reload("file-changed")


# ------------------------------------------------------------------------------------------
# data policies, as the admin path sees them
# ------------------------------------------------------------------------------------------

#: How long a policy this proxy wrote is reported before its follower has read it back.
WRITTEN_GRACE_SECONDS: Final = 60.0


class FleetPolicies:
    """The `PolicyBook` of proxy/paths/base.py, backed by the fleet topic.

    `value` answers from the fleet view the follower keeps, and, until the follower has read
    it back, from what this proxy just wrote (so a DescribeConfigs right after an alter shows
    the new value). `check` blocks (it loads the module): call it from a worker thread.
    """

    def __init__(self, manager: ChainManager) -> None:
        self.manager = manager
        self._matcher: tuple[Any, AdminMatcher] | None = None
        self._written: dict[str, tuple[tuple[int, int], str | None, float]] = {}

    def allows(self, principal: str | None) -> bool:
        patterns = self.manager.config.policy_admins
        if self._matcher is None or self._matcher[0] is not patterns:
            self._matcher = (patterns, AdminMatcher(patterns))
        return self._matcher[1].allows(principal)

    def value(self, topic: str) -> str | None:
        follower = self.manager.follower
        record = follower.view.policies.get(topic) if follower is not None else None
        written = self._written.get(topic)
        if written is not None:
            version, value, at = written
            if (record is None or record.version < version) and (
                    time.monotonic() - at < WRITTEN_GRACE_SECONDS):
                return value
            del self._written[topic]
        return record.value if record is not None else None

    def check(self, topic: str, policy: Policy) -> PolicyError | None:
        manager = self.manager
        accepted = dict(manager.catalog.accepted) if manager.catalog is not None else {}
        view = manager.follower.view if manager.follower is not None else None
        deployed = sorted(view.filters) if view is not None else []
        for i, entry in enumerate(policy.filters):
            found = accepted.get(entry.name)
            if found is None:
                if entry.name in deployed:
                    return PolicyError(f"filters[{i}].name",
                                       f"filter {entry.name!r} is deployed but this proxy "
                                       "refused it (see `sluice filter list`)")
                return PolicyError(f"filters[{i}].name",
                                   f"filter {entry.name!r} is not deployed in the fleet "
                                   f"(deployed: {', '.join(deployed) or 'none'})")
            spec = bind_spec(topic, entry, found.spec)
            try:
                check_loads(spec, manager.config.module_cache_dir)
            except (FilterLoadError, ValueError, OSError) as exc:
                return PolicyError(f"filters[{i}].config",
                                   f"filter {entry.name!r} does not load with it: {exc}")
        return None

    async def publish(self, topic: str, value: str | None, principal: str | None) -> None:
        follower = self.manager.follower
        settings = self.manager.fleet
        if follower is None or settings is None:
            raise OSError("the fleet is not configured")
        instance = self.manager.server.instance_id
        key = policy_key(topic)
        data: bytes | None
        if settings.signing_key is not None:
            # Signed by this proxy's key, above the seq in force (a replay changes nothing).
            payload = dict(policy_payload(topic, value, principal, instance),
                           seq=next_seq(follower.view.seqs.get(key.decode())))
            data = sign(settings.signing_key, key, payload)
        elif settings.allow_unsigned:
            data = (policy_record_value(topic, value, principal, instance)
                    if value is not None else None)
        else:
            raise OSError("this proxy has no fleet.signing_key: it cannot sign data policies")
        version = await follower.publish(key, data)
        self._written[topic] = (version, value, time.monotonic())
