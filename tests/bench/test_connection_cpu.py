"""bench.connection_cpu: the in-process measure of the pass-through core runs and is sane."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable

import pytest

from bench import connection_cpu


def _keep_writes(monkeypatch: pytest.MonkeyPatch) -> list[bytes]:
    """Every frame the fake transports write from now on, joined."""
    sent: list[bytes] = []
    original = connection_cpu._Transport.writelines

    def keep(self: connection_cpu._Transport, data: Iterable[bytes]) -> None:
        sent.append(b"".join(data))
        original(self, data)

    monkeypatch.setattr(connection_cpu._Transport, "writelines", keep)
    return sent


def test_measures_requests_that_all_went_through(capsys: pytest.CaptureFixture[str]) -> None:
    assert connection_cpu.main(["--rounds", "1", "--requests", "1500"]) == 0
    line = capsys.readouterr().out.strip()
    micros = float(line.split()[0])
    assert 0 < micros < 10_000 and "per one-record Produce request" in line


def test_every_request_and_response_is_relayed() -> None:
    # `_measure` refuses to report a figure when a frame was dropped or the connection
    # closed; a positive figure means every frame of every round was written onwards.
    assert asyncio.run(connection_cpu._measure(1, 1200)) > 0


def test_workload_2_requests_all_go_through(capsys: pytest.CaptureFixture[str]) -> None:
    # ~100 KB lz4 Produce requests of two partitions, each answered: a positive figure means
    # every one of them was written onwards (see the test above).
    assert connection_cpu.main(["--rounds", "1", "--requests", "60", "--shape", "w2"]) == 0
    line = capsys.readouterr().out.strip()
    assert float(line.split()[0]) > 0 and "workload-2" in line


def test_workload_2_requests_have_its_shape() -> None:
    ((request, response),) = connection_cpu._frames(1, "w2")
    assert 50_000 < len(request) < 200_000  # lz4 batches of two partitions of 1 500 JSON records
    assert len(response) < 200


def test_cold_mode_relays_every_frame_and_says_so(capsys: pytest.CaptureFixture[str]) -> None:
    # Sleeps between the calls; `_measure` still checks that every frame went through.
    argv = ["--rounds", "1", "--requests", "20", "--cold", "0.01"]
    assert connection_cpu.main(argv) == 0
    line = capsys.readouterr().out.strip()
    assert 0 < float(line.split()[0]) < 5_000 and "asleep" in line


def test_masked_requests_are_filtered_and_relayed() -> None:
    # With --mask the record of every request reaches the broker with its e-mail address
    # masked, and every request and response still goes through (`_measure` checks that).
    sent: list[bytes] = []
    original = connection_cpu._Transport.writelines

    def keep(self: connection_cpu._Transport, data: Iterable[bytes]) -> None:
        sent.append(b"".join(data))
        original(self, data)

    connection_cpu._Transport.writelines = keep  # type: ignore[method-assign]
    try:
        assert asyncio.run(connection_cpu._measure(1, 1100, mask=True)) > 0
    finally:
        connection_cpu._Transport.writelines = original  # type: ignore[method-assign]
    produced = [frame for frame in sent if b'"email": "' in frame]
    assert len(produced) == 2100
    assert all(b'"email": "*****@*******.***"' in frame for frame in produced)


def test_masked_workload_1_requests_are_filtered_in_the_pool_and_relayed(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # The chunked harness's shape (one uncompressed batch, above the inline size, so its job
    # runs in the filter pool), cold: every record of every request reaches the broker
    # masked, and `_measure` checks that every request and response went through.
    monkeypatch.setattr(connection_cpu, "W1_RECORDS", 300)
    sent = _keep_writes(monkeypatch)
    assert asyncio.run(connection_cpu._measure(1, 12, "w1", 0.001, True)) > 0
    produced = [frame for frame in sent if b'"email": "' in frame]
    assert len(produced) == 12 + 12  # warm-up and measured round
    assert all(frame.count(b'"email": "') == 300 for frame in produced)
    assert not any(b"@example.com" in frame for frame in produced), "an address went unmasked"


def test_masked_one_record_requests_cold_are_filtered_and_relayed(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    # --mask --cold on one-record requests: each one's job (inline once its kind has learnt)
    # masks its record, and every request and response goes through (`_measure` checks).
    sent = _keep_writes(monkeypatch)
    argv = ["--rounds", "1", "--requests", "40", "--cold", "0.001", "--mask"]
    assert connection_cpu.main(argv) == 0
    line = capsys.readouterr().out.strip()
    assert float(line.split()[0]) > 0 and "masked" in line and "asleep" in line
    produced = [frame for frame in sent if b'"email": "' in frame]
    assert len(produced) == 40 + 40  # warm-up and measured round
    assert all(b'"email": "*****@*******.***"' in frame for frame in produced)
