"""Kafka's own command-line tools and the Java client probe, run from the installed jars.

There is no `bin/` folder (the jars come from Maven Central, `scripts/kafka/pom.xml`), so a
tool is its main class: `kafka-topics.sh` is `java -cp '<libs>/*'
org.apache.kafka.tools.TopicCommand`. `run_tool` runs one with a timeout and returns what it
printed; `ClientProbe` compiles `tests/java/ClientProbe.java` (the Java client, driven by
command-line modes that print one JSON object) and runs it. Secrets never go on a command
line: SASL settings travel in a `--command-config` properties file (`write_properties`), and
an error message names the command with any `password`/`jaas` argument blanked.
"""

from __future__ import annotations

import json
import re
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sluice.kafka_broker import java_binary, kafka_libs

# The tools by their shell-script names (Kafka 4.4's classes, all in kafka-tools-4.4.0.jar).
TOOLS = {
    "kafka-topics": "org.apache.kafka.tools.TopicCommand",
    "kafka-configs": "org.apache.kafka.tools.ConfigCommand",
    "kafka-console-producer": "org.apache.kafka.tools.ConsoleProducer",
    "kafka-console-consumer": "org.apache.kafka.tools.consumer.ConsoleConsumer",
    "kafka-console-share-consumer": "org.apache.kafka.tools.consumer.ConsoleShareConsumer",
    "kafka-consumer-groups": "org.apache.kafka.tools.consumer.group.ConsumerGroupCommand",
    "kafka-acls": "org.apache.kafka.tools.AclCommand",
    "kafka-producer-perf-test": "org.apache.kafka.tools.ProducerPerformance",
    "kafka-consumer-perf-test": "org.apache.kafka.tools.ConsumerPerformance",
}

# A short-lived client JVM: the client compiler only and a small heap (the machine's two cores
# are shared); the same choice as the test broker's (sluice/kafka_broker.py).
JVM_OPTS = ("-Xmx256m", "-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC", "-Djava.awt.headless=true")

# Warnings and errors to stderr, so that a tool's stdout is its output only.
_LOG4J2 = """\
status = warn
appender.err.type = Console
appender.err.name = ERR
appender.err.target = SYSTEM_ERR
appender.err.layout.type = PatternLayout
appender.err.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = WARN
rootLogger.appenderRef.err.ref = ERR
"""

_SECRET_ARG = re.compile(r"password|jaas|secret", re.IGNORECASE)
JAVA_SOURCES = Path(__file__).resolve().parents[1] / "java"


class ToolFailed(RuntimeError):
    """A tool exited non-zero or timed out; the message has its (redacted) command and output."""


def redacted(cmd: list[str]) -> str:
    """The command with every argument that names a secret, and the one after it, blanked."""
    out: list[str] = []
    hide_next = False
    for arg in cmd:
        secret = bool(_SECRET_ARG.search(arg))
        out.append("<redacted>" if secret or hide_next else arg)
        hide_next = secret and arg.startswith("-")
    return " ".join(out)


def _log_config() -> Path:
    path = Path(tempfile.gettempdir()) / "sluice-kafka-tools-log4j2.properties"
    if not path.is_file() or path.read_text() != _LOG4J2:
        path.write_text(_LOG4J2)
    return path


def java_command(main: str, *args: str, classpath: list[Path] | None = None) -> list[str]:
    """`java ... -cp <extra>:<libs>/* <main> args`."""
    cp = [*(str(p) for p in classpath or []), str(kafka_libs() / "*")]
    return [
        java_binary(),
        *JVM_OPTS,
        f"-Dlog4j2.configurationFile={_log_config()}",
        "-cp",
        ":".join(cp),
        main,
        *args,
    ]


def run_java(
    main: str,
    *args: str,
    classpath: list[Path] | None = None,
    input: str | None = None,
    timeout: float = 90.0,
    check: bool = True,
) -> subprocess.CompletedProcess[str]:
    """Run a Java main class; `ToolFailed` (command redacted, output tail) on a non-zero exit
    when `check`, or always on a timeout."""
    cmd = java_command(main, *args, classpath=classpath)
    try:
        proc = subprocess.run(
            cmd, input=input, capture_output=True, text=True, timeout=timeout, check=False
        )
    except subprocess.TimeoutExpired as exc:
        raise ToolFailed(f"{redacted(cmd)}: no exit within {timeout:.0f} s") from exc
    if check and proc.returncode != 0:
        raise ToolFailed(
            f"{redacted(cmd)}: exit {proc.returncode}\nstdout:\n{proc.stdout[-3000:]}\n"
            f"stderr:\n{proc.stderr[-3000:]}"
        )
    return proc


def run_tool(name: str, *args: str, **kwargs: Any) -> subprocess.CompletedProcess[str]:
    """Run one of Kafka's tools by its script name (`kafka-topics`, ...), see `run_java`."""
    if name not in TOOLS:
        raise ValueError(f"unknown Kafka tool {name!r} (one of {', '.join(sorted(TOOLS))})")
    return run_java(TOOLS[name], *args, **kwargs)


def write_properties(path: Path, settings: dict[str, str]) -> Path:
    """A Java client properties file (for `--command-config`, `--consumer.config`, ...),
    readable by its owner only: it may hold a SASL password."""
    path.write_text("".join(f"{k}={v}\n" for k, v in settings.items()))
    path.chmod(0o600)
    return path


@dataclass
class ClientProbe:
    """The Java programs of `tests/java` (`ClientProbe`, `StreamsProbe`), compiled once into
    `folder`."""

    folder: Path
    compiled: bool = field(default=False)

    def compile(self, timeout: float = 120.0) -> ClientProbe:
        javac = Path(java_binary()).resolve().with_name("javac")
        if not javac.is_file():
            raise ToolFailed(
                f"no javac beside {java_binary()}: the Java client tests need a JDK "
                "(Debian: apt-get install openjdk-17-jdk-headless; `bash scripts/dev.sh install`)"
            )
        cmd = [
            str(javac),
            "-d",
            str(self.folder),
            "-cp",
            str(kafka_libs() / "*"),
            *sorted(str(p) for p in JAVA_SOURCES.glob("*.java")),
        ]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)
        if proc.returncode != 0:
            raise ToolFailed(f"javac tests/java/*.java failed:\n{proc.stdout}{proc.stderr}")
        self.compiled = True
        return self

    def run(
        self,
        mode: str,
        bootstrap: str,
        lines: list[str] | None = None,
        timeout: float = 90.0,
        **options: str | int | bool,
    ) -> dict[str, Any]:
        """One mode; `options` become `--name value` (underscores as dashes, True a flag)."""
        args = [mode, "--bootstrap", bootstrap]
        for name, value in options.items():
            flag = "--" + name.replace("_", "-")
            if value is True:
                args.append(flag)
            elif value is not False:
                args += [flag, str(value)]
        proc = run_java(
            "ClientProbe",
            *args,
            classpath=[self.folder],
            input="".join(f"{line}\n" for line in lines or []),
            timeout=timeout,
        )
        result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
        return result

    def run_main(self, main: str, *args: str, timeout: float = 120.0) -> dict[str, Any]:
        """Another program of `tests/java` by its class name; its last line of output, JSON."""
        proc = run_java(main, *args, classpath=[self.folder], timeout=timeout)
        result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
        return result
