"""One side of bench.chunked: a client process that lives for the whole run.

It holds one confluent-kafka producer, created once and kept (its connections, metadata and
librdkafka threads stay up between chunks, as in an application that produces all day), and
for every consume chunk it creates a fresh consumer. Each side of a pair runs in its own
process (``python -m bench.chunk_client``), so one side's Python heap, GIL and idle
librdkafka threads never slow the other.

The parent drives it with JSON lines on stdin; the child answers each with one JSON line on
stdout (``{"error": ...}`` when a step failed; the child then exits):

- ``{"op": "prepare", "topic": T}``: learn T's metadata and deliver one record to it, untimed,
  so the chunk that follows starts with the leader's connection and the topic's metadata known.
- ``{"op": "produce", "topic": T, "records": N}``: produce N of the ~200-byte JSON values
  (bench.workload.json_records) and flush; timed from the first produce() to flush()'s return,
  and the part of it after the last produce() (``tail``: only the requests in flight then).
- ``{"op": "consume", "topic": T, "records": N}``: a fresh batch-API consumer reads N records
  from offset 0 of every partition of T; timed from the moment its first record is returned
  (a first consume() for one record) to its last record, over the records after the first
  (connection set-up and the first fetch's wait are not counted).

Every answer carries ``seconds`` (the timed wall-clock span), ``records`` (counted in it),
``cpu`` (CPU seconds of the whole process in the span: the Python thread and librdkafka's)
and ``thread_cpu`` (CPU seconds of the Python thread alone). ``thread_cpu / seconds`` near 1
means the Python thread was never idle: the client, not the path, set the pace.

With ``--shapes`` the client also turns on librdkafka's statistics (every 100 ms) and adds to
each answer the requests it sent in the span (``requests``: Produce or Fetch) and their mean
round trip (``rtt_us``): records per request and round trip show whether a path changed the
shape of the traffic (a slower round trip lets the producer's batches fill up; a proxy can
answer a Fetch with less than the broker would). Off by default: it costs the client a little.

Delivery reports are asked for errors only (``delivery.report.only.error``): a Python callback
per record adds client CPU to every record. ``--reports`` turns them on, as
bench.workload.produce has them, to see what that client cost does to a ratio.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import IO, Any

from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition

from bench import workload

#: Records a consume() call asks for at most (bench.workload.consume's batch).
BATCH = 10_000
TIMEOUT = 120.0


@dataclass(frozen=True)
class Timed:
    """One chunk as a side measured it."""

    records: int
    seconds: float
    cpu: float
    thread_cpu: float
    requests: int = 0  # with --shapes: Produce or Fetch requests in the span
    rtt_us: float = 0.0  # with --shapes: their mean round trip
    #: produce only: seconds from the last produce() call's return to flush()'s (the tail,
    #: when only requests already built are in flight; the rest of `seconds` is the loop
    #: that hands records to librdkafka, which never blocks: its queue holds a chunk)
    tail: float = 0.0

    @property
    def records_per_request(self) -> float:
        return self.records / self.requests if self.requests else 0.0

    @property
    def rate(self) -> float:
        return self.records / self.seconds if self.seconds > 0 else 0.0

    @property
    def cpu_us_per_record(self) -> float:
        return 1e6 * self.cpu / self.records if self.records else 0.0

    @property
    def busy(self) -> float:
        """Share of the span the Python thread spent on a CPU."""
        return self.thread_cpu / self.seconds if self.seconds > 0 else 0.0


@dataclass(frozen=True)
class _Stats:
    """What one librdkafka statistics event says: requests so far of one kind (cumulative),
    and the round trips in its window (since the event before)."""

    requests: int
    rtt_sum: int
    rtt_count: int


class _Shapes:
    """The statistics events of one client, kept when --shapes is on."""

    def __init__(self, request: str) -> None:
        self.request = request  # "Produce" or "Fetch"
        self.events: list[_Stats] = []

    def config(self) -> dict[str, Any]:
        return {"statistics.interval.ms": 100, "stats_cb": self._event}

    def _event(self, text: str) -> None:
        brokers = [b for b in json.loads(text)["brokers"].values() if b.get("nodeid", -1) >= 0]
        self.events.append(
            _Stats(
                sum(b["req"].get(self.request, 0) for b in brokers),
                sum(b["rtt"]["sum"] for b in brokers),
                sum(b["rtt"]["cnt"] for b in brokers),
            )
        )

    def fresh(self, poll: Any) -> int:
        """Wait (calling `poll`) for the next event; the index of the last event."""
        seen = len(self.events)
        deadline = time.monotonic() + 2.0
        while len(self.events) == seen and time.monotonic() < deadline:
            poll(0.05)
        return len(self.events) - 1

    def since(self, first: int, last: int) -> dict[str, Any]:
        """Requests and mean round trip between events `first` (-1: none) and `last`."""
        if last < 0:
            return {}
        window = self.events[first + 1 : last + 1]
        count = sum(e.rtt_count for e in window)
        base = self.events[first].requests if first >= 0 else 0
        return {
            "requests": self.events[last].requests - base,
            "rtt_us": sum(e.rtt_sum for e in window) / count if count else 0.0,
        }


class _Side:
    """The child's state: the long-lived producer and the values it sends."""

    def __init__(
        self, bootstrap: str, chunk: int, compression: str, shapes: bool, reports: bool
    ) -> None:
        self.bootstrap = bootstrap
        self.values = workload.json_records(chunk)
        self.errors: list[str] = []
        self.shapes = shapes
        self.produce_shapes = _Shapes("Produce")
        config = workload.producer_config(bootstrap, chunk, compression)
        config["delivery.report.only.error"] = not reports
        config["on_delivery"] = self._delivered
        if shapes:
            config.update(self.produce_shapes.config())
        self.producer = Producer(config)
        self.producer.list_topics(timeout=20)  # connected before the first command

    def _delivered(self, err: Any, _msg: Any) -> None:
        if err is not None:
            self.errors.append(str(err))

    def _flush(self) -> None:
        left = self.producer.flush(TIMEOUT)
        if left or self.errors:
            errors, self.errors = self.errors, []
            raise RuntimeError(f"{left} records not delivered, {len(errors)} failed: {errors[:2]}")

    def prepare(self, topic: str) -> dict[str, Any]:
        self.producer.list_topics(topic, timeout=20)
        self.producer.produce(topic, value=self.values[0])
        self._flush()
        return {}

    def produce(self, topic: str, records: int) -> dict[str, Any]:
        if not 0 < records <= len(self.values):
            raise ValueError(f"records must be 1..{len(self.values)}, not {records}")
        values = self.values[:records]
        produce = self.producer.produce
        before = self.produce_shapes.fresh(self.producer.poll) if self.shapes else -1
        cpu0, thread0, t0 = time.process_time(), time.thread_time(), time.perf_counter()
        for v in values:
            produce(topic, value=v)
        looped = time.perf_counter()
        self._flush()
        t1, thread1, cpu1 = time.perf_counter(), time.thread_time(), time.process_time()
        answer = _answer(records, t1 - t0, cpu1 - cpu0, thread1 - thread0)
        answer["tail"] = t1 - looped
        if self.shapes:
            after = self.produce_shapes.fresh(self.producer.poll)
            answer.update(self.produce_shapes.since(before, after))
        return answer

    def consume(self, topic: str, records: int) -> dict[str, Any]:
        shapes = _Shapes("Fetch")
        consumer = Consumer(
            {**workload.consumer_config(self.bootstrap), **(shapes.config() if self.shapes else {})}
        )
        try:
            md = consumer.list_topics(topic, timeout=20)
            consumer.assign([TopicPartition(topic, p, 0) for p in md.topics[topic].partitions])
            got = 0
            started: tuple[float, float, float] | None = None
            first = 0
            deadline = time.monotonic() + TIMEOUT
            while got < records and time.monotonic() < deadline:
                # Until the first record, ask for one: consume() returns as soon as it is
                # there, and the clock starts then.
                want = 1 if started is None else min(BATCH, records - got)
                batch = consumer.consume(num_messages=want, timeout=0.5)
                for m in batch:
                    err = m.error()
                    if err is not None:
                        raise KafkaException(err)
                got += len(batch)
                if started is None and batch:
                    started = (time.process_time(), time.thread_time(), time.perf_counter())
                    first = got
            t1, thread1, cpu1 = time.perf_counter(), time.thread_time(), time.process_time()
            if got < records or started is None:
                raise RuntimeError(f"consumed {got}/{records} records of {topic} in {TIMEOUT} s")
            cpu0, thread0, t0 = started
            answer = _answer(got - first, t1 - t0, cpu1 - cpu0, thread1 - thread0)
            if self.shapes:
                # Every Fetch of this consumer, the few before its first record included.
                answer.update(shapes.since(-1, shapes.fresh(consumer.poll)))
            return answer
        finally:
            consumer.close()


