"""``sluice filter deploy|remove|list``: manage the filter fleet topic (see proxy/ops/fleet.py).

    sluice filter keygen KEYFILE
    sluice filter deploy NAME MODULE --topics T1,T2 --on produce,fetch --signing-key KEYFILE \
        --bootstrap HOST:PORT
    sluice filter remove NAME --signing-key KEYFILE --bootstrap HOST:PORT
    sluice filter list --bootstrap HOST:PORT [--trusted-key PUB ...] [--json]

Every proxy whose config has a ``fleet:`` section follows the topic and applies a deploy or
remove within seconds, if it is signed by a key the proxy trusts (``fleet.trusted_keys``);
``--wait SECONDS`` waits until every live proxy reports it.
Exit status: 0 done, 1 the cluster could not be reached / a proxy refused / ``--wait`` timed
out, 2 bad arguments (the message names the flag).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import getpass
import hashlib
import json
import os
import re
import socket
import sys
import time
from pathlib import Path
from typing import Any

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
_FLAG_OF_FIELD = {
    "name": "NAME", "module": "MODULE", "topics": "--topics", "apply_to": "--on",
    "on_error": "--on-error", "dead_letter_topic": "--dead-letter-topic",
    "config": "--config-json/--config-file", "function": "--function",
    "principals": "--principals", "timeout_ms": "--timeout-ms",
    "max_memory_mb": "--max-memory-mb",
}


class UsageError(ValueError):
    """A bad argument; the message names the flag."""


def _csv(text: str) -> list[str]:
    return [p.strip() for p in text.split(",") if p.strip()]


def _add_common(p: argparse.ArgumentParser) -> None:
    from sluice.proxy.ops.fleet import DEFAULT_TOPIC

    p.add_argument("--bootstrap", metavar="HOST:PORT",
                   default=os.environ.get("SLUICE_BOOTSTRAP"),
                   help="the Kafka cluster holding the fleet topic (or a Sluice proxy in front "
                        "of it); default $SLUICE_BOOTSTRAP")
    p.add_argument("--config", type=Path, metavar="FILE",
                   default=os.environ.get("SLUICE_CONFIG"),
                   help="the proxies' config file: its upstream_tls: and upstream_sasl: "
                        "secure the connections to the cluster (default $SLUICE_CONFIG; "
                        "without it, plaintext)")
    p.add_argument("--fleet-topic", default=DEFAULT_TOPIC, metavar="TOPIC",
                   help=f"the fleet topic (default {DEFAULT_TOPIC}; must match fleet.topic in "
                        "the proxies' config)")
    p.add_argument("--timeout", type=float, default=30.0, metavar="SECONDS",
                   help="give up talking to the cluster after this long (default 30)")


def _env_keys() -> list[str]:
    return _csv(os.environ.get("SLUICE_TRUSTED_KEYS", ""))


def _add_signing(p: argparse.ArgumentParser) -> None:
    p.add_argument("--signing-key", type=Path, metavar="KEYFILE",
                   default=os.environ.get("SLUICE_SIGNING_KEY"),
                   help="the operator's private key (from `sluice filter keygen`) that signs "
                        "the record; default $SLUICE_SIGNING_KEY")
    p.add_argument("--unsigned", action="store_true",
                   help="write an unsigned record (only fleets with fleet.allow_unsigned "
                        "apply it)")
    p.add_argument("--trusted-key", action="append", default=_env_keys(), metavar="PUB",
                   help="another key the proxies trust (ed25519:... or a .pub file; repeat; "
                        "default $SLUICE_TRUSTED_KEYS, comma-separated): the fleet is read as "
                        "they read it (the signing key is trusted too)")


def add_subcommands(sub: Any) -> None:
    """Add keygen, deploy, remove and list to the ``sluice filter`` subparsers."""
    keygen = sub.add_parser(
        "keygen", help="make an Ed25519 key pair that signs fleet records",
        description="Write a new Ed25519 private key to KEYFILE (mode 0600, PEM) and its public "
                    "key to KEYFILE.pub (one line: ed25519:<base64> <key id>). Operators sign "
                    "`filter deploy` and `filter remove` with the private key; proxies sign the "
                    "data policies set through them with theirs (fleet.signing_key). Proxies "
                    "apply only records signed by a key of their fleet.trusted_keys.")
    keygen.add_argument("keyfile", type=Path, metavar="KEYFILE",
                        help="where to write the private key (KEYFILE.pub gets the public key)")
    keygen.add_argument("--comment", default="", help="text after the public key (e.g. who)")
    keygen.add_argument("--force", action="store_true", help="overwrite an existing KEYFILE")
    keygen.set_defaults(func=cmd_keygen)
    deploy = sub.add_parser(
        "deploy", help="publish a filter to the fleet topic (every following proxy runs it)",
        description="Publish MODULE with its binding under NAME in the fleet topic (created "
                    "compacted if missing). Every proxy configured with `fleet:` adds it "
                    "to its chain (after the config file's filters) within seconds; a newer "
                    "deploy of NAME replaces it. The module is loaded locally first, so a "
                    "module or config that cannot run is refused here.")
    deploy.add_argument("name", metavar="NAME", help="filter name (the record key)")
    deploy.add_argument("module", metavar="MODULE", help="a .wasm file or builtin:NAME")
    deploy.add_argument("--topics", required=True, metavar="T1,T2",
                        help="topic globs the filter applies to (comma-separated)")
    deploy.add_argument("--on", required=True, metavar="DIRECTIONS",
                        help="comma-separated: produce, fetch, admin")
    deploy.add_argument("--on-error", default="reject", choices=("reject", "pass", "dead-letter"),
                        help="what a filter failure does to the records (default reject)")
    deploy.add_argument("--dead-letter-topic", metavar="TOPIC",
                        help="where --on-error dead-letter sends failed records")
    cfg = deploy.add_mutually_exclusive_group()
    cfg.add_argument("--config-json", metavar="JSON", help="the filter's config, a JSON object")
    cfg.add_argument("--config-file", type=Path, metavar="FILE",
                     help="the filter's config, a YAML or JSON file holding a mapping")
    deploy.add_argument("--function", help="entry point for the in-place and Connect ABIs")
    deploy.add_argument("--principals", metavar="P1,P2",
                        help="only for these principal globs (e.g. User:alice,User:svc-*)")
    deploy.add_argument("--timeout-ms", type=int,
                        help="deadline per call, ms of wall time while the guest runs "
                             "(default 100)")
    deploy.add_argument("--max-memory-mb", type=int,
                        help="linear memory cap per instance (default 64)")
    _add_signing(deploy)
    deploy.add_argument("--no-verify", action="store_true",
                        help="do not load the module locally before publishing it")
    deploy.add_argument("--wait", type=float, default=0.0, metavar="SECONDS",
                        help="wait until every live proxy runs this version (exit 1 if one "
                             "refuses it or time runs out)")
    _add_common(deploy)
    deploy.set_defaults(func=cmd_deploy)

    remove = sub.add_parser(
        "remove", help="remove a filter from the fleet topic (a signed removal record)",
        description="Write a signed removal record for NAME: every following proxy that trusts "
                    "the key drops the filter. (A bare tombstone changes nothing on a signed "
                    "fleet; --unsigned writes one for fleets with fleet.allow_unsigned.)")
    remove.add_argument("name", metavar="NAME")
    remove.add_argument("--force", action="store_true",
                        help="write the removal even if NAME is not deployed")
    _add_signing(remove)
    remove.add_argument("--wait", type=float, default=0.0, metavar="SECONDS",
                        help="wait until no live proxy runs NAME from the fleet")
    _add_common(remove)
    remove.set_defaults(func=cmd_remove)

    resign = sub.add_parser(
        "resign", help="sign every record in force again with a new key (key rotation)",
        description="Read the fleet as proxies trusting --trusted-key (the old keys) and "
                    "--signing-key read it, and write every filter and data policy in force "
                    "that the signing key did not sign again, signed by it, unchanged but for "
                    "a higher seq. Run it after adding the new public key to every proxy's "
                    "fleet.trusted_keys and before removing the old one.")
    _add_signing(resign)
    _add_common(resign)
    resign.set_defaults(func=cmd_resign)

    restore = sub.add_parser(
        "restore", help="write a proxy's last verified fleet state back to the fleet topic",
        description="Recovery after the fleet topic was deleted or truncated: write the signed "
                    "records of STATE_FILE (a proxy's <module_cache_dir>/fleet/state-<topic>"
                    ".json) to the fleet topic as they are, with the modules from the same "
                    "directory. Their signatures stay valid; proxies that still hold them "
                    "ignore them, new or restarted proxies apply them.")
    restore.add_argument("state_file", type=Path, metavar="STATE_FILE")
    _add_common(restore)
    restore.set_defaults(func=cmd_restore)

    lst = sub.add_parser(
        "list", help="what the fleet runs: filters by sha256, and which proxy runs which",
        description="Read the fleet topic: the deployed filters (name, sha256, binding) and "
                    "the proxies following it (from their heartbeats), with the sha256 of "
                    "every filter each one runs.")
    lst.add_argument("--json", action="store_true", help="print one JSON object")
    lst.add_argument("--trusted-key", action="append", default=_env_keys(), metavar="PUB",
                     help="a trusted public key (ed25519:... or a .pub file; repeat; default "
                          "$SLUICE_TRUSTED_KEYS, comma-separated): show only what verifies, as "
                          "a proxy trusting these keys applies it; without any, records are "
                          "shown as they claim, signatures unchecked")
    _add_common(lst)
    lst.set_defaults(func=cmd_list)


def _err(message: str) -> None:
    print(f"sluice filter: {message}", file=sys.stderr)


def _bootstrap(args: argparse.Namespace) -> str:
    """The cluster's address; also sets `args.kafka_security`, the librdkafka settings of
    `--config`'s upstream_tls:/upstream_sasl: (PLAINTEXT without --config)."""
    if not args.bootstrap:
        raise UsageError("--bootstrap HOST:PORT is required (or set SLUICE_BOOTSTRAP)")
    args.kafka_security = _security(getattr(args, "config", None))
    return str(args.bootstrap)


