"""Apache Kafka from its Maven Central jars, run on loopback: one node or a three-node cluster.

The real broker beside the bundled Tansu (`sluice/local_broker.py`): the tests run Sluice in
front of it, and `sluice demo --broker kafka` can use it. `bash scripts/dev.sh install` puts
the jars, checked against `scripts/kafka/jars.sha256`, in `<venv>/share/kafka/libs`; this module
formats each node's storage with `kafka.tools.StorageTool` and starts `kafka.Kafka` in KRaft
combined mode (every node is broker and controller, one static quorum).

Every node listens on 127.0.0.1 with the four client listeners a real deployment has:

- `PLAINTEXT`: no authentication; its principal, User:ANONYMOUS, is a super user (unless
  `anonymous_super_user=False`), so that tests that do not care about security keep working;
- `SASL_PLAINTEXT` and `SASL_SSL`: PLAIN and SCRAM-SHA-512 (SCRAM users made at format time);
- `SSL`: client certificates required, the principal is the certificate's CN;

plus `INTERNAL` (between brokers) and `CONTROLLER` (the quorum), both SASL PLAIN as the super
user `broker`. ACLs: `StandardAuthorizer`, super users `broker` and `admin`, and no access for
anyone else until an ACL grants it (`allow.everyone.if.no.acl.found=false`).
"""

from __future__ import annotations

import atexit
import base64
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from sluice.kafka_config import (
    ALL_LISTENERS,
    CLIENT_LISTENERS,
    HOST,
    SASL_MECHANISMS,
    server_properties,
)
from sluice.kafka_security import (
    ADMIN_USER,
    ORDINARY_USERS,
    PROXY_USER,
    KafkaCredentials,
    make_credentials,
)
from sluice.local_broker import free_port, wait_for_port

KAFKA_VERSION = "4.4.0"
READY_LINE = "Kafka Server started"

# A small heap and the client compiler only: the machine's 2 cores are shared by everything,
# and a test broker carries little traffic. Measured here (one node, format + start, 2 runs
# each, a loaded machine): C1 only 6.2-7.8 s and 3.4-3.6 s of CPU; tiered C2 9.9-10.4 s and
# 5.9-6.3 s of CPU. G1 instead of SerialGC and -Xshare:off made no difference that showed;
# SerialGC is kept for its fewer threads. The recorded class archive (kafka_class_archive.py)
# is worth more: one node 3.6-5.9 s and 2.1-2.3 s of CPU with it, 6.3-10.7 s and 3.2-3.4 s
# without; three nodes 14.2-15.0 s (8.2-8.6 s of CPU) against 18.8-20.7 s (12.2-12.6 s).
DEFAULT_JVM_OPTS = (
    "-Xms64m",
    "-XX:TieredStopAtLevel=1",
    "-XX:+UseSerialGC",
    "-Xshare:auto",
    "-Djava.awt.headless=true",
)

_LOG4J2 = """\
# Warnings and errors, plus the lines the launcher waits for (and the version).
status = warn
appender.out.type = Console
appender.out.name = OUT
appender.out.layout.type = PatternLayout
appender.out.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = {level}
rootLogger.appenderRef.out.ref = OUT
logger.server.name = kafka.server.KafkaRaftServer
logger.server.level = INFO
logger.version.name = org.apache.kafka.common.utils.internals.AppInfoParser
logger.version.level = INFO
"""


# The JVM says nothing when the class archive does not fit (it then loads classes from the
# jars): the fallback is harmless, the warning would be noise in every broker log.
_CDS_QUIET = ("-Xlog:cds=off", "-Xlog:cds+dynamic=off")


class KafkaNotInstalled(RuntimeError):
    """Java or the Kafka jars are missing: the message says how to install them."""


class KafkaStartError(RuntimeError):
    """A node did not start (or format): the message names its log and ends with its tail."""