def _answer(records: int, seconds: float, cpu: float, thread_cpu: float) -> dict[str, Any]:
    return {"records": records, "seconds": seconds, "cpu": cpu, "thread_cpu": thread_cpu}


def _serve(side: _Side, lines: IO[str], out: IO[str]) -> int:
    for line in lines:
        cmd = json.loads(line)
        op = cmd.get("op")
        try:
            if op == "quit":
                return 0
            if op == "prepare":
                answer = side.prepare(cmd["topic"])
            elif op == "produce":
                answer = side.produce(cmd["topic"], int(cmd["records"]))
            elif op == "consume":
                answer = side.consume(cmd["topic"], int(cmd["records"]))
            else:
                raise ValueError(f"unknown op {op!r}")
        except Exception as e:  # reported to the parent, which fails the run with it
            out.write(json.dumps({"error": f"{op}: {type(e).__name__}: {e}"}) + "\n")
            out.flush()
            return 1
        out.write(json.dumps(answer) + "\n")
        out.flush()
    return 0


def _main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="one long-lived side of bench.chunked")
    ap.add_argument("--bootstrap", required=True)
    ap.add_argument("--chunk", type=int, required=True)
    ap.add_argument("--compression", default="none")
    ap.add_argument("--shapes", action="store_true", help="count requests and round trips")
    ap.add_argument("--reports", action="store_true", help="a delivery callback per record")
    args = ap.parse_args(argv)
    side = _Side(args.bootstrap, args.chunk, args.compression, args.shapes, args.reports)
    print(json.dumps({"ready": True}), flush=True)
    code = _serve(side, sys.stdin, sys.stdout)
    side.producer.flush(10)
    return code


