"""`sluice demo` end to end, and its clean-up of every process it started (also on Ctrl-C)."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

pytestmark = pytest.mark.spark


def _descendants(pid: int) -> list[psutil.Process]:
    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []


def test_demo_runs_end_to_end(tmp_path: Path) -> None:
    out = tmp_path / "demo"
    proc = subprocess.run(
        [sys.executable, "-m", "sluice", "demo", "--out", str(out), "--records", "40"],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    text = proc.stdout
    lines = text.splitlines()
    produced = next(ln for ln in lines if "as produced:" in ln)
    stored = [ln for ln in lines if "payments.orders:" in ln]
    assert "@example.com" in produced
    # Stored (read around the proxy) and consumed through it: masked, no e-mail left.
    assert stored and all("@example.com" not in ln and "*" in ln for ln in stored)
    # The key (the customer's e-mail) and the header (a phone number) are stored masked too.
    key_sent = next(ln for ln in lines if "key, as produced:" in ln)
    key_stored = next(ln for ln in lines if "key, stored:" in ln)
    header_stored = next(ln for ln in lines if "header customer-phone, stored:" in ln)
    assert "@example.com" in key_sent and "@example.com" not in key_stored
    assert "@*******.***" in key_stored
    assert "+** ** **** ****" in header_stored
    tickets = [ln for ln in lines if "support.tickets:" in ln]
    assert len(tickets) == 2
    assert (
        "5500-0000-0000-0004" in tickets[0]
        or "4111 1111 1111 1111" in tickets[0]
        or "3400" in tickets[0]
    )
    assert "****" in tickets[1]
    # The transform wrote the derived topic, masked, and its lag went to zero.
    derived = next(ln for ln in lines if "support.tickets.masked:" in ln)
    assert "****" in derived and "@example" not in derived
    assert "tickets-masked lag: 0" in text
    card_lines = {ln.split(":", 1)[0].strip(): ln for ln in lines if "cards, " in ln}
    assert "4111 1111 1111 1111" in card_lines["cards, produced"]
    assert "4111" not in card_lines["cards, stored"]
    assert '"card": "sluice:enc:1:' in card_lines["cards, stored"]
    assert card_lines["cards, allowed reader"].split(":", 1)[1].strip() == (
        card_lines["cards, produced"].split(":", 1)[1].strip())
    assert "Payments_ARCHIVE: refused: topic-policy" in text
    assert "payments.firehose: refused: topic-policy: partitions" in text
    assert "payments.refunds: created" in text
    assert "consumed 40 of 40 payment events" in text
    # The proxy tagged its telemetry with the demo's key and the audit verified every file.
    verified = next(ln for ln in lines if "telemetry verified with key" in ln)
    assert verified.endswith(", 0 refused") and " 0 files" not in verified
    report = out / "report" / "report.html"
    assert report.is_file() and "<svg" in report.read_text()
    assert (out / "report" / "billing.csv").is_file()


def test_demo_ctrl_c_stops_everything_it_started(tmp_path: Path) -> None:
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "sluice",
            "demo",
            "--out",
            str(tmp_path / "demo"),
            "--skip-audit",
            "--records",
            "2000",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    assert proc.stdout is not None
    seen: list[psutil.Process] = []
    deadline = time.monotonic() + 120
    for line in proc.stdout:
        if "Producing" in line:
            seen = _descendants(proc.pid)
            break
        assert time.monotonic() < deadline
    names = {p.name() for p in seen}
    assert any("tansu" in n for n in names), names
    assert any("python" in n for n in names), names  # the proxy
    proc.send_signal(signal.SIGINT)
    rest = proc.communicate(timeout=60)[0]
    assert proc.returncode == 130, rest
    assert "Traceback" not in rest
    _gone, alive = psutil.wait_procs(seen, timeout=20)
    assert not alive, [p.pid for p in alive]


@pytest.mark.kafka
def test_demo_against_apache_kafka_and_its_clean_up(tmp_path: Path) -> None:
    """`--broker kafka`: the same demo on one Apache Kafka node; its JVM is stopped at the end."""
    args = ["demo", "--broker", "kafka", "--skip-audit", "--records", "20"]
    proc = subprocess.Popen(
        [sys.executable, "-m", "sluice", *args, "--out", str(tmp_path / "demo")],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    assert proc.stdout is not None
    lines: list[str] = []
    seen: list[psutil.Process] = []
    names: set[str] = set()
    for line in proc.stdout:
        lines.append(line)
        if "Producing" in line and not seen:
            seen = _descendants(proc.pid)
            names = {p.name() for p in seen}
    proc.wait(timeout=60)
    text = "".join(lines)
    assert proc.returncode == 0, text[-3000:]
    assert "Starting Apache Kafka 4.4.0" in text
    assert "java" in names, names
    stored = next(ln for ln in lines if "payments.orders:" in ln)
    assert "@example.com" not in stored and "*" in stored
    assert "tickets-masked lag: 0" in text
    assert "Payments_ARCHIVE: refused: topic-policy" in text
    assert "consumed 20 of 20 payment events" in text
    _gone, alive = psutil.wait_procs(seen, timeout=20)
    assert not alive, [p.pid for p in alive]
