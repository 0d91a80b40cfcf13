"""CPU per byte of a large unfiltered Fetch response through the real session, read the way the
event loop reads a socket: what the proxy's own code costs per GB on the consume side, with
no kernel and no scheduler in the figure.

    python -m bench.fetch_reads [--shape w1|w2] [--responses 200] [--rounds 5] [--baseline DIR]

Each response is delivered in wake-ups of `--wake` bytes (256 000 by default: what the
receive low-water mark lets in at a time, `proxy/net/low_water.py`), and within a wake-up as
uvloop reads: for a plain protocol, reads of up to 256 000 bytes into its own buffer, each
copied into a `bytes` handed to `data_received`; for a buffered protocol, reads into the
buffer `get_buffer` returns, again while a read fills the buffer. The copy the kernel makes
into the buffer read into is made here too (a `memoryview` assignment), on both sides, so
the two compare what the proxy adds to it. `--shape w1`: bench.chunked's consume side (one
partition, ~1 MB responses of ~200-byte JSON records, uncompressed); `w2`: workload 2's six
partitions of lz4 batches (`bench.connection_cpu --shape w2-fetch`).

With `--baseline DIR` the same measurement runs in alternating processes of this checkout and
of that tree (as `bench.connection_cpu --baseline`), and the median of per-pair ratios is
printed. Prints µs of CPU (process time) per response and s per GB of response bytes.
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
import tempfile
import time
from pathlib import Path
from typing import Any

from bench import baseline
from bench.connection_cpu import (
    W2_FETCH_TOPIC_ID,
    W2_FETCH_VERSION,
    _fetch_frames,
    _Transport,
    learn_fetch_ids,
)
from bench.workload import json_records
from sluice.codec import entities, schemas
from sluice.codec.headers import response_header_bytes
from sluice.codec.messages import ApiKey, encode_response
from sluice.codec.records import BatchHeader, Record, build_batch
from sluice.proxy.net import session as session_module
from sluice.proxy.net.server import ProxyServer
from sluice.proxy.ops.allocator import keep_batch_buffers
from sluice.proxy.ops.config import ProxyConfig

#: uvloop's read size for a plain protocol (its receive buffer).
UVLOOP_READ = 256_000
W1_RECORDS = 5000  # ~1.1 MB: a consumer's 1 MiB per partition, as bench.chunked reads it


def _w1_frames(count: int) -> list[tuple[bytes, bytes]]:
    """Workload-2-shaped Fetch requests answered with one partition of one uncompressed
    ~1 MB batch (the chunked harness's consume side)."""
    requests = _fetch_frames(count)
    values = json_records(W1_RECORDS)
    now = int(time.time() * 1000)
    cls = schemas.response_schema(ApiKey.FETCH, W2_FETCH_VERSION)
    tcls = entities.element_class(cls, "responses")
    pcls = entities.element_class(tcls, "partitions")
    header = BatchHeader(100, 0, 0, 2, 0, 0, len(values) - 1, now, now, -1, -1, -1, len(values))
    batch = build_batch(header, [Record(0, i, None, v, []) for i, v in enumerate(values)])
    body = encode_response(entities.build(
        cls, throttle_time=datetime.timedelta(0), error_code=0, session_id=0,
        responses=(entities.build(tcls, topic_id=W2_FETCH_TOPIC_ID, partitions=(
            entities.build(pcls, partition_index=0, error_code=0,
                           high_watermark=100 + len(values), last_stable_offset=100 + len(values),
                           log_start_offset=0, aborted_transactions=None,
                           preferred_read_replica=-1, records=batch),)),),
    ))
    out = []
    for cid, (request, _) in enumerate(requests, 1):
        response = response_header_bytes(cid, ApiKey.FETCH, W2_FETCH_VERSION) + body
        out.append((request, struct.pack(">i", len(response)) + response))
    return out


def _deliver(session: Any, side: Any, response: bytes, wake: int, recv: memoryview) -> None:
    """`response` as the loop reads it: wake-ups of `wake` bytes, reads as uvloop makes them."""
    view = memoryview(response)
    pos, end = 0, len(response)
    buffered = hasattr(side, "get_buffer")
    while pos < end:
        available = min(wake, end - pos)
        while available:
            if buffered:
                buf = side.get_buffer(-1)
                n = min(len(buf), available)
                buf[:n] = view[pos : pos + n]  # the kernel's copy
                side.buffer_updated(n)
                full = n == len(buf)
            else:
                n = min(UVLOOP_READ, available)
                recv[:n] = view[pos : pos + n]  # the kernel's copy
                session.broker_data(bytes(recv[:n]))  # uvloop's copy into a bytes
                full = n == UVLOOP_READ
            pos += n
            available -= n
            if not full:
                break  # a read that did not fill its buffer ends the wake-up (libuv)


async def _measure(shape: str, responses: int, rounds: int, wake: int) -> tuple[float, int]:
    keep_batch_buffers()  # as `sluice serve` sets itself up
    server = ProxyServer(ProxyConfig(listen=("127.0.0.1", 0), upstream=[("127.0.0.1", 1)]))
    session: Any = server._new_session(lambda: ("127.0.0.1", 1), None)
    client, broker = _Transport(), _Transport()
    session._client = client
    server.admit(session)
    session._set_up(client)
    session._connecting.cancel()
    session.broker_connected(broker)
    session._live = True
    learn_fetch_ids(session)
    side = session_module._BrokerSide(session)
    frames = (_w1_frames if shape == "w1" else _fetch_frames)(8)
    recv = memoryview(bytearray(UVLOOP_READ))
    clock = time.process_time
    best = float("inf")
    for r in range(rounds + 1):
        started = clock()
        for k in range(responses):
            request, response = frames[k % len(frames)]
            session.data_received(request)
            _deliver(session, side, response, wake, recv)
        spent = (clock() - started) / responses
        if r:  # the first round warms up
            best = min(best, spent)
    if session._ended or client.writes != broker.writes:
        raise RuntimeError("the connection closed or dropped frames: the figure would be wrong")
    return best * 1e6, len(frames[0][1])


def _run_in(env: dict[str, str], cwd: str, args: argparse.Namespace) -> float:
    result = subprocess.run(
        [sys.executable, "-m", "bench.fetch_reads", "--bare", "--shape", args.shape,
         "--responses", str(args.responses), "--rounds", str(args.rounds),
         "--wake", str(args.wake)],
        env=env, cwd=cwd, check=True, capture_output=True, text=True)
    return float(result.stdout.split()[0])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shape", choices=("w1", "w2"), default="w1")
    parser.add_argument("--responses", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--wake", type=int, default=256_000)
    parser.add_argument("--baseline", type=Path)
    parser.add_argument("--pairs", type=int, default=6)
    parser.add_argument("--bare", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.bare:
        us, size = asyncio.run(_measure(args.shape, args.responses, args.rounds, args.wake))
        print(f"{us:.2f} {size}")
        return 0
    if args.baseline is None:
        us, size = asyncio.run(_measure(args.shape, args.responses, args.rounds, args.wake))
        print(f"{args.shape}: {size} bytes a response, {us:.1f} µs of CPU per response, "
              f"{us / size * 1e3:.3f} s per GB")
        return 0
    source = baseline.prepare(args.baseline)
    # This checkout's bench package beside the baseline's `sluice` (the shim's directory).
    here = Path(__file__).resolve().parent
    mine = tempfile.mkdtemp(prefix="fetch-reads-")
    os.symlink(here, Path(mine) / "bench")
    ours = dict(os.environ)
    theirs = dict(os.environ, PYTHONPATH=f"{mine}{os.pathsep}{source.env['PYTHONPATH']}")
    ratios, a, b = [], [], []
    for pair in range(args.pairs):
        order = [(True, ours), (False, theirs)]
        if pair % 2:
            order.reverse()
        got = {}
        for this, env in order:
            got[this] = _run_in(env, str(source.cwd) if not this else str(here.parent), args)
        a.append(got[True])
        b.append(got[False])
        ratios.append(got[True] / got[False])
        print(f"pair {pair + 1}: this {got[True]:.1f} µs, baseline {got[False]:.1f} µs, "
              f"{ratios[-1]:.3f}", flush=True)
    print(f"{args.shape}: this / baseline {statistics.median(ratios):.3f} "
          f"({min(ratios):.3f}..{max(ratios):.3f}); µs per response {min(a):.1f}..{max(a):.1f} "
          f"against {min(b):.1f}..{max(b):.1f}; load {os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
