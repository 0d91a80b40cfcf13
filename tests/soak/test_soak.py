"""Soak: hundreds of concurrent client connections for minutes; the proxy's memory and file
descriptors stay flat.

Not in the default run (marker ``soak``). Run it with:

    SLUICE_SOAK_SECONDS=300 SLUICE_SOAK_CONNECTIONS=300 \
        /work/venv/bin/pytest -q -m soak tests/soak -s

Each simulated client is a raw asyncio connection that loops ApiVersions -> Metadata ->
Produce (a small batch, half of them to a pii-mask filtered topic) with a short pause, and
every ~20 cycles closes its connection and opens a new one (connection churn). A sampler reads
the proxy's RSS and open file descriptors (psutil) every few seconds; the test compares the
first minute with the last one, checks that every Produce succeeded, that the filtered topic
holds only masked values, and that the number of stored records equals the acknowledged ones.
"""

from __future__ import annotations

import asyncio
import os
import random
import statistics
import struct
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import psutil
import pytest

from bench import wire
from sluice.codec.headers import response_header_size
from sluice.codec.messages import decode_response
from tests.e2e.clients import create_topic, unique
from tests.harness.broker import TansuBroker
from tests.harness.proxy import SluiceProxy

pytestmark = pytest.mark.soak

SECONDS = float(os.environ.get("SLUICE_SOAK_SECONDS", "300"))
CONNECTIONS = int(os.environ.get("SLUICE_SOAK_CONNECTIONS", "300"))
SAMPLE_EVERY = 5.0
CONFIG = """
filters:
  - name: mask
    module: builtin:pii-mask
    topics: ["soak-masked-*"]
    apply_to: [produce]
"""


@dataclass
class Totals:
    cycles: int = 0
    acked: dict[str, int] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)
    reconnects: int = 0


async def _call(
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    key: int,
    version: int,
    entity: object,
    cid: int,
) -> object:
    writer.write(wire.request_bytes(key, version, entity, cid, client_id="soak"))
    await writer.drain()
    (size,) = struct.unpack(">i", await reader.readexactly(4))
    body = await reader.readexactly(size)
    (got,) = struct.unpack_from(">i", body, 0)
    if got != cid:
        raise AssertionError(f"correlation id {got} answers {cid}")
    return decode_response(key, version, body[response_header_size(body, key, version) :])


async def _client(
    n: int, bootstrap: str, topics: list[str], deadline: float, totals: Totals
) -> None:
    host, port = bootstrap.rsplit(":", 1)
    rng = random.Random(n)
    cid = 0
    while time.monotonic() < deadline:
        reader, writer = await asyncio.open_connection(host, int(port))
        totals.reconnects += 1
        try:
            for _ in range(rng.randrange(10, 30)):
                if time.monotonic() >= deadline:
                    break
                topic = topics[rng.randrange(len(topics))]
                cid += 1
                await _call(reader, writer, 18, 3, wire.api_versions_request(3), cid)
                cid += 1
                await _call(reader, writer, 3, 12, wire.metadata_request(12, [topic]), cid)
                cid += 1
                values = [f"c{n} mail soak{n}@example.com".encode()] * rng.randrange(1, 5)
                request = wire.produce_request(9, [(topic, 0, wire.batch(values))])
                response = await _call(reader, writer, 0, 9, request, cid)
                codes = [
                    int(p.error_code)
                    for t in response.responses  # type: ignore[attr-defined]
                    for p in t.partition_responses
                ]
                if codes == [0]:
                    totals.acked[topic] = totals.acked.get(topic, 0) + len(values)
                else:
                    totals.errors.append(f"produce error {codes}")
                totals.cycles += 1
                await asyncio.sleep(rng.uniform(0.2, 1.0))
        except (OSError, asyncio.IncompleteReadError, AssertionError) as exc:
            totals.errors.append(repr(exc))
        finally:
            writer.close()
            try:
                await writer.wait_closed()
            except OSError:
                pass


async def _sample(pid: int, deadline: float, samples: list[tuple[float, int, int]]) -> None:
    proc = psutil.Process(pid)
    start = time.monotonic()
    while time.monotonic() < deadline:
        samples.append((time.monotonic() - start, proc.memory_info().rss, proc.num_fds()))
        await asyncio.sleep(SAMPLE_EVERY)


@pytest.fixture
def soak_target(tmp_path: Path) -> Iterator[tuple[TansuBroker, SluiceProxy]]:
    cfg = tmp_path / "sluice.yaml"
    cfg.write_text(CONFIG + f"telemetry:\n  dir: {tmp_path / 'telemetry'}\n")
    with TansuBroker() as broker, SluiceProxy(upstream=broker.bootstrap, config=cfg) as proxy:
        yield broker, proxy


@pytest.mark.timeout(SECONDS + 300)  # the project default (300 s) would cut a soak short
def test_soak_memory_and_fds_stay_flat(soak_target: tuple[TansuBroker, SluiceProxy]) -> None:
    broker, proxy = soak_target
    assert proxy.process is not None
    assert SECONDS >= 150, "a soak needs a first and a last minute that do not overlap"
    topics = [unique("soak-masked"), unique("soak-plain")]
    for t in topics:
        create_topic(proxy.bootstrap, t)
    totals = Totals()
    samples: list[tuple[float, int, int]] = []

    async def main() -> None:
        deadline = time.monotonic() + SECONDS
        sampler = asyncio.create_task(_sample(proxy.process.pid, deadline, samples))  # type: ignore[union-attr]
        clients = [
            asyncio.create_task(_client(i, proxy.bootstrap, topics, deadline, totals))
            for i in range(CONNECTIONS)
        ]
        await asyncio.gather(*clients)
        await sampler

    asyncio.run(main())
    assert proxy.process.poll() is None
    first = [s for s in samples if s[0] < 60]
    last = [s for s in samples if s[0] >= samples[-1][0] - 60]
    rss_first = statistics.median(s[1] for s in first)
    rss_last = statistics.median(s[1] for s in last)
    fds_first = statistics.median(s[2] for s in first)
    fds_last = statistics.median(s[2] for s in last)
    report = (
        f"{totals.cycles} cycles, {totals.reconnects} connections, RSS {rss_first / 2**20:.1f} -> "
        f"{rss_last / 2**20:.1f} MiB, fds {fds_first:.0f} -> {fds_last:.0f}"
    )
    print(report)
    assert not totals.errors, totals.errors[:5]
    assert totals.cycles > CONNECTIONS * 10, report
    # Flat: the last minute within 10 % (+8 MiB for allocator noise) of the first minute.
    assert rss_last <= rss_first * 1.10 + 8 * 2**20, report
    assert fds_last <= fds_first * 1.10 + 10, report
    stored = {t: [r.value for r in wire.read_partition(broker.bootstrap, t)] for t in topics}
    assert {t: len(v) for t, v in stored.items()} == totals.acked, "stored != acknowledged"
    assert not [v for v in stored[topics[0]] if v and b"@example.com" in v], "unmasked values"
