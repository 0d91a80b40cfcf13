"""What a middle adds to one large Fetch's round trip, and its CPU per response: the per-fetch
latency a consumer waits for, with no client library and no parse in the figure.

    python -m bench.fetch_rtt [--broker kafka] [--rounds 15] [--per 20] [--baseline DIR]

A topic of one partition is filled directly with bench.chunked's workload-1 records (~200-byte
JSON values, uncompressed). A raw client (bench/wire.py's framing) then sends Fetch v16
requests (librdkafka 2.16's version, topic by id) for offset 0 with bench.chunked's consumer
sizes (8 MiB a partition), one at a time on one connection per block, and times each from the
request's send to the response's last byte read (into one preallocated buffer). The records
are in the page cache after the first read: every response is the same ~8.4 MB.

Blocks of `--per` fetches (after 2 unmeasured) rotate over direct, `sluice` (`sluice serve`,
no filters), `relay` (HAProxy in `mode tcp`, bench/targets.py, in front of the same broker: a
raw client needs no advertised address) and, with `--baseline DIR`, `sluice@base` (that
tree's `sluice serve`), the order reversed each round. Prints per variant the median round
trip with its quartiles and the middle process's CPU per response (its CPU clock,
bench/cpu_clock.py) with the system (kernel) share from psutil's ticks, and the load average.

Why: issue 29's chunked harness read Sluice's consume below HAProxy's at less CPU per GB, and
the question was whether forwarding a Fetch response only once it is whole (store and
forward) costs the consumer, which keeps one Fetch in flight per broker, that time on every
round trip (docs/PERFORMANCE.md, *Pass-through fetch*).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import socket
import statistics
import struct
import sys
import time
import uuid
from pathlib import Path

import psutil

from bench import baseline, cpu_clock, rig, targets, workload
from bench.wire import RawConnection, fetch_request, metadata_request, request_bytes
from sluice.local_broker import free_port

#: bench/workload.py `consumer_config`'s max.partition.fetch.bytes.
PARTITION_BYTES = 8 << 20
FETCH_VERSION = 16
#: Unmeasured fetches at the start of each block (the connection's first, the proxy's set-up).
SKIP = 2
_SIZE = struct.Struct(">i")


def topic_id(bootstrap: str, topic: str) -> uuid.UUID:
    """The topic's id (Fetch v13+ names topics by id), from a Metadata v12 response."""
    with RawConnection(bootstrap) as conn:
        response = conn.call(3, 12, metadata_request(12, [topic]))
    return uuid.UUID(str(response.topics[0].topic_id))


def round_trips(bootstrap: str, topic: uuid.UUID, count: int) -> tuple[list[float], int]:
    """Seconds of `count` Fetch round trips on one new connection (after `SKIP` unmeasured),
    and the size of the last response frame."""
    host, port = bootstrap.rsplit(":", 1)
    buf = bytearray(2 * PARTITION_BYTES)
    view = memoryview(buf)
    times: list[float] = []
    need = 0
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        for i in range(count + SKIP):
            request = request_bytes(
                1, FETCH_VERSION,
                fetch_request(FETCH_VERSION, topic, 0, 0, max_bytes=PARTITION_BYTES), i + 1)
            started = time.perf_counter()
            sock.sendall(request)
            got, need = 0, 4
            while got < need:
                n = sock.recv_into(view[got:], 1 << 20)
                if not n:
                    raise ConnectionError(f"{bootstrap} closed the connection")
                got += n
                if need == 4 and got >= 4:
                    need = 4 + _SIZE.unpack_from(buf, 0)[0]
                    if need > len(buf):
                        raise RuntimeError(f"a {need}-byte response: larger than expected")
            if i >= SKIP:
                times.append(time.perf_counter() - started)
    return times, need


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--broker", choices=rig.BROKERS, default="kafka")
    ap.add_argument("--records", type=int, default=60_000, help="records in the topic")
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--per", type=int, default=20, help="measured fetches per block")
    ap.add_argument("--baseline", type=Path, help="another Sluice tree: sluice@base")
    args = ap.parse_args(argv)
    source = baseline.prepare(args.baseline) if args.baseline else None
    with contextlib.ExitStack() as stack:
        broker = stack.enter_context(rig.broker(args.broker))
        topic = workload.make_topic(broker, 1)
        workload.produce(broker, topic, workload.json_records(args.records), compression="none")
        ident = topic_id(broker, topic)
        points: dict[str, targets.Target] = {"direct": targets.Target(broker, None)}
        names = ["sluice"] + (["sluice" + rig.BASE] if source else [])
        for name in names:
            points[name] = rig.sluice_point(stack, name, broker, [], "", source).target
        if targets.haproxy_available():
            points["relay"] = stack.enter_context(targets.haproxy_relay(broker, free_port()))
        order = list(points)
        times: dict[str, list[float]] = {n: [] for n in order}
        cpu = {n: cpu_clock.NONE for n in order}
        kernel = dict.fromkeys(order, 0.0)
        size = 0
        for r in range(args.rounds):
            for name in order if r % 2 == 0 else order[::-1]:
                pid = points[name].pid
                before, sys_before = cpu_clock.cpu_times(pid), _system(pid)
                got, size = round_trips(points[name].bootstrap, ident, args.per)
                cpu[name] += cpu_clock.cpu_times(pid) - before
                kernel[name] += _system(pid) - sys_before
                times[name] += got
    count = args.rounds * (args.per + SKIP)  # the CPU covers the unmeasured fetches too
    print(f"Fetch v{FETCH_VERSION} of {size} bytes, {args.rounds} rounds of {args.per}; "
          f"load {' '.join(f'{x:.1f}' for x in os.getloadavg())}")
    print("| variant | round trip ms median (p25..p75) | added ms | middle CPU ms / response "
          "(system share) |")
    print("|---|---:|---:|---:|")
    direct = statistics.median(times["direct"])
    for name in order:
        t = sorted(times[name])
        q = statistics.quantiles(t, n=4)
        mid = statistics.median(t)
        spent = cpu[name].seconds / count * 1e3
        share = kernel[name] / cpu[name].ticks if cpu[name].ticks else 0.0
        middle = "-" if points[name].pid is None else f"{spent:.2f} ({share:.0%})"
        print(f"| {name} | {mid * 1e3:.2f} ({q[0] * 1e3:.2f}..{q[2] * 1e3:.2f}) | "
              f"{(mid - direct) * 1e3:+.2f} | {middle} |")
    return 0


def _system(pid: int | None) -> float:
    """System CPU seconds of `pid` and its children (psutil's ticks): the kernel's share."""
    if pid is None:
        return 0.0
    try:
        proc = psutil.Process(pid)
        return sum(p.cpu_times().system for p in (proc, *proc.children(recursive=True)))
    except psutil.NoSuchProcess:
        return 0.0


if __name__ == "__main__":
    sys.exit(main())