def kafka_libs() -> Path:
    """The folder of Kafka's jars (`SLUICE_KAFKA_LIBS`, else `<venv>/share/kafka/libs`)."""
    override = os.environ.get("SLUICE_KAFKA_LIBS")
    libs = Path(override) if override else Path(sys.prefix) / "share" / "kafka" / "libs"
    marker = libs / f"kafka_2.13-{KAFKA_VERSION}.jar"
    if not marker.is_file():
        raise KafkaNotInstalled(
            f"Apache Kafka {KAFKA_VERSION}'s jars are not installed ({marker} is missing): "
            "run `bash scripts/dev.sh install` (it needs Java 17+ and Maven)"
        )
    return libs


def class_archive_path() -> Path:
    """The class-data-sharing archive of the installed jars (`sluice/kafka_class_archive.py`
    writes it; `scripts/dev.sh` records it once per install of the jars)."""
    return kafka_libs().parent / "kafka-classes.jsa"


def java_binary() -> str:
    """The `java` to run Kafka with: `$JAVA_HOME/bin/java`, else the one on PATH."""
    home = os.environ.get("JAVA_HOME")
    if home and (Path(home) / "bin" / "java").is_file():
        return str(Path(home) / "bin" / "java")
    found = shutil.which("java")
    if found is None:
        raise KafkaNotInstalled(
            "Apache Kafka needs Java 17 or newer and there is no `java` on PATH "
            "(Debian: apt-get install openjdk-17-jre-headless)"
        )
    return found


def new_cluster_id() -> str:
    """A cluster id as Kafka makes them: a random UUID in URL-safe base64 without padding,
    never starting with "-" (StorageTool's argument parser would take it for an option: 1
    start in 64 failed so before this check)."""
    while True:
        cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode()
        if not cluster_id.startswith("-"):
            return cluster_id


def _tail(path: Path | None, lines: int = 40) -> str:
    if path is None or not path.is_file():
        return "(no output)"
    text = path.read_text(errors="replace").splitlines()
    return "\n".join(text[-lines:])