class ChunkClient:
    """The parent's handle on one side process."""

    def __init__(
        self,
        bootstrap: str,
        chunk: int,
        compression: str = "none",
        shapes: bool = False,
        reports: bool = False,
    ) -> None:
        self.bootstrap = bootstrap
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "bench.chunk_client",
                "--bootstrap",
                bootstrap,
                "--chunk",
                str(chunk),
                "--compression",
                compression,
                *(["--shapes"] if shapes else []),
                *(["--reports"] if reports else []),
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            self._read()
        except BaseException:
            self.close()
            raise

    @property
    def pid(self) -> int:
        return self.proc.pid

    def _read(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            code = self.proc.wait(timeout=10)
            raise RuntimeError(f"chunk client for {self.bootstrap} exited ({code})")
        answer: dict[str, Any] = json.loads(line)
        if "error" in answer:
            raise RuntimeError(f"chunk client for {self.bootstrap}: {answer['error']}")
        return answer

    def _call(self, **cmd: Any) -> dict[str, Any]:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(cmd) + "\n")
        self.proc.stdin.flush()
        return self._read()

    def prepare(self, topic: str) -> None:
        self._call(op="prepare", topic=topic)

    def produce(self, topic: str, records: int) -> Timed:
        return Timed(**self._call(op="produce", topic=topic, records=records))

    def consume(self, topic: str, records: int) -> Timed:
        return Timed(**self._call(op="consume", topic=topic, records=records))

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                assert self.proc.stdin is not None
                self.proc.stdin.write(json.dumps({"op": "quit"}) + "\n")
                self.proc.stdin.close()
                self.proc.wait(timeout=20)
            except (OSError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait()

    def __enter__(self) -> ChunkClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


if __name__ == "__main__":
    raise SystemExit(_main())
