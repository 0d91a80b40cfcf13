"""The host's share of a masked Produce, per record: the produce path's job (the pipeline over
the request's filtered partition) and the splice of its output into the frame, against the
guest's calls alone (no broker, no network, one thread).

    python -m bench.bench_produce_host [--records 4000] [--rounds 30] [--baseline DIR]

A Produce request (v9) in the shape the chunked harness's producer sends (bench/chunked.py,
workload 1: librdkafka with linger.ms=5 sends ~4 000 records per request) holds one
uncompressed batch of `--records` ~200-byte JSON records (an e-mail address and a card
number in each) for one partition; builtin:pii-mask filters it on produce. The process sets
glibc's malloc up as `sluice serve` does (proxy/ops/allocator.py). Rows (µs per record,
median of the rounds, thread CPU time):

- whole: the job `ProducePath` hands the pool (`_filter_request`: CRC, records checks, the
  guest call, the new batch) and the splice of its result into the frame;
- guest: the `sluice_filter_records` call alone (its input written, outside the clock);
- host: whole - guest.

`--baseline DIR` measures another source tree (bench/baseline.py) too, in alternating fresh
processes (`--rounds` of each), and prints both.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bench.workload import json_records
from sluice.codec import entities, schemas
from sluice.codec.headers import parse_request_header, request_header_bytes
from sluice.codec.messages import ApiKey, encode_request
from sluice.codec.produce_splice import scan_produce_request
from sluice.codec.records import BatchHeader, Record, build_batch
from sluice.filters.abi_sluice import RECORD_BUDGET_US
from sluice.filters.chain import FilterChain
from sluice.filters.config import FilterSpec
from sluice.filters.context import RecordContext
from sluice.filters.native_io import native_input_head
from sluice.proxy.paths import produce as produce_path

try:  # what the produce path forwards: the splice's pieces, never joined
    from sluice.codec.produce_splice import splice_produce_pieces as _splice
except ImportError:  # a tree before that joins them
    from sluice.codec.produce_splice import (  # type: ignore[assignment]
        splice_produce_records as _splice,
    )

VERSION = 9
TOPIC = "bench-host"
BASE_TS = 1_700_000_000_000


def produce_frame(values: list[bytes]) -> tuple[bytes, bytes]:
    """(the request frame, its one batch)."""
    n = len(values)
    records = [Record(i, i // 50, None, v, []) for i, v in enumerate(values)]
    batch = build_batch(BatchHeader(0, 0, -1, 2, 0, 0, n - 1, BASE_TS, BASE_TS + (n - 1) // 50,
                                    -1, -1, -1, n), records)
    cls = schemas.request_schema(ApiKey.PRODUCE, VERSION)
    tcls = entities.element_class(cls, "topic_data")
    pcls = entities.element_class(tcls, "partition_data")
    request = entities.build(
        cls, transactional_id=None, acks=-1, timeout=datetime.timedelta(seconds=5),
        topic_data=(entities.build(tcls, name=TOPIC, partition_data=(
            entities.build(pcls, index=0, records=batch),)),),
    )
    head = request_header_bytes(ApiKey.PRODUCE, VERSION, 7, "bench")
    return head + encode_request(request), batch


def whole(chain: FilterChain, frame: bytes) -> Any:
    """The job and the splice, as the produce path runs them for this request: the frame's
    pieces where the tree forwards them unjoined (a baseline tree without: joined)."""
    header = parse_request_header(frame)
    view = memoryview(frame)
    layout = scan_produce_request(VERSION, view[header.header_size:])
    result = produce_path._filter_request(chain, layout, [TOPIC], (True,), "bench", None)
    assert result.replaced and not result.drop, "pii-mask rewrote nothing"
    return _splice(view[header.header_size:], layout, result.replaced, result.drop,
                   prefix=view[: header.header_size])


def guest_call(chain: FilterChain, batch: bytes, n: int) -> Any:
    """A closure that runs the guest's `sluice_filter_records` call alone (its input written
    beforehand, outside the clock) and returns the thread CPU ns of the call."""
    (f,) = chain.filters
    runner: Any = f._runner
    guest = runner.guest()
    ctx = RecordContext(TOPIC, 0, "produce", "bench", None)
    data = native_input_head(ctx, n, 0, BASE_TS) + batch[61:]
    native = runner._native
    alloc = runner._alloc

    def call() -> int:
        ptr = alloc(len(data)) & 0xFFFFFFFF
        guest.write(ptr, data)
        # The deadline the runner gives a batch (RECORD_BUDGET_US a record), as in the job.
        guest.extra_ticks = int(n * RECORD_BUDGET_US / 1000 / guest.engine.tick_ms)
        start = time.thread_time_ns()
        try:
            native(ptr, len(data))
        finally:
            guest.extra_ticks = 0
        return time.thread_time_ns() - start

    return call


def measure(records: int, rounds: int) -> tuple[float, float]:
    values = json_records(records)
    frame, batch = produce_frame(values)
    spec = FilterSpec(name="mask-pii", module="builtin:pii-mask", config={}, topics=("bench-*",),
                      apply_to=frozenset({"produce"}))  # fmt: skip
    chain = FilterChain.from_specs([spec])
    try:
        whole(chain, frame)  # warm
        call = guest_call(chain, batch, records)
        wholes, guests = [], []
        for _ in range(rounds):
            start = time.thread_time_ns()
            whole(chain, frame)
            wholes.append((time.thread_time_ns() - start) / records / 1000)
            guests.append(call() / records / 1000)
        return statistics.median(wholes), statistics.median(guests)
    finally:
        chain.close()


def _run_tree(tree: Path | None, source: Any, argv: list[str]) -> tuple[float, float]:
    """One measurement in a fresh process of this checkout (`tree` None) or of the
    baseline's prepared `source`: (whole, guest) µs per record."""
    cmd = [sys.executable, "-m", "bench.bench_produce_host", *argv, "--json"]
    here = str(Path(__file__).resolve().parent.parent)
    if tree is None:
        done = subprocess.run(cmd, check=True, capture_output=True, text=True, cwd=here)
    else:
        env = dict(os.environ, PYTHONPATH=f"{source.env['PYTHONPATH']}{os.pathsep}{here}")
        done = subprocess.run(cmd, check=True, capture_output=True, text=True, cwd=source.cwd,
                              env=env)
    got = json.loads(done.stdout.strip().splitlines()[-1])
    return got["whole"], got["guest"]


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--records", type=int, default=4000)
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--baseline", type=Path, default=None,
                    help="another Sluice source tree (bench/baseline.py): measured in "
                         "alternating processes with this one, --rounds times each")
    ap.add_argument("--json", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    try:  # as `sluice serve` sets it up (a tree without it: glibc's defaults)
        from sluice.proxy.ops.allocator import keep_batch_buffers
    except ImportError:
        pass
    else:
        keep_batch_buffers()
    if args.baseline is not None:
        from bench import baseline

        source = baseline.prepare(args.baseline)
        one = ["--records", str(args.records), "--rounds", "15"]
        got: dict[str, list[tuple[float, float]]] = {"this": [], "base": []}
        for _ in range(args.rounds):
            got["base"].append(_run_tree(args.baseline, source, one))
            got["this"].append(_run_tree(None, None, one))
        hosts = {k: [w - g for w, g in v] for k, v in got.items()}
        for name in ("base", "this"):
            whole_us = statistics.median(w for w, _ in got[name])
            guest_us = statistics.median(g for _, g in got[name])
            print(f"{name}: whole {whole_us:.3f} µs/record, guest {guest_us:.3f}, host "
                  f"{statistics.median(hosts[name]):.3f} (per-process ranges: whole "
                  f"{min(w for w, _ in got[name]):.3f}..{max(w for w, _ in got[name]):.3f})")
        ratios = sorted(t / b for t, b in zip(hosts["this"], hosts["base"], strict=True))
        print(f"host this/base per pair: median {statistics.median(ratios):.2f} "
              f"({ratios[0]:.2f}..{ratios[-1]:.2f})")
        return
    whole_us, guest_us = measure(args.records, args.rounds)
    if args.json:
        print(json.dumps({"whole": whole_us, "guest": guest_us}))
    else:
        print(f"whole {whole_us:.3f} µs/record, guest {guest_us:.3f}, "
              f"host {whole_us - guest_us:.3f}")


if __name__ == "__main__":
    main()
