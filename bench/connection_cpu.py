"""Micro-benchmark of the pass-through core per request: one-record Produce requests and their
responses through the real `ProxyServer`'s `Session` and `Connection` (framing, header, version
gate, the internal-topics and Produce paths, slots, the KIP-951 scan of the response, metrics,
the actions), with no socket and no broker; the transports only count writes. With `--mask`,
builtin:pii-mask filters produce (the mask-produce variant of `bench_proxy`): each one-record
request holds a ~200-byte JSON record of the benchmark workload (an e-mail and a card number to
mask), and its filter job runs as the proxy runs it (in the pool while its kind learns, then
inline on the loop, `net/job_placement.py`), so the figure is the whole in-process cost of a
one-record masked Produce: path, job placement, chain, guest call, splice, telemetry.

    python -m bench.connection_cpu [--rounds 5] [--requests 20000] [--baseline DIR]
                                   [--shape one|w2] [--cold SECONDS] [--mask]

Prints µs of CPU (process time) per request and its response, best of the rounds. `--shape
w2` sends bench_proxy workload 2's Produce requests instead (two partitions of 1 500 ~200-byte
JSON records in lz4 batches, ~100 KB, acks=all, v10 as librdkafka sends them to Apache Kafka
4), to separate what a large frame costs from what a request costs; `--shape w2-fetch` sends
workload 2's Fetch requests (v16, one topic by id, six partitions) and their responses (500
records an lz4 batch per partition) on an unfiltered topic. `--cold SECONDS` sleeps
that long before each request and before its response and counts only the CPU of the calls
themselves: on a loaded machine every wake-up of the proxy finds its caches cold, and this
shows what the same code then costs (the figure end to end is nearer to it than to the warm
one). With `--mask`, each masked request's CPU is counted from its read to its forwarding
(its job inline within the read once the kind has learnt, as in the proxy). With
`--baseline DIR` (another Sluice source tree, as for `bench_proxy --baseline`), the same
measurement runs in alternating processes of this checkout and of that tree, and the median
of the per-pair ratios is printed. End to end (`bench.request_cpu`), sockets and the scheduler
are most of the CPU per request and the machine's load moves it by more than the core's own
share; this isolates the core's share, warm.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import os
import statistics
import struct
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

from bench import baseline
from bench.path_cpu import produce_frame
from bench.workload import json_records
from sluice.codec import entities, schemas
from sluice.codec.headers import request_header_bytes, response_header_bytes
from sluice.codec.messages import ApiKey, encode_request, encode_response
from sluice.codec.records import BatchHeader, Record, build_batch
from sluice.filters.config import parse_filter_specs
from sluice.filters.yaml_lines import load_yaml_text_with_lines
from sluice.proxy.net.server import ProxyServer
from sluice.proxy.ops.allocator import keep_batch_buffers
from sluice.proxy.ops.config import ProxyConfig
from sluice.proxy.ops.gc_pauses import freeze_startup_heap
from sluice.proxy.ops.reload import build_chain

VERSION = 9  # what librdkafka sends to Apache Kafka 4
W2_VERSION = 10  # what librdkafka sends to Apache Kafka 4.4 with workload 2
W2_PARTITIONS, W2_RECORDS = 2, 1500  # per request: ~100 KB, as bench_proxy's w2 averages
W2_FETCH_VERSION = 16  # what librdkafka sends to Apache Kafka 4
W2_FETCH_TOPIC_ID = uuid.UUID(int=0x5E1CE)
W2_FETCH_PARTITIONS, W2_FETCH_RECORDS = 6, 500  # a consumer's Fetch of workload 2's topic
#: bench.chunked's workload-1 Produce requests: librdkafka's long-lived producer sends ~4 000
#: ~200-byte JSON records a request (`bench.chunked --shapes`), one uncompressed batch.
W1_RECORDS = 4000
SHAPES = ("one", "w1", "w2", "w2-fetch")
MASK_CONFIG = """\
filters:
  - name: mask-pii
    module: builtin:pii-mask
    topics: ["cpu-*"]
    apply_to: [produce]
