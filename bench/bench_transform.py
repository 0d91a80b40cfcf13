"""Transforms: throughput per guarantee, and the duplicate window after kill -9.

    python -m bench.bench_transform [--records N] [--partitions P] [--batch B]
                                    [--kills K] [--value-bytes 100]

Against a fresh bundled broker per phase, with examples/upper.wasm as the chain:

- throughput: N records of ``--value-bytes`` are written to the input first (a backlog); one
  `sluice transform run` process then transforms them. Reported: records/s from the moment the
  process has its partitions until the group's committed offsets reach the log ends (read with
  `sluice transform list`'s code every 0.5 s, so ±0.5 s), per guarantee.
- duplicates: the same backlog; the process is killed with SIGKILL ``--kills`` times, each
  time while it works through the backlog (1-2.5 s after it got its partitions), and started
  again; at the end the output is counted. Reported: records lost (must be 0), duplicates,
  and the window (``batch_records`` per crash). Exactly-once output is read with the
  committed-transactions reader of the tests (tests/transforms/committed_log.py); the raw
  count including aborted transactions, which Tansu shows to every reader, is printed too.
"""

from __future__ import annotations

import argparse
import random
import time
from collections import Counter
from pathlib import Path
from tempfile import TemporaryDirectory

from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from sluice.local_broker import TansuBroker
from sluice.transforms.config import load_transform_specs
from sluice.transforms.listing import transform_lag
from tests.transforms.committed_log import committed_records
from tests.transforms.runner_proc import TransformProcess, write_config

QUIET = {"log_level": 3}


def _backlog(bootstrap: str, topic: str, records: int, partitions: int, size: int) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20, **QUIET})
    pad = b"x" * max(0, size - 12)
    for i in range(records):
        producer.produce(topic, f"rec-{i:08d}".encode() + pad, f"k{i}".encode(),
                         partition=i % partitions)
        if i % 1000 == 0:
            producer.poll(0)
    assert producer.flush(60) == 0


def _caught_up(config: Path, bootstrap: str, records: int) -> bool:
    rows = transform_lag(load_transform_specs(config)[0], bootstrap)
    return sum(r.committed or 0 for r in rows) == records and all(r.lag == 0 for r in rows)


def _setup(broker: TansuBroker, work: Path, args: argparse.Namespace,
           guarantee: str) -> Path:
    admin = AdminClient({"bootstrap.servers": broker.bootstrap, **QUIET})
    for fut in admin.create_topics([NewTopic("lower", args.partitions, 1),
                                    NewTopic("upper", args.partitions, 1)]).values():
        fut.result(15)
    _backlog(broker.bootstrap, "lower", args.records, args.partitions, args.value_bytes)
    return write_config(work, f"bench-{guarantee}", ["lower"], "upper", guarantee=guarantee,
                        batch_records=args.batch)


def throughput(args: argparse.Namespace, guarantee: str) -> float:
    with TansuBroker() as broker, TemporaryDirectory() as tmp:
        config = _setup(broker, Path(tmp), args, guarantee)
        proc = TransformProcess(config, broker.bootstrap).start()
        try:
            proc.wait_for("transform_assigned", 60)
            started = time.monotonic()
            while not _caught_up(config, broker.bootstrap, args.records):
                time.sleep(0.5)
            return args.records / (time.monotonic() - started)
        finally:
            proc.stop()


def _output_values(bootstrap: str, partitions: int) -> list[bytes]:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "bench-read", **QUIET})
    consumer.assign([TopicPartition("upper", p, 0) for p in range(partitions)])
    out: list[bytes] = []
    idle = time.monotonic()
    while time.monotonic() - idle < 3:
        m = consumer.poll(0.2)
        if m is not None and not m.error():
            out.append((m.value() or b"")[:12])
            idle = time.monotonic()
    consumer.close()
    return out


def duplicates(args: argparse.Namespace, guarantee: str) -> dict[str, int]:
    with TansuBroker() as broker, TemporaryDirectory() as tmp:
        bs = broker.bootstrap
        config = _setup(broker, Path(tmp), args, guarantee)
        for _ in range(args.kills):
            proc = TransformProcess(config, bs).start()
            proc.wait_for("transform_assigned", 60)
            time.sleep(random.uniform(1.0, 2.5))
            proc.kill9()
            proc.stop()
        proc = TransformProcess(config, bs).start()
        try:
            while not _caught_up(config, bs, args.records):
                time.sleep(0.5)
        finally:
            proc.stop()
        raw = _output_values(bs, args.partitions)
        if guarantee == "exactly-once":
            values = [(v or b"")[:12] for p in range(args.partitions)
                      for _o, _k, v in committed_records(bs, "upper", p)]
        else:
            values = raw
        got = Counter(values)
        expected = {f"REC-{i:08d}".encode() for i in range(args.records)}
        return {"lost": len(expected - set(got)), "duplicates": sum(got.values()) - len(got),
                "raw_records_in_log": len(raw), "window_per_crash": args.batch}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=50_000)
    parser.add_argument("--partitions", type=int, default=3)
    parser.add_argument("--batch", type=int, default=500)
    parser.add_argument("--kills", type=int, default=3)
    parser.add_argument("--value-bytes", type=int, default=100)
    args = parser.parse_args()
    for guarantee in ("exactly-once", "at-least-once"):
        rate = throughput(args, guarantee)
        print(f"{guarantee:14} throughput: {rate:,.0f} records/s "
              f"({args.records} x {args.value_bytes} B, {args.partitions} partitions, "
              f"batch_records {args.batch})", flush=True)
    for guarantee in ("exactly-once", "at-least-once"):
        result = duplicates(args, guarantee)
        print(f"{guarantee:14} after {args.kills} x kill -9: {result}", flush=True)


if __name__ == "__main__":
    main()
