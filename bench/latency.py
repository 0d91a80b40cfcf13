"""Produce latency at a fixed rate, measured side by side: one producer straight to the broker
and one through the target, in the same window, each in its own process.

Measured one after the other, two latency phases do not share their noise: on the shared
2-core machine the broker's own p99 moved from 4 to 72 ms between rounds, which swamps a
proxy's sub-millisecond share. Here both producers send on one schedule (record i at
start + i / rate, the same wall-clock start), so a stall of the machine or the broker lands
on both and what differs is the path. Each producer runs in its own process
(``python -m bench.latency``) so one client's librdkafka threads and delivery callbacks never
wait for the other's GIL or poll loop. Pointing both at the broker (the ``direct`` variant of
bench.bench_proxy) measures the method's own noise: the difference should be zero.

A probe connects, sends one record, prints ``ready``, reads the start time (``time.time()``
seconds) from stdin, produces, and prints one JSON object: ``sent`` (seconds after the start
each record left ``produce()``) and ``latency`` (seconds from ``produce()`` to its delivery
callback), in send order.
"""

from __future__ import annotations

import argparse
import gc
import json
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from confluent_kafka import Producer

from bench.workload import QUIET, json_records


@dataclass(frozen=True)
class Latencies:
    """One producer's records: send offsets and delivery latencies (seconds), in send order."""

    sent: list[float]
    latency: list[float]
    rate: int

    def quantile(self, q: float) -> float:
        """The q-quantile (nearest rank) of the latencies, in seconds."""
        ordered = sorted(self.latency)
        return ordered[min(len(ordered) - 1, int(len(ordered) * q))]

    def late(self, by: float = 0.001) -> float:
        """Share of records that left more than `by` seconds after they were due: a client
        that could not keep its schedule (the machine was saturated) shows here."""
        if not self.sent:
            return 0.0
        return sum(1 for i, s in enumerate(self.sent) if s - i / self.rate > by) / len(self.sent)


@dataclass(frozen=True)
class Paired:
    """One window measured both ways."""

    direct: Latencies
    via: Latencies

    def added(self, q: float) -> float:
        """Seconds the target adds at quantile q: via minus direct, same window."""
        return self.via.quantile(q) - self.direct.quantile(q)


def latency_producer(bootstrap: str) -> Producer:
    """One record per Produce request: linger 0, acks=all, no compression."""
    return Producer(
        {
            "bootstrap.servers": bootstrap,
            "linger.ms": 0,
            "acks": "all",
            "compression.type": "none",
            **QUIET,
        }
    )


def produce_at_rate(
    producer: Producer, topic: str, rate: int, seconds: float, start: float, size: int = 200
) -> Latencies:
    """Produce `rate * seconds` records, record i due at `start + i / rate` (wall clock).

    Waits without spinning and without missing the moment a delivery report arrives:
    librdkafka's poll() takes whole milliseconds (a shorter timeout is a non-blocking poll, and
    a loop of those burnt 80 % of a core at 2 000 records/s, starving the broker and the proxy
    on the 2-core machine). So while records are in flight the loop blocks in poll(1 ms),
    which returns as soon as a report is queued; with nothing in flight no report can come and
    it sleeps until the next record is due. A record whose predecessor is still unanswered at
    its due time may leave up to 1 ms late; its latency counts from when it really left. The
    cyclic GC is off in the window (nothing here makes cycles; a collection would stall the
    callbacks)."""
    value = json_records(1, size)[0]
    total = int(rate * seconds)
    sent_at = [0.0] * total
    latency: list[float | None] = [None] * total
    errors: list[str] = []
    in_flight = 0
    t0 = start + (time.perf_counter() - time.time())  # the wall-clock start on perf_counter

    def delivered(i: int, sent: float) -> Any:
        def cb(err: Any, _msg: Any) -> None:
            nonlocal in_flight
            in_flight -= 1
            if err is not None:
                errors.append(str(err))
            else:
                latency[i] = time.perf_counter() - sent

        return cb

    gc_was_enabled = gc.isenabled()
    gc.disable()
    try:
        for i in range(total):
            due = t0 + i / rate
            while (now := time.perf_counter()) < due:
                if in_flight:
                    producer.poll(0.001)
                else:
                    time.sleep(due - now)
            in_flight += 1
            producer.produce(topic, value=value, on_delivery=delivered(i, now))
            sent_at[i] = now - t0
            producer.poll(0)
        left = producer.flush(60)
    finally:
        if gc_was_enabled:
            gc.enable()
    if errors or left:
        raise RuntimeError(f"{left} undelivered, {len(errors)} deliveries failed: {errors[:3]}")
    done = [lat for lat in latency if lat is not None]
    if len(done) != total:
        raise RuntimeError(f"{total - len(done)} records have no delivery report")
    return Latencies(sent_at, done, rate)


def _probe_main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="one latency probe (driven by paired())")
    ap.add_argument("--bootstrap", required=True)
    ap.add_argument("--topic", required=True)
    ap.add_argument("--rate", type=int, required=True)
    ap.add_argument("--seconds", type=float, required=True)
    args = ap.parse_args(argv)
    producer = latency_producer(args.bootstrap)
    producer.list_topics(args.topic, timeout=10)
    # One record first, so the leader connection is open before the clock starts.
    produce_at_rate(producer, args.topic, 1, 1, time.time())
    print("ready", flush=True)
    start = float(sys.stdin.readline())
    result = produce_at_rate(producer, args.topic, args.rate, args.seconds, start)
    json.dump({"sent": result.sent, "latency": result.latency}, sys.stdout)
    sys.stdout.flush()
    return 0


def _spawn(bootstrap: str, topic: str, rate: int, seconds: float) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "bench.latency",
            "--bootstrap",
            bootstrap,
            "--topic",
            topic,
            "--rate",
            str(rate),
            "--seconds",
            str(seconds),
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )


def paired(direct: tuple[str, str], via: tuple[str, str], rate: int, seconds: float) -> Paired:
    """Produce at `rate` for `seconds` to (bootstrap, topic) `direct` and `via` at once."""
    procs = [_spawn(b, t, rate, seconds) for b, t in (direct, via)]
    try:
        for p in procs:
            assert p.stdout is not None
            line = p.stdout.readline()
            if line.strip() != "ready":
                raise RuntimeError(f"latency probe did not start (got {line!r})")
        start = time.time() + 0.2
        for p in procs:
            assert p.stdin is not None
            p.stdin.write(f"{start!r}\n")
            p.stdin.close()
        results = []
        for p in procs:
            assert p.stdout is not None
            out = p.stdout.read()  # a probe blocks on its full pipe until read: no deadlock
            if p.wait(timeout=60) != 0:
                raise RuntimeError(f"latency probe failed with exit code {p.returncode}")
            doc = json.loads(out)
            results.append(Latencies(doc["sent"], doc["latency"], rate))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    return Paired(results[0], results[1])


if __name__ == "__main__":
    raise SystemExit(_probe_main())