def _security(path: Path | None) -> dict[str, str]:
    from sluice.proxy.net.kafka_settings import cluster_settings
    from sluice.proxy.ops.config import ConfigFileError
    from sluice.proxy.ops.config_load import build_config

    if path is None:
        return {"security.protocol": "PLAINTEXT"}
    try:
        # Only the cluster sections matter here; the addresses are placeholders.
        config = build_config(("127.0.0.1", 0), [("127.0.0.1", 9092)], Path(path))
    except ConfigFileError as exc:
        raise UsageError(f"--config: {exc}") from None
    return cluster_settings(config)


def _filter_config(args: argparse.Namespace) -> dict[str, Any]:
    if args.config_json is not None:
        try:
            value = json.loads(args.config_json)
        except ValueError as exc:
            raise UsageError(f"--config-json: not JSON ({exc})") from None
        if not isinstance(value, dict):
            raise UsageError("--config-json: must be a JSON object")
        return value
    if args.config_file is not None:
        import yaml

        try:
            value = yaml.safe_load(Path(args.config_file).read_text(encoding="utf-8"))
        except (OSError, yaml.YAMLError) as exc:
            raise UsageError(f"--config-file: {exc}") from None
        if value is None:
            return {}
        if not isinstance(value, dict):
            raise UsageError("--config-file: must hold a mapping")
        return value
    return {}