"""


class _Transport:
    """What the session writes to: counts, keeps nothing."""

    def __init__(self) -> None:
        self.writes = 0
        self.forwarded: asyncio.Future[None] | None = None

    def writelines(self, data: Any) -> None:
        self.writes += 1
        if self.forwarded is not None and not self.forwarded.done():
            self.forwarded.set_result(None)

    def write(self, data: Any) -> None:
        self.writelines((data,))

    def get_write_buffer_size(self) -> int:
        return 0  # every write is taken at once

    def is_closing(self) -> bool:
        return False

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def get_extra_info(self, key: str, default: Any = None) -> Any:
        return ("127.0.0.1", 1) if key == "peername" else default

    def set_write_buffer_limits(self, high: int | None = None) -> None:
        pass

    def close(self) -> None:
        pass


def _w2_request(partitions_: int = W2_PARTITIONS, records: int = W2_RECORDS,
                codec: int = 3) -> bytes:
    """A Produce request (header included) of workload 2's shape, correlation id 0 (or,
    with one partition of `W1_RECORDS` uncompressed, of the chunked harness's workload 1)."""
    values = json_records(partitions_ * records)
    now = int(time.time() * 1000)
    cls = schemas.request_schema(ApiKey.PRODUCE, W2_VERSION)
    tcls = entities.element_class(cls, "topic_data")
    pcls = entities.element_class(tcls, "partition_data")
    partitions = []
    for p in range(partitions_):
        mine = values[p * records : (p + 1) * records]
        lz4 = BatchHeader(0, 0, -1, 2, 0, codec, len(mine) - 1, now, now, -1, -1, -1, len(mine))
        batch = build_batch(lz4, [Record(0, i, None, v, []) for i, v in enumerate(mine)])
        partitions.append(entities.build(pcls, index=p, records=batch))
    request = entities.build(
        cls, transactional_id=None, acks=-1, timeout=datetime.timedelta(seconds=30),
        topic_data=(entities.build(tcls, name="cpu-topic", partition_data=tuple(partitions)),),
    )
    return request_header_bytes(ApiKey.PRODUCE, W2_VERSION, 0, "rdkafka") + encode_request(
        request)


def _fetch_frames(count: int) -> list[tuple[bytes, bytes]]:
    """Workload-2 Fetch (request, response) frames, size prefixes included: one topic (by id)
    of six partitions, each answered with an lz4 batch of ~200-byte JSON records."""
    topic_id = W2_FETCH_TOPIC_ID
    rcls = schemas.request_schema(ApiKey.FETCH, W2_FETCH_VERSION)
    rtcls = entities.element_class(rcls, "topics")
    rpcls = entities.element_class(rtcls, "partitions")
    request = entities.build(
        rcls, max_wait=datetime.timedelta(milliseconds=500), min_bytes=1, max_bytes=52428800,
        isolation_level=0, session_id=0, session_epoch=-1, rack_id="",
        topics=(entities.build(rtcls, topic_id=topic_id, partitions=tuple(
            entities.build(rpcls, partition=p, current_leader_epoch=0, fetch_offset=100,
                           last_fetched_epoch=-1, log_start_offset=-1,
                           partition_max_bytes=1048576)
            for p in range(W2_FETCH_PARTITIONS))),),
        forgotten_topics_data=(),
    )
    values = json_records(W2_FETCH_PARTITIONS * W2_FETCH_RECORDS)
    now = int(time.time() * 1000)
    cls = schemas.response_schema(ApiKey.FETCH, W2_FETCH_VERSION)
    tcls = entities.element_class(cls, "responses")
    pcls = entities.element_class(tcls, "partitions")
    partitions = []
    for p in range(W2_FETCH_PARTITIONS):
        mine = values[p * W2_FETCH_RECORDS : (p + 1) * W2_FETCH_RECORDS]
        lz4 = BatchHeader(100, 0, 0, 2, 0, 3, len(mine) - 1, now, now, -1, -1, -1, len(mine))
        batch = build_batch(lz4, [Record(0, i, None, v, []) for i, v in enumerate(mine)])
        partitions.append(entities.build(
            pcls, partition_index=p, error_code=0, high_watermark=100 + len(mine),
            last_stable_offset=100 + len(mine), log_start_offset=0, aborted_transactions=None,
            preferred_read_replica=-1, records=batch))
    body = encode_response(entities.build(
        cls, throttle_time=datetime.timedelta(0), error_code=0, session_id=0,
        responses=(entities.build(tcls, topic_id=topic_id, partitions=tuple(partitions)),),
    ))
    head = bytearray(request_header_bytes(ApiKey.FETCH, W2_FETCH_VERSION, 0, "rdkafka")
                     + encode_request(request))
    out = []
    for cid in range(1, count + 1):
        struct.pack_into(">i", head, 4, cid)
        response = response_header_bytes(cid, ApiKey.FETCH, W2_FETCH_VERSION) + body
        out.append((struct.pack(">i", len(head)) + bytes(head),
                    struct.pack(">i", len(response)) + response))
    return out


