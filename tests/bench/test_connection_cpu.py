"""bench.connection_cpu: the in-process measure of the pass-through core runs and is sane."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable

import pytest

from bench import connection_cpu


def test_measures_requests_that_all_went_through(capsys: pytest.CaptureFixture[str]) -> None:
    assert connection_cpu.main(["--rounds", "1", "--requests", "1500"]) == 0
    line = capsys.readouterr().out.strip()
    micros = float(line.split()[0])
    assert 0 < micros < 10_000 and "per one-record Produce request" in line


def test_every_request_and_response_is_relayed() -> None:
    # `_measure` refuses to report a figure when a frame was dropped or the connection
    # closed; a positive figure means every frame of every round was written onwards.
    assert asyncio.run(connection_cpu._measure(1, 1200)) > 0



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