def deploy_fields(args: argparse.Namespace) -> tuple[dict[str, Any], Any]:
    """The record's spec fields and a FilterSpec for the local check (UsageError if bad)."""
    from sluice.filters.config import parse_filter_specs
    from sluice.filters.yaml_lines import ConfigError

    if not _NAME.match(args.name):
        raise UsageError(f"NAME {args.name!r}: use letters, digits, '.', '-' and '_' "
                         "(at most 128, starting with a letter or digit)")
    fields: dict[str, Any] = {
        "name": args.name, "topics": _csv(args.topics), "apply_to": _csv(args.on),
        "on_error": args.on_error, "dead_letter_topic": args.dead_letter_topic,
        "config": _filter_config(args), "function": args.function,
        "principals": _csv(args.principals) if args.principals else None,
        "timeout_ms": args.timeout_ms, "max_memory_mb": args.max_memory_mb,
    }
    fields = {k: v for k, v in fields.items() if v is not None}
    raw = dict(fields, module=args.module)
    try:
        [spec] = parse_filter_specs([raw], Path.cwd() / "deploy", None, field_prefix=("d",))
    except ConfigError as exc:
        key = re.split(r"[.\[]", exc.field.removeprefix("d[0]."), maxsplit=1)[0]
        raise UsageError(f"{_FLAG_OF_FIELD.get(key, key)}: {exc.reason}") from None
    return fields, dataclasses.replace(spec, source="command line")