def _stop_process(proc: subprocess.Popen[bytes], timeout: float) -> None:
    """SIGTERM, then SIGKILL if it has not exited after `timeout` seconds; always reaped."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


@dataclass
class KafkaNode:
    """One combined broker+controller process: its ports by listener, files and process."""

    node_id: int
    ports: dict[str, int]
    folder: Path
    process: subprocess.Popen[bytes] | None = None
    # Where this launch's output starts in the log (a restart appends to the same file).
    log_offset: int = 0
    starts: int = 0

    @property
    def config_path(self) -> Path:
        return self.folder / "server.properties"

    @property
    def data_dir(self) -> Path:
        return self.folder / "data"

    @property
    def log_path(self) -> Path:
        return self.folder / "kafka.log"

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process is not None else None

    def address(self, listener: str = "PLAINTEXT") -> str:
        return f"{HOST}:{self.ports[listener]}"

    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None


_LIVE: set[KafkaCluster] = set()
_LIVE_LOCK = threading.Lock()


def _stop_all_at_exit() -> None:
    with _LIVE_LOCK:
        clusters = list(_LIVE)
    for cluster in clusters:
        cluster.stop()


atexit.register(_stop_all_at_exit)


@dataclass(eq=False)
class KafkaCluster:
    """`nodes` combined Kafka nodes on 127.0.0.1 (1 or 3 in the tests), one KRaft quorum.

    Replication factors of the internal topics equal `nodes` (at most 3); with 3 nodes
    `min.insync.replicas` is 2. `start()` formats and starts every node and returns once each
    has logged "Kafka Server started" and listens; `start_seconds` says how long that took.
    """

    nodes: int = 1
    users: tuple[str, ...] = (*ORDINARY_USERS, PROXY_USER)
    anonymous_super_user: bool = True
    heap: str = "512m"
    jvm_opts: tuple[str, ...] = DEFAULT_JVM_OPTS
    log_level: str = field(default_factory=lambda: os.environ.get("SLUICE_KAFKA_LOG", "WARN"))
    # Keep the folder (configs, data, logs) after stop(); also kept when a start fails.
    keep_files: bool = field(default_factory=lambda: bool(os.environ.get("SLUICE_KAFKA_KEEP")))
    extra_config: dict[str, str] = field(default_factory=dict)
    # Advertise this port instead of the PLAINTEXT listener's own (one node only): a relay in
    # front of the broker (bench/bench_proxy.py's HAProxy variant), as TansuBroker's
    # `advertised_port`, so that clients that bootstrap through the relay stay on it.
    advertised_port: int | None = None
    start_timeout: float = 120.0
    # Map the recorded class archive into every JVM when there is one (see
    # sluice/kafka_class_archive.py); `record_classes_to` makes the brokers write one at
    # exit instead.
    class_archive: bool = True
    record_classes_to: Path | None = None

    folder: Path | None = None
    cluster_id: str = ""
    credentials: KafkaCredentials | None = None
    node_list: list[KafkaNode] = field(default_factory=list)
    format_seconds: float = 0.0
    start_seconds: float = 0.0
    _failed: bool = False

    # ---- addresses and client settings -------------------------------------------------

    @property
    def node_ids(self) -> list[int]:
        return [node.node_id for node in self.node_list]

    def node(self, node_id: int) -> KafkaNode:
        for node in self.node_list:
            if node.node_id == node_id:
                return node
        raise KeyError(f"no Kafka node {node_id} (nodes: {self.node_ids})")

    def bootstrap_for(self, listener: str = "PLAINTEXT") -> str:
        """Every node's HOST:PORT on `listener`, comma-separated."""
        if listener not in ALL_LISTENERS:
            raise ValueError(
                f"unknown listener {listener!r} (one of {', '.join(CLIENT_LISTENERS)})"
            )
        return ",".join(node.address(listener) for node in self.node_list)

    @property
    def bootstrap(self) -> str:
        """The PLAINTEXT bootstrap address (what the Tansu harness's `bootstrap` is)."""
        return self.bootstrap_for("PLAINTEXT")

    @property
    def ca_cert(self) -> Path:
        return self._creds().ca_cert

    def password(self, user: str) -> str:
        return self._creds().passwords[user]

    def client_config(
        self, listener: str = "PLAINTEXT", user: str | None = None, mechanism: str = "PLAIN"
    ) -> dict[str, str]:
        """librdkafka (confluent-kafka) settings for `user` on `listener`: SASL credentials on
        the SASL listeners, the CA on the TLS ones, `user`'s certificate on SSL."""
        conf = {"bootstrap.servers": self.bootstrap_for(listener), "security.protocol": listener}
        creds = self._creds()
        if listener.startswith("SASL_"):
            if user is None:
                raise ValueError(f"{listener} needs a user")
            if mechanism not in SASL_MECHANISMS:
                raise ValueError(f"unknown SASL mechanism {mechanism!r}")
            conf |= {
                "sasl.mechanism": mechanism,
                "sasl.username": user,
                "sasl.password": creds.passwords[user],
            }
        if listener in ("SSL", "SASL_SSL"):
            conf["ssl.ca.location"] = str(creds.ca_cert)
        if listener == "SSL":
            if user is None:
                raise ValueError("SSL needs a user (its client certificate)")
            cert = creds.client_certs[user]
            conf["ssl.certificate.location"] = str(cert.cert)
            conf["ssl.key.location"] = str(cert.key)
        return conf

    def _creds(self) -> KafkaCredentials:
        if self.credentials is None:
            raise RuntimeError("the Kafka cluster has not been started")
        return self.credentials

    # ---- configuration -----------------------------------------------------------------

    def _allocate_ports(self) -> None:
        taken: set[int] = set()
        for node_id in range(1, self.nodes + 1):
            ports: dict[str, int] = {}
            for listener in ALL_LISTENERS:
                port = free_port()
                while port in taken:
                    port = free_port()
                taken.add(port)
                ports[listener] = port
            assert self.folder is not None
            self.node_list.append(KafkaNode(node_id, ports, self.folder / f"node-{node_id}"))

    def _properties(self, node: KafkaNode) -> dict[str, str]:
        props = server_properties(
            node.node_id,
            {n.node_id: n.ports for n in self.node_list},
            node.data_dir,
            self._creds(),
            anonymous_super_user=self.anonymous_super_user,
        )
        if self.advertised_port is not None:
            own = f"PLAINTEXT://{node.address('PLAINTEXT')}"
            relayed = f"PLAINTEXT://{HOST}:{self.advertised_port}"
            props["advertised.listeners"] = ",".join(
                relayed if entry == own else entry
                for entry in props["advertised.listeners"].split(",")
            )
        props.update(self.extra_config)
        return props

    def _write_config(self, node: KafkaNode) -> None:
        node.folder.mkdir(parents=True, exist_ok=True)
        lines = [f"{key}={value}" for key, value in self._properties(node).items()]
        node.config_path.write_text("\n".join(lines) + "\n")
        node.config_path.chmod(0o600)  # it holds the users' passwords

    def _java(self, main: str, *args: str) -> list[str]:
        assert self.folder is not None
        sharing: tuple[str, ...] = ()
        if self.record_classes_to is not None:
            if main == "kafka.Kafka":
                sharing = (f"-XX:ArchiveClassesAtExit={self.record_classes_to}", *_CDS_QUIET)
        elif self.class_archive and class_archive_path().is_file():
            sharing = (f"-XX:SharedArchiveFile={class_archive_path()}", *_CDS_QUIET)
        return [
            java_binary(),
            f"-Xmx{self.heap}",
            *self.jvm_opts,
            *sharing,
            f"-Dlog4j2.configurationFile={self.folder / 'log4j2.properties'}",
            "-cp",
            str(kafka_libs() / "*"),
            main,
            *args,
        ]

    # ---- life cycle --------------------------------------------------------------------

    def start(self) -> KafkaCluster:
        if self.nodes < 1:
            raise ValueError("a Kafka cluster needs at least one node")
        if self.advertised_port is not None and self.nodes != 1:
            raise ValueError("advertised_port needs a one-node cluster")
        kafka_libs()  # fail before making anything if the jars are missing
        began = time.monotonic()
        self.folder = Path(tempfile.mkdtemp(prefix="sluice-kafka-"))
        (self.folder / "log4j2.properties").write_text(_LOG4J2.format(level=self.log_level))
        self.cluster_id = new_cluster_id()
        self.credentials = make_credentials(self.folder / "tls", self.users)
        self._allocate_ports()
        with _LIVE_LOCK:
            _LIVE.add(self)
        try:
            for node in self.node_list:
                self._write_config(node)
            self._format_all()
            self.format_seconds = time.monotonic() - began
            for node in self.node_list:
                self._launch(node)
            deadline = time.monotonic() + self.start_timeout
            for node in self.node_list:
                self._wait_ready(node, deadline)
        except BaseException:
            self._failed = True
            self.stop()
            raise
        self.start_seconds = time.monotonic() - began
        return self

    def _format_all(self) -> None:
        """`StorageTool format` for every node at once (a JVM each: about 2 s of CPU)."""
        creds = self._creds()
        scram = [
            arg
            for name in (ADMIN_USER, *self.users)
            for arg in (
                "--add-scram",
                f"SCRAM-SHA-512=[name={name},password={creds.passwords[name]}]",
            )
        ]
        running: list[tuple[KafkaNode, subprocess.Popen[bytes], Path]] = []
        for node in self.node_list:
            out = node.folder / "format.log"
            with out.open("wb") as sink:
                cmd = self._java(
                    "kafka.tools.StorageTool",
                    "format",
                    "-t",
                    self.cluster_id,
                    "-c",
                    str(node.config_path),
                    *scram,
                )
                running.append(
                    (node, subprocess.Popen(cmd, stdout=sink, stderr=subprocess.STDOUT), out)
                )
        errors = []
        for node, proc, out in running:
            try:
                code = proc.wait(timeout=self.start_timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
                code = -9
            if code != 0:
                errors.append(f"node {node.node_id}: exit {code}, {out}:\n{_tail(out)}")
        if errors:
            raise KafkaStartError("kafka.tools.StorageTool format failed:\n" + "\n".join(errors))

    def _launch(self, node: KafkaNode) -> None:
        node.log_offset = node.log_path.stat().st_size if node.log_path.exists() else 0
        with node.log_path.open("ab") as sink:
            node.process = subprocess.Popen(
                self._java("kafka.Kafka", str(node.config_path)),
                stdout=sink,
                stderr=subprocess.STDOUT,
            )
        node.starts += 1

    def _wait_ready(self, node: KafkaNode, deadline: float) -> None:
        """Until this launch's output has the ready line and the PLAINTEXT port answers."""
        marker = READY_LINE.encode()
        while True:
            if node.log_path.exists():
                with node.log_path.open("rb") as log:
                    log.seek(node.log_offset)
                    if marker in log.read():
                        break
            if node.process is None or node.process.poll() is not None:
                code = node.process.returncode if node.process is not None else None
                raise KafkaStartError(
                    f"Kafka node {node.node_id} exited ({code}) before it started; "
                    f"{node.log_path}:\n{_tail(node.log_path)}"
                )
            if time.monotonic() > deadline:
                raise KafkaStartError(
                    f"Kafka node {node.node_id} did not log {READY_LINE!r} within "
                    f"{self.start_timeout:.0f} s; {node.log_path}:\n{_tail(node.log_path)}"
                )
            time.sleep(0.05)
        wait_for_port(node.ports["PLAINTEXT"], timeout=max(1.0, deadline - time.monotonic()))

    def kill(self, node_id: int) -> None:
        """`kill -9` one node by its PID (its data stays for `restart`)."""
        node = self.node(node_id)
        if node.process is not None and node.process.poll() is None:
            node.process.send_signal(signal.SIGKILL)
            node.process.wait(timeout=10)

    def stop_node(self, node_id: int, timeout: float = 15.0) -> None:
        """A clean stop of one node (SIGTERM, SIGKILL after `timeout` s)."""
        node = self.node(node_id)
        if node.process is not None:
            _stop_process(node.process, timeout)

    def restart(self, node_id: int, timeout: float | None = None) -> float:
        """Start a stopped or killed node again on the same ports and data; returns the
        seconds until it logged "Kafka Server started"."""
        node = self.node(node_id)
        if node.running():
            raise RuntimeError(f"Kafka node {node_id} is still running (pid {node.pid})")
        began = time.monotonic()
        self._launch(node)
        self._wait_ready(node, began + (timeout or self.start_timeout))
        return time.monotonic() - began

    def log_tail(self, node_id: int, lines: int = 40) -> str:
        return _tail(self.node(node_id).log_path, lines)

    def stop(self, timeout: float = 15.0) -> None:
        """SIGTERM to every node at once, SIGKILL to any still running after `timeout` s;
        the folder is removed unless `keep_files` or the start failed."""
        procs = [n.process for n in self.node_list if n.process is not None]
        for proc in procs:
            if proc.poll() is None:
                proc.terminate()
        deadline = time.monotonic() + timeout
        for proc in procs:
            _stop_process(proc, max(0.1, deadline - time.monotonic()))
        for node in self.node_list:
            node.process = None
        with _LIVE_LOCK:
            _LIVE.discard(self)
        if self.folder is not None and not (self.keep_files or self._failed):
            shutil.rmtree(self.folder, ignore_errors=True)

    def __enter__(self) -> KafkaCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
