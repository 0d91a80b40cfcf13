"""Pipelined masked Produce requests of one connection, filtered one at a time or side by side.

    python -m bench.produce_overlap                       # 5 requests of 4 500 records, 40 pairs
    python -m bench.produce_overlap --requests 2 --records 1000 --pairs 100

In process, no sockets: the real sans-IO `Connection`, the Produce path and builtin:pii-mask,
the jobs on a real pool of `--threads` threads. `--requests` workload-1 Produce requests (one
partition, `--records` ~200-byte JSON records each, idempotent batches) arrive in one read, as
librdkafka pipelines them; the clock runs until the last one is forwarded. Each pair runs the
serial pass (`proxy.spread_produce: false`) and the overlapping one (`Job.overlap`) back to
back, in alternating order. Prints wall time and process CPU time per pass (quartiles), how many
jobs ran at once, and the median of per-pair wall-time ratios. On a machine whose cores are
busy with other work the two passes take the same time: the threads overlap only where a core
is free.
"""

from __future__ import annotations

import argparse
import datetime
import statistics
import time
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from typing import Any

from bench import workload
from sluice.codec import entities, schemas
from sluice.codec.headers import request_header_bytes
from sluice.codec.messages import ApiKey, encode_request
from sluice.codec.records import BatchHeader, Record, build_batch
from sluice.filters.chain import FilterChain
from sluice.filters.config import FilterSpec
from sluice.proxy.contract import ClientInfo
from sluice.proxy.net.connection import Connection, Limits, SendToBroker, StartJob
from sluice.proxy.paths.base import PathContext
from sluice.proxy.paths.produce import ProducePath
from sluice.proxy.paths.registry import Routes, VersionTable
from sluice.proxy.paths.topics import TopicRegistry
from sluice.proxy.telemetry.metrics import Metrics

TOPIC = "bench-overlap"
VERSION = 9


def produce_frame(correlation_id: int, values: list[bytes], sequence: int) -> bytes:
    """A Produce request (size prefix included): one idempotent batch for partition 0."""
    n = len(values)
    header = BatchHeader(0, 0, -1, 2, 0, 0, n - 1, 1_700_000_000_000, 1_700_000_000_000,
                         4242, 0, sequence, n)
    batch = build_batch(header, [Record(i, 0, None, v, []) for i, v in enumerate(values)])
    cls = schemas.request_schema(ApiKey.PRODUCE, VERSION)
    tcls = entities.element_class(cls, "topic_data")
    pcls = entities.element_class(tcls, "partition_data")
    body = request_header_bytes(ApiKey.PRODUCE, VERSION, correlation_id, "bench")
    body += encode_request(entities.build(
        cls, transactional_id=None, acks=-1, timeout=datetime.timedelta(seconds=10),
        topic_data=(entities.build(tcls, name=TOPIC, partition_data=(
            entities.build(pcls, index=0, records=batch),)),)))
    return len(body).to_bytes(4, "big") + body


def routes(chain: FilterChain, overlap: bool) -> Routes:
    topics = TopicRegistry()
    metrics = Metrics()

    def context(generation: int) -> PathContext:
        return PathContext(
            chain=chain, generation=generation, directions=frozenset({"produce"}),
            topics=topics, metrics=metrics, node_address=lambda n, h, p: (h, p),
            open_upstream=None,  # type: ignore[arg-type]
            overlap_produce=overlap,
        )

    return Routes([ProducePath()], context, VersionTable())


def frames_in(data: list[Any]) -> int:
    """How many frames a SendToBroker carries: each is a 4-byte size prefix followed by its
    body, whole or in pieces (a spliced Produce request is written as its pieces)."""
    frames = left = 0
    for buf in data:
        if left:
            left -= len(buf)
        else:
            left = int.from_bytes(bytes(buf), "big")
            frames += 1
    return frames


def one_pass(chain: FilterChain, pool: ThreadPoolExecutor, threads: int, data: bytes,
             requests: int, overlap: bool) -> tuple[float, float, int]:
    """Wall seconds, process CPU seconds, and most jobs at once, until all are forwarded."""
    conn = Connection(ClientInfo("127.0.0.1:1", ("b", 9092)), routes(chain, overlap),
                      Metrics(), Limits(overlap_jobs=threads))
    running: dict[Future[Any], int] = {}
    forwarded = 0
    most = 0

    def perform(actions: list[Any]) -> None:
        nonlocal forwarded, most
        for a in actions:
            if isinstance(a, StartJob):
                running[pool.submit(a.job.run)] = a.job_id
                most = max(most, len(running))
            elif isinstance(a, SendToBroker):
                forwarded += frames_in(a.data)

    wall, cpu = time.perf_counter(), time.process_time()
    perform(conn.client_data(data))
    while running:
        done, _ = wait(list(running), return_when=FIRST_COMPLETED)
        for future in done:
            perform(conn.job_done(running.pop(future), future.result()))
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    if forwarded != requests:
        raise RuntimeError(f"{forwarded} of {requests} requests forwarded")
    return wall, cpu, most


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=5, help="pipelined requests per pass")
    ap.add_argument("--records", type=int, default=4500, help="records per request")
    ap.add_argument("--pairs", type=int, default=40)
    ap.add_argument("--threads", type=int, default=2, help="the pool's threads")
    args = ap.parse_args(argv)
    chain = FilterChain.from_specs([FilterSpec(
        name="pii", module="builtin:pii-mask", topics=(TOPIC,),
        apply_to=frozenset({"produce"}))])
    values = workload.json_records(args.records)
    data = b"".join(produce_frame(c, values, (c - 1) * args.records)
                    for c in range(1, args.requests + 1))
    results: dict[bool, list[tuple[float, float, int]]] = {False: [], True: []}
    with ThreadPoolExecutor(args.threads, thread_name_prefix="bench-filter") as pool:
        one_pass(chain, pool, args.threads, data, args.requests, True)  # warm: instances made
        for i in range(args.pairs):
            for overlap in ((False, True) if i % 2 else (True, False)):
                results[overlap].append(
                    one_pass(chain, pool, args.threads, data, args.requests, overlap))
    chain.close()
    print(f"{args.requests} pipelined Produce requests of {args.records} workload-1 records, "
          f"builtin:pii-mask, {args.threads} filter threads, {args.pairs} pairs")
    for overlap in (False, True):
        walls = [r[0] * 1000 for r in results[overlap]]
        cpus = [r[1] * 1000 for r in results[overlap]]
        quart = ", ".join(f"{q:.1f}" for q in statistics.quantiles(walls, n=4))
        print(f"  {'side by side' if overlap else 'one at a time'}: wall ms quartiles {quart} "
              f"(min {min(walls):.1f}), CPU ms median {statistics.median(cpus):.1f}, "
              f"most jobs at once {max(r[2] for r in results[overlap])}")
    ratios = [a[0] / b[0] for a, b in zip(results[True], results[False], strict=True)]
    print(f"  wall time side by side / one at a time, per pair: median "
          f"{statistics.median(ratios):.2f} ({min(ratios):.2f}..{max(ratios):.2f})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