def _who() -> str:
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = "unknown"
    return f"{user}@{socket.gethostname()}"


def cmd_keygen(args: argparse.Namespace) -> int:
    from sluice.proxy.ops.fleet_signing import KeyFileError, generate_key_files

    try:
        key = generate_key_files(args.keyfile, args.comment, force=args.force)
    except KeyFileError as exc:
        _err(f"keygen: {exc}")
        return 2
    print(f"wrote private key {args.keyfile} (mode 0600) and public key {args.keyfile}.pub")
    print(f"key id {key.key_id}: {key.public}")
    return 0


def _signing_key(args: argparse.Namespace) -> Any:
    """The SigningKey of --signing-key (None with --unsigned); UsageError if unusable."""
    from sluice.proxy.ops.fleet_signing import KeyFileError, load_signing_key

    if args.unsigned:
        return None
    if not args.signing_key:
        raise UsageError("--signing-key KEYFILE is required (or set SLUICE_SIGNING_KEY; "
                         "`sluice filter keygen` makes one); proxies apply only signed records")
    try:
        return load_signing_key(Path(args.signing_key))
    except KeyFileError as exc:
        raise UsageError(f"--signing-key: {exc}") from None


def _kafka_failure(exc: BaseException, bootstrap: str) -> str:
    text = str(exc) or type(exc).__name__
    return f"cannot talk to the cluster at {bootstrap}: {text}"


