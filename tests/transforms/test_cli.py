"""`sluice transform run` and `list` as a user meets them: exit codes, messages, the table."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

from confluent_kafka import Producer

from tests.e2e.clients import QUIET, create_topic, unique
from tests.harness.broker import TansuBroker
from tests.transforms.runner_proc import TransformProcess, write_config


def _sluice(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "sluice", "transform", *args],
                          capture_output=True, text=True, timeout=120, check=False)


def test_missing_topic_and_missing_section(broker: TansuBroker, tmp_path: Path) -> None:
    src = unique("in")
    create_topic(broker.bootstrap, src, 1)
    config = write_config(tmp_path, "t", [src], unique("nowhere"))
    run = _sluice("run", str(config), "--bootstrap", broker.bootstrap)
    assert run.returncode == 1
    assert "does not exist (create it first)" in run.stderr
    assert "Traceback" not in run.stderr
    empty = tmp_path / "empty.yaml"
    empty.write_text("telemetry: {}\n")
    run = _sluice("list", str(empty), "--bootstrap", broker.bootstrap)
    assert run.returncode == 2 and "no transforms: section" in run.stderr


def test_list_shows_lag_then_zero(broker: TansuBroker, tmp_path: Path) -> None:
    bs = broker.bootstrap
    src, dst = unique("in"), unique("out")
    create_topic(bs, src, 2)
    create_topic(bs, dst, 2)
    producer = Producer({"bootstrap.servers": bs, **QUIET})
    for i in range(50):
        producer.produce(src, b"v", partition=i % 2)
    assert producer.flush(10) == 0
    config = write_config(tmp_path, unique("t"), [src], dst, guarantee="at-least-once")
    before = _sluice("list", str(config), "--bootstrap", bs, "--json")
    assert before.returncode == 0, before.stderr
    rows = [json.loads(line) for line in before.stdout.splitlines()]
    assert [(r["partition"], r["committed"], r["end"], r["lag"]) for r in rows] == \
        [(0, None, 25, 25), (1, None, 25, 25)]
    proc = TransformProcess(config, bs).start()
    try:
        deadline = time.monotonic() + 60
        table = ""
        while time.monotonic() < deadline:
            table = _sluice("list", str(config), "--bootstrap", bs).stdout
            if all(line.split()[5] == "0" for line in table.splitlines()[1:]):
                break
            time.sleep(1)
    finally:
        assert proc.stop() == 0  # SIGTERM: finishes the batch, leaves the group, exit 0
    head, *lines = table.splitlines()
    assert head.split() == ["TRANSFORM", "INPUT", "PARTITION", "COMMITTED", "END", "LAG",
                            "OUTPUT", "GUARANTEE"]
    assert [line.split()[2:6] for line in lines] == [["0", "25", "25", "0"],
                                                     ["1", "25", "25", "0"]]
