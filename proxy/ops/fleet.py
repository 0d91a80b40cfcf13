"""The filter fleet: filter modules and their bindings kept in a compacted topic on the cluster.

One record per filter, key = the filter name (UTF-8); the value is JSON::

    {"format": 1, "name": "pii", "module": "builtin:pii-mask", "topics": ["users"],
     "apply_to": ["produce"], "on_error": "reject", "config": {...}, ... (the other keys of a
     ``filters:`` entry), "module_sha256": "<hex>", "module_size": 47014,
     "module_b64": "<the .wasm bytes, base64>", "deployed_at": "<ISO-8601>",
     "deployed_by": "user@host"}

An empty value (a tombstone) removes the filter. The newest record per key wins (compaction
keeps only that one). Proxies announce themselves in the same topic under the key
``instance:<instance id>`` with a heartbeat (host, pid, the filters they run by sha256, the fleet
versions they refused); a clean shutdown writes a tombstone for that key. Data policies (the
``x-data-policy`` topic config, proxy/ops/policies.py) live under ``policy:<topic>`` keys.

This module holds the record format (`FleetView` folds records into the current state), the
config section (`parse_fleet_section`), the catalog of accepted fleet filters
(`FleetCatalog`: verifies the module sha256, stores modules in the module cache directory by
sha256 and proves each one loads before it joins the chain), and the Kafka side
(`FleetFollower` for the proxy, `read_view`/`follow_view`/`ensure_topic` for the CLI), built on
confluent-kafka through fleet_kafka.py (the follower runs on the proxy's event loop, the
client's blocking calls on a thread of their own), secured by `upstream_tls:`/`upstream_sasl:`.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import dataclasses
import hashlib
import json
import os
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from sluice.filters.config import FilterSpec, parse_filter_specs
from sluice.filters.module_cache import default_cache_dir
from sluice.filters.yaml_lines import ConfigError, LineMap
from sluice.proxy.ops.fleet_kafka import (
    FleetAccessError,
    FleetAdmin,
    FleetKafkaError,
    FleetReader,
    FleetWriter,
)
from sluice.proxy.ops.fleet_signing import (
    FILTER,
    FILTER_REMOVED,
    POLICY,
    POLICY_REMOVED,
    KeyFileError,
    SignatureError,
    SigningKey,
    TrustedKey,
    Verified,
    is_signed,
    load_signing_key,
    load_trusted_keys,
    read_unverified,
    sign,
    verify,
)
from sluice.proxy.ops.policies import (
    POLICY_PREFIX,
    PolicyRecord,
    parse_policy_record,
    topic_name_problem,
)
from sluice.proxy.telemetry.logs import log

DEFAULT_TOPIC: Final = "_sluice_filters"
DEFAULT_POLL_SECONDS: Final = 2.0
DEFAULT_HEARTBEAT_SECONDS: Final = 5.0
DEFAULT_STARTUP_WAIT_SECONDS: Final = 10.0
INSTANCE_PREFIX: Final = "instance:"
#: Fleet batches larger than this are parsed in a worker thread, not on the event loop.
INLINE_APPLY_BYTES: Final = 256 * 1024
#: While the fleet cluster is unreachable, repeat the warning at most this often.
FAILURE_LOG_SECONDS: Final = 30.0
FORMAT_VERSION: Final = 1
#: Largest module `sluice filter deploy` accepts (it travels base64-encoded in one record).
MAX_MODULE_BYTES: Final = 8 * 1024 * 1024
#: Record size the topic is created with: the base64 of MAX_MODULE_BYTES plus the JSON around it.
MAX_RECORD_BYTES: Final = 16 * 1024 * 1024
TOPIC_CONFIGS: Final = {"cleanup.policy": "compact", "max.message.bytes": str(MAX_RECORD_BYTES)}
#: The keys of a ``filters:`` entry a fleet record carries (``module`` is replaced by the
#: stored module file when the proxy loads it).
SPEC_KEYS: Final = (
    "name", "topics", "apply_to", "on_error", "dead_letter_topic", "config", "function",
    "principals", "timeout_ms", "max_memory_mb",
)
_SETTINGS_KEYS: Final = (
    "topic", "poll_seconds", "heartbeat_seconds", "startup_wait_seconds", "bootstrap",
    "create_topic", "trusted_keys", "signing_key", "allow_unsigned", "cache_max_mb",
)
#: Default bound of the fleet module cache (``fleet.cache_max_mb``).
DEFAULT_CACHE_MAX_MB: Final = 256


class FleetRecordError(ValueError):
    """A fleet record that cannot be used (bad JSON, sha256 mismatch, missing field...)."""


# ------------------------------------------------------------------------------------------
# the config section
# ------------------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class FleetSettings:
    """The ``fleet:`` section of the config file."""

    topic: str = DEFAULT_TOPIC
    poll_seconds: float = DEFAULT_POLL_SECONDS
    heartbeat_seconds: float = DEFAULT_HEARTBEAT_SECONDS
    startup_wait_seconds: float = DEFAULT_STARTUP_WAIT_SECONDS
    bootstrap: str | None = None
    create_topic: bool = True
    #: Public keys whose signed records this proxy applies (its own signing key's included).
    trusted_keys: tuple[TrustedKey, ...] = ()
    #: This proxy's key: it signs the data policies set through it.
    signing_key: SigningKey | None = None
    #: Also apply unsigned records and bare tombstones (permissive; logged at start).
    allow_unsigned: bool = False
    cache_max_bytes: int = DEFAULT_CACHE_MAX_MB * 1024 * 1024

    def trust(self) -> FleetTrust:
        keys = {k.key_id: k for k in self.trusted_keys}
        if self.signing_key is not None:
            keys.setdefault(self.signing_key.key_id, self.signing_key.trusted())
        return FleetTrust(keys, self.allow_unsigned)


def _keys(raw: Any, lm: LineMap, base: Path | None) -> tuple[tuple[TrustedKey, ...],
                                                              SigningKey | None]:
    entries = raw.get("trusted_keys", [])
    if isinstance(entries, str):
        entries = [entries]
    if not isinstance(entries, list) or not all(isinstance(e, str) and e.strip()
                                                for e in entries):
        raise lm.error(("fleet", "trusted_keys"), "must be a list of public keys "
                       "('ed25519:<base64>') or paths of .pub files")
    trusted: list[TrustedKey] = []
    for i, entry in enumerate(entries):
        try:
            trusted.extend(load_trusted_keys([entry], base).values())
        except KeyFileError as exc:
            raise lm.error(("fleet", "trusted_keys", i), str(exc)) from None
    signing: SigningKey | None = None
    path = raw.get("signing_key")
    if path is not None:
        if not isinstance(path, str) or not path.strip():
            raise lm.error(("fleet", "signing_key"), "must be the path of a private key file "
                                                     "(sluice filter keygen writes one)")
        full = Path(path).expanduser()
        if base is not None and not full.is_absolute():
            full = base / full
        try:
            signing = load_signing_key(full)
        except KeyFileError as exc:
            raise lm.error(("fleet", "signing_key"), str(exc)) from None
    return tuple(trusted), signing


def parse_fleet_section(raw: Any, lines: LineMap | None = None,
                        base: Path | None = None) -> FleetSettings | None:
    """Validate ``fleet:`` (None when the section is absent); ConfigError names line and field.
    Key files are read here (relative paths: from `base`, the config file's directory)."""
    lm = lines if lines is not None else LineMap("<config>")
    if raw is None:
        return None
    if not isinstance(raw, dict):
        raise lm.error(("fleet",), "must be a mapping (use `fleet: {}` for the defaults)")
    for key in raw:
        if key not in _SETTINGS_KEYS:
            raise lm.error(("fleet", str(key)),
                           f"unknown key (expected one of {', '.join(_SETTINGS_KEYS)})")
    topic = raw.get("topic", DEFAULT_TOPIC)
    if not isinstance(topic, str) or not topic.strip() or len(topic) > 249:
        raise lm.error(("fleet", "topic"), f"must be a topic name, got {topic!r}")

    def seconds(key: str, default: float, minimum: float) -> float:
        value = raw.get(key, default)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value < minimum:
            raise lm.error(("fleet", key), f"must be a number of seconds >= {minimum}, "
                                           f"got {value!r}")
        return float(value)

    poll = seconds("poll_seconds", DEFAULT_POLL_SECONDS, 0.05)
    heartbeat = seconds("heartbeat_seconds", DEFAULT_HEARTBEAT_SECONDS, 0.1)
    wait = seconds("startup_wait_seconds", DEFAULT_STARTUP_WAIT_SECONDS, 0.0)
    bootstrap = raw.get("bootstrap")
    if bootstrap is not None and (not isinstance(bootstrap, str) or ":" not in bootstrap):
        raise lm.error(("fleet", "bootstrap"), f"must be HOST:PORT[,HOST:PORT...], "
                                               f"got {bootstrap!r}")
    create = raw.get("create_topic", True)
    if not isinstance(create, bool):
        raise lm.error(("fleet", "create_topic"), f"must be true or false, got {create!r}")
    allow = raw.get("allow_unsigned", False)
    if not isinstance(allow, bool):
        raise lm.error(("fleet", "allow_unsigned"), f"must be true or false, got {allow!r}")
    cache_mb = raw.get("cache_max_mb", DEFAULT_CACHE_MAX_MB)
    if isinstance(cache_mb, bool) or not isinstance(cache_mb, int) or cache_mb < 1:
        raise lm.error(("fleet", "cache_max_mb"), f"must be a whole number of MiB >= 1, "
                                                  f"got {cache_mb!r}")
    trusted, signing = _keys(raw, lm, base)
    if not trusted and signing is None and not allow:
        raise lm.error(("fleet", "trusted_keys"),
                       "required: the public keys whose signed fleet records this proxy applies "
                       "(`sluice filter keygen` makes a key pair; see docs/SECURITY.md). "
                       "`allow_unsigned: true` accepts unsigned records instead (insecure)")
    return FleetSettings(topic=topic, poll_seconds=poll, heartbeat_seconds=heartbeat,
                         startup_wait_seconds=wait, bootstrap=bootstrap, create_topic=create,
                         trusted_keys=trusted, signing_key=signing, allow_unsigned=allow,
                         cache_max_bytes=cache_mb * 1024 * 1024)


# ------------------------------------------------------------------------------------------
# records
# ------------------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class FilterRecord:
    """One deployed filter as the topic holds it (module bytes still base64; None when the
    record was restored from the proxy's state file and the module is in the cache)."""

    name: str
    fields: Mapping[str, Any]
    module: str
    sha256: str
    size: int
    module_b64: str | None
    deployed_at: str | None
    deployed_by: str | None
    partition: int
    offset: int
    #: Id of the key that signed the record (None: unsigned, permissive fleets only).
    signer: str | None = None
    seq: int = 0

    def module_bytes(self) -> bytes:
        """The module, after checking it against its sha256 (FleetRecordError if it differs)."""
        if self.module_b64 is None:
            raise FleetRecordError(f"fleet filter {self.name!r}: the record carries no module")
        try:
            data = base64.b64decode(self.module_b64, validate=True)
        except (binascii.Error, ValueError) as exc:
            raise FleetRecordError(f"fleet filter {self.name!r}: module_b64 is not base64 "
                                   f"({exc})") from None
        digest = hashlib.sha256(data).hexdigest()
        if digest != self.sha256:
            raise FleetRecordError(f"fleet filter {self.name!r}: module sha256 is {digest}, "
                                   f"the record says {self.sha256}")
        return data

    @property
    def version(self) -> tuple[int, int]:
        return (self.partition, self.offset)


@dataclass(frozen=True, slots=True)
class InstanceRecord:
    """A proxy's latest heartbeat."""

    instance: str
    data: Mapping[str, Any]

    @property
    def time_ms(self) -> int:
        value = self.data.get("time")
        return value if isinstance(value, int) else 0

    def live(self, now_ms: int | None = None) -> bool:
        """Heard from within three heartbeat intervals (plus slack for clock skew)."""
        now = now_ms if now_ms is not None else int(time.time() * 1000)
        interval = self.data.get("heartbeat_seconds")
        seconds = float(interval) if isinstance(interval, (int, float)) else 5.0
        return now - self.time_ms <= int(3 * seconds * 1000) + 2000

    def filters(self) -> list[dict[str, Any]]:
        items = self.data.get("filters")
        return [f for f in items if isinstance(f, dict)] if isinstance(items, list) else []

    def refused(self) -> list[dict[str, Any]]:
        items = self.data.get("refused")
        return [f for f in items if isinstance(f, dict)] if isinstance(items, list) else []


def filter_payload(fields: Mapping[str, Any], module_name: str, module: bytes,
                   deployed_by: str | None = None) -> dict[str, Any]:
    """What `sluice filter deploy` records (`fields`: keys of a ``filters:`` entry): the
    binding, the module's sha256 and size, who and when; not the module bytes."""
    body: dict[str, Any] = {"format": FORMAT_VERSION, "type": "filter"}
    for key in SPEC_KEYS:
        value = fields.get(key)
        if value is not None:
            body[key] = list(value) if isinstance(value, (tuple, frozenset, set)) else value
    if isinstance(body.get("apply_to"), list):
        body["apply_to"] = sorted(body["apply_to"])
    body.update(
        module=module_name,
        module_sha256=hashlib.sha256(module).hexdigest(),
        module_size=len(module),
        deployed_at=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        deployed_by=deployed_by,
    )
    return body


def removal_payload(name: str, removed_by: str | None) -> dict[str, Any]:
    """What `sluice filter remove` records (signed; a bare tombstone changes nothing)."""
    return {"type": FILTER_REMOVED, "name": name, "removed_by": removed_by,
            "removed_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}


def filter_record_value(fields: Mapping[str, Any], module_name: str, module: bytes,
                        deployed_by: str | None = None) -> bytes:
    """An unsigned (format 1) filter record, as a fleet with ``allow_unsigned`` accepts it."""
    body = filter_payload(fields, module_name, module, deployed_by)
    body["module_b64"] = base64.b64encode(module).decode("ascii")
    return json.dumps(body, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def signed_filter_value(key: SigningKey, fields: Mapping[str, Any], module_name: str,
                        module: bytes, deployed_by: str | None, seq: int) -> bytes:
    """The signed record `sluice filter deploy` writes."""
    body = dict(filter_payload(fields, module_name, module, deployed_by), seq=seq)
    return sign(key, str(fields["name"]).encode("utf-8"), body,
                base64.b64encode(module).decode("ascii"))


def parse_filter_record(name: str, value: bytes | Mapping[str, Any], partition: int = 0,
                        offset: int = 0, *, module_b64: str | None = None,
                        signer: str | None = None, seq: int = 0) -> FilterRecord:
    """Parse one filter record: its JSON (format 1, the module inside), or the payload of a
    verified signed record with `module_b64` beside it (FleetRecordError if malformed)."""
    if isinstance(value, Mapping):
        body: Any = value
    else:
        try:
            body = json.loads(value)
        except ValueError as exc:
            raise FleetRecordError(f"fleet filter {name!r}: value is not JSON ({exc})") from None
        if isinstance(body, dict):
            module_b64 = body.get("module_b64")
    if not isinstance(body, Mapping):
        raise FleetRecordError(f"fleet filter {name!r}: value must be a JSON object")
    if body.get("format") != FORMAT_VERSION:
        raise FleetRecordError(f"fleet filter {name!r}: unsupported format "
                               f"{body.get('format')!r} (this proxy reads {FORMAT_VERSION})")
    if body.get("name", name) != name:
        raise FleetRecordError(f"fleet filter {name!r}: the record names {body.get('name')!r}")
    sha = body.get("module_sha256")
    if not isinstance(sha, str) or len(sha) != 64 or any(c not in "0123456789abcdef"
                                                         for c in sha):
        raise FleetRecordError(f"fleet filter {name!r}: module_sha256 must be 64 hex digits")
    b64 = module_b64
    if b64 is not None and (not isinstance(b64, str) or not b64):
        raise FleetRecordError(f"fleet filter {name!r}: module_b64 is missing")
    if b64 is None and signer is None:
        raise FleetRecordError(f"fleet filter {name!r}: module_b64 is missing")
    fields = {k: body[k] for k in SPEC_KEYS if k in body}
    fields["name"] = name
    size = body.get("module_size")
    module = body.get("module")
    at, by = body.get("deployed_at"), body.get("deployed_by")
    return FilterRecord(
        name=name, fields=fields, module=module if isinstance(module, str) else "",
        sha256=sha, size=size if isinstance(size, int) else len(b64 or "") * 3 // 4,
        module_b64=b64, deployed_at=at if isinstance(at, str) else None,
        deployed_by=by if isinstance(by, str) else None, partition=partition, offset=offset,
        signer=signer, seq=seq)


@dataclass(frozen=True, slots=True)
class FleetTrust:
    """Which records a proxy applies: signed by one of `keys`, or also unsigned ones (and bare
    tombstones) when `allow_unsigned` (an explicit, permissive setting)."""

    keys: Mapping[str, TrustedKey]
    allow_unsigned: bool = False


#: Labels of refused records (``sluice_fleet_records_refused_total{reason}``).
REFUSAL_REASONS: Final = ("unsigned", "untrusted_key", "bad_signature", "unreadable", "replay",
                          "invalid_name")
_LOGGED_KEY_CHARS: Final = 120


@dataclass
class FleetView:
    """The state a fleet topic describes, folded record by record.

    With a `trust` (a proxy, or the CLI given trusted keys), only records that verify count:
    a filter or policy key changes only with a signed record whose ``seq`` is above the key's
    current one; anything else is kept in `refused` (key, reason, message) for the caller to
    count and log, and changes nothing. Without a `trust` (``sluice filter list`` with no
    keys) every record is read for display, signatures unchecked.
    """

    filters: dict[str, FilterRecord] = field(default_factory=dict)
    instances: dict[str, InstanceRecord] = field(default_factory=dict)
    #: Data policies by topic (``policy:<topic>`` keys).
    policies: dict[str, PolicyRecord] = field(default_factory=dict)
    #: Keys whose newest record could not be parsed (the previous version stays in `filters`).
    invalid: dict[str, str] = field(default_factory=dict)
    records: int = 0
    trust: FleetTrust | None = None
    #: Per filter name / ``policy:<topic>`` key: the seq of the record in force.
    seqs: dict[str, int] = field(default_factory=dict)
    #: Per key: the verified envelope in force (module bytes left out) and its position.
    signed: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: Records refused since the caller last emptied this list: (key, reason, message).
    refused: list[tuple[str, str, str]] = field(default_factory=list)
    #: Caught up with the topic: an older record read from now on is a replay.
    live: bool = False

    def apply_all(self, records: Iterable[tuple[bytes | None, bytes | None, int, int]]) -> bool:
        """Fold (key, value, partition, offset) records in order; True if filters or policies
        changed."""
        changed = False
        for key, value, partition, offset in records:
            changed = self.apply(key, value, partition, offset) or changed
        return changed

    def _refuse(self, name: str, reason: str, message: str) -> bool:
        self.refused.append((name[:_LOGGED_KEY_CHARS], reason, message))
        del self.refused[:-1000]  # the caller drains it; never grows without bound
        return False

    def apply(self, key: bytes | None, value: bytes | None, partition: int = 0,
              offset: int = 0) -> bool:
        """Fold one record in; True when the filters or the policies changed."""
        self.records += 1
        if key is None:
            return False
        try:
            name = key.decode("utf-8")
        except UnicodeDecodeError:
            return self._refuse(repr(key), "unreadable", "the record key is not UTF-8") \
                if value and self.trust is not None else False
        if name.startswith(INSTANCE_PREFIX):
            instance = name[len(INSTANCE_PREFIX):]
            if not value:
                self.instances.pop(instance, None)
                return False
            try:
                data = json.loads(value)
            except ValueError:
                return False
            if isinstance(data, dict):
                self.instances[instance] = InstanceRecord(instance, data)
            return False
        if name.startswith(POLICY_PREFIX):
            problem = topic_name_problem(name[len(POLICY_PREFIX):])
            if problem is not None:
                # Never a glob, never `*`: such a record blocks nothing and binds nothing.
                return self._refuse(name, "invalid_name", f"policy record ignored: {problem}")
        trust = self.trust
        if trust is None:
            if value and is_signed(value):
                try:
                    got = read_unverified(value)
                except SignatureError as exc:
                    self.invalid[name] = str(exc)
                    return False
                return self._apply_verified(name, got, partition, offset)
            return self._apply_unsigned(name, value, partition, offset)
        if not value:
            if trust.allow_unsigned:
                return self._apply_unsigned(name, value, partition, offset)
            return self._refuse(name, "unsigned", "a bare tombstone changes nothing (a removal "
                                                  "is a signed record)")
        if trust.allow_unsigned and not is_signed(value):
            return self._apply_unsigned(name, value, partition, offset)
        try:
            verified = verify(key, value, trust.keys)
        except SignatureError as exc:
            return self._refuse(name, exc.reason, str(exc))
        return self._apply_verified(name, verified, partition, offset)

    def restore(self, name: str, envelope: Mapping[str, Any], partition: int,
                offset: int) -> bool:
        """Fold in one entry of the proxy's state file (verified again: the file is on disk)."""
        if self.trust is None:
            return False
        if name.startswith(POLICY_PREFIX) and topic_name_problem(name[len(POLICY_PREFIX):]):
            return self._refuse(name, "invalid_name", "state file entry ignored")
        try:
            verified = verify(name.encode("utf-8"), envelope, self.trust.keys)
        except SignatureError as exc:
            return self._refuse(name, exc.reason, f"state file entry: {exc}")
        return self._apply_verified(name, verified, partition, offset)

    def _apply_verified(self, name: str, record: Verified, partition: int, offset: int) -> bool:
        is_policy = name.startswith(POLICY_PREFIX)
        topic = name[len(POLICY_PREFIX):] if is_policy else ""
        expected = (POLICY, POLICY_REMOVED) if is_policy else (FILTER, FILTER_REMOVED)
        if record.type not in expected:
            return self._refuse(name, "unreadable", f"a {record.type!r} record under this key")
        named = record.payload.get("topic") if is_policy else record.payload.get("name", name)
        if named != (topic if is_policy else name):
            return self._refuse(name, "unreadable", f"the signed record names {named!r}")
        current = self.seqs.get(name, 0)
        if record.seq <= current:
            if record.seq < current and self.live:
                return self._refuse(name, "replay", f"seq {record.seq} is not above the "
                                                    f"record in force ({current})")
            return False  # the record in force, or an older one read again on a re-read
        entry = {"envelope": dict(record.envelope), "partition": partition, "offset": offset}
        if record.type == FILTER:
            try:
                parsed = parse_filter_record(name, record.payload, partition, offset,
                                             module_b64=record.module_b64,
                                             signer=record.key_id, seq=record.seq)
            except FleetRecordError as exc:
                self.invalid[name] = str(exc)
                return False
            self.seqs[name], self.signed[name] = record.seq, entry
            self.invalid.pop(name, None)
            self.filters[name] = parsed
            return True
        self.seqs[name], self.signed[name] = record.seq, entry
        if record.type == FILTER_REMOVED:
            self.invalid.pop(name, None)
            return self.filters.pop(name, None) is not None
        if record.type == POLICY_REMOVED:
            return self.policies.pop(topic, None) is not None
        # A signed policy that cannot be used is kept (with its error): its topic fails closed.
        self.policies[topic] = parse_policy_record(topic, record.payload, partition, offset,
                                                   record.key_id, record.seq)
        return True

    def _apply_unsigned(self, name: str, value: bytes | None, partition: int,
                        offset: int) -> bool:
        """Format-1 records: permissive fleets (``allow_unsigned``) and the CLI's display."""
        if name.startswith(POLICY_PREFIX):
            topic = name[len(POLICY_PREFIX):]
            if not value:
                return self.policies.pop(topic, None) is not None
            self.policies[topic] = parse_policy_record(topic, value, partition, offset)
            return True
        if not value:
            self.invalid.pop(name, None)
            return self.filters.pop(name, None) is not None
        try:
            record = parse_filter_record(name, value, partition, offset)
        except FleetRecordError as exc:
            self.invalid[name] = str(exc)
            return False
        self.invalid.pop(name, None)
        self.filters[name] = record
        return True


# ------------------------------------------------------------------------------------------
# modules on disk and the accepted set
# ------------------------------------------------------------------------------------------

def fleet_module_dir(cache_dir: str | Path | None) -> Path:
    """Where fleet modules are stored: ``<module cache dir>/fleet``."""
    base = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()
    return base / "fleet"


def store_module(directory: Path, sha256: str, data: bytes) -> Path:
    """Write `data` as ``<directory>/<sha256>.wasm`` (atomic; kept if already there)."""
    path = directory / f"{sha256}.wasm"
    try:
        if hashlib.sha256(path.read_bytes()).hexdigest() == sha256:
            return path
    except OSError:
        pass
    directory.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".tmp-", suffix=".wasm")
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return path


@dataclass(frozen=True, slots=True)
class Accepted:
    record: FilterRecord
    spec: FilterSpec


@dataclass(frozen=True, slots=True)
class Refused:
    name: str
    sha256: str
    version: tuple[int, int]
    reason: str


@dataclass
class FleetPlan:
    """The outcome of `FleetCatalog.plan`: apply it with `FleetCatalog.commit` once the chain
    built from `specs` is installed."""

    accepted: dict[str, Accepted]
    refused: dict[str, Refused]
    newly_refused: list[Refused]
    changed: bool

    @property
    def specs(self) -> list[FilterSpec]:
        """Fleet filters in chain order: by name."""
        return [self.accepted[n].spec for n in sorted(self.accepted)]


class FleetCatalog:
    """The fleet filters this proxy runs, and the versions it refused.

    `check(spec)` must raise (FilterLoadError, ValueError) when the filter cannot run; a
    refused version leaves the previously accepted version of that name running (a broken
    update of a masking filter must not switch masking off).
    """

    def __init__(self, topic: str, cache_dir: str | Path | None,
                 check: Callable[[FilterSpec], None]) -> None:
        self.topic = topic
        self.module_dir = fleet_module_dir(cache_dir)
        self.check = check
        self.accepted: dict[str, Accepted] = {}
        self.refused: dict[str, Refused] = {}

    @property
    def specs(self) -> list[FilterSpec]:
        return [self.accepted[n].spec for n in sorted(self.accepted)]

    def spec_for(self, record: FilterRecord) -> FilterSpec:
        """Verify and store the module, validate the binding (raises on any problem).

        The record reached here verified (signature, then the module's sha256 before a byte
        is written); a module that then does not load is deleted again unless in use."""
        path = self.module_dir / f"{record.sha256}.wasm"
        existed = path.exists()
        if record.module_b64 is None:
            # Restored from the state file: the module must be in the cache, intact.
            try:
                data = path.read_bytes()
            except OSError:
                raise FleetRecordError(f"fleet filter {record.name!r}: module {record.sha256} "
                                       "is not in the module cache") from None
            if hashlib.sha256(data).hexdigest() != record.sha256:
                raise FleetRecordError(f"fleet filter {record.name!r}: the cached module "
                                       f"{path.name} does not match its sha256")
            with contextlib.suppress(OSError):
                os.utime(path)
        else:
            path = store_module(self.module_dir, record.sha256, record.module_bytes())
        try:
            fields = dict(record.fields)
            fields["module"] = str(path)
            specs = parse_filter_specs([fields], f"fleet:{self.topic}", None,
                                       field_prefix=("fleet", record.name))
            spec = dataclasses.replace(specs[0], signer=record.signer)
            self.check(spec)
        except BaseException:
            in_use = {a.record.sha256 for a in self.accepted.values()}
            if not existed and record.sha256 not in in_use:
                with contextlib.suppress(OSError):
                    path.unlink()
            raise
        return spec

    def prune(self, max_bytes: int) -> list[str]:
        """Bound the module directory: delete the least recently used modules no accepted
        filter uses (and stale temporary files) until it holds at most `max_bytes`; returns
        the names removed. Modules in use are never removed."""
        in_use = {f"{a.record.sha256}.wasm" for a in self.accepted.values()}
        try:
            entries = list(self.module_dir.iterdir())
        except OSError:
            return []
        removed: list[str] = []
        files: list[tuple[float, int, Path]] = []
        total = 0
        for p in entries:
            try:
                st = p.stat()
            except OSError:
                continue
            if p.name.startswith(".tmp-") and time.time() - st.st_mtime > 3600:
                with contextlib.suppress(OSError):
                    p.unlink()
                    removed.append(p.name)
                continue
            if p.suffix != ".wasm":
                continue
            total += st.st_size
            if p.name not in in_use:
                files.append((st.st_mtime, st.st_size, p))
        for _mtime, size, p in sorted(files, key=lambda f: f[0]):
            if total <= max_bytes:
                break
            with contextlib.suppress(OSError):
                p.unlink()
                removed.append(p.name)
                total -= size
        return removed

    def plan(self, desired: Mapping[str, FilterRecord]) -> FleetPlan:
        """Work out the accepted set for `desired` (blocking: runs modules' init)."""
        accepted: dict[str, Accepted] = {}
        refused: dict[str, Refused] = {}
        newly: list[Refused] = []
        for name, record in desired.items():
            current = self.accepted.get(name)
            if current is not None and current.record.version == record.version:
                accepted[name] = current
                continue
            known = self.refused.get(name)
            if known is not None and known.version == record.version:
                refused[name] = known
                if current is not None:
                    accepted[name] = current
                continue
            try:
                accepted[name] = Accepted(record, self.spec_for(record))
            except (FleetRecordError, ConfigError, ValueError, OSError) as exc:
                bad = Refused(name, record.sha256, record.version, str(exc))
                refused[name] = bad
                newly.append(bad)
                if current is not None:
                    accepted[name] = current
        before = {n: a.record.version for n, a in self.accepted.items()}
        after = {n: a.record.version for n, a in accepted.items()}
        return FleetPlan(accepted, refused, newly, before != after)

    def commit(self, plan: FleetPlan) -> None:
        self.accepted = dict(plan.accepted)
        self.refused = dict(plan.refused)


# ------------------------------------------------------------------------------------------
# Kafka IO (confluent-kafka, in fleet_kafka.py)
# ------------------------------------------------------------------------------------------

def _servers(bootstrap: str) -> str:
    return ",".join(s.strip() for s in bootstrap.split(",") if s.strip())


async def ensure_topic(bootstrap: str, topic: str, *, timeout: float = 15.0,
                       security: Mapping[str, Any] | None = None,
                       client_id: str = "sluice-fleet-admin") -> bool:
    """Create `topic` compacted (1 partition) if it does not exist; True if it was created."""
    admin = FleetAdmin(_servers(bootstrap), security or {}, client_id)
    return await admin.ensure_topic(topic, TOPIC_CONFIGS, timeout)


async def follow_view(bootstrap: str, topic: str,
                      until: Callable[[FleetView], bool], *, timeout: float,
                      client_id: str = "sluice-fleet-cli",
                      trust: FleetTrust | None = None,
                      security: Mapping[str, Any] | None = None) -> tuple[FleetView, bool]:
    """Read `topic` from the beginning, then keep reading until `until(view)` holds (checked
    once caught up and after every new batch) or `timeout` seconds pass.

    Returns (view, satisfied). A missing topic reads as an empty view.
    """
    deadline = time.monotonic() + timeout
    view = FleetView(trust=trust)
    reader = FleetReader(_servers(bootstrap), topic, security or {}, client_id, 200,
                         MAX_RECORD_BYTES)
    try:
        if await reader.assign_all(min(timeout, 10.0)) is None:
            return view, until(view)
        _begin, end = await reader.offsets(min(timeout, 10.0))
        synced = False
        while True:
            view.apply_all(await reader.poll(200))
            if not synced:
                synced = await reader.caught_up(end)
            if synced and until(view):
                return view, True
            if time.monotonic() >= deadline:
                return view, False
    finally:
        await reader.close()


async def read_view(bootstrap: str, topic: str, *, timeout: float = 30.0,
                    trust: FleetTrust | None = None,
                    security: Mapping[str, Any] | None = None) -> FleetView:
    """The current state of the fleet topic (reads up to the end once)."""
    view, done = await follow_view(bootstrap, topic, lambda _v: True, timeout=timeout,
                                   trust=trust, security=security)
    if not done:
        raise TimeoutError(f"could not read fleet topic {topic!r} to its end in {timeout:.0f} s")
    return view


async def produce(bootstrap: str, topic: str, key: bytes, value: bytes | None, *,
                  timeout: float = 30.0, security: Mapping[str, Any] | None = None,
                  client_id: str = "sluice-fleet-cli") -> tuple[int, int]:
    """Write one record (None = tombstone); returns (partition, offset)."""
    writer = FleetWriter(_servers(bootstrap), security or {}, client_id, MAX_RECORD_BYTES)
    try:
        return await writer.send(topic, key, value, timeout)
    finally:
        await writer.close(1.0)


# ------------------------------------------------------------------------------------------
# the proxy's own copy of the last verified state
# ------------------------------------------------------------------------------------------

def state_path(module_dir: Path, topic: str) -> Path:
    """Where a proxy keeps the last verified fleet state: beside the fleet modules."""
    return module_dir / f"state-{topic}.json"


def save_state(path: Path, view: FleetView, read_to: Mapping[int, int]) -> None:
    """Write the verified envelopes in force (no module bytes) and how far the topic was
    read, atomically. The file holds nothing secret; every entry is verified again on load."""
    body = {"format": 1, "records": view.signed,
            "read_to": {str(p): o for p, o in sorted(read_to.items())}}
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-state-", suffix=".json")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            json.dump(body, fh, separators=(",", ":"))
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def load_state(path: Path) -> tuple[dict[str, Any], dict[int, int]]:
    """(records by key, read_to by partition) from a state file; empty if there is none.
    ValueError if it exists but cannot be read."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return {}, {}
    except OSError as exc:
        raise ValueError(f"{path}: {exc.strerror or exc}") from None
    try:
        body = json.loads(text)
        records = body["records"]
        read_to = {int(p): int(o) for p, o in body.get("read_to", {}).items()}
    except (ValueError, TypeError, KeyError, AttributeError):
        raise ValueError(f"{path}: not a fleet state file") from None
    if not isinstance(records, dict):
        raise ValueError(f"{path}: not a fleet state file")
    return records, read_to


#: Refused records are logged at most this often per reason (the metric counts every one).
REFUSAL_LOG_SECONDS: Final = 30.0


OnChange = Callable[[dict[str, FilterRecord], dict[str, PolicyRecord]], Awaitable[None]]


class FleetFollower:
    """Follows the fleet topic on the proxy's event loop and publishes this proxy's heartbeat.

    `on_change(filters, policies)` receives the whole current state once the topic has been read
    to its end, then after every batch that changes it. `heartbeat()` returns the body of this
    proxy's heartbeat; `poke()` sends one now (after a chain switch); `publish` writes a record
    (a data policy) with the same producer.

    The view is kept for the proxy's whole life (and in `state_file` across restarts): only
    records that verify change it. A topic that disappears, is recreated, truncated or loses
    the records in force changes nothing; it is reported (`on_lost`, ``fleet_topic_lost``).
    """

    def __init__(self, settings: FleetSettings, bootstrap: str, instance_id: str,
                 on_change: OnChange, heartbeat: Callable[[], dict[str, Any]], *,
                 state_file: Path | None = None,
                 on_refused: Callable[[str], None] | None = None,
                 on_lost: Callable[[], None] | None = None,
                 security: Mapping[str, Any] | None = None) -> None:
        self.settings = settings
        self.bootstrap = settings.bootstrap or bootstrap
        #: librdkafka settings of `upstream_tls:`/`upstream_sasl:` (kafka_settings.py).
        self.security: dict[str, Any] = dict(security or {})
        #: Set when the cluster refused the proxy's user (credentials or ACLs): the message.
        self.access_error: str | None = None
        self.access_denied = asyncio.Event()
        self.instance_id = instance_id
        self.on_change = on_change
        self.heartbeat = heartbeat
        self.on_refused = on_refused
        self.on_lost = on_lost
        self.synced = asyncio.Event()
        self.view = FleetView(trust=settings.trust())
        self.state_file = state_file
        self._read_to: dict[int, int] = {}
        #: Keys (and seqs) whose records were lost from the topic and already reported.
        self._unanchored: dict[str, int] = {}
        self._saved: dict[str, int] = {}
        self._refusal_logged: dict[str, tuple[float, int]] = {}
        self._topic_ready = asyncio.Event()
        self._poke = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self._producer: FleetWriter | None = None
        self._restore()

    @property
    def key(self) -> bytes:
        return f"{INSTANCE_PREFIX}{self.instance_id}".encode()

    def _restore(self) -> None:
        if self.state_file is None:
            return
        try:
            records, read_to = load_state(self.state_file)
        except ValueError as exc:
            log.error("fleet_state_unreadable", file=str(self.state_file), reason=str(exc),
                      effect="starting from the fleet topic alone")
            return
        for name, entry in sorted(records.items()):
            if isinstance(entry, dict) and isinstance(entry.get("envelope"), dict):
                self.view.restore(str(name), entry["envelope"], int(entry.get("partition", 0)),
                                  int(entry.get("offset", 0)))
        self._drain_refusals()
        self._read_to = dict(read_to)
        self._saved = dict(self.view.seqs)
        if self.view.signed:
            log.info("fleet_state_restored", file=str(self.state_file),
                     filters=sorted(self.view.filters), policies=sorted(self.view.policies))

    def restored(self) -> bool:
        """Whether the state file gave filters or policies to apply before the topic is read."""
        return bool(self.view.filters or self.view.policies)

    def _save(self) -> None:
        if self.state_file is None or self.view.seqs == self._saved:
            return
        try:
            save_state(self.state_file, self.view, self._read_to)
            self._saved = dict(self.view.seqs)
        except OSError as exc:
            log.warning("fleet_state_not_saved", file=str(self.state_file),
                        error=exc.strerror or str(exc))

    def _drain_refusals(self) -> None:
        refused, self.view.refused = self.view.refused, []
        now = time.monotonic()
        for key, reason, message in refused:
            if self.on_refused is not None:
                self.on_refused(reason)
            last, suppressed = self._refusal_logged.get(reason, (-1e9, 0))
            if now - last < REFUSAL_LOG_SECONDS:
                self._refusal_logged[reason] = (last, suppressed + 1)
                continue
            self._refusal_logged[reason] = (now, 0)
            log.warning("fleet_record_refused", topic=self.settings.topic, key=key,
                        reason=reason, detail=message[:300], suppressed_since_last=suppressed,
                        effect="ignored: nothing running changes")

    def _lost(self, reason: str) -> None:
        if self.on_lost is not None:
            self.on_lost()
        log.error("fleet_topic_lost", topic=self.settings.topic, reason=reason,
                  keeping_filters=sorted(self.view.filters),
                  keeping_policies=sorted(self.view.policies),
                  effect="the last verified fleet state stays in force; see docs/SECURITY.md "
                         "(Signed filters and policies) to recover")

    def _check_positions(self, tps: list[int], begin: Mapping[int, int],
                         end: Mapping[int, int]) -> None:
        """Report a topic that lost what this proxy read (recreated, truncated, deleted)."""
        problems: list[str] = []
        for tp in tps:
            read = self._read_to.get(tp)
            if read is not None and end.get(tp, 0) < read:
                problems.append(f"partition {tp} ends at offset {end.get(tp, 0)}, "
                                f"below offset {read} already read (recreated or truncated)")
        for name, entry in self.view.signed.items():
            if self._unanchored.get(name) == self.view.seqs.get(name):
                continue  # already reported lost; the state in force stays as it is
            partition, offset = int(entry.get("partition", 0)), int(entry.get("offset", 0))
            tp = partition
            if tp in begin and (offset < begin[tp] or offset >= end.get(tp, 0)) and \
                    not problems:
                problems.append(f"the record in force for {name[:_LOGGED_KEY_CHARS]!r} "
                                f"(partition {partition}, offset {offset}) is gone")
        if problems:
            self._lost("; ".join(problems[:3]))
            # Follow the topic as it is now; the view (the verified state) stays as it was.
            self._read_to = {}
            self._unanchored = dict(self.view.seqs)

    def start(self) -> None:
        self._tasks = [asyncio.create_task(self._follow_forever(), name="fleet-follow"),
                       asyncio.create_task(self._heartbeat_forever(), name="fleet-heartbeat")]

    def poke(self) -> None:
        self._poke.set()

    async def stop(self, timeout: float = 5.0) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        producer, self._producer = self._producer, None
        if producer is None:
            return
        try:
            # A tombstone, so `sluice filter list` stops showing this instance at once.
            await asyncio.wait_for(
                producer.send(self.settings.topic, self.key, None, timeout), timeout + 1)
        except (FleetKafkaError, OSError, TimeoutError) as exc:
            log.warning("fleet_goodbye_failed", error=str(exc))
        with contextlib.suppress(FleetKafkaError, OSError, TimeoutError):
            await asyncio.wait_for(producer.close(timeout), timeout + 1)

    async def publish(self, key: bytes, value: bytes | None,
                      timeout: float = 10.0) -> tuple[int, int]:
        """Write one record to the fleet topic and wait for the broker's acknowledgement;
        returns (partition, offset). FleetKafkaError, OSError or TimeoutError when it cannot."""
        producer = self._producer
        if producer is None:
            # The heartbeat task has not connected yet: a producer for this one record.
            return await asyncio.wait_for(
                produce(self.bootstrap, self.settings.topic, key, value, timeout=timeout,
                        security=self.security, client_id=self._client_id),
                timeout + 5)
        return await asyncio.wait_for(
            producer.send(self.settings.topic, key, value, timeout), timeout + 1)

    @property
    def _client_id(self) -> str:
        return f"sluice-fleet-{self.instance_id}"

    async def _follow_forever(self) -> None:
        failures, logged_at = 0, 0.0
        while True:
            try:
                await self._follow()
            except FleetAccessError as exc:
                # Credentials or ACLs: no retry soon will cure it. Say so once, clearly; the
                # start-up wait (reload.py) turns it into a refusal to start.
                failures += 1
                now = time.monotonic()
                if self.access_error != str(exc) or now - logged_at >= FAILURE_LOG_SECONDS:
                    logged_at = now
                    log.error("fleet_access_denied", topic=self.settings.topic,
                              bootstrap=self.bootstrap, error=str(exc), failures=failures,
                              effect="the fleet's filters and policies are not read; "
                                     "the last verified state stays in force")
                self.access_error = str(exc)
                self.access_denied.set()
                await asyncio.sleep(self.settings.poll_seconds)
            except Exception as exc:  # any client failure: retry; the proxy keeps serving
                failures += 1
                now = time.monotonic()
                if failures == 1 or now - logged_at >= FAILURE_LOG_SECONDS:
                    logged_at = now
                    log.warning("fleet_follow_failed", topic=self.settings.topic,
                                bootstrap=self.bootstrap, error=str(exc) or type(exc).__name__,
                                failures=failures, retry_seconds=self.settings.poll_seconds)
                await asyncio.sleep(self.settings.poll_seconds)

    async def _follow(self) -> None:
        s = self.settings
        if s.create_topic and await ensure_topic(self.bootstrap, s.topic,
                                                 security=self.security,
                                                 client_id=self._client_id):
            log.info("fleet_topic_created", topic=s.topic)
        poll_ms = int(s.poll_seconds * 1000)
        consumer = FleetReader(_servers(self.bootstrap), s.topic, self.security,
                               self._client_id, min(500, poll_ms), MAX_RECORD_BYTES)
        try:
            tps = await consumer.assign_all()
            if tps is None and (self._read_to or set(self.view.seqs.items())
                                - set(self._unanchored.items())):
                self._lost("the fleet topic does not exist")
                self._read_to = {}
                self._unanchored = dict(self.view.seqs)
            while tps is None:
                await asyncio.sleep(s.poll_seconds)
                tps = await consumer.assign_all()
            self._topic_ready.set()
            self.access_error = None
            self.access_denied.clear()
            begin, end = await consumer.offsets()
            self._check_positions(tps, begin, end)
            view = self.view
            view.live = False  # re-reading from the start: older records are no replay
            synced = False
            pending = False
            reported: dict[str, str] = {}
            checked_at = time.monotonic()
            while True:
                records = await consumer.poll(poll_ms)
                size = sum(len(r[1] or b"") for r in records)
                if size > INLINE_APPLY_BYTES:
                    # Parsing megabytes of JSON would stall client traffic: do it off the loop.
                    changed = await asyncio.to_thread(view.apply_all, records)
                else:
                    changed = view.apply_all(records)
                for _key, _value, partition, offset in records:
                    self._read_to[partition] = max(self._read_to.get(partition, 0), offset + 1)
                self._drain_refusals()
                pending = pending or changed
                for name, reason in view.invalid.items():
                    if reported.get(name) != reason:
                        log.error("fleet_record_invalid", topic=s.topic, key=name, reason=reason)
                reported = dict(view.invalid)
                if not synced:
                    synced = await consumer.caught_up(end)
                    if synced:
                        view.live = True
                        log.info("fleet_synced", topic=s.topic, records=view.records,
                                 filters=sorted(view.filters))
                        self._save()
                        await self.on_change(dict(view.filters), dict(view.policies))
                        pending = False
                        self.synced.set()
                elif pending:
                    pending = False
                    self._save()
                    await self.on_change(dict(view.filters), dict(view.policies))
                if synced and time.monotonic() - checked_at >= max(1.0, s.poll_seconds):
                    # A topic deleted or truncated under a running proxy: noticed here.
                    checked_at = time.monotonic()
                    if not await consumer.exists():
                        raise FleetKafkaError(f"fleet topic {s.topic!r} disappeared")
                    self._check_positions(tps, *await consumer.offsets())
        finally:
            await consumer.close()

    async def _heartbeat_forever(self) -> None:
        s = self.settings
        await self._topic_ready.wait()
        # librdkafka connects lazily: a cluster it cannot reach shows in the first send.
        self._producer = FleetWriter(_servers(self.bootstrap), self.security, self._client_id,
                                     MAX_RECORD_BYTES)
        while True:
            self._poke.clear()
            body = dict(self.heartbeat())
            body.update(type="instance", instance=self.instance_id,
                        time=int(time.time() * 1000), heartbeat_seconds=s.heartbeat_seconds)
            try:
                await asyncio.wait_for(self._producer.send(
                    s.topic, self.key, json.dumps(body, separators=(",", ":")).encode(), 10), 11)
            except Exception as exc:  # the next heartbeat tries again
                log.warning("fleet_heartbeat_failed", error=str(exc) or type(exc).__name__)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._poke.wait(), s.heartbeat_seconds)