def cmd_deploy(args: argparse.Namespace) -> int:
    from sluice.filters.abi_base import FilterLoadError
    from sluice.filters.runtime import load_filter
    from sluice.proxy.ops.fleet import (
        MAX_MODULE_BYTES,
        filter_record_value,
        signed_filter_value,
    )

    try:
        bootstrap = _bootstrap(args)
        fields, spec = deploy_fields(args)
        key = _signing_key(args)
        trust = _trust(args, key)
    except UsageError as exc:
        _err(f"deploy: {exc}")
        return 2
    path = spec.module_path
    try:
        module = path.read_bytes()
    except OSError as exc:
        _err(f"deploy: MODULE {args.module}: cannot read {path}: {exc.strerror or exc}")
        return 2
    if len(module) > MAX_MODULE_BYTES:
        _err(f"deploy: MODULE {args.module}: {len(module)} bytes; the fleet takes modules up "
             f"to {MAX_MODULE_BYTES} bytes")
        return 2
    if not args.no_verify:
        try:
            load_filter(spec).close()
        except FilterLoadError as exc:
            _err(f"deploy: {exc}")
            return 2
    sha = hashlib.sha256(module).hexdigest()
    try:
        if key is None:
            value = filter_record_value(fields, args.module, module, _who())
        else:
            seq = asyncio.run(_next_seq(bootstrap, args.fleet_topic, args.name, args.timeout,
                                        trust, args.kafka_security))
            value = signed_filter_value(key, fields, args.module, module, _who(), seq)
        partition, offset = asyncio.run(_publish(bootstrap, args.fleet_topic, args.name, value,
                                                 args.timeout, args.kafka_security))
    except Exception as exc:  # the client raises a wide range of errors; report, do not trace
        _err(f"deploy: {_kafka_failure(exc, bootstrap)}")
        return 1
    signed = f", signed by key {key.key_id}" if key is not None else ", UNSIGNED"
    print(f"deployed {args.name}: sha256 {sha} ({len(module)} bytes) "
          f"to {args.fleet_topic} (partition {partition}, offset {offset}{signed})")
    if args.wait > 0:
        return _wait(bootstrap, args, args.name, (partition, offset))
    return 0


def _trust(args: argparse.Namespace, key: Any) -> Any:
    """How the proxies read the fleet: records of the signing key and of --trusted-key
    (None with --unsigned: everything, as a permissive fleet reads it)."""
    from sluice.proxy.ops.fleet import FleetTrust
    from sluice.proxy.ops.fleet_signing import KeyFileError, load_trusted_keys

    if key is None:
        return None
    try:
        keys = load_trusted_keys(args.trusted_key, Path.cwd())
    except KeyFileError as exc:
        raise UsageError(f"--trusted-key: {exc}") from None
    keys[key.key_id] = key.trusted()
    return FleetTrust(keys)


async def _next_seq(bootstrap: str, topic: str, name: str, timeout: float, trust: Any,
                    security: dict[str, str]) -> int:
    """A seq above the one of NAME's record in force (proxies ignore anything not above it)."""
    from sluice.proxy.ops.fleet import read_view
    from sluice.proxy.ops.fleet_signing import next_seq

    view = await read_view(bootstrap, topic, timeout=timeout, trust=trust, security=security)
    return next_seq(view.seqs.get(name))


async def _publish(bootstrap: str, topic: str, name: str, value: bytes | None,
                   timeout: float, security: dict[str, str]) -> tuple[int, int]:
    from sluice.proxy.ops.fleet import ensure_topic, produce

    await asyncio.wait_for(ensure_topic(bootstrap, topic, timeout=timeout, security=security),
                           timeout + 5)
    return await produce(bootstrap, topic, name.encode("utf-8"), value, timeout=timeout,
                         security=security)


def cmd_remove(args: argparse.Namespace) -> int:
    from sluice.proxy.ops.fleet import read_view, removal_payload
    from sluice.proxy.ops.fleet_signing import next_seq, sign

    try:
        bootstrap = _bootstrap(args)
        key = _signing_key(args)
        trust = _trust(args, key)
    except UsageError as exc:
        _err(f"remove: {exc}")
        return 2
    try:
        view = asyncio.run(read_view(bootstrap, args.fleet_topic, timeout=args.timeout,
                                     trust=trust, security=args.kafka_security))
        if args.name not in view.filters and not args.force:
            _err(f"remove: {args.name!r} is not deployed in {args.fleet_topic} "
                 "(--force writes the removal anyway)")
            return 1
        value = None if key is None else sign(
            key, args.name.encode("utf-8"),
            dict(removal_payload(args.name, _who()), seq=next_seq(view.seqs.get(args.name))))
        partition, offset = asyncio.run(_publish(bootstrap, args.fleet_topic, args.name, value,
                                                 args.timeout, args.kafka_security))
    except Exception as exc:  # the client raises a wide range of errors; report, do not trace
        _err(f"remove: {_kafka_failure(exc, bootstrap)}")
        return 1
    what = "tombstone, UNSIGNED" if key is None else f"removal signed by key {key.key_id}"
    print(f"removed {args.name} from {args.fleet_topic} ({what} at partition {partition}, "
          f"offset {offset})")
    for topic, record in sorted(view.policies.items()):
        if record.policy is not None and any(f.name == args.name for f in record.policy.filters):
            _err(f"remove: warning: the data policy of topic {topic!r} names {args.name!r}: "
                 "that topic fails closed until it is deployed again or the policy changes")
    if args.wait > 0:
        return _wait(bootstrap, args, args.name, None)
    return 0


