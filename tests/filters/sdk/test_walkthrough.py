"""docs/WRITING_FILTERS.md section 1, followed as written in each language it shows (C, Zig,
Rust, AssemblyScript, Go, JavaScript, Python): the guide's own code blocks are extracted, built,
tested with `sluice filter test`, and run in a real proxy in front of Tansu with a real client.
If the guide drifts from what works, this fails."""

from __future__ import annotations

import json
import re
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from sluice.cli import main
from tests.harness.broker import TansuBroker
from tests.harness.proxy import SluiceProxy

GUIDE = Path(__file__).resolve().parents[3] / "docs" / "WRITING_FILTERS.md"


def blocks(lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", GUIDE.read_text(), flags=re.DOTALL)


def consume_all(bootstrap: str, topic: str, want: int) -> list[bytes]:
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"g-{uuid.uuid4()}",
                  "enable.auto.commit": False, "log_level": 3})
    c.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])
    got: list[bytes] = []
    deadline = time.monotonic() + 30
    while len(got) < want and time.monotonic() < deadline:
        m = c.poll(0.5)
        value = m.value() if m is not None and m.error() is None else None
        if value is not None:
            got.append(value)
    c.close()
    return got


# --lang, the fence of the guide's code block, a name only that block uses, the file it goes in
WALKTHROUGHS = [("c", "c", "ssn_at", "filter.c"), ("zig", "zig", "ssnAt", "filter.zig"),
                ("rust", "rust", "ssn_at", "filter.rs"),
                ("assemblyscript", "ts", "ssnAt", "filter.ts"),
                ("go", "go", "ssnAt", "filter.go"), ("js", "js", "redactSsn", "filter.js"),
                ("python", "python", "ssn_stars", "filter.py")]


@pytest.mark.parametrize(("lang", "fence", "marker", "entry"), WALKTHROUGHS)
def test_guide_walkthrough(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                           broker: TansuBroker, start_proxy: Callable[..., SluiceProxy],
                           lang: str, fence: str, marker: str, entry: str) -> None:
    assert main(["filter", "new", "redact-ssn", "--lang", lang, "--dir", str(tmp_path)]) == 0
    src = tmp_path / "redact-ssn"
    (code,) = [b for b in blocks(fence) if marker in b]
    (src / entry).write_text(code)
    (sample,) = [b for b in blocks("json") if "emp-1" in b]
    (src / "sample.jsonl").write_text(sample)
    assert main(["filter", "build", str(src)]) == 0
    results = tmp_path / "results.jsonl"
    capsys.readouterr()
    assert main(["filter", "test", str(src / "redact-ssn.wasm"), "--input",
                 str(src / "sample.jsonl"), "--output", str(results)]) == 0
    out = capsys.readouterr().out
    assert "summary: keep 2, rewrite 1" in out and "counters: ssn=1" in out
    first = json.loads(results.read_text().splitlines()[0])
    assert first["value"] == '{"name": "Ann", "ssn": "***-**-****"}'

    (config,) = [b for b in blocks("yaml") if "redact-ssn" in b]
    cfg = tmp_path / "sluice.yaml"
    cfg.write_text(config)
    proxy = start_proxy(config=cfg)

    topic = f"hr.events-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": broker.bootstrap, "log_level": 3})
    admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(timeout=30)
    p = Producer({"bootstrap.servers": proxy.bootstrap, "log_level": 3})
    p.produce(topic, b'{"name": "Ann", "ssn": "123-45-6789"}')
    p.produce(topic, b"contact ann@example.com, card 4111 1111 1111 1111")
    assert p.flush(30) == 0

    via_proxy = consume_all(proxy.bootstrap, topic, 2)
    assert via_proxy == [b'{"name": "Ann", "ssn": "***-**-****"}',
                         b"contact ***@*******.***, card **** **** **** 1111"]
    stored = consume_all(broker.bootstrap, topic, 2)
    assert stored == [b'{"name": "Ann", "ssn": "***-**-****"}',
                      b"contact ann@example.com, card 4111 1111 1111 1111"]
