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

`--workload 2`: the request as bench_proxy's workload 2 sends it (lz4; librdkafka's sticky
partitioner puts ~2 800 records, ~93 KB on the wire, in one or two partitions' batches):
`--partitions` batches (default 2) of `--records` / `--partitions` records each, every one an
LZ4 frame as librdkafka writes it (level 0, independent 64 KiB blocks, no checksums). The
guest row then times each batch's call on its section, decompressed beforehand.

`--baseline DIR` measures another source tree (bench/baseline.py) too, in alternating fresh
processes (`--rounds` of each), and prints both.
"""

from __future__ import annotations

import argparse
import ctypes
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
from sluice.codec import entities, lz4_frame, schemas
from sluice.codec import records as records_module
from sluice.codec.compression import CODEC_LZ4
from sluice.codec.headers import parse_request_header, request_header_bytes
from sluice.codec.messages import ApiKey, encode_request
from sluice.codec.produce_splice import scan_produce_request
from sluice.codec.records import (
    BatchHeader,
    Record,
    build_batch,
    encode_records,
    records_section,
    split_batches,
)
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


def librdkafka_lz4(plain: bytes) -> bytes:
    """One LZ4 frame of `plain` as librdkafka's producer writes it: level 0, independent
    blocks of at most 64 KiB, no block or content checksums (through the system's liblz4,
    with ctypes of its own: a baseline tree's `lz4_frame` may not offer these settings)."""
    lib = lz4_frame._lib
    assert lib is not None, "no liblz4.so.1 on this host"
    prefs = lz4_frame._preferences(0, block_checksums=False)
    bound = lib.LZ4F_compressFrameBound(len(plain), ctypes.byref(prefs))
    out = ctypes.create_string_buffer(bound)
    written = lib.LZ4F_compressFrame(out, bound, plain, len(plain), ctypes.byref(prefs))
    assert not lib.LZ4F_isError(written)
    return out.raw[:written]


def produce_batch(values: list[bytes], lz4: bool = False) -> bytes:
    """One client batch of `values` (uncompressed, or lz4 as librdkafka compresses it)."""
    n = len(values)
    records = [Record(i, i // 50, None, v, []) for i, v in enumerate(values)]
    header = BatchHeader(0, 0, -1, 2, 0, CODEC_LZ4 if lz4 else 0, n - 1, BASE_TS,
                         BASE_TS + (n - 1) // 50, -1, -1, -1, n)
    if not lz4:
        return build_batch(header, records)
    # The header around librdkafka's frame (the codec's own compression writes other frames).
    return records_module._assemble(header, header.attributes,
                                    librdkafka_lz4(bytes(encode_records(records))), n)


def produce_frame(batches: list[bytes]) -> bytes:
    """The Produce request (v9) with one batch per partition 0, 1, ... of one topic."""
    cls = schemas.request_schema(ApiKey.PRODUCE, VERSION)
    tcls = entities.element_class(cls, "topic_data")
    pcls = entities.element_class(tcls, "partition_data")
    request = entities.build(
        cls, transactional_id=None, acks=-1, timeout=datetime.timedelta(seconds=5),
        topic_data=(entities.build(tcls, name=TOPIC, partition_data=tuple(
            entities.build(pcls, index=k, records=b) for k, b in enumerate(batches))),),
    )
    head = request_header_bytes(ApiKey.PRODUCE, VERSION, 7, "bench")
    return head + encode_request(request)


def whole(chain: FilterChain, frame: bytes, rewrites: bool = True) -> Any:
    """The job and the splice, as the produce path runs them for this request: the frame's
    pieces where the tree forwards them unjoined (a baseline tree without: joined)."""
    header = parse_request_header(frame)
    view = memoryview(frame)
    layout = scan_produce_request(VERSION, view[header.header_size:])
    result = produce_path._filter_request(chain, layout, [TOPIC], (True,), "bench", None)
    assert not result.drop and bool(result.replaced) == rewrites, "pii-mask rewrote otherwise"
    return _splice(view[header.header_size:], layout, result.replaced, result.drop,
                   prefix=view[: header.header_size])


def guest_call(chain: FilterChain, batch: bytes, n: int) -> Any:
    """A closure that runs the guest's `sluice_filter_records` call alone on `batch`'s
    section (decompressed beforehand; its input written beforehand, outside the clock) and
    returns the thread CPU ns of the call."""
    (f,) = chain.filters
    runner: Any = f._runner
    guest = runner.guest()
    ctx = RecordContext(TOPIC, 0, "produce", "bench", None)
    section = bytes(records_section(split_batches(batch)[0][0]))
    data = native_input_head(ctx, n, 0, BASE_TS) + section
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


def measure(records: int, rounds: int, workload: int = 1, partitions: int = 2,
            clean: bool = False) -> tuple[float, float]:
    """(whole, guest) µs per record, medians of `rounds`."""
    parts = partitions if workload == 2 else 1
    per = records // parts
    values = json_records(per * parts)
    if clean:  # nothing pii-mask would rewrite, in records of the same size
        values = [b'{"user_id": "u1", "note": "' + b"y" * (len(v) - 30) + b'"}' for v in values]
    batches = [produce_batch(values[k * per:(k + 1) * per], lz4=workload == 2)
               for k in range(parts)]
    frame = produce_frame(batches)
    spec = FilterSpec(name="mask-pii", module="builtin:pii-mask", config={}, topics=("bench-*",),
                      apply_to=frozenset({"produce"}))  # fmt: skip
    chain = FilterChain.from_specs([spec])
    n = per * parts
    try:
        whole(chain, frame, not clean)  # warm
        calls = [guest_call(chain, b, per) for b in batches]
        wholes, guests = [], []
        for _ in range(rounds):
            start = time.thread_time_ns()
            whole(chain, frame, not clean)
            wholes.append((time.thread_time_ns() - start) / n / 1000)
            guests.append(sum(call() for call in calls) / n / 1000)
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
    ap.add_argument("--records", type=int, default=None,
                    help="records in the request (default 4000; 2800 with --workload 2)")
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--workload", type=int, choices=(1, 2), default=1,
                    help="1: one uncompressed batch (the chunked harness's); 2: lz4 batches "
                         "as bench_proxy's workload 2 sends them (default records 2800)")
    ap.add_argument("--partitions", type=int, default=2,
                    help="workload 2: batches in the request, one per partition")
    ap.add_argument("--clean", action="store_true",
                    help="records with nothing to mask (the batch is forwarded as it came)")
    ap.add_argument("--baseline", type=Path, default=None,
                    help="another Sluice source tree (bench/baseline.py): measured in "
                         "alternating processes with this one, --rounds times each")
    ap.add_argument("--json", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.records is None:
        args.records = 2800 if args.workload == 2 else 4000
    try:  # as `sluice serve` sets it up (a tree without it: glibc's defaults)
        from sluice.proxy.ops.allocator import keep_batch_buffers
    except ImportError:
        pass
    else:
        keep_batch_buffers()
    if args.baseline is not None:
        from bench import baseline

        source = baseline.prepare(args.baseline)
        one = ["--records", str(args.records), "--rounds", "15", "--workload",
               str(args.workload), "--partitions", str(args.partitions),
               *(["--clean"] if args.clean else [])]
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
    whole_us, guest_us = measure(args.records, args.rounds, args.workload, args.partitions,
                                 args.clean)
    if args.json:
        print(json.dumps({"whole": whole_us, "guest": guest_us}))
    else:
        print(f"whole {whole_us:.3f} µs/record, guest {guest_us:.3f}, "
              f"host {whole_us - guest_us:.3f}")


if __name__ == "__main__":
    main()