def _position(entry: dict[str, Any]) -> tuple[Any, Any]:
    return (entry.get("fleet_partition"), entry.get("fleet_offset"))


def _instance_state(inst: Any, name: str, version: tuple[int, int] | None) -> str:
    """'ok', 'refused: ...' or 'pending' for one live proxy and the wanted deploy (the
    record's partition and offset; None: the filter was removed)."""
    entry = next((f for f in inst.filters() if f.get("name") == name), None)
    if version is None:
        return "ok" if entry is None or entry.get("source") != "fleet" else "pending"
    if entry is not None and entry.get("source") == "fleet" and _position(entry) == version:
        return "ok"
    for r in inst.refused():
        if r.get("name") == name and _position(r) == version:
            return f"refused: {r.get('reason')}"
    return "pending"


def _wait(bootstrap: str, args: argparse.Namespace, name: str,
          version: tuple[int, int] | None) -> int:
    from sluice.proxy.ops.fleet import FleetView, follow_view

    started = time.monotonic()

    def settled(view: FleetView) -> bool:
        live = [i for i in view.instances.values() if i.live()]
        return all(_instance_state(i, name, version) != "pending" for i in live)

    try:
        view, done = asyncio.run(follow_view(bootstrap, args.fleet_topic, settled,
                                             timeout=args.wait,
                                             security=args.kafka_security))
    except Exception as exc:  # the client raises a wide range of errors; report, do not trace
        _err(_kafka_failure(exc, bootstrap))
        return 1
    live = sorted((i for i in view.instances.values() if i.live()), key=lambda i: i.instance)
    if not live:
        print("no live proxy follows this fleet topic")
    failed = not done
    for inst in live:
        state = _instance_state(inst, name, version)
        failed |= state != "ok"
        print(f"  {inst.instance} ({inst.data.get('host')}, pid {inst.data.get('pid')}): {state}")
    elapsed = time.monotonic() - started
    print(f"{'settled' if done else 'timed out'} after {elapsed:.1f} s")
    return 1 if failed else 0


def _listing(view: Any, topic: str, bootstrap: str) -> dict[str, Any]:
    now = int(time.time() * 1000)
    filters = []
    for name in sorted(view.filters):
        r = view.filters[name]
        filters.append({"name": name, "sha256": r.sha256, "size": r.size, "module": r.module,
                        **{k: v for k, v in r.fields.items() if k != "name"},
                        "deployed_at": r.deployed_at, "deployed_by": r.deployed_by,
                        "signer": r.signer, "verified": view.trust is not None,
                        "partition": r.partition, "offset": r.offset})
    instances = []
    for inst in sorted(view.instances.values(), key=lambda i: i.instance):
        data = dict(inst.data)
        data["instance"] = inst.instance
        data["live"] = inst.live(now)
        data["seconds_since_heartbeat"] = round((now - inst.time_ms) / 1000, 1)
        instances.append(data)
    policies = [{"topic": t, "value": p.value, "set_by": p.set_by, "set_at": p.set_at,
                 "signer": p.signer,
                 "error": p.error, "filters": [f.name for f in p.policy.filters] if p.policy
                 else []} for t, p in sorted(view.policies.items())]
    refused: dict[str, int] = {}
    for _key, reason, _message in view.refused:
        refused[reason] = refused.get(reason, 0) + 1
    return {"topic": topic, "bootstrap": bootstrap, "filters": filters,
            "instances": instances, "invalid": dict(view.invalid), "policies": policies,
            "verified": view.trust is not None, "refused": refused}