def learn_fetch_ids(session: Any) -> None:
    """What a consumer's Metadata teaches the session before it fetches: the id of the
    `w2-fetch` topic and those of the proxy's internal topics (made up here)."""
    ctx = session.conn._routes.current.ctx
    names = sorted(ctx.protection.names) if ctx.protection is not None else []
    for n, name in enumerate(names, 1):
        ctx.topics.names[uuid.UUID(int=n)] = name
        ctx.topics.ids[name] = uuid.UUID(int=n)
    ctx.topics.names[W2_FETCH_TOPIC_ID] = "cpu-topic"
    ctx.topics.ids["cpu-topic"] = W2_FETCH_TOPIC_ID


def _frames(count: int, shape: str = "one", mask: bool = False) -> list[tuple[bytes, bytes]]:
    """(request, response) wire frames, size prefixes included, correlation ids 1..count."""
    if shape == "w2-fetch":
        return _fetch_frames(count)
    if shape == "w2":
        version, partitions = W2_VERSION, W2_PARTITIONS
        request = bytearray(_w2_request())
    elif shape == "w1":
        version, partitions = W2_VERSION, 1
        request = bytearray(_w2_request(1, W1_RECORDS, 0))
    else:
        version, partitions = VERSION, 1
        value = json_records(1)[0] if mask else b'{"n": 1, "name": "x"}' * 8
        request = bytearray(produce_frame("cpu-topic", value, VERSION))
    cls = schemas.response_schema(ApiKey.PRODUCE, version)
    tcls = entities.element_class(cls, "responses")
    pcls = entities.element_class(tcls, "partition_responses")
    body = encode_response(entities.build(cls, throttle_time_ms=0, responses=(
        entities.build(tcls, name="cpu-topic", partition_responses=tuple(
            entities.build(pcls, index=p, error_code=0, base_offset=5, log_append_time_ms=-1,
                           log_start_offset=0) for p in range(partitions))),)))
    out = []
    for cid in range(1, count + 1):
        struct.pack_into(">i", request, 4, cid)
        response = response_header_bytes(cid, ApiKey.PRODUCE, version) + body
        out.append((struct.pack(">i", len(request)) + bytes(request),
                    struct.pack(">i", len(response)) + response))
    return out


def _mask_chain() -> Any:
    """The mask-produce variant's chain, loaded as `sluice serve` loads it."""
    data, lines = load_yaml_text_with_lines(MASK_CONFIG, "<mask-produce>")
    specs = parse_filter_specs(data["filters"], "<mask-produce>", lines)
    return build_chain(specs)


async def _measure(rounds: int, requests: int, shape: str = "one", cold: float = 0.0,
                   mask: bool = False) -> float:
    server = ProxyServer(ProxyConfig(listen=("127.0.0.1", 0), upstream=[("127.0.0.1", 1)]))
    if mask:
        server.install_chain(_mask_chain())
    session: Any = server._new_session(lambda: ("127.0.0.1", 1), None)
    client, broker = _Transport(), _Transport()
    session._client = client
    server.admit(session)
    session._set_up(client)
    session._connecting.cancel()  # no broker to dial: the fake transport stands in
    session.broker_connected(broker)
    session._live = True
    # A few distinct workload-1 frames, sent in turn (each is ~0.8 MB).
    frames = _frames(min(requests, 8) if shape == "w1" else requests, shape, mask)
    if shape == "w2-fetch":
        learn_fetch_ids(session)
    if shape == "w1":
        # As `sluice serve` sets itself up (proxy/ops/app.py): ~0.8 MB buffers from the heap,
        # and the start-up heap frozen, so collections do not walk the benchmark's records.
        keep_batch_buffers()
        freeze_startup_heap()

    async def one(request: bytes, response: bytes) -> None:
        sent = broker.writes
        session.data_received(request)
        # A filtered request is forwarded once its job is done: inline, in a callback of
        # the loop's next turn; in the pool (while its kind learns), a few turns later.
        while broker.writes == sent and not session._ended:
            await asyncio.sleep(0)
        session.broker_data(response)

    async def pooled(request: bytes, response: bytes) -> float:
        """CPU of one request (its job inline within the read, or in the pool: the loop then
        waits in its poll, not in a busy loop, so the process's CPU is the request's) and of
        its response."""
        if cold:
            time.sleep(cold)
        started = clock()
        forwarded = broker.forwarded = loop.create_future()
        session.data_received(request)
        await forwarded
        spent = clock() - started
        if cold:
            time.sleep(cold)
        started = clock()
        session.broker_data(response)
        return spent + clock() - started

    loop = asyncio.get_running_loop()
    clock = time.process_time
    warm = min(50 if shape == "w1" else 1000, requests)
    for k in range(warm):
        await one(*frames[k % len(frames)])
    if len(frames) < requests:
        frames = [frames[k % len(frames)] for k in range(requests)]  # the same objects again
    best = float("inf")
    for _ in range(rounds):
        if mask and (shape == "w1" or cold):
            spent = 0.0
            for request, response in frames:
                spent += await pooled(request, response)
        elif mask:
            started = clock()
            for request, response in frames:
                await one(request, response)
            spent = clock() - started
        elif cold:
            spent = 0.0
            for request, response in frames:
                time.sleep(cold)  # other processes run meanwhile, as on a loaded machine
                started = clock()
                session.data_received(request)
                spent += clock() - started
                time.sleep(cold)
                started = clock()
                session.broker_data(response)
                spent += clock() - started
        else:
            started = clock()
            for request, response in frames:
                session.data_received(request)
                session.broker_data(response)
            spent = clock() - started
        best = min(best, spent / requests * 1e6)
    server.install_chain(None)
    # One write each way per request (each read holds one frame): anything else means frames
    # were held, dropped or refused.
    expected = warm + rounds * requests
    if session._ended or broker.writes != expected or client.writes != expected:
        raise RuntimeError("the connection closed or dropped frames: the figure would be wrong")
    return best


