"""Micro-benchmark of the request paths a one-record, unfiltered Produce crosses (no broker,
no network, one thread): the Produce path alone, and behind the internal-topics path (which
guards the proxy's own topics in front of every API that can name one).

    python -m bench.path_cpu [--rounds 7] [--calls 100000]

Prints µs of CPU (process time) per `on_request` call, best of the rounds. To compare two
builds, run the same command with each build's Python, one after the other, a few times.
"""

from __future__ import annotations

import argparse
import datetime
import time
import timeit
from typing import Any

from sluice.codec import entities, schemas
from sluice.codec.headers import parse_request_header, request_header_bytes
from sluice.codec.messages import ApiKey, encode_request
from sluice.codec.records import BatchHeader, Record, build_batch
from sluice.proxy.contract import ClientInfo
from sluice.proxy.paths.base import Exchange, PathContext
from sluice.proxy.paths.internal_topics import InternalTopicsPath
from sluice.proxy.paths.produce import ProducePath
from sluice.proxy.paths.protection import Protection
from sluice.proxy.paths.topics import TopicRegistry
from sluice.proxy.telemetry.metrics import Metrics


def produce_frame(topic: str, value: bytes, version: int = 9) -> bytes:
    now = int(time.time() * 1000)
    batch = build_batch(BatchHeader(0, 0, -1, 2, 0, 0, 0, now, now, -1, -1, -1, 1),
                        [Record(0, 0, None, value, [])])
    cls = schemas.request_schema(ApiKey.PRODUCE, version)
    tcls = entities.element_class(cls, "topic_data")
    pcls = entities.element_class(tcls, "partition_data")
    request = entities.build(
        cls, transactional_id=None, acks=1, timeout=datetime.timedelta(seconds=5),
        topic_data=(entities.build(tcls, name=topic, partition_data=(
            entities.build(pcls, index=0, records=batch),)),),
    )
    return request_header_bytes(ApiKey.PRODUCE, version, 7, "bench") + encode_request(request)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--calls", type=int, default=100_000)
    args = parser.parse_args()
    ctx = PathContext(
        chain=None, generation=0, directions=frozenset(), topics=TopicRegistry(),
        metrics=Metrics(), node_address=lambda n, h, p: (h, p),
        open_upstream=None,  # type: ignore[arg-type]
        protection=Protection(frozenset({"_sluice_filters"}), frozenset()),
    )
    frame = produce_frame("cpu-topic", b'{"n": 1}')
    header = parse_request_header(frame)
    client = ClientInfo("bench", ("broker", 9092))
    paths: list[tuple[str, Any]] = [
        ("produce path alone", ProducePath()),
        ("internal-topics + produce", InternalTopicsPath([ProducePath()])),
    ]
    for name, path in paths:
        def call(p: Any = path) -> Any:
            return p.on_request(ctx, Exchange(header, client), frame)

        best = min(timeit.repeat(call, number=args.calls, repeat=args.rounds,
                                 timer=time.process_time))
        print(f"{name:28s} {best / args.calls * 1e6:6.2f} µs CPU per request")


if __name__ == "__main__":
    main()