def cmd_resign(args: argparse.Namespace) -> int:
    from sluice.proxy.ops.fleet import read_view
    from sluice.proxy.ops.fleet_signing import next_seq, sign

    try:
        bootstrap = _bootstrap(args)
        key = _signing_key(args)
        if key is None:
            raise UsageError("--unsigned: resign writes signed records only")
        trust = _trust(args, key)
    except UsageError as exc:
        _err(f"resign: {exc}")
        return 2
    try:
        view = asyncio.run(read_view(bootstrap, args.fleet_topic, timeout=args.timeout,
                                     trust=trust, security=args.kafka_security))
        writes: list[tuple[str, bytes]] = []
        for name, entry in sorted(view.signed.items()):
            envelope = entry["envelope"]
            if envelope.get("key_id") == key.key_id:
                continue
            payload = dict(json.loads(envelope["signed"]))
            payload.pop("nonce", None)
            payload["seq"] = next_seq(view.seqs.get(name))
            record = view.filters.get(name)
            module = record.module_b64 if record is not None else None
            writes.append((name, sign(key, name.encode("utf-8"), payload, module)))
        for name, value in writes:
            asyncio.run(_publish(bootstrap, args.fleet_topic, name, value, args.timeout,
                                 args.kafka_security))
            print(f"re-signed {name} with key {key.key_id}")
    except Exception as exc:  # the client raises a wide range of errors; report, do not trace
        _err(f"resign: {_kafka_failure(exc, bootstrap)}")
        return 1
    print(f"{len(writes)} record(s) re-signed; {len(view.refused)} record(s) of the topic did "
          "not verify with the given keys and were left alone")
    return 0


def cmd_restore(args: argparse.Namespace) -> int:
    import base64

    from sluice.proxy.ops.fleet import load_state

    try:
        bootstrap = _bootstrap(args)
        records, _read_to = load_state(args.state_file)
    except (UsageError, ValueError) as exc:
        _err(f"restore: {exc}")
        return 2
    if not records:
        _err(f"restore: {args.state_file}: no records")
        return 2
    modules = args.state_file.parent
    writes: list[tuple[str, bytes]] = []
    for name, entry in sorted(records.items()):
        envelope = dict(entry["envelope"])
        payload = json.loads(envelope["signed"])
        if payload.get("type") == "filter":
            path = modules / f"{payload.get('module_sha256')}.wasm"
            try:
                envelope["module_b64"] = base64.b64encode(path.read_bytes()).decode("ascii")
            except OSError as exc:
                _err(f"restore: {name}: module {path}: {exc.strerror or exc}")
                return 1
        writes.append((name, json.dumps(envelope, separators=(",", ":")).encode("utf-8")))
    try:
        for name, value in writes:
            asyncio.run(_publish(bootstrap, args.fleet_topic, name, value, args.timeout,
                                 args.kafka_security))
            print(f"restored {name}")
    except Exception as exc:  # the client raises a wide range of errors; report, do not trace
        _err(f"restore: {_kafka_failure(exc, bootstrap)}")
        return 1
    return 0


