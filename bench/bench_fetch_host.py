"""The host's share of a filtered Fetch, per record: the fetch path's job (scan, the pipeline
over every filtered partition, splice) against the guest's calls alone (no broker, no network,
one thread).

    python -m bench.bench_fetch_host [--workload 1,2] [--records 36000] [--batch 4000] [--rounds 5]
                                     [--threads 2] [--shapes K] [--baseline DIR]

A Fetch response (v12, what librdkafka reads) in the shape of bench_proxy's workloads holds
`--records` ~200-byte JSON records (an e-mail address and a card number in each): workload 1
one partition of uncompressed batches, workload 2 six partitions of lz4 batches, batches of
`--batch` records (the defaults: about 7.5 MB in one partition, what librdkafka's
consumer gets per Fetch in bench_proxy, `max.partition.fetch.bytes` 8 MiB). builtin:pii-mask
filters it on fetch. The process sets glibc's malloc up as `sluice serve` does
(proxy/ops/allocator.py). Rows (µs per record, median of the
rounds, thread CPU time):

- whole: `on_response`'s scan and the job the fetch path hands the pool (the filters over
  every partition, the splice into the frame), as `sluice serve` runs them;
- guest: the `sluice_filter_records` calls alone (the Wasm call, on the same sections);
- host: whole - guest;
- wall (with `--threads N`, N >= 2): the job's wall time per record on one pool thread and
  spread over a filter pool of N threads (filters/parallel.py), alternating: what the
  consumer waits for, not CPU. Workload 1 (one partition) is spread as runs of its batches
  (`pipeline.plan_fetch`); a tree without that (or without the spread) shows the same job
  twice.

`--shapes K` times K responses in turn, the batches of the k-th `--batch` + 7k records (of
values shifted by 40k records), so that batch sizes vary from batch to batch as a broker's do
(each round then times all K; the guest row, the first): a cost that depends on a size being
new, not seen in a response repeated as is, shows.

`--baseline DIR` measures another source tree (bench/baseline.py) too, in alternating fresh
processes (`--rounds` of each, 3 measurements each), and prints both.
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

from kio.schema.errors import ErrorCode

from bench.bench_codec_paths import _element
from bench.workload import json_records
from sluice.codec.compression import CODEC_LZ4, CODEC_NONE
from sluice.codec.messages import encode_response
from sluice.codec.records import BatchHeader, Record, build_batch, records_section, split_batches
from sluice.codec.schemas import response_schema
from sluice.filters.abi_sluice import RECORD_BUDGET_US
from sluice.filters.chain import FilterChain
from sluice.filters.config import FilterSpec
from sluice.filters.context import RecordContext
from sluice.filters.native_io import native_input_head
from sluice.proxy.paths import fetch as fetch_path
from sluice.proxy.paths.base import Defer

VERSION = 12
TOPIC = "bench-host"
WORKLOADS = {1: (CODEC_NONE, 1), 2: (CODEC_LZ4, 6)}


#: `--shapes`: the k-th response's batches hold `--batch` + k * _SHAPE_STEP records, of the
#: values from k * _SHAPE_SHIFT on.
_SHAPE_STEP = 7
_SHAPE_SHIFT = 40


def batches(values: list[bytes], codec: int, size: int, base: int) -> bytes:
    out = []
    for i in range(0, len(values), size):
        chunk = values[i : i + size]
        records = [Record(j, j // 50, None, v, []) for j, v in enumerate(chunk)]
        n = len(records)
        header = BatchHeader(base + i, 0, 0, 2, 0, codec, n - 1, 1_700_000_000_000,
                             1_700_000_000_000 + (n - 1) // 50, -1, -1, -1, n)  # fmt: skip
        out.append(build_batch(header, records))
    return b"".join(out)


def fetch_frame(parts: list[bytes]) -> bytes:
    cls = response_schema(1, VERSION)
    tcls = _element(cls, "responses")
    pcls = _element(tcls, "partitions")
    partitions = tuple(
        pcls(partition_index=i, error_code=ErrorCode(0), high_watermark=10**7,
             last_stable_offset=10**7, log_start_offset=0, aborted_transactions=None,
             records=records)
        for i, records in enumerate(parts)
    )
    body = encode_response(
        cls(throttle_time=datetime.timedelta(0), error_code=ErrorCode(0), session_id=7,
            responses=(tcls(topic=TOPIC, partitions=partitions),))
    )
    return b"\x00\x00\x00\x2a\x00" + body  # correlation id + empty tags (header v1)


class _Ctx:
    """The little of PathContext the fetch path reads on this response."""

    def __init__(self, chain: FilterChain) -> None:
        from sluice.codec.batch_limits import DEFAULT_BATCH_LIMITS
        from sluice.proxy.paths.topics import TopicRegistry

        self.chain = chain
        self.topics = TopicRegistry()
        self.batch_limits = DEFAULT_BATCH_LIMITS
        self.helpers: Any = None  # the filter pool to spread over (a tree without: ignored)

    def filters_on(self, direction: str) -> bool:
        return True


class _Exchange:
    def __init__(self) -> None:
        from sluice.codec.headers import RequestHeader
        from sluice.proxy.contract import ClientInfo

        self.header = RequestHeader(1, VERSION, 42, "bench", 0, True)
        self.client = ClientInfo("bench", ("broker", 9092), client_id="bench")


def whole(path: Any, ctx: Any, frame: bytes) -> Any:
    outcome = path.on_response(ctx, _Exchange(), frame)
    assert isinstance(outcome, Defer), outcome
    return outcome.job.run()


def guest_calls(chain: FilterChain, frame: bytes) -> list[Any]:
    """One closure per batch that runs the guest's `sluice_filter_records` call alone (its
    input written beforehand, outside the clock)."""
    from sluice.codec.fetch_splice import scan_fetch_response

    (f,) = chain.filters
    runner: Any = f._runner
    guest = runner.guest()
    layout = scan_fetch_response(VERSION, frame, 5)
    calls = []
    for part in layout.topics[0].partitions:
        for raw in split_batches(part.records or b"")[0]:
            plain = bytes(records_section(raw))
            ctx = RecordContext(TOPIC, part.partition, "fetch", "bench", None)
            data = native_input_head(ctx, raw.header.record_count, raw.header.base_offset,
                                     raw.header.base_timestamp) + plain
            calls.append((data, raw.header.record_count))
    native = runner._native
    alloc = runner._alloc

    def make(data: bytes, n: int) -> Any:
        def call() -> float:
            ptr = alloc(len(data)) & 0xFFFFFFFF
            guest.write(ptr, data)
            # The deadline the runner gives a batch (RECORD_BUDGET_US a record): on a loaded
            # machine a 4 000-record call can outlast the bare timeout_ms.
            guest.extra_ticks = int(n * RECORD_BUDGET_US / 1000 / guest.engine.tick_ms)
            start = time.thread_time_ns()
            try:
                native(ptr, len(data))
            finally:
                guest.extra_ticks = 0
            return time.thread_time_ns() - start

        return call

    return [make(d, n) for d, n in calls]


def _helpers(pool: Any, threads: int) -> Any:
    try:
        from sluice.filters.parallel import Helpers
    except ImportError:  # a tree without it filters on one thread
        return None
    return Helpers(pool.submit, threads)


def wall(path: Any, ctx: Any, frame: bytes, threads: int, rounds: int,
         n: int) -> tuple[float, float]:
    """Median wall µs per record of the job on one pool thread alone and spread over a pool
    of `threads` (the job's own thread is one of them, as in `sluice serve`), alternating."""
    from concurrent.futures import ThreadPoolExecutor

    spread = {False: [], True: []}  # type: dict[bool, list[float]]
    with ThreadPoolExecutor(threads) as pool:
        helpers = _helpers(pool, threads)
        try:
            ctx.helpers = helpers
            pool.submit(whole, path, ctx, frame).result()  # warm: every instance made
            for _ in range(rounds):
                for on in (False, True):
                    ctx.helpers = helpers if on else None
                    start = time.perf_counter_ns()
                    pool.submit(whole, path, ctx, frame).result()
                    spread[on].append((time.perf_counter_ns() - start) / n / 1000)
        finally:
            ctx.helpers = None
    return statistics.median(spread[False]), statistics.median(spread[True])


def measure(workload: int, records: int, batch: int, rounds: int,
            threads: int = 1, shapes: int = 1) -> tuple[float, float, tuple[float, float] | None]:
    codec, partitions = WORKLOADS[workload]
    pool = json_records(records + _SHAPE_SHIFT * (shapes - 1))
    frames = []
    for s in range(shapes):
        values = pool[_SHAPE_SHIFT * s : _SHAPE_SHIFT * s + records]
        per = len(values) // partitions
        parts = [batches(values[k * per : (k + 1) * per], codec, batch + _SHAPE_STEP * s,
                         1000 * k)
                 for k in range(partitions)]  # fmt: skip
        frames.append(fetch_frame(parts))
    frame = frames[0]
    n = (records // partitions) * partitions
    spec = FilterSpec(name="mask-pii", module="builtin:pii-mask", config={}, topics=("bench-*",),
                      apply_to=frozenset({"fetch"}))  # fmt: skip
    chain = FilterChain.from_specs([spec])
    try:
        path = fetch_path.FetchPath()
        ctx = _Ctx(chain)
        whole(path, ctx, frame)  # warm
        calls = guest_calls(chain, frame)
        wholes, guests = [], []
        for _ in range(rounds):
            start = time.thread_time_ns()
            for each in frames:
                whole(path, ctx, each)
            wholes.append((time.thread_time_ns() - start) / n / len(frames) / 1000)
            guests.append(sum(c() for c in calls) / n / 1000)
        walled = wall(path, ctx, frame, threads, rounds, n) if threads > 1 else None
        return statistics.median(wholes), statistics.median(guests), walled
    finally:
        chain.close()


def _run_tree(tree: Path | None, source: Any, argv: list[str]
              ) -> tuple[float, float, tuple[float, float] | None]:
    """One measurement in a fresh process of this checkout (`tree` None) or of the
    baseline's prepared `source`: (whole, guest, wall) µs per record."""
    cmd = [sys.executable, "-m", "bench.bench_fetch_host", *argv, "--json"]
    if tree is None:
        done = subprocess.run(cmd, check=True, capture_output=True, text=True,
                              cwd=Path(__file__).resolve().parent.parent)
    else:
        here = str(Path(__file__).resolve().parent.parent)
        env = dict(os.environ, PYTHONPATH=f"{source.env['PYTHONPATH']}{os.pathsep}{here}")
        done = subprocess.run(cmd, check=True, capture_output=True, text=True, cwd=source.cwd,
                              env=env)
    got = json.loads(done.stdout.strip().splitlines()[-1])
    walls = got.get("wall")
    return got["whole"], got["guest"], None if walls is None else (walls[0], walls[1])


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workload", default="1,2")
    ap.add_argument("--records", type=int, default=36_000)
    ap.add_argument("--batch", type=int, default=4000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1,
                    help="also time the job's wall clock with a filter pool of this many "
                         "threads (2: proxy.filter_threads' default)")
    ap.add_argument("--shapes", type=int, default=1,
                    help="time this many responses in turn, of batches of different sizes")
    ap.add_argument("--baseline", type=Path, default=None,
                    help="another Sluice source tree (bench/baseline.py): measured in "
                         "alternating processes with this one, --rounds times each")
    ap.add_argument("--json", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    numbers = [int(x) for x in args.workload.split(",")]
    try:  # as `sluice serve` sets it up (a tree without it: glibc's defaults)
        from sluice.proxy.ops.allocator import keep_batch_buffers
    except ImportError:
        pass
    else:
        keep_batch_buffers()
    if args.baseline is not None:
        from bench import baseline

        source = baseline.prepare(args.baseline)
        for w in numbers:
            one = ["--workload", str(w), "--records", str(args.records), "--batch",
                   str(args.batch), "--rounds", "3", "--threads", str(args.threads),
                   "--shapes", str(args.shapes)]
            got: dict[str, list[tuple[float, float, tuple[float, float] | None]]] = {
                "this": [], "base": []}
            for _ in range(args.rounds):
                got["base"].append(_run_tree(args.baseline, source, one))
                got["this"].append(_run_tree(None, None, one))
            for name in ("base", "this"):
                whole_us = statistics.median(x for x, _, _ in got[name])
                guest_us = statistics.median(g for _, g, _ in got[name])
                walls = [v for _, _, v in got[name] if v is not None]
                shown = (f", wall on 1 / {args.threads} threads "
                         f"{statistics.median(a for a, _ in walls):.3f} / "
                         f"{statistics.median(b for _, b in walls):.3f}" if walls else "")
                print(f"workload {w} {name}: whole {whole_us:.3f} µs/record, guest "
                      f"{guest_us:.3f}, host {whole_us - guest_us:.3f}{shown}")
        return
    for w in numbers:
        all_us, guest_us, wall_us = measure(w, args.records, args.batch, args.rounds,
                                            args.threads, args.shapes)
        if args.json:
            print(json.dumps({"whole": all_us, "guest": guest_us, "wall": wall_us}))
        else:
            shown = ("" if wall_us is None else
                     f", wall on 1 / {args.threads} threads {wall_us[0]:.3f} / {wall_us[1]:.3f}")
            print(f"workload {w}: whole {all_us:.3f} µs/record, guest {guest_us:.3f}, "
                  f"host {all_us - guest_us:.3f}{shown}")


if __name__ == "__main__":
    main()
