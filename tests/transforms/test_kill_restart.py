"""Kill -9 a transform under load, with a second process sharing its partitions, restart it,
and check the output against the input: nothing lost; with transactions nothing twice; without
them duplicates only within the documented window (one batch per input partition).

Against Apache Kafka: the input also holds aborted transactions, which the transform must never
pass on, and the exactly-once output is read by a `read_committed` consumer, which must never
see a record of an aborted transaction (the killed process leaves one open) and must agree
with the log replayed by hand (tests/transforms/committed_log.py)."""

from __future__ import annotations

import threading
import time
from collections import Counter
from pathlib import Path

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

from sluice.transforms.config import load_transform_specs
from sluice.transforms.listing import transform_lag
from tests.e2e.clients import QUIET, create_topic, unique
from tests.harness.broker import TansuBroker
from tests.transforms.committed_log import committed_records
from tests.transforms.runner_proc import TransformProcess, write_config

PARTITIONS = 3
RECORDS = 12000
BATCH = 200


def _load(bootstrap: str, topic: str, done: threading.Event) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True,
                         "linger.ms": 5, **QUIET})
    aborter = Producer({"bootstrap.servers": bootstrap, "transactional.id": unique("aborts"),
                        **QUIET})
    aborter.init_transactions(30)
    for i in range(RECORDS):
        producer.produce(topic, f"rec-{i:06d}".encode(), f"k{i}".encode(),
                         partition=i % PARTITIONS)
        if i % 100 == 99:
            producer.poll(0)
            if i % 1000 == 999:
                # An aborted transaction in every input partition, between committed records
                # and, last of all, at the very end: the transform must commit past its marker
                # to read a lag of 0.
                aborter.begin_transaction()
                for p in range(PARTITIONS):
                    aborter.produce(topic, f"aborted-{i:06d}-{p}".encode(), partition=p)
                aborter.flush(30)
                aborter.abort_transaction(30)
            time.sleep(0.12)  # ~800 records/s: the kill lands in the middle of the load
    assert producer.flush(30) == 0
    done.set()


def _all_output(bootstrap: str, topic: str, **conf: str) -> list[tuple[int, bytes]]:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": unique("check"),
                         "enable.auto.commit": False, **QUIET, **conf})
    consumer.assign([TopicPartition(topic, p, 0) for p in range(PARTITIONS)])
    out: list[tuple[int, bytes]] = []
    idle = time.monotonic()
    while time.monotonic() - idle < 3:
        m = consumer.poll(0.2)
        if m is not None and not m.error():
            out.append((m.partition(), m.value() or b""))
            idle = time.monotonic()
    consumer.close()
    return out


def _wait_caught_up(config: Path, bootstrap: str, timeout: float = 120.0) -> None:
    spec = load_transform_specs(config)[0]
    deadline = time.monotonic() + timeout
    rows = []
    while time.monotonic() < deadline:
        rows = transform_lag(spec, bootstrap)
        # Aborted input transactions and their markers take offsets too: at least this many.
        if rows and all(r.lag == 0 and r.committed >= RECORDS // PARTITIONS for r in rows):
            return
        time.sleep(1)
    raise AssertionError(f"transform did not catch up: {rows}")


@pytest.mark.parametrize("guarantee", ["exactly-once", "at-least-once"])
def test_kill_and_restart_under_load(broker: TansuBroker, tmp_path: Path,
                                     guarantee: str) -> None:
    bs = broker.bootstrap
    src, dst = unique("lower"), unique("upper")
    create_topic(bs, src, PARTITIONS)
    create_topic(bs, dst, PARTITIONS)
    config = write_config(tmp_path, unique("t"), [src], dst, guarantee=guarantee,
                          batch_records=BATCH)
    first = TransformProcess(config, bs).start()
    second = TransformProcess(config, bs)
    restarted = TransformProcess(config, bs)
    done = threading.Event()
    load = threading.Thread(target=_load, args=(bs, src, done), daemon=True)
    try:
        load.start()
        first.wait_for("transform_assigned", 30)
        # A second process joins the group: the partitions are shared between the two.
        second.start()
        second.wait_for("transform_assigned", 30)
        first.kill9()
        assert not done.is_set(), "the load finished before the kill: make it longer"
        restarted.start()  # resumes from the committed offsets, wherever they are
        load.join(60)
        assert done.is_set()
        _wait_caught_up(config, bs)
    finally:
        for proc in (first, second, restarted):
            proc.stop()
    expected = Counter(f"REC-{i:06d}".encode() for i in range(RECORDS))
    raw = _all_output(bs, dst, **{"isolation.level": "read_uncommitted"})
    if guarantee == "exactly-once":
        values = _all_output(bs, dst, **{"isolation.level": "read_committed"})
        replayed = [(p, v) for p in range(PARTITIONS)
                    for _o, _k, v in committed_records(bs, dst, p)]
        assert sorted(values) == sorted(replayed), "read_committed differs from the log replay"
        print(f"records of aborted transactions in the log: {len(raw) - len(values)}")
    else:
        values = raw
    assert not [v for _p, v in raw if v.startswith(b"ABORTED")], "an aborted input record"
    got = Counter(v for _p, v in values)
    missing = expected - got
    assert not missing, f"{len(missing)} input records lost, e.g. {list(missing)[:5]}"
    assert set(got) == set(expected)
    # Same partition count: each record stays in its input partition.
    assert all(int(v[4:]) % PARTITIONS == p for p, v in values)
    duplicates = sum(got.values()) - RECORDS
    print(f"{guarantee}: {duplicates} duplicates after kill -9 (window {BATCH} per crash "
          "or failed commit)")
    if guarantee == "exactly-once":
        assert duplicates == 0
    else:
        # The window is one batch per crash or failed commit: one kill here, and at most two
        # rebalances (the second process joining, the first one's session expiring).
        assert duplicates <= BATCH * 3