def _run_in(
    env: dict[str, str], cwd: Path | None, rounds: int, requests: int, shape: str, cold: float,
    mask: bool,
) -> float:
    result = subprocess.run(
        [sys.executable, "-m", "bench.connection_cpu", "--rounds", str(rounds),
         "--requests", str(requests), "--shape", shape, "--cold", str(cold), "--bare",
         *(["--mask"] if mask else [])],
        env=env, cwd=cwd, check=True, capture_output=True, text=True,
    )
    return float(result.stdout.split()[-1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--requests", type=int, default=20_000)
    parser.add_argument("--baseline", default="", metavar="DIR",
                        help="another Sluice source tree, measured in alternation with this one")
    parser.add_argument("--pairs", type=int, default=4, help="alternations with --baseline")
    parser.add_argument("--shape", choices=SHAPES, default="one",
                        help="one-record requests, the chunked harness's workload-1 requests "
                        "(4 000 records, uncompressed), workload 2's ~100 KB lz4 requests, or "
                        "workload 2's Fetch requests and their six-partition responses")
    parser.add_argument("--cold", type=float, default=0.0, metavar="SECONDS",
                        help="sleep before each request and response (caches go cold)")
    parser.add_argument("--mask", action="store_true",
                        help="builtin:pii-mask on produce (the mask-produce variant)")
    parser.add_argument("--bare", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.mask and args.shape not in ("one", "w1"):
        parser.error("--mask measures one-record or workload-1 requests (--shape one|w1)")
    measure = (args.rounds, args.requests, args.shape, args.cold, args.mask)
    if args.bare:
        print(f"{asyncio.run(_measure(*measure)):.3f}")
        return 0
    if not args.baseline:
        micros = asyncio.run(_measure(*measure))
        what = {"one": "one-record", "w2": "workload-2 (~100 KB, lz4)",
                "w1": f"workload-1 ({W1_RECORDS} records, ~0.8 MB)"}.get(
            args.shape, "workload-2 (6 partitions, ~300 KB lz4)")
        what += " masked" if args.mask else ""
        warmth = f", {args.cold:g} s asleep before each call" if args.cold else ""
        kind = "Fetch" if args.shape == "w2-fetch" else "Produce"
        print(f"{micros:.2f} µs CPU per {what} {kind} request and its response{warmth}")
        return 0
    source = baseline.prepare(Path(args.baseline))
    here = Path(__file__).resolve().parent.parent
    # The baseline process imports that tree's `sluice` and this checkout's `bench`.
    base_env = dict(os.environ, PYTHONPATH=f"{source.env['PYTHONPATH']}{os.pathsep}{here}")
    this_env = dict(os.environ)
    ratios = []
    for k in range(args.pairs):
        order = [("this", this_env, None), ("base", base_env, source.cwd)]
        got = {}
        for name, env, cwd in order if k % 2 == 0 else reversed(order):
            got[name] = _run_in(env, cwd, *measure)
        ratios.append(got["this"] / got["base"])
        print(f"pair {k}: this {got['this']:.2f} µs, base {got['base']:.2f} µs")
    print(f"this/base, median of per-pair ratios: {statistics.median(ratios):.3f} "
          f"(range {min(ratios):.3f}..{max(ratios):.3f})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
