"""Record encryption throughput: records/s of builtin:encrypt over 200-byte JSON records.

    .venv/bin/python -m bench.bench_encryption [--records 20000] [--batch 100] [--rounds 5]
        [--codec 0] [--clock wall|cpu] [--path native|reference] [--gcm own|evp]

Runs the real pipeline (filters.pipeline: batch decode, the host filter, rebuild with CRC and
codec) over batches of `--batch` records, in memory with a local keyring in a temporary
directory, and prints the median records/s of:

  produce (encrypt)      whole value, and JSON fields mode (field "card")
  fetch, allowed         decrypting back to the produced batch
  fetch, refused         a principal outside decrypt_for (headers read, nothing changed)
  reference              the same batches through filter_produce/filter_fetch with a
                         json-validate Wasm filter: the cost of any decoding filter

`--clock cpu` counts the process's CPU time instead of wall time (steadier on a loaded
machine). `--path reference` turns off the native batch sealer (crypto/batch_seal.py), so
the per-record Python path is measured; `--gcm evp` runs the native path's AES-GCM through
OpenSSL's EVP instead of crypto/batch_seal.c's own AES-NI code (the same bytes). Also prints
the bytes stored per record against the bytes produced (whole batches, uncompressed unless
`--codec`).

Only indicative on a shared machine; the end-to-end comparison with direct produce/consume
belongs to bench/bench_proxy.py.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from bench.workload import json_records
from sluice.codec.records import BatchHeader, Record, build_batch
from sluice.crypto import batch_seal
from sluice.crypto.kms import KmsSettings
from sluice.filters.chain import FilterChain
from sluice.filters.config import FilterSpec
from sluice.filters.context import RecordContext
from sluice.filters.pipeline import filter_fetch, filter_produce

TOPIC = "payments"


def batches(values: list[bytes], size: int, codec: int) -> list[bytes]:
    out = []
    for start in range(0, len(values), size):
        chunk = values[start:start + size]
        recs = [Record(i, i, b"key-%d" % i, v, [], 0) for i, v in enumerate(chunk)]
        header = BatchHeader(0, 0, 0, 2, 0, codec, len(recs) - 1, 1_700_000_000_000,
                             1_700_000_000_000 + len(recs) - 1, 1000, 0, start, len(recs))
        out.append(build_batch(header, recs))
    return out


CLOCK: Callable[[], float] = time.perf_counter


def rate(run: Callable[[], int], rounds: int) -> float:
    """Median records/s of `run` (which returns how many records it handled)."""
    samples = []
    for _ in range(rounds):
        started = CLOCK()
        n = run()
        samples.append(n / max(CLOCK() - started, 1e-9))
    return statistics.median(samples)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=20000)
    parser.add_argument("--batch", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--codec", type=int, default=0, help="0 none, 1 gzip, 2 snappy, "
                                                              "3 lz4, 4 zstd")
    parser.add_argument("--clock", choices=("wall", "cpu"), default="wall",
                        help="wall time, or this process's CPU time (time.process_time)")
    parser.add_argument("--path", choices=("native", "reference"), default="native",
                        help="reference: the per-record Python path of builtin:encrypt")
    parser.add_argument("--gcm", choices=("own", "evp"), default="own",
                        help="evp: the native path's AES-GCM through OpenSSL's EVP")
    args = parser.parse_args(argv)
    if batch_seal.AVAILABLE:
        batch_seal.allow_own_gcm(args.gcm == "own")
    global CLOCK
    CLOCK = time.process_time if args.clock == "cpu" else time.perf_counter
    values = json_records(args.records)
    plain = batches(values, args.batch, args.codec)
    produce_ctx = RecordContext(TOPIC, 0, "produce", principal="User:app")
    allowed_ctx = RecordContext(TOPIC, 0, "fetch", principal="User:billing")
    refused_ctx = RecordContext(TOPIC, 0, "fetch", principal="User:bob")
    print(f"{args.records} records of ~{len(values[0])} bytes, batches of {args.batch}, "
          f"codec {args.codec}, median of {args.rounds} rounds, {args.clock} clock, "
          f"{args.path} path, AES-GCM "
          f"{'own' if batch_seal.AVAILABLE and batch_seal.own_gcm() else 'EVP'}")
    with tempfile.TemporaryDirectory() as tmp:
        kms = KmsSettings("local", path=str(Path(tmp) / "keys.json"))
        for mode, extra in (("value", {}), ("fields", {"fields": ["card"]})):
            spec = FilterSpec(name="enc", module="builtin:encrypt", topics=(TOPIC,),
                              apply_to=frozenset({"produce", "fetch"}), kms=kms,
                              config={"key": "payments", "decrypt_for": ["User:billing"],
                                      **extra})
            chain = FilterChain.from_specs([spec])
            if args.path == "reference":
                chain.filters[0]._runner.use_native = False  # type: ignore[union-attr]
            stored = [bytes(filter_produce(chain, produce_ctx, b).records or b"")
                      for b in plain]
            assert filter_fetch(chain, allowed_ctx, stored[0]).records == plain[0]
            produced, kept = sum(len(b) for b in plain), sum(len(b) for b in stored)
            print(f"  {mode:6s} bytes per record   produced {produced / args.records:,.1f}, "
                  f"stored {kept / args.records:,.1f} (+{(kept - produced) / args.records:,.1f})")

            def enc(chain: FilterChain = chain) -> int:
                for b in plain:
                    filter_produce(chain, produce_ctx, b)
                return args.records

            def dec(ctx: RecordContext, chain: FilterChain = chain,
                    stored: list[bytes] = stored) -> int:
                for b in stored:
                    filter_fetch(chain, ctx, b)
                return args.records

            print(f"  {mode:6s} produce (encrypt)  {rate(enc, args.rounds):>10,.0f} records/s")
            print(f"  {mode:6s} fetch, allowed     "
                  f"{rate(lambda: dec(allowed_ctx), args.rounds):>10,.0f} records/s")
            print(f"  {mode:6s} fetch, refused     "
                  f"{rate(lambda: dec(refused_ctx), args.rounds):>10,.0f} records/s")
            chain.close()
    ref = FilterChain.from_specs([FilterSpec(
        name="validate", module="builtin:json-validate", topics=(TOPIC,),
        apply_to=frozenset({"produce"}), config={"required_fields": ["user_id"]})])

    def validate() -> int:
        for b in plain:
            filter_produce(ref, produce_ctx, b)
        return args.records

    print(f"  reference json-validate produce  {rate(validate, args.rounds):>10,.0f} records/s")
    ref.close()


if __name__ == "__main__":
    main()
