"""What the proxy benchmarks point their clients at, started once for a whole run: the broker
(`--broker tansu` or `kafka`) and, per variant, the process in the middle (HAProxy, Kroxylicious,
`sluice serve` with the variant's filters). Shared by bench.bench_proxy (interleaved slices) and
bench.chunked (long-lived producers, flushed chunks), so both harnesses measure the same rig.

The variants (ALL, and OPTIONAL only when named) are described in bench.bench_proxy's docstring
and docs/PERFORMANCE.md.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import re
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from bench import baseline, kroxylicious, targets
from sluice.kafka_broker import KafkaCluster
from sluice.local_broker import TansuBroker, free_port, free_port_block

MASK_PRODUCE = """
filters:
  - name: mask-pii
    module: builtin:pii-mask
    topics: ["bench-*"]
    apply_to: [produce]
"""
MASK_FETCH = MASK_PRODUCE.replace("[produce]", "[fetch]")
ENCRYPT = """
filters:
  - name: encrypt
    module: builtin:encrypt
    topics: ["bench-*"]
    apply_to: [produce, fetch]
    config: {{key: bench, decrypt_for: ["User:ANONYMOUS"]}}
kms:
  type: local
  path: {path}
"""

ALL = [
    "direct",
    "aa",
    "relay",
    "kroxylicious",
    "sluice",
    "mask-produce",
    "mask-fetch",
    "encrypt",
    "kroxylicious-encrypt",
]
KROXYLICIOUS = {"kroxylicious": False, "kroxylicious-encrypt": True}  # name: encrypt
BROKERS = ("tansu", "kafka")
# Apache Kafka's own launch defaults (kafka-server-start.sh and kafka-run-class.sh): 1 GiB heap
# and G1 with its short pause target, not the tests' small C1-only settings
# (sluice/kafka_broker.py), so that the broker runs as users run it.
KAFKA_HEAP = "1g"
KAFKA_JVM_OPTS = (
    "-Xms1g",
    "-XX:+UseG1GC",
    "-XX:MaxGCPauseMillis=20",
    "-XX:InitiatingHeapOccupancyPercent=35",
    "-XX:+ExplicitGCInvokesConcurrent",
    "-Xshare:auto",
    "-Djava.awt.headless=true",
)
# Record encryption makes a producer's 1 MB batch larger than Kafka's default limit of one
# batch (message.max.bytes, 1 MiB): both encrypting proxies send what they are given as one
# batch. Tansu has no such limit; this gives Kafka room for the same batches.
KAFKA_CONFIG = {"message.max.bytes": str(8 << 20)}
#: builtin:encrypt in fields mode: the workload's "card" member only (not in ALL: run it with
#: --variants ...,encrypt-fields).
ENCRYPT_FIELDS = ENCRYPT.replace('decrypt_for: ["User:ANONYMOUS"]',
                                 'decrypt_for: ["User:ANONYMOUS"], fields: [card]')
#: Named in --variants only. sluice-own: `sluice serve` (no filters) in front of a broker of
#: its own, as relay is, so that the two hops compare without the broker behind them differing
#: (every other variant shares direct's broker). aa-own: a direct client of a broker of its
#: own, no middle: what a broker of its own alone does to a ratio (relay and sluice-own have
#: one), read against `aa` in the same run.
OPTIONAL = ["encrypt-fields", "sluice-own", "aa-own"]
#: Suffix of a Sluice variant run from the --baseline source tree.
BASE = "@base"
SLUICE_CONFIGS: dict[str, str | None] = {
    "sluice": None,
    "mask-produce": MASK_PRODUCE,
    "mask-fetch": MASK_FETCH,
    "encrypt": ENCRYPT,  # formatted with a fresh keyring path in rig()
    "encrypt-fields": ENCRYPT_FIELDS,  # likewise
}



@dataclass(frozen=True)
class Point:
    """One variant in the rig: where clients connect, the process in the middle, and the
    broker's own address (for topic admin and the side-by-side direct probe)."""

    target: targets.Target
    broker: str
    #: A Sluice variant's `/metrics` ports on 127.0.0.1, one per worker (bench.filter_jobs);
    #: empty for the other variants, or when `--proxy-yaml` brings its own `metrics:`.
    metrics: tuple[int, ...] = ()


@contextlib.contextmanager
def broker(kind: str, advertised_port: int | None = None) -> Iterator[str]:
    """A broker of `kind` ("tansu" or "kafka") on 127.0.0.1; yields its bootstrap address.
    `advertised_port`: the port it tells clients to use (a relay in front of it)."""
    if kind == "tansu":
        with TansuBroker(advertised_port=advertised_port) as tansu:
            yield tansu.bootstrap
    elif kind == "kafka":
        with KafkaCluster(
            nodes=1,
            heap=KAFKA_HEAP,
            jvm_opts=KAFKA_JVM_OPTS,
            advertised_ports={} if advertised_port is None else {"PLAINTEXT": advertised_port},
            extra_config=KAFKA_CONFIG,
        ) as kafka:
            yield kafka.bootstrap
    else:
        raise ValueError(f"unknown broker {kind!r} (one of {', '.join(BROKERS)})")


