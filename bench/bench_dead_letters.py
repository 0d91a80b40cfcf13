"""Dead-letter producing against the bundled Tansu broker: letters per second, Produce
requests and connections, and CPU per letter in the proxy's process.

    python -m bench.bench_dead_letters [--letters 50000] [--size 200] [--partitions 6]

Submits every letter at once (keyed, as a filter's failures usually are) to one
`DeadLetterWriter`, waits until all are acknowledged (acks=all), and prints the wall time, the
process CPU time per letter, and how many connections and Produce requests it took. All
letters are queued at once, so a run must fit the default 64 MiB bound of
`dead_letters.max_queued_bytes`; letters over it are dropped (the line says how many).
"""

from __future__ import annotations

import argparse
import asyncio
import time

from confluent_kafka.admin import AdminClient, NewTopic

from sluice.filters.chain import DeadLetter
from sluice.proxy.net.upstream_client import UpstreamDialer
from sluice.proxy.ops.config import ProxyConfig
from sluice.proxy.telemetry.dead_letters import DeadLetterWriter
from tests.harness.broker import TansuBroker


async def _run(bootstrap: tuple[str, int], topic: str, letters: list[DeadLetter]) -> None:
    writer = DeadLetterWriter(UpstreamDialer(ProxyConfig(("127.0.0.1", 0), [bootstrap])))
    wall, cpu = time.perf_counter(), time.process_time()
    writer.submit(letters)
    while writer.queued:
        await asyncio.sleep(0.005)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    await writer.close()
    n = len(letters)
    print(
        f"{n} letters of {len(letters[0].value or b'')} B: {wall:.2f} s wall "
        f"({n / wall:,.0f} letters/s), {cpu / n * 1e6:.1f} µs CPU/letter; "
        f"produced {writer.produced}, failed {writer.failed}, dropped {writer.dropped}; "
        f"connections {writer.connections_opened}, Produce requests {writer.produce_requests}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--letters", type=int, default=50_000)
    parser.add_argument("--size", type=int, default=200)
    parser.add_argument("--partitions", type=int, default=6)
    args = parser.parse_args()
    with TansuBroker() as broker:
        admin = AdminClient({"bootstrap.servers": broker.bootstrap, "log_level": 3})
        for fut in admin.create_topics([NewTopic("dlq-bench", args.partitions, 1)]).values():
            fut.result(15)
        letters = [
            DeadLetter("dlq-bench", b"key-%d" % i, b"x" * args.size, [("sluice.filter", b"b")])
            for i in range(args.letters)
        ]
        host, port = broker.bootstrap.rsplit(":", 1)
        asyncio.run(_run((host, int(port)), "dlq-bench", letters))


if __name__ == "__main__":
    main()
