"""Kroxylicious, a peer Kafka proxy (Java, Netty), as a benchmark target beside HAProxy and Sluice.

`bash scripts/dev.sh install` puts Kroxylicious 0.12.0's jars (its runtime, the
RecordEncryption filter and the in-memory test KMS; `scripts/kroxylicious/pom.xml`, checked
against `scripts/kroxylicious/jars.sha256`) in `<venv>/share/kroxylicious/libs`. Its launcher
module is not on Maven Central, so `bench/java/KroxyliciousLauncher.java` starts the
runtime (run as a single source file by `java`, compiled in memory at start).

The config this module writes: one virtual cluster in front of the broker, plain TCP on
127.0.0.1, nodes told apart by port (`portIdentifiesNode`: bootstrap on P, node k of the
broker's node ids on P+1+k; the node ids are read from the broker's metadata at start). With
`encrypt`, the RecordEncryption filter on every topic: whole record values sealed with
AES-256-GCM under a data key wrapped by one KEK (alias `bench`, a fresh random 256-bit key
held by the in-memory KMS, `UnitTestingKmsService`), selected for every topic by a constant
template, so every benchmark topic is encrypted, as Sluice's `encrypt` variant encrypts every
`bench-*` topic under its one key.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import secrets
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path

from confluent_kafka.admin import AdminClient

from bench.targets import Target
from sluice.kafka_broker import java_binary
from sluice.local_broker import free_port_block, wait_for_port

VERSION = "0.12.0"
LAUNCHER = Path(__file__).resolve().parent / "java" / "KroxyliciousLauncher.java"
READY_LINE = "kroxylicious-launcher: started"
KEK_ALIAS = "bench"

# Kroxylicious's defaults but for the heap, fixed so that its size does not depend on the
# machine's memory: tiered JIT (C2), G1 (the JVM's choice on 2 cores). Netty's direct
# buffers may take as much again.
JVM_OPTS = ("-Xms512m", "-Xmx512m", "-XX:+ExitOnOutOfMemoryError", "-Djava.awt.headless=true")

_LOG4J2 = """\
status = warn
appender.err.type = Console
appender.err.name = ERR
appender.err.target = SYSTEM_ERR
appender.err.layout.type = PatternLayout
appender.err.layout.pattern = %d %p %c{1} %m%n
rootLogger.level = warn
rootLogger.appenderRef.err.ref = ERR
"""


class KroxyliciousNotInstalled(RuntimeError):
    pass


def libs() -> Path:
    """The folder of Kroxylicious's jars (`SLUICE_KROXYLICIOUS_LIBS`, else
    `<venv>/share/kroxylicious/libs`)."""
    override = os.environ.get("SLUICE_KROXYLICIOUS_LIBS")
    folder = Path(override) if override else Path(sys.prefix) / "share" / "kroxylicious" / "libs"
    marker = folder / f"kroxylicious-runtime-{VERSION}.jar"
    if not marker.is_file():
        raise KroxyliciousNotInstalled(
            f"Kroxylicious {VERSION}'s jars are not installed ({marker} is missing): "
            "run `bash scripts/dev.sh install`"
        )
    return folder


def available() -> bool:
    try:
        libs()
    except KroxyliciousNotInstalled:
        return False
    return True


def broker_node_ids(bootstrap: str) -> list[int]:
    """The node ids the broker's metadata lists (Kroxylicious maps each to a port)."""
    admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 3})
    return sorted(admin.list_topics(timeout=20).brokers)


def config(
    broker_bootstrap: str, port: int, node_ids: Sequence[int], encrypt: bool
) -> dict[str, object]:
    """Kroxylicious's configuration (written as JSON, which its YAML parser reads): bootstrap
    on 127.0.0.1:`port`, node `node_ids[k]` on `port` + 1 + k."""
    cluster: dict[str, object] = {
        "name": "bench",
        "targetCluster": {"bootstrapServers": broker_bootstrap},
        "gateways": [
            {
                "name": "plain",
                "portIdentifiesNode": {
                    "bootstrapAddress": f"127.0.0.1:{port}",
                    "nodeStartPort": port + 1,
                    # One range per node id: ports follow the order of the ranges, so the
                    # node ids need not be consecutive.
                    "nodeIdRanges": [
                        {"name": f"node-{n}", "start": n, "end": n} for n in node_ids
                    ],
                },
            }
        ],
    }
    out: dict[str, object] = {"virtualClusters": [cluster]}
    if encrypt:
        kek = {
            "uuid": str(uuid.uuid4()),
            "key": base64.b64encode(secrets.token_bytes(32)).decode(),
            "algorithm": "AES",
            "alias": KEK_ALIAS,
        }
        out["filterDefinitions"] = [
            {
                "name": "encrypt",
                "type": "RecordEncryption",
                "config": {
                    "kms": "UnitTestingKmsService",
                    "kmsConfig": {"numIvBytes": 12, "numAuthBits": 128, "existingKeks": [kek]},
                    "selector": "TemplateKekSelector",
                    # No $(topicName): one KEK for every topic, like the Sluice variant.
                    "selectorConfig": {"template": KEK_ALIAS},
                },
            }
        ]
        out["defaultFilters"] = ["encrypt"]
    return out


@contextlib.contextmanager
def kroxylicious(
    broker_bootstrap: str, encrypt: bool = False, start_timeout: float = 90.0
) -> Iterator[Target]:
    """Kroxylicious in front of the broker at `broker_bootstrap` (pass-through, or with its
    RecordEncryption filter on every topic); yields its bootstrap address and JVM pid."""
    jars = libs()
    node_ids = broker_node_ids(broker_bootstrap)
    if not node_ids:
        raise RuntimeError(f"the broker at {broker_bootstrap} lists no nodes in its metadata")
    port = free_port_block(len(node_ids) + 1)
    with tempfile.TemporaryDirectory(prefix="sluice-bench-kroxylicious-") as folder:
        cfg = Path(folder) / "config.yaml"
        cfg.write_text(json.dumps(config(broker_bootstrap, port, node_ids, encrypt), indent=1))
        cfg.chmod(0o600)  # it holds the KEK
        (Path(folder) / "log4j2.properties").write_text(_LOG4J2)
        log_path = Path(folder) / "kroxylicious.log"
        cmd = [
            java_binary(),
            *JVM_OPTS,
            f"-Dlog4j2.configurationFile={Path(folder) / 'log4j2.properties'}",
            "-cp",
            str(jars / "*"),
            str(LAUNCHER),
            str(cfg),
        ]
        with log_path.open("wb") as log:
            proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
        try:
            deadline = time.monotonic() + start_timeout
            while READY_LINE not in log_path.read_text(errors="replace"):
                if proc.poll() is not None or time.monotonic() > deadline:
                    tail = log_path.read_text(errors="replace")[-4000:]
                    raise RuntimeError(
                        f"Kroxylicious did not start (exit {proc.poll()}):\n{tail}"
                    )
                time.sleep(0.1)
            wait_for_port(port, timeout=10)
            yield Target(f"127.0.0.1:{port}", proc.pid)
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=5)