@contextlib.contextmanager
def rig(
    names: Sequence[str],
    proxy_args: Sequence[str],
    proxy_yaml: str,
    broker_kind: str = "tansu",
    source: baseline.Source | None = None,
) -> Iterator[dict[str, Point]]:
    """Start everything the variants need, once, for the whole run."""
    with contextlib.ExitStack() as stack:
        main = stack.enter_context(broker(broker_kind))
        points: dict[str, Point] = {}
        for name in names:
            if name in ("direct", "aa"):
                points[name] = Point(targets.Target(main, None), main)
            elif name == "relay":
                port = free_port()
                relayed = stack.enter_context(broker(broker_kind, advertised_port=port))
                target = stack.enter_context(targets.haproxy_relay(relayed, port))
                points[name] = Point(target, relayed)
            elif name == "aa-own":
                own = stack.enter_context(broker(broker_kind))
                points[name] = Point(targets.Target(own, None), own)
            elif name == "sluice-own":
                own = stack.enter_context(broker(broker_kind))
                points[name] = sluice_point(stack, "sluice", own, proxy_args, proxy_yaml, source)
            elif name in KROXYLICIOUS:
                target = stack.enter_context(
                    kroxylicious.kroxylicious(main, encrypt=KROXYLICIOUS[name])
                )
                points[name] = Point(target, main)
            else:
                points[name] = sluice_point(stack, name, main, proxy_args, proxy_yaml, source)
        yield points


def sluice_point(
    stack: contextlib.ExitStack,
    name: str,
    main: str,
    proxy_args: Sequence[str],
    proxy_yaml: str,
    source: baseline.Source | None = None,
) -> Point:
    """Start the Sluice variant `name` (a key of SLUICE_CONFIGS, or one with the BASE suffix,
    run from `source`) in front of the broker `main`, stopped when `stack` closes. Other
    harnesses (bench.scaling) start several of one variant, each with its own arguments."""
    own = name.removesuffix(BASE)
    config = SLUICE_CONFIGS[own]
    if own in ("encrypt", "encrypt-fields"):
        keys = stack.enter_context(tempfile.TemporaryDirectory(prefix="sluice-bench-keys-"))
        config = SLUICE_CONFIGS[own].format(  # type: ignore[union-attr]
            path=json.dumps(f"{keys}/keys.json"))
    metrics: tuple[int, ...] = ()
    metrics_yaml = None
    if not _OWN_METRICS.search(proxy_yaml):
        # Scraped only between slices (bench.filter_jobs): nothing on the data path.
        workers = _workers(proxy_args)
        port = free_port_block(workers)
        metrics = tuple(range(port, port + workers))
        metrics_yaml = f"metrics:\n  listen: 127.0.0.1:{port}\n"
    text = "\n".join(t for t in (config, proxy_yaml, metrics_yaml) if t) or None
    target = stack.enter_context(targets.sluice(
        main, text, list(proxy_args), source if name.endswith(BASE) else None))
    return Point(target, main, metrics)


_OWN_METRICS = re.compile(r"^metrics\s*:", re.MULTILINE)


def _workers(proxy_args: Sequence[str]) -> int:
    """The N of `--workers N` / `--workers=N` among the proxy's arguments (1 without it);
    worker k serves its metrics on the configured port + k."""
    n = 1
    for i, arg in enumerate(proxy_args):
        if arg == "--workers" and i + 1 < len(proxy_args):
            n = int(proxy_args[i + 1])
        elif arg.startswith("--workers="):
            n = int(arg.split("=", 1)[1])
    return max(n, 1)


def add_rig_arguments(ap: argparse.ArgumentParser) -> None:
    """The options that choose the rig: `--variants`, `--broker`, and what every `sluice
    serve` gets (`--proxy-arg`, `--proxy-yaml`)."""
    ap.add_argument("--variants", default=",".join(ALL), help="comma-separated variants")
    ap.add_argument(
        "--broker",
        choices=BROKERS,
        default="tansu",
        help="the broker behind every variant: the bundled Tansu or Apache Kafka (one node)",
    )
    ap.add_argument(
        "--proxy-arg",
        action="append",
        default=[],
        metavar="ARG",
        help="an argument passed to every `sluice serve` (repeatable; write --proxy-arg=--x)",
    )
    ap.add_argument(
        "--proxy-yaml", default="", help="YAML appended to every Sluice variant's config file"
    )


def with_baseline(names: list[str]) -> list[str]:
    """`names` with each Sluice variant followed by its run from the --baseline tree."""
    return [m for n in names for m in ((n, n + BASE) if n in SLUICE_CONFIGS else (n,))]


def variant_names(ap: argparse.ArgumentParser, text: str) -> list[str]:
    """The comma-separated variants of `text`, `direct` first (added if missing); a usage
    error (exit 2) for an unknown name or a variant whose tool is not installed."""
    names = [n.strip() for n in text.split(",") if n.strip()]
    unknown = set(names) - set(ALL) - set(OPTIONAL)
    if unknown:
        ap.error(f"unknown variants: {', '.join(sorted(unknown))} "
                 f"(known: {', '.join(ALL + OPTIONAL)})")
    if "direct" not in names:
        names.insert(0, "direct")
    if "relay" in names and not targets.haproxy_available():
        ap.error("the relay variant needs haproxy (bash scripts/dev.sh install adds it)")
    if any(n in KROXYLICIOUS for n in names) and not kroxylicious.available():
        ap.error(
            f"the kroxylicious variants need Kroxylicious {kroxylicious.VERSION}'s jars "
            "(bash scripts/dev.sh install adds them)"
        )
    return names