def cmd_list(args: argparse.Namespace) -> int:
    from sluice.proxy.ops.fleet import FleetTrust, read_view
    from sluice.proxy.ops.fleet_signing import KeyFileError, load_trusted_keys

    try:
        bootstrap = _bootstrap(args)
        trust = None
        if args.trusted_key:
            try:
                trust = FleetTrust(load_trusted_keys(args.trusted_key, Path.cwd()))
            except KeyFileError as exc:
                raise UsageError(f"--trusted-key: {exc}") from None
    except UsageError as exc:
        _err(f"list: {exc}")
        return 2
    try:
        view = asyncio.run(read_view(bootstrap, args.fleet_topic, timeout=args.timeout,
                                     trust=trust, security=args.kafka_security))
    except Exception as exc:  # the client raises a wide range of errors; report, do not trace
        _err(f"list: {_kafka_failure(exc, bootstrap)}")
        return 1
    listing = _listing(view, args.fleet_topic, bootstrap)
    if args.json:
        print(json.dumps(listing, default=str))
        return 0
    _print_listing(listing)
    return 0


def _print_listing(listing: dict[str, Any]) -> None:
    filters, instances = listing["filters"], listing["instances"]
    live = sum(1 for i in instances if i["live"])
    print(f"fleet topic {listing['topic']} at {listing['bootstrap']}: {len(filters)} "
          f"filter(s), {live} live proxy instance(s)")
    print("\nFILTERS")
    if not filters:
        print("  (none deployed)")
    deployed = {f["name"]: f["sha256"] for f in filters}
    positions = {f["name"]: (f["partition"], f["offset"]) for f in filters}
    for f in filters:
        print(f"  {f['name']}  sha256 {f['sha256']}  {f['size']} bytes  {f['module']}")
        topics, on = ", ".join(f.get("topics", [])), ", ".join(f.get("apply_to", []))
        print(f"      topics {topics}  on {on}"
              f"  on_error {f.get('on_error', 'reject')}"
              f"  deployed {f['deployed_at']} by {f['deployed_by']}")
        signer = f["signer"] or "nobody (UNSIGNED)"
        print(f"      signed by key {signer}"
              f"{'' if f['verified'] else ' (claimed, not verified: pass --trusted-key)'}")
    for name, reason in sorted(listing["invalid"].items()):
        print(f"  {name}  INVALID newest record: {reason}")
    for reason, n in sorted(listing["refused"].items()):
        print(f"  ({n} record(s) refused: {reason})")
    if listing["policies"]:
        print("\nDATA POLICIES (x-data-policy)")
    for p in listing["policies"]:
        missing = [n for n in p["filters"] if n not in deployed]
        state = (f"  UNREADABLE: {p['error']}" if p["error"] else
                 f"  BLOCKED: {', '.join(missing)} not deployed" if missing else "")
        print(f"  {p['topic']}  filters {', '.join(p['filters']) or '-'}  set {p['set_at']} "
              f"by {p['set_by']}, signed by key {p['signer'] or 'nobody (UNSIGNED)'}{state}")
    print("\nINSTANCES")
    if not instances:
        print("  (no proxy has announced itself)")
    for inst in instances:
        status = "live" if inst["live"] else "stale"
        print(f"  {inst['instance']}  {inst.get('host')} pid {inst.get('pid')}  listen "
              f"{inst.get('listen')}  {status}, last heartbeat "
              f"{inst['seconds_since_heartbeat']:g} s ago")
        for f in inst.get("filters") or []:
            note = ""
            if f.get("source") == "fleet":
                want = positions.get(f.get("name"))
                note = ("current" if want == _position(f)
                        else "removed from fleet" if want is None else "OUTDATED")
            config = str(f.get("config_sha256") or "")[:12]
            print(f"      {f.get('name')}  sha256 {f.get('sha256')}  config {config}  "
                  f"{f.get('source')}{'  ' + note if note else ''}")
        running = {f.get("name") for f in inst.get("filters") or [] if f.get("source") == "fleet"}
        for name in sorted(set(deployed) - running):
            print(f"      {name}  NOT RUNNING (deployed sha256 {deployed[name]})")
        for r in inst.get("refused") or []:
            print(f"      {r.get('name')}  sha256 {r.get('sha256')}  REFUSED: {r.get('reason')}")
